"""The decode GEMV on tensor cores (M = 1..16), from Numba, with the activation's quantization fused.

The weight rows are the A operand (m16) and the activation rows the B operand (n8, zero-padded):
the exact decode arithmetic of the CUDA-core GEMV (gemv.py) moves onto the tensor cores, and the
promotion of each mma's partial into float32 registers keeps the strict G3 bound. The mma's k order
is permuted so each lane's 16 contiguous weight bytes feed two mmas straight from registers (no
shared memory for the weight); a ring of 2 chunks (128 K each) is in flight per warp; warps split K,
their sums meet in shared memory in a fixed order. Fused modes quantize x into shared memory first
(static, dynamic, per-token, 1 x 128 groups: codec.py's encoders), then read it per chunk; x too
large for one launch runs in row slices, or is quantized once and the codes GEMV runs. Block scales
(128 x 128 weights, 1 x 128 activation groups) are applied per 128-wide K block, upstream's order.
The grouped mode (``grouped_gemv``: mixture of experts at decode) runs E experts' GEMVs in one
launch, each block reading its expert's row range from the device.

What limits speed (measured on the H200, benchmarks/gpu/bench_tensorcore.py, 2026-11-30): 7.0 / 8.7 /
40.3 / 21.3 us at M = 1 on 4096^2 / 6144x4096 / 28672x4096 / 4096x14336 (cuBLASLt 6.3 / 8.5 / 31.1 /
19.9; the CUDA-core GEMV 8.9 / 12.0 / 46.4 / 24.8; the weight at the device copy rate 4.0 / 6.0 /
27.9 / 13.9). FP8 mma.sync is not native on Hopper (tc_gemm.py): its e4m3 -> f16 conversions, 48
F2FP per warp and 2 KB chunk (a third of them for the mostly-zero activation tile), plus ~130 other
instructions, keep the multiprocessors about half busy at the memory rate; a 4-deep ring was slower
(181 registers: 2 blocks a multiprocessor instead of 4). M = 16 (two activation tiles) is
0.55-0.63x cuBLASLt. The fused static FP8 layer at M = 1 (bf16 x, one launch) is 1.22 / 1.61 / 1.43
/ 1.29x torch's bf16 matmul.
"""

import functools
from collections import namedtuple

import numpy as np

from ..ptx import codec, mma
from ..ptx.codec import bits_float32, fill
from ..ptx.target import DEVICE_INLINE, SIMULATOR, cuda, types
from ..ptx.views import block_of, rows_of
from ..runtime import device
from ..runtime.launch import compile_kernel
from . import sm120_block_scaled as sm120
from .epilogue import (
    F32_1D,
    I32,
    I64,
    OUT_KIND,
    U8_2D,
    U16_1D,
    U16_2D,
    bias_bits,
    empty_out,
    load_bias,
    out_type,
    scale_vector,
    scaled_value,
    store_out,
)
from .gemv import X_KIND, GemvStage, x_loader
from .tc_gemm import (
    _ALIGN_16,
    _F32_ONE,
    _F32_ZERO,
    _U32_ZERO,
    chains_in_float32,
    rows_reason,
    scale_readers,
    shape_reason,
    unavailable_reason,
)

_DEVICE = DEVICE_INLINE

# ------------------------------------------------------------------------------------------------
# the decode GEMV (M = 1..16): the weight rows are the A operand (m16), the activation rows the B
# operand (n8, zero-padded past M; two n8 tiles above M = 8).
#
# A block owns 16 * rt weight rows; its warps split K in 128-wide chunks (warp w takes chunks w,
# w + warps, ...). Lane 4 g + t loads 16 bytes of weight rows g and g + 8 of each m16 tile at
# 128 c + 64 s + 16 t (s = 0, 1): four 128-bit loads a tile. The mma's k order is permuted (A
# register 2 h of segment s holds bytes 8 h .. 8 h + 3 of the lane's 16, register 2 h + 1 the next
# four), identically for A and B, so each lane's 16 contiguous bytes feed two mmas and the weight
# needs no shared memory. The loads of ``depth`` chunks are in flight at once: a ring of register
# slots, refilled with chunk c + depth * warps as soon as chunk c is consumed.
#
# The activation lane 4 g + t supplies is row g's 16 codes at the same offsets. Codes in: loaded
# with the weight, in the same ring. Fused quantization: the block first quantizes all of x into
# shared memory (rows padded to whole chunks plus 16 bytes, which spreads the rows over the banks),
# then reads it per chunk; the per-tensor / per-token amax pass, where needed, comes before. The
# first ring of weight loads is issued before any of that, so it overlaps.
#
# The warps' partial sums meet in shared memory in a fixed order; the epilogue is the GEMM's.

GemvConfig = namedtuple("GemvConfig", "rt warps depth")
GEMV_CONFIGS = {
    "r16_w4_d2": GemvConfig(rt=1, warps=4, depth=2),
    "r16_w8_d2": GemvConfig(rt=1, warps=8, depth=2),
    "r16_w4_d4": GemvConfig(rt=1, warps=4, depth=4),
    "r32_w4_d2": GemvConfig(rt=2, warps=4, depth=2),
    "sim_r16_w2_d2": GemvConfig(rt=1, warps=2, depth=2),
    "sim_r32_w2_d2": GemvConfig(rt=2, warps=2, depth=2),
}
# By the H200 (benchmarks/gpu/bench_tensorcore.py, table 4b, M = 1): 4 warps with 2 chunks in flight
# each was the fastest at K = 4096 (7.0 / 8.7 / 39.9 us at N = 4096 / 6144 / 28672); 8 warps at
# K = 14336 (21.1 against 28.1 us: 14 chunks a warp instead of 28). The 4-deep ring took 7.6 /
# 12.4 / 61.0 / 27.6: its 181 registers leave 2 blocks a multiprocessor, not 4.
GEMV_LONG_K = 8192


def gemv_config(m, k):
    """The GEMV configuration for M activation rows and K."""
    if SIMULATOR:
        return GEMV_CONFIGS["sim_r16_w2_d2"]
    return GEMV_CONFIGS["r16_w8_d2" if k >= GEMV_LONG_K else "r16_w4_d2"]


GEMV_MAX_M = 16
CHUNK = 128  # codes of K a warp step covers; also the block scales' K block
FUSED_SHARED_LIMIT = 48 * 1024  # the fused modes stage x's codes in (dynamic) shared memory

# activation modes: the CUDA-core GEMV's four stages and the 1 x 128 group one
MODE_CODES, MODE_STATIC, MODE_DYNAMIC, MODE_PER_TOKEN = (int(s) for s in GemvStage)
MODE_PER_GROUP = 4
_F32_448 = np.float32(448.0)
_F32_GROUP_EPS = np.float32(1e-10)  # upstream per_token_group_quant_fp8's eps
_U32_16 = np.uint32(16)
_FULL_MASK = 0xFFFFFFFF
I32_1D = types.int32[::1]


def fused_shared_bytes(m, k):
    """Dynamic shared memory of the fused GEMV: M rows of padded codes, then M x chunks group scales."""
    nchunks = -(-k // CHUNK)
    return m * (nchunks * CHUNK + 16) + 4 * m * nchunks


if SIMULATOR:

    def _octet_max(v, fscratch, warp, lane):
        """max of v over the eight lanes 8 j .. 8 j + 7 (every thread of the block must call)."""
        fscratch[warp * 32 + lane] = v
        cuda.syncthreads()
        base = warp * 32 + (lane // 8) * 8
        r = fscratch[base]
        for i in range(1, 8):
            r = max(r, fscratch[base + i])
        cuda.syncthreads()
        return r
else:

    def _octet_max(v, fscratch, warp, lane):
        v = max(v, cuda.shfl_xor_sync(_FULL_MASK, v, 1))
        v = max(v, cuda.shfl_xor_sync(_FULL_MASK, v, 2))
        return max(v, cuda.shfl_xor_sync(_FULL_MASK, v, 4))


_octet_max = cuda.jit(**_DEVICE)(_octet_max)


def _block_max_rows_fn(threads, rows):
    """Per-row maxima over a block: every thread passes ``local`` [rows]; the maxima are left in
    shared[0 .. rows). Every thread must call (it synchronizes the block). On the GPU each warp
    reduces by shuffles and the warps' maxima meet in shared memory (three barriers); the simulator,
    which has no shuffles, halves a shared tree (log2(threads) barriers). A maximum is exact in any
    order, so both give the same bits."""
    warps = threads // 32

    def block_max_rows_tree(local, shared):
        tid = cuda.threadIdx.x
        for r in range(rows):
            shared[tid * rows + r] = local[r]
        cuda.syncthreads()
        step = threads // 2
        while step > 0:
            if tid < step:
                for r in range(rows):
                    shared[tid * rows + r] = max(shared[tid * rows + r], shared[(tid + step) * rows + r])
            cuda.syncthreads()
            step //= 2

    def block_max_rows_shuffle(local, shared):
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        for r in range(rows):
            v = local[r]
            v = max(v, cuda.shfl_xor_sync(_FULL_MASK, v, 16))
            v = max(v, cuda.shfl_xor_sync(_FULL_MASK, v, 8))
            v = max(v, cuda.shfl_xor_sync(_FULL_MASK, v, 4))
            v = max(v, cuda.shfl_xor_sync(_FULL_MASK, v, 2))
            v = max(v, cuda.shfl_xor_sync(_FULL_MASK, v, 1))
            if lane == 0:
                shared[warp * rows + r] = v
        cuda.syncthreads()
        m = _F32_ZERO
        if tid < rows:
            m = shared[tid]
            for w in range(1, warps):
                m = max(m, shared[w * rows + tid])
        cuda.syncthreads()  # every warp's maxima read before row tid's total overwrites them
        if tid < rows:
            shared[tid] = m
        cuda.syncthreads()

    return cuda.jit(**_DEVICE)(block_max_rows_tree if SIMULATOR else block_max_rows_shuffle)


@functools.cache
def fused_quantizer(threads, x_rows, mode, hardware, swizzled=False):
    """``quantize(...)``: the fused GEMVs' quantization of up to ``x_rows`` activation
    rows by a block of ``threads``, in activation ``mode``, with hardware (inline-PTX) or portable
    loads and encoder. The codes go to shared memory row after row (``row_words`` words a row), or,
    ``swizzled``, as the wgmma B operand: 128-code stages of 8 rows, each one 1024-byte atom of
    128-byte rows whose 16-byte chunk j of row m sits at position j ^ m (ptx/sm90_wgmma.py's layout),
    stage c at word ``row_words + 256 c`` (``row_words`` is then the operand's first word)."""
    if swizzled and x_rows > 8:
        raise ValueError(f"the swizzled layout holds one 8-row atom a stage, got {x_rows} rows")
    load_x16 = x_loader(hardware)
    pair = codec.encode_pair("hardware" if hardware else "portable")
    finite_abs = codec.finite_abs
    octet_max = _octet_max
    block_max_rows = _block_max_rows_fn(threads, x_rows)
    one_pass = x_rows == 1 and mode in (MODE_DYNAMIC, MODE_PER_TOKEN)  # (see quantize_rows)
    min_scale = np.float32(1.0) / (np.float32(448.0) * np.float32(512.0))

    @cuda.jit(**_DEVICE)
    def code_word(m, sg, row_words):
        """The shared word of row m's 16 codes of segment sg (16 codes: 4 words)."""
        if swizzled:
            return row_words + 256 * (sg >> 3) + 32 * m + 4 * ((sg & 7) ^ m)
        return m * row_words + 4 * sg

    @cuda.jit(**_DEVICE)
    def encode16(vals, mult, divide, xs, word):
        """xs[word .. word + 4) = codes of vals[0 .. 16) times (or divided by) mult."""
        for q in range(4):
            i = 4 * q
            if divide:
                lo = pair(vals[i] / mult, vals[i + 1] / mult)
                hi = pair(vals[i + 2] / mult, vals[i + 3] / mult)
            else:
                lo = pair(vals[i] * mult, vals[i + 1] * mult)
                hi = pair(vals[i + 2] * mult, vals[i + 3] * mult)
            xs[word + q] = np.uint32(lo) | (np.uint32(hi) << _U32_16)

    # -- fused quantization: the activation's scales, then its codes in shared memory ------------

    @cuda.jit(**_DEVICE)
    def activation_scales(x, x_kind, qscale, m_total, k16, vals, local, amax_rows, row_mult, row_deq, tid):
        """The activation's per-tensor / per-token quantization multiplier (or divisor) and
        dequantization scale, into row_mult / row_deq (a pass over x for its amax where dynamic).
        Every thread must call (it synchronizes the block for the amax)."""
        if mode == MODE_STATIC and tid == 0:
            row_mult[0] = np.float32(_F32_ONE / qscale[0])
            row_deq[0] = qscale[0]
        if mode == MODE_DYNAMIC or mode == MODE_PER_TOKEN:
            for r in range(x_rows):
                local[r] = _F32_ZERO
            for r in range(x_rows):
                if r < m_total:
                    for cc in range(tid, k16, threads):
                        load_x16(x, x_kind, r, cc, vals)
                        for j in range(16):
                            local[r] = max(local[r], finite_abs(vals[j]))
            block_max_rows(local, amax_rows)
            if tid == 0:
                if mode == MODE_DYNAMIC:
                    total = _F32_ZERO
                    for r in range(x_rows):
                        total = max(total, amax_rows[r])
                    s = max(total / _F32_448, min_scale)
                    row_mult[0] = np.float32(_F32_ONE / s)
                    row_deq[0] = s
                else:
                    ub = qscale[0]
                    for r in range(x_rows):
                        am = amax_rows[r]
                        if ub > _F32_ZERO:
                            am = min(am, ub)
                        s = max(am / _F32_448, min_scale)
                        row_mult[r] = s
                        row_deq[r] = s

    @cuda.jit(**_DEVICE)
    def quantize_rows(
        x, x_kind, m_total, k_total, nchunks, row_words, gbase, xs, gs, vals, row_mult, fscratch, warp, lane, tid
    ):
        """x's codes into shared memory (xs, row_words a row), 16 values an item, a group's 8 items
        in 8 lanes; 1 x 128 groups also write their scales (gs). Every thread must call."""
        segs = 8 * nchunks
        items = m_total * segs
        # one row of at most one item a thread (K <= 16 threads): activation_scales' amax pass left
        # this thread's item in vals (its cc is tid), so it is not read again (a second wait on x)
        loaded = one_pass and segs <= threads
        for item0 in range(0, items, threads):
            item = item0 + tid
            valid = item < items
            if x_rows == 1:
                m = 0
            else:
                m = item // segs if valid else 0
            sg = item - m * segs if valid else 0
            if valid and 16 * sg < k_total:
                if not loaded:
                    load_x16(x, x_kind, m, sg, vals)
            else:
                for j in range(16):
                    vals[j] = _F32_ZERO
            if mode == MODE_PER_GROUP:
                # upstream per_token_group_quant_fp8: scale = max(amax, eps) / 448, x / scale
                amax = _F32_ZERO
                for j in range(16):
                    amax = max(amax, finite_abs(vals[j]))
                amax = octet_max(amax, fscratch, warp, lane)
                mult = np.float32(max(amax, _F32_GROUP_EPS) / _F32_448)
                divide = True
                if valid and sg % 8 == 0:
                    gs[gbase + m * nchunks + sg // 8] = mult
            elif mode == MODE_PER_TOKEN:
                mult = row_mult[m]
                divide = True
            else:
                mult = row_mult[0]
                divide = False
            if valid:
                encode16(vals, mult, divide, xs, code_word(m, sg, row_words))

    @cuda.jit(**_DEVICE)
    def quantize(
        x, x_kind, qscale, m_total, k_total, k16, nchunks, row_words, gbase, xs, gs, vals, local, amax_rows,
        row_mult, row_deq, fscratch, warp, lane, tid,
    ):  # fmt: skip
        """The activation's scales, then its codes (``k16`` = K // 16, computed by the caller: inside
        a device function LLVM lost that K >= 0, +3 instructions). Every thread must call."""
        activation_scales(x, x_kind, qscale, m_total, k16, vals, local, amax_rows, row_mult, row_deq, tid)
        cuda.syncthreads()
        quantize_rows(
            x, x_kind, m_total, k_total, nchunks, row_words, gbase, xs, gs, vals, row_mult, fscratch, warp, lane, tid
        )

    return quantize


@cuda.jit(**_DEVICE)
def zero_padding_rows(y, first, col0, width, out_kind):
    """y[first:, col0:col0 + width] (the columns inside y) written as 0 by the block's threads: a grouped
    GEMV's padding rows, past offsets[E], which the active-experts map's last grid row writes."""
    n_total = y.shape[1]
    for i in range(cuda.threadIdx.x, (y.shape[0] - first) * width, cuda.blockDim.x):
        col = col0 + i % width
        if col < n_total:
            store_out(y, first + i // width, col, _F32_ZERO, out_kind)


@functools.cache
def gemv_kernel(nb, cfg, mode, block_scaled, hardware, chain, unit=False, grouped=False, paired=False):
    """The tensor-core decode GEMV for up to 8 * nb activation rows, in activation ``mode``, with
    hardware (inline-PTX) or portable loads and encoder, chaining C through the mma or not (see
    gemm_kernel). ``unit``: the mma is the block-scaled instruction with every scale 2^0 (sm_120a /
    sm_121a, tc_gemm's mma_kind 'unit'): the same D = A B + C at that instruction's rate.
    ``grouped``: the grouped GEMV of E experts (codes in only; see "the grouped GEMV" below): the
    same pass over one expert's rows, 8 * nb at a time, on grid (blocks of N, E). ``paired`` (rt = 2):
    the block's two weight tiles are rows n0 .. n0 + 16 of each half of b (gate and up: the routed
    gate_up's one pass), on ceil(N / 32) blocks; each row's sum is the unpaired kernel's."""
    if paired and cfg.rt != 2:
        raise ValueError(f"a paired GEMV takes one tile in each half of b (rt = 2), got rt = {cfg.rt}")
    if grouped and mode != MODE_CODES:
        raise ValueError(f"the grouped GEMV takes codes (MODE_CODES), got mode {mode}")
    if block_scaled and mode not in (MODE_CODES, MODE_PER_GROUP):
        raise ValueError(f"block-scaled weights take codes or 1 x 128 group activations, got mode {mode}")
    if mode == MODE_PER_GROUP and not block_scaled:
        raise ValueError("1 x 128 group activations need block-scaled weights")
    rt, warps, depth = cfg.rt, cfg.warps, cfg.depth
    threads = 32 * warps
    x_rows = 8 * nb
    n_acc = rt * nb * 4
    fused = mode != MODE_CODES
    n_wslot = 16 * rt  # a lane's weight words per chunk: rt tiles x 2 rows x 2 segments x 4
    n_slot = n_wslot + (0 if fused else 8 * nb)  # codes in: + nb tiles x 2 segments x 4 activation words
    n_ring = depth * n_slot
    n_xw = 8 * nb
    n_red = warps * n_acc * 32
    n_amax = threads * x_rows if mode in (MODE_DYNAMIC, MODE_PER_TOKEN) else 1
    n_fscratch = warps * 32 if SIMULATOR else 1
    n_scratch = sm120.scratch_words(warps, unit)
    # inline PTX (hardware): one 128-bit load for any element type
    load16 = codec.load_row_words if hardware else codec.load_row_words_u8
    mma_op, lds4 = (sm120.mma_e4m3_unit if unit else mma.mma_e4m3), mma.lds_u32x4
    load_bias_value, finish, store = load_bias, scaled_value, store_out

    @cuda.jit(**_DEVICE)
    def tile_row(n0, r, n_total):
        """The first weight row of the block's tile r: 16 r on from n0, or (paired) in half r of b."""
        return n0 + r * (n_total >> 1) if paired else n0 + 16 * r  # (a shift: no zero-division check)

    @cuda.jit(**_DEVICE)
    def load_slot(ring, d, a, b, n0, n_total, m_total, k_total, c, nchunks):
        """Slot d of the ring = this lane's 16-byte pieces of chunk c: the weight rows (zeros past K
        or past the last chunk; rows past N reread row N - 1, their sums are dropped), and with
        codes in, the activation rows (zeros past M)."""
        lane = cuda.threadIdx.x % 32
        g = lane // 4
        t = lane % 4
        base = d * n_slot
        for r in range(rt):
            for h in range(2):
                row = min(tile_row(n0, r, n_total) + 8 * h + g, n_total - 1)
                for s in range(2):
                    col = CHUNK * c + 64 * s + 16 * t
                    ok = c < nchunks and col < k_total
                    w0, w1, w2, w3 = load16(b, row, col if ok else 0)
                    q = base + 4 * ((2 * r + h) * 2 + s)
                    ring[q] = w0 if ok else _U32_ZERO
                    ring[q + 1] = w1 if ok else _U32_ZERO
                    ring[q + 2] = w2 if ok else _U32_ZERO
                    ring[q + 3] = w3 if ok else _U32_ZERO
        if not fused:
            for i in range(nb):
                if grouped and 8 * i >= m_total:
                    continue  # a grouped slice of <= 8 rows: mma_chunk skips this tile too
                row = 8 * i + g
                for s in range(2):
                    col = CHUNK * c + 64 * s + 16 * t
                    ok = row < m_total and c < nchunks and col < k_total
                    w0, w1, w2, w3 = load16(a, min(row, m_total - 1), col if ok else 0)
                    q = base + n_wslot + 8 * i + 4 * s
                    ring[q] = w0 if ok else _U32_ZERO
                    ring[q + 1] = w1 if ok else _U32_ZERO
                    ring[q + 2] = w2 if ok else _U32_ZERO
                    ring[q + 3] = w3 if ok else _U32_ZERO

    row_scale, kblock_scale = scale_readers(block_scaled)
    quantize = fused_quantizer(threads, x_rows, mode, hardware)

    # -- per chunk: the activation words, the mmas, the block scales' promotion ------------------

    @cuda.jit(**_DEVICE)
    def activation_words(xw, ring, xs, base, c, nchunks, m_total, row_words, g, t):
        """This chunk's activation words, xw[4 (2 i + s) + q] for n8 tile i, segment s: from the
        ring slot at ``base`` (codes in), or from x's codes in shared memory (fused; zeros past M)."""
        for i in range(nb):
            if fused:
                row = 8 * i + g
                for s in range(2):
                    if row < m_total and c < nchunks:
                        xw[8 * i + 4 * s], xw[8 * i + 4 * s + 1], xw[8 * i + 4 * s + 2], xw[8 * i + 4 * s + 3] = lds4(
                            xs, row * row_words + 32 * c + 16 * s + 4 * t
                        )
                    else:
                        for q in range(4):
                            xw[8 * i + 4 * s + q] = _U32_ZERO
            else:
                for q in range(8):
                    xw[8 * i + q] = ring[base + n_wslot + 8 * i + q]

    @cuda.jit(**_DEVICE)
    def mma_into(c, q, a0, a1, a2, a3, b0, b1, scratch, warp, lane):
        """c[q .. q + 4) += A B through the mma's own C operand."""
        c[q], c[q + 1], c[q + 2], c[q + 3] = mma_op(
            a0, a1, a2, a3, b0, b1, c[q], c[q + 1], c[q + 2], c[q + 3], scratch, warp, lane
        )

    @cuda.jit(**_DEVICE)
    def mma_added(c, q, a0, a1, a2, a3, b0, b1, scratch, warp, lane):
        """c[q .. q + 4) += A B, the mma from C = 0 and its partial added in float32 (promotion per mma)."""
        d0, d1, d2, d3 = mma_op(a0, a1, a2, a3, b0, b1, _F32_ZERO, _F32_ZERO, _F32_ZERO, _F32_ZERO, scratch, warp, lane)
        c[q] += d0
        c[q + 1] += d1
        c[q + 2] += d2
        c[q + 3] += d3

    @cuda.jit(**_DEVICE)
    def mma_chunk(acc, part, ring, xw, base, m_total, scratch, warp, lane):
        """The chunk's mmas: weight tile r x activation tile i, two per segment, into the K block's
        partial (block scales) or the accumulator, chained through C or promoted per mma."""
        for r in range(rt):
            for i in range(nb):
                if grouped and 8 * i >= m_total:
                    continue  # (an ungrouped launch has nb = 2 only for 9..16 rows)
                q = 4 * (r * nb + i)
                for s in range(2):
                    for hh in range(2):
                        w = base + 4 * (4 * r + s)  # row g's words; row g + 8's are 8 further
                        a0 = ring[w + 2 * hh]
                        a1 = ring[w + 8 + 2 * hh]
                        a2 = ring[w + 2 * hh + 1]
                        a3 = ring[w + 8 + 2 * hh + 1]
                        b0 = xw[8 * i + 4 * s + 2 * hh]
                        b1 = xw[8 * i + 4 * s + 2 * hh + 1]
                        if block_scaled and chain:
                            mma_into(part, q, a0, a1, a2, a3, b0, b1, scratch, warp, lane)
                        elif block_scaled:
                            mma_added(part, q, a0, a1, a2, a3, b0, b1, scratch, warp, lane)
                        elif chain:
                            mma_into(acc, q, a0, a1, a2, a3, b0, b1, scratch, warp, lane)
                        else:
                            mma_added(acc, q, a0, a1, a2, a3, b0, b1, scratch, warp, lane)

    @cuda.jit(**_DEVICE)
    def promote(acc, part, scale_a, scale_b, gs, gbase, c, nchunks, m_total, n0, n_total, g, t):
        """The chunk is the K block: acc += (P * sa[m, kb]) * sb[n // 128, kb], then P = 0."""
        kb = min(c, nchunks - 1)
        for i in range(nb):
            if grouped and 8 * i >= m_total:
                continue
            m0 = min(8 * i + 2 * t, m_total - 1)
            m1 = min(8 * i + 2 * t + 1, m_total - 1)
            if mode == MODE_PER_GROUP:
                sa0 = gs[gbase + m0 * nchunks + kb]
                sa1 = gs[gbase + m1 * nchunks + kb]
            else:
                sa0 = kblock_scale(scale_a, m0, kb)
                sa1 = kblock_scale(scale_a, m1, kb)
            for r in range(rt):
                sbv = kblock_scale(scale_b, min(tile_row(n0, r, n_total) + g, n_total - 1) // 128, kb)
                q = 4 * (r * nb + i)
                acc[q] += np.float32(part[q] * sa0) * sbv
                acc[q + 1] += np.float32(part[q + 1] * sa1) * sbv
                acc[q + 2] += np.float32(part[q + 2] * sa0) * sbv
                acc[q + 3] += np.float32(part[q + 3] * sa1) * sbv
                for e in range(4):
                    part[q + e] = _F32_ZERO

    # -- the epilogue ------------------------------------------------------------------------------

    @cuda.jit(**_DEVICE)
    def reduce_and_store(
        acc,
        red,
        y,
        scale_a,
        sa_step,
        scale_b,
        sb_step,
        bias,
        bias_kind,
        out_kind,
        row_deq,
        n0,
        n_total,
        m_total,
        warp,
        lane,
        tid,
    ):
        """The warps' partial sums, added in warp order through shared memory; then y =
        round_out((sum * sa) * sb + bias). Every thread must call."""
        for i in range(n_acc):
            red[(warp * n_acc + i) * 32 + lane] = acc[i]
        cuda.syncthreads()
        has_bias = bias_kind != 0
        for idx in range(tid, n_acc * 32, threads):
            i = idx // 32
            ln = idx % 32
            total = red[idx]
            for w in range(1, warps):
                total += red[(w * n_acc + i) * 32 + ln]
            e = i % 4
            ti = (i // 4) % nb
            r = i // (4 * nb)
            n = tile_row(n0, r, n_total) + ln // 4 + 8 * (e // 2)
            m = 8 * ti + 2 * (ln % 4) + e % 2
            if n < n_total and m < m_total:
                if mode == MODE_CODES:
                    sam = row_scale(scale_a, sa_step, m)
                elif mode == MODE_PER_TOKEN:
                    sam = row_deq[m]
                elif fused and not block_scaled:
                    sam = row_deq[0]
                else:
                    sam = _F32_ONE
                sbn = row_scale(scale_b, sb_step, n)
                bv = load_bias_value(bias, bias_kind, n) if has_bias else _F32_ZERO
                store(y, m, n, finish(total, sam, sbn, has_bias, bv), out_kind)

    def gemv(a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
        """y[:M] = round_out(scaled (a or quantize(x)) @ b^T + bias); the arguments of
        gemm_kernels' GEMV (scale_a / scale_b [M, KB] / [NB, KB] when block-scaled). The kernel, or
        the grouped kernel's pass (a device function: every thread must call)."""
        n_total, k_total = b.shape
        m_total = y.shape[0]
        nchunks = (k_total + CHUNK - 1) // CHUNK
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        t = lane % 4
        n0 = cuda.blockIdx.x * 16 * (1 if paired else rt)
        scratch = cuda.shared.array(n_scratch, types.uint32)
        fscratch = cuda.shared.array(n_fscratch, types.float32)
        red = cuda.shared.array(n_red, types.float32)
        amax_rows = cuda.shared.array(n_amax, types.float32)
        row_mult = cuda.shared.array(16, types.float32)  # per-tensor / per-token: multiplier or divisor
        row_deq = cuda.shared.array(16, types.float32)  # and the dequantization scale
        # fused: x's codes, row_words a row, then the group scales (16-byte loads: aligned)
        xs = cuda.shared.array(0, types.uint32, alignment=_ALIGN_16)
        gs = cuda.shared.array(0, types.float32, alignment=_ALIGN_16)
        ring = cuda.local.array(n_ring, types.uint32)
        xw = cuda.local.array(n_xw, types.uint32)
        vals = cuda.local.array(16, types.float32)
        local = cuda.local.array(x_rows, types.float32)
        acc = cuda.local.array(n_acc, types.float32)
        part = cuda.local.array(n_acc, types.float32)
        fill(acc, _F32_ZERO)
        fill(part, _F32_ZERO)

        # load: the first ring of weight loads goes out before anything waits
        for d in range(depth):
            load_slot(ring, d, a, b, n0, n_total, m_total, k_total, warp + d * warps, nchunks)

        row_words = (nchunks * CHUNK + 16) // 4
        gbase = m_total * row_words
        if fused:
            quantize(
                x, x_kind, qscale, m_total, k_total, k_total // 16, nchunks, row_words, gbase, xs, gs, vals, local,
                amax_rows, row_mult, row_deq, fscratch, warp, lane, tid,
            )  # fmt: skip
            cuda.syncthreads()

        iters = (nchunks + warps - 1) // warps
        for round0 in range(0, iters, depth):
            for d in range(depth):
                it = round0 + d
                if it < iters:  # the same for every warp of the block
                    c = warp + it * warps
                    base = d * n_slot
                    activation_words(xw, ring, xs, base, c, nchunks, m_total, row_words, g, t)
                    mma_chunk(acc, part, ring, xw, base, m_total, scratch, warp, lane)
                    if block_scaled:
                        promote(acc, part, scale_a, scale_b, gs, gbase, c, nchunks, m_total, n0, n_total, g, t)
                    # load: refill this slot with the chunk depth steps ahead
                    load_slot(ring, d, a, b, n0, n_total, m_total, k_total, c + depth * warps, nchunks)

        reduce_and_store(
            acc,
            red,
            y,
            scale_a,
            sa_step,
            scale_b,
            sb_step,
            bias,
            bias_kind,
            out_kind,
            row_deq,
            n0,
            n_total,
            m_total,
            warp,
            lane,
            tid,
        )

    if not grouped:
        return gemv

    # -- the grouped GEMV: block (i, e) runs the pass on expert e's rows, as views ----------------
    # The views make the pass the ungrouped one: an expert's rows give the bits tc_gemv gives for
    # them alone with the same configuration.
    gemv_pass = cuda.jit(**_DEVICE)(gemv)

    def gemv_grouped(
        a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind, offsets, active
    ):
        """y[offsets[e]:offsets[e + 1]] of expert e = active[blockIdx.y] (-1: no expert, the block
        returns): b [E * N, K] holds the experts' weights one after another, scale_b is per expert
        ([E], sb_step 0) or per channel ([E * N], sb_step 1), or the block scales [E * NB, KB]; rows
        past offsets[E] are neither read nor written."""
        e = active[cuda.blockIdx.y]
        if e < 0:
            return
        n_total = y.shape[1]
        experts = offsets.shape[0] - 1
        if e == experts:  # the map's last row: the padding rows (offsets[E] ..) written as 0 here, not by a memset
            zero_padding_rows(y, offsets[experts], cuda.blockIdx.x * (16 * rt), 16 * rt, out_kind)
            return
        row0 = offsets[e]
        rows = offsets[e + 1] - row0
        if rows <= 0:
            return  # the whole block at once: no barrier is left waiting
        w0 = e * n_total
        we = b[w0 : w0 + n_total]
        # the views are taken here: a CUDA device function cannot return a view of an argument
        if block_scaled:
            blocks = (n_total + 127) // 128  # the weight's 128-row blocks
            sb0, sb1 = e * blocks, (e + 1) * blocks
        else:
            sb0, sb1 = (e * n_total if sb_step else e), scale_b.shape[0]
        sbe = scale_b[sb0:sb1]
        for s0 in range(0, rows, x_rows):
            if s0 > 0:
                cuda.syncthreads()  # the previous slice's sums are still being read from shared memory
            r0 = row0 + s0
            r1 = row0 + min(rows, s0 + x_rows)
            if block_scaled:
                sa0, sa1 = r0, r1
            else:
                sa0, sa1 = r0 * sa_step, scale_a.shape[0]
            gemv_pass(
                a[r0:r1],
                x,
                x_kind,
                qscale,
                we,
                scale_a[sa0:sa1],
                sa_step,
                sbe,
                sb_step,
                bias,
                bias_kind,
                y[r0:r1],
                out_kind,
            )

    return gemv_grouped


# The grouped kernel's loop over passes keeps more registers live than the ungrouped kernel (ptxas,
# sm_90, r16_w4_d2: 138-146 against 110-112 at 8 rows, 178-234 against 149-154 at 16), a block less a
# multiprocessor, and the ungrouped kernel lost a third of its speed to that (the 4-deep ring, module
# docstring). Capped at these counts by launch bounds (rt = 1, depth 2: the configurations whose
# ungrouped kernels fit), ptxas spills 8 bytes (codes) to 52 (block scales) at 8 rows and 40-48 at
# 16, and the occupancy is the ungrouped kernel's. Not yet measured against the uncapped kernel
# (bench_grouped_tc.py --configs times both).
GROUPED_REGISTER_CAP = {1: 128, 2: 168}  # by nb
_REGISTERS_PER_SM = 65536


def _grouped_launch_bounds(nb, cfg, bounded):
    if not bounded or cfg.rt != 1 or cfg.depth != 2:
        return None
    threads = 32 * cfg.warps
    blocks = _REGISTERS_PER_SM // (threads * GROUPED_REGISTER_CAP[nb])
    return (threads, blocks) if blocks > 1 else None


@functools.cache
def gemv_launcher(m, cfg, mode, block_scaled, hardware, chain, out_is_float32, unit=False, grouped=False, bounded=True):
    """The compiled tensor-core GEMV for M activation rows: launch on ceil(N / (16 rt)) blocks of
    32 * warps threads (``unit``: for the arch-specific target, sm_120a / sm_121a, sm120_block_scaled.py). ``grouped``: the
    grouped GEMV, M the rows of one pass (8 or 16), on grid (ceil(N / (16 rt)), E), with the int32
    offsets [E + 1] as a last argument; ``bounded``: with GROUPED_REGISTER_CAP's launch bounds."""
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"m must be in 1..{GEMV_MAX_M} for the tensor-core GEMV, got {m}")
    nb = 1 if m <= 8 else 2
    scale = types.float32[:, :] if block_scaled else F32_1D
    sig = (U8_2D, U16_2D, I32, F32_1D, U8_2D, scale, I64, scale, I64, U16_1D, I32, out_type(out_is_float32), I32)
    if grouped:
        bounds = None if SIMULATOR else _grouped_launch_bounds(nb, cfg, bounded)
        options = {"launch_bounds": bounds} if bounds else {}
        return compile_kernel(
            gemv_kernel(nb, cfg, mode, block_scaled, hardware, chain, unit, True),
            sig + (I32_1D, I32_1D),
            arch=sm120.arch(unit),
            **options,
        )
    return compile_kernel(gemv_kernel(nb, cfg, mode, block_scaled, hardware, chain, unit), sig, arch=sm120.arch(unit))


# Up to this M the dynamic modes quantize inside the GEMV: each block reads all of x for its amax,
# cheap for a few rows (gemm_kernels' GEMV fuses up to 4 the same way), not for 16 long rows.
FUSED_AMAX_MAX_M = 4


def gemv_static_shared_bytes(nb, cfg, mode):
    """The GEMV's static shared memory (the partial sums, the amax rows, the scales), which the
    fused modes' dynamic shared memory must fit beside: a launch asking for more than 48 KB in all
    fails with CUDA_ERROR_INVALID_VALUE (seen on the H200 with 11 rows of K = 4096). None counted
    under the simulator, which has no limit."""
    if SIMULATOR:
        return 0
    threads = 32 * cfg.warps
    red = cfg.warps * cfg.rt * nb * 4 * 32
    amax = threads * 8 * nb if mode in (MODE_DYNAMIC, MODE_PER_TOKEN) else 1
    return 4 * (red + amax + 2 * 16 + 2) + 128  # + 128: the arrays' alignment


def _fused_rows(k, mode, config):
    """How many rows of x one fused launch can stage (at most GEMV_MAX_M; 0 if not one)."""
    for rows in range(GEMV_MAX_M, 0, -1):
        nb = 1 if rows <= 8 else 2
        static = gemv_static_shared_bytes(nb, config or gemv_config(rows, k), mode)
        if fused_shared_bytes(rows, k) + static <= FUSED_SHARED_LIMIT:
            return rows
    return 0


def _max_fused_k(config):
    k = CHUNK
    while _fused_rows(k + CHUNK, MODE_PER_GROUP, config):
        k += CHUNK
    return k


def _fused_slices(
    m, rows, x_bits, x_kind, qscale, b, scale_a, scale_b, sb_step, out_dtype, bias, mode, block_scaled, y_bits, dev
):
    """The fused GEMV's launches over x's rows, ``rows`` at a time (rows are independent in these
    modes): (kernel, grid, block, args, shared bytes) each, writing ``y_bits``."""
    launches = []
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        launches.append(
            gemv_launch(
                r1 - r0,
                dev.placeholder("u8_2d"),
                x_bits[r0:r1],
                x_kind,
                qscale,
                b,
                scale_a,
                0,
                scale_b,
                sb_step,
                out_dtype,
                bias,
                mode,
                block_scaled,
                y_bits[r0:r1],
                dev,
            )
        )
    return launches


# ------------------------------------------------------------------------------------------------
# host side: the GEMV as a kernel of gemm.select / block.select, and the fused decode layer


def _device_flags(dev):
    """(hardware loads and encoder, chain C, the unit-scale block-scaled mma) on device record ``dev``."""
    if SIMULATOR:
        return False, False, False
    return codec.hardware_available(dev.cc), chains_in_float32(dev.cc), sm120.available(dev.cc)


def gemv_launch(
    m,
    a,
    x,
    x_kind,
    qscale,
    b,
    scale_a,
    sa_step,
    scale_b,
    sb_step,
    out_dtype,
    bias,
    mode,
    block_scaled,
    y_bits,
    dev,
    config=None,
):
    """(kernel, grid, block, args, shared bytes) of the GEMV for M activation rows into ``y_bits``."""
    bias_arg, bias_kind = bias_bits(bias, dev)
    hardware, chain, unit = _device_flags(dev)
    cfg = config or gemv_config(m, b.shape[1])
    shared = 0 if mode == MODE_CODES else fused_shared_bytes(m, b.shape[1])
    kernel = gemv_launcher(m, cfg, mode, block_scaled, hardware, chain, np.dtype(out_dtype) == np.float32, unit)
    return (
        kernel,
        -(-b.shape[0] // (16 * cfg.rt)),
        32 * cfg.warps,
        (
            a,
            x,
            x_kind,
            qscale,
            b,
            scale_a,
            sa_step,
            scale_b,
            sb_step,
            bias_arg,
            bias_kind,
            y_bits,
            OUT_KIND[np.dtype(out_dtype)],
        ),
        shared,
    )


def gemv_codes_launch(call, y_bits, block_scaled):
    """(kernel, grid, block, args) of the codes GEMV for a ``gemm.GemmCall`` / ``block.BlockCall``."""
    dev = call.device
    sa_step, sb_step = (0, 0) if block_scaled else (call.sa_step, call.sb_step)
    kernel, grid, block, args, _ = gemv_launch(
        call.m,
        call.a,
        dev.placeholder("u16_2d"),
        0,
        dev.placeholder("f32"),
        call.b,
        call.scale_a,
        sa_step,
        call.scale_b,
        sb_step,
        call.out_dtype,
        call.bias,
        MODE_CODES,
        block_scaled,
        y_bits,
        dev,
    )
    return kernel, grid, block, args


def gemv_reason(call, simulate=False):
    """Why the tensor-core GEMV cannot take a call (None when it can)."""
    if call.m > GEMV_MAX_M:
        return f"the tensor-core GEMV takes M <= {GEMV_MAX_M}, got M = {call.m}"
    return unavailable_reason(call.device, simulate) or shape_reason(call)


def fused_linear_reason(x, b, block_scaled=False):
    """Why the quantize + GEMM of x [M, K] by b [N, K] cannot be the fused tensor-core GEMV."""
    dev = device.current()
    m, k = x.shape
    if not 1 <= m <= GEMV_MAX_M:
        return f"the fused tensor-core layer takes 1..{GEMV_MAX_M} rows, got M = {m}"
    if k % 16:
        return f"the tensor-core kernels need K to be a multiple of 16, got K = {k}"
    if block_scaled and _fused_rows(k, MODE_PER_GROUP, None) == 0:
        return f"K must be at most {_max_fused_k(None)} for the fused group-quantized GEMV, got {k}"
    return unavailable_reason(dev) or rows_reason(b, "b")


def fused_rows(k, block_scaled, per_token, dynamic):
    """How many rows of x [., K] one fused launch stages in shared memory (0: not one)."""
    mode = MODE_PER_GROUP if block_scaled else MODE_PER_TOKEN if per_token else MODE_DYNAMIC if dynamic else MODE_STATIC
    return _fused_rows(k, mode, None)


def fusion_reason(m, k, per_token, dynamic):
    """Why a per-tensor or per-channel call's activation x [M, K] cannot be quantized inside the
    GEMV's launch (None when it can): x must fit the launch's shared memory, and a dynamic amax is
    found in the launch for a few rows only (every block reads all of them)."""
    rows = _fused_rows(k, MODE_PER_TOKEN if per_token else MODE_DYNAMIC if dynamic else MODE_STATIC, None)
    if rows == 0:
        return f"a row of K = {k} does not fit the fused GEMV's shared memory"
    if (per_token or dynamic) and m > FUSED_AMAX_MAX_M:
        return f"the fused GEMV finds the amax of at most {FUSED_AMAX_MAX_M} rows in its launch, got M = {m}"
    if dynamic and rows < m:
        return f"a dynamic per-tensor scale needs all {m} rows in one launch, and {rows} fit"
    return None


def fused_mode(block_scaled, per_token, input_scale):
    """The fused launch's activation mode: 1 x 128 groups (block-scaled), per-token, static (an
    input scale) or dynamic per-tensor."""
    if block_scaled:
        return MODE_PER_GROUP
    return MODE_PER_TOKEN if per_token else MODE_STATIC if input_scale is not None else MODE_DYNAMIC


def fused_launches(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias, y_bits, block_scales=None):
    """The launches of one FP8 linear layer at decode with the activation's quantization fused in,
    writing ``y_bits``: [(kernel, grid, block, args, shared bytes)], one per slice of rows that fits
    a launch's shared memory (one at decode); or None where the fusion does not serve (x does not fit
    shared memory at all, or a dynamic amax would make every block read many rows: then x is
    quantized first and the codes GEMV follows, ``fused_linear``); on sm_90, where it serves
    (``dense_wgmma_reason``), the one dense wgmma launch. x [M, K] is C-contiguous and
    16-byte aligned; arguments otherwise as ``vtnumba.ops.fp8_linear`` normalizes them, with
    ``block_scales`` [ceil(N/128), ceil(K/128)] (then scale_b is None) for 1 x 128 group
    activations and the block-scaled GEMM. A bound call (``vtnumba.cuda.bound``) prepares these
    launches once and replays them with new x / y pointers."""
    dev = device.current()
    m, k = x.shape
    n = b.shape[0]
    x_kind = X_KIND[np.dtype(x.dtype)]
    x_bits = x.view(np.uint16)
    wgmma = dense_wgmma_reason(m, k, fused_mode(block_scales is not None, per_token, input_scale), dev, n) is None
    if block_scales is not None:
        if wgmma:
            return [
                dense_wgmma_launch(
                    m, x_bits, x_kind, dev.placeholder("f32"), b, block_scales[:1, :1], block_scales, 0, out_dtype,
                    bias, MODE_PER_GROUP, True, y_bits, dev,
                )
            ]  # fmt: skip
        rows = _fused_rows(k, MODE_PER_GROUP, None)
        return _fused_slices(
            m,
            rows,
            x_bits,
            x_kind,
            dev.placeholder("f32"),
            b,
            block_scales[:1, :1],
            block_scales,
            0,
            out_dtype,
            bias,
            MODE_PER_GROUP,
            True,
            y_bits,
            dev,
        )
    dynamic = input_scale is None and not per_token
    if not wgmma and fusion_reason(m, k, per_token, dynamic) is not None:
        return None
    sb, sb_step = scale_vector(scale_b, n, dev)
    if per_token:
        mode, qscale = MODE_PER_TOKEN, scale_vector(np.float32(0.0) if scale_ub is None else scale_ub, 1, dev)[0]
    elif dynamic:
        mode, qscale = MODE_DYNAMIC, dev.scalar(1.0)
    else:
        mode, qscale = MODE_STATIC, scale_vector(input_scale, 1, dev)[0]
    if wgmma:
        return [
            dense_wgmma_launch(
                m, x_bits, x_kind, qscale, b, dev.placeholder("f32"), sb, sb_step, out_dtype, bias, mode, False, y_bits,
                dev,
            )
        ]  # fmt: skip
    rows = _fused_rows(k, mode, None)
    return _fused_slices(
        m,
        rows,
        x_bits,
        x_kind,
        qscale,
        b,
        dev.placeholder("f32"),
        sb,
        sb_step,
        out_dtype,
        bias,
        mode,
        False,
        y_bits,
        dev,
    )


def fused_linear(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias, quantize, block_scales=None):
    """One FP8 linear layer at decode in ONE launch, arguments as ``vtnumba.ops.fp8_linear``
    normalizes them (callers check ``fused_linear_reason``): the tensor-core GEMV quantizes x [M, K]
    as it reads it (``fused_launches``). Where the fusion does not serve, ``quantize(x)`` ->
    (codes, scale_a) runs first and the codes GEMV follows."""
    dev = device.current()
    m = x.shape[0]
    n = b.shape[0]
    x = device.xp.ascontiguousarray(x)
    if not SIMULATOR and x.data.ptr % 16:
        x = x.copy()
    y, y_bits = empty_out(m, n, out_dtype)
    launches = fused_launches(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias, y_bits, block_scales)
    if launches is None:
        codes, scale_a = quantize(x)
        sa, sa_step = scale_vector(scale_a, m, dev)
        sb, sb_step = scale_vector(scale_b, n, dev)
        launches = [
            gemv_launch(
                m,
                codes,
                dev.placeholder("u16_2d"),
                0,
                dev.placeholder("f32"),
                b,
                sa,
                sa_step,
                sb,
                sb_step,
                out_dtype,
                bias,
                MODE_CODES,
                False,
                y_bits,
                dev,
            )
        ]
    for kernel, grid, block, args, shared in launches:
        kernel(grid, block, *args, shared_mem=shared)
    return y


# ------------------------------------------------------------------------------------------------
# the grouped GEMV (mixture of experts at decode): E experts' weights, the activation rows sorted by
# expert, the row counts known only on the device
#
# Block (i, e) of grid (ceil(N / (16 rt)), E) reads offsets[e], offsets[e + 1]; an expert with no
# rows costs its blocks that one read and no weight byte. Otherwise the block runs the ungrouped
# pass on views of expert e: its weight rows e N .. e N + N, its activation, output and scale rows
# offsets[e] .. offsets[e + 1], 8 * nb rows a pass. A pass of <= 8 rows in a 16-row kernel (nb = 2)
# skips the second activation tile's loads and mmas, so 1..8 rows cost about what the 8-row kernel
# costs, up to its larger register file (fewer blocks a multiprocessor). More rows than one pass
# take: passes over the same weight rows, each re-read (from L2 when the block's rows are still
# there) and each paying the full mma and conversion cost.

# Above this many rows an expert no longer suits the GEMV (estimate, not measured): past 16 rows the
# kernel streams the expert's weight once per 16 rows, and already at 16 the ungrouped GEMV ran at
# 0.55-0.63x cuBLASLt (module docstring) -- a tiled grouped GEMM (tensor-core tiles of 64-128 rows)
# should win from here on. benchmarks/gpu/bench_grouped_tc.py measures 1 / 8 / 16 rows (and 32, 64).
grouped_rows_hint = GEMV_MAX_M


def _experts_reason(b):
    """Why b [E, N, K] cannot be read as the 2-D [E * N, K] with 16-byte rows (None when it can)."""
    if SIMULATOR:
        return None
    if b.strides[2] != 1 or b.strides[1] % 16 or b.strides[0] != b.shape[1] * b.strides[1] or b.data.ptr % 16:
        return (
            "the grouped tensor-core GEMV reads b [E, N, K] as [E * N, K] 16 bytes at a time: it needs "
            "contiguous K, 16-byte aligned rows and the experts one after another"
        )
    return None


def _f32_reason(arr, name, shapes):
    if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
        return f"the grouped tensor-core GEMV takes {name} as a float32 device array, got {type(arr).__name__}"
    if np.dtype(arr.dtype) == np.uint8:
        return (
            f"the grouped tensor-core GEMV takes float32 scales: E8M0 (uint8) {name} is not supported "
            "(decode it to float32, or run the grouped GEMM of another kernel)"
        )
    if np.dtype(arr.dtype) != np.float32:
        return f"the grouped tensor-core GEMV takes float32 scales, got {name} of {np.dtype(arr.dtype)}"
    if tuple(arr.shape) not in shapes:
        return f"{name} must have shape {' or '.join(map(str, shapes))}, got {tuple(arr.shape)}"
    return None


def grouped_gemv_reason(a, scale_a, b, scale_b, block_size, dev, simulate=False):
    """Why the grouped tensor-core GEMV cannot take a grouped GEMM (None when it can): a uint8 [P, K]
    codes, b uint8 [E, N, K]; scale_a float32 [1] / [P], scale_b float32 [E] / [E, N]; with
    ``block_size`` (128, 128): scale_a float32 [P, ceil(K / 128)], scale_b float32
    [E, ceil(N / 128), ceil(K / 128)]. ``simulate``: under the CUDA simulator, run the emulation."""
    reason = unavailable_reason(dev, simulate)
    if reason:
        return reason
    if len(a.shape) != 2 or len(b.shape) != 3:
        return f"the grouped tensor-core GEMV takes a [P, K] and b [E, N, K], got {tuple(a.shape)} and {tuple(b.shape)}"
    if np.dtype(a.dtype) != np.uint8 or np.dtype(b.dtype) != np.uint8:
        return f"the grouped tensor-core GEMV takes e4m3 codes (uint8), got {np.dtype(a.dtype)} and {np.dtype(b.dtype)}"
    p, k = a.shape
    e, n, kb = b.shape
    if kb != k:
        return f"a's K ({k}) and b's K ({kb}) differ"
    if k == 0 or k % 16:
        return f"the tensor-core kernels need K to be a positive multiple of 16, got K = {k}"
    if block_size is None:
        reason = _f32_reason(scale_a, "scale_a", {(1,), (p,)}) or _f32_reason(scale_b, "scale_b", {(e,), (e, n)})
        if reason is None and any(
            len(s.shape) == 1 and s.shape[0] > 1 and s.strides[0] != 4 for s in (scale_a, scale_b)
        ):
            reason = "the grouped tensor-core GEMV reads contiguous scale vectors"
        if reason is None and len(scale_b.shape) == 2 and not scale_b.flags.c_contiguous:
            reason = "the grouped tensor-core GEMV reads scale_b [E, N] as one contiguous vector"
    else:
        if tuple(block_size) != (128, 128):
            return f"the grouped tensor-core GEMV takes 128 x 128 blocks, got block_size {tuple(block_size)}"
        kblocks, nblocks = -(-k // 128), -(-n // 128)
        reason = _f32_reason(scale_a, "scale_a", {(p, kblocks)}) or _f32_reason(
            scale_b, "scale_b", {(e, nblocks, kblocks)}
        )
        if reason is None and not scale_b.flags.c_contiguous:
            reason = "the grouped tensor-core GEMV reads scale_b [E, NB, KB] as [E * NB, KB]: it must be contiguous"
    return reason or rows_reason(a, "a") or _experts_reason(b)


def grouped_gemv_launch(
    a,
    scale_a,
    b,
    scale_b,
    offsets,
    y_bits,
    out_dtype,
    block_size,
    dev,
    rows_hint=None,
    config=None,
    bounded=True,
    active=None,
):
    """(kernel, grid, block, args) of the grouped GEMV (arguments as ``grouped_gemv``).
    ``active``: int32 [G + 1], the experts each grid row runs (kernels/moe.py's active-experts map:
    -1 for none; the last entry, E, is the row of blocks that writes the padding rows as 0); None:
    every expert, in order (G = E).
    ``rows_hint``: the most rows one expert can have (top-k routing of T tokens: T), None for P;
    at most 8 runs the 8-row kernel (any count stays correct: more rows take more passes).
    ``config``: a GemvConfig (by default gemv_config's); ``bounded``: GROUPED_REGISTER_CAP's launch
    bounds (gemv_launcher)."""
    p, k = a.shape
    e, n, _ = b.shape
    hardware, chain, unit = _device_flags(dev)
    pass_rows = 8 if min(p, p if rows_hint is None else rows_hint) <= 8 else GEMV_MAX_M
    cfg = config or gemv_config(pass_rows, k)
    out_dtype = np.dtype(out_dtype)
    kernel = gemv_launcher(
        pass_rows, cfg, MODE_CODES, block_size is not None, hardware, chain, out_dtype == np.float32, unit, True,
        bounded,
    )  # fmt: skip
    args = grouped_args(a, scale_a, b, scale_b, offsets, y_bits, out_dtype, block_size, dev, active)
    return kernel, (-(-n // (16 * cfg.rt)), int(args[-1].shape[0])), 32 * cfg.warps, args


def grouped_args(a, scale_a, b, scale_b, offsets, y_bits, out_dtype, block_size, dev, active):
    """The arguments of a grouped GEMV launch (the mma.sync one and the swapped wgmma one take the
    same): tc_gemv.gemv_kernel's, codes in (no x, no bias), b as [E * N, K], the weight scales flat per
    expert ([E], [E * N] or the blocks [E * NB, KB]), then the offsets and the active-experts map
    (``identity_map`` where ``active`` is None)."""
    e, n, k = b.shape
    if block_size is not None:
        sa, sa_step, sb, sb_step = scale_a, 0, scale_b.reshape(e * scale_b.shape[1], scale_b.shape[2]), 0
    else:
        sa, sa_step = scale_a, 0 if scale_a.shape[0] == 1 else 1
        sb, sb_step = (scale_b, 0) if len(scale_b.shape) == 1 else (scale_b.reshape(-1), 1)
    return (
        a,
        dev.placeholder("u16_2d"),
        0,
        dev.placeholder("f32"),
        b.reshape(e * n, k),
        sa,
        sa_step,
        sb,
        sb_step,
        dev.placeholder("u16"),
        0,
        y_bits,
        OUT_KIND[np.dtype(out_dtype)],
        offsets,
        identity_map(dev, e) if active is None else active,
    )


_IDENTITY = {}  # (device ordinal, E) -> int32 [0, 1, ..., E - 1, E] on that device


def identity_map(dev, e):
    """The active-experts map that runs every expert in order: int32 [E + 1] (E last), made once per
    device and E, from cupy's own pool (a capture may not allocate). First needed while the stream
    is being captured (the warm-up call took another path: per_expert), it is made by a kernel the
    graph holds, for that call only: a capture may not copy from the host, and a cached array a
    captured kernel fills would hold nothing until the graph first replays."""
    key = (dev.ordinal, e)
    arr = _IDENTITY.get(key)
    if arr is None:
        host = np.arange(e + 1, dtype=np.int32)
        if SIMULATOR:
            arr = host
        else:
            xp = device.xp
            if xp.cuda.runtime.streamIsCapturing(xp.cuda.get_current_stream().ptr):
                return xp.arange(e + 1, dtype=np.int32)
            with xp.cuda.Device(dev.ordinal), xp.cuda.using_allocator(xp.get_default_memory_pool().malloc):
                arr = xp.asarray(host)
        _IDENTITY[key] = arr
    return arr


def grouped_gemv(
    a,
    scale_a,
    b,
    scale_b,
    offsets,
    y_bits,
    out_dtype,
    block_size,
    dev,
    rows_hint=None,
    config=None,
    bounded=True,
    active=None,
):
    """The grouped GEMM y[rows of e] = scaled a[rows of e] @ b[e]^T for every expert e, as
    ``vtnumba.cpu.experts.grouped_scaled_mm`` (callers check ``grouped_gemv_reason``): a uint8
    [P, K] codes sorted by expert, b uint8 [E, N, K], offsets int32 device [E + 1] (expert e's rows
    are offsets[e]:offsets[e + 1]; offsets[E] <= P), y_bits [P, N] the output's bits (float32, or
    uint16 for float16 / bfloat16 ``out_dtype``), C-contiguous. One launch on cupy's current stream:
    nothing synchronizes, nothing is read back (CUDA-graph capturable once warm). Rows past
    offsets[E] (padding) are written as 0."""
    p, k = a.shape
    e, n, _ = b.shape
    if p == 0 or e == 0 or n == 0:
        return
    kernel, grid, block, args = grouped_gemv_launch(
        a, scale_a, b, scale_b, offsets, y_bits, out_dtype, block_size, dev, rows_hint, config, bounded, active
    )
    kernel(grid, block, *args)


# ------------------------------------------------------------------------------------------------
# the routed GEMVs (mixture of experts at decode, with no align step): a routed (token, slot) pair is
# its own group, as vLLM's fused MoE takes it at one token. Block (i, p) of grid (ceil(N / (16 rt)),
# P) runs the FUSED pass (the activation quantized as it is read) for pair p = t k + j on views of
# token t's row and of expert e = ids[p]'s weight, so a pair gives the bits the fused GEMV gives for
# that row and expert alone: the grouped GEMV's arithmetic, the align and quantize launches gone.
#
# - gate_up: the gate rows then the up rows (I apart) in two passes of 16 rows a block, or in one
#   paired pass where the configuration holds 32 (a tile of each half), into a float32 [P, 2I]
#   scratch, then SiLU-and-multiply of the block's own columns into act [P, I] (kernels/moe.py's
#   silu_mul_value, silu_mul's float32 bits: a block reads back its own global writes after a
#   barrier). x is quantized by the gate_up experts' scheme, static scales
#   per expert. Its blocks also zero down's arrival counters.
# - down: one pass per pair on act's row, quantized by the down experts' scheme, into float32
#   y [P, H]; then the combine in a fixed order: each block counts its arrival on its token's
#   counter for its columns (after a fence, so its y is visible device-wide), and the k-th block to
#   arrive sums the token's k rows of those columns in slot order, kernels/moe.py's combine
#   arithmetic (weight times y rounded alone, float32 adds), rounded once to the output dtype: the
#   CPU's combine whichever block arrives last. It reads y by atomics (at L2): a line of y in its
#   L1 may predate another block's write.
#
# A pair whose id is outside [0, E) runs no pass, arrives, and adds nothing. Dynamic per-tensor
# activations are not routed: the scale of act is one amax over every pair's row, which no block of
# a pair sees.

ROUTED_STAGES = ("gate_up", "down")
_COMBINE_BATCH = 8  # the combine's reads of y in flight at once (a token's slots, 8 at a time)


def _routed_wgmma(cfg):
    """Whether ``cfg`` is the swapped wgmma pass's (kernels/sm90_wgmma_gemv.py), not the GEMV's."""
    from .sm90_wgmma_gemv import WgGemvConfig

    return isinstance(cfg, WgGemvConfig)


def _routed_paired(stage, cfg):
    """Whether the routed GEMV of ``stage`` in ``cfg`` is gate_up's one paired pass: 32 rows of the
    GEMV a block, or the wgmma pass (always paired at gate_up)."""
    return stage == "gate_up" and (_routed_wgmma(cfg) or cfg.rt == 2)


def routed_columns(stage, cfg):
    """Output columns a block of the routed GEMV owns: 16 rt, or 16 of each half when paired; the
    wgmma pass's 64, or 32 of each half."""
    if _routed_wgmma(cfg):
        from .sm90_wgmma_gemv import columns

        return columns(_routed_paired(stage, cfg))
    return 16 if _routed_paired(stage, cfg) else 16 * cfg.rt


def _routed_threads(cfg):
    if _routed_wgmma(cfg):
        from .sm90_wgmma_gemv import WG_THREADS

        return WG_THREADS
    return 32 * cfg.warps


@functools.cache
def routed_kernel(stage, cfg, mode, block_scaled, hardware, chain, unit, ids_int64, w_kind=0, out_is_float32=False):
    """The routed GEMV of ``stage`` ('gate_up' or 'down'; block above) in activation ``mode`` (static,
    per-token or 1 x 128 groups), compiled for ids of int64 (else int32); down's combine for routing
    weights of ``w_kind`` (kernels/moe.py's WeightKind) into a float32 (else 16-bit) output."""
    from .moe import mul_rn, routing_weight_fn, silu_mul_scalar, silu_mul_value, weight_type

    if stage not in ROUTED_STAGES:
        raise ValueError(f"stage must be one of {ROUTED_STAGES}, got {stage!r}")
    if mode not in (MODE_STATIC, MODE_PER_TOKEN, MODE_PER_GROUP):
        raise ValueError(f"the routed GEMV quantizes static, per-token or 1 x 128 group activations, got mode {mode}")
    paired = _routed_paired(stage, cfg)
    if _routed_wgmma(cfg):
        from ..ptx import sm90_wgmma
        from .sm90_wgmma_gemv import WG_THREADS, wgmma_gemv_pass

        # a routed pass quantizes one row (its pair's token): the 8-row quantizer's unrolled row
        # loops were 2,000 of per-token gate_up's 5,048 SASS instructions, run once a block and
        # missing the instruction cache (ncu, benchmarks/RESULTS.md 2026-12-03); rows 1-7 of the
        # B operand are not written (they feed only columns 1-7 of the sums, never stored)
        quantize = fused_quantizer(WG_THREADS, 1, mode, hardware, swizzled=True)
        activation = {MODE_STATIC: "static", MODE_PER_TOKEN: "per_token", MODE_PER_GROUP: "per_group"}[mode]
        # gate_up (paired) leaves its gate and up values in shared memory for the SiLU below
        gemv_pass = cuda.jit(**_DEVICE)(
            wgmma_gemv_pass(cfg, quantize, activation, block_scaled, paired, share=stage == "gate_up")
        )
        arch = sm90_wgmma.ARCH
        shared_silu = stage == "gate_up"
    else:
        gemv_pass = cuda.jit(**_DEVICE)(gemv_kernel(1, cfg, mode, block_scaled, hardware, chain, unit, paired=paired))
        arch = sm120.arch(unit)
        shared_silu = False
    width = routed_columns(stage, cfg)
    threads = _routed_threads(cfg)
    if width > threads:  # (every configuration holds it: gate_up's SiLU takes one column a thread)
        raise ValueError(f"a routed block's {width} columns must not exceed its {threads} threads")
    if shared_silu and width != 32:  # the wgmma pass's paired tile: 32 gate rows, then their 32 up rows
        raise ValueError(f"the shared-memory SiLU reads a paired tile of 32 columns a half, got {width}")
    out_f32 = OUT_KIND[np.dtype(np.float32)]
    weight = routing_weight_fn(w_kind)
    store = store_out

    @cuda.jit(**_DEVICE)
    def pair_token(p, k):
        """The token of routed pair p: p // k, both non-negative, as a 32-bit unsigned division
        (a signed 64-bit floor division is a call to a division routine and its sign fixes)."""
        return np.int64(np.uint32(p) // np.uint32(k))

    @cuda.jit(**_DEVICE)
    def expert_pass(a0, x_row, x_kind, qtable, q_step, b, scale_a0, scale_b, sb_step, bias0, y_view, e, r0, rows):
        """The fused pass over expert e's weight rows r0 .. r0 + rows (of the stacked b [E * N, K]).
        Its views are rows_of's, not slices: every window lies inside its array (the launcher's
        checks), so none of a slice's bounds arithmetic is paid before the first weight copy."""
        wv = rows_of(b, r0, rows)
        if block_scaled:
            first = r0 // 128
            sbv = rows_of(scale_b, first, min((r0 + rows + 127) // 128, scale_b.shape[0]) - first)
        elif sb_step:
            sbv = rows_of(scale_b, r0, rows)
        else:
            sbv = rows_of(scale_b, e, 1)
        gemv_pass(
            a0,
            x_row,
            x_kind,
            rows_of(qtable, e * q_step, 1),
            wv,
            scale_a0,
            0,
            sbv,
            sb_step,
            bias0,
            0,
            y_view,
            out_f32,
        )

    if stage == "gate_up":

        def routed_gate_up(
            a0, x, x_kind, qtable, q_step, b, scale_a0, scale_b, sb_step, bias0, hidden, act, ids, k, experts, arrivals
        ):
            """hidden [P, 2I] = this pair's gate and up rows, act [P, I] = silu(gate) * up (float32);
            arrivals zeroed for down."""
            p = cuda.blockIdx.y
            e = ids[p]  # first: every weight address waits for it, the zeroing below does not
            # (a while loop: a range with a step not known at compile time divides for its trip count)
            i = (p * cuda.gridDim.x + cuda.blockIdx.x) * threads + cuda.threadIdx.x
            while i < arrivals.shape[0]:
                arrivals[i] = 0
                i += cuda.gridDim.x * cuda.gridDim.y * threads
            if e < 0 or e >= experts:
                return  # the whole block: no barrier is left waiting
            inter = act.shape[1]
            t = pair_token(p, k)
            x_row = rows_of(x, t, 1)
            rows = 2 * inter if paired else inter  # a pass's weight rows: both halves, or one
            for half in range(1 if paired else 2):
                if half:
                    cuda.syncthreads()  # the gate pass's sums are still being read from shared memory
                expert_pass(
                    a0,
                    x_row,
                    x_kind,
                    qtable,
                    q_step,
                    b,
                    scale_a0,
                    scale_b,
                    sb_step,
                    bias0,
                    rows_of(hidden, p, 1) if paired else block_of(hidden, p, 1, half * rows, rows),
                    e,
                    e * 2 * inter + half * rows,
                    rows,
                )
            cuda.syncthreads()  # the block's gate and up values are in memory, visible to it
            n0 = cuda.blockIdx.x * width
            c = cuda.threadIdx.x
            j = n0 + c  # one column a thread (width <= threads): no range loop's trip count
            if c < width and j < inter:
                if shared_silu:  # the wgmma pass left them in shared memory: gate at tile row c, up at c + 32
                    left = cuda.shared.array(0, types.uint32)
                    act[p, j] = silu_mul_scalar(bits_float32(left[c]), bits_float32(left[c + 32]))
                else:  # read back from global memory: this block's own writes, after the barrier
                    act[p, j] = silu_mul_value(hidden, p, j, inter)

        kernel = routed_gate_up
    else:

        def routed_down(
            a0,
            act_bits,
            x_kind,
            qtable,
            q_step,
            b,
            scale_a0,
            scale_b,
            sb_step,
            bias0,
            y,
            ids,
            k,
            experts,
            w,
            out,
            out_kind,
            arrivals,
        ):
            """y [P, H] = this pair's down GEMV of its act row (float32), then, by the last of token t's
            k blocks of these columns, out[t] = sum_j w[t, j] * y[t k + j] (slot order)."""
            p = cuda.blockIdx.y
            e = ids[p]
            n = y.shape[1]
            if e >= 0 and e < experts:  # (the same for the whole block)
                expert_pass(
                    a0,
                    rows_of(act_bits, p, 1),
                    x_kind,
                    qtable,
                    q_step,
                    b,
                    scale_a0,
                    scale_b,
                    sb_step,
                    bias0,
                    rows_of(y, p, 1),
                    e,
                    e * n,
                    n,
                )
            last = cuda.shared.array(1, types.int32)
            cuda.threadfence()  # this thread's y, visible device-wide before the arrival
            cuda.syncthreads()
            t = pair_token(p, k)
            if cuda.threadIdx.x == 0:
                arrived = cuda.atomic.add(arrivals, t * cuda.gridDim.x + cuda.blockIdx.x, 1)
                last[0] = 1 if arrived == k - 1 else 0
            cuda.syncthreads()
            if last[0] == 0:
                return
            cuda.threadfence()
            n0 = cuda.blockIdx.x * width
            ys = cuda.local.array(_COMBINE_BATCH, types.float32)
            ws = cuda.local.array(_COMBINE_BATCH, types.float32)
            routed = cuda.local.array(_COMBINE_BATCH, types.boolean)
            for c in range(n0 + cuda.threadIdx.x, min(n0 + width, n), threads):
                acc = _F32_ZERO
                for j0 in range(0, k, _COMBINE_BATCH):
                    # a batch's reads first, unconditional (a slot past k rereads the last): issued
                    # back to back, their latencies overlap; a read behind each slot's id test made
                    # them one after another. Then the sums, in slot order.
                    for j in range(_COMBINE_BATCH):
                        q = t * k + min(j0 + j, k - 1)
                        ej = ids[q]
                        routed[j] = j0 + j < k and ej >= 0 and ej < experts
                        ws[j] = weight(w, q)
                        ys[j] = cuda.atomic.add(y, (q, c), _F32_ZERO)
                    for j in range(_COMBINE_BATCH):
                        if routed[j]:
                            acc = np.float32(acc + mul_rn(ws[j], ys[j]))
                store(out, t, c, acc, out_kind)

        kernel = routed_down
    if _routed_wgmma(cfg):  # its own name in a profile, the recorder's counts and the PTX entry
        kernel.__name__ = kernel.__qualname__ = f"{kernel.__name__}_wgmma"
    scale = types.float32[:, ::1] if block_scaled else F32_1D
    ids_type = types.int64[::1] if ids_int64 else I32_1D
    head = (U8_2D, U16_2D, I32, F32_1D, I64, U8_2D, scale, scale, I64, U16_1D)
    f32_2d = types.float32[:, ::1]
    if stage == "gate_up":
        sig = head + (f32_2d, f32_2d, ids_type, I64, I64, I32_1D)
    else:
        sig = head + (f32_2d, ids_type, I64, I64, weight_type(w_kind), out_type(out_is_float32), I32, I32_1D)
    return compile_kernel(kernel, sig, arch=arch)


# The configurations the routed GEMVs are swept over (benchmarks/gpu/bench_moe.py --parts configs):
# the dense GEMV's and two of two warps (short K, as the down projection's 768 = 6 chunks, in fewer,
# fuller warps). Apart from GEMV_CONFIGS, whose every entry the offline compile inventory builds.
ROUTED_GEMV_CONFIGS = dict(
    GEMV_CONFIGS,
    r16_w2_d2=GemvConfig(rt=1, warps=2, depth=2),
    r32_w2_d2=GemvConfig(rt=2, warps=2, depth=2),
)


def _wgmma_configs():
    from .sm90_wgmma_gemv import WgGemvConfig

    return {name: WgGemvConfig(stages=int(name[4:])) for name in ("wg_s2", "wg_s3", "wg_s4", "wg_s6")}


# The swapped wgmma pass's configurations (sm_90, kernels/sm90_wgmma_gemv.py), swept as the GEMV's are.
ROUTED_WGMMA_CONFIGS = _wgmma_configs()


def routed_config(stage, block_scaled, wgmma=False):
    """The routed pass's configuration for ``stage`` with block-scaled weights or not: the GEMV's
    (ROUTED_CONFIGS) or, ``wgmma``, the swapped wgmma pass's (ROUTED_WGMMA_CHOICE)."""
    if wgmma:
        return ROUTED_WGMMA_CONFIGS[ROUTED_WGMMA_CHOICE[stage]]
    if SIMULATOR:
        return GEMV_CONFIGS["sim_r16_w2_d2"]
    return ROUTED_GEMV_CONFIGS[ROUTED_CONFIGS[stage, bool(block_scaled)]]


# By (stage, block-scaled): the GEMV configuration (ROUTED_GEMV_CONFIGS) of each routed launch, from the H200
# sweeps at one token of Qwen3-30B-A3B, weights L2-cold (benchmarks/gpu/bench_moe.py --parts configs;
# benchmarks/RESULTS.md, 2026-12-02 12:46 and 13:11), us per-token / blocks:
# - gate_up (K = 2048): 4 warps of 16 rows, two passes, 25.0 / 16.4 and 21.9 / 16.7; 32 rows in one
#   paired pass (a tile of gate rows with the same tile of up rows) 18.3 per-token (26.1 / 19.8 at
#   12:46 as two 32-row passes); 2 warps 30.9 / 25.1, 8 warps 51.9 / 26.9 (one block a
#   multiprocessor), the 4-deep ring 39.2 / 26.4. The paired pass with block scales (176
#   registers, two blocks a multiprocessor) was not timed: blocks keep 16 rows.
# - down (K = 768: 6 chunks): 2 warps of 16 rows 15.3 / 11.2 and 15.4 / 12.3 against 4 warps 21.6 /
#   13.8 (32 rows 15.9 / 11.6).
ROUTED_CONFIGS = {
    ("gate_up", False): "r32_w4_d2",
    ("gate_up", True): "r16_w4_d2",
    ("down", False): "r16_w2_d2",
    ("down", True): "r16_w2_d2",
}


# By stage: the wgmma pass's ring. gate_up (K = 2048, 16 stages): 3 of 8 KB in flight a block;
# down (K = 768): 6 stages, the whole tile in flight at once (the sweep: benchmarks/RESULTS.md).
ROUTED_WGMMA_CHOICE = {"gate_up": "wg_s4", "down": "wg_s6"}


def routed_shared_bytes(cfg, k):
    """Dynamic shared memory of a routed launch of configuration ``cfg`` over rows of K."""
    if _routed_wgmma(cfg):
        from .sm90_wgmma_gemv import shared_bytes

        return shared_bytes(cfg, k)
    return fused_shared_bytes(1, k)


_DYNAMIC = {}  # (kernel, bytes) -> tc_gemm.DynamicSharedKernel: its opt-in is made once a function


def _with_shared(kernel, nbytes, always=False):
    """``kernel``, or above 48 KB of dynamic shared memory (or ``always``: a launch that carries its
    byte count, as gemm.Launch steps do) the wrapper that opts in to it."""
    from .tc_gemm import SHARED_LIMIT, DynamicSharedKernel

    if nbytes <= SHARED_LIMIT and not always:
        return kernel
    key = (id(kernel), nbytes)
    wrapped = _DYNAMIC.get(key)
    if wrapped is None:
        wrapped = _DYNAMIC.setdefault(key, DynamicSharedKernel(kernel, nbytes))
    return wrapped


def routed_launch(
    stage,
    x_bits,
    x_kind,
    qtable,
    q_step,
    b,
    scale_b,
    sb_step,
    mode,
    block_scaled,
    out,
    ids,
    experts,
    k,
    arrivals,
    dev,
    act=None,
    w=None,
    w_kind=0,
    layer_out=None,
    out_kind=None,
    config=None,
    wgmma=False,
):
    """(kernel, grid, block, args, shared bytes) of the routed GEMV of ``stage`` over ids.size pairs
    (k a token): x_bits [rows, K] the activation's bits (x [T, H] for gate_up, act [P, I] for down),
    qtable the static scales per expert (q_step 1) or a [1] placeholder (q_step 0: per-token takes no
    cap), b [E * N, K] the stacked weights with scale_b [E] (sb_step 0), [E * N] (1) or [E * NB, KB]
    (block-scaled); gate_up: out the float32 [P, 2I] hidden, act [P, I]; down: out the float32
    y [P, H], w the routing weights (flat, of ``w_kind``), layer_out the [T, H] output's bits of
    ``out_kind`` (epilogue.OUT_KIND).
    ``experts`` E (ids outside [0, E) route nothing); ``arrivals`` int32 [T * ceil(H / (16 rt))],
    down's counters (gate_up zeroes them: size them by ``routed_tiles``). ``wgmma``: the swapped
    wgmma pass (sm_90) in its chosen configuration, unless ``config`` names one."""
    hardware, chain, unit = _device_flags(dev)
    kdim = int(b.shape[1])
    cfg = config or routed_config(stage, block_scaled, wgmma)
    pairs = int(ids.shape[0])
    ids_int64 = np.dtype(ids.dtype) == np.int64
    a0 = dev.placeholder("u8_2d")
    sa0 = dev.placeholder("f32_2d" if block_scaled else "f32")
    head = (a0, x_bits, x_kind, qtable, q_step, b, sa0, scale_b, sb_step, dev.placeholder("u16"))
    if stage == "gate_up":
        kernel = routed_kernel(stage, cfg, mode, block_scaled, hardware, chain, unit, ids_int64)
        n = int(act.shape[1])
        args = head + (out, act, ids, k, experts, arrivals)
    else:
        out_is_float32 = out_kind == OUT_KIND[np.dtype(np.float32)]
        kernel = routed_kernel(
            stage, cfg, mode, block_scaled, hardware, chain, unit, ids_int64, int(w_kind), out_is_float32
        )
        n = int(out.shape[1])
        args = head + (out, ids, k, experts, w, layer_out, out_kind, arrivals)
    shared = routed_shared_bytes(cfg, kdim)
    grid = (-(-n // routed_columns(stage, cfg)), pairs)
    return _with_shared(kernel, shared), grid, _routed_threads(cfg), args, shared


def routed_tiles(h, block_scaled):
    """The arrival counters a token needs for H output columns: down's column tiles in the narrowest
    of its configurations (the GEMV's or the wgmma pass's: whichever runs, gate_up zeroed enough)."""
    widths = [routed_columns("down", routed_config("down", block_scaled))]
    widths += [routed_columns("down", cfg) for cfg in ROUTED_WGMMA_CONFIGS.values()]
    return -(-h // min(widths))


# ------------------------------------------------------------------------------------------------
# the dense decode layer on the swapped wgmma pass (sm_90): kernels/sm90_wgmma_gemv.py's pass over
# a whole weight, x's 1..8 rows quantized in the launch, K split over a thread block cluster
#
# Why: at decode an attention projection of Qwen3-30B-A3B (N = 512..4096 rows, K = 2048..4096) is
# 64 tiles of 64 rows or fewer: one block a tile would leave most of the H200's 132 multiprocessors
# idle, each block streaming 128-256 KB alone. Split over S blocks along K, a tile's blocks form one
# cluster and meet in its first block's shared memory, in rank order (no workspace, no counter, one
# launch, the same bytes every run). The mma.sync GEMV (above) converts every e4m3 code to f16
# first on Hopper; this pass reads them natively. It holds the tensor-core bound, not strict G3, so
# it runs where the lever VT_DENSE_CUBLASLT_FP8 lets cuBLASLt run, as the routed wgmma pass does.

DENSE_WGMMA_MAX_M = 8  # the pass's N side: one 8-row activation atom
DENSE_WGMMA_MAX_SPLIT = 8  # the portable cluster size
DENSE_WGMMA_STAGES = 5  # the ring's most stages (no deeper than a block's K blocks + 1)
DENSE_WGMMA_KERNEL = "dense_gemv_wgmma"
_DENSE_MODES = {
    MODE_STATIC: "static",
    MODE_DYNAMIC: "dynamic",
    MODE_PER_TOKEN: "per_token",
    MODE_PER_GROUP: "per_group",
    MODE_CODES: "codes",
}


def dense_wgmma_split(n, k, sms):
    """(split, stages) of the dense wgmma launch for b [N, K] on ``sms`` multiprocessors: K split
    in two while the tiles' blocks still fit one a multiprocessor (at most the portable cluster of
    8, at least one K block each, no block left without one), a ring of 5 stages or as deep as a
    block's K blocks allow. From the H200's sweep at M = 1, per-token, weights L2-cold
    (benchmarks/gpu/bench_dense_wgmma.py --sweep; benchmarks/RESULTS.md, 2026-12-04 ~18:55): the best
    split was 2 / 4 / 4-8 / 2 at 64 / 32 / 8 / 64 tiles (N = 4096 / 2048 / 512 / 4096), 5 stages
    ahead of 3 at every split; twice that many blocks was 5-55% slower."""
    from .sm90_wgmma_gemv import TILE_ROWS, split_chunks

    tiles = -(-n // TILE_ROWS)
    nchunks = -(-k // CHUNK)
    split = 1
    while split < DENSE_WGMMA_MAX_SPLIT and split < nchunks and 2 * tiles * split <= sms:
        split *= 2
    split = min(split, nchunks)
    per_block = split_chunks(k, split)
    split = -(-nchunks // per_block)  # every rank with K blocks
    return split, max(2, min(DENSE_WGMMA_STAGES, per_block + 1))


@functools.cache
def dense_wgmma_kernel(m, split, stages, mode, block_scaled, hardware, out_is_float32):
    """The dense decode layer ``dense_gemv_wgmma`` with tc_gemv.gemv_kernel's arguments for x's M
    rows (1..8) in activation ``mode`` (static, dynamic, per-token, 1 x 128 groups; or MODE_CODES: the codes
    a, quantized before, and their scales), K split over clusters of ``split`` blocks (grid
    (ceil(N / 64), split), 128 threads a block). The codes form accumulates exactly as the fused
    ones, so quantize-then-GEMV gives the fused launch's bytes."""
    from ..ptx import sm90_wgmma
    from .sm90_wgmma_gemv import WG_THREADS, WgGemvConfig, wgmma_gemv_pass

    if not 1 <= m <= DENSE_WGMMA_MAX_M:
        raise ValueError(f"m must be in 1..{DENSE_WGMMA_MAX_M} for the dense wgmma GEMV, got {m}")
    if mode not in _DENSE_MODES:
        raise ValueError(
            f"the dense wgmma GEMV quantizes x (static, dynamic, per-token, 1 x 128 groups) or reads codes, got {mode}"
        )
    # (the codes form calls no quantizer; the static one stands in for its type)
    quantize = fused_quantizer(WG_THREADS, m, MODE_STATIC if mode == MODE_CODES else mode, hardware, swizzled=True)
    gemv_pass = cuda.jit(**_DEVICE)(
        wgmma_gemv_pass(WgGemvConfig(stages=stages), quantize, _DENSE_MODES[mode], block_scaled, False, split)
    )

    def dense_gemv_wgmma(a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
        gemv_pass(a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind)

    scale = types.float32[:, :] if block_scaled else F32_1D
    sig = (U8_2D, U16_2D, I32, F32_1D, U8_2D, scale, I64, scale, I64, U16_1D, I32, out_type(out_is_float32), I32)
    cluster = (1, split, 1) if split > 1 else None
    return compile_kernel(dense_gemv_wgmma, sig, arch=sm90_wgmma.ARCH, cluster=cluster)


# Where the launch is chosen, from the H200 (benchmarks/gpu/bench_dense_wgmma.py; benchmarks/RESULTS.md,
# 2026-12-04 ~19:55), device us a layer, weights L2-cold: at M = 1 per-token 9.6 / 8.2 / 12.0 / 13.3 us
# at N x K = 4096 x 2048, 512 x 2048, 2048 x 4096, 4096 x 4096 against the mma.sync GEMV's 11.6 / 9.6 /
# 14.4 / 16.1 and quantize + cuBLASLt's 12.7 / 10.8 / 13.5 / 14.9 (dynamic 0.89-1.04x, static
# 0.97-1.10x of the better of those); at 28,672 rows (448 tiles, no split) cuBLASLt's 39 us beat its
# 49; at M = 8 the 8-row quantizer made it 1.5-2.5x slower; with 1 x 128 groups the mma.sync block
# GEMV was 1-15% faster. So: one row, per-tensor or per-token scales, weights of at most half as many
# 64-row tiles as the GPU has multiprocessors.
DENSE_WGMMA_CHOSEN_MAX_M = 1


def dense_wgmma_reason(m, k, mode, dev, n=0):
    """Why the fused decode layer of x [M, K] by b [N, K] in activation ``mode`` does not run the
    dense wgmma launch (None when it does; the launch itself takes 1..8 rows and 1 x 128 groups:
    ``dense_wgmma_launch``)."""
    from ... import _config
    from ..ptx import sm90_wgmma
    from .sm90_wgmma_gemv import WgGemvConfig, shared_bytes
    from .tc_gemm import F16_SHARED_LIMIT

    if SIMULATOR or not sm90_wgmma.available(dev.cc):
        return "the dense wgmma GEMV needs sm_90 (wgmma)"
    if DENSE_WGMMA_KERNEL in _config.disabled_kernels():
        return f"{DENSE_WGMMA_KERNEL} is disabled by VT_DISABLE_KERNELS"
    if not _config.dense_cublaslt_fp8_enabled():
        return (
            "it holds the tensor-core bound, not strict G3: turned off with cuBLASLt by the lever VT_DENSE_CUBLASLT_FP8"
        )
    if not 1 <= m <= DENSE_WGMMA_CHOSEN_MAX_M:
        return f"the dense wgmma GEMV is chosen for {DENSE_WGMMA_CHOSEN_MAX_M} row (the fastest there), got M = {m}"
    if mode == MODE_PER_GROUP:
        return "with 1 x 128 group scales the tensor-core block GEMV is as fast (measured)"
    from .sm90_wgmma_gemv import TILE_ROWS

    if 2 * -(-n // TILE_ROWS) > dev.sm_count:
        return f"N = {n} rows fill the GPU without splitting K: cuBLASLt reads a large weight faster (measured)"
    if shared_bytes(WgGemvConfig(stages=2), k, DENSE_WGMMA_MAX_SPLIT) > F16_SHARED_LIMIT:
        return f"a row of K = {k} does not fit the dense wgmma GEMV's shared memory"
    return None


def dense_wgmma_codes_launch(call, y_bits, block_scaled):
    """(kernel, grid, block, args, shared bytes) of the dense wgmma launch's codes form for a
    ``gemm.GemmCall`` / ``block.BlockCall`` (the fused launch's bytes for the same codes)."""
    dev = call.device
    sa_step, sb_step = (0, 0) if block_scaled else (call.sa_step, call.sb_step)
    return dense_wgmma_launch(
        call.m, dev.placeholder("u16_2d"), 0, dev.placeholder("f32"), call.b, call.scale_a, call.scale_b, sb_step,
        call.out_dtype, call.bias, MODE_CODES, block_scaled, y_bits, dev, a=call.a, sa_step=sa_step,
    )  # fmt: skip


def dense_wgmma_launch(
    m,
    x_bits,
    x_kind,
    qscale,
    b,
    scale_a,
    scale_b,
    sb_step,
    out_dtype,
    bias,
    mode,
    block_scaled,
    y_bits,
    dev,
    plan=None,
    a=None,
    sa_step=0,
):
    """(kernel, grid, block, args, shared bytes) of the dense wgmma layer for x's M rows into
    ``y_bits`` (MODE_CODES: of the codes ``a`` with scale_a stepping ``sa_step`` a row); ``plan``
    (split, stages) overrides ``dense_wgmma_split``'s (the benchmark's sweep)."""
    from .sm90_wgmma_gemv import TILE_ROWS, WG_THREADS, WgGemvConfig, shared_bytes

    n, k = b.shape
    split, stages = plan or dense_wgmma_split(n, k, dev.sm_count)
    bias_arg, bias_kind = bias_bits(bias, dev)
    hardware = codec.hardware_available(dev.cc)
    kernel = dense_wgmma_kernel(m, split, stages, mode, block_scaled, hardware, np.dtype(out_dtype) == np.float32)
    shared = shared_bytes(WgGemvConfig(stages=stages), k, split)
    args = (
        dev.placeholder("u8_2d") if a is None else a,
        x_bits,
        x_kind,
        qscale,
        b,
        scale_a,
        sa_step,
        scale_b,
        sb_step,
        bias_arg,
        bias_kind,
        y_bits,
        OUT_KIND[np.dtype(out_dtype)],
    )
    return _with_shared(kernel, shared, always=True), (-(-n // TILE_ROWS), split), WG_THREADS, args, shared


# ------------------------------------------------------------------------------------------------
# the grouped GEMV on the swapped wgmma pass (sm_90): mixture of experts at decode on the aligned
# path (T above the routed decode's reach: 9-64 tokens of top-8 over 128 experts, a few rows an
# expert). Block (i, g) of grid (ceil(N / 64), G) runs kernels/sm90_wgmma_gemv.py's pass on views
# of expert e = active[g]'s 64 weight rows i and its activation rows, 8 rows a pass (wgmma's N),
# the codes copied by cp.async. The same pass as the dense and routed decode: Hopper reads the e4m3
# codes natively, where the mma.sync grouped GEMV above converts each to f16 first. It holds the
# tensor-core bound, so it runs where the lever VT_DENSE_CUBLASLT_FP8 lets cuBLASLt run.

GROUPED_WGMMA_KERNEL = "wgmma_grouped_gemv"
# The ring: 3 weight tiles of 8 KB in flight a block. Depths 3 / 4 / 5 timed alike on an H100 (Qwen3's
# gate_up at 8 rows an expert 144.7 / 148.3 / 144.3 us, down 82.9 / 80.1 / 80.7: within the run's
# noise; benchmarks/RESULTS.md, 2026-12-07 21:11).
GROUPED_WGMMA_STAGES = 4


def grouped_wgmma_stages(k):
    """The ring's stages for rows of K: GROUPED_WGMMA_STAGES, or fewer where a row has fewer K blocks."""
    return max(2, min(GROUPED_WGMMA_STAGES, -(-k // CHUNK) + 1))


@functools.cache
def grouped_wgmma_kernel(stages, block_scaled, hardware, out_is_float32):
    """The grouped GEMV ``grouped_gemv_wgmma`` with the grouped mma.sync GEMV's arguments (codes in;
    offsets and the active-experts map last), launched on grid (ceil(N / 64), G) of 128 threads."""
    from ..ptx import sm90_wgmma
    from .sm90_wgmma_gemv import TILE_ROWS, WG_THREADS, X_ROWS, WgGemvConfig, wgmma_gemv_pass

    # (the codes form calls no quantizer; the static one stands in for its type)
    quantize = fused_quantizer(WG_THREADS, X_ROWS, MODE_STATIC, hardware, swizzled=True)
    gemv_pass = cuda.jit(**_DEVICE)(
        wgmma_gemv_pass(WgGemvConfig(stages=stages), quantize, "codes", block_scaled, False)
    )

    def grouped_gemv_wgmma(
        a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind, offsets, active
    ):
        """y[offsets[e]:offsets[e + 1]] of expert e = active[blockIdx.y] (-1: none, the block returns;
        E: the padding rows past offsets[E], written as 0), b [E * N, K] the experts' weights one
        after another, scale_b [E] (sb_step 0), [E * N] (1) or the block scales [E * NB, KB]."""
        e = active[cuda.blockIdx.y]
        if e < 0:
            return
        n_total = y.shape[1]
        experts = offsets.shape[0] - 1
        if e == experts:  # the padding rows, this block's 64 columns
            zero_padding_rows(y, offsets[experts], cuda.blockIdx.x * TILE_ROWS, TILE_ROWS, out_kind)
            return
        row0 = offsets[e]
        rows = offsets[e + 1] - row0
        if rows <= 0:
            return  # the whole block at once: no barrier is left waiting
        we = rows_of(b, e * n_total, n_total)
        if block_scaled:
            blocks = (n_total + 127) // 128  # the weight's 128-row blocks
            sbe = rows_of(scale_b, e * blocks, blocks)
        elif sb_step:
            sbe = rows_of(scale_b, e * n_total, n_total)
        else:
            sbe = rows_of(scale_b, e, 1)
        for s0 in range(0, rows, X_ROWS):
            if s0 > 0:
                cuda.syncthreads()  # every warp is done with the ring and the codes of the pass before
            r0 = row0 + s0
            count = min(rows - s0, X_ROWS)
            sae = rows_of(scale_a, r0, count) if block_scaled or sa_step else scale_a
            gemv_pass(
                rows_of(a, r0, count),
                x,
                x_kind,
                qscale,
                we,
                sae,
                sa_step,
                sbe,
                sb_step,
                bias,
                bias_kind,
                rows_of(y, r0, count),
                out_kind,
            )

    scale = types.float32[:, :] if block_scaled else F32_1D
    sig = (U8_2D, U16_2D, I32, F32_1D, U8_2D, scale, I64, scale, I64, U16_1D, I32, out_type(out_is_float32), I32)
    return compile_kernel(grouped_gemv_wgmma, sig + (I32_1D, I32_1D), arch=sm90_wgmma.ARCH)


def grouped_wgmma_reason(a, scale_a, b, scale_b, block_size, dev):
    """Why the grouped wgmma GEMV cannot take a grouped GEMM (None when it can): sm_90, the grouped
    mma.sync GEMV's operands (``grouped_gemv_reason``), a row of K in shared memory. (The lever
    VT_DENSE_CUBLASLT_FP8 is the choice's, cuda/grouped.py: a call naming the kernel runs it.)"""
    from ... import _config
    from ..ptx import sm90_wgmma
    from .sm90_wgmma_gemv import WgGemvConfig, shared_bytes
    from .tc_gemm import F16_SHARED_LIMIT

    if SIMULATOR or not sm90_wgmma.available(dev.cc):
        return "the grouped wgmma GEMV needs sm_90 (wgmma)"
    if GROUPED_WGMMA_KERNEL in _config.disabled_kernels():
        return f"{GROUPED_WGMMA_KERNEL} is disabled by VT_DISABLE_KERNELS"
    why = grouped_gemv_reason(a, scale_a, b, scale_b, block_size, dev)
    if why is None:
        k = int(a.shape[1])
        if shared_bytes(WgGemvConfig(stages=grouped_wgmma_stages(k)), k) > F16_SHARED_LIMIT:
            why = f"a row of K = {k} does not fit the grouped wgmma GEMV's shared memory"
    return why


def grouped_wgmma_launch(a, scale_a, b, scale_b, offsets, y_bits, out_dtype, block_size, dev, active=None, stages=None):
    """(kernel, grid, block, args, shared bytes) of the grouped wgmma GEMV (arguments as
    ``grouped_gemv_launch``; ``stages`` overrides ``grouped_wgmma_stages``'s ring, for the sweep)."""
    from .sm90_wgmma_gemv import TILE_ROWS, WG_THREADS, WgGemvConfig, shared_bytes

    k = a.shape[1]
    n = b.shape[1]
    stages = stages or grouped_wgmma_stages(k)
    out_dtype = np.dtype(out_dtype)
    hardware = codec.hardware_available(dev.cc)
    kernel = grouped_wgmma_kernel(stages, block_size is not None, hardware, out_dtype == np.float32)
    args = grouped_args(a, scale_a, b, scale_b, offsets, y_bits, out_dtype, block_size, dev, active)
    shared = shared_bytes(WgGemvConfig(stages=stages), k)
    grid = (-(-n // TILE_ROWS), int(args[-1].shape[0]))
    return _with_shared(kernel, shared, always=True), grid, WG_THREADS, args, shared


__all__ = [
    "GemvConfig",
    "GEMV_CONFIGS",
    "GEMV_MAX_M",
    "CHUNK",
    "gemv_config",
    "gemv_kernel",
    "gemv_launcher",
    "gemv_launch",
    "gemv_codes_launch",
    "gemv_reason",
    "fused_linear",
    "fused_linear_reason",
    "fused_shared_bytes",
    "gemv_static_shared_bytes",
    "MODE_CODES",
    "MODE_STATIC",
    "MODE_DYNAMIC",
    "MODE_PER_TOKEN",
    "MODE_PER_GROUP",
    "fused_launches",
    "fusion_reason",
    "fused_rows",
    "grouped_gemv",
    "grouped_gemv_launch",
    "grouped_gemv_reason",
    "grouped_args",
    "grouped_rows_hint",
    "ROUTED_STAGES",
    "ROUTED_CONFIGS",
    "ROUTED_GEMV_CONFIGS",
    "ROUTED_WGMMA_CONFIGS",
    "ROUTED_WGMMA_CHOICE",
    "routed_config",
    "routed_shared_bytes",
    "routed_columns",
    "routed_kernel",
    "routed_launch",
    "routed_tiles",
    "DENSE_WGMMA_KERNEL",
    "DENSE_WGMMA_MAX_M",
    "dense_wgmma_split",
    "dense_wgmma_kernel",
    "dense_wgmma_launch",
    "dense_wgmma_codes_launch",
    "dense_wgmma_reason",
    "DENSE_WGMMA_CHOSEN_MAX_M",
    "GROUPED_WGMMA_KERNEL",
    "GROUPED_WGMMA_STAGES",
    "grouped_wgmma_kernel",
    "grouped_wgmma_launch",
    "grouped_wgmma_reason",
    "grouped_wgmma_stages",
]
