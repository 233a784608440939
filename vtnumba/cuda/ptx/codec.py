"""Every bit-level primitive of vtnumba's GPU kernels, behind one simulator/hardware switch.

- bit casts: ``float32_bits`` / ``bits_float32``;
- 16-bit floats: ``half_bits_to_float32``, ``bfloat16_bits_to_float32``, ``half2_to_float32`` (two
  halves of a word), and the RNE narrowings ``float32_to_half_bits`` / ``float32_to_bfloat16_bits``;
- e4m3: ``decode_e4m3`` (one code), ``e4m3x4_scaled`` + ``nan_code_bits`` (four codes of a word by
  bit placement, the GEMV's weight decode), and the two encoders behind ``encode_pair`` /
  ``encode_one``;
- 16-byte memory access: ``load_u32x4`` / ``store_u32x4`` (the i-th 16-byte word of a flat buffer)
  and ``load_row_words`` (the 16 bytes at ``&arr[row, col]`` of a 2-D array);
- ``fill``: every element of a local array set to one value (an accumulator's start).

The switch: on a real GPU the primitives that have a PTX instruction are inline PTX (llvmlite
``InlineAsm`` intrinsics) or libdevice calls; under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1),
which runs device functions as Python and has neither PTX nor libdevice (its calls return None),
the same names are portable Python. The plain-Python helpers of ``vtnumba._format`` (the encoder and
decoder the CPU runs) are compiled here with this target's bit casts, so every target runs the same
statements.

Encoders (``ENCODERS``):

- ``"hardware"``: PTX ``cvt.rn.satfinite.e4m3x2.f32`` (sm_89 and newer), two values per
  instruction. The instruction alone does not give vtnumba's NaN policy: a clamp first turns NaN
  into 448 = 0x7E, as upstream vLLM's kernel does, so NaN is tested *before* the clamp and replaced
  by 0x7F afterwards (DESIGN.md, "NaN policy").
- ``"portable"``: ``vtnumba._format.encode_e4m3_scalar``, the very source the CPU runs. Used on GPUs
  older than sm_89 and under the simulator.

Both give the same bytes for all 2^32 float32 inputs (the exhaustive gpu test proves it against the
CPU kernel). 16-byte accesses move four words per instruction: one element per thread reached only
1.39 TB/s on the H200 and 8-byte loads 2.90 (ANCHORS.md). They need 16-byte-aligned addresses, which
callers check on the host; the simulator's forms index element by element.
"""

import numpy as np

from ... import _format
from ..._format import F32_E4M3_MAX, F32_ZERO
from .target import (
    DEVICE_INLINE,
    DEVICE_SCALAR,
    SIMULATOR,
    cuda,
    intrinsic,
    libdevice,
    lowering,
    mlir_address,
    mlir_asm,
    mlir_buffer_pointer,
    mlir_cast,
    mlir_codegen,
    mlir_element_pointer,
    mlir_index,
    mlir_type,
    mlir_vector_pointer,
    types,
)

ENCODERS = ("hardware", "portable")
HARDWARE_MIN_CC = (8, 9)  # cvt.*.e4m3x2.f32 (and cvt.rn.f16x2.e4m3x2) need sm_89 (Ada) or newer

_U32_8 = np.uint32(8)
_U32_16 = np.uint32(16)
_U32_BYTE = np.uint32(0xFF)
_U32_LOW_HALF = np.uint32(0xFFFF)
_U32_HIGH_HALF = np.uint32(0xFFFF0000)
_U32_NAN_CODE = np.uint32(_format.E4M3_NAN_CODE)
_F32_INF = np.float32(np.inf)


def hardware_available(cc):
    """Whether the inline-PTX paths (hardware encoder, e4m3 conversions) run on compute capability
    ``cc``: sm_89 and newer, and a real GPU."""
    return not SIMULATOR and tuple(cc) >= HARDWARE_MIN_CC


# ------------------------------------------------------------------------------------------------
# the switch: bit casts, float16 widening and 16-byte access, hardware or simulated

if SIMULATOR:
    # The simulator runs device functions as Python: _format's numpy bit casts work as they are.
    float32_bits = cuda.jit(**DEVICE_INLINE)(_format.float32_bits)
    bits_float32 = cuda.jit(**DEVICE_INLINE)(_format.bits_float32)

    @cuda.jit(**DEVICE_INLINE)
    def half_bits_to_float32(h):
        """float16 bits -> float32 (exact)."""
        return np.float32(np.uint16(h).view(np.float16))

    @cuda.jit(**DEVICE_INLINE)
    def load_u32x4(arr, index):
        """The ``index``-th 16-byte word of a flat float32 or 16-bit buffer as 4 uint32."""
        if arr.dtype.itemsize == 4:
            b = 4 * index
            return (
                np.uint32(float32_bits(arr[b])),
                np.uint32(float32_bits(arr[b + 1])),
                np.uint32(float32_bits(arr[b + 2])),
                np.uint32(float32_bits(arr[b + 3])),
            )
        b = 8 * index
        return (
            np.uint32(arr[b]) | (np.uint32(arr[b + 1]) << _U32_16),
            np.uint32(arr[b + 2]) | (np.uint32(arr[b + 3]) << _U32_16),
            np.uint32(arr[b + 4]) | (np.uint32(arr[b + 5]) << _U32_16),
            np.uint32(arr[b + 6]) | (np.uint32(arr[b + 7]) << _U32_16),
        )

    @cuda.jit(**DEVICE_INLINE)
    def store_u32x4(arr, index, w0, w1, w2, w3):
        """Write 4 uint32 as the ``index``-th 16-byte word of a flat uint8, 16-bit or float32 buffer."""
        size = arr.dtype.itemsize
        b = (16 // size) * index
        for k, w in enumerate((w0, w1, w2, w3)):
            w = np.uint32(w)
            if size == 4:
                arr[b + k] = bits_float32(w) if arr.dtype == np.float32 else w
            elif size == 2:
                arr[b + 2 * k] = np.uint16(w & np.uint32(0xFFFF))
                arr[b + 2 * k + 1] = np.uint16(w >> _U32_16)
            else:
                for j in range(4):
                    arr[b + 4 * k + j] = np.uint8((w >> np.uint32(8 * j)) & _U32_BYTE)

    load_row_words = None  # no inline PTX: kernels take the portable row loads below
    half2_to_float32 = None

else:
    from llvmlite import ir
    from numba.core import cgutils

    _i32, _f32 = ir.IntType(32), ir.FloatType()

    def asm_tuple(context, builder, ret, element, text, constraints, operands, side_effect=False):
        """The ``ret`` tuple (``ret.count`` registers of LLVM type ``element``) that one inline-PTX
        statement writes from ``operands``: the codegen of every intrinsic returning several
        registers (here, mma.py)."""
        fnty = ir.FunctionType(ir.LiteralStructType([element] * ret.count), [op.type for op in operands])
        res = builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=side_effect), operands)
        return context.make_tuple(builder, ret, [builder.extract_value(res, i) for i in range(ret.count)])

    @cuda.jit(**DEVICE_INLINE)
    def float32_bits(x):
        return np.uint32(libdevice.float_as_int(np.float32(x)))

    @cuda.jit(**DEVICE_INLINE)
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

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            bits16 = mlir_cast(lower, values[0], argtypes[0], types.uint16)
            return mlir_asm("cvt.f32.f16 $0, $1;", "=f,h", [bits16], "f")[0]

        return (sig, lowering(codegen, mlir)) if isinstance(h, types.Integer) and h.bitwidth >= 16 else None

    @cuda.jit(**DEVICE_INLINE)
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

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            pair = [mlir_cast(lower, v, t, types.float32) for v, t in zip(values, argtypes)]
            return mlir_asm("cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f", pair, "h")[0]

        return sig, lowering(codegen, mlir)

    def _index_to_intp(context, builder, fromty, value):
        return context.cast(builder, value, fromty, types.intp)

    def _mlir_llvm():
        from numba_cuda_mlir._mlir.dialects import llvm

        return llvm

    def _mlir_lane(i):
        from numba_cuda_mlir._mlir.dialects import arith

        return arith.constant(mlir_type("i32"), i)

    def _mlir_words(vec):
        """The i32 elements of an MLIR vector<4xi32>, as a tuple."""
        return tuple(_mlir_llvm().extractelement(vec, _mlir_lane(i)) for i in range(4))

    def _mlir_vector(words):
        """An MLIR vector<4xi32> of four i32 values."""
        vec = _mlir_llvm().mlir_undef(mlir_type("vector<4xi32>"))
        for i, word in enumerate(words):
            vec = _mlir_llvm().insertelement(vec, word, _mlir_lane(i))
        return vec

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

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            ptr = mlir_vector_pointer(mlir_buffer_pointer(values[0]), mlir_index(lower, values[1], argtypes[1]))
            return _mlir_words(_mlir_llvm().load(mlir_type("vector<4xi32>"), ptr, alignment=16))

        return sig, lowering(codegen, mlir)

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

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            ptr = mlir_vector_pointer(mlir_buffer_pointer(values[0]), mlir_index(lower, values[1], argtypes[1]))
            words = [mlir_cast(lower, v, t, types.uint32) for v, t in zip(values[2:], argtypes[2:])]
            _mlir_llvm().store(_mlir_vector(words), ptr, alignment=16)

        return sig, lowering(codegen, mlir)

    @intrinsic
    def load_row_words(typingctx, arr, row, col):
        """Four uint32 words from the 16 bytes at &arr[row, col] (16-byte aligned, any element type),
        one non-coherent 128-bit global load (the operand is read-only for the kernel's lifetime)."""
        ret = types.UniTuple(types.uint32, 4)
        sig = ret(arr, row, col)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            idx = [
                _index_to_intp(context, builder, signature.args[1], args[1]),
                _index_to_intp(context, builder, signature.args[2], args[2]),
            ]
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx)
            addr = builder.ptrtoint(ptr, ir.IntType(64))
            return asm_tuple(
                context,
                builder,
                ret,
                _i32,
                "{ .reg .u64 g; cvta.to.global.u64 g, $4; ld.global.nc.v4.u32 {$0, $1, $2, $3}, [g]; }",
                "=r,=r,=r,=r,l",
                [addr],
            )

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            ptr = mlir_element_pointer(lower, values[0], argtypes[0], values[1:3], argtypes[1:3])
            return tuple(
                mlir_asm(
                    "{ .reg .u64 g; cvta.to.global.u64 g, $4; ld.global.nc.v4.u32 {$0, $1, $2, $3}, [g]; }",
                    "=r,=r,=r,=r,l",
                    [mlir_address(ptr, generic=True)],
                    "rrrr",
                )
            )

        return sig, lowering(codegen, mlir)

    @intrinsic
    def half2_to_float32(typingctx, word):
        """The two float16 halves of a uint32 (low half first) as float32 (exact)."""
        ret = types.UniTuple(types.float32, 2)
        sig = ret(types.uint32)

        def codegen(context, builder, signature, args):
            return asm_tuple(
                context,
                builder,
                ret,
                _f32,
                "{ .reg .b16 a, b; mov.b32 {a, b}, $2; cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; }",
                "=f,=f,r",
                [args[0]],
            )

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            word = mlir_cast(lower, values[0], argtypes[0], types.uint32)
            text = "{ .reg .b16 a, b; mov.b32 {a, b}, $2; cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; }"
            return tuple(mlir_asm(text, "=f,=f,r", [word], "ff"))

        return sig, lowering(codegen, mlir)


def compile_device(fn, **extra):
    """A plain-Python helper compiled as an inline device function of this target (``DEVICE_SCALAR``:
    under numba-cuda-mlir inlined by its own inliner, see target.py): its bit casts are this
    module's, ``extra`` names replace other globals of its source."""
    return _format.compile_for_target(
        fn, cuda.jit(**DEVICE_SCALAR), float32_bits=float32_bits, bits_float32=bits_float32, **extra
    )


# ------------------------------------------------------------------------------------------------
# portable helpers (plain Python: valid device code and valid simulator code)

_U32_SIGN16 = np.uint32(0x8000)
_U32_ABS_MASK = np.uint32(0x7FFFFFFF)
_U32_F32_INF_BITS = np.uint32(0x7F800000)
_U32_F16_OVERFLOW = np.uint32(0x477FF000)  # 65520: rounds (to even) up to inf in float16
_U32_F16_MIN_NORMAL_AS_F32 = np.uint32(0x38800000)  # 2^-14
_U32_F16_NAN = np.uint32(0x7E00)
_U32_F16_INF = np.uint32(0x7C00)
_U32_BF16_QUIET = np.uint32(0x40)
_U32_2P23_BITS = np.uint32(0x4B000000)
_U32_F16_EXP_REBIAS = np.uint32(112 << 10)  # (127 - 15) << 10
_F32_2P24 = np.float32(2.0**24)
_F32_2P23 = np.float32(2.0**23)


def _float32_to_half_bits(x):
    """float32 -> float16 bits, round to nearest even, overflow to inf, NaN -> quiet NaN."""
    bits = np.uint32(float32_bits(x))
    sign = (bits >> np.uint32(16)) & _U32_SIGN16
    mag = bits & _U32_ABS_MASK
    # normal range: drop 13 mantissa bits with RNE (add 0xFFF plus the kept LSB, truncate)
    normal_mag = max(mag, _U32_F16_MIN_NORMAL_AS_F32)
    rounded = normal_mag + np.uint32(0xFFF) + ((normal_mag >> np.uint32(13)) & np.uint32(1))
    normal = (rounded >> np.uint32(13)) - _U32_F16_EXP_REBIAS
    # subnormal range (|x| < 2^-14): |x| * 2^24 is exact; adding 2^23 rounds it to an integer (RNE);
    # a carry to 1024 is exactly the smallest normal's code
    scaled = np.float32(abs(x) * _F32_2P24) + _F32_2P23
    subnormal = np.uint32(float32_bits(scaled)) - _U32_2P23_BITS
    code = subnormal if mag < _U32_F16_MIN_NORMAL_AS_F32 else normal
    code = _U32_F16_INF if mag >= _U32_F16_OVERFLOW else code
    code = _U32_F16_NAN if mag > _U32_F32_INF_BITS else code
    return np.uint16(code | sign)


def _float32_to_bfloat16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (overflow to inf), NaN kept quiet."""
    bits = np.uint32(float32_bits(x))
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet = (bits >> np.uint32(16)) | _U32_BF16_QUIET
    return np.uint16(quiet if (bits & _U32_ABS_MASK) > _U32_F32_INF_BITS else rounded)


# Four e4m3 codes of a word decoded by bit placement (the GEMV's weight stream, where decoding is
# the bottleneck: conversions issue at 16 per clock per SM, integer operations at 64). Placing a
# code's 7 magnitude bits at float32 bits 26..20 and its sign at bit 31 gives exactly
# code_value * 2^-120 for every finite code, subnormals included (e4m3's subnormals land on float32
# subnormals, exactly). NaN codes (0x7F / 0xFF) come out as finite garbage: ``nan_code_bits`` flags
# them so the caller can poison what they touch.
_U32_MAG_AT_20 = np.uint32(0x07F00000)
_U32_SIGN32 = np.uint32(0x80000000)
_U32_LOW7X4 = np.uint32(0x7F7F7F7F)
_U32_ONEX4 = np.uint32(0x01010101)
_U32_HIGHX4 = np.uint32(0x80808080)


def _e4m3x4_scaled(word):
    """The four e4m3 codes of a uint32 (byte 0 first) as float32 values times 2^-120, exact for
    every finite code."""
    w = np.uint32(word)
    v0 = bits_float32(((w << np.uint32(20)) & _U32_MAG_AT_20) | ((w << np.uint32(24)) & _U32_SIGN32))
    v1 = bits_float32(((w << np.uint32(12)) & _U32_MAG_AT_20) | ((w << np.uint32(16)) & _U32_SIGN32))
    v2 = bits_float32(((w << np.uint32(4)) & _U32_MAG_AT_20) | ((w << np.uint32(8)) & _U32_SIGN32))
    v3 = bits_float32(((w >> np.uint32(4)) & _U32_MAG_AT_20) | (w & _U32_SIGN32))
    return v0, v1, v2, v3


def _nan_code_bits(word):
    """Bit 7 of a byte is set where that byte of ``word`` is an e4m3 NaN code (0x7F or 0xFF)."""
    return ((np.uint32(word) & _U32_LOW7X4) + _U32_ONEX4) & _U32_HIGHX4


def _load_row_words_u8(arr, row, col):
    """The 16 bytes at &arr[row, col] of a uint8 array as four uint32 words (byte col lowest)."""
    w0 = (
        np.uint32(arr[row, col])
        | (np.uint32(arr[row, col + 1]) << np.uint32(8))
        | (np.uint32(arr[row, col + 2]) << np.uint32(16))
        | (np.uint32(arr[row, col + 3]) << np.uint32(24))
    )
    w1 = (
        np.uint32(arr[row, col + 4])
        | (np.uint32(arr[row, col + 5]) << np.uint32(8))
        | (np.uint32(arr[row, col + 6]) << np.uint32(16))
        | (np.uint32(arr[row, col + 7]) << np.uint32(24))
    )
    w2 = (
        np.uint32(arr[row, col + 8])
        | (np.uint32(arr[row, col + 9]) << np.uint32(8))
        | (np.uint32(arr[row, col + 10]) << np.uint32(16))
        | (np.uint32(arr[row, col + 11]) << np.uint32(24))
    )
    w3 = (
        np.uint32(arr[row, col + 12])
        | (np.uint32(arr[row, col + 13]) << np.uint32(8))
        | (np.uint32(arr[row, col + 14]) << np.uint32(16))
        | (np.uint32(arr[row, col + 15]) << np.uint32(24))
    )
    return w0, w1, w2, w3


def _load_row_words_u16(arr, row, col):
    """The 16 bytes at &arr[row, col] of a uint16 array as four uint32 words (element col lowest)."""
    w0 = np.uint32(arr[row, col]) | (np.uint32(arr[row, col + 1]) << np.uint32(16))
    w1 = np.uint32(arr[row, col + 2]) | (np.uint32(arr[row, col + 3]) << np.uint32(16))
    w2 = np.uint32(arr[row, col + 4]) | (np.uint32(arr[row, col + 5]) << np.uint32(16))
    w3 = np.uint32(arr[row, col + 6]) | (np.uint32(arr[row, col + 7]) << np.uint32(16))
    return w0, w1, w2, w3


def _half2_to_float32_portable(word):
    w = np.uint32(word)
    return half_bits_to_float32(w & _U32_LOW_HALF), half_bits_to_float32(w >> _U32_16)


decode_e4m3 = compile_device(_format.decode_e4m3_scalar)
decode_e8m0 = compile_device(_format.decode_e8m0_scalar)  # MX scale bytes -> 2^(byte - 127)
bfloat16_bits_to_float32 = compile_device(_format.bfloat16_bits_to_float32)
float32_to_half_bits = compile_device(_float32_to_half_bits)
float32_to_bfloat16_bits = compile_device(_float32_to_bfloat16_bits)
e4m3x4_scaled = compile_device(_e4m3x4_scaled)
nan_code_bits = compile_device(_nan_code_bits)
load_row_words_u8 = cuda.jit(**DEVICE_INLINE)(_load_row_words_u8)
load_row_words_u16 = cuda.jit(**DEVICE_INLINE)(_load_row_words_u16)
half2_to_float32_portable = compile_device(_half2_to_float32_portable, half_bits_to_float32=half_bits_to_float32)


@cuda.jit(**DEVICE_INLINE)
def fill(arr, value):
    """arr[:] = value for a 1-D (local) array: its length is a constant, so the loop unrolls and the
    elements stay in registers."""
    for i in range(arr.shape[0]):
        arr[i] = value


@cuda.jit(**DEVICE_INLINE)
def bf16_low(w):
    """The bfloat16 in the low half of a word, as float32 (exact)."""
    return bits_float32(w << _U32_16)


@cuda.jit(**DEVICE_INLINE)
def bf16_high(w):
    """The bfloat16 in the high half of a word, as float32 (exact)."""
    return bits_float32(w & _U32_HIGH_HALF)


@cuda.jit(**DEVICE_INLINE)
def f16_low(w):
    return half_bits_to_float32(w & _U32_LOW_HALF)


@cuda.jit(**DEVICE_INLINE)
def f16_high(w):
    return half_bits_to_float32(w >> _U32_16)


# ------------------------------------------------------------------------------------------------
# the encoders

# The portable encoder: the CPU's source, with this target's bit casts.
encode_e4m3 = compile_device(_format.encode_e4m3_scalar)


@cuda.jit(**DEVICE_INLINE)
def encode_pair_portable(lo, hi):
    """Codes of two float32 as uint32: code(lo) | code(hi) << 8."""
    return np.uint32(encode_e4m3(lo)) | (np.uint32(encode_e4m3(hi)) << _U32_8)


if not SIMULATOR:

    @cuda.jit(**DEVICE_INLINE)
    def encode_pair_hardware(lo, hi):
        """Codes of two float32 as uint32: code(lo) | code(hi) << 8, by one cvt instruction."""
        # NaN tested before the clamp (the clamp would turn NaN into 448), as "not equal to itself"
        # spelled ``not x == x``: numba-cuda-mlir 0.6.0 lowers a float ``!=`` to an ordered compare,
        # false for NaN (docs/DEVICE.md), and numba-cuda gives both spellings the same PTX
        lo_nan = not lo == lo
        hi_nan = not hi == hi
        lo_c = min(max(lo, -F32_E4M3_MAX), F32_E4M3_MAX)
        hi_c = min(max(hi, -F32_E4M3_MAX), F32_E4M3_MAX)
        pair = np.uint32(_cvt_e4m3x2(hi_c, lo_c))
        lo_code = _U32_NAN_CODE if lo_nan else pair & _U32_BYTE
        hi_code = _U32_NAN_CODE if hi_nan else pair >> _U32_8
        return lo_code | (hi_code << _U32_8)


@cuda.jit(**DEVICE_INLINE)
def finite_abs(v):
    """|v| for finite v, 0 for NaN and +-inf: amax is taken over finite elements (as the CPU's
    ``finite_amax``: NaN encodes to 0x7F and inf saturates, whatever the scale)."""
    a = abs(v)
    return a if a < _F32_INF else F32_ZERO


@cuda.jit(**DEVICE_INLINE)
def _first_code(pair):
    return pair & _U32_BYTE


def encode_one(encoder):
    """The single-value encoder for ``encoder``, returning uint32: the pair encoder's low code, so
    the elements outside 16-element groups go through the same instruction as the rest."""
    pair = encode_pair(encoder)

    @cuda.jit(**DEVICE_INLINE)
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


__all__ = [
    "ENCODERS",
    "HARDWARE_MIN_CC",
    "hardware_available",
    "compile_device",
    "float32_bits",
    "bits_float32",
    "decode_e8m0",
    "half_bits_to_float32",
    "bfloat16_bits_to_float32",
    "half2_to_float32",
    "half2_to_float32_portable",
    "float32_to_half_bits",
    "float32_to_bfloat16_bits",
    "bf16_low",
    "bf16_high",
    "f16_low",
    "f16_high",
    "decode_e4m3",
    "e4m3x4_scaled",
    "nan_code_bits",
    "encode_e4m3",
    "encode_pair",
    "encode_one",
    "finite_abs",
    "load_u32x4",
    "store_u32x4",
    "load_row_words",
    "load_row_words_u8",
    "load_row_words_u16",
    "fill",
]
