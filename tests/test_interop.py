"""Foreign arrays at the public boundary (vtnumba._interop) with torch CPU tensors and other DLPack
producers: zero-copy both ways (shared pointers), the same kind out with the same bytes as numpy,
float64 cast to float32 with RNE, the errors bad input gets, and importing vtnumba leaving torch alone.
The torch CUDA half is tests/test_interop_gpu.py."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba import _interop, seam

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(15)
BF16 = ml_dtypes.bfloat16
TORCH_OF = {np.float32: torch.float32, np.float16: torch.float16, BF16: torch.bfloat16}


def _tensor(a):
    """A torch tensor of numpy array ``a`` (bf16 through its bits: torch.from_numpy has no bf16)."""
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _np(t):
    """The numpy bytes of a torch result (bf16 as ml_dtypes.bfloat16)."""
    assert isinstance(t, torch.Tensor), type(t)
    return t.view(torch.int16).numpy().view(BF16) if t.dtype == torch.bfloat16 else t.numpy()


def _same(t, a):
    got = _np(t)
    assert got.dtype == a.dtype and got.shape == a.shape
    assert got.tobytes() == a.tobytes()


# -- torch stays optional ----------------------------------------------------------------------


def test_import_vtnumba_leaves_torch_unimported():
    code = (
        "import sys, vtnumba, vtnumba.seam, numpy as np; "
        "vtnumba.quantize_fp8(np.ones((2, 16), np.float32), 0.5); "
        "bad = [m for m in ('torch', 'jax', 'cupy') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "[]"


def test_vtnumba_torch_imports_the_real_torch():
    import vtnumba.torch as vtt

    assert vtt.torch is sys.modules["torch"] is torch
    assert vtt.nn is torch.nn and hasattr(vtt.torch, "Tensor")


# -- zero-copy --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.float8_e4m3fn])
def test_tensors_cross_both_ways_without_a_copy(dtype):
    """An @interop function that returns its argument: the numpy array it sees and the tensor it
    returns share the caller's memory."""
    seen = []

    @_interop.interop
    def identity(x):
        seen.append(x)
        return x

    base = torch.arange(64, dtype=torch.float32).reshape(4, 16)
    t = (base / 16).to(dtype) if dtype.is_floating_point else base.to(dtype)
    out = identity(t)
    ((arr,),) = [seen]
    assert isinstance(arr, np.ndarray) and arr.ctypes.data == t.data_ptr()
    assert isinstance(out, torch.Tensor) and out.data_ptr() == t.data_ptr()
    want = {
        torch.float32: np.float32,
        torch.float16: np.float16,
        torch.bfloat16: BF16,
        torch.uint8: np.uint8,
        torch.float8_e4m3fn: np.uint8,
    }[dtype]
    assert arr.dtype == want and arr.shape == (4, 16)
    # codes come back as uint8 (the documented choice); every other dtype as it went in
    assert out.dtype == (torch.uint8 if dtype == torch.float8_e4m3fn else dtype)
    assert torch.equal(out.view(torch.uint8), t.view(torch.uint8))


def test_strided_tensors_are_viewed_with_their_strides():
    t = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    view = t[::2, 1::3]
    arr = _interop.to_native(view)
    assert arr.ctypes.data == view.data_ptr()
    assert arr.strides == tuple(s * 4 for s in view.stride())
    np.testing.assert_array_equal(arr, view.numpy())
    # and the op gives the bytes of the contiguous copy (DESIGN.md: strided inputs)
    _same(vt.quantize_fp8(view, 0.25).data, vt.quantize_fp8(np.ascontiguousarray(view.numpy()), 0.25).data)


def test_results_share_memory_with_the_arrays_the_op_made():
    a = RNG.standard_normal((3, 5)).astype(np.float32)
    t = _interop.to_torch(a)
    assert t.data_ptr() == a.ctypes.data and t.dtype == torch.float32
    b = a.astype(BF16)
    tb = _interop.to_torch(b)
    assert tb.data_ptr() == b.ctypes.data and tb.dtype == torch.bfloat16


# -- the same kind out, the same bytes as numpy ------------------------------------------------


@pytest.mark.parametrize("np_dtype", [np.float32, np.float16, BF16])
def test_quantize_on_tensors_matches_numpy(np_dtype):
    x = (RNG.standard_normal((8, 48)) * 3).astype(np_dtype)
    t = _tensor(x)
    cases = [((0.05,), {}), ((), {}), ((), {"per_token": True}), ((), {"per_token": True, "scale_ub": 2.0})]
    for args, kw in cases:
        want = vt.quantize_fp8(x, *args, **kw)
        got = vt.quantize_fp8(t, *args, **kw)
        assert isinstance(got, vt.QuantizedActivation) and got.scheme == want.scheme
        assert got.data.dtype == torch.uint8 and got.scale.dtype == torch.float32
        _same(got.data, want.data)
        _same(got.scale, want.scale)
        assert np.count_nonzero(want.data) > 0.9 * want.data.size  # really quantized something
    _same(vt.encode_e4m3(t), vt.encode_e4m3(x))


def test_gemm_and_linear_on_tensors_match_numpy():
    m, n, k = 5, 24, 64
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = (RNG.standard_normal((n, k)) * 0.05).astype(np.float32)
    bias = RNG.standard_normal(n).astype(BF16)
    qx, qw = vt.quantize_fp8(x, per_token=True), vt.quantize_fp8(w, per_token=True)
    tq, tw = vt.quantize_fp8(_tensor(x), per_token=True), vt.quantize_fp8(_tensor(w), per_token=True)
    for out_dtype, torch_dtype in ((np.float32, torch.float32), (BF16, torch.bfloat16), (np.float16, torch.float16)):
        want = vt.scaled_mm(qx.data, qw.data, qx.scale, qw.scale, out_dtype=out_dtype, bias=bias)
        got = vt.scaled_mm(tq.data, tw.data, tq.scale, tw.scale, out_dtype=torch_dtype, bias=_tensor(bias))
        assert got.dtype == torch_dtype
        _same(got, want)
    # float8_e4m3fn codes are taken as well as uint8
    got = vt.scaled_mm(tq.data.view(torch.float8_e4m3fn), tw.data.view(torch.float8_e4m3fn), tq.scale, tw.scale)
    _same(got, vt.scaled_mm(qx.data, qw.data, qx.scale, qw.scale))
    want = vt.fp8_linear(x, qw.data, qw.scale, 0.02, bias=bias)
    _same(vt.fp8_linear(_tensor(x), tw.data, tw.scale, 0.02, bias=_tensor(bias)), want)
    assert np.abs(want).max() > 0
    _same(vt.decode_e4m3(tq.data), vt.decode_e4m3(qx.data))
    _same(vt.dequantize_fp8(tq.data, tq.scale, torch.bfloat16), vt.dequantize_fp8(qx.data, qx.scale, BF16))
    _same(tq.dequantize(), qx.dequantize())


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token"])
def test_seam_entry_points_on_tensors_match_numpy(scheme):
    k, n = 32, 16
    w = (RNG.standard_normal((n, k)) * 0.1).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    kw = dict(
        input_scale=0.01 if scheme == "static" else None, per_channel=scheme == "per_token", activation_scheme=scheme
    )
    fw = seam.Fp8Weight.from_float(w, bias=bias, **kw)
    tw = seam.Fp8Weight.from_float(_tensor(w), bias=_tensor(bias), **kw)  # a torch weight: numpy inside
    assert tw.device == "cpu" and isinstance(tw.data, np.ndarray)
    np.testing.assert_array_equal(tw.data, fw.data)
    x = RNG.standard_normal((2, 3, k)).astype(np.float32)
    want = seam.matmul_fp8(x, fw)
    got = seam.matmul_fp8(_tensor(x), fw)
    assert got.shape == (2, 3, n)
    _same(got, want)
    q = seam.quantize_activation(_tensor(x.reshape(-1, k)), fw)
    assert isinstance(q.data, torch.Tensor)
    _same(seam.matmul_fp8_prequant(q, fw), seam.matmul_fp8_prequant(seam.quantize_activation(x.reshape(-1, k), fw), fw))
    _same(seam.make_linear_method(fw).apply(_tensor(x)), want)


def test_other_dlpack_producers_get_numpy_back():
    """An object that only speaks DLPack (here numpy's own export behind a plain class) is viewed
    zero-copy, strided or not, and gets numpy results."""

    class Producer:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    x = RNG.standard_normal((6, 32)).astype(np.float32)
    strided = x[::2]
    seen = []

    @_interop.interop
    def look(a):
        seen.append(a)
        return a

    assert look(Producer(strided)).ctypes.data == strided.ctypes.data == seen[0].ctypes.data
    got = vt.quantize_fp8(Producer(strided), 0.1)
    assert isinstance(got.data, np.ndarray)
    np.testing.assert_array_equal(got.data, vt.quantize_fp8(np.ascontiguousarray(strided), 0.1).data)


# -- float64 ----------------------------------------------------------------------------------


def test_float64_is_cast_to_float32_with_rne_first():
    """Values a hair off an e4m3 tie: float32 rounds them onto the tie (which then goes to even),
    while rounding the float64 value straight to e4m3 would not. The op gives the first."""
    tiny = 2.0**-40  # far below half a float32 ulp at these magnitudes
    ties = np.array([1.0625, 1.1875, 1.5 * 2.0**-9, 2.375, -12.5, 216.0])  # midpoints of e4m3 neighbours
    x64 = np.concatenate([ties + tiny, ties - tiny]).reshape(2, -1)
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    values = vt.decode_e4m3(codes).astype(np.float64)
    direct = codes[np.abs(x64[..., None] - values).argmin(axis=-1)]  # nearest e4m3 to the float64 value
    want = vt.quantize_fp8(x64.astype(np.float32), 1.0).data
    # the construction matters: on one side of each tie the float64 value rounds away from even
    assert (direct != want).sum() == ties.size
    np.testing.assert_array_equal(vt.quantize_fp8(x64, 1.0).data, want)
    _same(vt.quantize_fp8(torch.from_numpy(x64), 1.0).data, want)
    np.testing.assert_array_equal(vt.encode_e4m3(x64), vt.encode_e4m3(x64.astype(np.float32)))
    # the dynamic scale and the per-token path see the float32 values too
    for kw in ({}, {"per_token": True}):
        a, b = vt.quantize_fp8(x64 * 3.3, **kw), vt.quantize_fp8((x64 * 3.3).astype(np.float32), **kw)
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_array_equal(a.scale, b.scale)


def test_float64_weights_bias_and_outputs():
    k, n = 32, 8
    w64 = RNG.standard_normal((n, k)) * 0.1
    bias64 = RNG.standard_normal(n)
    x64 = RNG.standard_normal((3, k))
    fw = seam.Fp8Weight.from_float(torch.from_numpy(w64), bias=torch.from_numpy(bias64))
    ref = seam.Fp8Weight.from_float(w64.astype(np.float32), bias=bias64.astype(np.float32))
    np.testing.assert_array_equal(fw.data, ref.data)
    y = seam.matmul_fp8(torch.from_numpy(x64), fw)
    assert y.dtype == torch.float32  # float64 is not an output dtype: results follow the float32 input
    _same(y, seam.matmul_fp8(x64.astype(np.float32), ref))
    qx, qw = vt.quantize_fp8(x64), vt.quantize_fp8(w64)
    np.testing.assert_array_equal(
        vt.scaled_mm(qx.data, qw.data, qx.scale.astype(np.float64), qw.scale, bias=bias64),
        vt.scaled_mm(qx.data, qw.data, qx.scale, qw.scale, bias=bias64.astype(np.float32)),
    )


# -- bad input --------------------------------------------------------------------------------


def test_requires_grad_is_refused_under_grad_mode_only():
    x = torch.randn(4, 16, requires_grad=True)
    with pytest.raises(ValueError, match=r"x must not require grad: .*gradient would be lost.*x\.detach\(\)"):
        vt.quantize_fp8(x, 0.1)
    w = vt.quantize_fp8(torch.randn(8, 16))
    with pytest.raises(ValueError, match="scale_b must not require grad"):
        vt.scaled_mm(w.data, w.data, 1.0, torch.ones(1, requires_grad=True))
    want = vt.quantize_fp8(x.detach().numpy(), 0.1).data
    with torch.no_grad():
        _same(vt.quantize_fp8(x, 0.1).data, want)
    with torch.inference_mode():
        _same(vt.quantize_fp8(x, 0.1).data, want)
    _same(vt.quantize_fp8(x.detach(), 0.1).data, want)


def test_mixed_frameworks_are_refused_naming_both():
    q = vt.quantize_fp8(torch.randn(4, 32))
    w = vt.quantize_fp8(RNG.standard_normal((8, 32)).astype(np.float32))
    with pytest.raises(
        TypeError,
        match=r"one framework, got a \(torch\.Tensor\) with b \(numpy\.ndarray\); "
        r"pass b as a tensor too",
    ):
        vt.scaled_mm(q.data, w.data, q.scale, w.scale)
    with pytest.raises(TypeError, match=r"got x \(torch\.Tensor\) with bias \(numpy\.ndarray\)"):
        vt.fp8_linear(torch.randn(2, 32), torch.from_numpy(w.data), 0.5, bias=np.zeros(8, np.float32))
    # numpy scalars and Python numbers are not arrays: they mix with anything
    vt.scaled_mm(q.data, torch.from_numpy(w.data), np.float32(0.5), 2.0)


def test_refused_dlpack_export_is_named():
    class Refuses:
        def __dlpack__(self, **kwargs):
            raise BufferError("cannot export a non-contiguous array")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(
        TypeError,
        match=r"x must be exportable through DLPack, got a .*Refuses whose export was "
        r"refused \(BufferError: cannot export a non-contiguous array\)",
    ):
        vt.quantize_fp8(Refuses(), 0.5)


def test_tensors_vtnumba_cannot_view_are_named():
    with pytest.raises(TypeError, match=r"x must be a tensor numpy/cupy can view .* got dtype torch\.float8_e5m2"):
        vt.quantize_fp8(torch.zeros(2, 4).to(torch.float8_e5m2))
    with pytest.raises(ValueError, match="x must be a CPU or CUDA tensor, got a tensor on meta"):
        vt.quantize_fp8(torch.zeros(2, 4, device="meta"))
    with pytest.raises(TypeError, match="x must be a float32, float16 or bfloat16 array, got dtype int32"):
        vt.quantize_fp8(torch.zeros(2, 4, dtype=torch.int32))
    q = vt.quantize_fp8(torch.randn(2, 16))
    with pytest.raises(ValueError, match="out_dtype must be one of float32, float16, bfloat16, got 'torch.int8'"):
        vt.scaled_mm(q.data, q.data, q.scale, q.scale, out_dtype=torch.int8)
    with pytest.raises(TypeError, match="x must be a numpy array .* a torch tensor"):
        vt.quantize_fp8([1.0, 2.0], 1.0)


def test_numpy_callers_take_the_fast_path():
    """numpy arguments reach the op as the very objects passed (no conversion, no copy)."""
    seen = []

    @_interop.interop
    def look(*args, **kwargs):
        seen.append((args, kwargs))
        return args[0]

    x = np.ones((2, 3), np.float32)
    q = vt.quantize_fp8(x)
    w = seam.Fp8Weight.from_float(x)
    out = look(x, q, w, np.float32(2), out_dtype=BF16, bias=None)
    ((args, kwargs),) = seen
    assert out is x and args[0] is x and args[1] is q and args[2] is w and kwargs == {"out_dtype": BF16, "bias": None}
