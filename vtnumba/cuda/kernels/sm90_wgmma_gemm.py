"""The FP8 GEMM on Hopper's native FP8 tensor-core instruction (``wgmma``, ptx/sm90_wgmma.py), from Numba.

It computes DESIGN.md's ``y = round_out((sum_k dec(a) dec(b)) * sa * sb + bias)`` (or the
block-scaled form) with the epilogue of epilogue.py, like tc_gemm.py, at tensor-core speed: tc_gemm's
``mma.sync`` is converted to f16 on sm_90, ``wgmma`` is not.

Design
------
A block computes a 128 x BN tile of y with two warpgroups: warpgroup w owns rows 64 w .. 64 w + 63,
all BN columns (one m64n{BN}k32 wgmma per 32 of K). K advances 128 codes a stage: 16-byte ``cp.async``
copies of the stage's A rows [128, 128] and B rows [BN, 128] fill a STAGES-deep ring of
128-byte-swizzled tiles (sm90_wgmma.py's layout) in dynamic shared memory. Rows past M / N and chunks past
K are zero-filled (zero codes are exact zeros). Two forms (``WgConfig.producer``):

- every thread copies and computes (``gemm_kernel``, the default): per stage, wait for this thread's
  copies, fence them into the async proxy, one block barrier, issue the copies STAGES - 2 stages
  ahead, then the four wgmmas into one of two partials, and promote the previous block's partial
  while they run;
- warp-specialized (``specialized_kernel``): a third warpgroup only copies, and stages change hands
  through mbarriers; each computing warpgroup promotes its partial after its own wgmmas, while the
  other's run.

Promotion: a 128-wide K block's partial P goes into float32 registers once the block's wgmmas are
done (``per_128``: the four wgmmas chain in the tensor core, DeepSeek-V3's interval, CUTLASS's
FP8 promotion interval), or after every wgmma (``per_wgmma``: each k32 partial from zero, added in
float32). Block scales (128 x 128 weights, 1 x 128 activation groups) are applied at the block's
promotion as ``acc += (P * sa[m, kb]) * sb[n // 128, kb]`` (upstream's order, tc_gemm's).

Precision: Hopper's FP8 tensor core does not add the products of one wgmma in float32 (DeepSeek-V3
§3.3.2; cuBLASLt misses G3 by up to 16x). Promotion bounds how far that reaches: it holds
``vtnumba.testing.reference.tensor_core_bound``; it does not claim DESIGN.md's strict G3, which
tc_gemm.py holds. So this kernel is chosen by name (``kernel="wgmma"``), never by the automatic
order behind the lever, whose contract is strict G3.

Shape rules: K % 16 == 0 and 16-byte aligned rows (cp.async), any M and N; compute capability 9.0
(the sm_90a target). No simulator emulation: tested on the H200.

Measured on the H200 (benchmarks/gpu/bench_wgmma.py, 2026-11-30; benchmarks/RESULTS.md)
-------------------------------------------------------------------------------------
- 4096^3, bf16 out: 201-204 us per_128 (675-683 TFLOP/s, 0.499x-0.511x cuBLASLt's 101-104 us over three
  runs; tc_gemm's mma.sync 548 us), 287 us per_wgmma (warp-specialized; 304 in the default form);
  28672 x 4096 x 4096: 0.41x; block-scaled 4096^3: 261-264 us, 0.42-0.43x torch's block
  ``_scaled_mm`` (242 us with k-contiguous activation scales).
- Accuracy on uniformly drawn codes, worst error / G3 bound: per_128 44.3 / 4.95 / 0.049 at K = 32 /
  256 / 4096 -- the same as cuBLASLt's, whose interval it shares; per_wgmma 44.3 / 1.91 / 0.022. Both
  within the tensor-core bound (at most 0.042 of it). tc_gemm: 0.016 / 0.002 / < 0.001.
- What limits it (Nsight Compute on the 4096^3 launch, benchmarks/RESULTS.md): not memory -- L2 at
  35% of its throughput, DRAM at 6% -- but latency at low occupancy. With 224 registers a thread
  (64 accumulators, 2 x 64 partials so a block's promotion overlaps the next block's wgmmas, the
  addresses) one block of 8 warps fits an SM: 2 warps a scheduler, issue slots 47% busy, no warp
  ready in 50% of cycles. Every warp both copies and computes, and one barrier per K block keeps
  them in step. The register budget also rules out m64n256 tiles. The warp-specialized form (a
  producer warpgroup, mbarriers) removes the copies and the barrier from the computing warps, but at
  three warpgroups a thread gets 168 registers, too few for the second partial, so each warpgroup
  waits for its own wgmmas before promoting: 217 us per_128 (287 us per_wgmma, where it wins).
  ``setmaxnreg`` (40 / 232, CUTLASS's split) did not raise ptxas's allocation above 168 from Numba's
  PTX (224 bytes of spills). TMA was not tried: its tensor map is encoded on the host
  (cuTensorMapEncodeTiled), outside the driver calls vtnumba's launcher makes.
  Ablations that changed little:
  cp.async L2 prefetch hints (.L2::128B / 256B), a 5-stage ring (205 us), one warpgroup per block at
  two blocks per SM (223 us: more warps, but 1.5x the bytes per FLOP).
- Two fixes that mattered, both in the SASS: the accumulators reach the epilogue through shared
  memory (``wgmma.stash``; indexed at run time they stayed in local memory, and with block scales
  LLVM stored all 64 every K block: 2.7x the time), and ``wgmma.hold`` after each promotion (without
  it LLVM sank the adds past the next wgmma and ptxas serialized every wgmma, advisory C7514).
"""

import functools
from collections import namedtuple

import numpy as np

from ..ptx import sm90_wgmma as wgmma
from ..ptx.codec import fill, float32_to_bfloat16_bits, float32_to_half_bits
from ..ptx.target import DEVICE_INLINE, SIMULATOR, cuda, types
from ..runtime.launch import compile_kernel
from . import tc_gemm
from .epilogue import OutKind, load_bias, scaled_value, store_out
from .tc_gemm import F16_SHARED_LIMIT, DynamicSharedKernel, gemm_signature, scale_readers

PER_128, PER_WGMMA = "per_128", "per_wgmma"
PROMOTIONS = (PER_128, PER_WGMMA)

WG_ROWS = 64  # rows of y per warpgroup (the wgmma's M)
WG_THREADS = 128
BK = wgmma.ROW_BYTES  # codes per stage: one 128-byte swizzled row
ROW_WORDS = BK // 4
CHUNKS = BK // 16  # 16-byte chunks per row
K_STEPS = BK // wgmma.K_STEP
SHARED_LIMIT = F16_SHARED_LIMIT  # dynamic shared memory per block with the opt-in (sm_90), tc_gemm's

WgConfig = namedtuple("WgConfig", "bn stages warpgroups blocks_per_sm producer", defaults=(2, 1, False))
WgConfig.__doc__ = """A tile configuration: BN columns per block (the wgmma's N), a STAGES-deep cp.async
ring, WARPGROUPS (1 or 2) computing 64 rows each, the blocks per SM the registers are capped for, and
PRODUCER: one more warpgroup that only copies, handing stages over through mbarriers (see
``specialized_kernel``); else every thread copies and computes, one block barrier per K block."""
WG_CONFIGS = {
    "128x128_s4": WgConfig(bn=128, stages=4),
    "128x128_s5": WgConfig(bn=128, stages=5),
    "128x64_s6": WgConfig(bn=64, stages=6),
    "64x128_s4_x2": WgConfig(bn=128, stages=4, warpgroups=1, blocks_per_sm=2),
    "64x128_s3_x2": WgConfig(bn=128, stages=3, warpgroups=1, blocks_per_sm=2),
    "ws_128x128_s4": WgConfig(bn=128, stages=4, producer=True),
    "ws_128x128_s6": WgConfig(bn=128, stages=6, producer=True),
}


def block_rows(cfg):
    return WG_ROWS * cfg.warpgroups


def threads(cfg):
    return WG_THREADS * (cfg.warpgroups + cfg.producer)


MBARRIER_BYTES = 2 * 8  # per stage: "full" (the producer's copies landed) and "empty" (consumed)
WG_DEFAULT = WG_CONFIGS["128x128_s4"]
# per promotion, the fastest on the H200 at 4096^3 (benchmarks/RESULTS.md): per_128 203 us (the
# warp-specialized form 217), per_wgmma 287 us warp-specialized (305 otherwise)
DEFAULTS = {PER_128: WG_DEFAULT, PER_WGMMA: WG_CONFIGS["ws_128x128_s4"]}

_F32_ZERO = np.float32(0.0)
OUT_FLOAT32, OUT_FLOAT16 = int(OutKind.FLOAT32), int(OutKind.FLOAT16)
# the descriptor's constant fields (stride byte offset 1024 >> 4, the 128-byte swizzle) and address mask
_DESC_HIGH = np.uint64(wgmma.descriptor_base(0))
_DESC_ADDRESS_MASK = np.uint32(wgmma.DESCRIPTOR_ADDRESS_MASK)


def shared_bytes(cfg):
    """Dynamic shared memory of a configuration's kernel: the ring plus the slack that puts it on a
    1024-byte boundary."""
    barriers = cfg.stages * MBARRIER_BYTES if cfg.producer else 0
    return cfg.stages * (block_rows(cfg) + cfg.bn) * BK + wgmma.SWIZZLE_ATOM_BYTES + barriers


def _check_config(cfg, block_scaled, promotion):
    if promotion not in PROMOTIONS:
        raise ValueError(f"promotion must be one of {PROMOTIONS}, got {promotion!r}")
    if cfg.warpgroups not in (1, 2):
        raise ValueError(f"warpgroups must be 1 or 2, got {cfg.warpgroups}")
    rows_per_pass = (WG_THREADS if cfg.producer else threads(cfg)) // CHUNKS
    if cfg.bn % rows_per_pass or not 32 <= cfg.bn <= 256:
        raise ValueError(f"BN must be a multiple of {rows_per_pass} in [32, 256] (whole copy passes), got {cfg.bn}")
    if cfg.stages < 3:
        raise ValueError(
            f"the ring needs at least 3 stages (one computed, one draining, one landing), got {cfg.stages}"
        )
    if cfg.bn // 2 * WG_THREADS * cfg.warpgroups * 4 > cfg.stages * (block_rows(cfg) + cfg.bn) * BK:
        raise ValueError(f"the epilogue stages the accumulators in the ring: {cfg.stages} stages are too few")
    if shared_bytes(cfg) > SHARED_LIMIT:
        raise ValueError(f"{cfg.stages} stages of 128 x {cfg.bn} tiles exceed {SHARED_LIMIT} bytes of shared memory")
    if block_scaled and 128 % cfg.bn:
        raise ValueError(f"block-scaled tiles must divide the 128-wide weight blocks: BN = {cfg.bn}")
    if block_scaled and promotion != PER_128:
        raise ValueError("block scales are applied per 128-wide K block: promotion must be per_128")


KernelParts = namedtuple("KernelParts", "copy_plan issue_stage block_scales promote write_out")


@functools.cache
def kernel_parts(cfg, block_scaled, copy_threads):
    """The device functions both kernel forms share, for a configuration whose copies are made by
    ``copy_threads`` threads: the stage copy, the block-scale read, the promotion and the epilogue."""
    bn = cfg.bn
    bm = block_rows(cfg)
    rows_per_pass = copy_threads // CHUNKS  # rows one pass of copies covers (a multiple of 8, see below)
    regs = bn // 2
    nt = bn // 8
    a_bytes = bm * BK
    a_copies = bm // rows_per_pass
    b_copies = bn // rows_per_pass
    hold, stash = wgmma.hold(regs), wgmma.stash(regs)
    from ..ptx import mma as mma_sync  # cp.async and the global address, shared with tc_gemm

    global_address = mma_sync.global_address
    copy_a = mma_sync.cp_async_rows(a_copies, rows_per_pass * ROW_WORDS)
    copy_b = mma_sync.cp_async_rows(b_copies, rows_per_pass * ROW_WORDS)
    row_scale, kblock_scale = scale_readers(block_scaled)
    load_bias_value, finish, store, store_pair = load_bias, scaled_value, store_out, wgmma.store_global_pair

    @cuda.jit(**DEVICE_INLINE)
    def copy_plan(a, b, ctid, pad, m0, n0):
        """This copying thread's part of every stage (``ctid``: its index among the copying threads):
        rows r0 + i * rows_per_pass, chunk c, stored at chunk position c ^ (row % 8) (rows_per_pass is
        a multiple of 8: the same position for every i). Returns (its word in ring slot 0, its A and B
        source addresses, their steps, how many of its A / B copies have a row inside M / N, the K
        offset of its chunk)."""
        m_total = a.shape[0]
        n_total = b.shape[0]
        r0 = ctid // CHUNKS
        chunk = ctid % CHUNKS
        copy_word = (pad + r0 * BK + 16 * (chunk ^ (r0 % 8))) // 4
        a_addr = global_address(a, min(m0 + r0, m_total - 1), 16 * chunk)
        b_addr = global_address(b, min(n0 + r0, n_total - 1), 16 * chunk)
        a_rows = (m_total - m0 - r0 + rows_per_pass - 1) // rows_per_pass
        b_rows = (n_total - n0 - r0 + rows_per_pass - 1) // rows_per_pass
        return (
            copy_word,
            a_addr,
            b_addr,
            rows_per_pass * a.strides[0],
            rows_per_pass * b.strides[0],
            a_rows,
            b_rows,
            16 * chunk,
        )

    @cuda.jit(**DEVICE_INLINE)
    def issue_stage(smem, a, b, k_total, kt, slot_word, a_addr, b_addr, a_step, b_step, a_rows, b_rows, chunk_code):
        """cp.async this thread's chunks of K stage ``kt`` into the ring slot whose word (with this
        thread's row and swizzled chunk position) is ``slot_word``; invalid ones zero-filled, read
        from the thread's first (valid) address."""
        col = kt * BK
        k_ok = col + chunk_code < k_total
        copy_a(smem, slot_word, a, a_addr, a_step, col, a_rows, k_ok, a_addr)
        copy_b(smem, slot_word + (a_bytes // 4), b, b_addr, b_step, col, b_rows, k_ok, b_addr)

    @cuda.jit(**DEVICE_INLINE)
    def block_scales(scale_a, scale_b, kb, row_a, m_total, block_n):
        """(sa[row_a, kb], sa[row_a + 8, kb], sb[n // 128, kb]): this thread's block scales of K block
        kb (1.0 each without block scales)."""
        return (
            kblock_scale(scale_a, min(row_a, m_total - 1), kb),
            kblock_scale(scale_a, min(row_a + 8, m_total - 1), kb),
            kblock_scale(scale_b, block_n, kb),
        )

    @cuda.jit(**DEVICE_INLINE)
    def promote(acc, part, sa0, sa1, sbv):
        """acc += the K block's partial (block scales: (P * sa[m, kb]) * sb[n // 128, kb])."""
        if block_scaled:
            for j in range(nt):
                acc[4 * j] += np.float32(part[4 * j] * sa0) * sbv
                acc[4 * j + 1] += np.float32(part[4 * j + 1] * sa0) * sbv
                acc[4 * j + 2] += np.float32(part[4 * j + 2] * sa1) * sbv
                acc[4 * j + 3] += np.float32(part[4 * j + 3] * sa1) * sbv
        else:
            for i in range(regs):
                acc[i] += part[i]
        hold(acc)  # the adds happen here, not after the next wgmma (see wgmma.hold)

    @cuda.jit(**DEVICE_INLINE)
    def write_out(
        acc,
        out,
        first,
        stride,
        y,
        m_total,
        n_total,
        n0,
        row_a,
        t,
        scale_a,
        sa_step,
        scale_b,
        sb_step,
        bias,
        bias_kind,
        out_kind,
    ):
        """y = round_out((acc * sa) * sb + bias) for this thread's accumulators (block scales are
        already in acc). acc goes through shared memory ``out`` (free by now), element i at word
        first + i * stride (threads at consecutive words: conflict-free), so it is never indexed at
        run time (wgmma.stash). Two adjacent columns go in one store where y's rows keep the pair
        aligned (N even, as for every real layer); else one element at a time."""
        stash(acc, out, first, stride)
        has_bias = bias_kind != 0
        sam0 = row_scale(scale_a, sa_step, min(row_a, m_total - 1))
        sam1 = row_scale(scale_a, sa_step, min(row_a + 8, m_total - 1))
        pair_bytes = 8 if out_kind == OUT_FLOAT32 else 4
        paired = y.strides[0] % pair_bytes == 0 and global_address(y, 0, 0) % pair_bytes == 0
        for j in range(nt):
            n = n0 + 8 * j + 2 * t  # even; the pair is (n, n + 1)
            if n < n_total:
                two = n + 1 < n_total
                sb0 = row_scale(scale_b, sb_step, n)
                sb1 = row_scale(scale_b, sb_step, n + 1) if two else sb0
                bv0 = load_bias_value(bias, bias_kind, n) if has_bias else _F32_ZERO
                bv1 = load_bias_value(bias, bias_kind, n + 1) if has_bias and two else _F32_ZERO
                for h in range(2):
                    m = row_a + 8 * h
                    if m < m_total:
                        sam = sam0 if h == 0 else sam1
                        i = first + (4 * j + 2 * h) * stride
                        v0 = finish(out[i], sam, sb0, has_bias, bv0)
                        if not two:
                            store(y, m, n, v0, out_kind)
                        else:
                            v1 = finish(out[i + stride], sam, sb1, has_bias, bv1)
                            if not paired:
                                store(y, m, n, v0, out_kind)
                                store(y, m, n + 1, v1, out_kind)
                            elif out_kind == OUT_FLOAT32:
                                store_pair(global_address(y, m, 4 * n), v0, v1)
                            elif out_kind == OUT_FLOAT16:
                                store_pair(
                                    global_address(y, m, 2 * n), float32_to_half_bits(v0), float32_to_half_bits(v1)
                                )
                            else:
                                store_pair(
                                    global_address(y, m, 2 * n),
                                    float32_to_bfloat16_bits(v0),
                                    float32_to_bfloat16_bits(v1),
                                )

    return KernelParts(copy_plan, issue_stage, block_scales, promote, write_out)


@functools.cache
def gemm_kernel(cfg, promotion, block_scaled, grouped=False):
    """The wgmma GEMM for one tile configuration, promotion and scale layout (arguments as
    tc_gemm.gemm_kernel's; ``grouped``: the grouped kernel, every thread copying and computing)."""
    _check_config(cfg, block_scaled, promotion)
    if grouped and cfg.producer:
        raise ValueError("the grouped wgmma GEMM runs the form where every thread copies and computes: producer=False")
    if cfg.producer:
        return specialized_kernel(cfg, promotion, block_scaled)
    bn, stages = cfg.bn, cfg.stages
    bm = block_rows(cfg)
    regs = bn // 2  # accumulator floats per thread
    a_bytes = bm * BK
    stage_bytes = (bm + bn) * BK  # a multiple of 1024: every tile starts on a swizzle atom
    per_wgmma = promotion == PER_WGMMA
    mma = wgmma.mma_e4m3(bn)
    wait_all, wait_one = wgmma.wait(0, regs), wgmma.wait(1, regs)
    nthreads = threads(cfg)
    copy_plan, issue_stage, block_scales, promote, write_out = kernel_parts(cfg, block_scaled, nthreads)
    fence, commit_mma, fence_proxy = wgmma.fence, wgmma.commit, wgmma.fence_proxy_async
    from ..ptx import mma as mma_sync  # cp.async and the global address, shared with tc_gemm

    commit_copies = mma_sync.cp_async_commit
    # stage kt's copies are waited for at iteration kt, with stages - 3 later ones still in flight
    wait_copies = mma_sync.cp_async_wait_group(stages - 3)
    wait_no_copies = mma_sync.cp_async_wait_group(0)

    @cuda.jit(**DEVICE_INLINE)
    def k_block(
        smem,
        a,
        b,
        k_total,
        kt,
        kt_total,
        copy_word,
        a_addr,
        b_addr,
        a_step,
        b_step,
        a_rows,
        b_rows,
        chunk_code,
        desc0,
        wg,
        acc,
        cur,
        prev,
        sa0,
        sa1,
        sbv,
        scale_a,
        scale_b,
        row_a,
        m_total,
        block_n,
    ):
        """K block kt: wait for its tile, refill the ring slot of tile kt - 2 (its wgmmas finished at
        the previous block's wait), issue this block's wgmmas into ``cur`` and, while they run,
        promote the previous block's partial ``prev`` (per_128). per_wgmma runs each k32 wgmma to
        completion and promotes it before the next: overlapping them through two partials, as
        per_128 does, made ptxas serialize every wgmma (C7514) for reasons its advisory does not name."""
        wait_copies()  # this thread's copies of tile kt have landed
        fence_proxy()  # ... and are visible to the tensor core's reads
        cuda.syncthreads()  # everyone's; and every wgmma reading tile kt - 2 is done
        nk = kt + stages - 2
        if nk < kt_total:
            issue_stage(
                smem,
                a,
                b,
                k_total,
                nk,
                copy_word + (nk % stages) * (stage_bytes // 4),
                a_addr,
                b_addr,
                a_step,
                b_step,
                a_rows,
                b_rows,
                chunk_code,
            )
        commit_copies()
        slot = (kt % stages) * stage_bytes
        desc_a = desc0 + np.uint64((slot + wg * 64 * BK) >> 4)
        desc_b = desc0 + np.uint64((slot + a_bytes) >> 4)
        if per_wgmma:  # each k32 slice (32 bytes on: + 2 in the descriptor's address field) from zero
            nsa0, nsa1, nsbv = block_scales(scale_a, scale_b, kt, row_a, m_total, block_n)  # 1.0: no block scales
            for kk in range(K_STEPS):
                fence()
                mma(cur, desc_a + np.uint64(2 * kk), desc_b + np.uint64(2 * kk), 0)
                commit_mma()
                wait_all(cur)
                promote(acc, cur, nsa0, nsa1, nsbv)
        else:
            fence()
            for kk in range(K_STEPS):
                mma(cur, desc_a + np.uint64(2 * kk), desc_b + np.uint64(2 * kk), kk)  # kk > 0 adds
            commit_mma()
            # this block's scales, for the next block's promotion: loaded while the wgmmas run (read
            # before the cp.async wait instead, the loads' latency joined that wait on the H200)
            nsa0, nsa1, nsbv = block_scales(scale_a, scale_b, kt, row_a, m_total, block_n)
            # the previous block's wgmmas are done (this one's may run on). Unconditional: with a branch
            # around the wait, ptxas serializes every wgmma (C7514, "non wgmma instructions reading
            # accumulator registers ... between start and end of the pipeline stage"). Before block 0
            # ``prev`` holds zeros, and adding them changes nothing.
            wait_one(prev)
            promote(acc, prev, sa0, sa1, sbv)
        return nsa0, nsa1, nsbv

    @cuda.jit(**DEVICE_INLINE)
    def tile(a, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind, m0, n0, m_total):
        """The 128 x BN tile of y at rows m0.., columns n0.. (tc_gemm's ``tile``)."""
        k_total = a.shape[1]
        n_total = b.shape[0]
        smem = cuda.shared.array(0, types.uint32)  # dynamic: the ring, sized at launch
        acc = cuda.local.array(regs, types.float32)
        part0 = cuda.local.array(regs, types.float32)
        part1 = cuda.local.array(regs, types.float32)
        fill(acc, _F32_ZERO)
        fill(part0, _F32_ZERO)
        fill(part1, _F32_ZERO)
        tid = cuda.threadIdx.x
        wg = tid // 128
        warp = (tid % 128) // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        # the ring starts at the first 1024-byte boundary of the dynamic shared memory
        base = wgmma.shared_address(smem, 0)
        pad = (wgmma.SWIZZLE_ATOM_BYTES - base % wgmma.SWIZZLE_ATOM_BYTES) % wgmma.SWIZZLE_ATOM_BYTES
        desc0 = np.uint64(((base + pad) >> 4) & _DESC_ADDRESS_MASK) | _DESC_HIGH
        copy_word, a_addr, b_addr, a_step, b_step, a_rows, b_rows, chunk_code = copy_plan(a, b, tid, pad, m0, n0)
        kt_total = (k_total + BK - 1) // BK
        row_a = m0 + wg * 64 + warp * 16 + g  # this thread's accumulator rows: row_a, row_a + 8
        block_n = n0 // 128

        for s in range(stages - 2):  # tiles 0 .. stages - 3 in flight; tile kt + stages - 2 at block kt
            if s < kt_total:
                issue_stage(
                    smem,
                    a,
                    b,
                    k_total,
                    s,
                    copy_word + s * (stage_bytes // 4),
                    a_addr,
                    b_addr,
                    a_step,
                    b_step,
                    a_rows,
                    b_rows,
                    chunk_code,
                )
            commit_copies()
        # two partials alternate (unrolled by two: a local array indexed at run time would leave
        # the registers): per_128, block kt in part0 / part1 by parity; per_wgmma, see k_block
        sa0 = sa1 = sbv = np.float32(1.0)  # block -1's scales: they multiply the zeros promoted before block 0
        kt = 0
        while kt + 1 < kt_total:
            sa0, sa1, sbv = k_block(
                smem,
                a,
                b,
                k_total,
                kt,
                kt_total,
                copy_word,
                a_addr,
                b_addr,
                a_step,
                b_step,
                a_rows,
                b_rows,
                chunk_code,
                desc0,
                wg,
                acc,
                part0,
                part1,
                sa0,
                sa1,
                sbv,
                scale_a,
                scale_b,
                row_a,
                m_total,
                block_n,
            )
            sa0, sa1, sbv = k_block(
                smem,
                a,
                b,
                k_total,
                kt + 1,
                kt_total,
                copy_word,
                a_addr,
                b_addr,
                a_step,
                b_step,
                a_rows,
                b_rows,
                chunk_code,
                desc0,
                wg,
                acc,
                part1,
                part0,
                sa0,
                sa1,
                sbv,
                scale_a,
                scale_b,
                row_a,
                m_total,
                block_n,
            )
            kt += 2
        if kt < kt_total:  # an odd count: the last block in part0
            sa0, sa1, sbv = k_block(
                smem,
                a,
                b,
                k_total,
                kt,
                kt_total,
                copy_word,
                a_addr,
                b_addr,
                a_step,
                b_step,
                a_rows,
                b_rows,
                chunk_code,
                desc0,
                wg,
                acc,
                part0,
                part1,
                sa0,
                sa1,
                sbv,
                scale_a,
                scale_b,
                row_a,
                m_total,
                block_n,
            )
            kt += 1
        # per_128: the last block's partial is still in flight (part0 for an odd count, else part1;
        # none when K is 0)
        if not per_wgmma:
            if kt_total % 2 == 1:  # (sa0, sa1, sbv): the last block's scales, returned by its k_block
                wait_all(part0)
                promote(acc, part0, sa0, sa1, sbv)
            else:  # a wait on every path: ptxas otherwise injects one and serializes the wgmmas (C7517)
                wait_all(part1)
                if kt_total > 0:
                    promote(acc, part1, sa0, sa1, sbv)

        # epilogue, through the ring once every wgmma and copy is done
        wait_no_copies()
        cuda.syncthreads()
        out = cuda.shared.array(0, types.float32)  # the same dynamic shared memory as smem
        write_out(
            acc,
            out,
            pad // 4 + tid,
            nthreads,
            y,
            m_total,
            n_total,
            n0,
            row_a,
            t,
            scale_a,
            sa_step,
            scale_b,
            sb_step,
            bias,
            bias_kind,
            out_kind,
        )

    return tc_gemm.tile_kernel(tile, bm, bn, grouped)


@functools.cache
def specialized_kernel(cfg, promotion, block_scaled):
    """The warp-specialized form (``cfg.producer``): warpgroup 0 only copies, warpgroups 1 and 2
    only compute, and stages change hands through two mbarriers each, never a block barrier.

    - Producer: for stage kt, wait until "empty" of its slot completes (the consumers are done with
      stage kt - STAGES), issue its cp.async copies, then -- LAG stages behind, in order -- wait for
      its own copies of stage kt - LAG, fence them into the async proxy and arrive on that slot's
      "full" (128 arrivals complete it).
    - Consumers: wait for "full", run the block's four wgmmas, wait for them, arrive on "empty" (256
      arrivals), promote. Without a block barrier one warpgroup promotes while the other's wgmmas
      run, so the partial is not double-buffered: 64 + 64 accumulators fit the 168 registers three
      warpgroups leave a thread.
    Phase parity: the r-th completion of a barrier (r = 0, 1, ...) is waited for with parity r & 1."""
    bn, stages = cfg.bn, cfg.stages
    bm = block_rows(cfg)
    regs = bn // 2
    a_bytes = bm * BK
    stage_bytes = (bm + bn) * BK
    lag = stages - 2  # copies in flight behind the newest stage (< stages: the producer never waits on itself)
    consumers = WG_THREADS * cfg.warpgroups
    per_wgmma = promotion == PER_WGMMA
    mma = wgmma.mma_e4m3(bn)
    wait_all = wgmma.wait(0, regs)
    fence, commit_mma, fence_proxy = wgmma.fence, wgmma.commit, wgmma.fence_proxy_async
    bar_init, bar_arrive, bar_try_wait = wgmma.mbarrier_init, wgmma.mbarrier_arrive, wgmma.mbarrier_try_wait
    from ..ptx import mma as mma_sync

    commit_copies = mma_sync.cp_async_commit
    wait_lag = mma_sync.cp_async_wait_group(lag)
    wait_no_copies = mma_sync.cp_async_wait_group(0)
    copy_plan, issue_stage, block_scales, promote, write_out = kernel_parts(cfg, block_scaled, WG_THREADS)
    full_word, empty_word = 0, 2 * stages  # the mbarriers: words [0, 4 stages) of the dynamic memory

    def gemm(a, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
        m_total, k_total = a.shape
        n_total = b.shape[0]
        smem = cuda.shared.array(0, types.uint32)
        tid = cuda.threadIdx.x
        wg = tid // 128
        m0 = cuda.blockIdx.y * bm
        n0 = cuda.blockIdx.x * bn
        kt_total = (k_total + BK - 1) // BK
        base = wgmma.shared_address(smem, 0)
        ring = base + stages * MBARRIER_BYTES  # the ring: the first 1024-byte boundary after the barriers
        pad = ring + (wgmma.SWIZZLE_ATOM_BYTES - ring % wgmma.SWIZZLE_ATOM_BYTES) % wgmma.SWIZZLE_ATOM_BYTES - base
        acc = cuda.local.array(regs, types.float32)  # the consumers' (the producer's stay zero, unused)
        part = cuda.local.array(regs, types.float32)
        fill(acc, _F32_ZERO)
        fill(part, _F32_ZERO)
        ctid = tid - WG_THREADS
        row_a = m0 + (wg - 1) * 64 + ((ctid % 128) // 32) * 16 + (ctid % 32) // 4  # rows row_a, row_a + 8
        if tid == 0:
            for s in range(stages):
                bar_init(smem, full_word + 2 * s, WG_THREADS)
                bar_init(smem, empty_word + 2 * s, consumers)
        cuda.syncthreads()
        if wg == 0:  # the producer
            copy_word, a_addr, b_addr, a_step, b_step, a_rows, b_rows, chunk_code = copy_plan(a, b, tid, pad, m0, n0)
            for kt in range(kt_total):
                slot = kt % stages
                if kt >= stages:  # the consumers' (kt // stages)-th release of this slot
                    while bar_try_wait(smem, empty_word + 2 * slot, (kt // stages - 1) & 1) == 0:
                        pass
                issue_stage(
                    smem,
                    a,
                    b,
                    k_total,
                    kt,
                    copy_word + slot * (stage_bytes // 4),
                    a_addr,
                    b_addr,
                    a_step,
                    b_step,
                    a_rows,
                    b_rows,
                    chunk_code,
                )
                commit_copies()
                if kt >= lag:
                    wait_lag()  # stage kt - lag has landed (for this thread)
                    fence_proxy()
                    bar_arrive(smem, full_word + 2 * ((kt - lag) % stages))
            wait_no_copies()
            fence_proxy()
            for kt in range(max(kt_total - lag, 0), kt_total):
                bar_arrive(smem, full_word + 2 * (kt % stages))
        else:  # a consumer: rows 64 (wg - 1) .. of the tile
            block_n = n0 // 128
            desc0 = np.uint64(((base + pad) >> 4) & _DESC_ADDRESS_MASK) | _DESC_HIGH
            for kt in range(kt_total):
                slot = kt % stages
                while bar_try_wait(smem, full_word + 2 * slot, (kt // stages) & 1) == 0:
                    pass
                sa0, sa1, sbv = block_scales(scale_a, scale_b, kt, row_a, m_total, block_n)
                at = slot * stage_bytes
                desc_a = desc0 + np.uint64((at + (wg - 1) * 64 * BK) >> 4)
                desc_b = desc0 + np.uint64((at + a_bytes) >> 4)
                if per_wgmma:
                    for kk in range(K_STEPS):
                        fence()
                        mma(part, desc_a + np.uint64(2 * kk), desc_b + np.uint64(2 * kk), 0)
                        commit_mma()
                        wait_all(part)
                        if kk == K_STEPS - 1:
                            bar_arrive(smem, empty_word + 2 * slot)
                        promote(acc, part, sa0, sa1, sbv)
                else:
                    fence()
                    for kk in range(K_STEPS):
                        mma(part, desc_a + np.uint64(2 * kk), desc_b + np.uint64(2 * kk), kk)
                    commit_mma()
                    wait_all(part)
                    bar_arrive(smem, empty_word + 2 * slot)  # the slot's reads are done
                    promote(acc, part, sa0, sa1, sbv)
        cuda.syncthreads()  # every copy landed and every wgmma read: the ring is free for the epilogue
        if wg > 0:
            out = cuda.shared.array(0, types.float32)
            write_out(
                acc,
                out,
                pad // 4 + (tid - WG_THREADS),
                consumers,
                y,
                m_total,
                n_total,
                n0,
                row_a,
                (tid % 32) % 4,
                scale_a,
                sa_step,
                scale_b,
                sb_step,
                bias,
                bias_kind,
                out_kind,
            )

    return gemm


@functools.cache
def gemm_launcher(cfg, promotion, block_scaled, out_is_float32, grouped=False):
    """The compiled wgmma GEMM (a ``DynamicSharedKernel``): launch on grid (ceil(N / BN),
    ceil(M / block_rows(cfg))) of threads(cfg) threads; ``grouped``: the grouped kernel, on grid
    (ceil(N / BN), tiles)."""
    sig = (tc_gemm.grouped_gemm_signature if grouped else gemm_signature)(block_scaled, out_is_float32)
    kernel = compile_kernel(
        gemm_kernel(cfg, promotion, block_scaled, grouped),
        sig,
        arch=wgmma.ARCH,
        launch_bounds=(threads(cfg), cfg.blocks_per_sm),
    )
    return DynamicSharedKernel(kernel, shared_bytes(cfg))


def unavailable_reason(dev):
    """Why the wgmma GEMM cannot run on device record ``dev`` (None when it can)."""
    if SIMULATOR:
        return "the wgmma GEMM has no simulator emulation (it runs on an sm_90 GPU only)"
    if not wgmma.available(dev.cc):
        return f"wgmma is an sm_90a instruction: it needs compute capability 9.0, got {dev.cc}"
    return None


def shape_reason(call):
    return tc_gemm.shape_reason(call, "the wgmma GEMM")


def gemm_launch(call, y_bits, block_scaled, promotion=PER_128, config=None):
    """(kernel, grid, block, args) of the wgmma GEMM for a ``gemm.GemmCall`` (or a
    ``block.BlockCall``: then the scales are 2-D and the steps unused)."""
    cfg = config or DEFAULTS[promotion]
    return (
        gemm_launcher(cfg, promotion, block_scaled, call.out_dtype == np.float32),
        (-(-call.n // cfg.bn), -(-call.m // block_rows(cfg))),
        threads(cfg),
        tc_gemm.gemm_args(call, y_bits, block_scaled),
    )


def grouped_reason(call):
    """Why the grouped wgmma GEMM cannot take an ``grouped.GroupedCall`` (None when it can)."""
    why = unavailable_reason(call.device) or tc_gemm.grouped_shape_reason(call, "the grouped wgmma GEMM")
    if why is None:
        scales = tc_gemm.grouped_scales(call)
        if isinstance(scales, str):
            why = scales
        elif scales[5]:
            why = "the wgmma GEMM takes no MXFP8 (E8M0) scales"
    return why


# The grouped GEMM's tiles by the rows an expert gets on average. Each expert's last tile is partly
# padding rows, so at 64-256 rows an expert the 128-row tiles compute up to twice the rows there
# are, the 64-row ones (one warpgroup, two blocks an SM; 223 against 201 us on the dense 4096^3, 10%
# slower where nothing is padding) half as many. The threshold is reasoned, not yet timed on a GPU
# (bench_grouped_tc.py --kernels times both); 0 gives the 128-row tiles everywhere.
GROUPED_CONFIGS = {"rows_64": WG_CONFIGS["64x128_s4_x2"], "rows_128": WG_DEFAULT}
GROUPED_64_BELOW = 256  # rows an expert on average under which the 64-row tiles run


def grouped_config(call):
    """The tile configuration of a grouped call (``GROUPED_CONFIGS``), by the rows an expert gets on
    average (``call.p / call.e``)."""
    return GROUPED_CONFIGS["rows_64" if call.p < GROUPED_64_BELOW * call.e else "rows_128"]


def grouped_gemm_launch(call, y_bits, tiles, promotion=PER_128, config=None):
    """(kernel, grid, block, args) of the grouped wgmma GEMM for an ``grouped.GroupedCall`` over
    ``tiles`` (``moe.row_tiles_launch``'s map, ``block_rows(cfg)`` rows a tile; ``cfg``
    ``grouped_config(call)`` unless given)."""
    cfg = config or grouped_config(call)
    block_scaled = tc_gemm.grouped_scales(call)[4]
    return (
        gemm_launcher(cfg, promotion, block_scaled, call.out_dtype == np.float32, True),
        (-(-call.n // cfg.bn), int(tiles.shape[0])),
        threads(cfg),
        tc_gemm.grouped_args(call, y_bits, tiles),
    )


__all__ = [
    "grouped_reason",
    "grouped_config",
    "grouped_gemm_launch",
    "GROUPED_CONFIGS",
    "GROUPED_64_BELOW",
    "PER_128",
    "PER_WGMMA",
    "PROMOTIONS",
    "block_rows",
    "threads",
    "WgConfig",
    "WG_CONFIGS",
    "WG_DEFAULT",
    "DEFAULTS",
    "shared_bytes",
    "kernel_parts",
    "gemm_kernel",
    "specialized_kernel",
    "gemm_launcher",
    "unavailable_reason",
    "shape_reason",
    "gemm_launch",
]
