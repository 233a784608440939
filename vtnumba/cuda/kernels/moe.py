"""The mixture-of-experts routing kernels (``vtnumba.cuda.experts`` launches them): align, gather,
static per-expert quantization, SiLU-and-multiply (plain or fused with the down experts'
quantization) and the weighted combine. The reference semantics are ``vtnumba/cpu/experts.py``'s.

Every launch goes to cupy's current stream through ``runtime/launch``'s ``Kernel``; nothing here
synchronizes or reads back to the host, so a whole ``moe_fp8`` call can be captured in a CUDA graph.
The row counts stay on the device: each kernel reads ``offsets`` itself.

- **align** (``align_launches``): one block up to ``ALIGN_CHUNK`` pairs (a chunk a block past it,
  after a launch that counts each chunk's experts). Per-warp per-expert counters in (dynamic) shared memory,
  filled with shared atomics (counts are order-free), an exclusive scan over the experts, then the
  scatter: each warp owns a contiguous run of pairs and walks it in batches of 32, ranking each pair
  among the batch's earlier lanes with the same expert. So the sorted order is the CPU's stable one
  (expert, then pair order) -- deterministic, bit for bit -- without a sort.
- **gather** (``gather_launch``): rows of any dtype copied by row index, 16 bytes a thread where the
  row's bytes allow it.
- **static rows** (``static_rows_launch``): a block per row; the row's expert found by a binary
  search of ``offsets``; ``encode(x * (1 / input_scale[e]))``, quant.py's static arithmetic.
- **SiLU** (``silu_launches``): ``g / (1 + exp(-g)) * u`` in float32, then per mode: the float32
  activation (padding rows 0), or its codes and scales by the down experts' scheme -- per token,
  per group (float32 scales, UE8M0 rounding, or E8M0 bytes: MXFP8), static per expert, dynamic per
  tensor (two launches: amax partials over the routed rows, then the quantization). Padding rows
  quantize as zeros, which is what the CPU's zeroed padding gives.
- **combine** (``combine_launch``): ``out[t] = sum_j w[t, j] * y[pair_row[t, j]]`` in float32, slot
  order, each product rounded before its add (``fmul_rn``: the NVVM would fuse it into an FMA and
  lose the CPU's bytes), rounded once to the output type.

GPU ``expf`` is not numpy's: an activation may differ from the CPU's by an ulp or two, so a code
next to a rounding boundary may differ by one step (tests/test_cudasim_experts.py states the
tolerance). Everything else is the CPU's arithmetic, bit for bit.
"""

import enum
import functools
import math

import numpy as np

from ..._format import F32_E4M3_MAX, F32_MIN_SCALE, F32_ONE, F32_ZERO
from ..ptx import codec
from ..ptx.codec import (
    bfloat16_bits_to_float32,
    bits_float32,
    finite_abs,
    float32_bits,
    half_bits_to_float32,
    load_u32x4,
    store_u32x4,
)
from ..ptx.target import DEVICE_INLINE, SIMULATOR, cuda, libdevice, types
from ..runtime.launch import compile_kernel
from .epilogue import OutKind, out_type, store_out
from .quant import (
    _LOADERS,
    GROUP,
    _group_ops,
    _group_scale_rule,
    _segment_max,
    _times,
    _warp_max,
    block_max_for,
)

# --- align -----------------------------------------------------------------------------------------
# 16 warps: the scatter's batches are serial per warp, so more warps shorten it; the per-warp
# counters ((warps + 1) * E int32) must fit the 48 KiB of shared memory a block gets without opt-in.
ALIGN_WARPS = 2 if SIMULATOR else 16
ALIGN_THREADS = 32 * ALIGN_WARPS
_SHARED_INTS = 48 * 1024 // 4
MAX_ALIGN_EXPERTS = _SHARED_INTS // 2 - 1  # one warp: (1 + 1) * E counters


def align_warps(num_experts, pairs=None):
    """Warps of the align block for E experts: ALIGN_WARPS, fewer where their counters would not fit,
    and no more than the pairs fill (a warp per 32): at decode (8 pairs) one warp's scan takes 5 of
    the block's barriers where 16 warps' took 9, and its counters a sixteenth of the zeroing and
    prefix work (the align took 10 us of a 63 us decode layer on the H200 with 16 warps)."""
    warps = max(1, min(ALIGN_WARPS, _SHARED_INTS // num_experts - 1))
    return warps if pairs is None else max(1, min(warps, -(-int(pairs) // 32)))


# Past ALIGN_CHUNK pairs the align spreads over blocks, a chunk of pairs each: one SM walking 16 K
# pairs (a 2,048-token prefill at top-8) took 134 us a layer on the H200 (2026-12-03), its batches
# waiting on global loads one after another. A first launch counts each chunk's experts
# (``_align_counts``); then each block of the align ranks its own chunk as the one-block align ranks
# all pairs, every expert's cursor starting past the earlier chunks' rows. The order is the same.
ALIGN_CHUNK = 64 if SIMULATOR else 1024


def _align_counts(ids, block_counts, num_experts, pairs, chunk):
    """block_counts[b * E + e] = the pairs of chunk b (pairs [b chunk, (b + 1) chunk)) routed to e."""
    counts = cuda.shared.array(0, types.int32)  # [E]
    tid = cuda.threadIdx.x
    b = cuda.blockIdx.x
    for e in range(tid, num_experts, cuda.blockDim.x):
        counts[e] = 0
    cuda.syncthreads()
    for i in range(b * chunk + tid, min(pairs, (b + 1) * chunk), cuda.blockDim.x):
        e = ids[i]
        if e >= 0 and e < num_experts:
            cuda.atomic.add(counts, e, 1)
    cuda.syncthreads()
    for e in range(tid, num_experts, cuda.blockDim.x):
        block_counts[b * num_experts + e] = counts[e]


def _align(ids, offsets, pair_row, row_token, block_counts, num_experts, k, pairs, chunk):
    counts = cuda.shared.array(0, types.int32)  # [warps * E] per-warp counters, then [E] expert starts
    scan = cuda.shared.array(ALIGN_THREADS, types.int32)
    batch = cuda.shared.array(ALIGN_THREADS, types.int32)
    threads = cuda.blockDim.x
    warps = threads // 32
    tid = cuda.threadIdx.x
    lane = tid % 32
    warp = tid // 32
    b = cuda.blockIdx.x
    blocks = cuda.gridDim.x  # > 1: block_counts holds every chunk's counts (``_align_counts``)
    first_pair = b * chunk
    last_pair = min(pairs, first_pair + chunk)
    starts = warps * num_experts
    for i in range(tid, starts + num_experts, threads):
        counts[i] = 0
    cuda.syncthreads()
    per_warp = (last_pair - first_pair + warps - 1) // warps
    lo = first_pair + warp * per_warp
    hi = min(last_pair, lo + per_warp)
    for i in range(lo + lane, hi, 32):
        e = ids[i]
        if e >= 0 and e < num_experts:
            cuda.atomic.add(counts, warp * num_experts + e, 1)
    cuda.syncthreads()
    # counters -> each warp's exclusive prefix within its expert; the expert's total beside them
    # (over every chunk where there are several)
    for e in range(tid, num_experts, threads):
        run = 0
        for w in range(warps):
            c = counts[w * num_experts + e]
            counts[w * num_experts + e] = run
            run += c
        if blocks > 1:
            run = 0
            for c in range(blocks):
                run += block_counts[c * num_experts + e]
        counts[starts + e] = run
    cuda.syncthreads()
    # exclusive scan of the totals: each thread sums a contiguous run of experts, the runs are
    # scanned across the block (Hillis-Steele), then each thread writes its experts' starts
    per = (num_experts + threads - 1) // threads
    first = tid * per
    last = min(num_experts, first + per)
    local = 0
    for e in range(first, last):
        local += counts[starts + e]
    scan[tid] = local
    cuda.syncthreads()
    step = 1
    while step < threads:
        v = scan[tid]
        if tid >= step:
            v += scan[tid - step]
        cuda.syncthreads()
        scan[tid] = v
        cuda.syncthreads()
        step *= 2
    routed = scan[threads - 1]
    run = scan[tid] - local
    for e in range(first, last):
        total = counts[starts + e]
        before = 0  # this expert's rows in the earlier chunks
        for c in range(b):
            before += block_counts[c * num_experts + e]
        if b == 0:
            offsets[e] = run
        counts[starts + e] = run + before
        run += total
    if tid == 0 and b == 0:
        offsets[num_experts] = routed
    cuda.syncthreads()
    for i in range(tid, starts, threads):
        counts[i] += counts[starts + i % num_experts]
    cuda.syncthreads()
    # the scatter, a batch of 32 pairs per warp at a time, every warp the same number of batches
    for batch_index in range((per_warp + 31) // 32):
        i = lo + 32 * batch_index + lane
        e = -1
        if i < hi:
            v = ids[i]
            if v >= 0 and v < num_experts:
                e = v
        batch[tid] = e
        cuda.syncthreads()
        rank = 0
        later = 0
        for j in range(32):
            if batch[warp * 32 + j] == e:
                if j < lane:
                    rank += 1
                elif j > lane:
                    later += 1
        if e >= 0:
            row = counts[warp * num_experts + e] + rank
            pair_row[i] = row
            row_token[row] = i // k
        elif i < hi:
            pair_row[i] = -1
        cuda.syncthreads()  # every lane has read its expert's cursor before the last one moves it
        if e >= 0 and later == 0:
            counts[warp * num_experts + e] += rank + 1
    for r in range(routed + b * threads + tid, pairs, blocks * threads):
        row_token[r] = 0  # padding rows name token 0: a gather by them stays in bounds


@functools.cache
def align_kernel(ids_int64):
    ids_type = types.int64[::1] if ids_int64 else types.int32[::1]
    i32 = types.int32[::1]
    i64 = types.int64
    return compile_kernel(_align, (ids_type, i32, i32, i32, i32, i64, i64, i64, i64))


@functools.cache
def align_counts_kernel(ids_int64):
    ids_type = types.int64[::1] if ids_int64 else types.int32[::1]
    return compile_kernel(_align_counts, (ids_type, types.int32[::1], types.int64, types.int64, types.int64))


def align_blocks(pairs):
    """Blocks of the align for ``pairs`` pairs: one up to ``ALIGN_CHUNK``, a chunk each past it."""
    return max(1, -(-int(pairs) // ALIGN_CHUNK))


def align_launches(ids, offsets, pair_row, row_token, block_counts, num_experts, k):
    """[(kernel, grid, block, args, shared bytes)] of the align for flat ids [P] (int32 or int64) into
    offsets [E + 1], pair_row [P] (flat) and row_token [P]: one launch up to ``ALIGN_CHUNK`` pairs,
    else the counts per chunk into ``block_counts`` int32 [align_blocks(P) E], then the align."""
    pairs = int(ids.shape[0])
    blocks = align_blocks(pairs)
    int64 = np.dtype(ids.dtype) == np.int64
    chunk = pairs if blocks == 1 else ALIGN_CHUNK
    warps = align_warps(num_experts, min(pairs, chunk))
    align = (
        align_kernel(int64),
        blocks,
        32 * warps,
        (ids, offsets, pair_row, row_token, block_counts, num_experts, k, pairs, chunk),
        4 * (warps + 1) * num_experts,
    )
    if blocks == 1:
        return [align]
    counts = (
        align_counts_kernel(int64),
        blocks,
        ALIGN_THREADS,
        (ids, block_counts, num_experts, pairs, chunk),
        4 * num_experts,
    )
    return [counts, align]


# --- the active experts ------------------------------------------------------------------------------
# A grouped GEMM's grid has a row of blocks per expert; at decode (top-8 of 128 experts at one token)
# 120 of those rows would only read their empty range and return, ~12 thousand blocks for gate_up.
# The map lists the experts that have rows (at most min(E, P) of them), so the grid has that many
# rows instead; a row past the count reads -1 and returns. Their order is the atomics', not fixed:
# each expert writes only its own rows, so the GEMM's bytes do not depend on it.
MAP_THREADS = 32 if SIMULATOR else 256


def _active_experts(offsets, num_experts, active, slots):
    count = cuda.shared.array(1, types.int32)
    tid = cuda.threadIdx.x
    if tid == 0:
        count[0] = 0
    cuda.syncthreads()
    for e in range(tid, num_experts, cuda.blockDim.x):
        if offsets[e + 1] > offsets[e]:
            i = cuda.atomic.add(count, 0, 1)
            if i < slots:
                active[i] = e
    cuda.syncthreads()
    for i in range(count[0] + tid, slots, cuda.blockDim.x):
        active[i] = -1
    if tid == 0:
        active[slots] = num_experts  # the grid row after the experts' (the padding rows, where a kernel has one)


@functools.cache
def active_experts_kernel():
    i32 = types.int32[::1]
    return compile_kernel(_active_experts, (i32, types.int64, i32, types.int64))


def active_experts_launch(offsets, num_experts, active):
    """(kernel, grid, block, args) writing ``active`` [slots + 1]: the experts with rows (in no fixed
    order), -1 after them up to ``slots``, then E."""
    return active_experts_kernel(), 1, MAP_THREADS, (offsets, num_experts, active, int(active.shape[0]) - 1)


# --- the row tiles of a grouped tiled GEMM ----------------------------------------------------------
# Tile t of the grouped tensor-core GEMMs (tc_gemm.py, sm90_wgmma_gemm.py) is tiles[t] = (expert,
# first row, the expert's end row): expert e's rows offsets[e] .. offsets[e + 1] in tiles of
# ``tile_rows``, one expert after another, then the padding rows offsets[E] .. P as expert E, then
# -1 (no work) up to the map's length, ceil(P / tile_rows) + E + 1 (each expert and the padding add
# at most one part-filled tile). The counts are read on the device, so the host never learns them
# and a captured graph remakes the map on each replay.
ROW_TILE_THREADS = 32 if SIMULATOR else 256
MAX_ROW_TILE_EXPERTS = 4096  # the tile starts live in shared memory
_ROW_TILE_STARTS = MAX_ROW_TILE_EXPERTS + 2  # a shared array's size must be a constant of the module


def _row_tiles(offsets, num_experts, rows, tile_rows, tiles):
    start = cuda.shared.array(_ROW_TILE_STARTS, types.int32)
    tid = cuda.threadIdx.x
    for e in range(tid, num_experts + 1, cuda.blockDim.x):  # each group's tile count
        hi = offsets[e + 1] if e < num_experts else rows
        start[e + 1] = (max(hi - offsets[e], 0) + tile_rows - 1) // tile_rows
    cuda.syncthreads()
    if tid == 0:  # their running sum, in shared memory (E + 1 adds)
        start[0] = 0
        for e in range(num_experts + 1):
            start[e + 1] += start[e]
    cuda.syncthreads()
    for e in range(tid, num_experts + 1, cuda.blockDim.x):
        lo = offsets[e]
        hi = offsets[e + 1] if e < num_experts else rows
        for j in range(start[e + 1] - start[e]):
            tiles[start[e] + j, 0] = e
            tiles[start[e] + j, 1] = lo + j * tile_rows
            tiles[start[e] + j, 2] = hi
    for t in range(start[num_experts + 1] + tid, tiles.shape[0], cuda.blockDim.x):
        tiles[t, 0] = -1


@functools.cache
def row_tiles_kernel():
    return compile_kernel(_row_tiles, (types.int32[::1], types.int64, types.int64, types.int64, types.int32[:, ::1]))


def row_tile_count(rows, num_experts, tile_rows):
    """The length of the tile map of ``rows`` rows over ``num_experts`` experts."""
    return -(-int(rows) // int(tile_rows)) + int(num_experts) + 1


def row_tiles_launch(offsets, num_experts, rows, tile_rows, tiles):
    """(kernel, grid, block, args) writing the tile map ``tiles`` int32 [row_tile_count(...), 3]."""
    if num_experts > MAX_ROW_TILE_EXPERTS:
        raise ValueError(f"num_experts must be <= {MAX_ROW_TILE_EXPERTS} for the row tile map, got {num_experts}")
    return row_tiles_kernel(), 1, ROW_TILE_THREADS, (offsets, int(num_experts), int(rows), int(tile_rows), tiles)


# --- gather ----------------------------------------------------------------------------------------
THREADS = 32 if SIMULATOR else 256
MAX_BLOCKS = 1 << 16  # grid-stride beyond
# the element type a row is copied in, by its width in bytes (16: four words through load_u32x4,
# which takes float32 buffers on every target)
_UNIT_TYPES = {16: types.float32, 4: types.uint32, 2: types.uint16, 1: types.uint8}
UNIT_DTYPES = {16: np.float32, 4: np.uint32, 2: np.uint16, 1: np.uint8}


@functools.cache
def gather_kernel(unit):
    """dst[r, :] = src[row_token[r], :] over flat buffers of ``unit``-byte elements (16: 16-byte
    words), ``row_units`` of them a row."""
    wide = unit == 16

    def gather(src, dst, row_token, row_units, total):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < total:
            r = i // row_units
            s = row_token[r] * row_units + (i - r * row_units)
            if wide:
                w0, w1, w2, w3 = load_u32x4(src, s)
                store_u32x4(dst, i, w0, w1, w2, w3)
            else:
                dst[i] = src[s]
            i += stride

    t = _UNIT_TYPES[unit][::1]
    return compile_kernel(gather, (t, t, types.int32[::1], types.int64, types.int64))


def _grid(units):
    return max(1, min(-(-units // THREADS), MAX_BLOCKS))


def gather_launch(src, dst, row_token, unit, row_units):
    """The gather of flat ``src`` rows into flat ``dst`` (both viewed as ``UNIT_DTYPES[unit]``)."""
    total = int(row_token.shape[0]) * row_units
    return gather_kernel(unit), _grid(total), THREADS, (src, dst, row_token, row_units, total)


# --- the row's expert ------------------------------------------------------------------------------
@cuda.jit(**DEVICE_INLINE)
def expert_of(offsets, num_experts, row):
    """The expert whose rows hold ``row`` (< offsets[E]): the last e with offsets[e] <= row, which
    skips empty experts."""
    lo = 0
    hi = num_experts
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if offsets[mid] <= row:
            lo = mid
        else:
            hi = mid
    return lo


# --- static per-expert quantization ----------------------------------------------------------------
@functools.cache
def static_rows_kernel(kind, encoder):
    """codes[r] = encode(x[r] * (1 / input_scales[e])) for the rows of expert e, scales[r] =
    input_scales[e]; padding rows (>= offsets[E]) get codes 0 and scale 1. A block per row, x flat,
    16-element groups where the rows are made of them (``row_groups`` > 0), a scalar loop else."""
    encode_group, _ = _group_ops(kind, codec.encode_pair(encoder), _times)
    encode = codec.encode_one(encoder)
    load = _LOADERS[kind]

    def quantize_rows_static(x, out, scales, offsets, input_scales, num_experts, cols, row_groups, rows):
        t = cuda.threadIdx.x
        routed = offsets[num_experts]
        for row in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            start = row * cols
            first_group = start // GROUP  # exact when row_groups > 0
            if row < routed:
                s = input_scales[expert_of(offsets, num_experts, row)]
                inv = F32_ONE / s  # float32, as the CPU's np.float32(1.0) / np.float32(scale)
                if t == 0:
                    scales[row] = s
                for g in range(t, row_groups, THREADS):
                    encode_group(x, out, first_group + g, inv)
                for j in range(row_groups * GROUP + t, cols, THREADS):
                    out[start + j] = encode(load(x, start + j) * inv)
            else:
                if t == 0:
                    scales[row] = F32_ONE
                for g in range(t, row_groups, THREADS):
                    store_u32x4(out, first_group + g, np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))
                for j in range(row_groups * GROUP + t, cols, THREADS):
                    out[start + j] = 0

    x_type = types.float32[::1] if kind == "float32" else types.uint16[::1]
    return compile_kernel(
        quantize_rows_static,
        (
            x_type,
            types.uint8[::1],
            types.float32[::1],
            types.int32[::1],
            types.float32[::1],
            types.int64,
            types.int64,
            types.int64,
            types.int64,
        ),
    )


def static_rows_launch(
    x_flat, kind, encoder, out_flat, scales, offsets, input_scales, num_experts, rows, cols, aligned
):
    row_groups = cols // GROUP if aligned and cols % GROUP == 0 else 0
    return (
        static_rows_kernel(kind, encoder),
        max(1, min(rows, MAX_BLOCKS)),
        THREADS,
        (x_flat, out_flat, scales, offsets, input_scales, num_experts, cols, row_groups, rows),
    )


# --- SiLU-and-multiply, plain or fused with the quantization ----------------------------------------
class SiluMode(enum.IntEnum):
    """What the SiLU kernel writes (see the module docstring)."""

    PLAIN = 0  # the float32 activation
    PER_TOKEN = 1  # codes, one scale a row (max(amax / 448, floor), a divide)
    PER_GROUP = 2  # codes, one scale a 1 x g group (float32, UE8M0 or E8M0 bytes), a divide
    STATIC = 3  # codes by the row's expert's static scale (a multiply by its reciprocal)
    DYNAMIC_AMAX = 4  # the amax partials of the routed rows, one a block
    DYNAMIC = 5  # codes by the per-tensor scale those partials give (a multiply by its reciprocal)


# exp's argument is capped where float32 exp is already inf: the simulator's math.exp raises
# OverflowError past about 709, the GPU's expf gives inf from 88.7 on, as numpy does
_F32_EXP_CAP = np.float32(100.0)


@cuda.jit(**DEVICE_INLINE)
def silu_mul_scalar(g, u):
    """``g / (1 + exp(-g)) * u`` in float32 (vLLM's silu_and_mul, the CPU's expression operation by
    operation)."""
    e = np.float32(math.exp(min(-g, _F32_EXP_CAP)))
    return np.float32(np.float32(g / np.float32(F32_ONE + e)) * u)


@cuda.jit(**DEVICE_INLINE)
def silu_mul_value(h, row, j, half):
    """``silu_mul_scalar`` of column j of row ``row`` of h [P, 2I] (gate first, up after it)."""
    return silu_mul_scalar(h[row, j], h[row, half + j])


# A warp a row: the H200's profile of a converted Qwen3-MoE's 2,048-token prefill (2026-12-03) had the
# block-a-row form at 280 us a layer (per token, [16 K, 1536] float32 rows) where its bytes take
# about 30: each row's 256 threads read 3 columns each with scalar loads, then met at two block
# barriers. A warp per row reads 16 bytes a lane (``WIDE``: four columns a chunk, one ld.v4 of gate
# and one of up), meets through shuffles, and writes four codes a lane as one word.
SILU_WARPS = 1 if SIMULATOR else 8  # rows a block
SILU_THREADS = 32 * SILU_WARPS
# blocks of the dynamic amax pass: few enough that every block of the quantize pass reduces all
# partials cheaply (quant.py's AMAX_BLOCKS_PER_SM)
SILU_AMAX_BLOCKS_PER_SM = 8
_U32_16 = np.uint32(16)
WIDE = 4  # columns a chunk where the rows allow 16-byte access (``silu_width``)
_silu_block_max = block_max_for(SILU_THREADS)


def silu_width(half, group_size, aligned):
    """Columns a lane takes at a time: ``WIDE`` where I (``half``) and the group (per-group; other
    modes pass ``WIDE``) are multiples of 4 and the buffers 16-byte aligned, else 1."""
    return WIDE if aligned and half % WIDE == 0 and group_size % WIDE == 0 else 1


def silu_segment(group_size, width):
    """Lanes a per-group group spans in one step (its chunks), where that is a power of two <= 32
    (the group's amax then meets inside its segment of lanes, one read of the row); 0 where it is
    not, and the warp walks the row's groups one by one instead."""
    chunks = group_size // width
    return chunks if 1 <= chunks <= 32 and chunks & (chunks - 1) == 0 else 0


@functools.cache
def silu_kernel(mode, encoder="portable", ue8m0=False, e8m0=None, width=WIDE, segment=0):
    """The SiLU kernel of ``mode`` (a ``SiluMode``): a warp per row (``SILU_WARPS`` rows a block,
    grid-stride over rows), the row in chunks of ``width`` columns (``silu_width``), chunk c of every
    row taken by lane c % 32. Per token: the row's amax, then its codes (the chunks read twice, the
    second time from L1). Per group: ``segment`` lanes a group (``silu_segment``), or, 0, the warp
    walks the groups. ``ue8m0`` / ``e8m0`` ('rceil', 'floor'): the per-group scale rule (quant.py's
    ``_group_scale_rule``). One signature for every mode; a mode ignores the arguments it does not
    write or read. h, act: flat float32; codes: flat uint32 (four codes a word) where ``width`` is
    ``WIDE``, flat uint8 else."""
    encode = codec.encode_one(encoder)
    pair = codec.encode_pair(encoder)
    scale_of, _ = _group_scale_rule(ue8m0, e8m0)
    e8m0_scales = e8m0 is not None
    wide = width == WIDE
    per_group_steps = mode == SiluMode.PER_GROUP and segment > 0

    @cuda.jit(**DEVICE_INLINE)
    def chunk(h, row, c, half, live):
        """The four activations of chunk c of ``row`` (width 1: the one, then zeros); zeros on a row
        that is not live."""
        if not live:
            return F32_ZERO, F32_ZERO, F32_ZERO, F32_ZERO
        if wide:
            words = half // WIDE  # 16-byte words of gate (then of up) in a row
            g0, g1, g2, g3 = load_u32x4(h, 2 * row * words + c)
            u0, u1, u2, u3 = load_u32x4(h, 2 * row * words + words + c)
            return (
                silu_mul_scalar(bits_float32(g0), bits_float32(u0)),
                silu_mul_scalar(bits_float32(g1), bits_float32(u1)),
                silu_mul_scalar(bits_float32(g2), bits_float32(u2)),
                silu_mul_scalar(bits_float32(g3), bits_float32(u3)),
            )
        return silu_mul_scalar(h[2 * row * half + c], h[2 * row * half + half + c]), F32_ZERO, F32_ZERO, F32_ZERO

    @cuda.jit(**DEVICE_INLINE)
    def amax4(v0, v1, v2, v3):
        return max(max(finite_abs(v0), finite_abs(v1)), max(finite_abs(v2), finite_abs(v3)))

    @cuda.jit(**DEVICE_INLINE)
    def put_codes(codes, row, c, half, v0, v1, v2, v3):
        """Codes of the chunk's (already scaled) activations."""
        if wide:
            codes[row * (half // WIDE) + c] = pair(v0, v1) | (pair(v2, v3) << _U32_16)
        else:
            codes[row * half + c] = encode(v0)

    def silu(h, act, codes, scales, scale_bytes, partials, offsets, input_scales, num_experts, half, group_size, rows):
        red = cuda.shared.array(SILU_THREADS, types.float32)
        t = cuda.threadIdx.x
        lane = t % 32
        warp = t // 32
        chunks = half // width
        steps = (chunks + 31) // 32  # every warp takes as many: the simulator's reductions sync the block
        routed = offsets[num_experts]
        mult = F32_ONE
        if mode == SiluMode.DYNAMIC:  # every block reduces the partials to the one scale
            amax = F32_ZERO
            for p in range(t, partials.shape[0], SILU_THREADS):
                amax = max(amax, partials[p])
            s = max(_silu_block_max(amax, red) / F32_E4M3_MAX, F32_MIN_SCALE)
            if cuda.grid(1) == 0:
                scales[0] = s
            mult = F32_ONE / s
        local = F32_ZERO
        for base in range(cuda.blockIdx.x * SILU_WARPS, rows, cuda.gridDim.x * SILU_WARPS):
            row = base + warp
            here = row < rows
            live = here and row < routed
            if mode == SiluMode.PLAIN:
                for c in range(lane, chunks if here else 0, 32):
                    v0, v1, v2, v3 = chunk(h, row, c, half, live)
                    if wide:
                        bits = float32_bits(v0), float32_bits(v1), float32_bits(v2), float32_bits(v3)
                        store_u32x4(act, row * (half // WIDE) + c, bits[0], bits[1], bits[2], bits[3])
                    else:
                        act[row * half + c] = v0
            elif mode == SiluMode.DYNAMIC_AMAX:
                for c in range(lane, chunks if live else 0, 32):
                    v0, v1, v2, v3 = chunk(h, row, c, half, live)
                    local = max(local, amax4(v0, v1, v2, v3))
            elif mode == SiluMode.DYNAMIC or mode == SiluMode.STATIC:
                if mode == SiluMode.STATIC:
                    s = F32_ONE
                    if live:
                        s = input_scales[expert_of(offsets, num_experts, row)]
                    mult = F32_ONE / s  # float32, as the CPU's np.float32(1.0) / np.float32(scale)
                    if here and lane == 0:
                        scales[row] = s
                for c in range(lane, chunks if here else 0, 32):
                    v0, v1, v2, v3 = chunk(h, row, c, half, live)
                    put_codes(codes, row, c, half, v0 * mult, v1 * mult, v2 * mult, v3 * mult)
            elif mode == SiluMode.PER_TOKEN:
                amax = F32_ZERO
                for c in range(lane, chunks if live else 0, 32):
                    v0, v1, v2, v3 = chunk(h, row, c, half, live)
                    amax = max(amax, amax4(v0, v1, v2, v3))
                s = max(_warp_max(amax, red, lane, warp) / F32_E4M3_MAX, F32_MIN_SCALE)
                if here and lane == 0:
                    scales[row] = s
                for c in range(lane, chunks if here else 0, 32):
                    v0, v1, v2, v3 = chunk(h, row, c, half, live)
                    put_codes(codes, row, c, half, v0 / s, v1 / s, v2 / s, v3 / s)
            elif per_group_steps:  # a group is ``segment`` lanes of one step: one read of the row
                groups = (half + group_size - 1) // group_size
                for step in range(steps):
                    c = 32 * step + lane
                    valid = here and c < chunks
                    v0, v1, v2, v3 = chunk(h, row, c, half, live and c < chunks)
                    stored, s = scale_of(_segment_max(amax4(v0, v1, v2, v3), red, lane, warp, segment))
                    if valid:
                        gi = c // segment
                        if c % segment == 0:
                            if e8m0_scales:
                                scale_bytes[row * groups + gi] = stored
                            else:
                                scales[row * groups + gi] = stored
                        put_codes(codes, row, c, half, v0 / s, v1 / s, v2 / s, v3 / s)
            else:  # PER_GROUP, groups wider than a warp's step: the warp walks them, each read twice
                groups = (half + group_size - 1) // group_size
                per = group_size // width
                for gi in range(groups):
                    lo = gi * per
                    hi = min(chunks, lo + per)
                    amax = F32_ZERO
                    for c in range(lo + lane, hi if live else 0, 32):
                        v0, v1, v2, v3 = chunk(h, row, c, half, live)
                        amax = max(amax, amax4(v0, v1, v2, v3))
                    stored, s = scale_of(_warp_max(amax, red, lane, warp))
                    if here:
                        if lane == 0:
                            if e8m0_scales:
                                scale_bytes[row * groups + gi] = stored
                            else:
                                scales[row * groups + gi] = stored
                        for c in range(lo + lane, hi, 32):
                            v0, v1, v2, v3 = chunk(h, row, c, half, live)
                            put_codes(codes, row, c, half, v0 / s, v1 / s, v2 / s, v3 / s)
        if mode == SiluMode.DYNAMIC_AMAX:
            amax = _silu_block_max(local, red)
            if t == 0:
                partials[cuda.blockIdx.x] = amax

    f32 = types.float32[::1]
    return compile_kernel(
        silu,
        (
            f32,
            f32,
            types.uint32[::1] if wide else types.uint8[::1],
            f32,
            types.uint8[::1],
            f32,
            types.int32[::1],
            f32,
            types.int64,
            types.int64,
            types.int64,
            types.int64,
        ),
    )


def silu_launch(
    mode,
    encoder,
    h,
    act,
    codes,
    scales,
    scale_bytes,
    partials,
    offsets,
    input_scales,
    num_experts,
    group_size,
    blocks,
    ue8m0=False,
    e8m0=None,
    width=WIDE,
):
    """(kernel, grid, block, args) of one SiLU launch (``SiluMode``) over h [P, 2I] float32, ``blocks``
    blocks (``silu_blocks``) and chunks of ``width`` columns (``silu_width``): h, act and codes are
    taken as 2-D arrays and passed flat (codes as words where the width is ``WIDE``)."""
    rows, half = int(h.shape[0]), int(h.shape[1]) // 2
    segment = silu_segment(group_size, width) if mode == SiluMode.PER_GROUP else 0
    codes_flat = codes.reshape(-1)
    if width == WIDE:
        codes_flat = codes_flat.view(np.uint32)
    return (
        silu_kernel(mode, encoder, bool(ue8m0), e8m0, width, segment),
        blocks,
        SILU_THREADS,
        (
            h.reshape(-1),
            act.reshape(-1),
            codes_flat,
            scales,
            scale_bytes,
            partials,
            offsets,
            input_scales,
            num_experts,
            half,
            group_size,
            rows,
        ),
    )


def silu_blocks(rows, mode, sm_count):
    """Blocks of a SiLU launch over ``rows`` rows: a warp a row, capped (the amax pass and the
    quantize pass of dynamic per-tensor share one count, the partials')."""
    blocks = -(-int(rows) // SILU_WARPS)
    if mode in (SiluMode.DYNAMIC_AMAX, SiluMode.DYNAMIC):
        return max(1, min(blocks, sm_count * SILU_AMAX_BLOCKS_PER_SM))
    return max(1, min(blocks, MAX_BLOCKS))


# --- combine ---------------------------------------------------------------------------------------
if SIMULATOR:

    @cuda.jit(**DEVICE_INLINE)
    def mul_rn(a, b):
        return np.float32(a * b)
else:

    @cuda.jit(**DEVICE_INLINE)
    def mul_rn(a, b):
        """a * b rounded on its own: NVVM contracts a multiply feeding an add into one FMA unless
        the multiply is this intrinsic (mul.rn.f32), and the CPU rounds both."""
        return libdevice.fmul_rn(a, b)


class WeightKind(enum.IntEnum):
    """The routing weights' dtype (float32 values, or float16 / bfloat16 bits)."""

    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2


def routing_weight_fn(w_kind):
    """The device function ``weight(w, i)``: routing weight i of ``w`` (float32 values, or float16 /
    bfloat16 bits) as float32."""

    def weight(w, i):
        if w_kind == WeightKind.FLOAT32:
            return w[i]
        if w_kind == WeightKind.FLOAT16:
            return half_bits_to_float32(w[i])
        return bfloat16_bits_to_float32(w[i])

    return cuda.jit(**DEVICE_INLINE)(weight)


def weight_type(w_kind):
    """The kernel argument type of the routing weights of ``w_kind``."""
    return types.float32[::1] if w_kind == WeightKind.FLOAT32 else types.uint16[::1]


# The combine reads y's rows for four columns a thread where y allows 16-byte loads, with the slot
# count compiled in (up to ``COMBINE_MAX_SLOTS``) so the loop over slots unrolls and every slot's loads
# issue before the first add: a thread an output with a run-time slot loop waited on each slot's row
# index, then its y, in turn (117 us a layer at a 2,048-token prefill of Qwen3-30B-A3B shapes on the
# H200, 2026-12-03, where its bytes take about 40). The adds stay in slot order.
COMBINE_MAX_SLOTS = 16


def combine_width(h, aligned):
    """Columns a combine thread takes: 4 where H is a multiple of 4 and y is 16-byte aligned, else 1."""
    return 4 if aligned and h % 4 == 0 else 1


@functools.cache
def combine_kernel(w_kind, out_is_float32, slots=0, width=1):
    """out[t, c] = round_out(sum_j w[t, j] * y[pair_row[t, j], c]), ``width`` adjacent outputs a
    thread (y flat; 4: one 16-byte load a slot), grid-stride; ``slots``: k compiled in (0: read from
    the argument)."""
    wide = width == 4

    def combine(y, pair_row, w, out, out_kind, k):
        t_total = out.shape[0]
        h = out.shape[1]
        per_row = h // width
        kk = slots if slots > 0 else k
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < t_total * per_row:
            t = i // per_row
            c = (i - t * per_row) * width
            a0 = F32_ZERO
            a1 = F32_ZERO
            a2 = F32_ZERO
            a3 = F32_ZERO
            for j in range(kk):
                r = pair_row[t * k + j]
                if r >= 0:
                    wt = weight(w, t * k + j)
                    if wide:
                        y0, y1, y2, y3 = load_u32x4(y, (r * h + c) // 4)
                        a0 = np.float32(a0 + mul_rn(wt, bits_float32(y0)))
                        a1 = np.float32(a1 + mul_rn(wt, bits_float32(y1)))
                        a2 = np.float32(a2 + mul_rn(wt, bits_float32(y2)))
                        a3 = np.float32(a3 + mul_rn(wt, bits_float32(y3)))
                    else:
                        a0 = np.float32(a0 + mul_rn(wt, y[r * h + c]))
            store_out(out, t, c, a0, out_kind)
            if wide:
                store_out(out, t, c + 1, a1, out_kind)
                store_out(out, t, c + 2, a2, out_kind)
                store_out(out, t, c + 3, a3, out_kind)
            i += stride

    weight = routing_weight_fn(w_kind)
    return compile_kernel(
        combine,
        (
            types.float32[::1],
            types.int32[::1],
            weight_type(w_kind),
            out_type(out_is_float32),
            types.int32,
            types.int64,
        ),
    )


def combine_launch(y, pair_row, w_flat, w_kind, out_bits, out_kind, k, aligned=True):
    """(kernel, grid, block, args) of the combine of y [P, H] float32 into out [T, H] (its bits)."""
    width = combine_width(int(out_bits.shape[1]), aligned)
    total = int(out_bits.shape[0]) * int(out_bits.shape[1]) // width
    slots = k if k <= COMBINE_MAX_SLOTS else 0
    return (
        combine_kernel(int(w_kind), int(out_kind) == OutKind.FLOAT32, slots, width),
        _grid(total),
        THREADS,
        (y.reshape(-1), pair_row, w_flat, out_bits, int(out_kind), k),
    )


__all__ = [
    "ALIGN_THREADS",
    "ALIGN_WARPS",
    "MAX_ALIGN_EXPERTS",
    "align_warps",
    "align_kernel",
    "align_launches",
    "align_blocks",
    "align_counts_kernel",
    "ALIGN_CHUNK",
    "THREADS",
    "UNIT_DTYPES",
    "gather_kernel",
    "gather_launch",
    "row_tiles_kernel",
    "row_tiles_launch",
    "row_tile_count",
    "expert_of",
    "static_rows_kernel",
    "static_rows_launch",
    "SiluMode",
    "silu_mul_value",
    "silu_kernel",
    "silu_launch",
    "silu_blocks",
    "WeightKind",
    "combine_kernel",
    "routing_weight_fn",
    "weight_type",
    "combine_launch",
    "combine_width",
    "COMBINE_MAX_SLOTS",
    "mul_rn",
]
