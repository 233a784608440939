"""The decode GEMV on Hopper's native FP8 instruction, swapped: the weight rows are ``wgmma``'s M = 64
operand and the few activation rows its N = 8 operand (vLLM's Triton fused MoE swaps A and B the same
way at decode). Sm_90a only; the pass of the routed MoE decode (tc_gemv.py, "the routed GEMVs"), of
the dense decode layer (``dense_wgmma_*``: x quantized in the launch, or codes quantized before) and
of the aligned MoE decode's grouped GEMV (``grouped_wgmma_*``: codes), all three in tc_gemv.py.

Why: the tensor-core GEMV of tc_gemv.py runs ``mma.sync``, which Hopper executes on e4m3 only through
f16 conversions (F2FP, a third of that GEMV's instructions); at one token the routed MoE layer was
bound by them, 3.6-3.9x the time of its weight bytes (benchmarks/RESULTS.md, 2026-12-02 13:27).
``wgmma`` reads the e4m3 codes from shared memory as they are.

Design
------
A block is one warpgroup (128 threads) and owns 64 weight rows: rows n0 .. n0 + 64, or, ``paired``
(gate_up), rows n0 .. n0 + 32 of each half of b, so that SiLU(gate) * up of 32 columns is the
block's own. K advances 128 codes a stage. Each thread ``cp.async``-copies four 16-byte chunks of the
stage's [64, 128] weight tile into a ring of STAGES + 1 128-byte-swizzled tiles (ptx/sm90_wgmma.py's
layout; STAGES - 1 tiles in flight, one computed, one still read by the previous stage's wgmmas). While the first tiles land, the block quantizes its activation
rows (tc_gemv.fused_quantizer, the fused GEMV's own code) straight into the B operand: every stage of
K as one 1024-byte atom of 8 rows. Rows past M are not written: row n of B feeds only column n of the
sums, which is never stored. Per stage: wait for the tile, one block
barrier, refill the slot of the stage two before, four chained m64n8k32 wgmmas into a partial, then
wait for the previous stage's wgmmas (``wgmma.wait_group 1``: this stage's run meanwhile) and
promote that partial into float32 registers (per 128 of K, CUTLASS's and DeepSeek-V3's interval;
with block scales as ``acc += (P * sa[m, kb]) * sb[n // 128, kb]``, upstream's order). Two partials
alternate, two stages a turn of the loop, so the promotions run in K order as before the lag. The epilogue is the
fused GEMV's: ``y = round_out((acc * sa) * sb + bias)``.

Precision: the tensor-core bound (``vtnumba.testing.reference.tensor_core_bound``), as the wgmma GEMM
and cuBLASLt hold, not DESIGN.md's strict G3: the routed decode takes this pass only where the lever
VT_DENSE_CUBLASLT_FP8 lets cuBLASLt run (cuda/experts.py).

Measured on the H200 (benchmarks/gpu/bench_moe.py --parts decode,configs; benchmarks/RESULTS.md,
2026-12-02 17:41-18:20 and 2026-12-03 13:14-13:45): Qwen3-30B-A3B's routed layer at one token 25.1 /
24.3 us eager (per-token / 128 x 128 blocks) against 32.0 / 29.0 on the mma.sync pass, once the
routed passes took a one-row quantizer. Under Nsight Compute about 45% of a block's time is before
the K loop (a 3,000-instruction kernel run once a block: instruction- and constant-cache misses,
the wait for the routed id that the weight address hangs on) and most of the loop's is the wait for
a tile; two warpgroups sharing K (half the serial chain) changed nothing and were taken out, as
were steps of several K blocks a barrier (benchmarks/RESULTS.md says why).

A block runs with one warp a scheduler, so its time follows the instructions each warp issues, one
after another (ncu: one every 4.7 cycles). Hence the lean index arithmetic: the copies' addresses and
row tests made once, ring slots as counters that wrap (not ``i % stages``), no zero-filling of B's
unused rows, and the one-row quantizer reading x once. That took per-token gate_up from 3,352 to
2,408 SASS instructions and the routed gate_up from 10.9-11.1 to 9.7-10.0 us L2-hot (H100,
benchmarks/RESULTS.md 2026-12-06).

Shape rules: up to 8 activation rows, K % 16 == 0 and 16-byte aligned weight rows. No simulator
emulation (wgmma has none): tested on the H200.
"""

import functools
from collections import namedtuple

import numpy as np

from ..ptx import mma as mma_sync
from ..ptx import sm90_wgmma as wgmma
from ..ptx.codec import bits_float32, float32_bits
from ..ptx.target import DEVICE_INLINE, cuda, types
from .epilogue import load_bias, scaled_value, store_out
from .tc_gemm import _F32_ONE, _F32_ZERO, _U32_ZERO, scale_readers

_U32_ONE = np.uint32(1)

WG_THREADS = 128
TILE_ROWS = 64  # the wgmma's M: weight rows a block owns
X_ROWS = 8  # the wgmma's N: activation rows (rows past M unwritten, their sums unused)
BK = wgmma.ROW_BYTES  # codes a stage: one 128-byte swizzled row
TILE_BYTES = TILE_ROWS * BK  # a ring slot
X_STAGE_BYTES = X_ROWS * BK  # the B operand's stage: one swizzle atom
_AMAX_WORDS = WG_THREADS // 32 * X_ROWS  # the per-row maxima of the quantizer's shuffles: a warp's each
_COPY_ROWS = WG_THREADS // (BK // 16)  # rows one pass of the block's 16-byte copies covers: 16
_PASS_WORDS = _COPY_ROWS * BK // 4  # a ring slot's words one such pass fills
_SLOT_WORDS = TILE_BYTES // 4
_SPLIT_WORDS = WG_THREADS * X_ROWS // 2  # a block's sums for split-K: its accumulators, as bits
_DESC_HIGH = np.uint64(wgmma.descriptor_base(0))
_DESC_ADDRESS_MASK = np.uint32(wgmma.DESCRIPTOR_ADDRESS_MASK)
_DESC_K_STEP = np.uint64(wgmma.K_STEP >> 4)  # a k32 slice further: 32 bytes, in the descriptor's address field
_DESC_X_STEP = np.uint64(X_STAGE_BYTES >> 4)  # the B operand's next K block
# (descriptor arithmetic stays in uint64: a Python int times a uint64 is a float64 in Numba, which
# cannot hold a descriptor's 64 bits -- illegal addresses on the H200 when a step was tried that way)

WgGemvConfig = namedtuple("WgGemvConfig", "stages")
WgGemvConfig.__doc__ = """The swapped wgmma GEMV's configuration: STAGES - 1 of its 64 x 128 weight tiles (K
blocks) in flight (a ring of STAGES + 1, ``ring_slots``); one block barrier and one wgmma wait a K
block, the wait for the K block before."""


def columns(paired):
    """Output columns a block owns: 32 of each half when paired, else 64."""
    return TILE_ROWS // 2 if paired else TILE_ROWS


def split_chunks(k, split):
    """K blocks each of ``split`` blocks of a cluster takes (the last may take fewer)."""
    nchunks = -(-k // BK)
    return -(-nchunks // split)


def ring_slots(stages, per_block):
    """The ring's tiles for a block of ``per_block`` K blocks: STAGES - 1 in flight, the one computed
    and the one before it, whose wgmmas are still running while the next are issued (a lag of one K
    block); never more than the block has K blocks."""
    return min(stages + 1, per_block)


def shared_bytes(cfg, k, split=1):
    """Dynamic shared memory of the pass for K split over ``split`` blocks: the 1024-byte alignment
    slack, the ring (``ring_slots``), the B operand (every stage of K) and 8 rows of 1 x 128 group
    scales."""
    nchunks = -(-k // BK)
    return (
        wgmma.SWIZZLE_ATOM_BYTES
        + ring_slots(cfg.stages, split_chunks(k, split)) * TILE_BYTES
        + nchunks * X_STAGE_BYTES
        + 4 * X_ROWS * nchunks
    )


@functools.cache
def wgmma_gemv_pass(cfg, quantize, activation, block_scaled, paired, split=1, share=False):
    """The pass ``gemv(a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y,
    out_kind)`` with tc_gemv.gemv_kernel's arguments (``a`` unused: the activation is always
    quantized here, by ``quantize``: tc_gemv.fused_quantizer's for WG_THREADS threads, the swizzled
    layout and as many rows as the caller's y has, at most X_ROWS (the routed passes: one), in the
    mode ``activation`` names: 'static', 'per_token' or 'per_group'), a
    device function every thread of the block must call: y[:M, tile] for the block's tile
    (blockIdx.x) of b's rows. (tc_gemv passes the quantizer: this module does not import it back.)

    ``split`` > 1: K is split over that many blocks, blockIdx.y 0 .. split - 1, which must be one
    thread block cluster (launch.Kernel's ``cluster`` (1, split, 1)): block r takes K blocks
    r c .. r c + c (c = ``split_chunks``), and block 0 adds the others' sums to its own in rank order
    through the cluster's shared memory before the epilogue (split-K with a fixed order and no
    global workspace; the others store nothing).

    ``share``: the finished values of y's row 0 are also left in the first 64 words of the dynamic
    shared memory (float32 bits, word r for tile row r), after a barrier: the routed gate_up's
    SiLU-and-multiply reads its gate and up values there rather than back from global memory."""
    if activation not in ("static", "dynamic", "per_token", "per_group", "codes"):
        raise ValueError(
            "the swapped wgmma GEMV quantizes static, dynamic, per_token or per_group activations or reads codes, "
            f"got {activation!r}"
        )
    per_token, per_group, codes = activation == "per_token", activation == "per_group", activation == "codes"
    if cfg.stages < 2:
        raise ValueError(f"the ring needs at least 2 stages (one computed, one landing), got {cfg.stages}")
    stages = cfg.stages
    row_scale, kblock_scale = scale_readers(block_scaled)
    mma = wgmma.mma_e4m3(X_ROWS)
    regs = X_ROWS // 2
    wait_all, wait_lag, hold = wgmma.wait(0, regs), wgmma.wait(1, regs), wgmma.hold(regs)
    fence, commit_mma, fence_proxy = wgmma.fence, wgmma.commit, wgmma.fence_proxy_async
    commit_copies = mma_sync.cp_async_commit
    wait_copies = mma_sync.cp_async_wait_group(stages - 2)  # this K block landed, the next stages - 2 may not
    wait_no_copies = mma_sync.cp_async_wait_group(0)
    global_address = mma_sync.global_address
    copy16 = mma_sync.cp_async_16
    finish, store, load_bias_value = scaled_value, store_out, load_bias
    tile_cols = columns(paired)
    if share and split > 1:
        raise ValueError("share needs the whole K in one block (split 1)")
    if split < 1 or (split > 1 and paired):
        raise ValueError(f"split must be 1, or above 1 for an unpaired pass, got {split} (paired={paired})")
    cluster_sync, cluster_load = (wgmma.cluster_sync, wgmma.cluster_load) if split > 1 else (None, None)
    n_fscratch = 1  # (the quantizer's simulator scratch: this pass never runs there)

    @cuda.jit(**DEVICE_INLINE)
    def tile_place(n0, r, n_total):
        """(the row of b, whether it is inside its half) of the block's tile row r (0 .. 64): row
        n0 + r of b, or (paired) row n0 + r % 32 of half r // 32 of b."""
        if paired:
            half = n_total >> 1
            pos = n0 + (r & 31)
            return pos + half * (r >> 5), pos < half
        return n0 + r, n0 + r < n_total

    @cuda.jit(**DEVICE_INLINE)
    def issue_stage(smem, b, word, a0, a1, a2, a3, v0, v1, v2, v3, zero, col, k_ok):
        """cp.async this thread's four chunks of the stage at byte column ``col`` into the ring slot at
        ``word``: tile rows r, r + 16, r + 32, r + 48 from addresses a0 .. a3 (each at this thread's
        chunk of the row); a row outside its half of b (v0 .. v3 false) or a chunk past K (not k_ok)
        zero-filled, reading nothing from the valid address ``zero``. Addresses and row tests are
        the caller's, made once: per stage this is four adds and four copies (the loop's index
        arithmetic was most of its 97 SASS instructions a stage before)."""
        ok = k_ok and v0
        copy16(smem, word, b, a0 + col if ok else zero, 16 if ok else 0)
        ok = k_ok and v1
        copy16(smem, word + _PASS_WORDS, b, a1 + col if ok else zero, 16 if ok else 0)
        ok = k_ok and v2
        copy16(smem, word + 2 * _PASS_WORDS, b, a2 + col if ok else zero, 16 if ok else 0)
        ok = k_ok and v3
        copy16(smem, word + 3 * _PASS_WORDS, b, a3 + col if ok else zero, 16 if ok else 0)

    @cuda.jit(**DEVICE_INLINE)
    def promote(acc, part, sa0, sa1, sb0, sb1):
        """acc += the stage's partial; block scales: (P * sa[m, kb]) * sb[n // 128, kb]."""
        if block_scaled:
            acc[0] += np.float32(part[0] * sa0) * sb0
            acc[1] += np.float32(part[1] * sa1) * sb0
            acc[2] += np.float32(part[2] * sa0) * sb1
            acc[3] += np.float32(part[3] * sa1) * sb1
        else:
            acc[0] += part[0]
            acc[1] += part[1]
            acc[2] += part[2]
            acc[3] += part[3]
        hold(acc)  # the adds happen here, not after the next wgmma (see wgmma.hold)

    @cuda.jit(**DEVICE_INLINE)
    def put(y, total, n, inside, m, m_total, sam, scale_b, sb_step, bias, has_bias, bias_kind, out_kind):
        """Store y[m, n]; return its float32 value (0 where it is not stored)."""
        v = _F32_ZERO
        if inside and m < m_total:
            bv = load_bias_value(bias, bias_kind, n) if has_bias else _F32_ZERO
            v = finish(total, sam, row_scale(scale_b, sb_step, n), has_bias, bv)
            store(y, m, n, v, out_kind)
        return v

    @cuda.jit(**DEVICE_INLINE)
    def copy_codes(a, m_total, k_total, nchunks, base_word, smem, tid):
        """The codes a [M, K] as the B operand (``activation`` 'codes': quantized before, by the
        quantization kernels): 16 codes an item by one ``cp.async``, at the swizzled place the
        quantizer writes them (tc_gemv.fused_quantizer's ``code_word``), zeros past K. Issued before
        the first weight tiles' commit, so K block 0's wait covers them. The rows must be 16-byte
        aligned, as every caller's reason asks (tc_gemm.rows_reason of a): byte loads and shared
        stores took 8-16 loads a thread before the K loop, and doubled the pass's code."""
        segs = np.int64(8 * nchunks)
        items = np.int64(m_total) * segs
        zero = global_address(a, 0, 0)
        item = np.int64(tid)
        while item < items:
            m = item // segs
            sg = item - m * segs
            word = base_word + 256 * (sg >> 3) + 32 * m + 4 * ((sg & 7) ^ m)
            inside = 16 * sg < k_total
            copy16(smem, word, a, global_address(a, m, 16 * sg) if inside else zero, 16 if inside else 0)
            item += WG_THREADS

    @cuda.jit(**DEVICE_INLINE)
    def block_mmas(part, desc_a, desc_b):
        """The K block's four chained k32 wgmmas into ``part`` (the first from zero)."""
        for kk in range(4):
            mma(part, desc_a + _DESC_K_STEP * np.uint64(kk), desc_b + _DESC_K_STEP * np.uint64(kk), kk)

    @cuda.jit(**DEVICE_INLINE)
    def block_scales(gs, gbase, scale_a, scale_b, kb, nchunks, m0, m1, n_lo, n_hi, n_total):
        """(sa0, sa1, sb0, sb1): K block kb's scales for this thread's rows (ones unless block-scaled)."""
        if block_scaled:
            if per_group:
                sa0 = gs[gbase + m0 * nchunks + kb]
                sa1 = gs[gbase + m1 * nchunks + kb]
            else:
                sa0 = kblock_scale(scale_a, m0, kb)
                sa1 = kblock_scale(scale_a, m1, kb)
            sb0 = kblock_scale(scale_b, min(n_lo, n_total - 1) // 128, kb)
            sb1 = kblock_scale(scale_b, min(n_hi, n_total - 1) // 128, kb)
            return sa0, sa1, sb0, sb1
        return _F32_ONE, _F32_ONE, _F32_ONE, _F32_ONE

    @cuda.jit(**DEVICE_INLINE)
    def next_slot(slot, slots):
        """The ring slot after ``slot``, wrapping at ``slots`` (both uint32)."""
        after = np.uint32(slot + _U32_ONE)
        return after if after < slots else _U32_ZERO

    @cuda.jit(**DEVICE_INLINE)
    def k_block(smem, b, part, fill, fill_word, lo, lo2, hi, hi2, v0, v1, v2, v3, col, k_ok, desc_a, desc_b):
        """Start one K block: wait for its tile (this thread's copies, then everyone's, at the barrier,
        which also frees the slot of the K block two before, whose wgmmas every warp has waited for),
        refill that slot with the K block STAGES - 1 ahead when ``fill``, and issue this K block's four
        wgmmas into ``part``, not waited for."""
        wait_copies()  # this thread's copies of the K block have landed
        fence_proxy()  # ... and are visible to the tensor core's reads
        cuda.syncthreads()
        if fill:
            issue_stage(smem, b, fill_word, lo, lo2, hi, hi2, v0, v1, v2, v3, lo, col, k_ok)
        commit_copies()
        fence()
        block_mmas(part, desc_a, desc_b)
        commit_mma()

    def gemv(a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
        n_total, k_total = b.shape
        m_total = y.shape[0]
        nchunks = (k_total + BK - 1) // BK  # K blocks
        # the thread and block indices as unsigned: Numba widens the special registers to signed
        # 64-bit, so every // and % of them was a signed division's shift with its sign fixes
        tid = np.uint32(cuda.threadIdx.x)
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        n0 = np.uint32(cuda.blockIdx.x) * tile_cols
        # this block's K blocks: kc0 .. kc0 + own (all of K unsplit)
        per_block = (nchunks + split - 1) // split
        kc0 = cuda.blockIdx.y * per_block if split > 1 else 0
        own = max(0, min(nchunks - kc0, per_block))
        smem = cuda.shared.array(0, types.uint32)  # dynamic: the ring, x's codes, the group scales
        gs = cuda.shared.array(0, types.float32)  # (the same memory, as float32)
        fscratch = cuda.shared.array(n_fscratch, types.float32)
        amax_rows = cuda.shared.array(_AMAX_WORDS, types.float32)
        row_mult = cuda.shared.array(X_ROWS, types.float32)
        row_deq = cuda.shared.array(X_ROWS, types.float32)
        vals = cuda.local.array(16, types.float32)
        local = cuda.local.array(X_ROWS, types.float32)
        acc = cuda.local.array(regs, types.float32)
        part = cuda.local.array(regs, types.float32)  # a K block's partial (the first of a turn's two)
        part_b = cuda.local.array(regs, types.float32)  # (the second)
        sums = cuda.shared.array(_SPLIT_WORDS if split > 1 else 1, types.uint32)  # split-K: this block's sums
        for i in range(regs):
            acc[i] = _F32_ZERO
            part[i] = _F32_ZERO
            part_b[i] = _F32_ZERO

        # the ring starts at the first 1024-byte boundary of the dynamic shared memory
        base = wgmma.shared_address(smem, 0)
        pad = (wgmma.SWIZZLE_ATOM_BYTES - base % wgmma.SWIZZLE_ATOM_BYTES) % wgmma.SWIZZLE_ATOM_BYTES
        slots = min(stages + 1, per_block)  # ring_slots (a host function: not callable here)
        x_byte = pad + slots * TILE_BYTES
        gbase = (x_byte + nchunks * X_STAGE_BYTES) // 4
        desc0 = np.uint64(((base + pad) >> 4) & _DESC_ADDRESS_MASK) | _DESC_HIGH

        # this thread's copies: tile rows r, r + 16, r + 32, r + 48, chunk j at position j ^ (r % 8)
        r = tid // 8
        j = tid % 8
        k_code = 16 * j
        word0 = (pad + r * BK + 16 * (j ^ (r % 8))) // 4
        lo_row, _ = tile_place(n0, r, n_total)
        hi_row, _ = tile_place(n0, r + 32, n_total)
        # the copies inside their half (of b, or of the whole b unpaired): rows 16 apart
        limit = n_total >> 1 if paired else n_total
        lo_first = n0 + r
        hi_first = lo_first if paired else lo_first + 32
        v0, v1 = lo_first < limit, lo_first + _COPY_ROWS < limit
        v2, v3 = hi_first < limit, hi_first + _COPY_ROWS < limit
        lo = global_address(b, min(lo_row, n_total - 1), k_code)
        hi = global_address(b, min(hi_row, n_total - 1), k_code)
        row_step = _COPY_ROWS * b.strides[0]
        lo2, hi2 = lo + row_step, hi + row_step
        col = kc0 * BK  # the byte column of the next K block to copy
        # x's codes first (``codes``): their copies join the first K block's group, landed at its wait
        x_word = x_byte // 4
        if codes:
            copy_codes(a, m_total, k_total, nchunks, x_word, smem, tid)
        for s in range(stages - 1):  # the first stages - 1 K blocks in flight before anything waits
            if s < own:
                issue_stage(
                    smem, b, word0 + s * _SLOT_WORDS, lo, lo2, hi, hi2, v0, v1, v2, v3, lo, col, col + k_code < k_total
                )
            commit_copies()
            col += BK

        # x quantized into the B operand, its scales, while the tiles land. Rows past M are left as
        # they are: row n of the B operand feeds only column n of the sums, which is never stored.
        if not codes:
            quantize(
                x, x_kind, qscale, m_total, k_total, k_total // 16, nchunks, x_word, gbase, smem, gs, vals, local,
                amax_rows, row_mult, row_deq, fscratch, warp, lane, tid,
            )  # fmt: skip
        fence_proxy()  # this thread's codes, visible to the tensor core after the barrier below

        # this thread's accumulators: tile rows 16 warp + g (acc 0, 1) and + 8 (acc 2, 3), x rows 2 t, 2 t + 1
        n_lo, in_lo = tile_place(n0, 16 * warp + g, n_total)
        n_hi, in_hi = tile_place(n0, 16 * warp + g + 8, n_total)
        m0 = min(2 * t, m_total - 1)
        m1 = min(2 * t + 1, m_total - 1)
        # The K loop, two K blocks a turn into two partials: K block i's wgmmas run while K block
        # i - 1's are waited for and promoted (a lag of one: a wait for the wgmmas just issued left the
        # tensor core's latency in every K block), in K order, so the sums are the unlagged loop's.
        # The partials alternate by position in the turn, not by a branch on them: ptxas serializes
        # every wgmma whose accumulators a branch chooses (advisory C7517). Ring slots are counters
        # that wrap (not i % slots: signed 64-bit remainders were a third of the loop's instructions).
        # The loop's counters are unsigned 32-bit (Numba's would be signed 64-bit: a pair of
        # instructions for each add and compare of them, in every K block)
        u_own, u_slots = np.uint32(own), np.uint32(slots)
        refills = np.uint32(max(own - (stages - 1), 0))  # K block i refills a slot while i < refills
        k_left = np.uint32(max(k_total - k_code, 0))  # this thread's chunk is inside K while col < k_left
        at = np.uint32(col)  # the byte column of the next K block to copy
        read_slot = _U32_ZERO
        fill_slot = np.uint32(min(stages - 1, slots - 1))  # the slot of K block stages - 1 (its first refill)
        desc_b = desc0 + np.uint64((x_byte - pad + kc0 * X_STAGE_BYTES) >> 4)
        # K block 0 into part; then each turn: the next K block into part_b while part's is waited
        # for and promoted, and the one after into part while part_b's is. Each way out of the loop
        # waits for the K block still running in its own branch (its partial known there: a wait
        # after the paths meet would leave ptxas unsure which accumulators are in flight, C7517).
        # The two halves of a turn are written out: k_block returning the ring's state as a tuple,
        # called from one place, scheduled the block-scaled half-turn at 102 SASS instructions, not 74.
        if own > 0:
            k_block(
                smem, b, part, refills > 0, word0 + fill_slot * _SLOT_WORDS, lo, lo2, hi, hi2,
                v0, v1, v2, v3, at, at < k_left, desc0 + np.uint64(read_slot * (TILE_BYTES >> 4)), desc_b,
            )  # fmt: skip
            at = np.uint32(at + BK)
            fill_slot = next_slot(fill_slot, u_slots)
            read_slot = next_slot(read_slot, u_slots)
            desc_b += _DESC_X_STEP
            i = _U32_ZERO  # K block i is running, in part
            while True:  # (no test on entry: ptxas would see a way out with K block 0 running)
                i_b = np.uint32(i + _U32_ONE)
                sa0, sa1, sb0, sb1 = block_scales(
                    gs, gbase, scale_a, scale_b, kc0 + i, nchunks, m0, m1, n_lo, n_hi, n_total
                )
                if i_b >= u_own:  # K block i was the last
                    wait_all(part)
                    promote(acc, part, sa0, sa1, sb0, sb1)
                    break
                k_block(
                    smem, b, part_b, i_b < refills, word0 + fill_slot * _SLOT_WORDS, lo, lo2, hi, hi2,
                    v0, v1, v2, v3, at, at < k_left, desc0 + np.uint64(read_slot * (TILE_BYTES >> 4)), desc_b,
                )  # fmt: skip
                at = np.uint32(at + BK)
                fill_slot = next_slot(fill_slot, u_slots)
                read_slot = next_slot(read_slot, u_slots)
                desc_b += _DESC_X_STEP
                wait_lag(part)  # K block i
                promote(acc, part, sa0, sa1, sb0, sb1)
                i = np.uint32(i_b + _U32_ONE)
                sa0, sa1, sb0, sb1 = block_scales(
                    gs, gbase, scale_a, scale_b, kc0 + i_b, nchunks, m0, m1, n_lo, n_hi, n_total
                )
                if i >= u_own:  # K block i_b was the last
                    wait_all(part_b)
                    promote(acc, part_b, sa0, sa1, sb0, sb1)
                    break
                k_block(
                    smem, b, part, i < refills, word0 + fill_slot * _SLOT_WORDS, lo, lo2, hi, hi2,
                    v0, v1, v2, v3, at, at < k_left, desc0 + np.uint64(read_slot * (TILE_BYTES >> 4)), desc_b,
                )  # fmt: skip
                at = np.uint32(at + BK)
                fill_slot = next_slot(fill_slot, u_slots)
                read_slot = next_slot(read_slot, u_slots)
                desc_b += _DESC_X_STEP
                wait_lag(part_b)  # K block i_b
                promote(acc, part_b, sa0, sa1, sb0, sb1)
        wait_no_copies()
        if split > 1:
            # the cluster's sums meet in block 0, in rank order: each thread's four at the same place
            for q in range(regs):
                sums[regs * tid + q] = float32_bits(acc[q])
            cluster_sync()  # every block's sums written, visible cluster-wide
            if cuda.blockIdx.y == 0:
                for rank in range(1, split):
                    for q in range(regs):
                        acc[q] = acc[q] + bits_float32(cluster_load(sums, regs * tid + q, rank))
            cluster_sync()  # block 0 has read them: the others' shared memory may go
            if cuda.blockIdx.y != 0:
                return

        has_bias = bias_kind != 0
        if codes and not block_scaled:
            sam0, sam1 = scale_a[m0 * sa_step], scale_a[m1 * sa_step]
        elif per_token:
            sam0, sam1 = row_deq[m0], row_deq[m1]
        elif block_scaled:
            sam0 = sam1 = _F32_ONE
        else:
            sam0 = sam1 = row_deq[0]
        v_lo = put(y, acc[0], n_lo, in_lo, 2 * t, m_total, sam0, scale_b, sb_step, bias, has_bias, bias_kind, out_kind)
        put(y, acc[1], n_lo, in_lo, 2 * t + 1, m_total, sam1, scale_b, sb_step, bias, has_bias, bias_kind, out_kind)
        v_hi = put(y, acc[2], n_hi, in_hi, 2 * t, m_total, sam0, scale_b, sb_step, bias, has_bias, bias_kind, out_kind)
        put(y, acc[3], n_hi, in_hi, 2 * t + 1, m_total, sam1, scale_b, sb_step, bias, has_bias, bias_kind, out_kind)
        if share:
            cuda.syncthreads()  # every warp's last reads of the ring and the group scales are done
            if t == 0:  # the threads holding row 0: tile rows 16 warp + g and + 8
                smem[16 * warp + g] = float32_bits(v_lo)
                smem[16 * warp + g + 8] = float32_bits(v_hi)

    return gemv


__all__ = [
    "WgGemvConfig",
    "WG_THREADS",
    "TILE_ROWS",
    "columns",
    "ring_slots",
    "shared_bytes",
    "split_chunks",
    "wgmma_gemv_pass",
]
