"""The GEMM epilogue every Numba GEMM kernel shares: scales, bias and rounding to the output type,
plus the kernel that applies it to a float32 accumulator (the f32-staged cuBLASLt path).

Every kernel computes DESIGN.md's
    y[m, n] = round_out((sum_k dec(a[m, k]) * dec(b[n, k])) * sa[m] * sb[n] + float32(bias[n]))
with the scales applied as ``(acc * sa) * sb`` in float32 (upstream's order: two scalar
multiplies) and the output rounded to nearest even.

Argument conventions shared by the GEMM kernels (the launcher takes them as fixed signatures):
- scales: float32 vectors with a step, read as ``s[i * step]``: step 0 for a per-tensor scale
  (shape (1,)), step 1 for per-row / per-channel.
- bias: uint16 bits with a ``BiasKind``, so one signature serves every bias dtype and a kernel
  compiles once per output type (a float32 bias travels as two little-endian uint16 halves).
- output: float32 [M, N], or uint16 [M, N] holding float16 or bfloat16 bits, by ``OutKind``.
"""

import enum
import functools

import numpy as np

from .. import _arrays
from .codec import (
    bfloat16_bits_to_float32,
    bits_float32,
    compile_device,
    float32_to_bfloat16_bits,
    float32_to_half_bits,
    half_bits_to_float32,
)
from .launch import compile_kernel
from .target import cuda, types


class BiasKind(enum.IntEnum):
    """How a kernel reads its bias argument (uint16 bits)."""

    NONE = 0
    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3


class OutKind(enum.IntEnum):
    """What a kernel writes: float32 values, or float16 / bfloat16 bits in a uint16 array."""

    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2


BIAS_KIND = {np.dtype(np.float32): BiasKind.FLOAT32, np.dtype(np.float16): BiasKind.FLOAT16,
             _arrays.BFLOAT16: BiasKind.BFLOAT16}
OUT_KIND = {np.dtype(np.float32): OutKind.FLOAT32, np.dtype(np.float16): OutKind.FLOAT16,
            _arrays.BFLOAT16: OutKind.BFLOAT16}


def _load_bias(bias, kind, n):
    """bias[n] as float32 from its uint16 bits; exact."""
    if kind == BiasKind.FLOAT32:
        return bits_float32(np.uint32(bias[2 * n]) | (np.uint32(bias[2 * n + 1]) << np.uint32(16)))
    if kind == BiasKind.FLOAT16:
        return half_bits_to_float32(bias[n])
    return bfloat16_bits_to_float32(bias[n])


def _scaled_value(acc, scale_a, scale_b, has_bias, bias_value):
    """(acc * sa) * sb + bias_value, in float32 (the bias already read as float32)."""
    v = np.float32(np.float32(acc * scale_a) * scale_b)
    if has_bias:
        v = np.float32(v + bias_value)
    return v


def _epilogue_value(acc, scale_a, scale_b, bias, bias_kind, n):
    """(acc * sa) * sb + float32(bias[n]), in float32."""
    return scaled_value(acc, scale_a, scale_b, bias_kind != BiasKind.NONE,
                        load_bias(bias, bias_kind, n) if bias_kind != BiasKind.NONE else np.float32(0.0))


def _store_out(y, m, n, v, out_kind):
    """y[m, n] = round(v) into float32 or float16 / bfloat16 bits."""
    if out_kind == OutKind.FLOAT32:
        y[m, n] = v
    elif out_kind == OutKind.FLOAT16:
        y[m, n] = float32_to_half_bits(v)
    else:
        y[m, n] = float32_to_bfloat16_bits(v)


load_bias = compile_device(_load_bias, half_bits_to_float32=half_bits_to_float32,
                           bfloat16_bits_to_float32=bfloat16_bits_to_float32)
scaled_value = compile_device(_scaled_value)
epilogue_value = compile_device(_epilogue_value, load_bias=load_bias, scaled_value=scaled_value)
store_out = compile_device(_store_out, float32_to_half_bits=float32_to_half_bits,
                           float32_to_bfloat16_bits=float32_to_bfloat16_bits)


def _epilogue_kernel(acc, y, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, out_kind):
    """y = round_out((acc * sa) * sb + bias) over a float32 accumulator [M, N]; grid-stride."""
    m_total, n_total = acc.shape
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < m_total * n_total:
        m = i // n_total
        n = i - m * n_total
        v = epilogue_value(acc[m, n], scale_a[m * sa_step], scale_b[n * sb_step], bias, bias_kind, n)
        store_out(y, m, n, v, out_kind)
        i += stride


# kernel signature pieces shared by the GEMM kernel families
U8_2D = types.uint8[:, :]
U16_2D = types.uint16[:, :]
F32_1D = types.float32[::1]
U16_1D = types.uint16[::1]
I64 = types.int64
I32 = types.int32


def out_type(out_is_float32):
    return types.float32[:, ::1] if out_is_float32 else types.uint16[:, ::1]


@functools.lru_cache(maxsize=None)
def epilogue_kernel(out_is_float32):
    sig = (types.float32[:, ::1], out_type(out_is_float32), F32_1D, I64, F32_1D, I64, U16_1D, I32, I32)
    return compile_kernel(_epilogue_kernel, sig)


__all__ = ["BiasKind", "OutKind", "BIAS_KIND", "OUT_KIND", "load_bias", "scaled_value", "epilogue_value",
           "store_out", "epilogue_kernel", "out_type"]
