"""MXFP8 on the CPU (OCP Microscaling Formats v1.0): E8M0-scaled group quantization, and the GEMM of e4m3
codes whose scales on both operands are E8M0 bytes (DESIGN.md, "MXFP8").

- **quantization**: per group of g values along a row (32 in MXFP8), the group's finite amax gives an
  E8M0 byte (``vtnumba._format.e8m0_scale_byte``: the rceil or the floor rule) and
  ``codes = encode(x / 2^(byte - 127))``; the kernel multiplies by 2^(127 - byte), which is the same
  float32 (one rounding of the same real number).
- **GEMM**: the block-scaled contract, ``y = bias + sum_kb (P_kb * sa) * sb`` (``vtnumba.cpu.block``),
  with power-of-two scales. Those make a shortcut exact: ``dec(a) * sa`` and ``dec(b) * sb`` are
  float32 values with no rounding, and so are their products, whenever the exponents stay in range:
  both bytes in [1, 246] (no 2^-127 subnormal, no NaN, no overflow of 448 * scale) and
  123 <= byte_a + byte_b <= 344 (no product below float32's smallest subnormal step, no partial
  sum near its largest value). Then every term of every output is an exact float32 and the fast
  kernels below sum them with scaled operands, in an order that keeps each term within the
  G3-per-block allowance of ``reference.block_scaled_mm``: a term may pass through at most
  ``8 * nkb + 8 * bk_eff + 4`` float32 roundings (first order; each rounding errs by at most u = eps32 / 2
  of the partial sum, which is at most the sum of its terms' magnitudes). Outside that range (scales
  no real checkpoint holds) ``vtnumba.cpu.block``'s kernels run on the decoded float32 scales, in the
  contract's own order; a weight scale out of range is found while its row is decoded.

The kernels (``kernel=`` picks one by name, as the per-tensor and block-scaled GEMMs do):

- ``reference``: the block-scaled reference kernel on the decoded scales (the contract's order).
- ``small_m`` (M < 64): a (scaled, decoded) and four rows of b decoded with their scales into a
  buffer, 4 x 4 register blocks as ``gemm.small_m_kernel``, in chunks of 256 values of k (8 blocks of
  32): any order inside a chunk (at most 255 roundings a term), chunk sums added in order. At M = 1
  on a path with a byte-lookup MX inner loop (``avx512_vbmi``) the M = 1 kernel runs instead: each
  block's products summed in 16 lanes, scaled, added into lane accumulators (``vbmi.dot4_e4m3_mx``).
- ``blas`` (larger M): both operands decoded with their scales into chunk-major float32 tiles, one
  sgemm per chunk of 256 values of k (whatever order the BLAS sums in, at most 255 roundings a term),
  the chunk products added in order.

A short last block (K % bk != 0) is a chunk of its own, so its terms, whose allowance is smaller,
pass through at most bk_eff + nchunks roundings.
"""

import numpy as np
from numba import njit, prange

from .. import _arrays
from .._config import (
    CPU_CHUNK,
    CPU_INLINE,
    CPU_PARALLEL_MIN_ELEMENTS,
    CPU_PARALLEL_MIN_MACS,
    CPU_SERIAL_KERNEL,
    CPU_STRICT_FUNCTION,
)
from .._format import MX_GROUP
from . import block, paths, tile
from .codec import bits_float32, decode_e4m3, decode_e8m0, e8m0_reciprocal, e8m0_scale_byte
from .gemm import (
    _REASSOC,
    _SMALL_M_ROWS,
    KERNELS,
    accumulate_rows,
    add_bias,
    bias_vector,
    gemm_macs,
    to_out_dtype,
)
from .paths import cpu_kernel, run_sgemm_driver, team_runs, vector_width_hint
from .quant import _elements, _encode_times, _finite_amax
from .vbmi import dot4_e4m3_mx

__all__ = ["quantize_mx", "mx_scaled_mm", "decode_e8m0_array", "KERNELS"]

# Values of k per chunk of the fast kernels: whatever order a chunk is summed in, a term passes
# through at most CHUNK_TERMS - 1 roundings there, inside the 8 * 32 + 4 the G3-per-block bound allows
# each term of a full 32-wide block (module docstring).
CHUNK_TERMS = 256
# The exponent window of the exact shortcut (module docstring), as E8M0 bytes.
_BYTE_MIN, _BYTE_MAX = 1, 246
_PAIR_MIN, _PAIR_MAX = 123, 344


# -- quantization -----------------------------------------------------------------------------------


@cpu_kernel(CPU_PARALLEL_MIN_ELEMENTS, _elements)
def quantize_kernel(x, group_size, rceil, out, scales, scale_row_stride, scale_group_stride):
    """out = encode(x * 2^(127 - byte)) per group of ``group_size`` along each row of x [rows, K], the
    group's E8M0 byte from its finite amax written to ``scales`` (flat, by the two strides: row-major
    or column-major). Work items as ``block.quantize_per_group_kernel``'s."""
    rows, k_len = x.shape
    groups = (k_len + group_size - 1) // group_size
    total = rows * groups
    per_item = max(1, CPU_CHUNK // group_size)
    for item in prange((total + per_item - 1) // per_item):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        first = item * per_item
        r = first // groups
        j = first - r * groups
        for _ in range(first, min(total, first + per_item)):
            lo = j * group_size
            hi = min(k_len, lo + group_size)
            xs = x[r, lo:hi]
            byte = e8m0_scale_byte(_finite_amax(xs), rceil)
            scales[r * scale_row_stride + j * scale_group_stride] = byte
            _encode_times(xs, e8m0_reciprocal(byte), out[r, lo:hi])
            j += 1
            if j == groups:
                j = 0
                r += 1


def quantize_mx(x, group_size, rounding, column_major_scales=False):
    """MX quantization of x (float32 / float16 / bfloat16, [..., K]) in groups of ``group_size`` along the
    last axis, ``rounding`` 'rceil' or 'floor'. Returns (codes uint8 of x's shape, E8M0 bytes uint8 of
    shape x.shape[:-1] + (ceil(K / group_size),))."""
    return block.run_group_kernel(quantize_kernel, x, group_size, rounding == "rceil", column_major_scales, np.uint8)


def decode_e8m0_array(scales):
    """E8M0 bytes -> float32 2^(byte - 127) (byte 0: the subnormal 2^-127), 0xFF -> NaN; numpy, exact."""
    return _arrays.decode_e8m0(np.asarray(scales, dtype=np.uint8))


# -- pieces of the GEMM ------------------------------------------------------------------------------


@njit(**CPU_SERIAL_KERNEL)
def _outside(row, lo, hi):
    """How many bytes of ``row`` lie outside [lo, hi] (a vectorized count, not a search)."""
    count = 0
    for i in range(row.size):
        v = np.int64(row[i])
        count += (v < lo) + (v > hi)
    return count


@njit(**CPU_INLINE)
def _rows_outside(sb, n0, valid, bn, lo, hi):
    """How many scale bytes of weight rows n0 .. n0 + valid - 1 lie outside [lo, hi]."""
    outside = 0
    for j in range(valid):
        outside += _outside(sb[(n0 + j) // bn], lo, hi)
    return outside


@njit(**CPU_INLINE)
def _decode_span(src, srow, bk, k0, k1, dst):
    """dst[k - k0] = dec(src[k]) * 2^(srow[k // bk] - 127) for k0 <= k < k1 (any k0): exact in
    the shortcut's window. Runs of 32 values under one scale go through a loop of exactly 32 (LLVM makes
    it two 16-lane steps); a loop bounded by the block's end ran its vector body never (its unroll of
    64 values is longer than a block) and made the M = 16 kernel 3.5x slower."""
    if bk % MX_GROUP == 0 and (k1 - k0) % MX_GROUP == 0:
        for k in range(k0, k1, MX_GROUP):
            s = decode_e8m0(srow[k // bk])
            run = src[k : k + MX_GROUP]
            d = dst[k - k0 : k - k0 + MX_GROUP]
            for i in range(MX_GROUP):
                d[i] = decode_e4m3(run[i]) * s
    else:
        for kb in range(k0 // bk, (k1 + bk - 1) // bk):
            s = decode_e8m0(srow[kb])
            for k in range(max(k0, kb * bk), min(k1, kb * bk + bk)):
                dst[k - k0] = decode_e4m3(src[k]) * s


@njit(**CPU_SERIAL_KERNEL)
def decode_scaled_rows(codes, scales, bk, out):
    """out[r, k] = dec(codes[r, k]) * 2^(scales[r, k // bk] - 127): exact in the shortcut's window."""
    for r in range(codes.shape[0]):
        _decode_span(codes[r], scales[r], bk, 0, codes.shape[1], out[r])


@njit(**CPU_SERIAL_KERNEL)
def _chunk_bounds(k_len, bk):
    """Chunk edges along K: CHUNK_TERMS-wide chunks (a multiple of bk) over the full blocks, then the
    short last block (K % bk != 0) as a chunk of its own."""
    chunk = bk * max(1, CHUNK_TERMS // bk)
    k_full = (k_len // bk) * bk
    n = (k_full + chunk - 1) // chunk + (1 if k_full < k_len else 0)
    edges = np.empty(n + 1, dtype=np.int64)
    for c in range(n):
        edges[c] = min(k_full, c * chunk)
    edges[n] = k_len
    return edges


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs, fastmath=_REASSOC)
def small_m_kernel(x, b, sb, bn, bk, edges, lo, hi, bias, out, bad):
    """x = dec(a) * sa [M, K] (exact) and codes b with E8M0 bytes sb: four rows of b per step decoded
    with their scales into a buffer one chunk at a time (exact), ``gemm.small_m_kernel``'s 4 x 4 register
    blocks over it (any order inside the chunk), each chunk's sums added into float32 accumulators in
    chunk order, the bias last. A weight byte outside [lo, hi] sets ``bad[0]`` (the caller then runs
    the contract's kernels) and its rows are left unwritten."""
    m_rows, k_len = x.shape
    n_rows = b.shape[0]
    width = 0
    for c in range(edges.size - 1):
        width = max(width, edges[c + 1] - edges[c])
    for item in prange((n_rows + _SMALL_M_ROWS - 1) // _SMALL_M_ROWS):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        n0 = item * _SMALL_M_ROWS
        valid = min(_SMALL_M_ROWS, n_rows - n0)
        if _rows_outside(sb, n0, valid, bn, lo, hi):
            bad[0] = 1
            continue
        rows = np.zeros((_SMALL_M_ROWS, width), dtype=np.float32)
        acc = np.zeros((m_rows, _SMALL_M_ROWS), dtype=np.float32)
        for c in range(edges.size - 1):
            k0 = edges[c]
            kc = edges[c + 1] - k0
            for j in range(valid):
                _decode_span(b[n0 + j], sb[(n0 + j) // bn], bk, k0, k0 + kc, rows[j])
            w0, w1, w2, w3 = rows[0, :kc], rows[1, :kc], rows[2, :kc], rows[3, :kc]
            accumulate_rows(x, k0, kc, w0, w1, w2, w3, acc)
        for m in range(m_rows):
            for j in range(valid):
                out[m, n0 + j] = add_bias(acc[m, j], bias, n0 + j)


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs)
def tiled_kernel(x, b, sb, bn, bk, edges, lo, hi, bias, out, bad):
    """small_m on the AVX-512 paths (``paths.CpuPath.register_tiles``): ``small_m_kernel``'s contract,
    each chunk's sums run in K order by ``tile.py``'s register tiles (at most chunk-width roundings a
    term, as there), the chunk sums added in chunk order."""
    m_rows, k_len = x.shape
    n_rows = b.shape[0]
    nr = tile.BLOCK_ROWS
    blocks = (n_rows + nr - 1) // nr
    runs = team_runs(blocks)
    panel = tile.panel_rows(k_len)
    for run in prange(runs):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        for m0 in range(0, m_rows, panel):  # tile.panel_rows: the activation a panel at a time
            m1 = min(m_rows, m0 + panel)
            xt = tile.activation_columns(x[m0:m1], False)  # float32 x: each thread its own (tile.activation_columns)
            for block_index in range(run * blocks // runs, (run + 1) * blocks // runs):
                n0 = block_index * nr
                valid = min(nr, n_rows - n0)
                if _rows_outside(sb, n0, valid, bn, lo, hi):
                    bad[0] = 1
                    continue
                w = tile.weight_columns(tile.weight_buffer(nr, valid), nr, 0)
                p = np.empty((nr, xt.shape[1]), dtype=np.float32)
                total = np.zeros((tile.LANES, xt.shape[1]), dtype=np.float32)
                for c in range(edges.size - 1):
                    p[:] = 0.0
                    for k0 in range(edges[c], edges[c + 1], tile.TILE_K):  # a chunk wider than a pass (bk > 512)
                        kc = min(tile.TILE_K, edges[c + 1] - k0)
                        for j in range(valid):
                            _decode_span(b[n0 + j], sb[(n0 + j) // bn], bk, k0, k0 + kc, w[j])
                        tile.sum_tiles(xt, k0, kc, w, p)
                    for j in range(nr):
                        t = total[j]
                        q = p[j]
                        for m in range(m1 - m0):
                            t[m] += q[m]
                block.store_tile_sums(total, bias, out[m0:m1], n0, valid)


# Weight rows per work item of the M = 1 kernel (one scale buffer per item: an allocation per four rows
# cost more than the decode itself).
_GEMV_ROWS = 64


@njit(**CPU_INLINE)
def _row_scales(srow, lo, span, dst):
    """dst[i] = 2^(srow[i] - 127) for bytes in [lo, lo + span] (then 1..254: byte << 23 is the float32);
    returns nonzero when a byte lies outside, and then dst is not to be used. One vectorized pass: the
    M = 1 kernel decodes a work item's rows at once (per row, the loop's set-up and final reduction
    cost 10% of an N = K = 4096 call)."""
    outside = np.uint32(0)
    for i in range(srow.size):
        v = np.uint32(srow[i])
        outside = max(outside, np.uint32(v - lo))
        dst[i] = bits_float32(np.uint32(v << np.uint32(23)))
    return outside > span


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs, fastmath=_REASSOC)
def gemv_lookup_kernel(x, b, sb, bn, lo, hi, bias, out, bad):
    """M = 1 with 32-wide blocks on a byte-lookup path: per work item of _GEMV_ROWS weight rows, their
    block scales decoded to float32 (``_row_scales``), then four rows at a time through the path's
    ``dot4_e4m3_mx`` (64 codes a step); the blocks past the last whole step and the rows past a
    multiple of four by plain loops (each block's sum, times its scale, added in block order)."""
    n_rows, k_len = b.shape
    nkb = sb.shape[1]
    xr = x[0]
    steps = k_len // 64
    lo_u = np.uint32(lo)
    span = np.uint32(hi - lo)
    for item in prange((n_rows + _GEMV_ROWS - 1) // _GEMV_ROWS):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        g0 = item * _GEMV_ROWS
        g1 = min(n_rows, g0 + _GEMV_ROWS)
        scales = np.empty((g1 - g0, nkb), dtype=np.float32)
        outside = False
        if bn == 1:  # the item's scale rows are one contiguous run
            outside = _row_scales(sb[g0:g1].reshape(-1), lo_u, span, scales.reshape(-1))
        else:
            for j in range(g1 - g0):
                outside |= _row_scales(sb[(g0 + j) // bn], lo_u, span, scales[j])
        if outside:
            bad[0] = 1
            continue
        for n0 in range(g0, g1 - _SMALL_M_ROWS + 1, _SMALL_M_ROWS):
            j0 = n0 - g0
            s0, s1, s2, s3 = scales[j0], scales[j0 + 1], scales[j0 + 2], scales[j0 + 3]
            w0, w1, w2, w3 = b[n0], b[n0 + 1], b[n0 + 2], b[n0 + 3]
            a0, a1, a2, a3 = dot4_e4m3_mx(xr, w0, w1, w2, w3, s0, s1, s2, s3, steps)
            for kb in range(2 * steps, nkb):  # the tail: at most one whole block and a short one
                p0 = p1 = p2 = p3 = np.float32(0.0)
                for k in range(kb * MX_GROUP, min(k_len, kb * MX_GROUP + MX_GROUP)):
                    t = xr[k]
                    p0 += t * decode_e4m3(w0[k])
                    p1 += t * decode_e4m3(w1[k])
                    p2 += t * decode_e4m3(w2[k])
                    p3 += t * decode_e4m3(w3[k])
                a0 += p0 * s0[kb]
                a1 += p1 * s1[kb]
                a2 += p2 * s2[kb]
                a3 += p3 * s3[kb]
            out[0, n0] = add_bias(a0, bias, n0)
            out[0, n0 + 1] = add_bias(a1, bias, n0 + 1)
            out[0, n0 + 2] = add_bias(a2, bias, n0 + 2)
            out[0, n0 + 3] = add_bias(a3, bias, n0 + 3)
        for n in range(g1 - (g1 - g0) % _SMALL_M_ROWS, g1):
            w, srow = b[n], scales[n - g0]
            total = np.float32(0.0)
            for kb in range(nkb):
                p = np.float32(0.0)
                for k in range(kb * MX_GROUP, min(k_len, kb * MX_GROUP + MX_GROUP)):
                    p += xr[k] * decode_e4m3(w[k])
                total += p * srow[kb]
            out[0, n] = add_bias(total, bias, n)


@njit(**CPU_SERIAL_KERNEL)
def _decode_chunks(codes, scales, row0, row_block, bk, edges, lo, hi, out):
    """out[c, r, :] = dec(codes[r, chunk c]) * 2^(scales[(row0 + r) // row_block, kb] - 127), zero-padded
    past the chunk's end (exact zeros change no sum); each chunk's tile C-contiguous for sgemm. Returns
    how many scale bytes fell outside [lo, hi] (then nothing is to be trusted)."""
    outside = 0
    for r in range(codes.shape[0]):
        srow = scales[(row0 + r) // row_block]
        outside += _outside(srow, lo, hi)
        src = codes[r]
        for c in range(edges.size - 1):
            k0, k1 = edges[c], edges[c + 1]
            dst = out[c, r]
            _decode_span(src, srow, bk, k0, k1, dst)
            for k in range(k1 - k0, dst.size):
                dst[k] = np.float32(0.0)
    return outside


@njit(**CPU_STRICT_FUNCTION)
def _add_chunk(total, p):
    """total += p, element-wise in float32 (strict: the chunk sums are added in chunk order)."""
    for i in range(p.shape[0]):
        dst, src = total[i], p[i]
        for j in range(src.size):
            dst[j] = dst[j] + src[j]


def _mx_macs(a, sa, b, *_):
    """The work of the MX blas kernel: M * N * K."""
    return a.shape[0] * b.shape[0] * b.shape[1]


@cpu_kernel(CPU_PARALLEL_MIN_MACS, _mx_macs)
def blas_kernel(a, sa, b, sb, bn, bk, edges, lo, hi, bias, out, block_rows, panel_rows, slots):
    """A block of a and a panel of b decoded with their scales into chunk-major tiles, one sgemm per
    chunk, the chunk products added in order, the bias last. Returns the count of weight bytes outside
    [lo, hi] (the caller then runs the contract's kernels). The panels are dealt to ``slots``
    workers as in ``block.blas_kernel`` (the serial twin, one slot: a driver whose sgemm brings the
    threads, see the note above ``gemm.decode_rows``; the parallel twin: inside a torch forward)."""
    m_rows = a.shape[0]
    n_rows = b.shape[0]
    nch = edges.size - 1
    width = 0
    for c in range(nch):
        width = max(width, edges[c + 1] - edges[c])
    mb_max = min(block_rows, m_rows)
    nb_max = min(panel_rows, n_rows)
    a_tile = np.empty(nch * mb_max * width, dtype=np.float32)
    b_tiles = np.empty((slots, nch * nb_max * width), dtype=np.float32)
    p_tiles = np.empty((slots, mb_max * nb_max), dtype=np.float32)
    t_tiles = np.empty((slots, mb_max * nb_max), dtype=np.float32)
    outside = np.zeros(slots, dtype=np.int64)  # per slot: a weight byte fell outside the window
    panels = (n_rows + panel_rows - 1) // panel_rows
    for m0 in range(0, m_rows, block_rows):
        mb = min(block_rows, m_rows - m0)
        a_dec = a_tile[: nch * mb * width].reshape((nch, mb, width))
        _decode_chunks(a[m0 : m0 + mb], sa, m0, 1, bk, edges, 0, 255, a_dec)
        for slot in prange(slots):
            for panel in range(slot, panels, slots):
                n0 = panel * panel_rows
                nb = min(panel_rows, n_rows - n0)
                b_dec = b_tiles[slot, : nch * nb * width].reshape((nch, nb, width))
                if outside[slot] or _decode_chunks(b[n0 : n0 + nb], sb, n0, bn, bk, edges, lo, hi, b_dec):
                    outside[slot] = 1
                    break
                p = p_tiles[slot, : mb * nb].reshape((mb, nb))
                total = t_tiles[slot, : mb * nb].reshape((mb, nb))
                total[:] = 0.0
                for c in range(nch):
                    np.dot(a_dec[c], b_dec[c].T, p)  # sgemm over one chunk, float32 accumulate
                    _add_chunk(total, p)
                for i in range(mb):
                    dst = out[m0 + i, n0 : n0 + nb]
                    src = total[i]
                    for j in range(nb):
                        dst[j] = add_bias(src[j], bias, n0 + j)
        if outside.any():
            return 1
    return 0


# -- the entry point ---------------------------------------------------------------------------------

# Tiles of the blas kernel: as gemm.blas_tiles (activation blocks of at least 1024 rows, sgemm wants
# them tall), with weight panels of 256 rows, so that a chunk's product and the running total (1 MiB
# each at 1024 rows) stay in a 2 MiB L2 between chunks.
_PANEL_ROWS = 256
_BLOCK_ELEMENTS = 8 * 1024 * 1024
_MIN_BLOCK_ROWS = 1024


def choose_kernel(m, n, k):
    """The MX GEMM's kernel for a shape when none is forced: the block-scaled GEMM's rule
    (``block.takes_small_m``)."""
    return "small_m" if block.takes_small_m(m, n, k) else "blas"


def _window(sa):
    """(lo, hi): the weight bytes the shortcut takes beside activation bytes ``sa``, or None when an
    activation byte is outside it (module docstring)."""
    a_min, a_max = int(sa.min()), int(sa.max())
    if a_min < _BYTE_MIN or a_max > _BYTE_MAX:
        return None
    lo, hi = max(_BYTE_MIN, _PAIR_MIN - a_min), min(_BYTE_MAX, _PAIR_MAX - a_max)
    return (lo, hi) if lo <= hi else None


def _lookup_path():
    return "dot4_e4m3_mx" in paths.active().kernel_globals


def mx_scaled_mm(a, b, scale_a, scale_b, block_size, out_dtype, bias, kernel=None):
    """The CPU backend's GEMM with E8M0 scales on both operands: a [M, K], b [N, K] uint8 codes;
    scale_a uint8 [M, ceil(K / bk)], scale_b uint8 [ceil(N / bn), ceil(K / bk)]; block_size (bn, bk);
    bias [N] or None; ``kernel`` None, 'reference', 'small_m' or 'blas'. Returns y [M, N] in
    ``out_dtype``: ``block.block_scaled_mm`` on the decoded scales, within the same G3-per-block bound."""
    m, k = a.shape
    n = b.shape[0]
    bn, bk = (int(v) for v in block_size)
    if kernel is None:
        kernel = choose_kernel(m, n, k)
    elif kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)} on the CPU, got {kernel!r}")
    sa = np.ascontiguousarray(scale_a, dtype=np.uint8)
    sb = np.ascontiguousarray(scale_b, dtype=np.uint8)
    window = None if kernel == "reference" or m * n * k == 0 else _window(sa)
    if window is not None:
        y = _fast(a, b, sa, sb, bn, bk, bias, kernel, window)
        if y is not None:
            return to_out_dtype(y, out_dtype)
    return block.block_scaled_mm(a, b, decode_e8m0_array(sa), decode_e8m0_array(sb), (bn, bk), out_dtype, bias, kernel)


def rows_kernel(m):
    """The small_m kernel for M = m > 1 on the active path (``paths.takes_register_tiles``)."""
    return tiled_kernel if paths.takes_register_tiles(m) else small_m_kernel


def _fast(a, b, sa, sb, bn, bk, bias, kernel, window):
    """The exact-shortcut kernels' float32 result, or None when a weight byte is outside the window."""
    m, k = a.shape
    n = b.shape[0]
    lo, hi = window
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    bias32 = bias_vector(bias)
    out = np.empty((m, n), dtype=np.float32)
    edges = _chunk_bounds(k, bk)
    if kernel == "blas":
        block_rows = min(m, max(_MIN_BLOCK_ROWS, _BLOCK_ELEMENTS // k))
        panel_rows = min(n, _PANEL_ROWS)
        outside = run_sgemm_driver(
            blas_kernel,
            (a, sa, b),
            n,
            panel_rows,
            block_rows * panel_rows * int(np.diff(edges).max()),  # one sgemm per chunk
            lambda threads, rows: blas_kernel.call_with(
                threads, a, sa, b, sb, bn, bk, edges, lo, hi, bias32, out, block_rows, rows, threads
            ),
        )
        return None if outside else out
    x = np.empty((m, k), dtype=np.float32)
    decode_scaled_rows(a, sa, bk, x)
    bad = np.zeros(1, dtype=np.uint8)
    if m == 1 and bk == MX_GROUP and _lookup_path():
        gemv_lookup_kernel(x, b, sb, bn, lo, hi, bias32, out, bad)
    else:
        rows_kernel(m)(x, b, sb, bn, bk, edges, lo, hi, bias32, out, bad)
    return None if bad[0] else out
