"""The grouped FP8 GEMM on CUDA cores: every expert's rows times its weight in one launch, for every
scale kind the CPU's ``grouped_scaled_mm`` takes (``vtnumba/cpu/experts.py``).

    y[r, n] = round_out(sum_kb (P[r, n, kb] * sa[r, kb]) * sb[e, n // bn, kb])      rows r of expert e

with P the float32 sum of the exact products of K-block kb (DESIGN.md's block-scaled GEMM, upstream's
order). Without block scales there is one K-block, K wide: ``(P * sa) * sb``, the Numba GEMMs' order.
Scales are read as ``s[row * row_step + kb * kb_step]`` (activation: [1], [P], [P, KB]) and
``s[e * e_step + (n // bn) * nb_step + kb * kb_step]`` (weight: [E], [E, N], [E, NB, KB]), float32 or
E8M0 bytes (decoded exactly, ``codec.decode_e8m0``).

The grid is (N-tiles, G + 1): grid row i runs expert ``active[i]`` (kernels/moe.py's map of the
experts with rows, G = min(E, P) entries, -1 past the count; every expert in order when that saves
nothing). A block reads ``offsets[e]`` and ``offsets[e + 1]`` itself and returns at once when its
expert is empty, so the host never learns the counts; the last grid row (e = E) writes the padding
rows (offsets[E] .. P) as 0.

``grouped_kernel`` (the decode kernel; K % 16 == 0, 16-byte rows, K-blocks of 16 * 2^i <= 512 bytes):
gemv.py's layout per expert. A block owns ``rows`` weight rows; its threads split K, each loading 16
weight bytes of every row per step (128-bit loads, issued before any arithmetic) and the same 16
bytes of up to ``m_tile`` activation rows; weights decoded by bit placement times 2^-120,
activations times 2^60, products exact, float32 FMAs. The expert's rows are taken ``m_tile`` at a
time: each slice streams the weight tile once (so at decode, up to ``m_tile`` rows per expert, each
routed expert's weight is read once), the rows past the expert's count skipped by a block-uniform
test. With block scales, the ``bk / 16`` lanes that cover one K-block meet through shuffles at the
step's end and one of them adds ``(P * sa) * sb``; the threads' sums then meet as in gemv.py.

``general_kernel`` (any K, block size, alignment): a thread per output column, each row's K-blocks
summed element by element from the scalar decoder. The path of last resort.

NaN codes poison their row or column (flags, as gemv.py); a NaN E8M0 byte poisons through the
arithmetic. Both kernels meet DESIGN.md's G3 (per block) bound: float32 sums of exact products.
"""

import functools

import numpy as np

from ..ptx import codec
from ..ptx.codec import decode_e4m3, decode_e8m0, e4m3x4_scaled, fill, nan_code_bits
from ..ptx.target import DEVICE_INLINE, SIMULATOR, cuda, types
from ..runtime.launch import compile_kernel
from .epilogue import out_type, store_out
from .rows import fma_rows_for

_F32_ZERO = np.float32(0.0)
_F32_NAN = np.float32(np.nan)
_U32_ZERO = np.uint32(0)
_F32_2P60 = np.float32(2.0**60)
_F32_2P120 = np.float32(2.0**120)

GROUPED_THREADS = 128  # gemv.py's measured 128
MAX_SEGMENT = 32  # lanes of one K-block: bk <= 16 * 32 bytes
GENERAL_THREADS = 32 if SIMULATOR else 128


def _shfl_segment_sum(v, scratch, lane, warp, width):
    offset = width // 2
    while offset > 0:
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, offset)
        offset //= 2
    return v


def _simulated_segment_sum(v, scratch, lane, warp, width):
    """The same sum through shared memory (the simulator has no shuffles); every thread of the
    block must call it."""
    scratch[warp * 32 + lane] = v
    cuda.syncthreads()
    first = warp * 32 + (lane // width) * width
    total = np.float32(0.0)
    for i in range(width):
        total += scratch[first + i]
    cuda.syncthreads()
    return total


# the sum of v over each aligned run of ``width`` lanes (a power of two <= 32), in every lane of it
segment_sum = cuda.jit(**DEVICE_INLINE)(_simulated_segment_sum if SIMULATOR else _shfl_segment_sum)


@cuda.jit(**DEVICE_INLINE)
def _scale_at(f32, u8, e8m0, index):
    """A scale from float32 values or E8M0 bytes (decoded exactly)."""
    if e8m0:
        return decode_e8m0(u8[index])
    return f32[index]


def m_tile_for(rows):
    """The compiled activation-row slice for calls of ``rows`` rows in all: 1, 2 or 4."""
    return 1 if rows <= 1 else 2 if rows <= 2 else 4


def rows_for(m_tile):
    """Weight rows a block owns: 4, 2 at m_tile 4 (gemv.py's register budget); under the simulator,
    whose cost is per block, 8."""
    if SIMULATOR:
        return 8
    return 4 if m_tile <= 2 else 2


def threads_for(k):
    """Threads a block: 128 split K in 16-byte steps; 64 or 32 where K has fewer steps than that."""
    k16 = k // 16
    if k16 >= 128 and not SIMULATOR:  # (the simulator runs a Python thread a thread: at most two warps)
        return GROUPED_THREADS
    return 64 if k16 > 32 else 32


@functools.cache
def grouped_kernel(m_tile, rows, threads, segment, blocked, sa_e8m0, sb_e8m0, hardware):
    """The decode grouped GEMM (module docstring) for up to ``m_tile`` rows a slice, ``rows`` weight
    rows and ``threads`` threads a block; ``blocked``: K-blocks of 16 * ``segment`` bytes scaled at
    each step's end (else one scaling at the end); ``sa_e8m0`` / ``sb_e8m0``: E8M0 byte scales;
    ``hardware``: inline-PTX 128-bit loads (a real GPU) or the portable ones."""
    load_words = codec.load_row_words if hardware else codec.load_row_words_u8
    n_acc = rows * m_tile
    warps = threads // 32
    n_partial = warps * n_acc
    n_x = 16 * m_tile  # (local array sizes must be constants of the factory, not expressions)
    n_words = 4 * rows
    scratch_size = threads * n_acc if SIMULATOR else 1

    if SIMULATOR:  # no shuffles: every sum through shared memory at once, two barriers (each costs)

        @cuda.jit(**DEVICE_INLINE)
        def segment_sums(vals, sums, scratch, lane, warp, width):
            """sums[i] = the sum of vals[i] over this lane's run of ``width`` lanes, for every i."""
            tid = warp * 32 + lane
            for i in range(n_acc):
                scratch[tid * n_acc + i] = vals[i]
            cuda.syncthreads()
            first = warp * 32 + (lane // width) * width
            for i in range(n_acc):
                total = np.float32(0.0)
                for j in range(width):
                    total += scratch[(first + j) * n_acc + i]
                sums[i] = total
            cuda.syncthreads()
    else:

        @cuda.jit(**DEVICE_INLINE)
        def segment_sums(vals, sums, scratch, lane, warp, width):
            for i in range(n_acc):
                sums[i] = segment_sum(vals[i], scratch, lane, warp, width)

    fma_rows = fma_rows_for(rows, m_tile)

    def grouped(
        a,
        b,
        offsets,
        sa_f,
        sa_u,
        sa_row,
        sa_kb,
        sb_f,
        sb_u,
        sb_e,
        sb_nb,
        sb_kb,
        block_n,
        block_k,
        num_experts,
        y,
        out_kind,
        active,
    ):
        e = active[cuda.blockIdx.y]
        if e < 0:
            return
        n_total = y.shape[1]
        k16 = a.shape[1] // 16
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        n_base = cuda.blockIdx.x * rows
        if e == num_experts:  # the padding rows, zeroed once by this grid row
            first = offsets[num_experts]
            for i in range(tid, (y.shape[0] - first) * rows, threads):
                n = n_base + i % rows
                if n < n_total:
                    store_out(y, first + i // rows, n, _F32_ZERO, out_kind)
            return
        lo = offsets[e]
        hi = offsets[e + 1]
        if hi <= lo:
            return
        partial = cuda.shared.array(n_partial, types.float32)
        scratch = cuda.shared.array(scratch_size, types.float32)
        acc = cuda.local.array(n_acc, types.float32)
        part = cuda.local.array(n_acc, types.float32)
        sums = cuda.local.array(n_acc, types.float32)
        xv = cuda.local.array(n_x, types.float32)
        qw = cuda.local.array(4, types.uint32)
        words = cuda.local.array(n_words, types.uint32)
        w_nan = cuda.local.array(rows, types.uint32)
        x_nan = cuda.local.array(m_tile, types.uint32)
        steps = (k16 + threads - 1) // threads
        w_first = e * n_total
        for r0 in range(lo, hi, m_tile):
            live = min(m_tile, hi - r0)  # block-uniform: the rows past it cost nothing
            fill(acc, _F32_ZERO)
            fill(w_nan, _U32_ZERO)
            fill(x_nan, _U32_ZERO)
            for step in range(steps):  # every thread the same count (the block-scale shuffles need them all)
                c = tid + step * threads
                valid = c < k16
                if blocked:
                    fill(part, _F32_ZERO)
                if valid:  # (only the last step leaves threads out)
                    for r in range(rows):  # all loads first; rows past N reread the last one (dropped)
                        w0, w1, w2, w3 = load_words(b, w_first + min(n_base + r, n_total - 1), 16 * c)
                        words[4 * r] = w0
                        words[4 * r + 1] = w1
                        words[4 * r + 2] = w2
                        words[4 * r + 3] = w3
                    for m in range(m_tile):
                        if m < live:
                            qw[0], qw[1], qw[2], qw[3] = load_words(a, r0 + m, 16 * c)
                            for i in range(4):
                                x_nan[m] |= nan_code_bits(qw[i])
                                f0, f1, f2, f3 = e4m3x4_scaled(qw[i])  # times 2^-120, then times 2^60
                                xv[16 * m + 4 * i] = np.float32(np.float32(f0 * _F32_2P120) * _F32_2P60)
                                xv[16 * m + 4 * i + 1] = np.float32(np.float32(f1 * _F32_2P120) * _F32_2P60)
                                xv[16 * m + 4 * i + 2] = np.float32(np.float32(f2 * _F32_2P120) * _F32_2P60)
                                xv[16 * m + 4 * i + 3] = np.float32(np.float32(f3 * _F32_2P120) * _F32_2P60)
                        else:
                            for j in range(16):
                                xv[16 * m + j] = _F32_ZERO
                    fma_rows(words, xv, part if blocked else acc, w_nan)
                if blocked:
                    kb = (16 * c) // block_k
                    lead = valid and lane % segment == 0
                    segment_sums(part, sums, scratch, lane, warp, segment)
                    for r in range(rows):
                        sb = _F32_ZERO
                        if lead:
                            sb = _scale_at(
                                sb_f,
                                sb_u,
                                sb_e8m0,
                                e * sb_e + (min(n_base + r, n_total - 1) // block_n) * sb_nb + kb * sb_kb,
                            )
                        for m in range(m_tile):
                            p = sums[r * m_tile + m]
                            if lead and m < live:
                                sa = _scale_at(sa_f, sa_u, sa_e8m0, (r0 + m) * sa_row + kb * sa_kb)
                                acc[r * m_tile + m] += np.float32(np.float32(np.float32(p * _F32_2P60) * sa) * sb)
            for r in range(rows):
                for m in range(m_tile):
                    if w_nan[r] != _U32_ZERO or x_nan[m] != _U32_ZERO:
                        acc[r * m_tile + m] = _F32_NAN
            segment_sums(acc, sums, scratch, lane, warp, 32)
            if lane == 0:
                for i in range(n_acc):
                    partial[warp * n_acc + i] = sums[i]
            cuda.syncthreads()
            out_r = tid // m_tile
            out_m = tid - out_r * m_tile
            if tid < n_acc and n_base + out_r < n_total and out_m < live:
                total = _F32_ZERO
                for w in range(warps):
                    total += partial[w * n_acc + tid]
                n = n_base + out_r
                if not blocked:
                    total = np.float32(total * _F32_2P60)  # exact: undo the 2^-60
                    sa = sa_f[(r0 + out_m) * sa_row]
                    sb = sb_f[e * sb_e + (n // block_n) * sb_nb]
                    total = np.float32(np.float32(total * sa) * sb)
                store_out(y, r0 + out_m, n, total, out_kind)
            cuda.syncthreads()  # the partials are the next slice's

    return grouped


def _signature(out_is_float32):
    u8 = types.uint8[::1]
    f32 = types.float32[::1]
    i64 = types.int64
    return (
        types.uint8[:, :],
        types.uint8[:, :],
        types.int32[::1],
        f32,
        u8,
        i64,
        i64,
        f32,
        u8,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        out_type(out_is_float32),
        types.int32,
        types.int32[::1],
    )


@functools.cache
def grouped_launcher(m_tile, rows, threads, segment, blocked, sa_e8m0, sb_e8m0, hardware, out_is_float32):
    return compile_kernel(
        grouped_kernel(m_tile, rows, threads, segment, blocked, sa_e8m0, sb_e8m0, hardware), _signature(out_is_float32)
    )


@functools.cache
def general_kernel(sa_e8m0, sb_e8m0):
    """The general grouped kernel (module docstring) for float32 or E8M0 scales on either side."""

    def general(
        a,
        b,
        offsets,
        sa_f,
        sa_u,
        sa_row,
        sa_kb,
        sb_f,
        sb_u,
        sb_e,
        sb_nb,
        sb_kb,
        block_n,
        block_k,
        num_experts,
        y,
        out_kind,
        active,
    ):
        e = active[cuda.blockIdx.y]
        if e < 0:
            return
        n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        n_total = y.shape[1]
        k_total = a.shape[1]
        if n >= n_total:
            return
        if e == num_experts:
            for r in range(offsets[num_experts], y.shape[0]):
                store_out(y, r, n, _F32_ZERO, out_kind)
            return
        w_row = e * n_total + n
        nkb = (k_total + block_k - 1) // block_k
        for r in range(offsets[e], offsets[e + 1]):
            acc = _F32_ZERO
            for kb in range(nkb):
                p = _F32_ZERO
                for k in range(kb * block_k, min(k_total, kb * block_k + block_k)):
                    p += decode_e4m3(a[r, k]) * decode_e4m3(b[w_row, k])
                sa = _scale_at(sa_f, sa_u, sa_e8m0, r * sa_row + kb * sa_kb)
                sb = _scale_at(sb_f, sb_u, sb_e8m0, e * sb_e + (n // block_n) * sb_nb + kb * sb_kb)
                acc += np.float32(np.float32(p * sa) * sb)
            store_out(y, r, n, acc, out_kind)

    return general


@functools.cache
def general_launcher(sa_e8m0, sb_e8m0, out_is_float32):
    return compile_kernel(general_kernel(sa_e8m0, sb_e8m0), _signature(out_is_float32))


# ------------------------------------------------------------------------------------------------
# host side: which of the two takes a call, and its launch (``call`` is grouped.GroupedCall)


def segment_for(block_k):
    """Lanes per K-block of the decode kernel (bk / 16, a power of two <= 32), or None."""
    if block_k % 16:
        return None
    seg = block_k // 16
    return seg if seg <= MAX_SEGMENT and seg & (seg - 1) == 0 else None


def grouped_reason(call):
    """Why the decode grouped kernel cannot run ``call`` (None if it can)."""
    if call.k % 16:
        return f"the grouped kernel reads 16 bytes at a time: K must be a multiple of 16, got {call.k}"
    if call.blocked and segment_for(call.block_k) is None:
        return (
            f"the grouped kernel takes K-blocks of 16, 32, 64, 128, 256 or 512 (whole 16-byte steps of at "
            f"most a warp), got block_k = {call.block_k}"
        )
    if not SIMULATOR:
        for name, arr in (("a", call.a), ("b", call.b2d)):
            if arr.strides[1] != 1 or arr.strides[0] % 16 or arr.data.ptr % 16:
                return f"the grouped kernel needs 16-byte aligned {name} rows"
    return None


def _scale_args(call, dev):
    f32, u8 = dev.placeholder("f32"), dev.placeholder("u8_2d").reshape(-1)
    sa_f, sa_u = (f32, call.sa) if call.sa_e8m0 else (call.sa, u8)
    sb_f, sb_u = (f32, call.sb) if call.sb_e8m0 else (call.sb, u8)
    return (
        sa_f,
        sa_u,
        call.sa_row,
        call.sa_kb,
        sb_f,
        sb_u,
        call.sb_e,
        call.sb_nb,
        call.sb_kb,
        call.block_n,
        call.block_k,
        call.e,
    )


def grouped_launch(call, y_bits, out_kind, active):
    """(kernel, grid, block, args) of the decode grouped kernel; ``active`` int32 [G + 1]: the expert of
    each grid row (kernels/moe.py's map; its last entry E is the padding rows' row)."""
    m_tile = m_tile_for(call.p)
    rows = rows_for(m_tile)
    threads = threads_for(call.k)
    segment = segment_for(call.block_k) if call.blocked else 1
    kernel = grouped_launcher(
        m_tile,
        rows,
        threads,
        segment,
        call.blocked,
        call.sa_e8m0,
        call.sb_e8m0,
        codec.hardware_available(call.device.cc),
        call.out_dtype == np.float32,
    )
    return (
        kernel,
        (-(-call.n // rows), int(active.shape[0])),
        threads,
        (call.a, call.b2d, call.offsets) + _scale_args(call, call.device) + (y_bits, int(out_kind), active),
    )


def general_launch(call, y_bits, out_kind, active):
    """(kernel, grid, block, args) of the general grouped kernel (``active`` as grouped_launch's)."""
    kernel = general_launcher(call.sa_e8m0, call.sb_e8m0, call.out_dtype == np.float32)
    return (
        kernel,
        (-(-call.n // GENERAL_THREADS), int(active.shape[0])),
        GENERAL_THREADS,
        (call.a, call.b2d, call.offsets) + _scale_args(call, call.device) + (y_bits, int(out_kind), active),
    )


__all__ = [
    "GROUPED_THREADS",
    "GENERAL_THREADS",
    "segment_sum",
    "m_tile_for",
    "rows_for",
    "threads_for",
    "grouped_kernel",
    "grouped_launcher",
    "general_kernel",
    "general_launcher",
    "segment_for",
    "grouped_reason",
    "grouped_launch",
    "general_launch",
]
