"""The tiled FP8 GEMM on tensor cores, from Numba (``mma.sync`` through inline PTX, mma.py).

It computes DESIGN.md's ``y = round_out((sum_k dec(a) dec(b)) * sa * sb + bias)`` (or the
block-scaled form) with the epilogue of epilogue.py (``scaled_value``, ``load_bias``,
``store_out``), and holds the strict G3 bound where cuBLASLt misses it by up to 16x. It is the
Numba path behind the lever (VT_DENSE_CUBLASLT_FP8=0) and for shapes cuBLASLt refuses; the decode
GEMV on tensor cores is tc_gemv.py.

Design
------
- ``gemm_kernel``: a block computes a BM x BN tile with WM x WN warps of MT m16 x NT n8
  mma tiles; K advances 64 codes a stage, copied by ``cp.async.cg`` 16 bytes a thread into a
  3-deep shared ring (static 48 KB); chunk c of a 64-byte shared row sits at c ^ ((row >> 1) & 3),
  so the copies and the ``ldmatrix.x4`` fragment reads are bank-conflict free. Rows past M / N and
  chunks past K are zero-filled by the copy (zero codes are exact zeros). Any M, N; K % 16 == 0
  and 16-byte aligned rows (else the caller falls back to the CUDA-core kernel).
- ``tile``: one BM x BN tile of y at (m0, n0), rows from m_total on left alone. The dense kernel
  runs the tile of its block's place; the grouped kernel (a mixture's experts, ``grouped=True``)
  reads its block's (expert, first row, end row) from a tile map kernels/moe.py makes on the device
  and runs the same tile on that expert's weight ``b[e]`` and scales: each expert's rows are the
  dense kernel's on that expert, bit for bit. sm90_wgmma_gemm.py's kernels take the same two forms
  (``tile_kernel``).
- Block scales (128 x 128 weights, 1 x 128 activation groups): the partial P of each 128-wide K
  block is promoted as ``acc += (P * sa[m, kb]) * sb[n // 128, kb]`` (upstream's order).
- f16 staging (``TileConfig.f16``: "a", "b" or "ab"; sm_90 only, see ``default_config``): the
  staged operands are converted once per block into double-buffered f16 tiles in dynamic shared
  memory (e4m3 -> f16 is exact) and the warps run the native ``mma.m16n8k16`` f16 HMMA; the other
  operand, if any, is converted from e4m3 fragments in registers. Each k32 step issues the same
  two HMMAs and float32 add that ptxas makes of the e4m3 mma on sm_90, so promotion per mma keeps
  its meaning and its bits (the comment above ``GEMM_CONFIGS`` has the details).

Promotion (measured on the H200, benchmarks/gpu/bench_tensorcore.py, 2026-11-30)
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
  conversion): wg_gemm.py, 0.5x cuBLASLt with promotion per 128 of K -- within the tensor-core bound,
  not strict G3, which is why this kernel stays the lever's path.
- f16 staging, timed on the H200 (2026-11-30 17:47 UTC, benchmarks/gpu/bench_tensorcore.py gemm): every
  f16-staged configuration was slower than the e4m3 kernel's 550 us at 4096^3 -- 593 us (one operand
  staged, 64 x 64 warp tiles) to 679 us -- and 930-1,039 against 988 us block-scaled; bit for bit
  the e4m3 kernel's result (262,144 of 262,144 elements at K = 256 and 4096). Cutting the
  conversions to a third did not pay: the SASS counts per SM and 64-wide K tile put the staged
  kernels at ~1,150-1,280 clocks of shared-memory traffic (each staged byte copied, read and written
  again as f16, the f16 ldmatrix reads doubled) against the conversions they save, so the tile
  pipeline stays bound near where it was. The e4m3 kernel stays the default (F16_DEFAULT below);
  the staged ones stay selectable for the next attempt (wgmma).
"""

import functools
from collections import namedtuple

import numpy as np

from ..ptx import mma
from ..ptx.codec import decode_e8m0, fill
from ..ptx.target import DEVICE_INLINE, SIMULATOR, cuda, types
from ..runtime.launch import compile_kernel
from . import sm120_block_scaled as sm120
from .epilogue import OUT_KIND, bias_bits, load_bias, scaled_value, store_out

# Promotion: how often the tensor core's partial sum moves into float32 registers the kernel adds.
PER_MMA, PER_128 = "per_mma", "per_128"
PROMOTIONS = (PER_MMA, PER_128)

# Which mma a kernel issues, and with what scales (DESIGN.md, "MXFP8"):
# - "plain": ``mma.sync...e4m3.e4m3.f32`` (sm_89 and newer);
# - "unit", "mx": sm_12x's block-scaled ``kind::mxf8f6f4`` mma, with unit scales for the plain
#   kernel's arithmetic at that instruction's rate, or with MXFP8 operands' real scales: what differs
#   lives in sm120_block_scaled.py (the mma, the MX step, the sm_120a / sm_121a target);
# - "mx_explicit": MXFP8 operands on the plain mma (sm_89, sm_90): each k32 block's P from C = 0, then
#   ``acc += (P * sa) * sb`` in float32 -- the block-scaled contract's order, exact multiplies.
MMA_KINDS = ("plain", *sm120.KINDS, "mx_explicit")
MX_KINDS = ("mx", "mx_explicit")

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

TileConfig = namedtuple("TileConfig", "mt nt wm wn stages ldmatrix f16", defaults=("",))
TileConfig.__doc__ = """A tile configuration: MT x NT mma tiles per warp, WM x WN warps, a STAGES deep
cp.async ring, fragments by ldmatrix (else 32-bit shared loads); ``f16``: the operands staged in
f16 shared memory ("a", "b" or "ab"; "" runs the e4m3 mma), see below."""
BK = 64  # codes per row per stage
ROW_WORDS = BK // 4
F16_ROW_WORDS = BK // 2  # an f16 row of a stage: 128 bytes, eight 16-byte chunks
SHARED_LIMIT = 48 * 1024  # static shared memory: no opt-in attribute needed
F16_SHARED_LIMIT = 227 * 1024  # dynamic shared memory per block with the opt-in (sm_90; sm_89: 99 KB)

# f16 staging (``f16`` non-empty). The FP8 mma is not native on sm_90 (module docstring): each warp
# converts the e4m3 fragments it reads, so a byte is converted once per warp that reads it (A by WN
# warps, B by WM warps). A staged operand is instead converted once per block: the cp.async ring
# still lands e4m3 codes, then each thread converts the 16-byte chunks it copied itself (its own
# cp.async.wait_group makes them visible to it: no barrier) into f16 rows of a double-buffered f16
# tile, and the warps read f16 fragments of it with ldmatrix. An operand not staged is read from the
# ring as e4m3 fragments and converted in registers. Either way the warps run the native f16
# ``mma.m16n8k16``. Iteration kt converts tile kt + 1 and computes tile kt between one pair of
# barriers, so one warp's conversions overlap another's mma. Staging trades conversions for shared
# memory traffic (a staged k16 row: 16 bytes copied, read, 32 written, and 32 per ldmatrix read,
# against 16 per read unstaged), hence the one-operand variants.
#
# An f16 row is 128 bytes, eight chunks; chunk c of row r is stored at c ^ (r & 7): conflict-free
# for ldmatrix (8 consecutive rows) and for the conversion's 16-byte stores (a phase of 8 threads:
# 2 rows x 4 source chunks, one parity each). A 16-code chunk c converts with one
# cvt.rn.f16x2.e4m3x2 per code pair, no byte shuffles: f16 chunk 2c holds the lower pair of each
# 4-code word (codes 16c + 4t + {0, 1} at k' = 2t + {0, 1}), chunk 2c + 1 the upper pair. Each k32
# step runs two HMMAs, the first on the lower pairs, the second on the upper ones -- the split
# ptxas's own lowering of the e4m3 mma makes on sm_90 (cuobjdump: the first HMMA reads the F2FP of
# every register's low half, the second of its .H1 half) -- which is also what converting an e4m3
# ldmatrix fragment in registers gives. A and B use the same order, so each product pairs the same
# codes (mma.py).
#
# Promotion: per_mma runs the two k16 HMMAs of each k32 step from C = 0 (the second adding the
# first's result), then adds that partial in float32 -- the arithmetic ptxas emits for the e4m3 mma
# with the accumulator as C on sm_90. per_128 (and block scales) chain the K block's partial through
# the HMMAs and promote it once per 128 of K; ``chain`` with per_mma chains the accumulator through
# every HMMA (no float32 add at all: the tensor core's accumulation, measured, not claimed).

# Measured at 4096^3 on the H200 (us, per_mma): 547 / 594 / 547 / 573 / 523 / 581 for the first six
# (e4m3) in this order. The default stays the 128 x 128 tile the GPU tests ran on, and whose BN
# divides the 128-wide weight blocks (128 x 96 was 4% faster and does not).
GEMM_CONFIGS = {
    "128x128_w8_32x64": TileConfig(mt=2, nt=8, wm=4, wn=2, stages=3, ldmatrix=True),
    "128x128_w8_64x32": TileConfig(mt=4, nt=4, wm=2, wn=4, stages=3, ldmatrix=True),
    "128x128_w4_64x64": TileConfig(mt=4, nt=8, wm=2, wn=2, stages=3, ldmatrix=True),
    "128x128_w8_32x64_lds": TileConfig(mt=2, nt=8, wm=4, wn=2, stages=3, ldmatrix=False),
    "128x96_w4_64x48": TileConfig(mt=4, nt=6, wm=2, wn=2, stages=3, ldmatrix=True),
    "128x192_w8_64x48_s2": TileConfig(mt=4, nt=6, wm=2, wn=4, stages=2, ldmatrix=True),
    "f16ab_128x128_w8_32x64": TileConfig(mt=2, nt=8, wm=4, wn=2, stages=3, ldmatrix=True, f16="ab"),
    "f16b_128x128_w8_32x64": TileConfig(mt=2, nt=8, wm=4, wn=2, stages=4, ldmatrix=True, f16="b"),
    "f16ab_128x128_w4_64x64": TileConfig(mt=4, nt=8, wm=2, wn=2, stages=3, ldmatrix=True, f16="ab"),
    "f16b_128x128_w4_64x64": TileConfig(mt=4, nt=8, wm=2, wn=2, stages=4, ldmatrix=True, f16="b"),
    "f16ab_128x256_w8_64x64": TileConfig(mt=4, nt=8, wm=2, wn=4, stages=3, ldmatrix=True, f16="ab"),
    "f16a_128x256_w8_64x64": TileConfig(mt=4, nt=8, wm=2, wn=4, stages=4, ldmatrix=True, f16="a"),
    "f16ab_256x128_w8_64x64": TileConfig(mt=4, nt=8, wm=4, wn=2, stages=3, ldmatrix=True, f16="ab"),
    "f16b_256x128_w8_64x64": TileConfig(mt=4, nt=8, wm=4, wn=2, stages=4, ldmatrix=True, f16="b"),
    "16x32_w2_16x16": TileConfig(mt=1, nt=2, wm=1, wn=2, stages=4, ldmatrix=True),  # MXFP8 at small M
    "32x64_w4_32x16": TileConfig(mt=2, nt=2, wm=1, wn=4, stages=4, ldmatrix=True),
    "sim_32x16": TileConfig(mt=1, nt=2, wm=2, wn=1, stages=2, ldmatrix=True),  # tiny, for the simulator
    "sim_32x16_lds": TileConfig(mt=1, nt=2, wm=2, wn=1, stages=2, ldmatrix=False),
    "sim_32x16_f16ab": TileConfig(mt=1, nt=2, wm=2, wn=1, stages=2, ldmatrix=True, f16="ab"),
    "sim_32x16_f16a": TileConfig(mt=1, nt=2, wm=2, wn=1, stages=3, ldmatrix=True, f16="a"),
    "sim_32x16_f16b": TileConfig(mt=1, nt=2, wm=2, wn=1, stages=2, ldmatrix=True, f16="b"),
}
GEMM_DEFAULT = GEMM_CONFIGS["sim_32x16" if SIMULATOR else "128x128_w8_32x64"]
# The f16-staged defaults, sm_90 only (see default_config). None -- the e4m3 default there too: on
# the H200 every f16-staged configuration was slower (module docstring; benchmarks/gpu/bench_tensorcore.py
# gemm prints the fastest of each kind after table 1).
F16_DEFAULT = None
F16_SPLIT_DEFAULT = None  # with a K-block partial (per_128, block scales): 32 x 64 warp tiles, BN | 128


# MXFP8's tile by M, the first whose limit holds (the 128 x 128 default beyond). At M = 1 the default
# gives N / 128 blocks, a quarter of the H200's SMs for N = 4096, each running eight m16 tiles for
# one real row. On the H200 (benchmarks/gpu/bench_mx_gpu.py --configs, Llama-3-8B's shapes, every tile's
# output bit for bit the default's): 16 x 32 took 36-124 us at M = 1 .. 16 where the default took
# 246-828; 32 x 64 took 115-375 at M = 256 against 247-812.
MX_CONFIGS_BY_M = ((64, "16x32_w2_16x16"), (256, "32x64_w4_32x16"))


def mx_config(m):
    """The tile configuration of an MXFP8 GEMM of ``m`` rows (``MX_CONFIGS_BY_M``)."""
    for limit, name in MX_CONFIGS_BY_M:
        if m <= limit:
            return GEMM_CONFIGS[name]
    return GEMM_DEFAULT


def default_config(cc, split):
    """The configuration ``gemm_launch`` runs on compute capability ``cc`` (``split``: per_128 or
    block scales, which keep a K-block partial beside the accumulator). f16 staging on sm_90, where
    the FP8 mma is converted to f16 HMMAs anyway; the e4m3 mma elsewhere: native FP8 on sm_89 and
    sm_12x, whose 99 KB of shared memory per block would not hold the f16 tiles either."""
    f16 = F16_SPLIT_DEFAULT if split else F16_DEFAULT
    return GEMM_CONFIGS[f16] if f16 and not SIMULATOR and tuple(cc) == (9, 0) else GEMM_DEFAULT


def tile_shape(cfg):
    return cfg.wm * cfg.mt * 16, cfg.wn * cfg.nt * 8


def shared_bytes(cfg):
    """(static, dynamic) shared memory of a configuration's kernel, in bytes: the f16-staged kernel
    keeps its e4m3 ring and two f16 tiles of the staged operands in dynamic shared memory."""
    bm, bn = tile_shape(cfg)
    ring = cfg.stages * (bm + bn) * BK
    staged = bm * ("a" in cfg.f16) + bn * ("b" in cfg.f16)
    return (0, ring + 2 * staged * BK * 2) if cfg.f16 else (ring, 0)


def _check_config(cfg, block_scaled):
    bm, bn = tile_shape(cfg)
    threads = 32 * cfg.wm * cfg.wn
    if (bm * 4) % threads or (bn * 4) % threads:
        raise ValueError(f"tile {bm} x {bn} must split into 16-byte copies evenly over {threads} threads")
    if cfg.ldmatrix and cfg.nt % 2:
        raise ValueError(f"ldmatrix loads B fragments two n8 tiles at a time: nt must be even, got {cfg.nt}")
    if cfg.f16 not in ("", "a", "b", "ab"):
        raise ValueError(f"f16 must be one of '', 'a', 'b', 'ab', got {cfg.f16!r}")
    if cfg.f16 and not cfg.ldmatrix:
        raise ValueError("the f16-staged kernel reads its fragments with ldmatrix: ldmatrix must be True")
    static, dynamic = shared_bytes(cfg)
    if static > SHARED_LIMIT or dynamic > F16_SHARED_LIMIT:
        raise ValueError(
            f"{cfg.stages} stages of {bm} x {bn} tiles exceed "
            f"{F16_SHARED_LIMIT if cfg.f16 else SHARED_LIMIT} bytes of shared memory"
        )
    if block_scaled and 128 % bn:
        raise ValueError(f"block-scaled tiles must divide the 128-wide weight blocks: BN = {bn}")
    return bm, bn, threads


def _split_accumulators(promotion, block_scaled):
    """Whether the kernel keeps a K-block partial beside the accumulator."""
    return promotion == PER_128 or block_scaled


@functools.cache
def scale_readers(block_scaled):
    """(row_scale(scale, step, i), kblock_scale(scale, i, kb)) device functions: per-tensor and
    per-row x per-channel scales are read at the end (``scale[i * step]``), block scales at each
    K-block's promotion (``scale[i, kb]``); each form reads 1.0 where the other applies."""
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

    return row_scale, kblock_scale


@functools.cache
def explicit_mx_step_functions(mt, nt):
    """(n_scales, mx_scales, mx_step): the MX step of ``gemm_kernel`` for a warp tile of MT m16 x NT
    n8 mma tiles on the plain mma (sm_89, sm_90; sm120_block_scaled.mx_step_functions is sm_12x's,
    with the same signatures)."""
    mma_e4m3 = mma.mma_e4m3

    @cuda.jit(**_DEVICE)
    def mx_scales(kb, mx_ctx):
        """MX on the plain mma: the E8M0 scales of K block ``kb`` that this lane's mma steps use, read
        from global memory and decoded once per k32 step rather than once per mma (a warp tile's
        mt x nt mmas share mt row pairs and nt column pairs). Into ``sc`` (mx_ctx's last item; rows
        and columns past the edge read the last one's scales: their codes are zero-filled, their
        outputs not stored): sc[2 i], sc[2 i + 1] the scales of rows r, r + 8 of m16 tile i,
        sc[2 mt + 2 j], sc[2 mt + 2 j + 1] of columns c, c + 1 (c = 8 j + 2 t) of n8 tile j."""
        scale_a, scale_b, row0, col0, m_last, n_last, g, t, sc = mx_ctx
        for i in range(mt):
            r = row0 + 16 * i
            sc[2 * i] = decode_e8m0(scale_a[min(r, m_last), kb])
            sc[2 * i + 1] = decode_e8m0(scale_a[min(r + 8, m_last), kb])
        for j in range(nt):
            c = col0 + 8 * j + 2 * t
            sc[2 * mt + 2 * j] = decode_e8m0(scale_b[min(c, n_last), kb])
            sc[2 * mt + 2 * j + 1] = decode_e8m0(scale_b[min(c + 1, n_last), kb])

    @cuda.jit(**_DEVICE)
    def mx_step(acc, af, bf, q, i, j, sc, scratch, warp, lane):
        """MX on the plain mma: output tile q (m16 tile i, n8 tile j) times one K block: D of each
        output from C = 0, scaled by its row's and its column's scale (``sc``, from ``mx_scales``),
        added in float32."""
        d0, d1, d2, d3 = mma_e4m3(
            af[0],
            af[1],
            af[2],
            af[3],
            bf[2 * j],
            bf[2 * j + 1],
            _F32_ZERO,
            _F32_ZERO,
            _F32_ZERO,
            _F32_ZERO,
            scratch,
            warp,
            lane,
        )
        sa0, sa1 = sc[2 * i], sc[2 * i + 1]
        sb0, sb1 = sc[2 * mt + 2 * j], sc[2 * mt + 2 * j + 1]
        acc[q] += np.float32(d0 * sa0) * sb0
        acc[q + 1] += np.float32(d1 * sa0) * sb1
        acc[q + 2] += np.float32(d2 * sa1) * sb0
        acc[q + 3] += np.float32(d3 * sa1) * sb1

    return 2 * (mt + nt), mx_scales, mx_step


@functools.cache
def gemm_kernel(cfg, promotion, block_scaled, chain, mma_kind="plain", grouped=False):
    """The tiled tensor-core GEMM for one tile configuration, promotion and scale layout. ``chain``
    (per-mma promotion only): pass the accumulator as the mma's C instead of C = 0 and a float32
    add -- on the e4m3 kernel the same arithmetic where the mma itself adds C in float32 after each
    k32 product (sm_90, see ``chains_in_float32``), with half the adds; on the f16-staged kernel
    the tensor core's own accumulation through every k16 HMMA (no float32 add). ``mma_kind``: see
    MMA_KINDS; the MX kinds take E8M0 scales uint8 [M, ceil(K / 32)] and [N, ceil(K / 32)] (one weight
    scale per row and 32 of K) and promote per mma. ``grouped``: the kernel of a grouped GEMM (the
    experts of a mixture, ``grouped_gemm`` below) instead, each tile that of one expert."""
    if promotion not in PROMOTIONS:
        raise ValueError(f"promotion must be one of {PROMOTIONS}, got {promotion!r}")
    if mma_kind not in MMA_KINDS:
        raise ValueError(f"mma_kind must be one of {MMA_KINDS}, got {mma_kind!r}")
    mx = mma_kind in MX_KINDS
    if mx and (promotion != PER_MMA or block_scaled or chain or cfg.f16):
        raise ValueError(
            "an MX kernel promotes per mma from C = 0 on the e4m3 ring, with its own scales: "
            f"got promotion={promotion!r}, block_scaled={block_scaled!r}, chain={chain!r}, f16={cfg.f16!r}"
        )
    if mma_kind != "plain" and cfg.f16:
        raise ValueError(f"the f16-staged kernel runs f16 HMMAs, not mma_kind {mma_kind!r}")
    bm, bn, threads = _check_config(cfg, block_scaled)
    mt, nt, wm_count, stages, use_ldmatrix = cfg.mt, cfg.nt, cfg.wm, cfg.stages, cfg.ldmatrix
    f16, f16_a, f16_b = cfg.f16 != "", "a" in cfg.f16, "b" in cfg.f16
    # "ab": a thread refills the ring slot it has just converted (all of it its own); one operand
    # staged: a slot is refilled once its tile is computed (the other operand is read from it)
    early_refill = f16_a and f16_b
    warps = cfg.wm * cfg.wn
    a_words = bm * ROW_WORDS
    stage_words = (bm + bn) * ROW_WORDS
    ring_words = stages * stage_words
    f16_b_words = bm * F16_ROW_WORDS if f16_a else 0  # where B rows start in an f16 tile
    f16_words = (bm * f16_a + bn * f16_b) * F16_ROW_WORDS  # one f16 tile; two follow the ring
    smem_words = 0 if f16 else ring_words  # f16: dynamic shared memory, sized at launch
    a_copies = bm * 4 // threads
    b_copies = bn * 4 // threads
    rows_per_pass = threads // 4
    n_acc = mt * nt * 4
    split = _split_accumulators(promotion, block_scaled)
    n_part = n_acc if split else 1
    n_af, n_bf = (8, 4 * nt) if f16 else (4, 2 * nt)
    n_raw = 4 if f16 else 1  # e4m3 fragments of an unstaged operand, before conversion
    chained = promotion == PER_128 or chain
    scratch_words = sm120.scratch_words(warps, mma_kind in sm120.KINDS)
    own_scratch = SIMULATOR or not f16
    mma_op, mma16, ldsm, lds = mma.mma_e4m3, mma.mma_f16, mma.ldmatrix_x4, mma.lds_u32
    if mma_kind == "unit":
        mma_op = sm120.mma_e4m3_unit  # the plain mma's arithmetic at the block-scaled rate
    lds4, sts4, cvt4 = mma.lds_u32x4, mma.sts_u32x4, mma.cvt_e4m3x4_f16
    commit = mma.cp_async_commit
    copy_a = mma.cp_async_rows(a_copies, rows_per_pass * ROW_WORDS)
    copy_b = mma.cp_async_rows(b_copies, rows_per_pass * ROW_WORDS)
    # the groups still pending when a tile is needed: e4m3, tile kt at iteration kt (stages - 1
    # issued ahead); f16, tile kt + 1 at iteration kt (early refill: stages issued ahead of it)
    wait_tile = mma.cp_async_wait_group(stages - 1 if early_refill else stages - 2)
    load_bias_value, finish, store = load_bias, scaled_value, store_out

    @cuda.jit(**_DEVICE)
    def issue_tile(
        smem,
        a,
        b,
        k_total,
        kt,
        stage,
        a_addr,
        b_addr,
        a_step,
        b_step,
        a_rows,
        b_rows,
        a_zero,
        b_zero,
        chunk_code,
        copy_word,
    ):
        """cp.async the A and B rows of K tile ``kt`` into ``stage``. This thread copies the 16-byte
        chunk at a_addr + i * a_step + kt * BK of copy i (rows r0 + i * rows_per_pass), valid for
        i < a_rows; rows past M / N and chunks past K are zero-filled from a valid address (zero
        codes are exact zeros: padding changes no sum)."""
        col = kt * BK
        k_ok = col + chunk_code < k_total  # chunk_code: the K offset of this thread's chunk
        base = stage * stage_words + copy_word
        copy_a(smem, base, a, a_addr, a_step, col, a_rows, k_ok, a_zero)
        copy_b(smem, base + a_words, b, b_addr, b_step, col, b_rows, k_ok, b_zero)

    @cuda.jit(**_DEVICE)
    def convert_rows(smem, src, dst, r0, chunk, copies):
        """Convert this thread's ``copies`` chunks (rows r0 + i * rows_per_pass, codes 16 chunk ..
        16 chunk + 15) from the ring words at ``src`` (its copy words) to the f16 rows at ``dst``:
        f16 chunk 2 chunk takes the lower code pair of each word, chunk 2 chunk + 1 the upper."""
        for i in range(copies):
            r = r0 + i * rows_per_pass
            w0, w1, w2, w3 = lds4(smem, src + i * rows_per_pass * ROW_WORDS)
            l0, h0 = cvt4(w0)
            l1, h1 = cvt4(w1)
            l2, h2 = cvt4(w2)
            l3, h3 = cvt4(w3)
            row = dst + r * F16_ROW_WORDS
            sts4(smem, row + 4 * ((2 * chunk) ^ (r % 8)), l0, l1, l2, l3)
            sts4(smem, row + 4 * ((2 * chunk + 1) ^ (r % 8)), h0, h1, h2, h3)

    @cuda.jit(**_DEVICE)
    def convert_tile(smem, slot, half, copy_word, r0, chunk):
        """Convert this thread's chunks of the staged operands in ring slot ``slot`` into f16 tile
        ``half``."""
        src = slot * stage_words + copy_word
        dst = ring_words + half * f16_words
        if f16_a:
            convert_rows(smem, src, dst, r0, chunk, a_copies)
        if f16_b:
            convert_rows(smem, src + a_words, dst + f16_b_words, r0, chunk, b_copies)

    row_scale, kblock_scale = scale_readers(block_scaled or mx)  # MX: the scales are applied per mma

    @cuda.jit(**_DEVICE)
    def add_partial(acc, part, q, d0, d1, d2, d3):
        """Promotion per mma: add one mma's partial (d0..d3) in float32 to the K-block partial (split)
        or straight to the accumulator."""
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

    # -- the copy and fragment plans: which bytes this thread copies, which fragment rows it reads --

    @cuda.jit(**_DEVICE)
    def copy_plan(a, b, m0, n0, m_total, n_total, tid):
        """This thread's copies: rows r0 + i * rows_per_pass, 16-byte chunk ``chunk``, stored in a
        swizzled slot of every stage at ``copy_word``; the global addresses of its first A and B
        chunks, the zero-fill source, the address step per copy and how many copies hold a row < M
        (< N)."""
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
        return r0, chunk, copy_word, a_addr, b_addr, a_zero, b_zero, a_step, b_step, a_rows, b_rows

    @cuda.jit(**_DEVICE)
    def fragment_plan(lane, wm, wn, g, t):
        """Where this lane's fragment reads start: with ldmatrix, lane supplies row lane % 8 of matrix
        lane // 8; an e4m3 row (ring) has its chunks swizzled by (row >> 1) & 3, an f16 row by
        row & 7 (the warps' rows start at multiples of 8). (rr, sw, a_lane, b_lane, a_hi, b_hi)."""
        rr = lane % 8
        jj = lane // 8
        sw = (rr // 2) % 4 if use_ldmatrix else (g // 2) % 4
        if use_ldmatrix:
            a_row = wm * mt * 16 + rr + 8 * (jj % 2)
            b_row = wn * nt * 8 + 8 * (jj // 2) + rr
            a_hi = jj // 2  # matrices 2, 3: the next chunk of k
            b_hi = jj % 2
            a_lane = a_row * (F16_ROW_WORDS if f16_a else ROW_WORDS)
            b_lane = (f16_b_words + b_row * F16_ROW_WORDS) if f16_b else (a_words + b_row * ROW_WORDS)
        else:
            a_lane = (wm * mt * 16 + g) * ROW_WORDS + t
            b_lane = a_words + (wn * nt * 8 + g) * ROW_WORDS + t
            a_hi = 0
            b_hi = 0
        return rr, sw, a_lane, b_lane, a_hi, b_hi

    # -- load fragments: one k32 step's A and B fragments from shared memory --------------------

    @cuda.jit(**_DEVICE)
    def load_b_e4m3(smem, bf, sbase, ks, b_lane, b_hi, sw, scratch, warp, lane):
        """B fragments of k32 step ``ks`` (chunks 2 ks, 2 ks + 1 of every row) for the warp's NT n8
        tiles, from the e4m3 ring slot at ``sbase``."""
        if use_ldmatrix:
            b_off = sbase + b_lane + 4 * ((2 * ks + b_hi) ^ sw)
            for j in range(nt // 2):
                bf[4 * j], bf[4 * j + 1], bf[4 * j + 2], bf[4 * j + 3] = ldsm(
                    smem, b_off + 16 * ROW_WORDS * j, scratch, warp, lane
                )
        else:
            lo = 4 * ((2 * ks) ^ sw)
            hi = 4 * ((2 * ks + 1) ^ sw)
            for j in range(nt):
                base = sbase + b_lane + 8 * ROW_WORDS * j
                bf[2 * j] = lds(smem, base + lo)
                bf[2 * j + 1] = lds(smem, base + hi)

    @cuda.jit(**_DEVICE)
    def load_a_e4m3(smem, af, sbase, ks, i, a_lane, a_hi, sw, scratch, warp, lane):
        """The A fragment of m16 tile ``i`` at k32 step ``ks``, from the e4m3 ring slot at ``sbase``."""
        if use_ldmatrix:
            a_off = sbase + a_lane + 4 * ((2 * ks + a_hi) ^ sw)
            af[0], af[1], af[2], af[3] = ldsm(smem, a_off + 16 * ROW_WORDS * i, scratch, warp, lane)
        else:
            lo = 4 * ((2 * ks) ^ sw)
            hi = 4 * ((2 * ks + 1) ^ sw)
            base = sbase + a_lane + 16 * ROW_WORDS * i
            af[0] = lds(smem, base + lo)
            af[1] = lds(smem, base + 8 * ROW_WORDS + lo)
            af[2] = lds(smem, base + hi)
            af[3] = lds(smem, base + 8 * ROW_WORDS + hi)

    @cuda.jit(**_DEVICE)
    def load_b_f16(smem, bf, raw, fbase, sbase, ks, b_lane, b_hi, rr, sw, scratch, warp, lane):
        """The two HMMAs' B fragments of k32 step ``ks`` (e4m3 chunks 2 ks, 2 ks + 1 = f16 chunks
        4 ks .. 4 ks + 3): HMMA h takes the code pair h of every 4-code word, i.e. f16 chunks 4 ks + h
        (k' 0-7) and 4 ks + 2 + h (k' 8-15); bf[0, 2 nt) feeds HMMA 0, [2 nt, 4 nt) HMMA 1. From the
        f16 tile at ``fbase`` where B is staged, else converted from the e4m3 ring slot at ``sbase``."""
        if f16_b:
            for h in range(2):
                b_off = fbase + b_lane + 4 * ((4 * ks + h + 2 * b_hi) ^ rr)
                for j in range(nt // 2):
                    q = 2 * nt * h + 4 * j
                    bf[q], bf[q + 1], bf[q + 2], bf[q + 3] = ldsm(
                        smem, b_off + 16 * F16_ROW_WORDS * j, scratch, warp, lane
                    )
        else:
            # the lower code pair of e4m3 b0, b1 -> the first HMMA's b0, b1; the upper -> the second's
            b_off = sbase + b_lane + 4 * ((2 * ks + b_hi) ^ sw)
            for j in range(nt // 2):
                raw[0], raw[1], raw[2], raw[3] = ldsm(smem, b_off + 16 * ROW_WORDS * j, scratch, warp, lane)
                for u in range(2):  # n8 tiles 2 j, 2 j + 1
                    q = 2 * (2 * j + u)
                    bf[q], bf[2 * nt + q] = cvt4(raw[2 * u])
                    bf[q + 1], bf[2 * nt + q + 1] = cvt4(raw[2 * u + 1])

    @cuda.jit(**_DEVICE)
    def load_a_f16(smem, af, raw, fbase, sbase, ks, i, a_lane, a_hi, rr, sw, scratch, warp, lane):
        """The two HMMAs' A fragments of m16 tile ``i`` at k32 step ``ks`` (af[0:4] HMMA 0, af[4:8]
        HMMA 1), as ``load_b_f16`` reads B."""
        if f16_a:
            for h in range(2):
                a_off = fbase + a_lane + 4 * ((4 * ks + h + 2 * a_hi) ^ rr) + 16 * F16_ROW_WORDS * i
                af[4 * h], af[4 * h + 1], af[4 * h + 2], af[4 * h + 3] = ldsm(smem, a_off, scratch, warp, lane)
        else:
            # the lower code pair of e4m3 a0..a3 -> the first HMMA's a0..a3; the upper -> the second's
            a_off = sbase + a_lane + 4 * ((2 * ks + a_hi) ^ sw) + 16 * ROW_WORDS * i
            raw[0], raw[1], raw[2], raw[3] = ldsm(smem, a_off, scratch, warp, lane)
            af[0], af[4] = cvt4(raw[0])
            af[1], af[5] = cvt4(raw[1])
            af[2], af[6] = cvt4(raw[2])
            af[3], af[7] = cvt4(raw[3])

    # -- mma steps: one output tile times one k32 step, promoted as configured -------------------

    @cuda.jit(**_DEVICE)
    def mma_into(c, q, a0, a1, a2, a3, b0, b1, scratch, warp, lane):
        """c[q .. q + 4) += A B through the e4m3 mma's own C operand."""
        c[q], c[q + 1], c[q + 2], c[q + 3] = mma_op(
            a0, a1, a2, a3, b0, b1, c[q], c[q + 1], c[q + 2], c[q + 3], scratch, warp, lane
        )

    @cuda.jit(**_DEVICE)
    def mma_step(acc, part, af, bf, q, j, scratch, warp, lane):
        """Output tile q (n8 tile j) times this k32 step on the e4m3 mma: chained through the K-block
        partial (the tensor core accumulates the K block itself) or the accumulator (the mma adds C
        in float32 itself, sm_90), or from C = 0 with the partial added in float32."""
        if chained and split:
            mma_into(part, q, af[0], af[1], af[2], af[3], bf[2 * j], bf[2 * j + 1], scratch, warp, lane)
        elif chained:
            mma_into(acc, q, af[0], af[1], af[2], af[3], bf[2 * j], bf[2 * j + 1], scratch, warp, lane)
        else:
            d0, d1, d2, d3 = mma_op(
                af[0],
                af[1],
                af[2],
                af[3],
                bf[2 * j],
                bf[2 * j + 1],
                _F32_ZERO,
                _F32_ZERO,
                _F32_ZERO,
                _F32_ZERO,
                scratch,
                warp,
                lane,
            )
            add_partial(acc, part, q, d0, d1, d2, d3)

    @cuda.jit(**_DEVICE)
    def hmma_pair_into(c, q, af, bf, lo, hi, scratch, warp, lane):
        """c[q .. q + 4) += A B through the two f16 HMMAs of a k32 step, C chained through both."""
        for h in range(2):
            b = lo if h == 0 else hi
            c[q], c[q + 1], c[q + 2], c[q + 3] = mma16(
                af[4 * h],
                af[4 * h + 1],
                af[4 * h + 2],
                af[4 * h + 3],
                bf[b],
                bf[b + 1],
                c[q],
                c[q + 1],
                c[q + 2],
                c[q + 3],
                scratch,
                warp,
                lane,
            )

    @cuda.jit(**_DEVICE)
    def hmma_step(acc, part, af, bf, q, j, scratch, warp, lane):
        """``mma_step`` on the f16-staged kernel: two k16 HMMAs per k32 step, chained through the
        K-block partial or the accumulator, or from C = 0 (the second adding the first's result)
        with the k32 partial added in float32 -- the arithmetic ptxas makes of the e4m3 mma on sm_90."""
        lo = 2 * j
        hi = 2 * nt + 2 * j
        if chained and split:
            hmma_pair_into(part, q, af, bf, lo, hi, scratch, warp, lane)
        elif chained:
            hmma_pair_into(acc, q, af, bf, lo, hi, scratch, warp, lane)
        else:
            d0, d1, d2, d3 = mma16(
                af[0],
                af[1],
                af[2],
                af[3],
                bf[lo],
                bf[lo + 1],
                _F32_ZERO,
                _F32_ZERO,
                _F32_ZERO,
                _F32_ZERO,
                scratch,
                warp,
                lane,
            )
            d0, d1, d2, d3 = mma16(af[4], af[5], af[6], af[7], bf[hi], bf[hi + 1], d0, d1, d2, d3, scratch, warp, lane)
            add_partial(acc, part, q, d0, d1, d2, d3)

    # MX: a k32 step's scales read once (mx_scales, n_mx of them) and the step that applies them
    # (mx_step): in the instruction on sm_12x's block-scaled mma, in float32 after the plain one
    mx_parts = sm120.mx_step_functions if mma_kind == "mx" else explicit_mx_step_functions
    n_mx, mx_scales, mx_step = mx_parts(mt, nt)
    n_mx = n_mx if mx else 1

    @cuda.jit(**_DEVICE)
    def mma_tile(smem, acc, part, af, bf, raw, fbase, sbase, plan, kt, mx_ctx, scratch, warp, lane):
        """The warp's MT x NT output tiles times one 64-wide K tile (tile ``kt``): two k32 steps, B
        fragments for the warp's columns first, then A one m16 tile at a time (fewer registers live).
        An MX kernel skips a k32 step past K (all its codes are zero-filled)."""
        rr, sw, a_lane, b_lane, a_hi, b_hi = plan
        for ks in range(2):
            kb = 2 * kt + ks
            if mx:
                if kb >= mx_ctx[0].shape[1]:
                    continue
                mx_scales(kb, mx_ctx)
            if f16:
                load_b_f16(smem, bf, raw, fbase, sbase, ks, b_lane, b_hi, rr, sw, scratch, warp, lane)
            else:
                load_b_e4m3(smem, bf, sbase, ks, b_lane, b_hi, sw, scratch, warp, lane)
            for i in range(mt):
                if f16:
                    load_a_f16(smem, af, raw, fbase, sbase, ks, i, a_lane, a_hi, rr, sw, scratch, warp, lane)
                else:
                    load_a_e4m3(smem, af, sbase, ks, i, a_lane, a_hi, sw, scratch, warp, lane)
                for j in range(nt):
                    if f16:
                        hmma_step(acc, part, af, bf, 4 * (i * nt + j), j, scratch, warp, lane)
                    elif mx:
                        mx_step(acc, af, bf, 4 * (i * nt + j), i, j, mx_ctx[8], scratch, warp, lane)
                    else:
                        mma_step(acc, part, af, bf, 4 * (i * nt + j), j, scratch, warp, lane)

    # -- promote and write out -------------------------------------------------------------------

    @cuda.jit(**_DEVICE)
    def promote(acc, part, scale_a, scale_b, kb, block_n, m0, m_total, wm, g):
        """The end of 128-wide K block ``kb``: the partial into acc, block-scaled as
        ``acc += (P * sa[m, kb]) * sb[n // 128, kb]`` (upstream's order) or added as it is."""
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

    @cuda.jit(**_DEVICE)
    def write_out(
        acc, y, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, out_kind, m0, n0, m_total, n_total, wm, wn, g, t
    ):
        """The epilogue: y = round_out((acc * sa) * sb + bias) over the warp's tiles (block scales are
        already in acc)."""
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

    @cuda.jit(**_DEVICE)
    def tile(a, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind, m0, n0, m_total):
        """The BM x BN tile of y at rows m0.., columns n0..: rows from m_total on (and columns from
        N on) are neither read nor written. Scales and bias as ``gemm`` takes them."""
        k_total = a.shape[1]
        n_total = b.shape[0]
        smem = cuda.shared.array(smem_words, types.uint32, alignment=_ALIGN_128)  # cp.async, ldmatrix: 16 B
        if own_scratch:
            scratch = cuda.shared.array(scratch_words, types.uint32)
        else:
            scratch = smem  # unused on a GPU: no static array beside the dynamic one
        acc = cuda.local.array(n_acc, types.float32)
        part = cuda.local.array(n_part, types.float32)
        af = cuda.local.array(n_af, types.uint32)
        bf = cuda.local.array(n_bf, types.uint32)
        raw = cuda.local.array(n_raw, types.uint32)
        fill(acc, _F32_ZERO)
        fill(part, _F32_ZERO)
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        wm = warp % wm_count
        wn = warp // wm_count
        g = lane // 4
        t = lane % 4
        r0, chunk, copy_word, a_addr, b_addr, a_zero, b_zero, a_step, b_step, a_rows, b_rows = copy_plan(
            a, b, m0, n0, m_total, n_total, tid
        )
        plan = fragment_plan(lane, wm, wn, g, t)
        mx_ctx = (
            scale_a,
            scale_b,
            m0 + wm * mt * 16 + g,
            n0 + wn * nt * 8,
            m_total - 1,
            n_total - 1,
            g,
            t,
            cuda.local.array(n_mx, types.float32),
        )
        kt_total = (k_total + BK - 1) // BK
        block_n = n0 // 128

        # prologue: the ring's first tiles in flight (f16: tile 0 converted too)
        for s in range(stages if early_refill else stages - 1):
            if s < kt_total:
                issue_tile(
                    smem,
                    a,
                    b,
                    k_total,
                    s,
                    s,
                    a_addr,
                    b_addr,
                    a_step,
                    b_step,
                    a_rows,
                    b_rows,
                    a_zero,
                    b_zero,
                    16 * chunk,
                    copy_word,
                )
            commit()
        if f16:
            wait_tile()
            convert_tile(smem, 0, 0, copy_word, r0, chunk)
            if early_refill:
                if stages < kt_total:
                    issue_tile(
                        smem,
                        a,
                        b,
                        k_total,
                        stages,
                        0,
                        a_addr,
                        b_addr,
                        a_step,
                        b_step,
                        a_rows,
                        b_rows,
                        a_zero,
                        b_zero,
                        16 * chunk,
                        copy_word,
                    )
                commit()
        st_read = 0  # the ring slot of tile kt
        st_write = stages - 1  # the ring slot of tile kt - 1 (refilled at iteration kt)
        for kt in range(kt_total):
            st_next = 0 if st_read == stages - 1 else st_read + 1  # the ring slot of tile kt + 1
            # load tiles: refill the ring slot nobody reads any more (f16: convert tile kt + 1)
            if f16:
                # f16 tile kt % 2 is complete, nobody reads f16 tile (kt + 1) % 2 nor ring slot
                # st_write any more
                cuda.syncthreads()
                if not early_refill:
                    nk = kt + stages - 1
                    if nk < kt_total:
                        issue_tile(
                            smem,
                            a,
                            b,
                            k_total,
                            nk,
                            st_write,
                            a_addr,
                            b_addr,
                            a_step,
                            b_step,
                            a_rows,
                            b_rows,
                            a_zero,
                            b_zero,
                            16 * chunk,
                            copy_word,
                        )
                    commit()
                if kt + 1 < kt_total:
                    wait_tile()  # this thread's copies of tile kt + 1
                    convert_tile(smem, st_next, (kt + 1) % 2, copy_word, r0, chunk)
                    # early refill: the slot just converted was all this thread's own
                    if early_refill and kt + 1 + stages < kt_total:
                        issue_tile(
                            smem,
                            a,
                            b,
                            k_total,
                            kt + 1 + stages,
                            st_next,
                            a_addr,
                            b_addr,
                            a_step,
                            b_step,
                            a_rows,
                            b_rows,
                            a_zero,
                            b_zero,
                            16 * chunk,
                            copy_word,
                        )
                if early_refill:
                    commit()
            else:
                wait_tile()
                cuda.syncthreads()
                nk = kt + stages - 1
                if nk < kt_total:
                    issue_tile(
                        smem,
                        a,
                        b,
                        k_total,
                        nk,
                        st_write,
                        a_addr,
                        b_addr,
                        a_step,
                        b_step,
                        a_rows,
                        b_rows,
                        a_zero,
                        b_zero,
                        16 * chunk,
                        copy_word,
                    )
                commit()
            # mma steps over tile kt
            mma_tile(
                smem,
                acc,
                part,
                af,
                bf,
                raw,
                ring_words + (kt % 2) * f16_words,
                st_read * stage_words,
                plan,
                kt,
                mx_ctx,
                scratch,
                warp,
                lane,
            )
            st_read = st_next
            st_write = 0 if st_write == stages - 1 else st_write + 1
            if split and (kt % 2 == 1 or kt == kt_total - 1):
                promote(acc, part, scale_a, scale_b, kt // 2, block_n, m0, m_total, wm, g)

        write_out(
            acc,
            y,
            scale_a,
            sa_step,
            scale_b,
            sb_step,
            bias,
            bias_kind,
            out_kind,
            m0,
            n0,
            m_total,
            n_total,
            wm,
            wn,
            g,
            t,
        )

    return tile_kernel(tile, bm, bn, grouped)


def tile_kernel(tile, bm, bn, grouped):
    """The kernel of a tiled GEMM whose device function ``tile(a, b, scale_a, sa_step, scale_b,
    sb_step, bias, bias_kind, y, out_kind, m0, n0, m_total)`` computes one BM x BN tile (this module's
    and sm90_wgmma_gemm.py's): the dense GEMM, block (x, y) the tile at (BM y, BN x); or, ``grouped``,
    the grouped GEMM of a mixture's experts over a tile map."""
    if not grouped:

        def gemm(a, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
            """y = round_out(a @ b^T scaled + bias). Per-tensor / per-row x per-channel: scale_a, scale_b
            float32 vectors read as scale[i * step]. Block-scaled: scale_a [M, ceil(K/128)] per
            1 x 128 activation group, scale_b [ceil(N/128), ceil(K/128)] per 128 x 128 weight block
            (the steps unused)."""
            tile(
                a, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind,
                cuda.blockIdx.y * bm, cuda.blockIdx.x * bn, a.shape[0],
            )  # fmt: skip

        return gemm

    def grouped_gemm(a, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind, tiles):
        """The grouped form: y rows of expert e = a's rows times b[e] [N, K], scale_b[e] its scales
        (per-channel [E, N] or [E, 1] with sb_step 0, blocks [E, NB, KB], MX [E, N, KB]); scale_a by
        absolute row as in ``gemm``. Grid row t runs ``tiles[t]`` = (expert, first row, the expert's
        end row), moe.row_tiles_launch's map: expert -1 has no work, expert E writes its rows as 0
        (the padding rows after the experts')."""
        t = cuda.blockIdx.y
        e = tiles[t, 0]
        n0 = cuda.blockIdx.x * bn
        if e < 0:
            return
        m0 = tiles[t, 1]
        m_end = tiles[t, 2]
        if e >= b.shape[0]:
            zero_rows(y, m0, min(m0 + bm, m_end), n0, min(n0 + bn, y.shape[1]))
            return
        tile(a, b[e], scale_a, sa_step, scale_b[e], sb_step, bias, bias_kind, y, out_kind, m0, n0, m_end)

    return grouped_gemm


@cuda.jit(**_DEVICE)
def zero_rows(y, r0, r1, c0, c1):
    """y[r0:r1, c0:c1] = 0 (the bits of +0.0 in every output kind), by the block's threads."""
    width = c1 - c0
    i = cuda.threadIdx.x
    total = (r1 - r0) * width
    while i < total:
        y[r0 + i // width, c0 + i % width] = 0
        i += cuda.blockDim.x


_u8_2d = types.uint8[:, :]
_f32_1d = types.float32[::1]
_f32_2d = types.float32[:, :]
_u16_1d = types.uint16[::1]
_i64 = types.int64
_i32 = types.int32


def _out_type(out_is_float32):
    return types.float32[:, ::1] if out_is_float32 else types.uint16[:, ::1]


class DynamicSharedKernel:
    """A compiled kernel (launch.Kernel) whose every launch takes ``shared_mem`` bytes of dynamic
    shared memory, opting in above 48 KB (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, once
    per device); called and prepared like the kernel itself."""

    # function pointer -> the opt-in made for it: the largest any wrapper of that kernel needs (two
    # wrappers of one kernel, for two K, must not lower each other's)
    _OPTED_IN: dict = {}

    def __init__(self, kernel, shared_mem):
        self.kernel, self.shared_mem = kernel, shared_mem

    def __getattr__(self, name):  # ptx, function, signature, ...
        return getattr(self.kernel, name)

    def _opt_in(self):
        if SIMULATOR or self.shared_mem <= SHARED_LIMIT:
            return
        fn = self.kernel.function()
        if DynamicSharedKernel._OPTED_IN.get(fn.ptr, 0) < self.shared_mem:
            # cupy's Function (unlike its RawKernel) has no setter for the attribute: the driver call
            from cupy.cuda import driver

            driver.funcSetAttribute(fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared_mem)
            DynamicSharedKernel._OPTED_IN[fn.ptr] = self.shared_mem

    def __call__(self, grid, block, *args, shared_mem=0):
        self._opt_in()  # (shared_mem: a caller's own count, which this kernel's replaces)
        self.kernel(grid, block, *args, shared_mem=self.shared_mem)

    def prepare(self, grid, block, *args, shared_mem=0):
        self._opt_in()
        return self.kernel.prepare(grid, block, *args, shared_mem=self.shared_mem)


def gemm_signature(block_scaled, out_is_float32, mx=False):
    """The argument types of a tiled GEMM kernel (this module's and wg_gemm.py's): a, b, scale_a,
    sa_step, scale_b, sb_step, bias bits, bias kind, y, out kind. ``mx``: E8M0 scales, uint8 2-D."""
    scale = _u8_2d if mx else _f32_2d if block_scaled else _f32_1d
    return (_u8_2d, _u8_2d, scale, _i64, scale, _i64, _u16_1d, _i32, _out_type(out_is_float32), _i32)


def grouped_gemm_signature(block_scaled, out_is_float32, mx=False):
    """The argument types of a grouped tiled GEMM kernel (this module's and sm90_wgmma_gemm.py's):
    ``gemm_signature``'s with b [E, N, K], the weight scales per expert ([E, N] or [E, 1]; blocks
    [E, NB, KB]; MX [E, N, KB]) and the tile map int32 [T, 3] last."""
    scale_a = _u8_2d if mx else _f32_2d if block_scaled else _f32_1d
    scale_b = types.uint8[:, :, :] if mx else types.float32[:, :, :] if block_scaled else types.float32[:, ::1]
    out = _out_type(out_is_float32)
    return (_u8_2d, types.uint8[:, :, :], scale_a, _i64, scale_b, _i64, _u16_1d, _i32, out, _i32, types.int32[:, ::1])


@functools.cache
def gemm_launcher(cfg, promotion, block_scaled, chain, out_is_float32, mma_kind="plain", grouped=False):
    """The compiled GEMM (see ``gemm_kernel``): launch on grid (ceil(N / BN), ceil(M / BM)) of
    32 * wm * wn threads (an f16-staged configuration: a ``DynamicSharedKernel``); ``grouped``: the
    grouped kernel, on grid (ceil(N / BN), tiles). The kernels of the block-scaled mma (``mma_kind``
    'unit', 'mx') are compiled for the arch-specific target (sm_120a, sm_121a): plain sm_12x refuses
    the instruction."""
    signature = grouped_gemm_signature if grouped else gemm_signature
    kernel = compile_kernel(
        gemm_kernel(cfg, promotion, block_scaled, chain, mma_kind, grouped),
        signature(block_scaled, out_is_float32, mma_kind in MX_KINDS),
        arch=sm120.arch(mma_kind in sm120.KINDS),
    )
    dynamic = shared_bytes(cfg)[1]
    return DynamicSharedKernel(kernel, dynamic) if dynamic else kernel


# ------------------------------------------------------------------------------------------------
# host side: capability, and the kernel in gemm.py's selection style


def chains_in_float32(cc):
    """Whether the FP8 mma adds its C operand in float32 after each k32 product on ``cc``: on sm_90
    ptxas lowers mma.m16n8k32.e4m3 to an e4m3 -> f16 unpack, two chained HMMA.16816.F32 from zero,
    then one FADD of C (cuobjdump of this module's kernels), so passing the accumulator as C is
    promotion per mma, bit for bit (tests/test_tensorcore_gpu.py checks it against the explicit
    form). Elsewhere (sm_89, sm_12x: native FP8 mma) the hardware's own accumulation is not
    documented, so the explicit form runs."""
    return tuple(cc) == (9, 0)


def unavailable_reason(dev, simulate=False):
    """Why the tensor-core kernels cannot run on device record ``dev`` (None when they can). Under
    the CUDA simulator they run only when asked to (``simulate=True``): the portable emulation is for
    tests."""
    if SIMULATOR:
        return (
            None
            if simulate
            else (
                "the tensor-core kernels run under the CUDA simulator only through their "
                "portable emulation (simulate=True)"
            )
        )
    if not mma.available(dev.cc):
        return f"FP8 mma.sync needs compute capability >= {mma.MIN_CC}, got {dev.cc}"
    return None


def rows_reason(arr, name):
    """Why a 2-D operand cannot be copied 16 bytes at a time (None when it can)."""
    if SIMULATOR:
        return None
    if arr.strides[1] != 1 or arr.strides[0] % 16 or arr.data.ptr % 16:
        return (
            f"the tensor-core kernels copy 16 bytes at a time: {name} needs 16-byte aligned rows "
            f"(contiguous K, row stride % 16 == 0)"
        )
    return None


def shape_reason(call, kernels="the tensor-core kernels"):
    """Why the operands cannot be copied 16 bytes at a time (None when they can): the rule of every
    cp.async GEMM (this module's, sm90_wgmma_gemm.py's)."""
    if call.k % 16:
        return f"{kernels}: 16-byte copies need K to be a multiple of 16, got K = {call.k}"
    return rows_reason(call.a, "a") or rows_reason(call.b, "b")


def mma_kind_for(cc, mx=False):
    """The mma a tensor-core kernel issues on compute capability ``cc`` (MMA_KINDS): the block-scaled
    instruction on sm_120 / sm_121 (real scales for MXFP8 operands, unit scales otherwise), the plain
    one elsewhere (MXFP8 operands then scaled per k32 in float32)."""
    if sm120.available(cc):
        return "mx" if mx else "unit"
    return "mx_explicit" if mx else "plain"


def gemm_args(call, y_bits, block_scaled):
    """The arguments of a tiled GEMM kernel (``gemm_signature``) for a ``gemm.GemmCall`` or a
    ``block.BlockCall`` (2-D scales, the steps unused; an MX call's E8M0 bytes)."""
    bias, bias_kind = bias_bits(call.bias, call.device)
    sa_step, sb_step = (0, 0) if block_scaled or getattr(call, "mx", False) else (call.sa_step, call.sb_step)
    return (
        call.a,
        call.b,
        call.scale_a,
        sa_step,
        call.scale_b,
        sb_step,
        bias,
        bias_kind,
        y_bits,
        OUT_KIND[call.out_dtype],
    )


def gemm_launch(call, y_bits, block_scaled, promotion=PER_MMA, config=None, mma_kind=None):
    """(kernel, grid, block, args) of the tiled tensor-core GEMM for a ``gemm.GemmCall`` (or a
    ``block.BlockCall``: then the scales are 2-D and the steps unused; an MX ``BlockCall`` takes an MX
    kernel). ``mma_kind`` (MMA_KINDS) by default ``mma_kind_for`` the call's device."""
    mx = getattr(call, "mx", False)
    mma_kind = mma_kind or mma_kind_for(call.device.cc, mx)
    if (mma_kind in MX_KINDS) != mx:
        raise ValueError(f"mma_kind must be an MX kind exactly for an MX call, got {mma_kind!r} for mx={mx}")
    block_scaled = block_scaled and not mx
    if config is None and mx and not SIMULATOR:  # the simulator's tests keep its one tiny tile
        config = mx_config(call.m)
    cfg = config or default_config(call.device.cc, _split_accumulators(promotion, block_scaled))
    if mma_kind != "plain" and cfg.f16:
        cfg = GEMM_DEFAULT  # the block-scaled and MX kernels run the e4m3 ring
    # the f16-staged kernel promotes per k32 explicitly; its chain is the tensor core's accumulation
    chain = not SIMULATOR and not cfg.f16 and chains_in_float32(call.device.cc) and not mx
    bm, bn = tile_shape(cfg)
    return (
        gemm_launcher(cfg, promotion, block_scaled, chain, call.out_dtype == np.float32, mma_kind),
        (-(-call.n // bn), -(-call.m // bm)),
        32 * cfg.wm * cfg.wn,
        gemm_args(call, y_bits, block_scaled),
    )


def grouped_scales(call):
    """(scale_a, sa_step, scale_b, sb_step, block_scaled, mx) of an ``grouped.GroupedCall`` as the
    grouped kernels take them, or a str saying why they cannot: float32 per-tensor / per-row
    activations with per-expert per-tensor / per-channel weights; 128 x 128 weight blocks with 1 x 128
    activation groups; MXFP8 (E8M0 bytes, 1 x 32 blocks)."""
    e, n = call.e, call.n
    if call.sa_e8m0 or call.sb_e8m0:
        if not (call.sa_e8m0 and call.sb_e8m0 and call.block_size == (1, 32) and call.scale_a.ndim == 2):
            return "the tiled grouped GEMM takes E8M0 scales as MXFP8 only: both operands, 1 x 32 blocks"
        return call.scale_a, 0, call.scale_b.reshape(e, n, -1), 0, False, True
    if call.blocked:
        if call.block_size != (128, 128) or call.scale_a.ndim != 2:
            return (
                "the tiled grouped GEMM takes block scales as 128 x 128 weight blocks with 1 x 128 activation "
                f"groups [P, KB], got block_size {call.block_size} and scale_a of {call.scale_a.ndim} dimension(s)"
            )
        return call.scale_a, 0, call.scale_b.reshape(e, -1, call.scale_b.shape[-1]), 0, True, False
    if call.sb.size not in (e, e * n):
        return (
            f"the tiled grouped GEMM takes weight scales [E] or [E, N], got {call.sb.size} values for E = {e}, N = {n}"
        )
    per_channel = call.sb.size == e * n and n > 1
    scale_b = call.sb.reshape(e, n if per_channel else 1)
    return call.sa, call.sa_row, scale_b, int(per_channel), False, False


def grouped_shape_reason(call, kernels="the tiled grouped GEMM"):
    """Why a grouped call's operands cannot be copied 16 bytes at a time (None when they can)."""
    if call.k % 16:
        return f"{kernels}: 16-byte copies need K to be a multiple of 16, got K = {call.k}"
    return rows_reason(call.a, "a") or rows_reason(call.b2d, "b (as [E * N, K])")


def grouped_gemm_launch(call, y_bits, tiles, promotion=PER_MMA, config=None, mma_kind=None):
    """(kernel, grid, block, args) of the grouped tiled tensor-core GEMM for an ``grouped.GroupedCall``
    (its reasons: ``grouped_scales``, ``grouped_shape_reason``) over ``tiles``, the map
    ``moe.row_tiles_launch`` made with ``grouped_tile_rows(call)`` rows a tile."""
    block_scaled, mx = grouped_scales(call)[4:]
    cfg = config or grouped_config(call)
    mma_kind = mma_kind or mma_kind_for(call.device.cc, mx)
    chain = not SIMULATOR and not cfg.f16 and chains_in_float32(call.device.cc) and not mx
    _, bn = tile_shape(cfg)
    return (
        gemm_launcher(cfg, promotion, block_scaled, chain, call.out_dtype == np.float32, mma_kind, True),
        (-(-call.n // bn), int(tiles.shape[0])),
        32 * cfg.wm * cfg.wn,
        grouped_args(call, y_bits, tiles),
    )


def grouped_args(call, y_bits, tiles):
    """The arguments of a grouped tiled GEMM kernel (``grouped_gemm_signature``; this module's and
    sm90_wgmma_gemm.py's) for an ``grouped.GroupedCall`` over the tile map ``tiles``: no bias."""
    scale_a, sa_step, scale_b, sb_step = grouped_scales(call)[:4]
    bias, bias_kind = bias_bits(None, call.device)
    return (
        call.a,
        call.b,
        scale_a,
        sa_step,
        scale_b,
        sb_step,
        bias,
        bias_kind,
        y_bits,
        OUT_KIND[call.out_dtype],
        tiles,
    )


def grouped_config(call):
    """The tile configuration of a grouped call: the dense default (the e4m3 ring; MXFP8's 128 x 128)."""
    mx = call.sa_e8m0 and call.sb_e8m0
    if mx:
        return GEMM_DEFAULT
    return default_config(call.device.cc, _split_accumulators(PER_MMA, call.blocked))


def grouped_tile_rows(call):
    """Rows a tile of the grouped call's kernel (``grouped_gemm_launch``) covers: the tile map's unit."""
    return tile_shape(grouped_config(call))[0]


__all__ = [
    "grouped_args",
    "grouped_gemm_launch",
    "grouped_gemm_signature",
    "grouped_scales",
    "grouped_shape_reason",
    "grouped_tile_rows",
    "PER_MMA",
    "PER_128",
    "PROMOTIONS",
    "MMA_KINDS",
    "MX_KINDS",
    "mma_kind_for",
    "TileConfig",
    "GEMM_CONFIGS",
    "GEMM_DEFAULT",
    "F16_DEFAULT",
    "F16_SPLIT_DEFAULT",
    "MX_CONFIGS_BY_M",
    "mx_config",
    "default_config",
    "tile_shape",
    "shared_bytes",
    "gemm_kernel",
    "DynamicSharedKernel",
    "gemm_signature",
    "gemm_launcher",
    "gemm_launch",
    "gemm_args",
    "chains_in_float32",
    "unavailable_reason",
    "rows_reason",
    "shape_reason",
]
