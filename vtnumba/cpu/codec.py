"""The e4m3 codec from ``vtnumba._format`` compiled for the CPU (Numba ``@njit``, inlined)."""

import numpy as np
from numba import njit, types
from numba.extending import overload

from .. import _format
from .._config import CPU_INLINE

float32_bits = njit(**CPU_INLINE)(_format.float32_bits)
bits_float32 = njit(**CPU_INLINE)(_format.bits_float32)
_targets = dict(float32_bits=float32_bits, bits_float32=bits_float32)

encode_e4m3 = _format.compile_for_target(_format.encode_e4m3_scalar, njit(**CPU_INLINE), **_targets)
decode_e4m3 = _format.compile_for_target(_format.decode_e4m3_scalar, njit(**CPU_INLINE), **_targets)
_bf16_to_f32 = _format.compile_for_target(_format.bfloat16_bits_to_float32, njit(**CPU_INLINE), **_targets)
per_group_scale = _format.compile_for_target(_format.per_group_scale, njit(**CPU_INLINE), **_targets)
e8m0_scale_byte = _format.compile_for_target(_format.e8m0_scale_byte, njit(**CPU_INLINE), **_targets)
decode_e8m0 = _format.compile_for_target(_format.decode_e8m0_scalar, njit(**CPU_INLINE), **_targets)
e8m0_reciprocal = _format.compile_for_target(
    _format.e8m0_reciprocal, njit(**CPU_INLINE), decode_e8m0_scalar=decode_e8m0, **_targets
)


def load_float32(v):
    """An input element widened to float32: float32 as is, uint16 read as bfloat16 bits (exact).

    The CPU target of Numba has no float16 type, so float16 inputs are widened by numpy before the
    kernel (also exact); bfloat16 arrays reach the kernels as their uint16 bits.
    """
    if isinstance(v, np.uint16):  # plain-Python meaning (NUMBA_DISABLE_JIT); Numba uses the overload
        return _format.bfloat16_bits_to_float32(v)
    return np.float32(v)


@overload(load_float32, inline="always")
def _load_float32(v):
    if v == types.float32:
        return lambda v: v
    if v == types.uint16:
        return lambda v: _bf16_to_f32(v)
    return None
