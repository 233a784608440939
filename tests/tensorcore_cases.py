"""References and the G3 check shared by the tensor-core tests (simulator and GPU).

Independent of the kernels: float64 over the decoded codes of ``vtnumba.testing.reference``.
"""

import ml_dtypes
import numpy as np

from vtnumba.testing import reference

BF16 = np.dtype(ml_dtypes.bfloat16)
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
OUT_DTYPES = [F32, F16, BF16]
BLOCK = 128
# (out dtype, per-row x per-channel scales, bias dtype): the GPU tests' epilogue cases
EPILOGUE_CASES = [
    (F32, False, None),
    (F32, True, F32),
    (F16, True, F16),
    (F16, False, F32),
    (BF16, True, BF16),
    (BF16, False, None),
]


def kernels_here(name):
    """The kernel module ``vtnumba.cuda.kernels.<name>`` where its kernels run on this GPU, else the
    test skips with the module's own reason (``unavailable_reason``)."""
    import importlib

    import pytest

    from vtnumba.cuda.runtime import device

    module = importlib.import_module(f"vtnumba.cuda.kernels.{name}")
    reason = module.unavailable_reason(device.current())
    if reason:
        pytest.skip(reason)
    return module


def scales_and_bias(rng, m, n, vector_scales, bias_dtype):
    """(scale_a, scale_b, bias) of an epilogue case: signed per-row and positive per-channel float32
    vectors (or two scalars, one negative), and a standard-normal bias of ``bias_dtype`` (or None)."""
    sa = rng.uniform(-0.02, 0.02, m).astype(np.float32) if vector_scales else np.float32(0.015)
    sb = rng.uniform(0.001, 0.01, n).astype(np.float32) if vector_scales else np.float32(-0.25)
    bias = None if bias_dtype is None else rng.standard_normal(n).astype(bias_dtype)
    return sa, sb, bias


def to_device(xp, v):
    """``v`` as an ``xp`` array; scalars and None as they are."""
    return v if v is None or np.isscalar(v) else xp.asarray(v)


def launch_tc_f32(tc, xp, config, promotion, chain, a, b):
    """y = a @ b^T (float32 out, unit scales) from tc_gemm's kernel for one configuration, every
    element NaN-poisoned first; ``xp`` is numpy under the simulator, cupy on a GPU."""
    cfg = tc.GEMM_CONFIGS[config]
    (m, _), n = a.shape, b.shape[0]
    bm, bn = tc.tile_shape(cfg)
    y = xp.full((m, n), xp.nan, dtype=xp.float32)
    one = xp.ones(1, xp.float32)
    tc.gemm_launcher(cfg, promotion, False, chain, True)(
        (-(-n // bn), -(-m // bm)), 32 * cfg.wm * cfg.wn, a, b, one, 0, one, 0, xp.zeros(1, xp.uint16), 0, y, 0
    )
    return y


def uniform_codes(rng, shape, nan_codes=False):
    """Codes drawn uniformly over the e4m3 code space (magnitudes 2^-9 .. 448 equally likely): the
    adversarial case for accumulation, where cuBLASLt misses G3 by up to 16x."""
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C
    if nan_codes:
        codes.flat[0] = 0x7F
        codes.flat[-1] = 0xFF
    return codes


def block_case(rng, m):
    """A block-scaled GEMM case with M rows: N = 300 (three weight row blocks, the last partial),
    K = 1088 (nine K blocks, the last 64 wide), uniformly drawn codes with NaNs in a, per-group
    activation scales [M, 9], signed block scales [3, 9], a bfloat16 bias: (a, b, sa, sb, bias)."""
    n, k = 300, 1088
    a, b = uniform_codes(rng, (m, k), nan_codes=True), uniform_codes(rng, (n, k))
    sa = rng.uniform(0.001, 0.02, (m, 9)).astype(np.float32)
    sb = rng.uniform(-0.05, 0.05, (3, 9)).astype(np.float32)
    bias = rng.standard_normal(n).astype(BF16)
    return a, b, sa, sb, bias


def block_reference(a, b, scale_a, scale_b, bias=None):
    """DESIGN.md's block-scaled GEMM in float64 and its G3 bound: ref = bias + sum_kb P_kb *
    sa[m, kb] * sb[n // 128, kb] with exact P_kb; bound = 4 K eps32 sum_kb |sa sb| sum_(k in kb)
    |terms| (each block's float32 sum, the scaling and the sum over blocks stay inside it)."""
    da, db = reference.decode(a), reference.decode(b)
    m, k = da.shape
    n = db.shape[0]
    sa = np.asarray(scale_a, dtype=np.float64)
    sb = np.asarray(scale_b, dtype=np.float64)[np.arange(n) // BLOCK]  # [N, KB]
    ref = np.zeros((m, n))
    weight = np.zeros((m, n))
    for kb in range(-(-k // BLOCK)):
        ks = slice(kb * BLOCK, (kb + 1) * BLOCK)
        s = sa[:, kb : kb + 1] * sb[:, kb][None, :]
        ref += (da[:, ks] @ db[:, ks].T) * s
        weight += (np.abs(da[:, ks]) @ np.abs(db[:, ks]).T) * np.abs(s)
    if bias is not None:
        ref += np.asarray(bias, dtype=np.float64).reshape(1, -1)
    return ref, 4.0 * k * reference.EPS32 * weight


def group_quantize(x):
    """Upstream's per_token_group_quant_fp8 with g = 128, in numpy float32: scale = max(amax_group,
    1e-10) / 448 (amax over finite values), codes = encode(x / scale). Returns (codes, scales [M, KB])."""
    xf = np.asarray(x).astype(np.float32)
    m, k = xf.shape
    kb = -(-k // BLOCK)
    codes = np.empty((m, k), dtype=np.uint8)
    scales = np.empty((m, kb), dtype=np.float32)
    for j in range(kb):
        part = xf[:, j * BLOCK : (j + 1) * BLOCK]
        mag = np.abs(part)
        amax = np.where(np.isfinite(mag), mag, np.float32(0)).max(axis=1, keepdims=True)
        s = (np.maximum(amax, np.float32(1e-10)) / np.float32(448.0)).astype(np.float32)
        scales[:, j] = s[:, 0]
        codes[:, j * BLOCK : (j + 1) * BLOCK] = reference.encode((part / s).astype(np.float32))
    return codes, scales


def check_g3(y, ref, bound, out_dtype):
    """y within bound + the out dtype's rounding of ref, NaN exactly where ref is NaN. Returns
    (elements compared that are finite and non-zero, worst err / bound)."""
    y = np.asarray(y)
    assert y.dtype == out_dtype and y.shape == ref.shape
    got = y.astype(np.float64)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    tol = bound + reference.out_rounding(ref, out_dtype)
    err = np.abs(got - ref)
    bad = ~nan & ~(err <= tol)
    assert not bad.any(), f"{bad.sum()} outside G3, worst err {err[bad].max()} vs tol {tol[bad].min()}"
    ok = ~nan & (bound > 0)
    worst = float(np.max(err[ok] / bound[ok])) if ok.any() else 0.0
    return int((~nan & (ref != 0)).sum()), worst


# -- the fragment layout, checked on one warp -------------------------------------------------------
cuda = types = mma = None  # bound by mma_layout_check (module globals: the simulator swaps `cuda`)


def _pack(codes, row, k0):
    return (
        np.uint32(codes[row, k0])
        | (np.uint32(codes[row, k0 + 1]) << np.uint32(8))
        | (np.uint32(codes[row, k0 + 2]) << np.uint32(16))
        | (np.uint32(codes[row, k0 + 3]) << np.uint32(24))
    )


def _pack16(bits, row, k0):
    return np.uint32(bits[row, k0]) | (np.uint32(bits[row, k0 + 1]) << np.uint32(16))


def _layout_kernel(mma_fn, pack, per_register):
    """One warp, lane 4 g + t: A rows g, g + 8 and B column g packed from ``a`` / ``b`` at k =
    per_register t and per_register (t + 4) (``per_register`` codes or halves a register), the mma
    ``mma_fn`` run with C from ``c``, D written to ``d`` by the C layout."""
    half = 4 * per_register

    def kernel(a, b, c, d):
        scratch = cuda.shared.array(192, types.uint32)  # mma.SCRATCH_WORDS_PER_WARP
        lane = cuda.threadIdx.x
        g = lane // 4
        k = per_register * (lane % 4)
        t2 = 2 * (lane % 4)
        d0, d1, d2, d3 = mma_fn(
            pack(a, g, k),
            pack(a, g + 8, k),
            pack(a, g, k + half),
            pack(a, g + 8, k + half),
            pack(b, g, k),
            pack(b, g, k + half),
            c[g, t2],
            c[g, t2 + 1],
            c[g + 8, t2],
            c[g + 8, t2 + 1],
            scratch,
            0,
            lane,
        )
        d[g, t2] = d0
        d[g, t2 + 1] = d1
        d[g + 8, t2] = d2
        d[g + 8, t2 + 1] = d3

    return kernel


def _cvt_kernel(words, out):
    i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    if i < words.shape[0]:
        lo, hi = mma.cvt_e4m3x4_f16(words[i])
        out[2 * i] = lo
        out[2 * i + 1] = hi


def _bind():
    global cuda, types, mma
    from vtnumba.cuda.ptx import mma as mma_module
    from vtnumba.cuda.ptx.target import cuda as cuda_module
    from vtnumba.cuda.ptx.target import types as types_module

    cuda, types, mma = cuda_module, types_module, mma_module


def _launch(kernel, grid, block, host_args, to_device, to_host, out_index):
    args = list(host_args) if to_device is None else [to_device(v) for v in host_args]
    cuda.jit(kernel)[grid, block](*args)
    return args[out_index] if to_host is None else to_host(args[out_index])


def mma_f16_layout_check(rng, to_device=None, to_host=None):
    """mma_layout_check for the f16 m16n8k16 mma (vtnumba/cuda/ptx/mma.py's f16 fragments): A [16, 16]
    and B [8, 16] hold decoded e4m3 codes as f16 (every product exact). Returns (D, A B^T + C, G3
    bound)."""
    _bind()
    a, b = uniform_codes(rng, (16, 16)), uniform_codes(rng, (8, 16))
    a16, b16 = (reference.decode(v).astype(np.float16).view(np.uint16) for v in (a, b))
    c = rng.standard_normal((16, 8)).astype(np.float32)
    kernel = _layout_kernel(mma.mma_f16, cuda.jit(device=True)(_pack16), 2)
    d = _launch(kernel, 1, 32, [a16, b16, c, np.full((16, 8), np.nan, dtype=np.float32)], to_device, to_host, 3)
    ref, bound = reference.scaled_mm(a, b, 1.0, 1.0)
    return d, ref + c, bound


def cvt_f16_check(to_device=None, to_host=None):
    """All 256 codes through cvt_e4m3x4_f16 (four a word): (got, expected) f16 bit patterns, the
    expected from reference.decode (exact in f16)."""
    _bind()
    codes = np.arange(256, dtype=np.uint8)
    words = codes.view(np.uint32).copy()  # code 4 i + j in byte j of word i
    got = _launch(_cvt_kernel, 1, 64, [words, np.zeros(128, dtype=np.uint32)], to_device, to_host, 1)
    return got.view(np.uint16), reference.decode(codes).astype(np.float16).view(np.uint16)


def assert_same_f16(got, want):
    """Bit-equal f16 patterns, any NaN payload matching any NaN. Returns the values compared."""
    got_nan, want_nan = (np.isnan(v.view(np.float16)) for v in (got, want))
    np.testing.assert_array_equal(got_nan, want_nan)
    np.testing.assert_array_equal(got[~want_nan], want[~want_nan])
    return int((~want_nan).sum())


def mma_layout_check(rng, to_device=None, to_host=None):
    """One warp loads A [16, 32] and B [8, 32] into fragments exactly as vtnumba/cuda/ptx/mma.py
    documents (lane 4 g + t: A rows g, g + 8 at k 4t.. and 4t + 16..; B column g), runs the mma with
    a non-zero C and writes D by the C layout. Returns (D, ref = A B^T + C, G3 bound)."""
    _bind()
    a, b = uniform_codes(rng, (16, 32)), uniform_codes(rng, (8, 32))
    c = rng.standard_normal((16, 8)).astype(np.float32)
    kernel = _layout_kernel(mma.mma_e4m3, cuda.jit(device=True)(_pack), 4)
    d = _launch(kernel, 1, 32, [a, b, c, np.full((16, 8), np.nan, dtype=np.float32)], to_device, to_host, 3)
    ref, bound = reference.scaled_mm(a, b, 1.0, 1.0)
    return d, ref + c, bound
