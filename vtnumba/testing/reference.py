"""An oracle for vtnumba, written independently of its kernels.

The encoder enumerates the e4m3fn grid from its definition and picks the nearest grid value by
scanning, ties to the even significand; no frexp, no bit tricks, no shared code with
``vtnumba._format``. It is slow (a 65536 x 127 distance table per chunk) and meant for tests.
The quantizers follow DESIGN.md's formulas with numpy float32 arithmetic; the GEMM reference is
float64 over the lossy pipeline, with DESIGN.md's G3 error bound.
"""

from dataclasses import dataclass

import ml_dtypes
import numpy as np

MAX = 448.0
NAN_CODE = 0x7F


def _grid():
    """The 127 finite non-negative e4m3fn magnitudes, index = code (0x00..0x7E), as float64."""
    values = []
    for code in range(0x7F):
        exponent, mantissa = code >> 3, code & 7
        if exponent == 0:
            values.append(mantissa * 2.0**-9)  # subnormal: m/8 * 2^(1-7)
        else:
            values.append((1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7))
    return np.array(values, dtype=np.float64)


GRID = _grid()
assert GRID[0x7E] == MAX and GRID[0x08] == 2.0**-6 and GRID[0x01] == 2.0**-9


def _widen(x):
    x = np.asarray(x)
    if x.dtype in (np.float16, np.dtype(ml_dtypes.bfloat16)):
        return x.astype(np.float32)
    if x.dtype != np.float32:
        raise TypeError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    return x


def encode(x):
    """float32 (or f16/bf16, widened exactly) -> uint8 e4m3fn codes, by nearest-grid scanning."""
    x = _widen(x)
    flat = x.reshape(-1)
    out = np.empty(flat.size, dtype=np.uint8)
    step = 1 << 15
    for lo in range(0, flat.size, step):
        v = flat[lo : lo + step].astype(np.float64)
        neg = np.signbit(v)
        a = np.abs(v)
        nan = np.isnan(a)
        a = np.where(nan, 0.0, np.minimum(a, MAX))  # clamp (inf too), then round
        dist = np.abs(a[:, None] - GRID[None, :])
        best = np.argmin(dist, axis=1)  # the lower code on a tie
        nxt = np.minimum(best + 1, 0x7E)
        tie = (dist[np.arange(a.size), nxt] == dist[np.arange(a.size), best]) & (nxt != best)
        best = np.where(tie & (best % 2 == 1), nxt, best)  # even code = even significand
        code = best.astype(np.uint8) | np.where(neg, 0x80, 0).astype(np.uint8)
        out[lo : lo + step] = np.where(nan, NAN_CODE, code)
    return out.reshape(x.shape)


def decode(codes):
    """uint8 codes -> float64 values; 0x7F / 0xFF -> NaN."""
    codes = np.asarray(codes).view(np.uint8) if np.asarray(codes).dtype != np.uint8 else np.asarray(codes)
    mag = codes & 0x7F
    val = np.where(mag == 0x7F, np.nan, GRID[np.minimum(mag, 0x7E)])
    return np.where(codes & 0x80, -val, val)


FLOOR = np.float32(1.0) / (np.float32(448.0) * np.float32(512.0))


@dataclass
class Quantized:
    data: np.ndarray
    scale: np.ndarray


def _finite_amax(x, axis=None, keepdims=False):
    a = np.abs(x)
    a = np.where(np.isfinite(a), a, np.float32(0))
    return np.max(a, axis=axis, keepdims=keepdims).astype(np.float32)


def quantize(x, scale=None, *, per_token=False, scale_ub=None):
    """Reference quantizer for the three modes of DESIGN.md (numpy float32 arithmetic)."""
    xf = _widen(x)
    if per_token:
        t = _finite_amax(xf, axis=1, keepdims=True)
        if scale_ub is not None:
            t = np.minimum(t, np.float32(scale_ub))
        s = np.maximum(t / np.float32(448.0), FLOOR).astype(np.float32)
        return Quantized(encode((xf / s).astype(np.float32)), s)
    if scale is None:
        scale = np.maximum(_finite_amax(xf) / np.float32(448.0), FLOOR)
    s = np.float32(scale)
    inv = np.float32(1.0) / s
    return Quantized(encode((xf * inv).astype(np.float32)), np.array([s], dtype=np.float32))


EPS32 = float(np.finfo(np.float32).eps)


def scaled_mm(a, b, scale_a, scale_b, bias=None):
    """float64 reference of the lossy pipeline and its G3 bound.

    Returns (ref, bound): ref[m, n] = (sum_k dec(a) dec(b)) * sa * sb + bias[n] computed in
    float64 over exact products; bound = 4 * K * eps32 * |sa * sb| * sum_k |dec(a) dec(b)|, the
    float32-accumulation allowance (add the out dtype's rounding on top)."""
    da, db = decode(a), decode(b)
    k = da.shape[1]
    sa = np.asarray(scale_a, dtype=np.float64).reshape(-1, 1) if np.ndim(scale_a) else float(scale_a)
    sb = np.asarray(scale_b, dtype=np.float64).reshape(1, -1) if np.ndim(scale_b) else float(scale_b)
    acc = da @ db.T
    absacc = np.abs(da) @ np.abs(db).T
    ref = acc * sa * sb
    if bias is not None:
        ref = ref + np.asarray(bias, dtype=np.float64).reshape(1, -1)
    bound = 4.0 * k * EPS32 * np.abs(sa * sb) * absacc
    return ref, bound


# cuBLASLt's FP8 GEMM on Hopper does not accumulate every product in float32 (measured on the H200:
# up to ~16x the G3 bound on uniformly drawn codes, bit-identical to torch._scaled_mm, FAST_ACCUM
# off). The model behind this bound: the tensor cores add each 32-wide k-group of exact FP8 products
# to their accumulator after aligning them to the largest magnitude present, keeping about 14
# significant bits (DeepSeek-V3 technical report, section 3.3.2: "limited to retaining around 14
# bits"), and the library promotes the accumulator to float32 registers every 4 such groups (128
# products, CUTLASS's FP8 mainloop promotion interval). Per group that loses at most 33 units of
# 2^-13 of the chunk's magnitude; 4 groups per chunk give 132 * 2^-13 of the chunk's sum of |terms|.
# A bit-level simulation of that model stays inside it (tests/test_cpu_gemm.py), and so does the
# H200: its worst error, ~16x G3 at K = 256 (2^-9 of the sum of |terms|), is 8x inside the bound.
TENSOR_CORE_REL = 132 * 2.0**-13


def tensor_core_bound(a, b, scale_a, scale_b):
    """The error allowance for a GEMM run on Hopper FP8 tensor cores (cuBLASLt): |sa * sb| *
    sum_k |dec(a) dec(b)| * TENSOR_CORE_REL, on top of G3's float32 bound. A model, loose by design
    (it catches a wrong scale, bias or layout, not a subtle accumulation change); the strict G3
    bound holds for every Numba kernel and the CPU."""
    _, g3 = scaled_mm(a, b, scale_a, scale_b)
    k = decode(a).shape[1]
    return g3 * (1.0 + TENSOR_CORE_REL / (4.0 * k * EPS32))


def out_rounding(ref, out_dtype):
    """Half an ulp of ``out_dtype`` at |ref| (the allowance for the final RNE rounding), with the
    float32 product-with-scales rounding folded in."""
    dt = np.dtype(out_dtype)
    eps = {np.dtype(np.float32): 2.0**-23, np.dtype(np.float16): 2.0**-10, np.dtype(ml_dtypes.bfloat16): 2.0**-7}[dt]
    tiny = {np.dtype(np.float32): 2.0**-149, np.dtype(np.float16): 2.0**-24, np.dtype(ml_dtypes.bfloat16): 2.0**-133}[
        dt
    ]
    return np.abs(ref) * (eps / 2 + 2 * EPS32) + tiny


# -- block-scaled FP8 (per-group activations, block-scaled weights) ---------------------------------

GROUP_EPS = np.float32(1e-10)  # upstream's eps, as the float32 its kernels receive
TINY32 = 2.0**-149  # float32's smallest subnormal: twice the most a product rounded into subnormals loses


def _ceil_power_of_two(s):
    """The smallest power of two >= s, for positive normal float32 s, found with frexp (s = f * 2^e,
    f in [0.5, 1)); written apart from the kernels' exponent-bit form on purpose."""
    f, e = np.frexp(np.asarray(s, dtype=np.float64))
    return np.ldexp(1.0, np.where(f == 0.5, e - 1, e)).astype(np.float32)


def quantize_per_group(x, group_size, scale_ue8m0=False):
    """Per-token-group quantization (upstream vLLM's ``per_token_group_quant_fp8``): each run of
    ``group_size`` elements along the last axis gets ``scale = max(amax, 1e-10) / 448`` in float32
    (amax over the group's finite values, as every vtnumba amax: NaN encodes to 0x7F and inf
    saturates whatever the scale), then ``codes = encode(x / scale)``, a true float32 division.
    ``scale_ue8m0``: the scale becomes the smallest power of two >= max(scale, 1e-10) (upstream's CUDA
    kernel). A last group shorter than ``group_size`` (K % group_size != 0) takes its own amax, as
    upstream's torch-native QuantFP8 does by zero-padding. Returns Quantized(data uint8 x.shape,
    scale float32 x.shape[:-1] + (ceil(K / group_size),))."""
    xf = _widen(x)
    k = xf.shape[-1]
    rows = xf.reshape(-1, k)
    groups = -(-k // group_size)
    codes = np.empty(rows.shape, dtype=np.uint8)
    scales = np.empty((rows.shape[0], groups), dtype=np.float32)
    for j in range(groups):
        part = rows[:, j * group_size : (j + 1) * group_size]
        s = (np.maximum(_finite_amax(part, axis=1, keepdims=True), GROUP_EPS) / np.float32(448.0)).astype(np.float32)
        if scale_ue8m0:
            s = _ceil_power_of_two(np.maximum(s, GROUP_EPS))
        with np.errstate(over="ignore", invalid="ignore"):
            codes[:, j * group_size : (j + 1) * group_size] = encode((part / s).astype(np.float32))
        scales[:, j] = s[:, 0]
    return Quantized(codes.reshape(xf.shape), scales.reshape(xf.shape[:-1] + (groups,)))


def block_scaled_mm(a, b, scale_a, scale_b, block_size, bias=None):
    """float64 reference of the block-scaled GEMM and its G3-per-block bound.

    ``y[m, n] = bias[n] + sum_kb (P[m, n, kb] * sa[m, kb]) * sb[n // bn, kb]``, with
    ``P[m, n, kb] = sum_{k in block kb} dec(a[m, k]) * dec(b[n, k])``, the K-blocks
    ``[kb * bk, min(K, (kb + 1) * bk))`` (the last one may be short), scale_a [M, ceil(K / bk)],
    scale_b [ceil(N / bn), ceil(K / bk)]. P is exact here: every product of two e4m3 values is a
    multiple of 2^-18 below 2^18, so float64 holds any sum of up to 2^17 of them exactly.

    Returns (ref, bound). The bound covers a float32 pipeline that sums each P in float32 (any order),
    scales it with two float32 multiplies in either order, and sums the scaled blocks in float32
    (any order), with u = eps32 / 2 the unit roundoff:

    - block kb, with A = sum_{k in kb} |dec(a) dec(b)| and s = |sa * sb|: a float32 sum of bk_eff
      exact products errs by at most (bk_eff - 1) * u * A; the two multiplies add (1 + u)^2 - 1 of
      relative error, plus at most 2^-150 each where a product lands among float32's subnormals (the
      first one's loss is then magnified by |sb|). Allowed: e_kb = s * A * (4 * bk_eff + 2) * eps32
      + 2^-149 * (1 + |sb|), which holds those with room for the float64 reference's own rounding.
    - the cross-block sum of nkb scaled blocks (per-step rounding of the running float32 sum)
      errs by at most (nkb - 1) * u * sum_kb |block_kb|, and |block_kb| <= s * A + e_kb. Allowed:
      4 * nkb * eps32 * sum_kb (s * A + e_kb).
    - the bias add and the rounding to the out dtype: ``out_rounding(ref, out_dtype)`` on top (its
      2 * eps32 * |ref| term covers the float32 bias add), with the bound widened by (1 + eps32) for
      the bias add's rounding of the error already allowed.

    Sums that cancel are covered: every term uses magnitudes. A NaN code gives NaN in ref and bound.
    Scales given as uint8 are E8M0 bytes (``decode_e8m0``; 0xFF, NaN, poisons its block like a NaN code).
    """
    bn, bk = (int(v) for v in block_size)
    da, db = decode(a), decode(b)
    m, k = da.shape
    n = db.shape[0]
    nkb = -(-k // bk)
    sa = _block_scales(scale_a).reshape(m, nkb)
    sb = _block_scales(scale_b).reshape(-(-n // bn), nkb)
    sb_rows = np.repeat(sb, bn, axis=0)[:n]  # [N, nkb]: the weight scale of each output row
    ref = np.zeros((m, n))
    blocks_abs = np.zeros((m, n))
    blocks_err = np.zeros((m, n))
    for kb in range(nkb):
        lo, hi = kb * bk, min(k, (kb + 1) * bk)
        p = da[:, lo:hi] @ db[:, lo:hi].T
        absum = np.abs(da[:, lo:hi]) @ np.abs(db[:, lo:hi]).T
        s = sa[:, kb : kb + 1] * sb_rows[None, :, kb]
        ref += p * s
        term = absum * np.abs(s)
        blocks_abs += term
        blocks_err += term * ((4 * (hi - lo) + 2) * EPS32) + TINY32 * (1.0 + np.abs(sb_rows[None, :, kb]))
    bound = (blocks_err + 4.0 * nkb * EPS32 * (blocks_abs + blocks_err)) * (1.0 + EPS32)
    if bias is not None:
        ref = ref + np.asarray(bias, dtype=np.float64).reshape(1, -1)
    return ref, bound


def block_tensor_core_allowance(a, b, scale_a, scale_b, block_size):
    """What Hopper's tensor cores add to ``block_scaled_mm``'s bound when they accumulate each block
    (cuBLASLt's block scaling, the wgmma kernels): ``TENSOR_CORE_REL`` of each block's scaled sum of
    |terms|, sum_kb |sa sb| sum |terms| -- the same reference run on magnitudes (codes without their
    sign bit)."""
    magnitudes, _ = block_scaled_mm(
        np.asarray(a) & 0x7F,
        np.asarray(b) & 0x7F,
        np.abs(_block_scales(scale_a)),
        np.abs(_block_scales(scale_b)),
        block_size,
    )
    return TENSOR_CORE_REL * magnitudes


def _block_scales(scale):
    """Block or group scales as float64: uint8 (or ml_dtypes.float8_e8m0fnu) arrays are E8M0 bytes."""
    scale = np.asarray(scale)
    if scale.dtype == np.uint8 or scale.dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
        return decode_e8m0(scale)
    return scale.astype(np.float64)


# -- MXFP8 (OCP Microscaling Formats v1.0): e4m3 elements, one E8M0 scale byte per group ----------------

E8M0_NAN = 0xFF
RCP_448 = np.float32(1.0 / 448.0)  # the rceil rule's multiplier: float32(1 / 448), as torchao forms it


def decode_e8m0(scales):
    """E8M0 bytes (uint8 or ml_dtypes.float8_e8m0fnu) -> float64 2^(byte - 127); 0xFF -> NaN. Every
    byte 0..254 is a power of two that float32 holds exactly (byte 0, 2^-127, as a subnormal)."""
    b = np.asarray(scales).view(np.uint8).astype(np.int64)
    return np.where(b == E8M0_NAN, np.nan, np.ldexp(1.0, b - 127))


def e8m0_bytes(amax, rounding="rceil"):
    """The E8M0 byte of each group scale from the groups' finite amax (float32, >= 0), found with
    frexp on float64 (exact for every float32), apart from the kernels' exponent-bit form:

    - ``"rceil"``: the smallest power of two >= float32(amax * float32(1 / 448)); 2^-127 when that
      product is at most 2^-127 (zero included).
    - ``"floor"``: 2^(floor(log2(amax)) - 8) (OCP MX v1.0, section 6.3: e4m3's emax is 8), at least
      2^-127 (an all-zero group gets 2^-127)."""
    amax = np.asarray(amax, dtype=np.float32)
    if rounding == "rceil":
        s = (amax * RCP_448).astype(np.float32).astype(np.float64)
        f, e = np.frexp(s)  # s = f * 2^e, f in [0.5, 1)
        p = np.where(s == 0, -127, np.where(f == 0.5, e - 1, e))
    elif rounding == "floor":
        f, e = np.frexp(amax.astype(np.float64))
        p = np.where(amax == 0, -127, (e - 1) - 8)
    else:
        raise ValueError(f"rounding must be 'rceil' or 'floor', got {rounding!r}")
    return (np.clip(p, -127, 127) + 127).astype(np.uint8)


def quantize_mx(x, group_size=32, rounding="rceil"):
    """MX quantization along the last axis: per group of ``group_size`` (32 in the OCP MX formats), the
    group's finite amax gives an E8M0 byte (``e8m0_bytes``), and ``codes = encode(x / 2^(byte - 127))``,
    a float32 division (exact but for the one rounding, the divisor being a power of two). A last
    group shorter than ``group_size`` takes its own amax. NaN encodes to 0x7F and +-inf saturates
    without entering amax (vtnumba's NaN policy), so no byte is 0xFF. Returns Quantized(data uint8
    x.shape, scale uint8 x.shape[:-1] + (ceil(K / group_size),))."""
    xf = _widen(x)
    k = xf.shape[-1]
    rows = xf.reshape(-1, k)
    groups = -(-k // group_size)
    codes = np.empty(rows.shape, dtype=np.uint8)
    scales = np.empty((rows.shape[0], groups), dtype=np.uint8)
    for j in range(groups):
        part = rows[:, j * group_size : (j + 1) * group_size]
        byte = e8m0_bytes(_finite_amax(part, axis=1), rounding)
        divisor = decode_e8m0(byte).astype(np.float32)[:, None]
        with np.errstate(over="ignore", invalid="ignore"):
            codes[:, j * group_size : (j + 1) * group_size] = encode((part / divisor).astype(np.float32))
        scales[:, j] = byte
    return Quantized(codes.reshape(xf.shape), scales.reshape(xf.shape[:-1] + (groups,)))
