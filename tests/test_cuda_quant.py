"""GPU quantization on a real GPU (marker ``gpu``; proven on the H200): G2 exhaustive for both
encoders, G1 on the design population for every mode and dtype, strided and unaligned inputs,
CUDA graph capture on a cupy stream, torch tensors, and the errors a GPU call gives.

The two tests at the end run anywhere: they pin the one clear error of a GPU call that cannot run.
"""

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba.testing import reference

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

F32 = np.float32
BF16 = ml_dtypes.bfloat16
DTYPES = [np.float32, np.float16, BF16]
DTYPE_IDS = ["f32", "f16", "bf16"]
SCALES = (1.0, 0.5, 0.035, 0.0092, 7.25, 0.13, 0.77)  # DESIGN.md's G1 scales
ENCODERS = ("hardware", "portable")
gpu_only = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend():
    import vtnumba.cuda as backend

    return backend


def _population(scale, seed=1):
    from test_quant_cpu import population  # the G1 population of DESIGN.md, built for the CPU gate

    return population(scale, np.random.default_rng(seed))[0]


def _assert_codes(got, want, what):
    got = np.asarray(got)
    assert got.dtype == np.uint8 and got.shape == want.shape, what
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert bad.size == 0, f"{what}: {bad.size} of {want.size} codes differ (first at {bad[:5]})"
    assert np.count_nonzero(want) > 0, f"{what}: vacuous, every code is 0"


# --- G2 exhaustive -----------------------------------------------------------------------------
def _cpu_code_thresholds():
    """For c = 1..126, the smallest float32 magnitude bit pattern the CPU kernel encodes to >= c.

    The CPU encoder is proven equal to the oracle (nearest grid value, RNE) for all 2^32 inputs by
    tests/test_exhaustive.py, so it is a monotone step function of the magnitude's bits: these 126
    steps, the sign and the NaN rule reproduce it exactly. Found by bisection on the CPU kernel
    itself (32 vectorized calls)."""
    targets = np.arange(1, 127, dtype=np.int64)
    lo = np.zeros(targets.size, dtype=np.int64)
    hi = np.full(targets.size, 0x43E00000, dtype=np.int64)  # 448.0 -> code 126
    for _ in range(32):
        mid = (lo + hi) // 2
        codes = vt.encode_e4m3(mid.astype(np.uint32).view(F32)).astype(np.int64)
        up = codes >= targets
        hi = np.where(up, mid, hi)
        lo = np.where(up, lo, mid + 1)
    assert np.array_equal(lo, hi)
    return hi.astype(np.uint32)


def _reference_codes(cp, bits, thresholds):
    """The CPU kernel's codes for float32 bit patterns ``bits`` (cupy uint32), on the GPU."""
    mag = bits & np.uint32(0x7FFFFFFF)
    codes = cp.searchsorted(thresholds, mag, side="right").astype(cp.uint8)
    codes |= ((bits >> np.uint32(24)) & np.uint32(0x80)).astype(cp.uint8)
    return cp.where(mag > np.uint32(0x7F800000), np.uint8(0x7F), codes)


@gpu_only
@pytest.mark.exhaustive
def test_g2_exhaustive_every_float32_both_encoders(cp, backend):
    thresholds = _cpu_code_thresholds()
    thr = cp.asarray(thresholds)
    # the GPU-resident reference is the CPU kernel: check it directly on the steps and a sample
    rng = np.random.default_rng(0)
    edges = thresholds.astype(np.int64)[:, None] + np.arange(-2, 3)[None, :]
    sample = np.concatenate([edges.reshape(-1), rng.integers(0, 1 << 32, 1 << 20)]).astype(np.uint32)
    sample = np.concatenate([sample, sample | np.uint32(0x80000000)])
    cpu = vt.encode_e4m3(sample.view(F32))
    ref_sample = cp.asnumpy(_reference_codes(cp, cp.asarray(sample), thr))
    assert np.array_equal(ref_sample, cpu), "the GPU-resident reference does not reproduce the CPU kernel"

    chunk = 1 << 28
    compared = {enc: 0 for enc in ENCODERS}
    mismatches = {enc: 0 for enc in ENCODERS}
    nonzero = 0
    for start in range(0, 1 << 32, chunk):
        bits = cp.arange(start, start + chunk, dtype=cp.uint64).astype(cp.uint32)
        want = _reference_codes(cp, bits, thr)
        nonzero += int(cp.count_nonzero(want))
        for enc in ENCODERS:
            got = backend.quantize_static(bits.view(cp.float32), F32(1.0), encoder=enc)
            mismatches[enc] += int(cp.count_nonzero(got != want))
            compared[enc] += got.size
            del got
        del bits, want
    print(f"G2 exhaustive: compared {compared}, mismatches {mismatches}")
    assert compared == {enc: 1 << 32 for enc in ENCODERS}
    assert nonzero > 1 << 31  # vacuity: codes across the range, not a zero-filled buffer
    assert mismatches == {enc: 0 for enc in ENCODERS}


# --- G1 population ---------------------------------------------------------------------------
@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_g1_static_host_and_device_scales(cp, dtype):
    for scale in SCALES:
        x = _population(scale).astype(dtype)
        want = reference.quantize(x, scale)
        xd = cp.asarray(x)
        q = vt.quantize_fp8(xd, scale)
        assert isinstance(q.data, cp.ndarray) and q.scale.shape == (1,)
        assert cp.asnumpy(q.scale)[0] == F32(scale)
        _assert_codes(cp.asnumpy(q.data), want.data, f"static scale={scale}")
        qd = vt.quantize_fp8(xd, cp.asarray([scale], dtype=cp.float32))  # read on the device
        _assert_codes(cp.asnumpy(qd.data), want.data, f"static device scale={scale}")


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_g1_dynamic(cp, dtype):
    for scale in (1.0, 0.13):
        x = _population(scale)
        x = x[np.abs(x) < 1e6].astype(dtype)  # huge values would make every other code 0
        want = reference.quantize(x, None)
        q = vt.quantize_fp8(cp.asarray(x))
        assert cp.asnumpy(q.scale)[0] == want.scale[0]
        _assert_codes(cp.asnumpy(q.data), want.data, f"dynamic ({scale})")


@gpu_only
@pytest.mark.parametrize("ub", [None, 0.5, "device"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_g1_per_token(cp, dtype, ub):
    for cols in (256, 250):  # 16-element groups per row, and rows the groups cannot tile
        x = _population(0.77)
        x = x[: x.size // cols * cols].reshape(-1, cols).astype(dtype)
        x[3] = 0  # the floor scale
        ub_value = None if ub is None else 0.5
        want = reference.quantize(x, per_token=True, scale_ub=ub_value)
        ub_arg = cp.asarray([0.5], dtype=cp.float32) if ub == "device" else ub_value
        q = vt.quantize_fp8(cp.asarray(x), per_token=True, scale_ub=ub_arg)
        assert np.array_equal(cp.asnumpy(q.scale), want.scale)
        _assert_codes(cp.asnumpy(q.data), want.data, f"per-token cols={cols} ub={ub}")


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_portable_encoder_g1(cp, backend, dtype):
    """The portable encoder on the GPU, every mode (the exhaustive test covers static float32)."""
    x = _population(0.13)
    x = x[np.abs(x) < 1e6][: 4096 * 4].reshape(-1, 4096).astype(dtype)
    xd = cp.asarray(x)
    _assert_codes(
        cp.asnumpy(backend.quantize_static(xd, F32(0.13), encoder="portable")),
        reference.quantize(x, 0.13).data,
        "portable static",
    )
    codes, scale = backend.quantize_dynamic(xd, encoder="portable")
    want = reference.quantize(x, None)
    assert cp.asnumpy(scale)[0] == want.scale[0]
    _assert_codes(cp.asnumpy(codes), want.data, "portable dynamic")
    codes, scales = backend.quantize_per_token(xd, None, encoder="portable")
    want = reference.quantize(x, per_token=True)
    assert np.array_equal(cp.asnumpy(scales), want.scale)
    _assert_codes(cp.asnumpy(codes), want.data, "portable per-token")


@gpu_only
@pytest.mark.parametrize("mode", ["static", "dynamic", "per_token"])
def test_strided_input_copy_outlives_its_kernel(cp, mode):
    # a strided input is copied to a contiguous temporary; released before its kernel ran, the
    # pool handed that memory to the output and the kernel read its own codes (seen on the H200
    # as a few wrong codes on the first of several calls). Many calls, each checked.
    x = _population(0.13)[: 96 * 512].reshape(96, 512).astype(np.float32)
    xd = cp.asarray(x)
    host = np.ascontiguousarray(x[1:40, 3:259])
    kw = {"static": dict(scale=0.13), "dynamic": {}, "per_token": dict(per_token=True)}[mode]
    want = vt.quantize_fp8(host, **kw)
    for i in range(20):
        got = vt.quantize_fp8(xd[1:40, 3:259], **kw)
        assert np.array_equal(cp.asnumpy(got.scale).reshape(-1), np.asarray(want.scale).reshape(-1)), f"call {i}"
        _assert_codes(cp.asnumpy(got.data), want.data, f"{mode} call {i}")


# --- layouts -----------------------------------------------------------------------------------
@gpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_and_unaligned_inputs_give_contiguous_bytes(cp, dtype):
    x = _population(0.13)[: 96 * 512].reshape(96, 512).astype(dtype)
    xd = cp.asarray(x)
    views = {
        "columns ::2": (x[:, ::2], xd[:, ::2]),
        "transpose": (x.T, xd.T),
        "window": (x[3:50, 7:300], xd[3:50, 7:300]),
        "unaligned flat": (x.reshape(-1)[1:], xd.reshape(-1)[1:]),  # not 16-byte aligned: scalar path
        "odd size": (x.reshape(-1)[:12345], xd.reshape(-1)[:12345]),
    }
    for what, (host, dev) in views.items():
        want = vt.quantize_fp8(np.ascontiguousarray(host), 0.13).data  # the CPU kernels
        _assert_codes(cp.asnumpy(vt.quantize_fp8(dev, 0.13).data), want, what)
    rows = x[1:40, 3:259]  # per-token on a window whose rows are not 16-byte aligned
    want = vt.quantize_fp8(np.ascontiguousarray(rows), per_token=True)
    got = vt.quantize_fp8(xd[1:40, 3:259], per_token=True)
    assert np.array_equal(cp.asnumpy(got.scale), want.scale)
    got_codes = cp.asnumpy(got.data)
    bad = np.argwhere(got_codes != want.data)[:4]
    detail = [
        (
            int(r),
            int(c),
            float(rows[r, c]),
            float(want.scale[r, 0]),
            float(np.float32(rows[r, c]) / want.scale[r, 0]),
            hex(got_codes[r, c]),
            hex(want.data[r, c]),
        )
        for r, c in bad
    ]
    _assert_codes(got_codes, want.data, f"per-token window (row, col, x, scale, x / scale, gpu, cpu): {detail}")


@gpu_only
def test_torch_tensors_are_taken_zero_copy(cp, backend):
    torch = pytest.importorskip("torch")
    x = _population(0.5)[: 64 * 256].reshape(64, 256)
    for tdtype, npdtype in ((torch.float32, np.float32), (torch.bfloat16, BF16), (torch.float16, np.float16)):
        t = torch.from_numpy(x.astype(np.float32)).to("cuda").to(tdtype)
        want = vt.quantize_fp8(x.astype(npdtype), 0.5).data
        _assert_codes(cp.asnumpy(backend.quantize_static(t, F32(0.5))), want, f"torch {tdtype}")


# --- CUDA graphs -------------------------------------------------------------------------------
@gpu_only
def test_graph_capture_replays_quantize_calls(cp):
    rng = np.random.default_rng(5)
    x1 = (rng.standard_normal((64, 4096)) * 3).astype(BF16)
    x2 = (rng.standard_normal((64, 4096)) * 50).astype(BF16)
    xd = cp.asarray(x1)

    def calls():
        return [vt.quantize_fp8(xd, 0.13), vt.quantize_fp8(xd), vt.quantize_fp8(xd, per_token=True, scale_ub=0.5)]

    def expected(x):
        return [
            reference.quantize(x, 0.13),
            reference.quantize(x, None),
            reference.quantize(x, per_token=True, scale_ub=0.5),
        ]

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        calls()  # compile, load and warm the memory pool outside the capture
        stream.synchronize()
        stream.begin_capture()
        captured = calls()
        graph = stream.end_capture()
        for x in (x1, x2):
            xd[...] = cp.asarray(x)
            for q in captured:  # poison: the replay must write every output
                q.data.fill(0xAB)
                if q.scheme != "static":  # a static scale is the shared, read-only upload of 0.13
                    q.scale.fill(-1.0)
            graph.launch(stream)
            stream.synchronize()
            for q, want in zip(captured, expected(x)):
                assert np.array_equal(cp.asnumpy(q.scale).reshape(want.scale.shape), want.scale), q.scheme
                _assert_codes(cp.asnumpy(q.data), want.data, f"graph replay {q.scheme}")


@gpu_only
def test_launch_from_a_fresh_thread(cp):
    """A thread that never touched cupy has no current CUDA context; the launch path sets one up."""
    import threading

    x = (np.random.default_rng(9).standard_normal((8, 256)) * 10).astype(np.float32)
    xd = cp.asarray(x)
    cp.cuda.Device().synchronize()
    result = {}

    def work():
        try:
            q = vt.quantize_fp8(xd, 0.13)
            result["codes"] = cp.asnumpy(q.data)
        except Exception as exc:  # surfaced in the main thread below
            result["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "error" not in result, result.get("error")
    _assert_codes(result["codes"], reference.quantize(x, 0.13).data, "fresh thread")


# --- errors ------------------------------------------------------------------------------------
@gpu_only
def test_bad_gpu_inputs_are_refused_before_any_kernel(cp):
    x = cp.ones((4, 32), dtype=cp.float32)
    with pytest.raises(TypeError, match="x must be a float32, float16 or bfloat16 array"):
        vt.quantize_fp8(x.view(cp.uint16), 1.0)  # bf16 bits without the bf16 dtype are not bf16
    with pytest.raises(ValueError, match="scale must be a positive finite float32"):
        vt.quantize_fp8(x, 0.0)
    with pytest.raises(ValueError, match="x must be 2-D"):
        vt.quantize_fp8(x.reshape(-1), per_token=True)
    with pytest.raises(TypeError, match="scale on the GPU must be a float32 array"):
        vt.quantize_fp8(x, cp.ones(1, dtype=cp.float16))
    # float64 is cast to float32 (RNE) at the boundary, for scales as for x (README, "torch models")
    np.testing.assert_array_equal(
        vt.quantize_fp8(x, cp.full(1, 0.3, dtype=cp.float64)).data.get(),
        vt.quantize_fp8(x, cp.full(1, 0.3, dtype=cp.float32)).data.get(),
    )


class _FakeGpuArray:
    """Looks like a GPU array to the boundary; no GPU behind it."""

    dtype = np.dtype(np.float32)
    shape = (4,)
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_gpu_call_without_a_usable_gpu_says_why():
    from vtnumba.cuda.ptx import target

    if target.gpu_unavailable_reason() is None:
        pytest.skip("a GPU is usable here; the next test pins the messages")
    with pytest.raises(RuntimeError, match="vtnumba's GPU path needs a usable CUDA GPU: "):
        vt.quantize_fp8(_FakeGpuArray())


def test_unusable_gpu_messages_name_the_cause(monkeypatch):
    from vtnumba.cuda.ptx import target

    reason = target.gpu_unavailable_reason.__wrapped__
    monkeypatch.setattr(target, "IMPORT_ERROR", AttributeError("module 'numpy' has no attribute 'row_stack'"))
    message = reason()
    assert "numba-cuda could not be imported" in message and "numpy" in message and "row_stack" in message
    monkeypatch.setattr(target, "gpu_unavailable_reason", lambda: "no usable CUDA driver (test)")
    with pytest.raises(RuntimeError, match=r"needs a usable CUDA GPU: no usable CUDA driver \(test\)"):
        target.require_gpu()


# --- the launcher's ABI packing (runs anywhere numba-cuda imports; no GPU needed) -------------------
PTX_ENTRY = """
.visible .entry _ZN8__main__1kE(
	.param .u64 _ZN8__main__1kE_param_0,
	.param .u64 .ptr .align 1 _ZN8__main__1kE_param_1,
	.param .f32 _ZN8__main__1kE_param_2,
	.param .u8 _ZN8__main__1kE_param_3
)
{
	ret;
}
"""


def test_entry_params_reads_the_ptx_parameter_list():
    from vtnumba.cuda.runtime.launch import entry_params

    assert entry_params(PTX_ENTRY) == ("_ZN8__main__1kE", [8, 8, 4, 1])
    with pytest.raises(RuntimeError, match="exactly one .entry"):
        entry_params(PTX_ENTRY + PTX_ENTRY)


def test_launcher_packs_numba_array_abi():
    import struct

    from vtnumba.cuda.ptx.target import types
    from vtnumba.cuda.runtime.launch import Buffer, Kernel, compile_kernel

    def kernel(x, out, alpha, n, big, flag):
        pass

    sig = (types.float32[::1], types.uint8[:, :], types.float32, types.int32, types.uint64, types.boolean)
    k = Kernel(kernel, sig)
    values = k.flatten((Buffer(0x1000, (10,), (4,)), Buffer(0x2000, (3, 4), (8, 1)), 0.5, -7, 2**63 + 5, True))
    struct.pack_into(k._format, k._slot_bytes, 0, *values)
    slots = k._slots
    assert slots.size == 7 + 9 + 4  # one 8-byte slot per PTX parameter
    # meminfo, parent, nitems, itemsize, data, shape..., strides...
    assert list(slots[:7]) == [0, 0, 10, 4, 0x1000, 10, 4]
    assert list(slots[7:16]) == [0, 0, 12, 1, 0x2000, 3, 4, 8, 1]
    assert slots[16:17].view(np.float32)[0] == F32(0.5)
    assert slots[17:18].view(np.int32)[0] == -7
    assert int(slots[18]) == 2**63 + 5
    assert slots[19:20].view(np.uint8)[0] == 1
    assert list(k._param_ptrs) == [slots.ctypes.data + 8 * i for i in range(slots.size)]
    with pytest.raises(ValueError, match="array argument must be 1-D"):
        k.flatten((Buffer(0x1000, (2, 5), (20, 4)), Buffer(0x2000, (3, 4), (8, 1)), 0.5, 1, 1, True))
    with pytest.raises(TypeError, match="takes 6 arguments, got 2"):
        k.flatten((1, 2))
    assert compile_kernel(kernel, sig) is compile_kernel(kernel, sig)  # one object per (kernel, signature)
