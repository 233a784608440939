"""The e4m3 codec for the GPU: two encoders behind one switch, input widening, and wide loads.

Encoders (``ENCODERS``):

- ``"hardware"``: PTX ``cvt.rn.satfinite.e4m3x2.f32`` (sm_89 and newer) through an inline-PTX
  intrinsic, two values per instruction. The instruction alone does not give vtnumba's NaN policy
  (probe 2 clamped first, and the clamp turns NaN into 448 = 0x7E, as upstream vLLM's kernel does),
  so NaN is tested *before* the clamp and replaced by 0x7F afterwards (DESIGN.md, "NaN policy").
- ``"portable"``: ``vtnumba._format.encode_e4m3_scalar`` -- the very source the CPU runs --
  compiled as an inline device function with the bit casts spelled through libdevice
  (``float_as_int`` / ``int_as_float``). Used on GPUs older than sm_89 and under the CUDA simulator,
  where the plain-Python bit casts of ``_format`` work as they are (the simulator has no libdevice:
  its calls return None).

Both encoders give the same bytes for all 2^32 float32 inputs (the exhaustive gpu test proves it
against the CPU kernel).

Wide memory access: ``load_u32x4`` / ``store_u32x4`` read and write 16 bytes per instruction
(``ld.v4.u32`` / ``st.v4.u32``) from an array's buffer; one element per thread reached only 1.39
TB/s on the H200 and 8-byte loads 2.90 (ANCHORS.md). They need 16-byte-aligned addresses: callers
check alignment on the host and fall back to scalar indexing otherwise. They do not exist under the
simulator, whose kernels index element by element.
"""

import numpy as np

from .. import _format
from .._format import F32_E4M3_MAX, F32_ZERO
from .target import DEVICE_INLINE, SIMULATOR, cuda, intrinsic, libdevice, types

ENCODERS = ("hardware", "portable")
HARDWARE_MIN_CC = (8, 9)  # cvt.*.e4m3x2.f32 needs sm_89 (Ada) or newer

_device_inline = DEVICE_INLINE
_U32_8 = np.uint32(8)
_U32_BYTE = np.uint32(0xFF)
_U32_NAN_CODE = np.uint32(_format.E4M3_NAN_CODE)
_F32_INF = np.float32(np.inf)

if SIMULATOR:
    # The simulator runs device functions as Python: _format's numpy bit casts work as they are.
    float32_bits = cuda.jit(**_device_inline)(_format.float32_bits)
    bits_float32 = cuda.jit(**_device_inline)(_format.bits_float32)

    @cuda.jit(**_device_inline)
    def half_bits_to_float32(h):
        """float16 bits -> float32 (exact)."""
        return np.float32(np.uint16(h).view(np.float16))

else:
    from llvmlite import ir

    @cuda.jit(**_device_inline)
    def float32_bits(x):
        return np.uint32(libdevice.float_as_int(np.float32(x)))

    @cuda.jit(**_device_inline)
    def bits_float32(b):
        return libdevice.int_as_float(np.int32(b))

    @intrinsic
    def _cvt_f16_bits_to_f32(typingctx, h):
        """PTX cvt.f32.f16: float16 bits (low 16 bits of ``h``) -> float32, exact."""
        sig = types.float32(h)

        def codegen(context, builder, signature, args):
            bits16 = builder.trunc(args[0], ir.IntType(16))
            fnty = ir.FunctionType(ir.FloatType(), [ir.IntType(16)])
            return builder.call(ir.InlineAsm(fnty, "cvt.f32.f16 $0, $1;", "=f,h"), [bits16])

        return (sig, codegen) if isinstance(h, types.Integer) and h.bitwidth >= 16 else None

    @cuda.jit(**_device_inline)
    def half_bits_to_float32(h):
        """float16 bits -> float32 (exact)."""
        return _cvt_f16_bits_to_f32(np.uint32(h))

    @intrinsic
    def _cvt_e4m3x2(typingctx, hi, lo):
        """PTX cvt.rn.satfinite.e4m3x2.f32: (hi, lo) float32 -> uint16 holding code(hi) << 8 | code(lo)."""
        sig = types.uint16(types.float32, types.float32)

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(16), [ir.FloatType(), ir.FloatType()])
            asm = ir.InlineAsm(fnty, "cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f")
            return builder.call(asm, args)

        return sig, codegen

    def _index_to_intp(context, builder, fromty, value):
        return context.cast(builder, value, fromty, types.intp)

    @intrinsic
    def load_u32x4(typingctx, arr, index):
        """The ``index``-th 16-byte word of ``arr``'s buffer as 4 uint32 (one ld.v4.u32)."""
        if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
            return None
        sig = types.UniTuple(types.uint32, 4)(arr, index)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            vec_ptr = builder.bitcast(ary.data, ir.VectorType(ir.IntType(32), 4).as_pointer())
            idx = _index_to_intp(context, builder, signature.args[1], args[1])
            vec = builder.load(builder.gep(vec_ptr, [idx]), align=16)
            words = [builder.extract_element(vec, ir.Constant(ir.IntType(32), i)) for i in range(4)]
            return context.make_tuple(builder, signature.return_type, words)

        return sig, codegen

    @intrinsic
    def store_u32x4(typingctx, arr, index, w0, w1, w2, w3):
        """Write 4 uint32 as the ``index``-th 16-byte word of ``arr``'s buffer (one st.v4.u32)."""
        if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
            return None
        sig = types.void(arr, index, types.uint32, types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            vec_ty = ir.VectorType(ir.IntType(32), 4)
            vec_ptr = builder.bitcast(ary.data, vec_ty.as_pointer())
            idx = _index_to_intp(context, builder, signature.args[1], args[1])
            vec = ir.Constant(vec_ty, ir.Undefined)
            for i, word in enumerate(args[2:]):
                vec = builder.insert_element(vec, word, ir.Constant(ir.IntType(32), i))
            builder.store(vec, builder.gep(vec_ptr, [idx]), align=16)
            return context.get_dummy_value()

        return sig, codegen

# The portable encoder: the CPU's source, with this target's bit casts.
_primitives = dict(float32_bits=float32_bits, bits_float32=bits_float32)
encode_e4m3 = _format.compile_for_target(_format.encode_e4m3_scalar, cuda.jit(**_device_inline), **_primitives)
bfloat16_bits_to_float32 = _format.compile_for_target(
    _format.bfloat16_bits_to_float32, cuda.jit(**_device_inline), **_primitives)


@cuda.jit(**_device_inline)
def encode_pair_portable(lo, hi):
    """Codes of two float32 as uint32: code(lo) | code(hi) << 8."""
    return np.uint32(encode_e4m3(lo)) | (np.uint32(encode_e4m3(hi)) << _U32_8)


if not SIMULATOR:

    @cuda.jit(**_device_inline)
    def encode_pair_hardware(lo, hi):
        """Codes of two float32 as uint32: code(lo) | code(hi) << 8, by one cvt instruction."""
        lo_nan = lo != lo  # before the clamp: the clamp would turn NaN into 448
        hi_nan = hi != hi
        lo_c = min(max(lo, -F32_E4M3_MAX), F32_E4M3_MAX)
        hi_c = min(max(hi, -F32_E4M3_MAX), F32_E4M3_MAX)
        pair = np.uint32(_cvt_e4m3x2(hi_c, lo_c))
        lo_code = _U32_NAN_CODE if lo_nan else pair & _U32_BYTE
        hi_code = _U32_NAN_CODE if hi_nan else pair >> _U32_8
        return lo_code | (hi_code << _U32_8)


@cuda.jit(**_device_inline)
def finite_abs(v):
    """|v| for finite v, 0 for NaN and +-inf: amax is taken over finite elements (as the CPU's
    ``_finite_amax``: NaN encodes to 0x7F and inf saturates, whatever the scale)."""
    a = abs(v)
    return a if a < _F32_INF else F32_ZERO


@cuda.jit(**_device_inline)
def _first_code(pair):
    return pair & _U32_BYTE


def encode_one(encoder):
    """The single-value encoder for ``encoder``, returning uint32: the pair encoder's low code, so
    the elements outside 16-element groups go through the same instruction as the rest."""
    pair = encode_pair(encoder)

    @cuda.jit(**_device_inline)
    def encode(v):
        return _first_code(pair(v, F32_ZERO))

    return encode


def encode_pair(encoder):
    """The pair encoder device function for ``encoder`` ('hardware' or 'portable')."""
    if encoder == "hardware":
        if SIMULATOR:
            raise ValueError("encoder must be 'portable' under the CUDA simulator (no PTX there), got 'hardware'")
        return encode_pair_hardware
    if encoder == "portable":
        return encode_pair_portable
    raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")


__all__ = ["ENCODERS", "HARDWARE_MIN_CC", "encode_e4m3", "encode_pair", "encode_one", "finite_abs", "float32_bits",
           "bits_float32", "bfloat16_bits_to_float32", "half_bits_to_float32"]
