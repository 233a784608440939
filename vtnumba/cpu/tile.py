"""The small-M GEMMs on the AVX-512 paths: register tiles along M, each sum in K order.

``gemm.small_m_kernel`` and its block-scaled twin sum each output along k in 16 lanes (a 4 x 4 block
of dot products) and reduce the lanes at the end of every pass: at the small layers of a research
model (K = 256-512) and at every 128-wide K-block, the reductions and the activation rows read again
for every four weight rows cost more than the multiply-adds. Measured on a 2-core Sapphire Rapids
(benchmarks/RESULTS.md, 2026-12-07): 128 x 256 x 512 took 243-251 us on two threads (434-444 on one)
against 144-192 us for numpy's sgemm on float32 weights; the tiles below, 191-194 us (323-325).

Here the activation is transposed once per call (``xt[k, m]``, M padded with zeros to a multiple of
16) and the decoded weight rows are broadcast: a tile of 16 or 32 activation rows (one or two
<16 x float> vectors along m) by 8 or 16 weight rows holds 16 accumulators in registers, and each
step of k is one or two vector loads, 8 or 16 broadcasts and 16 FMAs. No lane is ever reduced, and
each output's sum runs in K order, one rounding a term: an e4m3 x e4m3 product is exact in float32, so
the FMA rounds once, as the reference kernel's ``p += x * w`` does. The dense kernel is therefore
bitwise the reference kernel, and the block-scaled one bitwise the block reference (each K-block's sum
in order, then the strict block step); tests/test_cpu_tile.py checks both.

The tiles are written as LLVM vector IR through a Numba intrinsic (``_sum_tile``), as vbmi.py's lookups
are: Numba's loops left the accumulators in memory or packed them partly (block.py's note on the
SLP vectorizer). They take 16 activation rows and more (``MIN_ROWS``; below, the 4 x 4 kernels stay),
and only the AVX-512 paths run them (``paths.CpuPath.register_tiles``): 32 vector
registers hold the 16 accumulators; on AVX2's 16 they would spill, and the NEON and portable paths keep
``gemm.small_m_kernel``, unmeasured with these tiles.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .._config import CPU_INLINE
from . import vbmi
from .codec import decode_e4m3

LANES = 16  # float32 lanes of a zmm register: activation rows per vector
# K per pass: the decoded weight rows' buffer is [rows, TILE_K] (16 x 512 float32 = 32 KiB, in L1), a
# fixed row stride, so a step's broadcasts address every row from one register with constant offsets
# (with the stride a variable, LLVM kept 16 row pointers and reloaded 6 from the stack each step).
TILE_K = 512
# The fewest activation rows the tiles take (the small-M kernels' choice, gemm.rows_kernel and its
# twins): below, a vector holds fewer rows than it computes. Measured against the 4 x 4 kernels (serial,
# the Sapphire Rapids core, benchmarks/cpu/bench_cpu_tiles.py): dense 0.80x / 0.89x / 1.11x at M = 2 /
# 4 / 8 (K x N = 256 x 512) and 0.52x / 0.61x / 0.82x (2048 x 768, an MoE expert's gate_up); at M = 16
# 1.3-1.5x.
MIN_ROWS = 16
# How the tiles' callers decode activation codes (``activation_columns``): the bit arithmetic here; the
# VBMI paths' kernel_globals bind ``tile_lookup`` to True (byte lookups), as they bind ``tile_decode``.
TILE_LOOKUP = False
_F32, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
_VEC = ir.VectorType(_F32, LANES)


def _c_float32(*arrays):
    """Whether every argument is typed as a 2-D C-contiguous float32 array (an intrinsic refuses
    others at compile time: its row addresses come from shape[1])."""
    return all(
        isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C" and a.dtype == types.float32 for a in arrays
    )


def _sum_tile(vectors, rows):
    """An intrinsic ``sum_tile(xt, m0, k0, kc, w, acc)``: for j < ``rows`` and the ``vectors`` * 16
    activation rows from m0, ``acc[j, m] += w[j, k] * xt[k0 + k, m]`` for k = 0 .. kc - 1 in order
    (one FMA a term). xt [K, Mp], w [rows or more, TILE_K] (``weight_buffer``'s: its row stride is
    compiled in) and acc [rows or more, Mp] are C-contiguous float32; m0 + 16 * vectors <= Mp, kc <=
    TILE_K. The accumulators live in registers through the loop."""

    @intrinsic
    def sum_tile(typingctx, xt, m0, k0, kc, w, acc):
        if not _c_float32(xt, w, acc):
            return None  # the addresses below assume C-contiguous float32 rows
        sig = types.none(xt, m0, k0, kc, w, acc)

        def codegen(context, builder, signature, args):
            xt_arr, w_arr, acc_arr = (
                context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 4, 5)
            )
            m0, k0, kc = (context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 2, 3))
            xt_width = cgutils.unpack_tuple(builder, xt_arr.shape)[1]
            w_width = ir.Constant(_I64, TILE_K)
            acc_width = cgutils.unpack_tuple(builder, acc_arr.shape)[1]
            xp, wp, ap = (builder.bitcast(a.data, _F32.as_pointer()) for a in (xt_arr, w_arr, acc_arr))
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3), "llvm.fma.v16f32")
            splat = ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES)

            def vector_at(base, offset):
                return builder.bitcast(builder.gep(base, [offset]), _VEC.as_pointer())

            def acc_offset(j, v):
                lane0 = builder.add(m0, ir.Constant(_I64, LANES * v))
                return builder.add(builder.mul(ir.Constant(_I64, j), acc_width), lane0)

            def running_sum(j, v):  # where the sums start: acc as the caller left it
                return builder.load(vector_at(ap, acc_offset(j, v)), align=4)

            slots = [
                [cgutils.alloca_once_value(builder, running_sum(j, v)) for v in range(vectors)] for j in range(rows)
            ]
            with cgutils.for_range(builder, kc) as loop:
                k = loop.index
                x_row = builder.add(builder.mul(builder.add(k0, k), xt_width), m0)
                xs = [
                    builder.load(vector_at(xp, builder.add(x_row, ir.Constant(_I64, LANES * v))), align=4)
                    for v in range(vectors)
                ]
                for j in range(rows):
                    wk = builder.load(builder.gep(wp, [builder.add(builder.mul(ir.Constant(_I64, j), w_width), k)]))
                    one = builder.insert_element(ir.Constant(_VEC, ir.Undefined), wk, ir.Constant(_I32, 0))
                    wide = builder.shuffle_vector(one, ir.Constant(_VEC, ir.Undefined), splat)
                    for v in range(vectors):
                        slot = slots[j][v]
                        builder.store(builder.call(fma, [wide, xs[v], builder.load(slot)]), slot)
            for j in range(rows):
                for v in range(vectors):
                    builder.store(builder.load(slots[j][v]), vector_at(ap, acc_offset(j, v)), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return sum_tile


@intrinsic
def transpose16(typingctx, src, r0, c0, dst, r1, c1, rows, cols):
    """dst[r1 + i, c1 + j] = src[r0 + j, c0 + i] for i < rows and j < cols (both <= 16): a 16 x 16
    float32 block of src transposed in registers (sixteen vector loads, four rounds of sixteen
    two-source shuffles, ``_transposed_rows``) and stored a row at a time under a mask of ``cols``
    lanes, so that dst's columns past them (another tile's, another thread's) are never written.
    ``src`` (holding the whole block) and ``dst`` are 2-D C-contiguous float32."""
    if not _c_float32(src, dst):
        return None  # the addresses below assume C-contiguous float32 rows
    sig = types.none(src, r0, c0, dst, r1, c1, rows, cols)

    def codegen(context, builder, signature, args):
        (sp, src_width), (dp, dst_width) = _float32_rows(context, builder, signature, args, (0, 3))
        r0, c0, r1, c1, rows, cols = (
            context.cast(builder, args[i], signature.args[i], types.int64) for i in (1, 2, 4, 5, 6, 7)
        )
        vectors = _transposed_rows(
            builder, [builder.load(_row_at(builder, sp, src_width, r0, c0, j), align=4) for j in range(LANES)]
        )
        lanes = ir.Constant(ir.VectorType(_I32, LANES), list(range(LANES)))
        limit = builder.insert_element(
            ir.Constant(ir.VectorType(_I32, LANES), ir.Undefined), builder.trunc(cols, _I32), ir.Constant(_I32, 0)
        )
        limit = builder.shuffle_vector(
            limit,
            ir.Constant(ir.VectorType(_I32, LANES), ir.Undefined),
            ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES),
        )
        mask = builder.icmp_unsigned("<", lanes, limit)
        store = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [_VEC, _VEC.as_pointer(), _I32, ir.VectorType(ir.IntType(1), LANES)]),
            "llvm.masked.store.v16f32.p0",
        )
        for i in range(LANES):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, i), rows), likely=True):
                builder.call(
                    store, [vectors[i], _row_at(builder, dp, dst_width, r1, c1, i), ir.Constant(_I32, 4), mask]
                )
        return context.get_dummy_value()

    return sig, codegen


def _float32_rows(context, builder, signature, args, positions):
    """(float* data, row width) of each 2-D C-contiguous float32 array argument at ``positions``."""
    arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in positions]
    return [(builder.bitcast(a.data, _F32.as_pointer()), cgutils.unpack_tuple(builder, a.shape)[1]) for a in arrays]


def _row_at(builder, base, width, r, c, i):
    """A <16 x float>* to base[(r + i) * width + c]."""
    at = builder.add(builder.mul(builder.add(r, ir.Constant(_I64, i)), width), c)
    return builder.bitcast(builder.gep(base, [at]), _VEC.as_pointer())


def _transposed_rows(builder, rows):
    """The 16 vectors of a 16 x 16 block's transpose from its 16 row vectors: round d (8, 4, 2, 1)
    swaps, inside every 2d x 2d block, the top-right d x d block with the bottom-left one; after the
    four rounds every element has crossed the diagonal once."""
    rows = list(rows)
    for d in (8, 4, 2, 1):
        upper = [c if not c & d else LANES + c - d for c in range(LANES)]
        lower = [c + d if not c & d else LANES + c for c in range(LANES)]
        for i in range(LANES):
            if i & d:
                continue
            a, b = rows[i], rows[i + d]
            rows[i] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, LANES), upper))
            rows[i + d] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, LANES), lower))
    return rows


# 32 activation rows by 8 weight rows (two vectors a weight: 10 loads and 16 FMAs a step), its 16-row
# edge, and 16 by 16 for M <= 16 (one load, 16 broadcasts and 16 FMAs a step).
_sum_32x8, _sum_16x8, _sum_16x16 = _sum_tile(2, 8), _sum_tile(1, 8), _sum_tile(1, 16)


# Weight rows a tile block sums and stores together: 16 floats, one 64-byte line of each output row.
# With 8 (the 32 x 8 tile's own count), each block wrote half of every line of out, and the other half
# came from the next block once the line had left L1: at 512 x 512 x 256 on one Sapphire Rapids core
# the stores cost 206 us of the call's 1,215 (16 rows: 119 of 1,078).
BLOCK_ROWS = 16


# The activation a tiled kernel's thread takes at once: a panel of rows whose columns xt [K, rows] fill
# about 512 KiB, so they stay in L2 while the thread's weight blocks stream past them; every weight block
# is decoded again for each panel. Whole, the columns outgrew L2 and each 16-row weight block read them
# from L3: on one Sapphire Rapids core a row of 512 x 256 cost 2.0 us at M = 128-256 (sgemm on float32
# weights, 2.0-2.1) and 3.7 at M = 2,048; 256 x 512, 5.6; 768 x 2,048, 51.9 against 27.1 at M = 128.
# In panels of 512 KiB, 2.2-2.8 / 2.2-2.4 / 24.8-30.3 us at M = 2,048 (panels of 128 and 256 KiB
# measured alike within the host's noise, 27.9-33.9 at 768 x 2,048).
PANEL_FLOATS = 128 * 1024
# The fewest rows a panel takes, so that a weight block's decode is shared by 64 activation rows at
# large K.
MIN_PANEL_ROWS = 64


@njit(**CPU_INLINE)
def panel_rows(k_len):
    """Activation rows a tiled kernel's thread takes at once (``PANEL_FLOATS``): a multiple of 32, the
    32 x 8 tiles' rows."""
    return max(MIN_PANEL_ROWS, PANEL_FLOATS // max(1, k_len) // (2 * LANES) * (2 * LANES))


@njit(**CPU_INLINE)
def weight_buffer(rows, valid):
    """The decoded weight rows' buffer, flat: ``rows`` rows of TILE_K and one row of slack, so that
    ``weight_columns`` can view it from any column. Rows past ``valid`` are zero (their sums are never
    stored), the others written by each pass before they are read (zeroing all of it would store
    32 KiB a tile, more than a pass at K <= 512 decodes into it)."""
    w = np.empty((rows + 1) * TILE_K, dtype=np.float32)
    w[valid * TILE_K : rows * TILE_K] = 0.0  # the slack is never read (weight_columns)
    return w


@njit(**CPU_INLINE)
def weight_columns(buffer, rows, first):
    """The buffer's ``rows`` rows from column ``first`` on, as the C-contiguous [rows, TILE_K] the tiles
    read (row j's columns first .. TILE_K - 1, then the next row's: a tile reads fewer than
    TILE_K - first of them). ``weight_columns(buffer, rows, 0)`` is where a pass decodes; a pass of
    several K-blocks then sums each from its own first column."""
    return buffer[first : first + rows * TILE_K].reshape(rows, TILE_K)


@njit(**CPU_INLINE)
def transposed(x):
    """xt[k, m] = x[m, k], M padded with zero rows to a multiple of 16 (the tiles' vectors): whole
    16 x 16 blocks by ``transpose16``, the edges element by element. At M = 128, K = 256 on one
    Sapphire Rapids core: 60 us element by element row by row, 20 in 16 x 16 blocks of scalar
    copies, 4 with ``transpose16``."""
    m_rows, k_len = x.shape
    padded = -(-m_rows // LANES) * LANES
    # np.empty and loops, not np.zeros: inside a parallel kernel, an array expression before the
    # prange is a parallel region of its own (a second launch per call: the dense tiles at
    # 16 x 256 x 256 on two threads took 25 us with it, 20 without)
    xt = np.empty((k_len, padded), dtype=np.float32)
    m_full, k_full = m_rows - m_rows % LANES, k_len - k_len % LANES
    for m0 in range(0, m_full, LANES):
        for k0 in range(0, k_full, LANES):
            transpose16(x, m0, k0, xt, k0, m0, LANES, LANES)
    for m in range(m_rows):
        for k in range(k_full if m < m_full else 0, k_len):
            xt[k, m] = x[m, k]
    for k in range(k_len):
        for m in range(m_rows, padded):
            xt[k, m] = 0.0
    return xt


@njit(**CPU_INLINE)
def store_sums(acc, out, n0, valid):
    """out[m, n0 + j] = acc[j, m] for j < valid and every row m of out, from acc [16, Mp] (a weight row
    per row, as the tiles leave them, the epilogue already applied along its rows): 16 x 16 blocks
    transposed in registers and stored ``valid`` lanes a row. On the Sapphire Rapids core, at 512 x 512
    x 256 on one thread, transposing into a [Mp, 16] buffer and then an epilogue of 8 values a row
    cost 325 of the call's 1,268 us; the epilogue along acc's rows and these stores, 122 of 1,078
    (with 16-row blocks, BLOCK_ROWS)."""
    m_rows = out.shape[0]
    for m0 in range(0, m_rows, LANES):
        transpose16(acc, 0, m0, out, m0, n0, min(LANES, m_rows - m0), valid)


@njit(**CPU_INLINE)
def sum_tiles(xt, k0, kc, w, acc):
    """acc[j, m] += sum_k w[j, k] * xt[k0 + k, m] for the block's BLOCK_ROWS weight rows j and every
    activation row m, over every tile of the call (k in order)."""
    padded = xt.shape[1]
    if padded == LANES:
        _sum_16x16(xt, 0, k0, kc, w, acc)
        return
    # the block's two halves of 8 weight rows on each 32-row tile in turn: the tile's activation
    # columns are read from L1 by the second
    w_lo, w_hi, acc_lo, acc_hi = w[:8], w[8:BLOCK_ROWS], acc[:8], acc[8:BLOCK_ROWS]
    m0 = 0
    while m0 + 2 * LANES <= padded:
        _sum_32x8(xt, m0, k0, kc, w_lo, acc_lo)
        _sum_32x8(xt, m0, k0, kc, w_hi, acc_hi)
        m0 += 2 * LANES
    if m0 < padded:
        _sum_16x8(xt, m0, k0, kc, w_lo, acc_lo)
        _sum_16x8(xt, m0, k0, kc, w_hi, acc_hi)


@njit(**CPU_INLINE)
def decode_block(b, n0, valid, k0, kc, w):
    """w[j, :kc] = dec(b[n0 + j, k0:k0 + kc]) for j < valid (rows past them stay as they are: zeros),
    by the codec's bit arithmetic, which LLVM vectorizes."""
    for j in range(valid):
        src = b[n0 + j, k0 : k0 + kc]
        dst = w[j]
        for k in range(kc):
            dst[k] = decode_e4m3(src[k])


@njit(**CPU_INLINE)
def decode_block_lookup(b, n0, valid, k0, kc, w):
    """``decode_block`` by byte lookups (``vbmi.decode_codes``), 64 codes a step, the last kc % 64 by
    the bit arithmetic: the byte-lookup paths' ``tile_decode`` (paths.py). At M = 16 the decode is a
    large share of the call: with the bit arithmetic, 17.7 us of ~60 at 16 x 256 x 512 on one
    Sapphire Rapids core (45 with the lookups)."""
    steps = kc // vbmi.BLOCK
    for j in range(valid):
        src = b[n0 + j, k0 : k0 + kc]
        dst = w[j]
        vbmi.decode_codes(src, dst, steps)
        for k in range(steps * vbmi.BLOCK, kc):
            dst[k] = decode_e4m3(src[k])


def _decoded_transposer(decode):
    """``transposed`` of dec(codes), with ``decode`` (``decode_block`` or ``decode_block_lookup``)
    bound at compile time: each 16 rows of codes decoded into a [16, K] band, then transposed from it
    by ``transpose16``; the band's rows past M are zeros, so xt's padding columns are zeros."""

    @njit(**CPU_INLINE)
    def decoded_transposed(codes):
        m_rows, k_len = codes.shape
        padded = -(-m_rows // LANES) * LANES
        xt = np.empty((k_len, padded), dtype=np.float32)
        band = np.empty((LANES, k_len), dtype=np.float32)
        k_full = k_len - k_len % LANES
        for m0 in range(0, padded, LANES):
            rows = min(LANES, m_rows - m0)
            decode(codes, m0, rows, 0, k_len, band)
            for j in range(rows, LANES):
                for k in range(k_len):
                    band[j, k] = 0.0
            for k0 in range(0, k_full, LANES):
                transpose16(band, 0, k0, xt, k0, m0, LANES, LANES)
            for k in range(k_full, k_len):
                for j in range(LANES):
                    xt[k, m0 + j] = band[j, k]
        return xt

    return decoded_transposed


_DECODED_TRANSPOSED = {False: _decoded_transposer(decode_block), True: _decoded_transposer(decode_block_lookup)}


def activation_columns(x, lookup):
    """xt [K, Mp] of the activation x [M, K] for the register tiles, M padded with zero columns to a
    multiple of 16: float32 rows transposed (``transposed``), or e4m3 codes decoded as they are
    transposed, by byte lookups where ``lookup`` (a compile-time constant: a path's ``tile_lookup``)
    says so, else by the bit arithmetic. The dense and block-scaled tiles take the codes: each of a
    call's threads builds its own xt from them, as the call's first step, rather than one serial
    decode and transpose whose [K, Mp] float32 the other threads then read out of the first one's
    cache. On the 2-core Sapphire Rapids VM inside a torch forward (M = 128, K = 256), that transfer
    held a second thread back about 30 us, so a call of N = 128 ran no faster on two threads than on
    one (benchmarks/RESULTS.md, 2026-12-07). Compiled code only (an overload by x's dtype)."""
    raise NotImplementedError("activation_columns is compiled by Numba only")


@overload(activation_columns, prefer_literal=True)
def _activation_columns(x, lookup):
    if not isinstance(x, types.Array) or x.ndim != 2:
        return None
    if x.dtype == types.float32:
        return lambda x, lookup: transposed(x)
    if x.dtype == types.uint8 and isinstance(lookup, types.BooleanLiteral):
        decoded_transposed = _DECODED_TRANSPOSED[lookup.literal_value]
        return lambda x, lookup: decoded_transposed(x)
    return None
