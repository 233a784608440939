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

Decoding: the tiled GEMM and the epilogue use
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


def scaled_value(acc, scale_a, scale_b, has_bias, bias_value):
    """(acc * sa) * sb + bias_value, in float32 (the bias already read as float32)."""
    v = np.float32(np.float32(acc * scale_a) * scale_b)
    if has_bias:
        v = np.float32(v + bias_value)
    return v


def epilogue_value(acc, scale_a, scale_b, bias, bias_kind, n):
    """(acc * sa) * sb + float32(bias[n]), in float32."""
    return scaled_value(acc, scale_a, scale_b, bias_kind != 0,
                        load_bias(bias, bias_kind, n) if bias_kind != 0 else np.float32(0.0))


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
bfloat16_bits_to_float32 = _device(_format.bfloat16_bits_to_float32)
half_bits_to_float32 = _device(half_bits_to_float32)
float32_to_half_bits = _device(float32_to_half_bits)
float32_to_bfloat16_bits = _device(float32_to_bfloat16_bits)
load_bias = _device(load_bias, half_bits_to_float32=half_bits_to_float32,
                    bfloat16_bits_to_float32=bfloat16_bits_to_float32)
scaled_value = _device(scaled_value)
epilogue_value = _device(epilogue_value, load_bias=load_bias, scaled_value=scaled_value)
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
# Layout of the work: a block owns gemv_rows(M) weight rows; its 128 threads split K, each taking 16
# weight bytes of every one of those rows per step (that many 128-bit loads in flight before any
# arithmetic) and the same 16 activation values, read straight from global memory (every block
# reads the same activation, so it is served by the caches). At N = K = 4096 that is two steps of
# 128 threads x 16 bytes per row, 1024 blocks. The epilogue's scales and bias are read at the start,
# beside the first weight loads. The partial sums meet through warp shuffles and one shared-memory
# step. No activation staging: the first version staged the whole activation in shared memory per
# block (serial, uncoalesced) and ran at 13-22 us where cuBLASLt takes 6.2 (H200, 2026-11-29); this
# one takes 8.9 (benchmarks/sweep_gemv.py), bounded by the exact decode's arithmetic (gemm.py).
#
# The weight is decoded by bit placement, not by cvt.rn.f16x2.e4m3x2 (conversions issue at 16 per
# clock per SM; integer operations at 64): placing the 7 magnitude bits of an e4m3 code at float32
# bits 26..20 and its sign at bit 31 gives exactly code_value * 2^-120 for every finite code,
# subnormals included (e4m3's subnormals land on float32 subnormals, exactly). The activation
# factor is its e4m3 value times 2^60, so every product is code_a * code_b * 2^-60: a normal
# float32, exact, far from underflow and overflow, and float32 sums of such products round exactly
# as the unscaled sums would (scaling by a power of two commutes with rounding when nothing
# underflows). The sum is multiplied back by 2^60 (exact) before the scales. The one code the
# placement does not give is NaN (0x7F / 0xFF): flags per weight row and per activation row catch
# it, and the affected outputs become NaN, as NaN * x would.
#
# Activation modes (one kernel body, compiled per mode; only the activation's source differs):
#   0 codes:     a holds e4m3 codes, the dequantization scale is scale_a
#   1 static:    x is float, codes = encode(x * (1 / scale)), scale given (DESIGN.md static)
#   2 dynamic:   per-tensor scale = max(amax / 448, floor) over all of x, then as static
#   3 per_token: per-row scale = max(min(amax_row, ub) / 448, floor), codes = encode(x / scale_row)
# Modes 1-3 make an FP8 linear layer at decode one launch: quantization and GEMM fused. Modes 2-3
# first read the activation once for its amax (every block does; it is small and cached).

# 128 threads a block: the fastest of 128 / 256 at every M in benchmarks/sweep_gemv.py (H200,
# 2026-11-29); the simulator runs each thread as a Python thread, so it gets 64 (still two warps).
GEMV_THREADS = 64 if SIMULATOR else 128
GEMV_MAX_M = 4


def gemv_rows(m):
    """Weight rows per block for M activation rows: 4 (four 128-bit loads in flight per thread, one
    activation read shared by four rows), 2 at M = 3..4, whose 64 activation values per step would
    otherwise push the kernel past 160 registers (ptxas -v, sm_90)."""
    return 4 if gemv_m_tile(m) <= 2 else 2


def gemv_min_blocks(m, mode):
    """Resident blocks per SM the launch bounds ask for (None: no bound). At M = 1, 8 blocks of
    the codes kernel (64 registers, a 16-byte spill) and 6 of the fused static one beat the
    unbounded kernels in benchmarks/sweep_gemv.py: 8.9 against ~10 us, 11.3 against ~12 us at
    N = K = 4096."""
    if gemv_m_tile(m) != 1:
        return None
    return 8 if mode == STAGE_CODES else 6
STAGE_CODES, STAGE_STATIC, STAGE_DYNAMIC, STAGE_PER_TOKEN = 0, 1, 2, 3
X_FLOAT32, X_FLOAT16, X_BFLOAT16 = 0, 1, 2

_F32_ZERO = np.float32(0.0)
_F32_ONE = np.float32(1.0)
_F32_NAN = np.float32(np.nan)
_F32_2P60 = np.float32(2.0 ** 60)
_F32_2P120 = np.float32(2.0 ** 120)
_U32_MAG_AT_20 = np.uint32(0x07F00000)
_U32_SIGN32 = np.uint32(0x80000000)
_U32_LOW7X4 = np.uint32(0x7F7F7F7F)
_U32_ONEX4 = np.uint32(0x01010101)
_U32_HIGHX4 = np.uint32(0x80808080)
_U32_HIGH16 = np.uint32(0xFFFF0000)


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


def _portable_load_u16x8(arr, row, col):
    """The 16 bytes at &arr[row, col] of a uint16 array as four uint32 words (element col lowest)."""
    w0 = np.uint32(arr[row, col]) | (np.uint32(arr[row, col + 1]) << np.uint32(16))
    w1 = np.uint32(arr[row, col + 2]) | (np.uint32(arr[row, col + 3]) << np.uint32(16))
    w2 = np.uint32(arr[row, col + 4]) | (np.uint32(arr[row, col + 5]) << np.uint32(16))
    w3 = np.uint32(arr[row, col + 6]) | (np.uint32(arr[row, col + 7]) << np.uint32(16))
    return w0, w1, w2, w3


_portable_load_u16 = cuda.jit(**_DEVICE)(_portable_load_u16x8)


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


@functools.lru_cache(maxsize=None)
def gemv_kernel(m_tile, hardware, mode, rows, threads):
    """The GEMV kernel for up to ``m_tile`` activation rows (1, 2 or 4; compiled per value so the
    accumulators live in registers), with hardware loads and encoder (inline PTX, sm_89+) or
    portable ones, for one activation ``mode`` (compiled per mode: the codes-only kernel then
    carries none of the quantizer's registers), owning ``rows`` weight rows per block of
    ``threads`` threads."""
    from . import codec, quant

    if hardware:
        load16, half2 = _HW
        load16_u16 = load16  # the inline-PTX load takes any element type
    else:
        load16, half2, load16_u16 = _portable_load, _portable_half2, _portable_load_u16
    pair = codec.encode_pair("hardware" if hardware else "portable")
    finite_abs = codec.finite_abs
    n_acc = rows * m_tile
    warps = threads // 32
    n_partial = warps * n_acc
    n_words = 4 * rows
    n_x = 16 * m_tile
    from_bits = _PRIMITIVES.get("bits_float32", bits_float32)
    dec4 = e4m3x4_scaled
    nan_bits = nan_code_bits
    store = store_out
    warp_sum = _warp_sum
    block_max = quant.block_max_for(threads)
    scratch_size = threads if SIMULATOR else 1
    load_bias_value = load_bias
    finish = scaled_value

    @cuda.jit(**_DEVICE)
    def load_x16(x, x_kind, m, c, vals):
        """vals[0..16) = x[m, 16 c .. 16 c + 16) as float32 (x: a uint16 view of the float rows)."""
        if x_kind == X_FLOAT32:
            for i in range(4):
                w0, w1, w2, w3 = load16_u16(x, m, 32 * c + 8 * i)
                vals[4 * i] = from_bits(w0)
                vals[4 * i + 1] = from_bits(w1)
                vals[4 * i + 2] = from_bits(w2)
                vals[4 * i + 3] = from_bits(w3)
        else:
            for i in range(2):
                w0, w1, w2, w3 = load16_u16(x, m, 16 * c + 8 * i)
                if x_kind == X_FLOAT16:
                    vals[8 * i], vals[8 * i + 1] = half2(w0)
                    vals[8 * i + 2], vals[8 * i + 3] = half2(w1)
                    vals[8 * i + 4], vals[8 * i + 5] = half2(w2)
                    vals[8 * i + 6], vals[8 * i + 7] = half2(w3)
                else:  # bfloat16: the upper 16 bits of a float32
                    vals[8 * i] = from_bits(w0 << _U32_16)
                    vals[8 * i + 1] = from_bits(w0 & _U32_HIGH16)
                    vals[8 * i + 2] = from_bits(w1 << _U32_16)
                    vals[8 * i + 3] = from_bits(w1 & _U32_HIGH16)
                    vals[8 * i + 4] = from_bits(w2 << _U32_16)
                    vals[8 * i + 5] = from_bits(w2 & _U32_HIGH16)
                    vals[8 * i + 6] = from_bits(w3 << _U32_16)
                    vals[8 * i + 7] = from_bits(w3 & _U32_HIGH16)

    @cuda.jit(**_DEVICE)
    def load_rows(b, n_base, n_total, c, words):
        """The 16 weight bytes of step ``c`` of each of the block's rows, as 4 words a row, every
        load issued before any is used (rows past N reread the last one; their sums are dropped)."""
        for r in range(rows):
            w0, w1, w2, w3 = load16(b, min(n_base + r, n_total - 1), 16 * c)
            words[4 * r] = w0
            words[4 * r + 1] = w1
            words[4 * r + 2] = w2
            words[4 * r + 3] = w3

    @cuda.jit(**_DEVICE)
    def encode4(vals, i, mult, divide):
        """The codes of vals[4 i .. 4 i + 4) times (or divided by) ``mult``, as one uint32."""
        if divide:
            lo = pair(vals[4 * i] / mult, vals[4 * i + 1] / mult)
            hi = pair(vals[4 * i + 2] / mult, vals[4 * i + 3] / mult)
        else:
            lo = pair(vals[4 * i] * mult, vals[4 * i + 1] * mult)
            hi = pair(vals[4 * i + 2] * mult, vals[4 * i + 3] * mult)
        return np.uint32(lo) | (np.uint32(hi) << _U32_16)

    def gemv(a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
        n_total, k_total = b.shape
        m_total = y.shape[0]
        k16 = k_total // 16
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        n_base = cuda.blockIdx.x * rows
        red = cuda.shared.array(threads, types.float32)
        partial = cuda.shared.array(n_partial, types.float32)
        row_scale = cuda.shared.array(m_tile, types.float32)  # dynamic modes: dequantization scale
        row_mult = cuda.shared.array(m_tile, types.float32)  # and quantization multiplier / divisor
        scratch = cuda.shared.array(scratch_size, types.float32)
        vals = cuda.local.array(16, types.float32)
        qw = cuda.local.array(4, types.uint32)
        acc = cuda.local.array(n_acc, types.float32)
        xv = cuda.local.array(n_x, types.float32)
        words = cuda.local.array(n_words, types.uint32)
        w_nan = cuda.local.array(rows, types.uint32)
        x_nan = cuda.local.array(m_tile, types.uint32)
        for i in range(n_acc):
            acc[i] = _F32_ZERO
        for r in range(rows):
            w_nan[r] = np.uint32(0)
        for m in range(m_tile):
            x_nan[m] = np.uint32(0)

        # The first step's weight loads go out before anything waits: a scale read, a barrier or
        # an amax pass ahead of them would add a whole memory latency to every block.
        c = tid
        if c < k16:
            load_rows(b, n_base, n_total, c, words)
        # the epilogue's operands too: read at the end they would add a memory latency per block
        out_r = tid // m_tile
        out_m = tid - out_r * m_tile
        out_n = min(n_base + out_r, n_total - 1)
        sb = _F32_ONE
        sa = _F32_ONE
        bias_value = _F32_ZERO
        if tid < n_acc:
            sb = scale_b[out_n * sb_step]
            if bias_kind != 0:
                bias_value = load_bias_value(bias, bias_kind, out_n)
            if mode == STAGE_CODES:
                sa = scale_a[min(out_m, m_total - 1) * sa_step]
            elif mode == STAGE_STATIC:
                sa = qscale[0]

        # -- the activation's scales -------------------------------------------------------------
        static_mult = _F32_ONE
        if mode == STAGE_STATIC:
            static_mult = np.float32(_F32_ONE / qscale[0])  # each thread: the same float32 quotient
        if mode == STAGE_DYNAMIC or mode == STAGE_PER_TOKEN:  # one read of x for its amax
            total = _F32_ZERO
            for m in range(m_tile):
                local = _F32_ZERO
                if m < m_total:
                    for cc in range(tid, k16, threads):
                        load_x16(x, x_kind, m, cc, vals)
                        for j in range(16):
                            local = max(local, finite_abs(vals[j]))
                amax = block_max(local, red)
                total = max(total, amax)
                if mode == STAGE_PER_TOKEN and tid == 0:
                    ub = qscale[0]
                    if ub > _F32_ZERO:
                        amax = min(amax, ub)
                    s = max(amax / np.float32(448.0), _format.F32_MIN_SCALE)
                    row_scale[m] = s
                    row_mult[m] = s
            if mode == STAGE_DYNAMIC and tid == 0:
                s = max(total / np.float32(448.0), _format.F32_MIN_SCALE)
                for m in range(m_tile):
                    row_scale[m] = s
                    row_mult[m] = np.float32(_F32_ONE / s)
            cuda.syncthreads()

        # -- streaming: bit-placed decode, float32 FMA; the next step's loads after each step -----
        divide = mode == STAGE_PER_TOKEN
        while c < k16:
            for m in range(m_tile):
                if m < m_total:
                    if mode == STAGE_CODES:
                        qw[0], qw[1], qw[2], qw[3] = load16(a, m, 16 * c)
                    else:
                        load_x16(x, x_kind, m, c, vals)
                        mult = static_mult if mode == STAGE_STATIC else row_mult[m]
                        for i in range(4):
                            qw[i] = encode4(vals, i, mult, divide)
                    for i in range(4):
                        x_nan[m] |= nan_bits(qw[i])
                        f0, f1, f2, f3 = dec4(qw[i])  # the e4m3 value times 2^-120, then times 2^60
                        xv[16 * m + 4 * i] = np.float32(np.float32(f0 * _F32_2P120) * _F32_2P60)
                        xv[16 * m + 4 * i + 1] = np.float32(np.float32(f1 * _F32_2P120) * _F32_2P60)
                        xv[16 * m + 4 * i + 2] = np.float32(np.float32(f2 * _F32_2P120) * _F32_2P60)
                        xv[16 * m + 4 * i + 3] = np.float32(np.float32(f3 * _F32_2P120) * _F32_2P60)
                else:
                    for j in range(16):
                        xv[16 * m + j] = _F32_ZERO
            for r in range(rows):
                for q in range(4):
                    w = words[4 * r + q]
                    w_nan[r] |= nan_bits(w)
                    f0, f1, f2, f3 = dec4(w)
                    for m in range(m_tile):
                        s = acc[r * m_tile + m]
                        s += f0 * xv[16 * m + 4 * q]
                        s += f1 * xv[16 * m + 4 * q + 1]
                        s += f2 * xv[16 * m + 4 * q + 2]
                        s += f3 * xv[16 * m + 4 * q + 3]
                        acc[r * m_tile + m] = s
            c += threads
            if c < k16:
                load_rows(b, n_base, n_total, c, words)

        # -- reduction: NaN codes poison their outputs, then warp shuffles and one shared step ----
        for r in range(rows):
            for m in range(m_tile):
                if w_nan[r] != np.uint32(0) or x_nan[m] != np.uint32(0):
                    acc[r * m_tile + m] = _F32_NAN
        for i in range(n_acc):
            v = warp_sum(acc[i], scratch, lane, warp)
            if lane == 0:
                partial[warp * n_acc + i] = v
        cuda.syncthreads()
        if tid < n_acc and n_base + out_r < n_total and out_m < m_total:
            total = _F32_ZERO
            for w in range(warps):
                total += partial[w * n_acc + tid]
            total = np.float32(total * _F32_2P60)  # exact: undo the 2^-60
            if mode == STAGE_DYNAMIC or mode == STAGE_PER_TOKEN:
                sa = row_scale[out_m]
            store(y, out_m, n_base + out_r, finish(total, sa, sb, bias_kind != 0, bias_value), out_kind)

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
def gemv_launcher(m, hardware, out_is_float32, mode, rows=None, threads=GEMV_THREADS, min_blocks=None):
    """The GEMV for M activation rows in activation ``mode``, launched on ceil(N / rows) blocks of
    ``threads``; ``rows`` defaults to gemv_rows(M); ``min_blocks`` (resident per SM; default
    gemv_min_blocks, 0 for none) caps the registers through launch bounds
    (benchmarks/sweep_gemv.py tries the alternatives)."""
    sig = (_u8_2d, _u16_2d, _i32, _f32_1d, _u8_2d, _f32_1d, _i64, _f32_1d, _i64, _u16_1d, _i32,
           _out_type(out_is_float32), _i32)
    if min_blocks is None:
        min_blocks = gemv_min_blocks(m, mode)
    bounds = None if SIMULATOR or not min_blocks else (threads, min_blocks)
    return compile_kernel(gemv_kernel(gemv_m_tile(m), hardware, mode, rows or gemv_rows(m), threads), sig,
                          launch_bounds=bounds)


__all__ = ["epilogue_kernel", "tiled_kernel", "gemv_launcher", "gemv_m_tile", "hardware_path_available",
           "TILE_M", "TILE_N", "TILED_THREADS", "GEMV_THREADS", "gemv_rows", "GEMV_MAX_M", "STAGE_CODES", "STAGE_STATIC", "STAGE_DYNAMIC",
           "STAGE_PER_TOKEN", "X_FLOAT32", "X_FLOAT16", "X_BFLOAT16"]
