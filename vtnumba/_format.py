"""The e4m3fn format: constants, and the scalar codec written ONCE as plain Python.

The two scalar functions below are valid Python, valid ``@njit`` code and valid ``@cuda.jit``
device code. Each target compiles the same source (``compile_for_target``); the only thing a
target may swap is the bit-cast primitive pair ``float32_bits`` / ``bits_float32``, because the
CPU spells it ``np.float32(x).view(np.uint32)`` and the GPU spells it ``libdevice.float_as_int``.

Why a bit-level encoder and not frexp/round: it is branch-free (selects only), so LLVM vectorizes
it on the CPU, and it was proven against torch's clamp+cast for all 2^32 float32 inputs on an H200
(docs/ANCHORS.md, "The encoder, exhaustively").

Constants are float32/uint32 scalars on purpose: Numba types a bare Python float literal as
float64, and ``y + 2**23`` in float64 would not round to an integer the way float32 does.
"""

import types

import numpy as np

E4M3_MAX = 448.0
E4M3_MAX_CODE = 0x7E  # +448
E4M3_NAN_CODE = 0x7F  # our single NaN code, for every NaN input (see DESIGN.md, "NaN policy")

# float32 constants (Numba reads module-level numpy scalars as typed compile-time constants)
F32_ZERO = np.float32(0.0)
F32_ONE = np.float32(1.0)
F32_E4M3_MAX = np.float32(448.0)
# dynamic-scale floor, formed in float32 exactly as upstream's `1.0f / (FP8_E4M3_MAX * 512.f)`
F32_MIN_SCALE = np.float32(1.0) / (np.float32(448.0) * np.float32(512.0))
_F32_512 = np.float32(512.0)  # 2^9: e4m3's subnormal step is 2^-9
_F32_2P23 = np.float32(8388608.0)  # 2^23: adding it rounds a float32 in [0, 2^22) to an integer, RNE
_F32_2M9 = np.float32(0.001953125)  # 2^-9

_U32_ABS_MASK = np.uint32(0x7FFFFFFF)
_U32_INF_BITS = np.uint32(0x7F800000)
_U32_448_BITS = np.uint32(0x43E00000)  # 448.0
_U32_MIN_NORMAL_BITS = np.uint32(0x3C800000)  # 2^-6, e4m3's smallest normal
_U32_2P23_BITS = np.uint32(0x4B000000)  # bits of 2^23
_U32_RNE_HALF = np.uint32(0x7FFFF)  # half an e4m3 ulp minus one, in float32 mantissa units (2^19 - 1)
_U32_EXP_REBIAS = np.uint32(960)  # (127 - 7) << 3: float32 exponent bias to e4m3's, in code units
_U32_DECODE_BIAS = np.uint32(0x3C000000)  # (127 - 7) << 23
_U32_F32_NAN_BITS = np.uint32(0x7FC00000)


def float32_bits(x):
    """Bits of a float32 as uint32 (CPU / Python / CUDA simulator spelling)."""
    return np.float32(x).view(np.uint32)


def bits_float32(b):
    """The float32 whose bits are ``b`` (CPU / Python / CUDA simulator spelling)."""
    return np.uint32(b).view(np.float32)


def encode_e4m3_scalar(x):
    """float32 -> e4m3fn code (0..255): RNE, saturating to +-448, every NaN -> 0x7F, -0.0 -> 0x80.

    ``x`` must already be a float32 (callers widen f16/bf16 first; the widening is exact).
    """
    # Every integer intermediate is wrapped in np.uint32: Numba widens uint32 arithmetic to 64
    # bits, and the truncations let LLVM narrow the vector lanes back to 32 (16 lanes, not 8).
    bits = np.uint32(float32_bits(x))
    sign = np.uint32((bits >> np.uint32(24)) & np.uint32(0x80))
    mag = np.uint32(bits & _U32_ABS_MASK)
    # normal range: round the float32 mantissa to 3 bits, ties to even (add 2^19 - 1 plus the kept
    # LSB, then truncate); a carry walks into the exponent, which is what RNE wants.
    # (max() keeps the discarded lane from wrapping below zero: pure Python would warn on it)
    normal_mag = max(mag, _U32_MIN_NORMAL_BITS)
    lsb = np.uint32((normal_mag >> np.uint32(20)) & np.uint32(1))
    rounded = np.uint32(normal_mag + np.uint32(_U32_RNE_HALF + lsb))
    normal_code = np.uint32(np.uint32(rounded >> np.uint32(20)) - _U32_EXP_REBIAS)
    # subnormal range (|x| < 2^-6): |x| * 512 is exact, and adding 2^23 rounds it to an integer
    # with float32's own RNE; the integer lands in the low mantissa bits.
    scaled = np.float32(abs(x) * _F32_512) + _F32_2P23
    subnormal_code = np.uint32(np.uint32(float32_bits(scaled)) - _U32_2P23_BITS)
    code = subnormal_code if mag < _U32_MIN_NORMAL_BITS else normal_code
    code = np.uint32(E4M3_MAX_CODE) if mag >= _U32_448_BITS else code  # saturate (inf too)
    code = np.uint32(code | sign)
    code = np.uint32(E4M3_NAN_CODE) if mag > _U32_INF_BITS else code  # NaN loses its sign
    return np.uint8(code)


def decode_e4m3_scalar(c):
    """e4m3fn code -> float32, exact; 0x7F and 0xFF -> NaN."""
    code = np.uint32(c)
    mag = code & np.uint32(0x7F)
    normal = bits_float32((mag << np.uint32(20)) + _U32_DECODE_BIAS)
    subnormal = np.float32(np.float32(mag) * _F32_2M9)
    value = subnormal if mag < np.uint32(8) else normal
    value = bits_float32(_U32_F32_NAN_BITS) if mag == np.uint32(0x7F) else value
    return -value if code >= np.uint32(0x80) else value


def bfloat16_bits_to_float32(h):
    """bfloat16 bits (uint16) -> float32: the bits are the top half of a float32, so this is exact."""
    return bits_float32(np.uint32(h) << np.uint32(16))


# Per-group activation scales (upstream vLLM's per_token_group_quant_fp8): the eps its CUDA and Triton
# kernels clamp amax with, as a float32 (both pass eps=1e-10 as a float32 kernel argument).
F32_GROUP_EPS = np.float32(1e-10)
_U32_MANTISSA_MASK = np.uint32(0x7FFFFF)
_U32_23 = np.uint32(23)


def per_group_scale(amax, ue8m0):
    """The scale of one activation group from its finite amax (a float32): ``max(amax, 1e-10) / 448``
    in float32, as upstream's per_token_group_quant_fp8 (CUDA ``ComputeGroupScale``, Triton
    ``_per_token_group_quant_fp8``: eps clamps amax, then one float32 divide).

    ``ue8m0``: the scale is rounded up to a power of two, the smallest one >= ``max(scale, 1e-10)``,
    as upstream's CUDA kernel does (``exp2f(ceilf(log2f(fmaxf(y_s, 1e-10f))))``, which its register
    kernel and DeepGEMM's ``ceil_to_ue8m0`` spell as "add one to the exponent when the mantissa is not
    zero, then clear the mantissa"; we use that bit form, exact for every input). The scale is always
    a positive normal float32 (>= 1e-10 / 448), so the exponent bump never reaches inf.
    """
    scale = np.float32(max(amax, F32_GROUP_EPS) / F32_E4M3_MAX)
    if ue8m0:
        bits = np.uint32(float32_bits(max(scale, F32_GROUP_EPS)))
        exponent = np.uint32(bits >> _U32_23)  # the sign bit is 0
        exponent = np.uint32(exponent + np.uint32(1)) if (bits & _U32_MANTISSA_MASK) != np.uint32(0) else exponent
        scale = bits_float32(np.uint32(exponent << _U32_23))
    return scale


def compile_for_target(fn, jit, **primitives):
    """Compile one of the plain-Python scalar functions above for a target.

    ``jit`` is the target's decorator (``numba.njit(inline='always')`` or
    ``numba.cuda.jit(device=True, inline=True)``); ``primitives`` replace globals of the source
    (only the bit casts differ between targets). The function's code object is shared, so the
    encoder is written once and every target runs the same statements.
    """
    if primitives:
        namespace = dict(fn.__globals__)
        namespace.update(primitives)
        fn = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    return jit(fn)


# -- E8M0 scales (OCP Microscaling Formats v1.0, section 5.4.1) ------------------------------------
#
# One byte, the power of two 2^(byte - 127): byte 0 is 2^-127 (a float32 subnormal), 254 is 2^127,
# 0xFF is NaN; no zero, no sign, no infinity. An MXFP8 group of 32 e4m3 codes shares one such byte.
E8M0_BIAS = 127
E8M0_NAN = 0xFF
MX_GROUP = 32  # values along K per E8M0 scale byte (OCP MX)
MX_BLOCK = (1, MX_GROUP)  # an MXFP8 operand's block_size: one scale per row and 32 of K
E8M0_ROUNDINGS = ("rceil", "floor")  # DESIGN.md "MXFP8": rceil is the default (never saturates)
# torchao's rceil forms the scale as ``max_abs * (1.0 / max_pos)``: float32 times float32(1 / 448)
# (torchao/prototype/mx_formats/mx_tensor.py, _to_mx_rceil, line 185 at 36027d82)
F32_RCP_448 = np.float32(1.0 / 448.0)
_U32_E8M0_MIN_BITS = np.uint32(0x00400000)  # 2^-127, the float32 subnormal byte 0 stands for
_U32_HALF_MANTISSA = np.uint32(0x400000)
_U32_E8M0_FLOOR_SHIFT = np.uint32(8)  # log2 of e4m3's largest power of two (256): emax_elem


def e8m0_scale_byte(amax, rceil):
    """The E8M0 byte of one MX group's scale from the group's finite amax (a float32 >= 0).

    - ``rceil`` (True; NVIDIA's rule, cuBLAS's "1D block quantization", torchao's RCEIL): the
      smallest power of two >= float32(amax * float32(1 / 448)), so every element's scaled
      magnitude is at most 448 and nothing saturates. Mirrors torchao's ``_f32_to_e8m0_rceil``
      (mx_tensor.py lines 111-130 at 36027d82): a normal float32 rounds up when any mantissa bit is
      set; a subnormal one rounds to byte 1 only above 2^-127 (byte 0 is 2^-127 itself).
    - floor (False; the OCP MX v1.0 spec's section 6.3 and torchao's FLOOR, mx_tensor.py line 331):
      2^(floor(log2(amax)) - 8), 8 being e4m3's largest exponent; the group's largest elements then
      scale to [256, 512) and those above 448 saturate. amax's exponent field minus 8, clamped at 0.

    An all-zero group (amax 0) gets byte 0 under both rules. The byte is never 0xFF: amax is finite
    and at most 2^128, so rceil stops at 247 and floor at 246.
    """
    if rceil:
        bits = np.uint32(float32_bits(np.float32(amax * F32_RCP_448)))
        exponent = np.uint32(bits >> _U32_23)  # the sign bit is 0
        mantissa = np.uint32(bits & _U32_MANTISSA_MASK)
        up = mantissa > _U32_HALF_MANTISSA if exponent == np.uint32(0) else mantissa != np.uint32(0)
        return np.uint8(exponent + np.uint32(1)) if up else np.uint8(exponent)
    exponent = np.uint32(np.uint32(float32_bits(amax)) >> _U32_23)
    return np.uint8(exponent - _U32_E8M0_FLOOR_SHIFT) if exponent > _U32_E8M0_FLOOR_SHIFT else np.uint8(0)


def decode_e8m0_scalar(byte):
    """E8M0 byte -> float32 2^(byte - 127), exact (byte 0: the subnormal 2^-127); 0xFF -> NaN."""
    b = np.uint32(byte)
    bits = np.uint32(b << _U32_23) if b != np.uint32(0) else _U32_E8M0_MIN_BITS
    bits = _U32_F32_NAN_BITS if b == np.uint32(E8M0_NAN) else bits
    return bits_float32(bits)


def e8m0_reciprocal(byte):
    """1 / 2^(byte - 127) as a float32, exact, for a byte 0..254 (the quantizer's multiplier: x times
    it equals x / 2^(byte - 127) in float32, both being the one rounding of the same real number)."""
    return decode_e8m0_scalar(np.uint32(254) - np.uint32(byte))
