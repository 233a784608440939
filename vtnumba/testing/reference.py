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
            values.append(mantissa * 2.0 ** -9)  # subnormal: m/8 * 2^(1-7)
        else:
            values.append((1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7))
    return np.array(values, dtype=np.float64)


GRID = _grid()
assert GRID[0x7E] == MAX and GRID[0x08] == 2.0 ** -6 and GRID[0x01] == 2.0 ** -9


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
        v = flat[lo:lo + step].astype(np.float64)
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
        out[lo:lo + step] = np.where(nan, NAN_CODE, code)
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
TENSOR_CORE_REL = 132 * 2.0 ** -13


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
    eps = {np.dtype(np.float32): 2.0 ** -23, np.dtype(np.float16): 2.0 ** -10,
           np.dtype(ml_dtypes.bfloat16): 2.0 ** -7}[dt]
    tiny = {np.dtype(np.float32): 2.0 ** -149, np.dtype(np.float16): 2.0 ** -24,
            np.dtype(ml_dtypes.bfloat16): 2.0 ** -133}[dt]
    return np.abs(ref) * (eps / 2 + 2 * EPS32) + tiny
