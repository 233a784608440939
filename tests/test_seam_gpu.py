"""The seam's GPU half (marker ``gpu``: skipped without a GPU; run on the H200):
ResidentFp8 on 'cuda' / 'cuda:N' with load accounting to the byte, reuse and release;
matmul_fp8 == matmul_fp8_prequant bitwise on cupy arrays; the CPU within G3 and the GPU within G3 on
the Numba kernels (lever off) or the tensor-core bound on cuBLASLt (lever on); a two-layer MLP;
device mismatches refused."""

import numpy as np
import pytest

import vtnumba as vt
from vtnumba import seam
from vtnumba.testing import reference

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(63)


def _gpu(cp, x):
    """A numpy array on the GPU; bfloat16 goes over as bits and is viewed back."""
    if x.dtype.itemsize == 2 and x.dtype != np.float16:
        return cp.asarray(x.view(np.uint16)).view(x.dtype)
    return cp.asarray(x)


def _host(y):
    """A cupy array on the host, bfloat16 included (read as bits, viewed back)."""
    dt = np.dtype(y.dtype)
    if dt.itemsize == 2 and dt != np.float16:
        return y.view(np.uint16).get().view(dt)
    return y.get()


def _stats(device):
    return seam.load_stats().get(device, seam.DeviceLoadStats())


def _host_weight(n=64, k=128, scheme="dynamic", per_channel=False, bias=True):
    w = (RNG.standard_normal((n, k)) * np.linspace(0.02, 0.2, n)[:, None]).astype(np.float32)
    return seam.Fp8Weight.from_float(
        w,
        input_scale=np.float32(0.0213) if scheme == "static" else None,
        per_channel=per_channel,
        activation_scheme=scheme,
        bias=RNG.standard_normal(n).astype(np.float32) if bias else None,
    )


def _current(cp):
    return f"cuda:{cp.cuda.runtime.getDevice()}"


def test_resident_on_cuda_is_uploaded_once_and_accounted_to_the_byte(cp):
    w = _host_weight(n=64, k=128, per_channel=True, bias=True)
    dev = _current(cp)
    expected = 64 * 128 + 4 * 64 + 4 * 64  # codes, float32 per-channel scale, float32 bias
    before = _stats(dev)
    r = seam.ResidentFp8(w, "cuda")
    assert r.device == dev and seam.ResidentFp8(w, dev) is r  # 'cuda' is the current device
    after = _stats(dev)
    assert after.uploads - before.uploads == 1 and after.upload_bytes - before.upload_bytes == expected
    assert r.nbytes == expected
    assert isinstance(r.weight.data, cp.ndarray) and r.weight.data.device.id == int(dev.split(":")[1])
    np.testing.assert_array_equal(r.weight.data.get(), w.data)
    np.testing.assert_array_equal(r.weight.weight_scale.get(), w.weight_scale)
    np.testing.assert_array_equal(r.weight.bias.get(), w.bias)
    assert r.weight.input_scale is None and r.weight.activation_scheme == w.activation_scheme


def test_release_host_after_upload_to_cuda(cp):
    w = _host_weight()
    dev = _current(cp)
    x = cp.asarray(RNG.standard_normal((4, 128)).astype(np.float32))
    host_bytes = w.data.nbytes
    before = _stats(dev)
    r = seam.ResidentFp8(w, dev, release_host=True)
    after = _stats(dev)
    assert w.data is None and w.released_to == dev
    assert after.released_host - before.released_host == 1
    assert after.released_host_bytes - before.released_host_bytes == host_bytes
    y = seam.matmul_fp8(x, w)  # the released host weight still finds its resident copy
    cp.testing.assert_array_equal(y, seam.matmul_fp8(x, r))
    with pytest.raises(ValueError, match=f"released after upload to {dev}"):
        seam.matmul_fp8(x.get(), w)


def test_a_host_weight_used_with_a_gpu_input_is_uploaded_once(cp):
    w = _host_weight()
    dev = _current(cp)
    x = cp.asarray(RNG.standard_normal((2, 128)).astype(np.float32))
    before = _stats(dev)
    y1 = seam.matmul_fp8(x, w)
    y2 = seam.matmul_fp8(x, w)
    assert _stats(dev).uploads - before.uploads == 1
    cp.testing.assert_array_equal(y1, y2)


def test_second_gpu_has_its_own_copy_and_accounting(cp):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs (run on nvidia-h200-x2)")
    w = _host_weight()
    before0, before1 = _stats("cuda:0"), _stats("cuda:1")
    r0, r1 = seam.ResidentFp8(w, "cuda:0"), seam.ResidentFp8(w, "cuda:1")
    assert r0 is not r1 and r1.weight.data.device.id == 1
    assert _stats("cuda:0").uploads - before0.uploads == 1 and _stats("cuda:1").uploads - before1.uploads == 1
    assert _stats("cuda:1").upload_bytes - before1.upload_bytes == r1.nbytes
    x0 = cp.asarray(RNG.standard_normal((2, 128)).astype(np.float32))
    with pytest.raises(ValueError, match="x must be on the weight's device cuda:1, got an array on cuda:0"):
        seam.matmul_fp8(x0, r1)


def _gemm_allowance(lever, q_data, w, q_scale, ref, out_dtype):
    """What the GPU GEMM may differ from the float64 oracle by: G3 on the Numba kernels (lever
    off), the tensor-core model on cuBLASLt (lever on; reference.tensor_core_bound says why)."""
    if lever == "0":
        _, bound = reference.scaled_mm(q_data, w.data, q_scale, w.weight_scale)
    else:
        bound = reference.tensor_core_bound(q_data, w.data, q_scale, w.weight_scale)
    return bound + reference.out_rounding(ref, out_dtype)


@pytest.mark.parametrize("lever", ["1", "0"])
@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("m", [1, 5, 64])
def test_gpu_matmul_equals_prequant_bitwise_and_cpu_within_g3(cp, monkeypatch, lever, scheme, per_channel, dtype, m):
    import ml_dtypes

    monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", lever)
    np_dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    w = _host_weight(n=64, k=128, scheme=scheme, per_channel=per_channel)
    x_host = (RNG.standard_normal((m, 128)) * 2).astype(np_dtype)
    x = _gpu(cp, x_host)
    r = seam.ResidentFp8(w, "cuda")
    y = seam.matmul_fp8(x, r)
    assert isinstance(y, cp.ndarray) and y.shape == (m, 64) and np.dtype(y.dtype) == np.dtype(np_dtype)
    q = seam.quantize_activation(x, r.weight)
    y_pre = seam.matmul_fp8_prequant(q, r, out_dtype=np_dtype)
    np.testing.assert_array_equal(_host(y).view(np.uint8), _host(y_pre).view(np.uint8))
    # G2 on the activation, then the GPU GEMM and the CPU's against the same float64 oracle
    q_cpu = seam.quantize_activation(x_host, w)
    np.testing.assert_array_equal(q.data.get(), q_cpu.data)
    ref, bound = reference.scaled_mm(q_cpu.data, w.data, q_cpu.scale, w.weight_scale, w.bias)
    y_cpu = seam.matmul_fp8(x_host, w)
    assert np.all(np.abs(y_cpu.astype(np.float64) - ref) <= bound + reference.out_rounding(ref, np_dtype))
    allow = _gemm_allowance(lever, q_cpu.data, w, q_cpu.scale, ref, np_dtype)
    assert np.all(np.abs(_host(y).astype(np.float64) - ref) <= allow)
    assert np.count_nonzero(ref) == ref.size


@pytest.mark.parametrize("lever", ["1", "0"])
def test_both_sides_of_the_lever_stay_within_their_bounds(cp, monkeypatch, lever):
    monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", lever)
    assert seam.dense_cublaslt_fp8_enabled() is (lever == "1")
    w = _host_weight(n=256, k=256, scheme="dynamic")  # cuBLASLt-eligible: N, K multiples of 16
    x_host = RNG.standard_normal((128, 256)).astype(np.float32)
    y = seam.matmul_fp8(cp.asarray(x_host), w).get()
    q = vt.quantize_fp8(x_host)
    ref, _ = reference.scaled_mm(q.data, w.data, q.scale, w.weight_scale, w.bias)
    assert np.all(np.abs(y - ref) <= _gemm_allowance(lever, q.data, w, q.scale, ref, np.float32))
    assert np.count_nonzero(ref) == ref.size


@pytest.mark.parametrize("lever", ["1", "0"])
def test_two_layer_mlp_on_the_gpu(cp, monkeypatch, lever):
    monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", lever)
    d, h, m = 128, 256, 8
    up_host = seam.Fp8Weight.from_float(
        (RNG.standard_normal((h, d)) / np.sqrt(d)).astype(np.float32),
        input_scale=np.float32(4.5 / 448),
        bias=RNG.standard_normal(h).astype(np.float32),
    )
    down_host = seam.Fp8Weight.from_float(
        (RNG.standard_normal((d, h)) / np.sqrt(h)).astype(np.float32), per_channel=True, activation_scheme="per_token"
    )
    up_gpu = seam.make_linear_method(seam.ResidentFp8(up_host, "cuda"))
    down_gpu = seam.make_linear_method(seam.ResidentFp8(down_host, "cuda"))
    x = RNG.standard_normal((m, d)).astype(np.float32)
    y1 = up_gpu.apply(cp.asarray(x))
    hidden = cp.maximum(y1, 0)
    y2 = down_gpu.apply(hidden)
    # each GPU layer within its bound of the float64 oracle on the very input it saw
    compared = 0
    for wt, inp, out in ((up_host, x, y1.get()), (down_host, hidden.get(), y2.get())):
        q = reference.quantize(inp, wt.input_scale, per_token=wt.activation_scheme == "per_token")
        ref, _ = reference.scaled_mm(q.data, wt.data, q.scale, wt.weight_scale, wt.bias)
        assert np.all(np.abs(out - ref) <= _gemm_allowance(lever, q.data, wt, q.scale, ref, np.float32))
        compared += np.count_nonzero(ref)
    assert compared > 0.9 * (m * h + m * d)
    # and the same MLP on the CPU through the same seam agrees closely (the hidden activations may
    # differ by float32 accumulation order, which can move a per-token code by one step)
    y_cpu = seam.matmul_fp8(np.maximum(seam.matmul_fp8(x, up_host), 0), down_host)
    assert np.linalg.norm(y2.get() - y_cpu) <= 1e-2 * np.linalg.norm(y_cpu)


def test_unquantized_method_on_cupy(cp):
    w = RNG.standard_normal((32, 64)).astype(np.float32)
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    m = seam.make_linear_method(cp.asarray(w))
    assert type(m) is seam.UnquantizedLinearMethod
    np.testing.assert_allclose(m.apply(cp.asarray(x)).get(), x @ w.T, rtol=1e-5, atol=1e-5)


def test_device_mismatches_are_refused(cp):
    w = _host_weight()
    r = seam.ResidentFp8(w, "cuda")
    with pytest.raises(ValueError, match=f"x must be on the weight's device {r.device}, got a numpy array"):
        seam.matmul_fp8(RNG.standard_normal((2, 128)).astype(np.float32), r)
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N'"):
        seam.ResidentFp8(w, "cuda:x")
    with pytest.raises(ValueError, match="device must name one of the"):
        seam.ResidentFp8(w, f"cuda:{cp.cuda.runtime.getDeviceCount()}")
