"""The CPU backend of vtnumba's ops (``vtnumba.ops.Backend``): numpy in, numpy out, Numba ``@njit``
kernels inside. The reference every other backend is compared with."""

import numpy as np

from .. import _arrays, _format
from . import quant

# decode is a 256-entry table built from the one scalar decoder (plain Python, once per process).
DECODE_TABLE = np.array([_format.decode_e4m3_scalar(c) for c in range(256)], dtype=np.float32)


def _kernel_input(x):
    """C-contiguous float32 or bfloat16-bits (uint16) array the kernels read.

    float16 is widened by numpy (exact; Numba's CPU target has no float16); strided inputs are
    made contiguous, so they give the bytes of their contiguous copies. A 0-d x stays 0-d
    (np.ascontiguousarray would make it 1-d, and the codes would come back with shape (1,))."""
    dt = np.dtype(x.dtype)
    if dt == _arrays.BFLOAT16:
        return np.asarray(x, order="C").view(np.uint16)
    if dt == np.float16:
        return x.astype(np.float32, order="C")
    return np.asarray(x, order="C")


def scale_array(scale):
    return np.array([scale], dtype=np.float32)


def quantize_static(x, scale):
    xin = _kernel_input(x)
    out = np.empty(xin.shape, dtype=np.uint8)
    inv = np.float32(1.0) / np.float32(scale)  # formed once, in float32 (DESIGN.md)
    quant.quantize_static(xin.reshape(-1), inv, out.reshape(-1))
    return out


def quantize_dynamic(x):
    xin = _kernel_input(x)
    scale = quant.dynamic_scale(quant.finite_amax(xin.reshape(-1)))
    out = np.empty(xin.shape, dtype=np.uint8)
    quant.quantize_static(xin.reshape(-1), np.float32(1.0) / scale, out.reshape(-1))
    return out, scale_array(scale)


def quantize_per_token(x, scale_ub):
    xin = _kernel_input(x)
    out = np.empty(xin.shape, dtype=np.uint8)
    scales = np.empty((xin.shape[0], 1), dtype=np.float32)
    quant.quantize_per_token(xin, np.float32(0.0 if scale_ub is None else scale_ub), out, scales)
    return out, scales


def quantize_per_group(x, group_size, scale_ue8m0, column_major_scales):
    from .block import quantize_per_group as impl  # compiled only when first used

    return impl(x, group_size, scale_ue8m0, column_major_scales)


def quantize_per_group_e8m0(x, group_size, rounding, column_major_scales):
    from .mx import quantize_mx as impl

    return impl(x, group_size, rounding, column_major_scales)


def decode(codes):
    return np.asarray(DECODE_TABLE[codes])  # 0-d codes index to a numpy scalar: keep it an array


def dequantize(codes, scale, dtype):
    scale = np.asarray(scale, dtype=np.float32)
    y = DECODE_TABLE[codes] * scale  # float32 product, exact decode
    return np.asarray(y.astype(dtype))  # numpy / ml_dtypes casts round to nearest even


def scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, kernel):
    from .gemm import scaled_mm as impl  # the GEMM kernels compile only when first used

    return impl(a, b, scale_a, scale_b, out_dtype, bias, kernel)


def block_scaled_mm(a, b, scale_a, scale_b, block_size, out_dtype, bias, kernel):
    from . import mx
    from .block import block_scaled_mm as impl

    e8m0_a, e8m0_b = scale_a.dtype == np.uint8, scale_b.dtype == np.uint8
    if e8m0_a and e8m0_b:  # MXFP8 and its kin: power-of-two scales on both sides (cpu/mx.py)
        return mx.mx_scaled_mm(a, b, scale_a, scale_b, block_size, out_dtype, bias, kernel)
    # E8M0 on one side only (DeepSeek's UE8M0 weight blocks beside float32 activation scales): the
    # bytes decode exactly to float32
    scale_a = mx.decode_e8m0_array(scale_a) if e8m0_a else scale_a
    scale_b = mx.decode_e8m0_array(scale_b) if e8m0_b else scale_b
    return impl(a, b, scale_a, scale_b, block_size, out_dtype, bias, kernel)


def fp8_linear(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias):
    """Quantize, then the GEMM: the two ops in sequence (the CPU has nothing to gain from fusing)."""
    if per_token:
        codes, scale_a = quantize_per_token(x, scale_ub)
        scale_a = scale_a.reshape(-1)
    elif input_scale is None:
        codes, scale_a = quantize_dynamic(x)
    else:
        codes, scale_a = quantize_static(x, input_scale), input_scale
    return scaled_mm(codes, b, scale_a, scale_b, out_dtype, bias, None)
