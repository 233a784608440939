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

from ... import _arrays
from ..ptx.codec import (
    bfloat16_bits_to_float32,
    bits_float32,
    compile_device,
    float32_bits,
    float32_to_bfloat16_bits,
    float32_to_half_bits,
    half_bits_to_float32,
    load_u32x4,
    store_u32x4,
)
from ..ptx.target import cuda, types
from ..runtime import device
from ..runtime.launch import compile_kernel


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


BIAS_KIND = {
    np.dtype(np.float32): BiasKind.FLOAT32,
    np.dtype(np.float16): BiasKind.FLOAT16,
    _arrays.BFLOAT16: BiasKind.BFLOAT16,
}
OUT_KIND = {
    np.dtype(np.float32): OutKind.FLOAT32,
    np.dtype(np.float16): OutKind.FLOAT16,
    _arrays.BFLOAT16: OutKind.BFLOAT16,
}


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
    return scaled_value(
        acc,
        scale_a,
        scale_b,
        bias_kind != BiasKind.NONE,
        load_bias(bias, bias_kind, n) if bias_kind != BiasKind.NONE else np.float32(0.0),
    )


def _store_out(y, m, n, v, out_kind):
    """y[m, n] = round(v) into float32 or float16 / bfloat16 bits."""
    if out_kind == OutKind.FLOAT32:
        y[m, n] = v
    elif out_kind == OutKind.FLOAT16:
        y[m, n] = float32_to_half_bits(v)
    else:
        y[m, n] = float32_to_bfloat16_bits(v)


load_bias = compile_device(
    _load_bias, half_bits_to_float32=half_bits_to_float32, bfloat16_bits_to_float32=bfloat16_bits_to_float32
)
scaled_value = compile_device(_scaled_value)
epilogue_value = compile_device(_epilogue_value, load_bias=load_bias, scaled_value=scaled_value)
store_out = compile_device(
    _store_out, float32_to_half_bits=float32_to_half_bits, float32_to_bfloat16_bits=float32_to_bfloat16_bits
)


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


# The f32-staged path's epilogue streams the accumulator once (4 bytes read, 2 or 4 written per
# element), so it is a copy-rate kernel. Each thread takes 8 consecutive elements of a row: two
# 16-byte loads of the accumulator and one 16-byte store of 16-bit outputs (two of float32), one
# row index division per 8 elements. The element-per-thread form, with a 64-bit division per
# element, ran at about 27% of the copy rate on the H200 (743 us of a 2,020 us MLP at M = 4096).
EPILOGUE_VECTOR = 8
EPILOGUE_THREADS = 256
_EPILOGUE_MAX_BLOCKS = 1 << 20  # grid-stride beyond


def _pair_bits(v0, v1, out_kind):
    """Two float32 values rounded to 16-bit outputs, packed low-first in a uint32."""
    if out_kind == OutKind.FLOAT16:
        return np.uint32(float32_to_half_bits(v0)) | (np.uint32(float32_to_half_bits(v1)) << np.uint32(16))
    return np.uint32(float32_to_bfloat16_bits(v0)) | (np.uint32(float32_to_bfloat16_bits(v1)) << np.uint32(16))


pair_bits = compile_device(
    _pair_bits, float32_to_half_bits=float32_to_half_bits, float32_to_bfloat16_bits=float32_to_bfloat16_bits
)


def _epilogue_vector_kernel(acc, y, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, out_kind, n_total, groups):
    """The epilogue over a flat float32 accumulator, 8 elements of one row per thread-step (N % 8 ==
    0, both buffers 16-byte aligned): y = round_out((acc * sa) * sb + bias), element by element the
    arithmetic of ``_epilogue_kernel``."""
    g = cuda.grid(1)
    stride = cuda.gridsize(1)
    while g < groups:
        first = g * 8
        m = first // n_total
        n = first - m * n_total
        sa = scale_a[m * sa_step]
        a0, a1, a2, a3 = load_u32x4(acc, 2 * g)
        a4, a5, a6, a7 = load_u32x4(acc, 2 * g + 1)
        v0 = epilogue_value(bits_float32(a0), sa, scale_b[n * sb_step], bias, bias_kind, n)
        v1 = epilogue_value(bits_float32(a1), sa, scale_b[(n + 1) * sb_step], bias, bias_kind, n + 1)
        v2 = epilogue_value(bits_float32(a2), sa, scale_b[(n + 2) * sb_step], bias, bias_kind, n + 2)
        v3 = epilogue_value(bits_float32(a3), sa, scale_b[(n + 3) * sb_step], bias, bias_kind, n + 3)
        v4 = epilogue_value(bits_float32(a4), sa, scale_b[(n + 4) * sb_step], bias, bias_kind, n + 4)
        v5 = epilogue_value(bits_float32(a5), sa, scale_b[(n + 5) * sb_step], bias, bias_kind, n + 5)
        v6 = epilogue_value(bits_float32(a6), sa, scale_b[(n + 6) * sb_step], bias, bias_kind, n + 6)
        v7 = epilogue_value(bits_float32(a7), sa, scale_b[(n + 7) * sb_step], bias, bias_kind, n + 7)
        if out_kind == OutKind.FLOAT32:
            store_u32x4(y, 2 * g, float32_bits(v0), float32_bits(v1), float32_bits(v2), float32_bits(v3))
            store_u32x4(y, 2 * g + 1, float32_bits(v4), float32_bits(v5), float32_bits(v6), float32_bits(v7))
        else:
            store_u32x4(
                y,
                g,
                pair_bits(v0, v1, out_kind),
                pair_bits(v2, v3, out_kind),
                pair_bits(v4, v5, out_kind),
                pair_bits(v6, v7, out_kind),
            )
        g += stride


# kernel signature pieces shared by the GEMM kernel families
U8_2D = types.uint8[:, :]
U16_2D = types.uint16[:, :]
F32_1D = types.float32[::1]
U16_1D = types.uint16[::1]
I64 = types.int64
I32 = types.int32


def out_type(out_is_float32):
    return types.float32[:, ::1] if out_is_float32 else types.uint16[:, ::1]


@functools.cache
def epilogue_kernel(out_is_float32):
    sig = (types.float32[:, ::1], out_type(out_is_float32), F32_1D, I64, F32_1D, I64, U16_1D, I32, I32)
    return compile_kernel(_epilogue_kernel, sig)


@functools.cache
def epilogue_vector_kernel(out_is_float32):
    y_type = types.float32[::1] if out_is_float32 else types.uint16[::1]
    sig = (types.float32[::1], y_type, F32_1D, I64, F32_1D, I64, U16_1D, I32, I32, I64, I64)
    return compile_kernel(_epilogue_vector_kernel, sig)


def _aligned16(a):
    try:
        return a.data.ptr % 16 == 0
    except AttributeError:  # numpy under the simulator
        return True


def epilogue_launch(acc, y_bits, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, out_kind):
    """(kernel, grid, block, args) of the epilogue from the float32 accumulator acc [M, N] into y_bits
    [M, N] (float32, or the uint16 bits of float16 / bfloat16): the 8-wide kernel where N % 8 == 0
    and both are 16-byte aligned, else the element-per-thread one."""
    m, n = acc.shape
    out_is_float32 = int(out_kind) == OutKind.FLOAT32
    if n % EPILOGUE_VECTOR == 0 and _aligned16(acc) and _aligned16(y_bits):
        groups = m * n // EPILOGUE_VECTOR
        blocks = max(1, min(-(-groups // EPILOGUE_THREADS), _EPILOGUE_MAX_BLOCKS))
        return (
            epilogue_vector_kernel(out_is_float32),
            blocks,
            EPILOGUE_THREADS,
            (
                acc.reshape(-1),
                y_bits.reshape(-1),
                scale_a,
                sa_step,
                scale_b,
                sb_step,
                bias,
                bias_kind,
                int(out_kind),
                n,
                groups,
            ),
        )
    blocks = max(1, min((m * n + 255) // 256, 4096))  # grid-stride loop: a few thousand blocks fill any GPU
    return (
        epilogue_kernel(out_is_float32),
        blocks,
        256,
        (acc, y_bits, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, int(out_kind)),
    )


# ------------------------------------------------------------------------------------------------
# host side: a call's operands as every GEMM kernel takes them (the conventions above)

_F32 = np.dtype(np.float32)


def scale_vector(scale, rows, dev):
    """(float32 device vector, step) for a scale given as a host float32 or a device array (1,) /
    (rows,): step 0 reads the one value for every row."""
    if isinstance(scale, (np.floating, float, int)):
        return dev.scalar(scale), 0
    vec = scale if len(scale.shape) == 1 else scale.reshape(-1)
    if vec.dtype != _F32:
        vec = vec.astype(_F32)  # f16 / bf16 widen exactly; DESIGN.md's scales are float32
    size = vec.shape[0]
    if size > 1 and vec.strides[0] != 4:
        vec = device.xp.ascontiguousarray(vec)
    return vec, (0 if size == 1 else 1)


def bias_bits(bias, dev):
    """(uint16 view, BiasKind) of a bias vector (a placeholder and NONE without one)."""
    if bias is None:
        return dev.placeholder("u16"), BiasKind.NONE
    if not bias.flags.c_contiguous:
        bias = device.xp.ascontiguousarray(bias)
    return bias.view(np.uint16), BIAS_KIND[np.dtype(bias.dtype)]


def out_bits(y):
    """The output as the Numba kernels write it: float32, or the uint16 bits of float16 / bfloat16."""
    return y if y.dtype == _F32 else y.view(np.uint16)


def empty_out(m, n, out_dtype):
    """The output [M, N] and the view the Numba kernels write (float32, or uint16 bits)."""
    y = device.xp.empty((m, n), dtype=out_dtype)
    return y, out_bits(y)


def rows_aligned(arr):
    """Whether every row of a 2-D device array starts on 16 bytes with its elements contiguous."""
    return arr.strides[1] == arr.itemsize and arr.strides[0] % 16 == 0 and arr.data.ptr % 16 == 0


__all__ = [
    "BiasKind",
    "OutKind",
    "BIAS_KIND",
    "OUT_KIND",
    "load_bias",
    "scaled_value",
    "epilogue_value",
    "store_out",
    "epilogue_kernel",
    "epilogue_vector_kernel",
    "epilogue_launch",
    "EPILOGUE_VECTOR",
    "out_type",
    "scale_vector",
    "bias_bits",
    "out_bits",
    "empty_out",
    "rows_aligned",
]
