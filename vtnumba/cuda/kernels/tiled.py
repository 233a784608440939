"""The tiled GEMM on CUDA cores: any shape, any strides, exact float32 accumulation.

The path of last resort: shapes cuBLASLt and the tensor-core kernels refuse (odd K, unaligned
views), the CUDA simulator, and the lever turned off where nothing faster applies. Each block owns a
64 x 64 output tile; its 256 threads decode 64 x 32 codes of each operand into shared memory per K
step and each accumulate a 4 x 4 block of outputs (strided by 16) with float32 FMAs (a product of
two e4m3 values is exact in float32, so an FMA gives the bits of a multiply then an add). The
epilogue is ``epilogue.py``'s.
"""

import functools

import numpy as np

from ..ptx.codec import decode_e4m3, decode_e8m0
from ..ptx.target import DEVICE_INLINE, cuda, types
from ..runtime.launch import compile_kernel
from .epilogue import F32_1D, I32, I64, U8_2D, U16_1D, epilogue_value, out_type, store_out

TILE_M = 64
TILE_N = 64
TILE_K = 32
TILED_THREADS = 256  # 16 x 16, each thread a 4 x 4 block of outputs, strided by 16
TILED_SHARED_FLOATS = TILE_K * (TILE_M + TILE_N)  # == TILE_M * TILE_N: the output tile fits too


@cuda.jit(**DEVICE_INLINE)
def load_tile(smem, a, b, m0, n0, k0, k_end, tid):
    """Decode the [64, 32] tiles of a and b at (m0 | n0, k0) into shared memory, k-major (the compute
    loop then reads rows of 64 consecutive floats: no bank conflicts); past the matrices or k_end,
    zeros. Consecutive threads take consecutive k: coalesced byte loads."""
    m_total = a.shape[0]
    n_total = b.shape[0]
    for i in range(TILE_M * TILE_K // TILED_THREADS):
        idx = tid + i * TILED_THREADS
        r = idx // TILE_K
        c = idx - r * TILE_K
        k = k0 + c
        va = np.float32(0.0)
        vb = np.float32(0.0)
        if k < k_end:
            if m0 + r < m_total:
                va = decode_e4m3(a[m0 + r, k])
            if n0 + r < n_total:
                vb = decode_e4m3(b[n0 + r, k])
        smem[c * TILE_M + r] = va
        smem[TILE_K * TILE_M + c * TILE_N + r] = vb


@cuda.jit(**DEVICE_INLINE)
def accumulate_tile(smem, acc, tx, ty):
    """acc[i * 4 + j] += the tile's products for output (ty + 16 i, tx + 16 j), float32 FMAs."""
    for kk in range(TILE_K):
        a_row = kk * TILE_M + ty
        b_row = TILE_K * TILE_M + kk * TILE_N + tx
        for i in range(4):
            av = smem[a_row + 16 * i]
            for j in range(4):
                acc[i * 4 + j] += av * smem[b_row + 16 * j]


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
        load_tile(smem, a, b, m0, n0, k0, k_total, tid)
        cuda.syncthreads()
        accumulate_tile(smem, acc, tx, ty)
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


@functools.cache
def tiled_kernel(out_is_float32):
    sig = (U8_2D, U8_2D, F32_1D, I64, F32_1D, I64, U16_1D, I32, out_type(out_is_float32), I32)
    return compile_kernel(_tiled_kernel, sig)


# ------------------------------------------------------------------------------------------------
# block-scaled: y[m, n] = bias[n] + sum_kb (P[m, n, kb] * sa[m, kb]) * sb[n // bn, kb], P the float32
# sum of the exact products inside K-block kb (upstream's Triton block kernel's order); any bn, bk.
# The same tiles as above; each K-block's partial sums get their scales at the block's end.


@cuda.jit(**DEVICE_INLINE)
def _float_scale(scale, i, kb):
    return scale[i, kb]


@cuda.jit(**DEVICE_INLINE)
def _e8m0_scale(scale, i, kb):
    return decode_e8m0(scale[i, kb])  # MX scale bytes: 2^(byte - 127), 0xFF NaN


def _block_body(read_a, read_b):
    """The block-scaled tiled kernel reading its scales through ``read_a`` / ``read_b`` (float32 arrays,
    or E8M0 bytes decoded as they are read)."""

    def _tiled_block_kernel(a, b, scale_a, scale_b, block_n, block_k, bias, bias_kind, y, out_kind):
        m_total, k_total = a.shape
        n_total = b.shape[0]
        smem = cuda.shared.array(TILED_SHARED_FLOATS, types.float32)
        acc = cuda.local.array(16, types.float32)  # sum over finished K-blocks, scaled
        part = cuda.local.array(16, types.float32)  # the current K-block's products
        for i in range(16):
            acc[i] = np.float32(0.0)
        tid = cuda.threadIdx.x
        tx = tid % 16
        ty = tid // 16
        m0 = cuda.blockIdx.y * TILE_M
        n0 = cuda.blockIdx.x * TILE_N
        for kb in range((k_total + block_k - 1) // block_k):
            k_begin = kb * block_k
            k_end = min(k_total, k_begin + block_k)
            for i in range(16):
                part[i] = np.float32(0.0)
            for k0 in range(k_begin, k_end, TILE_K):
                load_tile(smem, a, b, m0, n0, k0, k_end, tid)
                cuda.syncthreads()
                accumulate_tile(smem, part, tx, ty)
                cuda.syncthreads()
            # the block step: (P * sa[m, kb]) * sb[n // bn, kb], added in kb order (rows / columns past
            # the matrix read row / column 0's scale: their results are never stored)
            for i in range(4):
                m = m0 + ty + 16 * i
                sa = read_a(scale_a, m if m < m_total else 0, kb)
                for j in range(4):
                    n = n0 + tx + 16 * j
                    sb = read_b(scale_b, (n if n < n_total else 0) // block_n, kb)
                    acc[i * 4 + j] += np.float32(np.float32(part[i * 4 + j] * sa) * sb)
        for i in range(4):
            for j in range(4):
                smem[(ty + 16 * i) * TILE_N + tx + 16 * j] = acc[i * 4 + j]
        cuda.syncthreads()
        one = np.float32(1.0)
        for idx in range(tid, TILE_M * TILE_N, TILED_THREADS):
            r = idx // TILE_N
            c = idx - r * TILE_N
            m = m0 + r
            n = n0 + c
            if m < m_total and n < n_total:
                store_out(y, m, n, epilogue_value(smem[idx], one, one, bias, bias_kind, n), out_kind)

    return _tiled_block_kernel


_FLOAT_BODY = _block_body(_float_scale, _float_scale)


@functools.cache
def tiled_block_kernel(out_is_float32, e8m0_a=False, e8m0_b=False):
    """The block-scaled tiled kernel; ``e8m0_a`` / ``e8m0_b``: that operand's scales are E8M0 bytes
    (uint8, MXFP8's, DeepSeek's UE8M0 weight blocks), decoded as they are read."""
    f32_2d, u8_2d = types.float32[:, :], types.uint8[:, :]
    sig = (
        U8_2D,
        U8_2D,
        u8_2d if e8m0_a else f32_2d,
        u8_2d if e8m0_b else f32_2d,
        I64,
        I64,
        U16_1D,
        I32,
        out_type(out_is_float32),
        I32,
    )
    body = (
        _FLOAT_BODY
        if not (e8m0_a or e8m0_b)
        else _block_body(_e8m0_scale if e8m0_a else _float_scale, _e8m0_scale if e8m0_b else _float_scale)
    )
    return compile_kernel(body, sig)


__all__ = ["tiled_kernel", "tiled_block_kernel", "TILE_M", "TILE_N", "TILE_K", "TILED_THREADS"]
