"""Torch CUDA tensors through vtnumba (the H200 half of tests/test_interop.py): in and out without a
copy (equal data pointers), the same bytes as the CPU, on torch's current stream without
synchronizing, Fp8Linear on the GPU, and all-MiniLM-L6-v2 through sentence-transformers on the GPU
from the float16 export (``VT_MINILM_FP16``: the folder examples/export_minilm_fp16.py writes)."""

import copy
import importlib.util
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba import _interop, seam
from vtnumba.testing import devices

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(1516)
BF16 = ml_dtypes.bfloat16
SLEEP_CYCLES = int(2e8)  # torch.cuda._sleep: ~0.1 s of one SM at the H200's clock


def _cuda(a, device="cuda"):
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).to(device).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def _host(t):
    assert isinstance(t, torch.Tensor) and t.is_cuda, type(t)
    t = t.cpu()
    return t.view(torch.int16).numpy().view(BF16) if t.dtype == torch.bfloat16 else t.numpy()


def _same(t, a):
    got = _host(t)
    assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes()


def _cupy():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.float8_e4m3fn])
def test_cuda_tensors_cross_both_ways_without_a_copy(dtype):
    cupy = _cupy()
    seen = []

    @_interop.interop
    def identity(x):
        seen.append(x)
        return x

    base = torch.arange(64, dtype=torch.float32, device="cuda").reshape(4, 16)
    t = (base / 16).to(dtype) if dtype.is_floating_point else base.to(dtype)
    out = identity(t)
    (arr,) = seen
    assert isinstance(arr, cupy.ndarray) and arr.data.ptr == t.data_ptr() and arr.shape == (4, 16)
    assert isinstance(out, torch.Tensor) and out.is_cuda and out.data_ptr() == t.data_ptr()
    assert out.dtype == (torch.uint8 if dtype == torch.float8_e4m3fn else dtype)


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16, BF16])
def test_ops_on_cuda_tensors_match_the_cpu(np_dtype):
    m, n, k = 6, 48, 64
    x = (RNG.standard_normal((m, k)) * 3).astype(np_dtype)
    w = (RNG.standard_normal((n, k)) * 0.05).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    tx, tw, tb = _cuda(x), _cuda(w), _cuda(bias)
    for args, kw in (((0.05,), {}), ((), {}), ((), {"per_token": True})):
        want, got = vt.quantize_fp8(x, *args, **kw), vt.quantize_fp8(tx, *args, **kw)
        assert got.data.dtype == torch.uint8 and got.data.device == tx.device
        _same(got.data, want.data)
        _same(got.scale, want.scale)
    qw, tqw = vt.quantize_fp8(w, per_token=True), vt.quantize_fp8(tw, per_token=True)
    qx, tqx = vt.quantize_fp8(x, per_token=True), vt.quantize_fp8(tx, per_token=True)
    _same(tqx.data, qx.data)
    cupy = _cupy()
    views = [cupy.from_dlpack(t) for t in (tqx.data, tqw.data, tqx.scale, tqw.scale, tb)]
    for kernel in ("tiled", None):  # a named Numba kernel, and the one the backend picks
        got = vt.scaled_mm(
            tqx.data.view(torch.float8_e4m3fn),
            tqw.data,
            tqx.scale,
            tqw.scale,
            out_dtype=torch.bfloat16,
            bias=tb,
            kernel=kernel,
        )
        want = vt.scaled_mm(*views[:4], out_dtype=BF16, bias=views[4], kernel=kernel)  # cupy views: same kernel
        assert got.dtype == torch.bfloat16 and got.device == tx.device
        _same(got, devices.to_host(want))
        cpu = vt.scaled_mm(qx.data, qw.data, qx.scale, qw.scale, bias=bias)
        np.testing.assert_allclose(_host(got).astype(np.float32), cpu, rtol=2e-2, atol=2e-2 * np.abs(cpu).max())
    fw = seam.Fp8Weight.from_float(w, per_channel=True, activation_scheme="per_token", bias=bias)
    y = seam.matmul_fp8(tx, fw)
    assert y.dtype == tx.dtype and y.device == tx.device and y.shape == (m, n)
    x64 = RNG.standard_normal((m, k))
    _same(vt.quantize_fp8(_cuda(x64), 0.05).data, vt.quantize_fp8(x64.astype(np.float32), 0.05).data)


def test_runs_on_torchs_current_stream_without_synchronizing():
    """On a side stream, x is written only after a long sleep; the op must run after that write (it
    is queued on the same stream) and return before the sleep ends (nothing waited for the GPU)."""
    cupy = _cupy()
    x_host = (RNG.standard_normal((64, 256)) * 2).astype(np.float32)
    want = vt.quantize_fp8(x_host, 0.05).data
    want_dyn = vt.quantize_fp8(x_host, per_token=True)
    src = _cuda(x_host)
    x = torch.full_like(src, float("nan"))  # read too early, x would encode to 0x7F everywhere
    vt.quantize_fp8(src, 0.05), vt.quantize_fp8(src, per_token=True)  # compile outside the timed window
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # and let cupy's and torch's pools make their first blocks for this
        warm = vt.quantize_fp8(src, 0.05)  # stream: a first cudaMalloc may synchronize (seen on the H200:
        vt.quantize_fp8(src, per_token=True)  # torch's .to() below, on its first call on the stream)
        warm.data.to(torch.int32) + 1
    torch.cuda.synchronize()
    cupy_stream_before = cupy.cuda.get_current_stream().ptr
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(src)
        q = vt.quantize_fp8(x, 0.05)
        qd = vt.quantize_fp8(x, per_token=True)
        y = q.data.to(torch.int32) + 1  # torch work on the result, on the same stream
        still_busy = not side.query()
    assert still_busy, "the call waited for the GPU (or the sleep was too short to tell)"
    assert cupy.cuda.get_current_stream().ptr == cupy_stream_before  # cupy's stream restored
    side.synchronize()
    _same(q.data, want)
    _same(qd.data, want_dyn.data)
    _same(qd.scale, want_dyn.scale)
    np.testing.assert_array_equal(y.cpu().numpy(), want.astype(np.int32) + 1)
    assert (want != 0x7F).all()  # the poison would have shown


def test_tensors_on_another_gpu_run_there():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = (RNG.standard_normal((8, 32))).astype(np.float32)
    with torch.cuda.device(0):
        q = vt.quantize_fp8(_cuda(x, "cuda:1"), per_token=True)
    assert q.data.device == torch.device("cuda:1") and q.scale.device == torch.device("cuda:1")
    _same(q.data, vt.quantize_fp8(x, per_token=True).data)
    a = vt.quantize_fp8(_cuda(x, "cuda:0"))
    b = vt.quantize_fp8(_cuda(x, "cuda:1"))
    with pytest.raises(ValueError, match="arrays must all be on one GPU, got a on cuda:0 and b on cuda:1"):
        vt.scaled_mm(a.data, b.data, a.scale, 1.0)


def test_torch_with_cupy_is_refused():
    cupy = _cupy()
    a = vt.quantize_fp8(_cuda(RNG.standard_normal((4, 32)).astype(np.float32)))
    b = cupy.asarray(vt.quantize_fp8(RNG.standard_normal((8, 32)).astype(np.float32)).data)
    with pytest.raises(TypeError, match=r"one framework, got a \(torch\.Tensor\) with b \(cupy\.ndarray\)"):
        vt.scaled_mm(a.data, b, a.scale, 1.0)


@pytest.mark.parametrize("scheme", ["dynamic", "per_token", "static"])
def test_fp8_linear_on_the_gpu(scheme):
    cupy = _cupy()
    import vtnumba.torch as vtt

    torch.manual_seed(3)
    linear = torch.nn.Linear(128, 64)
    layer = vtt.Fp8Linear.from_linear(linear, scheme, input_scale=0.01 if scheme == "static" else None)
    x = torch.randn(3, 5, 128)
    with torch.inference_mode():
        want = layer(x)  # the CPU result
        seam.reset_load_stats()
        xg = x.cuda().to(torch.bfloat16)
        y1, y2 = layer(xg), layer(xg)
    stats = seam.load_stats()
    assert stats["cuda:0"].uploads == 1  # the weight went to the GPU once
    assert y1.is_cuda and y1.dtype == torch.bfloat16 and y1.shape == (3, 5, 64)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    # the same as the seam on cupy views of the same input
    want_gpu = seam.matmul_fp8(cupy.from_dlpack(xg.view(torch.int16)).view(BF16), layer._resident[0])
    assert _host(y1).tobytes() == devices.to_host(want_gpu).tobytes()
    rel = (y1.float().cpu() - want).abs().max() / want.abs().max()
    assert rel < 0.05  # bf16 input vs float32 input: close


def test_gpu_linear_from_a_cuda_linear_stays_there():
    import vtnumba.torch as vtt

    linear = torch.nn.Linear(64, 32).cuda()
    layer = vtt.Fp8Linear.from_linear(linear, "per_token")  # quantized on the GPU, on torch's stream
    assert layer.weight.is_cuda and layer.weight.dtype == torch.float8_e4m3fn and layer.fp8_weight.device == "cuda:0"
    with torch.no_grad():
        y = layer(torch.randn(4, 64, device="cuda"))
        assert y.is_cuda
        with pytest.raises(ValueError, match="x must be on the layer's device cuda:0, got a tensor on cpu"):
            layer(torch.randn(4, 64))


def test_minilm_through_sentence_transformers_on_the_gpu():
    folder = os.environ.get("VT_MINILM_FP16")
    if not folder or not Path(folder).is_dir():
        pytest.skip(
            "set VT_MINILM_FP16 to the folder examples/export_minilm_fp16.py writes (the weights "
            "package cannot be installed on the H200)"
        )
    pytest.importorskip("sentence_transformers")
    examples = Path(__file__).resolve().parents[1] / "examples"
    spec = importlib.util.spec_from_file_location("minilm_fp8", examples / "minilm_fp8.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    model = ex.sentence_transformer_from_fp16(folder, "cuda")
    result = ex.run_torch(model=copy.deepcopy(model), device="cuda")
    assert result["linear_layers"] == 37
    for label in ("fp8-static", "fp8-per-token"):
        fig = result["variants"][label]
        assert fig["mean_cosine"] >= 0.99 and fig["nearest_same"] == fig["sentences"] == 12, (label, fig)
        assert fig["min_cosine"] < 1.0
    print({label: round(v.get("mean_cosine", 1.0), 5) for label, v in result["variants"].items()})
