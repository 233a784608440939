"""FP8 GEMM and decode GEMV on tensor cores, from Numba (``mma.sync`` through inline PTX, mma.py).

Both kernels compute DESIGN.md's ``y = round_out((sum_k dec(a) dec(b)) * sa * sb + bias)`` (or the
block-scaled form) with the epilogue of gemm_kernels.py (``scaled_value``, ``load_bias``,
``store_out``), and hold the strict G3 bound where cuBLASLt misses it by up to 16x.

Design
------
- Tiled GEMM (``gemm_kernel``): a block computes a BM x BN tile with WM x WN warps of MT m16 x NT n8
  mma tiles; K advances 64 codes a stage, copied by ``cp.async.cg`` 16 bytes a thread into a
  3-deep shared ring (static 48 KB); chunk c of a 64-byte shared row sits at c ^ ((row >> 1) & 3),
  so the copies and the ``ldmatrix.x4`` fragment reads are bank-conflict free. Rows past M / N and
  chunks past K are zero-filled by the copy (zero codes are exact zeros). Any M, N; K % 16 == 0
  and 16-byte aligned rows (else the caller falls back to the CUDA-core kernel).
- Decode GEMV (``gemv_kernel``, M <= 16): weight rows are the A operand (m16), activation rows the
  B operand (n8, zero-padded); the mma's k order is permuted so each lane's 16 contiguous weight
  bytes feed two mmas straight from registers (no shared memory for the weight); a ring of 2
  chunks (128 K each) is in flight per warp; warps split K, their sums meet in shared memory in a
  fixed order. Fused modes quantize x into shared memory first (static, dynamic, per-token,
  1 x 128 groups: codec.py's encoders), then read it per chunk; x too large for one launch runs in
  row slices, or is quantized once and the codes GEMV runs.
- Block scales (128 x 128 weights, 1 x 128 activation groups): the partial P of each 128-wide K
  block is promoted as ``acc += (P * sa[m, kb]) * sb[n // 128, kb]`` (upstream's order).

Promotion (measured on the H200, benchmarks/bench_tensorcore.py, 2026-11-30)
---------------------------------------------------------------------------
On sm_90 ptxas lowers ``mma.m16n8k32.e4m3`` to F2FP.F16.E4M3.UNPACK_B conversions, two
HMMA.16816.F32 (the first from zero) and one FADD of C (cuobjdump). So passing the accumulator as C
*is* promotion per mma: each k32 partial enters float32 registers through an IEEE add. The default,
``per_mma``, runs that way on sm_90 (``chains_in_float32``; bit-identical to the explicit
C = 0-and-add form on the H200, test_chained_c_is_promotion_per_mma) and explicitly elsewhere.
At 4096^3: per_mma chained 547 us, explicit 613 us (+12%: 128 more FADD per 64 HMMA), per_128
(a second register set, the K block's partial) 579 us. Worst |err| / G3 bound on uniformly drawn
codes: 0.002 (K = 256) and < 0.001 (K = 4096) for all three, against cuBLASLt's 4.45 and 0.049.
per_128 claims G3 only where the mma adds C in float32 (sm_90); per_mma claims it everywhere.

What limits speed
-----------------
- GEMM: 251 TF/s at 4096^3 (0.18x cuBLASLt's 1,370; 28672 x 4096 x 4096: 254 TF/s, 0.18x;
  block-scaled 139 TF/s, 0.11x torch's block _scaled_mm). FP8 mma.sync is not native on Hopper: each
  k32 mma is two f16 HMMAs after e4m3 -> f16 conversions, which issue at 16 per clock per SM
  (CUDA guide, "other type conversions"). The main loop (128 x 128 tile, 8 warps of 32 x 64) holds
  64 HMMA, 96 F2FP, 128 FADD, 12 LDSM, 4 LDGSTS and ~90 other instructions per warp and 64-wide K
  tile; 547 us is ~17 sub-partition cycles per HMMA, of which the conversions alone are ~12 (the
  FADD ablation above prices one instruction at ~1 cycle). Tile shapes converting less (128 x 96,
  4 warps of 64 x 48: 1.17 conversions per HMMA instead of 1.5) gained 4% (523 us); 64 x 64 warp
  tiles spill at 255 registers. The way to cuBLASLt's speed is wgmma (sm_90a, native FP8, no
  conversion) with per-wgmma promotion into float32 registers (DeepSeek-V3's scheme), or, short of
  it, converting each stage once per block into f16 shared memory (3x fewer conversions).
- GEMV: 7.0 / 8.7 / 40.3 / 21.3 us at M = 1 on 4096^2 / 6144x4096 / 28672x4096 / 4096x14336
  (cuBLASLt 6.3 / 8.5 / 31.1 / 19.9; the CUDA-core GEMV 8.9 / 12.0 / 46.4 / 24.8; the weight at
  the device copy rate 4.0 / 6.0 / 27.9 / 13.9). The same conversions, 48 F2FP per warp and
  2 KB chunk (a third of them for the mostly-zero activation tile), plus ~130 other
  instructions, keep the multiprocessors about half busy at the memory rate; a 4-deep ring was
  slower (181 registers: 2 blocks a multiprocessor instead of 4). M = 16 (two activation tiles)
  is 0.55-0.63x cuBLASLt. The fused static FP8 layer at M = 1 (bf16 x, one launch) is 1.22 / 1.61 /
  1.43 / 1.29x torch's bf16 matmul.
"""

import functools
from collections import namedtuple

import numpy as np

from . import mma
from .gemm_kernels import load_bias, scaled_value, store_out
from .launch import compile_kernel
from .target import DEVICE_INLINE, SIMULATOR, cuda, types

# Promotion: how often the tensor core's partial sum moves into float32 registers the kernel adds.
PER_MMA, PER_128 = "per_mma", "per_128"
PROMOTIONS = (PER_MMA, PER_128)

_F32_ZERO = np.float32(0.0)
_F32_ONE = np.float32(1.0)
_U32_ZERO = np.uint32(0)
_DEVICE = DEVICE_INLINE
# shared arrays read 16 bytes at a time (cp.async, ldmatrix, ld.shared.v4) must be aligned; Numba
# aligns them to their element otherwise. The simulator takes no alignment (nor needs one).
_ALIGN_16 = None if SIMULATOR else 16
_ALIGN_128 = None if SIMULATOR else 128

# ------------------------------------------------------------------------------------------------
# the tiled GEMM
#
# A block computes a BM x BN tile of y with WM x WN warps, each warp MT m16 tiles by NT n8 tiles.
# K advances 64 codes a stage: cp.async copies the block's A rows [BM, 64] and B rows [BN, 64] into
# shared memory, STAGES deep, so the copies of the next STAGES - 1 tiles fly while one is computed.
# A shared row is 64 bytes, four 16-byte chunks; chunk c of row r is stored at position
# c ^ ((r >> 1) & 3), which makes both the 16-byte copies and the fragment reads (ldmatrix rows, or
# 32-bit words) conflict-free: the 8 rows one phase touches fall on 8 distinct (row parity, chunk)
# pairs, i.e. all 32 banks.

TileConfig = namedtuple("TileConfig", "mt nt wm wn stages ldmatrix")
BK = 64  # codes per row per stage
ROW_WORDS = BK // 4
SHARED_LIMIT = 48 * 1024  # static shared memory: no opt-in attribute needed

# Measured at 4096^3 on the H200 (us, per_mma): 547 / 594 / 547 / 573 / 523 / 581 in this order.
# The default stays the 128 x 128 tile the GPU tests ran on, and whose BN divides the 128-wide
# weight blocks (128 x 96 was 4% faster and does not).
GEMM_CONFIGS = {
    "128x128_w8_32x64": TileConfig(mt=2, nt=8, wm=4, wn=2, stages=3, ldmatrix=True),
    "128x128_w8_64x32": TileConfig(mt=4, nt=4, wm=2, wn=4, stages=3, ldmatrix=True),
    "128x128_w4_64x64": TileConfig(mt=4, nt=8, wm=2, wn=2, stages=3, ldmatrix=True),
    "128x128_w8_32x64_lds": TileConfig(mt=2, nt=8, wm=4, wn=2, stages=3, ldmatrix=False),
    "128x96_w4_64x48": TileConfig(mt=4, nt=6, wm=2, wn=2, stages=3, ldmatrix=True),
    "128x192_w8_64x48_s2": TileConfig(mt=4, nt=6, wm=2, wn=4, stages=2, ldmatrix=True),
    "sim_32x16": TileConfig(mt=1, nt=2, wm=2, wn=1, stages=2, ldmatrix=True),  # tiny, for the simulator
    "sim_32x16_lds": TileConfig(mt=1, nt=2, wm=2, wn=1, stages=2, ldmatrix=False),
}
GEMM_DEFAULT = GEMM_CONFIGS["sim_32x16" if SIMULATOR else "128x128_w8_32x64"]


def tile_shape(cfg):
    return cfg.wm * cfg.mt * 16, cfg.wn * cfg.nt * 8


def _check_config(cfg, block_scaled):
    bm, bn = tile_shape(cfg)
    threads = 32 * cfg.wm * cfg.wn
    if (bm * 4) % threads or (bn * 4) % threads:
        raise ValueError(f"tile {bm} x {bn} must split into 16-byte copies evenly over {threads} threads")
    if cfg.ldmatrix and cfg.nt % 2:
        raise ValueError(f"ldmatrix loads B fragments two n8 tiles at a time: nt must be even, got {cfg.nt}")
    if cfg.stages * (bm + bn) * BK > SHARED_LIMIT:
        raise ValueError(f"{cfg.stages} stages of {bm} x {bn} tiles exceed {SHARED_LIMIT} bytes of shared memory")
    if block_scaled and 128 % bn:
        raise ValueError(f"block-scaled tiles must divide the 128-wide weight blocks: BN = {bn}")
    return bm, bn, threads


def _split_accumulators(promotion, block_scaled):
    """Whether the kernel keeps a K-block partial beside the accumulator."""
    return promotion == PER_128 or block_scaled


@functools.lru_cache(maxsize=None)
def gemm_kernel(cfg, promotion, block_scaled, chain):
    """The tiled tensor-core GEMM for one tile configuration, promotion and scale layout. ``chain``
    (per-mma promotion only): pass the accumulator as the mma's C instead of C = 0 and a float32
    add -- the same arithmetic where the mma itself adds C in float32 after each k32 product (sm_90,
    see ``chains_in_float32``), with half the adds."""
    if promotion not in PROMOTIONS:
        raise ValueError(f"promotion must be one of {PROMOTIONS}, got {promotion!r}")
    bm, bn, threads = _check_config(cfg, block_scaled)
    mt, nt, wm_count, stages, use_ldmatrix = cfg.mt, cfg.nt, cfg.wm, cfg.stages, cfg.ldmatrix
    warps = cfg.wm * cfg.wn
    a_words = bm * ROW_WORDS
    stage_words = (bm + bn) * ROW_WORDS
    smem_words = stages * stage_words
    a_copies = bm * 4 // threads
    b_copies = bn * 4 // threads
    rows_per_pass = threads // 4
    n_acc = mt * nt * 4
    split = _split_accumulators(promotion, block_scaled)
    n_part = n_acc if split else 1
    n_af, n_bf = 4, 2 * nt
    chained = promotion == PER_128 or chain
    scratch_words = warps * mma.SCRATCH_WORDS_PER_WARP if SIMULATOR else 1
    mma_op, ldsm, lds = mma.mma_e4m3, mma.ldmatrix_x4, mma.lds_u32
    cp16, commit = mma.cp_async_16, mma.cp_async_commit
    wait_tile = mma.cp_async_wait_group(stages - 2)
    load_bias_value, finish, store = load_bias, scaled_value, store_out

    @cuda.jit(**_DEVICE)
    def issue_tile(smem, a, b, k_total, kt, stage, a_addr, b_addr, a_step, b_step, a_rows, b_rows, a_zero,
                   b_zero, chunk_code, copy_word):
        """cp.async the A and B rows of K tile ``kt`` into ``stage``. This thread copies the 16-byte
        chunk at a_addr + i * a_step + kt * BK of copy i (rows r0 + i * rows_per_pass), valid for
        i < a_rows; rows past M / N and chunks past K are zero-filled from a valid address (zero
        codes are exact zeros: padding changes no sum)."""
        col = kt * BK
        k_ok = col + chunk_code < k_total  # chunk_code: the K offset of this thread's chunk
        base = stage * stage_words + copy_word
        for i in range(a_copies):
            ok = k_ok and i < a_rows
            cp16(smem, base + i * rows_per_pass * ROW_WORDS, a, (a_addr + i * a_step + col) if ok else a_zero,
                 16 if ok else 0)
        for i in range(b_copies):
            ok = k_ok and i < b_rows
            cp16(smem, base + a_words + i * rows_per_pass * ROW_WORDS, b,
                 (b_addr + i * b_step + col) if ok else b_zero, 16 if ok else 0)

    if block_scaled:
        @cuda.jit(**_DEVICE)
        def row_scale(scale, step, i):
            return _F32_ONE  # the block scales are applied in the main loop

        @cuda.jit(**_DEVICE)
        def kblock_scale(scale, i, kb):
            return scale[i, kb]
    else:
        @cuda.jit(**_DEVICE)
        def row_scale(scale, step, i):
            return scale[i * step]

        @cuda.jit(**_DEVICE)
        def kblock_scale(scale, i, kb):
            return _F32_ONE

    def gemm(a, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
        """y = round_out(a @ b^T scaled + bias). Per-tensor / per-row x per-channel: scale_a, scale_b
        float32 vectors read as scale[i * step]. Block-scaled: scale_a [M, ceil(K/128)] per
        1 x 128 activation group, scale_b [ceil(N/128), ceil(K/128)] per 128 x 128 weight block
        (the steps unused)."""
        m_total, k_total = a.shape
        n_total = b.shape[0]
        smem = cuda.shared.array(smem_words, types.uint32, alignment=_ALIGN_128)  # cp.async, ldmatrix: 16 B
        scratch = cuda.shared.array(scratch_words, types.uint32)
        acc = cuda.local.array(n_acc, types.float32)
        part = cuda.local.array(n_part, types.float32)
        af = cuda.local.array(n_af, types.uint32)
        bf = cuda.local.array(n_bf, types.uint32)
        for i in range(n_acc):
            acc[i] = _F32_ZERO
        for i in range(n_part):
            part[i] = _F32_ZERO
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        wm = warp % wm_count
        wn = warp // wm_count
        g = lane // 4
        t = lane % 4
        m0 = cuda.blockIdx.y * bm
        n0 = cuda.blockIdx.x * bn
        # the copies: thread -> (row r0 + i * rows_per_pass, chunk), stored in swizzled slot
        r0 = tid // 4
        chunk = tid % 4
        slot = chunk ^ ((r0 // 2) % 4)  # rows_per_pass is a multiple of 8: the same slot for every i
        copy_word = r0 * ROW_WORDS + 4 * slot  # + stage base + i * rows_per_pass * ROW_WORDS
        a_addr = mma.global_address(a, min(m0 + r0, m_total - 1), 16 * chunk)
        b_addr = mma.global_address(b, min(n0 + r0, n_total - 1), 16 * chunk)
        a_zero = mma.global_address(a, 0, 0)
        b_zero = mma.global_address(b, 0, 0)
        a_step = rows_per_pass * a.strides[0]
        b_step = rows_per_pass * b.strides[0]
        a_rows = (m_total - m0 - r0 + rows_per_pass - 1) // rows_per_pass  # copies with a row < M
        b_rows = (n_total - n0 - r0 + rows_per_pass - 1) // rows_per_pass
        # the fragment reads: with ldmatrix, lane supplies row lane % 8 of matrix lane // 8
        rr = lane % 8
        jj = lane // 8
        sw = (rr // 2) % 4 if use_ldmatrix else (g // 2) % 4
        if use_ldmatrix:
            a_row = wm * mt * 16 + rr + 8 * (jj % 2)
            b_row = wn * nt * 8 + 8 * (jj // 2) + rr
            a_hi = jj // 2  # matrices 2, 3: k + 16
            b_hi = jj % 2
            a_lane = a_row * ROW_WORDS
            b_lane = a_words + b_row * ROW_WORDS
        else:
            a_lane = (wm * mt * 16 + g) * ROW_WORDS + t
            b_lane = a_words + (wn * nt * 8 + g) * ROW_WORDS + t
            a_hi = 0
            b_hi = 0
        kt_total = (k_total + BK - 1) // BK
        block_n = n0 // 128

        for s in range(stages - 1):
            if s < kt_total:
                issue_tile(smem, a, b, k_total, s, s, a_addr, b_addr, a_step, b_step, a_rows, b_rows, a_zero, b_zero,
                           16 * chunk, copy_word)
            commit()
        st_read = 0
        st_write = stages - 1
        for kt in range(kt_total):
            wait_tile()
            cuda.syncthreads()
            nk = kt + stages - 1
            if nk < kt_total:
                issue_tile(smem, a, b, k_total, nk, st_write, a_addr, b_addr, a_step, b_step, a_rows, b_rows, a_zero,
                           b_zero, 16 * chunk, copy_word)
            commit()
            sbase = st_read * stage_words
            for ks in range(2):
                # fragments of this 32-wide k step (chunks 2 ks, 2 ks + 1 of every row): B for the
                # warp's columns first, then A one m16 tile at a time (fewer registers live)
                if use_ldmatrix:
                    b_off = sbase + b_lane + 4 * ((2 * ks + b_hi) ^ sw)
                    for j in range(nt // 2):
                        bf[4 * j], bf[4 * j + 1], bf[4 * j + 2], bf[4 * j + 3] = ldsm(
                            smem, b_off + 16 * ROW_WORDS * j, scratch, warp, lane)
                    a_off = sbase + a_lane + 4 * ((2 * ks + a_hi) ^ sw)
                else:
                    lo = 4 * ((2 * ks) ^ sw)
                    hi = 4 * ((2 * ks + 1) ^ sw)
                    for j in range(nt):
                        base = sbase + b_lane + 8 * ROW_WORDS * j
                        bf[2 * j] = lds(smem, base + lo)
                        bf[2 * j + 1] = lds(smem, base + hi)
                for i in range(mt):
                    if use_ldmatrix:
                        af[0], af[1], af[2], af[3] = ldsm(smem, a_off + 16 * ROW_WORDS * i, scratch, warp, lane)
                    else:
                        base = sbase + a_lane + 16 * ROW_WORDS * i
                        af[0] = lds(smem, base + lo)
                        af[1] = lds(smem, base + 8 * ROW_WORDS + lo)
                        af[2] = lds(smem, base + hi)
                        af[3] = lds(smem, base + 8 * ROW_WORDS + hi)
                    for j in range(nt):
                        q = 4 * (i * nt + j)
                        if chained and split:  # the tensor core accumulates the K block itself
                            part[q], part[q + 1], part[q + 2], part[q + 3] = mma_op(
                                af[0], af[1], af[2], af[3], bf[2 * j], bf[2 * j + 1],
                                part[q], part[q + 1], part[q + 2], part[q + 3], scratch, warp, lane)
                        elif chained:  # the mma adds C (the accumulator) in float32 itself
                            acc[q], acc[q + 1], acc[q + 2], acc[q + 3] = mma_op(
                                af[0], af[1], af[2], af[3], bf[2 * j], bf[2 * j + 1],
                                acc[q], acc[q + 1], acc[q + 2], acc[q + 3], scratch, warp, lane)
                        else:  # promotion per mma: C = 0, the partial added in float32
                            d0, d1, d2, d3 = mma_op(
                                af[0], af[1], af[2], af[3], bf[2 * j], bf[2 * j + 1],
                                _F32_ZERO, _F32_ZERO, _F32_ZERO, _F32_ZERO, scratch, warp, lane)
                            if split:
                                part[q] += d0
                                part[q + 1] += d1
                                part[q + 2] += d2
                                part[q + 3] += d3
                            else:
                                acc[q] += d0
                                acc[q + 1] += d1
                                acc[q + 2] += d2
                                acc[q + 3] += d3
            if split and (kt % 2 == 1 or kt == kt_total - 1):
                # the end of a 128-wide K block: promote (and scale) the partial into acc
                kb = kt // 2
                sbv = kblock_scale(scale_b, block_n, kb)
                for i in range(mt):
                    for h in range(2):
                        sav = kblock_scale(scale_a, min(m0 + wm * mt * 16 + 16 * i + 8 * h + g, m_total - 1), kb)
                        for j in range(nt):
                            q = 4 * (i * nt + j) + 2 * h
                            for e in range(2):
                                if block_scaled:
                                    acc[q + e] += np.float32(part[q + e] * sav) * sbv
                                else:
                                    acc[q + e] += part[q + e]
                                part[q + e] = _F32_ZERO
            st_read = 0 if st_read == stages - 1 else st_read + 1
            st_write = 0 if st_write == stages - 1 else st_write + 1

        # epilogue: y = round_out((acc * sa) * sb + bias) (block scales are already in acc)
        has_bias = bias_kind != 0
        for j in range(nt):
            for e in range(2):
                n = n0 + wn * nt * 8 + 8 * j + 2 * t + e
                if n < n_total:
                    sbn = row_scale(scale_b, sb_step, n)
                    bv = load_bias_value(bias, bias_kind, n) if has_bias else _F32_ZERO
                    for i in range(mt):
                        for h in range(2):
                            m = m0 + wm * mt * 16 + 16 * i + 8 * h + g
                            if m < m_total:
                                sam = row_scale(scale_a, sa_step, m)
                                v = finish(acc[4 * (i * nt + j) + 2 * h + e], sam, sbn, has_bias, bv)
                                store(y, m, n, v, out_kind)

    return gemm


_u8_2d = types.uint8[:, :]
_f32_1d = types.float32[::1]
_f32_2d = types.float32[:, :]
_u16_1d = types.uint16[::1]
_i64 = types.int64
_i32 = types.int32


def _out_type(out_is_float32):
    return types.float32[:, ::1] if out_is_float32 else types.uint16[:, ::1]


@functools.lru_cache(maxsize=None)
def gemm_launcher(cfg, promotion, block_scaled, chain, out_is_float32):
    """The compiled GEMM (see ``gemm_kernel``): launch on grid (ceil(N / BN), ceil(M / BM)) of
    32 * wm * wn threads."""
    scale = _f32_2d if block_scaled else _f32_1d
    sig = (_u8_2d, _u8_2d, scale, _i64, scale, _i64, _u16_1d, _i32, _out_type(out_is_float32), _i32)
    return compile_kernel(gemm_kernel(cfg, promotion, block_scaled, chain), sig)


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
}
# By the H200 (benchmarks/bench_tensorcore.py, table 4b, M = 1): 4 warps with 2 chunks in flight
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

# activation modes: the decode GEMV's four (gemm_kernels.STAGE_*) and the 1 x 128 group one
MODE_CODES, MODE_STATIC, MODE_DYNAMIC, MODE_PER_TOKEN, MODE_PER_GROUP = 0, 1, 2, 3, 4
X_FLOAT32, X_FLOAT16, X_BFLOAT16 = 0, 1, 2
_F32_448 = np.float32(448.0)
_F32_GROUP_EPS = np.float32(1e-10)  # upstream per_token_group_quant_fp8's eps
_U32_16 = np.uint32(16)
_U32_LOW16 = np.uint32(0xFFFF)
_U32_HIGH16 = np.uint32(0xFFFF0000)
_FULL_MASK = 0xFFFFFFFF


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
    shared[0 .. rows). Every thread must call (it synchronizes the block)."""

    def block_max_rows(local, shared):
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

    return cuda.jit(**_DEVICE)(block_max_rows)


@functools.lru_cache(maxsize=None)
def gemv_kernel(nb, cfg, mode, block_scaled, hardware, chain):
    """The tensor-core decode GEMV for up to 8 * nb activation rows, in activation ``mode``, with
    hardware (inline-PTX) or portable loads and encoder, chaining C through the mma or not (see
    gemm_kernel)."""
    from . import codec
    from . import gemm_kernels as gk

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
    n_scratch = warps * mma.SCRATCH_WORDS_PER_WARP if SIMULATOR else 1
    if hardware:
        load16, half2 = gk._HW
    else:
        load16, half2 = gk._portable_load, gk._portable_half2
    load16_u16 = load16 if hardware else gk._portable_load_u16
    pair = codec.encode_pair("hardware" if hardware else "portable")
    finite_abs = codec.finite_abs
    from_bits = gk._PRIMITIVES.get("bits_float32", gk.bits_float32)
    mma_op, lds4 = mma.mma_e4m3, mma.lds_u32x4
    octet_max = _octet_max
    block_max_rows = _block_max_rows_fn(threads, x_rows)
    load_bias_value, finish, store = load_bias, scaled_value, store_out
    min_scale = np.float32(1.0) / (np.float32(448.0) * np.float32(512.0))

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
                row = min(n0 + 16 * r + 8 * h + g, n_total - 1)
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

    @cuda.jit(**_DEVICE)
    def load_x16(x, x_kind, row, k, vals):
        """vals[0 .. 16) = x[row, k .. k + 16) as float32 (x: the uint16 view of the rows)."""
        if x_kind == X_FLOAT32:
            for i in range(4):
                w0, w1, w2, w3 = load16_u16(x, row, 2 * k + 8 * i)
                vals[4 * i] = from_bits(w0)
                vals[4 * i + 1] = from_bits(w1)
                vals[4 * i + 2] = from_bits(w2)
                vals[4 * i + 3] = from_bits(w3)
        else:
            for i in range(2):
                w0, w1, w2, w3 = load16_u16(x, row, k + 8 * i)
                j = 8 * i
                if x_kind == X_FLOAT16:
                    vals[j], vals[j + 1] = half2(w0)
                    vals[j + 2], vals[j + 3] = half2(w1)
                    vals[j + 4], vals[j + 5] = half2(w2)
                    vals[j + 6], vals[j + 7] = half2(w3)
                else:  # bfloat16: the upper 16 bits of a float32
                    vals[j] = from_bits(w0 << _U32_16)
                    vals[j + 1] = from_bits(w0 & _U32_HIGH16)
                    vals[j + 2] = from_bits(w1 << _U32_16)
                    vals[j + 3] = from_bits(w1 & _U32_HIGH16)
                    vals[j + 4] = from_bits(w2 << _U32_16)
                    vals[j + 5] = from_bits(w2 & _U32_HIGH16)
                    vals[j + 6] = from_bits(w3 << _U32_16)
                    vals[j + 7] = from_bits(w3 & _U32_HIGH16)

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

    if block_scaled:
        @cuda.jit(**_DEVICE)
        def row_scale(scale, step, i):
            return _F32_ONE

        @cuda.jit(**_DEVICE)
        def kblock_scale(scale, i, kb):
            return scale[i, kb]
    else:
        @cuda.jit(**_DEVICE)
        def row_scale(scale, step, i):
            return scale[i * step]

        @cuda.jit(**_DEVICE)
        def kblock_scale(scale, i, kb):
            return _F32_ONE

    def gemv(a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
        """y[:M] = round_out(scaled (a or quantize(x)) @ b^T + bias); the arguments of
        gemm_kernels' GEMV (scale_a / scale_b [M, KB] / [NB, KB] when block-scaled)."""
        n_total, k_total = b.shape
        m_total = y.shape[0]
        nchunks = (k_total + CHUNK - 1) // CHUNK
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        t = lane % 4
        n0 = cuda.blockIdx.x * 16 * rt
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
        for i in range(n_acc):
            acc[i] = _F32_ZERO
            part[i] = _F32_ZERO

        # the first ring of weight loads goes out before anything waits
        for d in range(depth):
            load_slot(ring, d, a, b, n0, n_total, m_total, k_total, warp + d * warps, nchunks)

        row_words = (nchunks * CHUNK + 16) // 4
        gbase = m_total * row_words
        if fused:
            # -- the activation's per-tensor / per-token scales (a pass over x for its amax) ------
            if mode == MODE_STATIC and tid == 0:
                row_mult[0] = np.float32(_F32_ONE / qscale[0])
                row_deq[0] = qscale[0]
            if mode == MODE_DYNAMIC or mode == MODE_PER_TOKEN:
                for r in range(x_rows):
                    local[r] = _F32_ZERO
                k16 = k_total // 16
                for r in range(x_rows):
                    if r < m_total:
                        for cc in range(tid, k16, threads):
                            load_x16(x, x_kind, r, 16 * cc, vals)
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
            cuda.syncthreads()
            # -- quantize x into shared memory: 16 values an item, a group's 8 items in 8 lanes ----
            segs = 8 * nchunks
            items = m_total * segs
            for item0 in range(0, items, threads):
                item = item0 + tid
                valid = item < items
                m = item // segs if valid else 0
                sg = item - m * segs if valid else 0
                if valid and 16 * sg < k_total:
                    load_x16(x, x_kind, m, 16 * sg, vals)
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
                    encode16(vals, mult, divide, xs, m * row_words + 4 * sg)
            cuda.syncthreads()

        iters = (nchunks + warps - 1) // warps
        for round0 in range(0, iters, depth):
            for d in range(depth):
                it = round0 + d
                if it < iters:  # the same for every warp of the block
                    c = warp + it * warps
                    base = d * n_slot
                    # -- this chunk's activation words: xw[4 (2 i + s) + q] for n8 tile i, segment s
                    for i in range(nb):
                        if fused:
                            row = 8 * i + g
                            for s in range(2):
                                if row < m_total and c < nchunks:
                                    xw[8 * i + 4 * s], xw[8 * i + 4 * s + 1], xw[8 * i + 4 * s + 2], \
                                        xw[8 * i + 4 * s + 3] = lds4(xs, row * row_words + 32 * c + 16 * s + 4 * t)
                                else:
                                    for q in range(4):
                                        xw[8 * i + 4 * s + q] = _U32_ZERO
                        else:
                            for q in range(8):
                                xw[8 * i + q] = ring[base + n_wslot + 8 * i + q]
                    # -- the mmas: weight tile r x activation tile i, two per segment ----------------
                    for r in range(rt):
                        for i in range(nb):
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
                                    if block_scaled:
                                        if chain:
                                            part[q], part[q + 1], part[q + 2], part[q + 3] = mma_op(
                                                a0, a1, a2, a3, b0, b1, part[q], part[q + 1], part[q + 2],
                                                part[q + 3], scratch, warp, lane)
                                        else:
                                            d0, d1, d2, d3 = mma_op(a0, a1, a2, a3, b0, b1, _F32_ZERO, _F32_ZERO,
                                                                    _F32_ZERO, _F32_ZERO, scratch, warp, lane)
                                            part[q] += d0
                                            part[q + 1] += d1
                                            part[q + 2] += d2
                                            part[q + 3] += d3
                                    elif chain:
                                        acc[q], acc[q + 1], acc[q + 2], acc[q + 3] = mma_op(
                                            a0, a1, a2, a3, b0, b1, acc[q], acc[q + 1], acc[q + 2], acc[q + 3],
                                            scratch, warp, lane)
                                    else:
                                        d0, d1, d2, d3 = mma_op(a0, a1, a2, a3, b0, b1, _F32_ZERO, _F32_ZERO,
                                                                _F32_ZERO, _F32_ZERO, scratch, warp, lane)
                                        acc[q] += d0
                                        acc[q + 1] += d1
                                        acc[q + 2] += d2
                                        acc[q + 3] += d3
                    if block_scaled:
                        # the chunk is the K block: acc += (P * sa[m, kb]) * sb[n // 128, kb]
                        kb = min(c, nchunks - 1)
                        for i in range(nb):
                            m0 = min(8 * i + 2 * t, m_total - 1)
                            m1 = min(8 * i + 2 * t + 1, m_total - 1)
                            if mode == MODE_PER_GROUP:
                                sa0 = gs[gbase + m0 * nchunks + kb]
                                sa1 = gs[gbase + m1 * nchunks + kb]
                            else:
                                sa0 = kblock_scale(scale_a, m0, kb)
                                sa1 = kblock_scale(scale_a, m1, kb)
                            for r in range(rt):
                                sbv = kblock_scale(scale_b, min(n0 + 16 * r + g, n_total - 1) // 128, kb)
                                q = 4 * (r * nb + i)
                                acc[q] += np.float32(part[q] * sa0) * sbv
                                acc[q + 1] += np.float32(part[q + 1] * sa1) * sbv
                                acc[q + 2] += np.float32(part[q + 2] * sa0) * sbv
                                acc[q + 3] += np.float32(part[q + 3] * sa1) * sbv
                                for e in range(4):
                                    part[q + e] = _F32_ZERO
                    # refill this slot: the chunk depth steps ahead
                    load_slot(ring, d, a, b, n0, n_total, m_total, k_total, c + depth * warps, nchunks)

        # -- the warps' partial sums, in warp order; then the epilogue ---------------------------
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
            n = n0 + 16 * r + ln // 4 + 8 * (e // 2)
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

    return gemv


_u16_2d = types.uint16[:, :]


@functools.lru_cache(maxsize=None)
def gemv_launcher(m, cfg, mode, block_scaled, hardware, chain, out_is_float32):
    """The compiled tensor-core GEMV for M activation rows: launch on ceil(N / (16 rt)) blocks of
    32 * warps threads."""
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"m must be in 1..{GEMV_MAX_M} for the tensor-core GEMV, got {m}")
    nb = 1 if m <= 8 else 2
    scale = _f32_2d if block_scaled else _f32_1d
    sig = (_u8_2d, _u16_2d, _i32, _f32_1d, _u8_2d, scale, _i64, scale, _i64, _u16_1d, _i32,
           _out_type(out_is_float32), _i32)
    return compile_kernel(gemv_kernel(nb, cfg, mode, block_scaled, hardware, chain), sig)


# ------------------------------------------------------------------------------------------------
# host side: capability, kernel choice per device, and the kernels in gemm.py's selection style


def chains_in_float32(cc):
    """Whether the FP8 mma adds its C operand in float32 after each k32 product on ``cc``: on sm_90
    ptxas lowers mma.m16n8k32.e4m3 to an e4m3 -> f16 unpack, two chained HMMA.16816.F32 from zero,
    then one FADD of C (cuobjdump of this module's kernels), so passing the accumulator as C is
    promotion per mma, bit for bit (tests/test_tensorcore_gpu.py checks it against the explicit
    form). Elsewhere (sm_89, sm_12x: native FP8 mma) the hardware's own accumulation is not
    documented, so the explicit form runs."""
    return tuple(cc) == (9, 0)


def unavailable_reason(simulate=False):
    """Why the tensor-core kernels cannot run here (None when they can). Under the CUDA simulator
    they run only when asked to (``simulate=True``): the portable emulation is for tests."""
    if SIMULATOR:
        return None if simulate else ("the tensor-core kernels run under the CUDA simulator only through their "
                                      "portable emulation (simulate=True)")
    from . import gemm

    cc = gemm._compute_capability()
    if not mma.available(cc):
        return f"FP8 mma.sync needs compute capability >= {mma.MIN_CC}, got {cc}"
    return None


def _rows_reason(arr, name):
    """Why a 2-D operand cannot be copied 16 bytes at a time (None when it can)."""
    if SIMULATOR:
        return None
    if arr.strides[1] != 1 or arr.strides[0] % 16 or arr.data.ptr % 16:
        return (f"the tensor-core kernels copy 16 bytes at a time: {name} needs 16-byte aligned rows "
                f"(contiguous K, row stride % 16 == 0)")
    return None


def _shape_reason(call):
    if call.k % 16:
        return f"the tensor-core kernels need K to be a multiple of 16, got K = {call.k}"
    return _rows_reason(call.a, "a") or _rows_reason(call.b, "b")


def _device_flags():
    """(hardware loads and encoder, chain C) for the current device."""
    if SIMULATOR:
        return False, False
    from . import gemm
    from .gemm_kernels import hardware_path_available

    cc = gemm._compute_capability()
    return hardware_path_available(cc), chains_in_float32(cc)


def _launch_gemm(a, b, scale_a, sa_step, scale_b, sb_step, out_dtype, bias, block_scaled, promotion, config):
    from . import gemm

    m, n = a.shape[0], b.shape[0]
    y, y_bits = gemm._empty_out(m, n, out_dtype)
    bias_bits, bias_kind = gemm._bias_bits(bias)
    _, chain = _device_flags()
    cfg = config or GEMM_DEFAULT
    bm, bn = tile_shape(cfg)
    gemm_launcher(cfg, promotion, block_scaled, chain, out_dtype == np.float32)(
        (-(-n // bn), -(-m // bm)), 32 * cfg.wm * cfg.wn, a, b, scale_a, sa_step, scale_b, sb_step,
        bias_bits, bias_kind, y_bits, gemm._OUT_KIND[np.dtype(out_dtype)])
    return y


class TensorCoreGemm:
    """The tiled tensor-core GEMM as a kernel of ``gemm.select``: per-tensor and per-row x
    per-channel scales (``gemm.GemmCall``)."""

    name = "tensorcore"

    def __init__(self, promotion=PER_MMA, config=None, simulate=False):
        if promotion not in PROMOTIONS:
            raise ValueError(f"promotion must be one of {PROMOTIONS}, got {promotion!r}")
        self.promotion, self.config, self.simulate = promotion, config, simulate

    def can_implement(self, call):
        reason = unavailable_reason(self.simulate) or _shape_reason(call)
        return (False, reason) if reason else (True, "")

    def run(self, call):
        return _launch_gemm(call.a, call.b, call.scale_a, call.sa_step, call.scale_b, call.sb_step, call.out_dtype,
                            call.bias, False, self.promotion, self.config)


def _gemv_cfg(config, m, k):
    return config or gemv_config(m, k)


def _launch_gemv(m, a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, out_dtype, bias, mode,
                 block_scaled, config, out=None):
    """Launch the GEMV for M activation rows into ``out`` ((y, the bits view it writes); new if None)."""
    from . import gemm

    n = b.shape[0]
    y, y_bits = gemm._empty_out(m, n, out_dtype) if out is None else out
    bias_bits, bias_kind = gemm._bias_bits(bias)
    hardware, chain = _device_flags()
    cfg = _gemv_cfg(config, m, b.shape[1])
    shared = 0 if mode == MODE_CODES else fused_shared_bytes(m, b.shape[1])
    gemv_launcher(m, cfg, mode, block_scaled, hardware, chain, out_dtype == np.float32)(
        -(-n // (16 * cfg.rt)), 32 * cfg.warps, a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step,
        bias_bits, bias_kind, y_bits, gemm._OUT_KIND[np.dtype(out_dtype)], shared_mem=shared)
    return y


class TensorCoreGemv:
    """The tensor-core decode GEMV (M <= 16, codes in) as a kernel of ``gemm.select``."""

    name = "tensorcore_gemv"

    def __init__(self, config=None, simulate=False):
        self.config, self.simulate = config, simulate

    def can_implement(self, call):
        if call.m > GEMV_MAX_M:
            return False, f"the tensor-core GEMV takes M <= {GEMV_MAX_M}, got M = {call.m}"
        reason = unavailable_reason(self.simulate) or _shape_reason(call)
        return (False, reason) if reason else (True, "")

    def run(self, call):
        from . import gemm

        return _launch_gemv(call.m, call.a, gemm._placeholder("u16_2d"), 0, gemm._placeholder("f32"), call.b,
                            call.scale_a, call.sa_step, call.scale_b, call.sb_step, call.out_dtype, call.bias,
                            MODE_CODES, False, self.config)


def _block_scales(scale_a, scale_b, m, n, k):
    """The block scales as float32 2-D arrays: scale_a [M, ceil(K/128)], scale_b [ceil(N/128),
    ceil(K/128)] (checked here: these entry points are not behind ops.py yet)."""
    kb = -(-k // 128)
    _check_block_scale(scale_a, "scale_a", (m, kb))
    _check_block_scale(scale_b, "scale_b", (-(-n // 128), kb))
    return scale_a, scale_b


def _check_block_scale(s, name, shape):
    if tuple(s.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} for 128 x 128 blocks, got {tuple(s.shape)}")
    if np.dtype(s.dtype) != np.float32:
        raise TypeError(f"{name} must be float32, got {s.dtype}")


def scaled_mm_blockwise(a, b, scale_a, scale_b, out_dtype=np.float32, bias=None, *, promotion=PER_MMA,
                        config=None, simulate=False):
    """DESIGN.md's block-scaled GEMM on tensor cores: ``y[m, n] = bias[n] + sum_kb (P[m, n, kb] *
    scale_a[m, kb]) * scale_b[n // 128, kb]``, P the float32 sum of the products in K block kb
    (128 wide); scale_a per 1 x 128 activation group [M, ceil(K/128)], scale_b per 128 x 128 weight
    block [ceil(N/128), ceil(K/128)], both float32 (any strides). M <= 16 runs the decode GEMV."""
    reason = unavailable_reason(simulate)
    if reason:
        raise RuntimeError(reason)
    m, k = a.shape
    n = b.shape[0]
    scale_a, scale_b = _block_scales(scale_a, scale_b, m, n, k)
    if k % 16:
        raise ValueError(f"K must be a multiple of 16 for the tensor-core kernels, got {k}")
    for name, arr in (("a", a), ("b", b)):
        why = _rows_reason(arr, name)
        if why:
            raise ValueError(why)
    out_dtype = np.dtype(out_dtype)
    if m <= GEMV_MAX_M:
        from . import gemm

        return _launch_gemv(m, a, gemm._placeholder("u16_2d"), 0, gemm._placeholder("f32"), b, scale_a, 0,
                            scale_b, 0, out_dtype, bias, MODE_CODES, True, None)
    return _launch_gemm(a, b, scale_a, 0, scale_b, 0, out_dtype, bias, True, promotion, config)


def fp8_linear(x, b, scale_b, input_scale=None, *, per_token=False, scale_ub=None, weight_block_scales=None,
               out_dtype=np.float32, bias=None, config=None, simulate=False):
    """One FP8 linear layer at decode (M <= 16) in ONE launch: the tensor-core GEMV quantizes the
    float activation x [M, K] as it reads it, then multiplies with the e4m3 weight b [N, K].

    Per-tensor / per-channel weight scale ``scale_b`` (scalar or [N]), activation: ``input_scale``
    given -> static per-tensor; None -> dynamic per-tensor; ``per_token`` -> dynamic per row
    (``scale_ub`` caps amax). With ``weight_block_scales`` [ceil(N/128), ceil(K/128)] (then
    ``scale_b`` must be None): 1 x 128 group activations, ``scale = max(amax_group, 1e-10) / 448``
    and ``codes = encode(x / scale)`` (upstream's per_token_group_quant_fp8), block-scaled GEMM.
    Semantics and arguments as ``gemm.fp8_linear``; x float32 / float16 / bfloat16."""
    from .. import _arrays, ops
    from . import gemm

    reason = unavailable_reason(simulate)
    if reason:
        raise RuntimeError(reason)
    if len(x.shape) != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    m, k = x.shape
    n = b.shape[0]
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"x must have 1..{GEMV_MAX_M} rows for the fused decode layer, got {m}")
    if k % 16:
        raise ValueError(f"K must be a multiple of 16 for the tensor-core kernels, got {k}")
    why = _rows_reason(b, "b")
    if why:
        raise ValueError(why)
    x_kind = gemm._X_KIND[_arrays.float_dtype(x, "x")]
    out_dtype = np.dtype(out_dtype)
    xp = gemm._xp()
    x = xp.ascontiguousarray(x)
    if not SIMULATOR and x.data.ptr % 16:
        x = x.copy()
    x_bits = x.view(np.uint16)
    if weight_block_scales is not None:
        if scale_b is not None or input_scale is not None or per_token:
            raise ValueError("weight_block_scales takes 1 x 128 group activations: scale_b, input_scale and "
                             "per_token must be unset")
        _check_block_scale(weight_block_scales, "weight_block_scales", (-(-n // 128), -(-k // 128)))
        rows = _fused_rows(k, MODE_PER_GROUP, config)  # the rows one launch stages in shared memory
        if rows == 0:
            raise ValueError(f"K must be at most {_max_fused_k(config)} for the fused group-quantized GEMV, got {k}")
        return _fused_in_slices(m, rows, x_bits, x_kind, gemm._placeholder("f32"), b, weight_block_scales[:1, :1],
                                weight_block_scales, 0, out_dtype, bias, MODE_PER_GROUP, True, config)
    sb, sb_step = gemm._scale(ops._mm_scale(scale_b, "scale_b", n), n)
    dynamic = input_scale is None and not per_token
    rows = _fused_rows(k, MODE_PER_TOKEN if per_token else MODE_DYNAMIC if dynamic else MODE_STATIC, config)
    if rows == 0 or ((per_token or dynamic) and m > FUSED_AMAX_MAX_M) or (dynamic and rows < m):
        # quantize once, then the codes GEMV: x does not fit in shared memory, or every block would
        # read many rows of x for their amax (a per-tensor amax must also see every row at once)
        q = ops.quantize_fp8(x, input_scale, per_token=per_token, scale_ub=scale_ub)
        sa, sa_step = gemm._scale(q.scale.reshape(-1), m)
        return _launch_gemv(m, q.data, gemm._placeholder("u16_2d"), 0, gemm._placeholder("f32"), b, sa, sa_step,
                            sb, sb_step, out_dtype, bias, MODE_CODES, False, config)
    if per_token:
        mode = MODE_PER_TOKEN
        qscale = gemm.device_scalar(0.0 if scale_ub is None else ops.quant_scale(scale_ub, "scale_ub"))
    elif dynamic:
        mode, qscale = MODE_DYNAMIC, gemm.device_scalar(1.0)
    else:
        mode = MODE_STATIC
        s = ops.quant_scale(input_scale, "input_scale")
        qscale = s.reshape(1) if hasattr(s, "__cuda_array_interface__") else gemm.device_scalar(s)
    return _fused_in_slices(m, rows, x_bits, x_kind, qscale, b, gemm._placeholder("f32"), sb, sb_step, out_dtype,
                            bias, mode, False, config)


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
        static = gemv_static_shared_bytes(nb, _gemv_cfg(config, rows, k), mode)
        if fused_shared_bytes(rows, k) + static <= FUSED_SHARED_LIMIT:
            return rows
    return 0


def _max_fused_k(config):
    k = CHUNK
    while _fused_rows(k + CHUNK, MODE_PER_GROUP, config):
        k += CHUNK
    return k


def _fused_in_slices(m, rows, x_bits, x_kind, qscale, b, scale_a, scale_b, sb_step, out_dtype, bias, mode,
                     block_scaled, config):
    """The fused GEMV over x's rows, ``rows`` at a time (rows are independent in these modes)."""
    from . import gemm

    y, y_bits = gemm._empty_out(m, b.shape[0], out_dtype)
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        _launch_gemv(r1 - r0, gemm._placeholder("u8_2d"), x_bits[r0:r1], x_kind, qscale, b, scale_a, 0, scale_b,
                     sb_step, out_dtype, bias, mode, block_scaled, config, out=(y[r0:r1], y_bits[r0:r1]))
    return y


__all__ = ["PER_MMA", "PER_128", "PROMOTIONS", "TileConfig", "GemvConfig", "GEMM_CONFIGS", "GEMM_DEFAULT",
           "GEMV_CONFIGS", "gemv_config", "GEMV_MAX_M", "TensorCoreGemm", "TensorCoreGemv", "scaled_mm_blockwise",
           "fp8_linear", "fused_shared_bytes", "chains_in_float32", "unavailable_reason", "gemm_launcher", "gemv_launcher", "tile_shape"]
