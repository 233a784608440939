"""Numba CUDA kernels of the FP8 GEMM: the tiled GEMM, the decode (small-M) GEMV, and the epilogue
of the f32-staged cuBLASLt path.

Every kernel computes DESIGN.md's
    y[m, n] = round_out((sum_k dec(a[m, k]) * dec(b[n, k])) * sa[m] * sb[n] + float32(bias[n]))
with float32 products and sums (a product of two e4m3 values is exact in float32, so a fused
multiply-add gives the same bits as a multiply then an add), the scales applied as ``(acc * sa) * sb``
in float32, and the output rounded to nearest even by the portable helpers below.

Argument conventions shared by the kernels (the launcher, ``vtnumba.cuda.launch``, takes them as
fixed signatures):
- scales: float32 vectors with a step, read as ``s[i * step]``: step 0 for a per-tensor scale
  (shape (1,)), step 1 for per-row / per-channel.
- bias: uint16 bits with a kind: 0 none, 1 float32 (two uint16 halves, little-endian), 2 float16,
  3 bfloat16. One signature for every bias dtype, so a kernel compiles once per output type.
- output: float32 [M, N], or uint16 [M, N] holding float16 (out_kind 1) or bfloat16 (out_kind 2)
  bits; out_kind 0 is float32.

Decoding: the tiled GEMM, the epilogue and the GEMV's activation staging use
``vtnumba._format.decode_e4m3_scalar`` compiled for the GPU (run by the simulator as plain Python).
The GEMV's weight stream, where decoding is the bottleneck, places the code's bits into a float32
(exact, scaled by a power of two; see the GEMV section for why and the proof). On sm_89+ its 16-byte
loads and float16 reads are inline PTX; elsewhere, and in the simulator, plain indexing.
"""

import functools

import numpy as np

from .. import _format
from .launch import compile_kernel
from .target import SIMULATOR, cuda, intrinsic, libdevice, types

# ------------------------------------------------------------------------------------------------
# portable scalar helpers (plain Python; valid Numba CUDA code and valid simulator code)

_U32_SIGN16 = np.uint32(0x8000)
_U32_ABS16 = np.uint32(0x7FFF)
_U32_F16_INF = np.uint32(0x7C00)
_U32_F16_REBIAS = np.uint32(0x38000000)  # (127 - 15) << 23
_U32_F32_INF_BITS = np.uint32(0x7F800000)
_U32_ABS_MASK = np.uint32(0x7FFFFFFF)
_U32_F16_OVERFLOW = np.uint32(0x477FF000)  # 65520: rounds (to even) up to inf in float16
_U32_F16_MIN_NORMAL_AS_F32 = np.uint32(0x38800000)  # 2^-14
_U32_F16_NAN = np.uint32(0x7E00)
_U32_BF16_QUIET = np.uint32(0x40)
_U32_FFF = np.uint32(0xFFF)
_U32_7FFF = np.uint32(0x7FFF)
_U32_2P23_BITS = np.uint32(0x4B000000)
_U32_ONE = np.uint32(1)
_U32_13 = np.uint32(13)
_U32_16 = np.uint32(16)
_U32_F16_EXP_REBIAS = np.uint32(112 << 10)
_F32_2M24 = np.float32(2.0 ** -24)
_F32_2P24 = np.float32(2.0 ** 24)
_F32_2P23 = np.float32(2.0 ** 23)
_F32_FLT_MAX = np.float32(np.finfo(np.float32).max)


def float32_bits(x):
    return _format.float32_bits(x)


def bits_float32(b):
    return _format.bits_float32(b)


def half_bits_to_float32(h):
    """float16 bits -> float32, exact (subnormals, infinities and NaN included)."""
    h = np.uint32(h)
    sign = (h & _U32_SIGN16) << _U32_16
    mag = h & _U32_ABS16
    normal = bits_float32(((mag << _U32_13) + _U32_F16_REBIAS) | sign)
    special = bits_float32(sign | _U32_F32_INF_BITS | ((mag & np.uint32(0x3FF)) << _U32_13))
    tiny = np.float32(np.float32(mag) * _F32_2M24)  # subnormal: mag * 2^-24, exact
    tiny = -tiny if sign != np.uint32(0) else tiny
    value = tiny if mag < np.uint32(0x400) else normal
    return special if mag >= _U32_F16_INF else value


def float32_to_half_bits(x):
    """float32 -> float16 bits, round to nearest even, overflow to inf, NaN -> quiet NaN."""
    bits = np.uint32(float32_bits(x))
    sign = (bits >> _U32_16) & _U32_SIGN16
    mag = bits & _U32_ABS_MASK
    # normal range: drop 13 mantissa bits with RNE (add 0xFFF plus the kept LSB, truncate)
    normal_mag = max(mag, _U32_F16_MIN_NORMAL_AS_F32)
    rounded = normal_mag + _U32_FFF + ((normal_mag >> _U32_13) & _U32_ONE)
    normal = (rounded >> _U32_13) - _U32_F16_EXP_REBIAS
    # subnormal range (|x| < 2^-14): |x| * 2^24 is exact; adding 2^23 rounds it to an integer (RNE);
    # a carry to 1024 is exactly the smallest normal's code
    scaled = np.float32(abs(x) * _F32_2P24) + _F32_2P23
    subnormal = np.uint32(float32_bits(scaled)) - _U32_2P23_BITS
    code = subnormal if mag < _U32_F16_MIN_NORMAL_AS_F32 else normal
    code = _U32_F16_INF if mag >= _U32_F16_OVERFLOW else code
    code = _U32_F16_NAN if mag > _U32_F32_INF_BITS else code
    return np.uint16(code | sign)


def float32_to_bfloat16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even (overflow to inf), NaN kept quiet."""
    bits = np.uint32(float32_bits(x))
    rounded = (bits + _U32_7FFF + ((bits >> _U32_16) & _U32_ONE)) >> _U32_16
    quiet = (bits >> _U32_16) | _U32_BF16_QUIET
    return np.uint16(quiet if (bits & _U32_ABS_MASK) > _U32_F32_INF_BITS else rounded)


def load_bias(bias, kind, n):
    """bias[n] as float32 from its uint16 bits (kind 1 float32, 2 float16, 3 bfloat16); exact."""
    if kind == 1:
        return bits_float32(np.uint32(bias[2 * n]) | (np.uint32(bias[2 * n + 1]) << _U32_16))
    if kind == 2:
        return half_bits_to_float32(bias[n])
    return bfloat16_bits_to_float32(bias[n])


def epilogue_value(acc, scale_a, scale_b, bias, bias_kind, n):
    """(acc * sa) * sb + float32(bias[n]), in float32."""
    v = np.float32(np.float32(acc * scale_a) * scale_b)
    if bias_kind != 0:
        v = np.float32(v + load_bias(bias, bias_kind, n))
    return v


def store_out(y, m, n, v, out_kind):
    """y[m, n] = round(v) into float32 (kind 0) or float16 / bfloat16 bits (kinds 1 / 2)."""
    if out_kind == 0:
        y[m, n] = v
    elif out_kind == 1:
        y[m, n] = float32_to_half_bits(v)
    else:
        y[m, n] = float32_to_bfloat16_bits(v)


# ------------------------------------------------------------------------------------------------
# compile the helpers for the target (the bit casts are the only target-specific primitives)

if SIMULATOR:
    _DEVICE = dict(device=True)
    _PRIMITIVES = {}
else:
    _DEVICE = dict(device=True, forceinline=True)


def _device(fn, **extra):
    return _format.compile_for_target(fn, cuda.jit(**_DEVICE), **{**_PRIMITIVES, **extra})


if not SIMULATOR:
    @cuda.jit(**_DEVICE)
    def _gpu_float32_bits(x):
        return np.uint32(libdevice.float_as_int(x))

    @cuda.jit(**_DEVICE)
    def _gpu_bits_float32(b):
        return libdevice.int_as_float(np.int32(b))

    _PRIMITIVES = dict(float32_bits=_gpu_float32_bits, bits_float32=_gpu_bits_float32)

decode_e4m3 = _device(_format.decode_e4m3_scalar)
encode_e4m3 = _device(_format.encode_e4m3_scalar)
bfloat16_bits_to_float32 = _device(_format.bfloat16_bits_to_float32)
half_bits_to_float32 = _device(half_bits_to_float32)
float32_to_half_bits = _device(float32_to_half_bits)
float32_to_bfloat16_bits = _device(float32_to_bfloat16_bits)
load_bias = _device(load_bias, half_bits_to_float32=half_bits_to_float32,
                    bfloat16_bits_to_float32=bfloat16_bits_to_float32)
epilogue_value = _device(epilogue_value, load_bias=load_bias)
store_out = _device(store_out, float32_to_half_bits=float32_to_half_bits,
                    float32_to_bfloat16_bits=float32_to_bfloat16_bits)


# ------------------------------------------------------------------------------------------------
# hardware paths (sm_89+): 16-byte loads and the exact e4m3x2 -> f16x2 conversion, in inline PTX

def _make_ptx_intrinsics():
    from llvmlite import ir
    from numba.core import cgutils

    i32, f32 = ir.IntType(32), ir.FloatType()

    @intrinsic
    def load_u32x4(typingctx, arr, row, col):
        """Four uint32 words from the 16 bytes at &arr[row, col] (16-byte aligned), one
        non-coherent 128-bit global load (the weight is read-only for the kernel's lifetime)."""
        ret = types.UniTuple(types.uint32, 4)
        sig = ret(arr, row, col)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            idx = [context.cast(builder, args[1], signature.args[1], types.intp),
                   context.cast(builder, args[2], signature.args[2], types.intp)]
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx)
            addr = builder.ptrtoint(ptr, ir.IntType(64))
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ir.IntType(64)])
            asm = ir.InlineAsm(fnty, "{ .reg .u64 g; cvta.to.global.u64 g, $4; "
                                     "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [g]; }", "=r,=r,=r,=r,l")
            res = builder.call(asm, [addr])
            return context.make_tuple(builder, ret, [builder.extract_value(res, i) for i in range(4)])

        return sig, codegen

    @intrinsic
    def half2_to_float32(typingctx, word):
        """The two float16 halves of a uint32 (low half first) as float32 (exact)."""
        ret = types.UniTuple(types.float32, 2)
        sig = ret(types.uint32)

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 2), [i32])
            asm = ir.InlineAsm(fnty, "{ .reg .b16 a, b; mov.b32 {a, b}, $2; cvt.f32.f16 $0, a; "
                                     "cvt.f32.f16 $1, b; }", "=f,=f,r")
            res = builder.call(asm, [args[0]])
            return context.make_tuple(builder, ret, [builder.extract_value(res, i) for i in range(2)])

        return sig, codegen

    return load_u32x4, half2_to_float32


def _portable_load_u32x4(arr, row, col):
    w = []
    for q in range(4):
        c = col + 4 * q
        w.append(np.uint32(arr[row, c]) | (np.uint32(arr[row, c + 1]) << np.uint32(8))
                 | (np.uint32(arr[row, c + 2]) << np.uint32(16)) | (np.uint32(arr[row, c + 3]) << np.uint32(24)))
    return w[0], w[1], w[2], w[3]


def _portable_load_u32x4_gpu(arr, row, col):
    w0 = (np.uint32(arr[row, col]) | (np.uint32(arr[row, col + 1]) << np.uint32(8))
          | (np.uint32(arr[row, col + 2]) << np.uint32(16)) | (np.uint32(arr[row, col + 3]) << np.uint32(24)))
    w1 = (np.uint32(arr[row, col + 4]) | (np.uint32(arr[row, col + 5]) << np.uint32(8))
          | (np.uint32(arr[row, col + 6]) << np.uint32(16)) | (np.uint32(arr[row, col + 7]) << np.uint32(24)))
    w2 = (np.uint32(arr[row, col + 8]) | (np.uint32(arr[row, col + 9]) << np.uint32(8))
          | (np.uint32(arr[row, col + 10]) << np.uint32(16)) | (np.uint32(arr[row, col + 11]) << np.uint32(24)))
    w3 = (np.uint32(arr[row, col + 12]) | (np.uint32(arr[row, col + 13]) << np.uint32(8))
          | (np.uint32(arr[row, col + 14]) << np.uint32(16)) | (np.uint32(arr[row, col + 15]) << np.uint32(24)))
    return w0, w1, w2, w3


def _portable_half2_to_float32(word):
    w = np.uint32(word)
    return half_bits_to_float32(w & np.uint32(0xFFFF)), half_bits_to_float32(w >> np.uint32(16))


_portable_load = cuda.jit(**_DEVICE)(_portable_load_u32x4 if SIMULATOR else _portable_load_u32x4_gpu)
_portable_half2 = cuda.jit(**_DEVICE)(_portable_half2_to_float32)
_HW = None if SIMULATOR else _make_ptx_intrinsics()


def hardware_path_available(cc):
    """The inline-PTX decode needs cvt.rn.f16x2.e4m3x2: sm_89 and newer, and a real GPU."""
    return not SIMULATOR and tuple(cc) >= (8, 9)


# ------------------------------------------------------------------------------------------------
# the f32-staged epilogue: y = round_out(acc * sa * sb + bias), acc from cuBLASLt in float32

def _epilogue_kernel(acc, y, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, out_kind):
    m_total, n_total = acc.shape
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < m_total * n_total:
        m = i // n_total
        n = i - m * n_total
        v = epilogue_value(acc[m, n], scale_a[m * sa_step], scale_b[n * sb_step], bias, bias_kind, n)
        store_out(y, m, n, v, out_kind)
        i += stride


# ------------------------------------------------------------------------------------------------
# the tiled GEMM: any shape, any strides; f32 CUDA-core FMA (the path for shapes cuBLASLt refuses
# and for the lever turned off)

TILE_M = 64
TILE_N = 64
TILE_K = 32
TILED_THREADS = 256  # 16 x 16, each thread a 4 x 4 block of outputs, strided by 16
TILED_SHARED_FLOATS = TILE_K * (TILE_M + TILE_N)  # == TILE_M * TILE_N: the output tile fits too


def _tiled_kernel(a, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
    m_total, k_total = a.shape
    n_total = b.shape[0]
    # one shared buffer: the k-major A and B tiles while accumulating (the compute loop reads rows
    # of 64 consecutive floats: no bank conflicts), then the 64 x 64 output tile for the epilogue
    smem = cuda.shared.array(TILED_SHARED_FLOATS, types.float32)
    acc = cuda.local.array(16, types.float32)
    for i in range(16):
        acc[i] = np.float32(0.0)
    tid = cuda.threadIdx.x
    tx = tid % 16
    ty = tid // 16
    m0 = cuda.blockIdx.y * TILE_M
    n0 = cuda.blockIdx.x * TILE_N
    for k0 in range(0, k_total, TILE_K):
        # load and decode: consecutive threads take consecutive k (coalesced byte loads)
        for i in range(TILE_M * TILE_K // TILED_THREADS):
            idx = tid + i * TILED_THREADS
            r = idx // TILE_K
            c = idx - r * TILE_K
            k = k0 + c
            va = np.float32(0.0)
            vb = np.float32(0.0)
            if k < k_total:
                if m0 + r < m_total:
                    va = decode_e4m3(a[m0 + r, k])
                if n0 + r < n_total:
                    vb = decode_e4m3(b[n0 + r, k])
            smem[c * TILE_M + r] = va
            smem[TILE_K * TILE_M + c * TILE_N + r] = vb
        cuda.syncthreads()
        for kk in range(TILE_K):
            a_row = kk * TILE_M + ty
            b_row = TILE_K * TILE_M + kk * TILE_N + tx
            for i in range(4):
                av = smem[a_row + 16 * i]
                for j in range(4):
                    acc[i * 4 + j] += av * smem[b_row + 16 * j]
        cuda.syncthreads()
    # stage the accumulators through shared memory: a short loop with constant indices keeps acc in
    # registers (an epilogue indexing acc in a loop the compiler does not unroll would spill it)
    for i in range(4):
        for j in range(4):
            smem[(ty + 16 * i) * TILE_N + tx + 16 * j] = acc[i * 4 + j]
    cuda.syncthreads()
    for idx in range(tid, TILE_M * TILE_N, TILED_THREADS):
        r = idx // TILE_N
        c = idx - r * TILE_N
        m = m0 + r
        n = n0 + c
        if m < m_total and n < n_total:
            v = epilogue_value(smem[idx], scale_a[m * sa_step], scale_b[n * sb_step], bias, bias_kind, n)
            store_out(y, m, n, v, out_kind)


# ------------------------------------------------------------------------------------------------
# the decode GEMV (M <= 4): streams the weight once at memory speed.
#
# Layout of the work: a block of GEMV_WARPS warps; each warp owns a few weight rows
# (gemv_rows_per_warp: 4 at M = 1); each lane reads 16 contiguous weight bytes of each of its rows
# per step (one 128-bit load per row, all issued before any arithmetic). The activation rows are staged once per block in shared
# memory, laid out plane by plane so that the 32 lanes of a warp read 32 consecutive words (no bank
# conflicts): as float32 when M x K x 4 bytes fit in 48 KiB (no conversion in the inner loop), else
# as float16 bits (exact for e4m3 values; half the bytes, so K = 14336 fits at M = 1).
#
# Why the weight is decoded by bit placement and not by the cvt.rn.f16x2.e4m3x2 instruction: the
# first version (cvt e4m3x2 -> f16x2, then cvt f16 -> f32) ran at 13.1 us for N = K = 4096, M = 1 on
# the H200, twice cuBLASLt's 6.2 us: conversions issue at 16 per clock per SM, and it took 1.5 per
# weight byte. Placing the 7 magnitude bits of an e4m3 code at float32 bits 26..20 and its sign at
# bit 31 (three integer operations, 64 per clock) gives exactly code_value * 2^-120 for every
# finite code, subnormals included (e4m3's subnormals land on float32 subnormals, exactly). The
# activation is staged times 2^60, so every product is code_a * code_b * 2^-60: a normal float32,
# exact, far from underflow and overflow, and float32 sums of such products round exactly as the
# unscaled sums would (scaling by a power of two commutes with rounding when nothing underflows).
# The accumulator is multiplied back by 2^60 (exact) before the scales. The one code the placement
# does not give is NaN (0x7F / 0xFF): a per-row flag catches it, and the row's outputs become NaN,
# as NaN * x would.
#
# Staging modes (one kernel, a runtime switch; only the staging differs):
#   0 codes:     a holds e4m3 codes, the dequantization scale is scale_a
#   1 static:    x is float, codes = encode(x * (1 / scale)), scale given (DESIGN.md static)
#   2 dynamic:   per-tensor scale = max(amax / 448, floor) over all of x, then as static
#   3 per_token: per-row scale = max(min(amax_row, ub) / 448, floor), codes = encode(x / scale_row)
# Modes 1-3 make an FP8 linear layer at decode one launch: quantization and GEMM fused.

GEMV_WARPS = 4
GEMV_THREADS = 32 * GEMV_WARPS
GEMV_MAX_M = 4
GEMV_SHARED_BYTES = 48 * 1024  # the static per-block limit without an opt-in attribute
STAGE_CODES, STAGE_STATIC, STAGE_DYNAMIC, STAGE_PER_TOKEN = 0, 1, 2, 3
X_FLOAT32, X_FLOAT16, X_BFLOAT16 = 0, 1, 2

_F32_ZERO = np.float32(0.0)
_F32_ONE = np.float32(1.0)
_F32_NAN = np.float32(np.nan)
_F32_2P60 = np.float32(2.0 ** 60)
_U32_MAG_AT_20 = np.uint32(0x07F00000)
_U32_SIGN32 = np.uint32(0x80000000)
_U32_LOW7X4 = np.uint32(0x7F7F7F7F)
_U32_ONEX4 = np.uint32(0x01010101)
_U32_HIGHX4 = np.uint32(0x80808080)


def e4m3x4_scaled(word):
    """The four e4m3 codes of a uint32 (byte 0 first) as float32 values times 2^-120, exact for
    every finite code (see the comment above); NaN codes give finite garbage (callers flag them)."""
    w = np.uint32(word)
    v0 = bits_float32(((w << np.uint32(20)) & _U32_MAG_AT_20) | ((w << np.uint32(24)) & _U32_SIGN32))
    v1 = bits_float32(((w << np.uint32(12)) & _U32_MAG_AT_20) | ((w << _U32_16) & _U32_SIGN32))
    v2 = bits_float32(((w << np.uint32(4)) & _U32_MAG_AT_20) | ((w << np.uint32(8)) & _U32_SIGN32))
    v3 = bits_float32(((w >> np.uint32(4)) & _U32_MAG_AT_20) | (w & _U32_SIGN32))
    return v0, v1, v2, v3


def nan_code_bits(word):
    """Bit 7 of a byte is set where that byte of ``word`` is an e4m3 NaN code (0x7F or 0xFF)."""
    return ((np.uint32(word) & _U32_LOW7X4) + _U32_ONEX4) & _U32_HIGHX4


e4m3x4_scaled = _device(e4m3x4_scaled)
nan_code_bits = _device(nan_code_bits)


def _load_x(x, x_kind, m, k):
    """x[m, k] as float32 from a uint16 view: float32 (two halves), float16 or bfloat16 bits."""
    if x_kind == 0:
        return bits_float32(np.uint32(x[m, 2 * k]) | (np.uint32(x[m, 2 * k + 1]) << np.uint32(16)))
    if x_kind == 1:
        return half_bits_to_float32(x[m, k])
    return bfloat16_bits_to_float32(x[m, k])


_load_x_dev = _device(_load_x, half_bits_to_float32=half_bits_to_float32,
                      bfloat16_bits_to_float32=bfloat16_bits_to_float32)


def _shfl_warp_sum(v, scratch, lane, warp):
    """The sum of v over the 32 lanes of a warp, in every lane (butterfly shuffles)."""
    offset = 16
    while offset > 0:
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, offset)
        offset //= 2
    return v


def _simulated_warp_sum(v, scratch, lane, warp):
    """The same sum through shared memory: the CUDA simulator has no warp shuffles. Every thread of
    the block must call it (it synchronizes the block)."""
    scratch[warp * 32 + lane] = v
    cuda.syncthreads()
    total = np.float32(0.0)
    for i in range(32):
        total += scratch[warp * 32 + i]
    cuda.syncthreads()
    return total


_warp_sum = cuda.jit(**_DEVICE)(_simulated_warp_sum if SIMULATOR else _shfl_warp_sum)
_WARP_SUM_SCRATCH = GEMV_THREADS if SIMULATOR else 1


def gemv_rows_per_warp(m_tile):
    """Weight rows per warp: 4 at M = 1 (four 128-bit loads in flight per lane, one activation read
    shared by four rows); 2 for M = 2..4, whose activation registers (16 per row of x) would
    otherwise spill (checked with ptxas -v for sm_90)."""
    return 4 if m_tile == 1 else 2


def gemv_rows_per_block(m):
    return GEMV_WARPS * gemv_rows_per_warp(gemv_m_tile(m))


def gemv_stages_float32(m, k):
    """Whether the activation is staged as float32 (else float16 bits) for M rows of K."""
    return gemv_m_tile(m) * k * 4 <= GEMV_SHARED_BYTES


def gemv_shared_bytes(m, k):
    """Dynamic shared memory of the GEMV for M rows of K (rows up to the compiled tile are staged)."""
    return gemv_m_tile(m) * k * (4 if gemv_stages_float32(m, k) else 2)


@functools.lru_cache(maxsize=None)
def gemv_kernel(m_tile, hardware, stage_float32):
    """The GEMV kernel for up to ``m_tile`` activation rows (1, 2 or 4; compiled per value so the
    accumulators live in registers), with hardware loads (inline PTX) or portable ones, and the
    activation staged as float32 or float16 bits."""
    if hardware:
        load16, half2 = _HW
    else:
        load16, half2 = _portable_load, _portable_half2
    rows = gemv_rows_per_warp(m_tile)
    n_acc = rows * m_tile
    n_x = 16 * m_tile
    n_words = 4 * rows
    load_x = _load_x_dev
    encode = encode_e4m3
    decode = decode_e4m3
    to_half = float32_to_half_bits
    to_bits = _PRIMITIVES.get("float32_bits", float32_bits)
    from_bits = _PRIMITIVES.get("bits_float32", bits_float32)
    dec4 = e4m3x4_scaled
    nan_bits = nan_code_bits
    epilogue = epilogue_value
    store = store_out
    warp_sum = _warp_sum
    scratch_size = _WARP_SUM_SCRATCH

    def gemv(a, x, x_kind, mode, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
        n_total, k_total = b.shape
        m_total = y.shape[0]
        k16 = k_total // 16
        kh = k_total // 2
        stage = cuda.shared.array(0, types.uint32)
        row_scale = cuda.shared.array(m_tile, types.float32)
        row_amax = cuda.shared.array(m_tile, types.float32)
        scratch = cuda.shared.array(scratch_size, types.float32)
        tid = cuda.threadIdx.x

        # -- staging: activation rows -> their decoded e4m3 values (rows >= M staged as zeros) --
        if mode != STAGE_CODES:
            if tid < m_tile:
                row_amax[tid] = _F32_ZERO
            cuda.syncthreads()
            if mode != STAGE_STATIC:
                for m in range(m_total):
                    local = _F32_ZERO
                    for k in range(tid, k_total, GEMV_THREADS):
                        v = abs(load_x(x, x_kind, m, k))
                        if v <= _F32_FLT_MAX:  # finite only: NaN and inf stay out of amax
                            local = max(local, v)
                    slot = m if mode == STAGE_PER_TOKEN else 0
                    cuda.atomic.max(row_amax, slot, local)
                cuda.syncthreads()
            if tid < m_total:
                if mode == STAGE_STATIC:
                    s = qscale[0]
                elif mode == STAGE_DYNAMIC:
                    s = max(row_amax[0] / np.float32(448.0), _format.F32_MIN_SCALE)
                else:
                    t = row_amax[tid]
                    if qscale[0] > _F32_ZERO:
                        t = min(t, qscale[0])
                    s = max(t / np.float32(448.0), _format.F32_MIN_SCALE)
                row_scale[tid] = s
            cuda.syncthreads()
        per_word = 1 if stage_float32 else 2  # activation values per staged 32-bit word
        words_per_row = k_total // per_word
        for word in range(tid, m_tile * words_per_row, GEMV_THREADS):
            m = word // words_per_row
            rest = word - m * words_per_row
            plane = rest // k16
            c = rest - plane * k16
            k = 16 * c + per_word * plane
            v0 = _F32_ZERO
            v1 = _F32_ZERO
            if m < m_total:
                if mode == STAGE_CODES:
                    c0 = a[m, k]
                    c1 = a[m, k + per_word - 1]
                elif mode == STAGE_PER_TOKEN:
                    s = row_scale[m]
                    c0 = encode(np.float32(load_x(x, x_kind, m, k) / s))
                    c1 = encode(np.float32(load_x(x, x_kind, m, k + per_word - 1) / s))
                else:
                    inv = np.float32(_F32_ONE / row_scale[m])
                    c0 = encode(np.float32(load_x(x, x_kind, m, k) * inv))
                    c1 = encode(np.float32(load_x(x, x_kind, m, k + per_word - 1) * inv))
                v0 = decode(c0)
                v1 = decode(c1)
            if stage_float32:
                stage[word] = np.uint32(to_bits(np.float32(v0 * _F32_2P60)))
            else:
                stage[word] = np.uint32(to_half(v0)) | (np.uint32(to_half(v1)) << np.uint32(16))
        cuda.syncthreads()

        # -- streaming: 128-bit weight loads, bit-placed decode, f32 FMA, warp reduction --------
        lane = tid % 32
        warp = tid // 32
        n_base = (cuda.blockIdx.x * GEMV_WARPS + warp) * rows
        acc = cuda.local.array(n_acc, types.float32)
        xv = cuda.local.array(n_x, types.float32)
        words = cuda.local.array(n_words, types.uint32)
        nan_flags = cuda.local.array(rows, types.uint32)
        for i in range(n_acc):
            acc[i] = _F32_ZERO
        for r in range(rows):
            nan_flags[r] = np.uint32(0)
        for c in range(lane, k16, 32):
            for r in range(rows):  # every load of this step before any arithmetic
                n = min(n_base + r, n_total - 1)
                w0, w1, w2, w3 = load16(b, n, 16 * c)
                words[4 * r] = w0
                words[4 * r + 1] = w1
                words[4 * r + 2] = w2
                words[4 * r + 3] = w3
            for m in range(m_tile):
                if stage_float32:
                    for j in range(16):
                        xv[16 * m + j] = from_bits(stage[m * k_total + j * k16 + c])
                else:
                    for p in range(8):
                        lo, hi = half2(stage[m * kh + p * k16 + c])
                        xv[16 * m + 2 * p] = np.float32(lo * _F32_2P60)
                        xv[16 * m + 2 * p + 1] = np.float32(hi * _F32_2P60)
            for r in range(rows):
                for q in range(4):
                    w = words[4 * r + q]
                    nan_flags[r] |= nan_bits(w)
                    f0, f1, f2, f3 = dec4(w)
                    for m in range(m_tile):
                        s = acc[r * m_tile + m]
                        s += f0 * xv[16 * m + 4 * q]
                        s += f1 * xv[16 * m + 4 * q + 1]
                        s += f2 * xv[16 * m + 4 * q + 2]
                        s += f3 * xv[16 * m + 4 * q + 3]
                        acc[r * m_tile + m] = s
        for i in range(n_acc):
            acc[i] = warp_sum(acc[i], scratch, lane, warp)
        for r in range(rows):
            has_nan = warp_sum(_F32_ONE if nan_flags[r] != np.uint32(0) else _F32_ZERO, scratch, lane, warp)
            nan_flags[r] = np.uint32(1) if has_nan > _F32_ZERO else np.uint32(0)
        if lane == 0:
            for r in range(rows):
                n = n_base + r
                if n < n_total:
                    sb = scale_b[n * sb_step]
                    for m in range(m_tile):
                        if m < m_total:
                            sa = scale_a[m * sa_step] if mode == STAGE_CODES else row_scale[m]
                            total = np.float32(acc[r * m_tile + m] * _F32_2P60)  # exact: undo 2^-60
                            if nan_flags[r] != np.uint32(0):
                                total = _F32_NAN
                            v = epilogue(total, sa, sb, bias, bias_kind, n)
                            store(y, m, n, v, out_kind)

    return gemv


def gemv_m_tile(m):
    """The compiled row count that covers ``m`` activation rows."""
    for tile in (1, 2, 4):
        if m <= tile:
            return tile
    raise ValueError(f"m must be <= {GEMV_MAX_M} for the decode GEMV, got {m}")


# ------------------------------------------------------------------------------------------------
# signatures and compiled kernels

_u8_2d = types.uint8[:, :]
_u16_2d = types.uint16[:, :]
_f32_1d = types.float32[::1]
_u16_1d = types.uint16[::1]
_i64 = types.int64
_i32 = types.int32


def _out_type(out_is_float32):
    return types.float32[:, ::1] if out_is_float32 else types.uint16[:, ::1]


@functools.lru_cache(maxsize=None)
def epilogue_kernel(out_is_float32):
    sig = (types.float32[:, ::1], _out_type(out_is_float32), _f32_1d, _i64, _f32_1d, _i64, _u16_1d, _i32, _i32)
    return compile_kernel(_epilogue_kernel, sig)


@functools.lru_cache(maxsize=None)
def tiled_kernel(out_is_float32):
    sig = (_u8_2d, _u8_2d, _f32_1d, _i64, _f32_1d, _i64, _u16_1d, _i32, _out_type(out_is_float32), _i32)
    return compile_kernel(_tiled_kernel, sig)


@functools.lru_cache(maxsize=None)
def gemv_launcher(m, k, hardware, out_is_float32):
    """The GEMV for M rows of K: its compiled variant follows from M and K."""
    sig = (_u8_2d, _u16_2d, _i32, _i32, _f32_1d, _u8_2d, _f32_1d, _i64, _f32_1d, _i64, _u16_1d, _i32,
           _out_type(out_is_float32), _i32)
    return compile_kernel(gemv_kernel(gemv_m_tile(m), hardware, gemv_stages_float32(m, k)), sig)


__all__ = ["epilogue_kernel", "tiled_kernel", "gemv_launcher", "gemv_m_tile", "hardware_path_available",
           "gemv_shared_bytes", "TILE_M", "TILE_N", "TILED_THREADS", "GEMV_THREADS", "gemv_rows_per_block",
           "GEMV_MAX_M", "GEMV_SHARED_BYTES", "STAGE_CODES", "STAGE_STATIC", "STAGE_DYNAMIC",
           "STAGE_PER_TOKEN", "X_FLOAT32", "X_FLOAT16", "X_BFLOAT16"]
