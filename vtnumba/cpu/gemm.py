"""The CPU FP8 GEMM: ``y = (dec(a) @ dec(b).T) * scale_a * scale_b + bias``, float32 accumulate.

Three kernels behind one entry point (``scaled_mm``), picked by M * K (the decoded activation):

- ``reference``: plain loops, one float32 accumulator per output, k in order. Kept readable on
  purpose: it is the tests' second oracle, beside the float64 one in ``vtnumba.testing``.
- ``small_m`` (decode and modest prefill): rows of b spread over the cores; each weight byte is
  decoded once, branch-free (bit arithmetic and selects, no table gather, so LLVM vectorizes it): straight
  into the dot product's registers at M = 1, into a small cache-resident buffer shared by every
  row of a otherwise. The weight is read once at 1 byte per value, a quarter of what sgemv reads
  from weights kept dequantized in float32. On the AVX-512 paths M >= 16 runs ``tiled_kernel``
  (``tile.py``'s register tiles, each sum in K order: bitwise ``reference``) instead of the 4 x 4
  blocks.
- ``blas`` (prefill, M large): a block of a and a panel of b are decoded exactly into float32
  tiles and multiplied by BLAS (``np.dot`` inside ``@njit`` calls sgemm). The whole dequantized
  weight never exists: one panel of it at a time.

Where the scales go (all three kernels alike): the float32 accumulator stays unscaled to the end,
then ``y = acc * float32(sa[m] * sb[n]) + bias[n]`` in float32, rounded (RNE) to the out dtype.
That is one folded alpha per output, as the C++ seam (and cuBLASLt's alpha) does, rather than
upstream's two scalar multiplies; DESIGN.md's G3 bound holds for both. Folding costs one multiply
per output and serves per-row x per-channel scales in the same expression.

Kernels never validate (``vtnumba.ops`` does); they take uint8 codes, scale vectors of length 1
(per-tensor) or M / N, and a float32 bias of length N or 0 (none).

Threads: ``small_m`` runs on Numba's threads above a work threshold and on the calling thread below
it (``vtnumba.cpu.paths.CpuKernel``; 4 Mi multiply-adds, measured in benchmarks/cpu/bench_cpu_threads.py),
``blas`` on BLAS's (its decode and epilogue are serial, see ``decode_rows``). Numba's OpenMP workers
wait passively (``vtnumba._config.start_threads``): spinning ones, beside OpenBLAS's workers (which
busy-wait after each call) or another busy process, stalled a small layer for 12-16 ms on two cores.
Each kernel is compiled for the path this CPU runs (``vtnumba.cpu.paths``); on ``avx512_vbmi`` and
``neon_tbl`` the M = 1 kernel decodes by byte lookups (``vtnumba.cpu.vbmi``, ``vtnumba.cpu.neon``).
"""

import numpy as np
from numba import njit, prange

from .._config import CPU_INLINE, CPU_PARALLEL_MIN_MACS, CPU_SERIAL_KERNEL, CPU_STRICT_FUNCTION, blas_threads
from . import paths, tile
from .codec import decode_e4m3
from .paths import cpu_kernel, team_runs, vector_width_hint
from .tile import TILE_LOOKUP as tile_lookup
from .tile import decode_block as tile_decode
from .vbmi import dot4_e4m3

KERNELS = ("reference", "small_m", "blas")

# The small_m kernel takes a shape by default while its decoded activations (M * K float32) stay
# under 12 MiB: its x rows are re-read once per 4 weight rows, fast while they sit in cache. Past
# that decode + sgemm is steadier. Measured (`bench_cpu_gemm.py --crossover`, N = 4096, 2-core AMD
# EPYC, ms; two runs where they disagreed):
#   K = 4096    M      16    128    256    512   1024     K = 14336   M    128    256    512   1024
#   peer sgemm       4.39   18.2   35.9   67.5  141.7     peer sgemm      72.0  131.3  252.9  485.1
#   small_m          2.02   15.4   30.2   59.5  146-194   small_m         54.6  102-141 591   1411
#   blas             6.11   20.8   45.4   81.2  161-164   blas            99.3  157     290    544
# At 16 MiB and more (M = 1024 at K = 4096) small_m swung with the load on the shared L3.
SMALL_M_ELEMENTS = 3 * 1024 * 1024

# Reassociation lets LLVM split each float32 sum over k into vector lanes ('contract' lets it use
# FMA). Every sum stays float32; only its order changes, which G3's 4*K*eps32 bound allows for any
# order. No 'nnan'/'ninf': a 0x7F code must still decode to NaN and spread to its outputs.
_REASSOC = {"reassoc", "contract"}

# Every fast kernel decodes with the codec's one decoder (vtnumba._format, branch-free selects that
# LLVM vectorizes). A shorter decode exists -- the code's bits shifted into float32's fields read as
# 2^-120 times the value -- but it turns e4m3 subnormals into float32 subnormals, and Intel cores
# take a microcode assist on arithmetic with a subnormal input: at
# M = 16, N = K = 4096 that kernel took 128 ms on a Xeon (sgemm on float32 weights: 17 ms) and
# 3.4 ms on the AMD box. No kernel here feeds subnormals to arithmetic.
_SMALL_M_ROWS = 4  # rows of a and of b per register block (4 x 4 accumulators)
# K per pass of the small-M kernel: the 4 decoded weight rows (16 KiB) stay in L1 while the x rows
# stream from L2. Measured at M = 16, N = 4096: chunks of 1024 / 2048 / 4096 / 8192 took 2.25 / 3.39
# / 3.35 / 3.22 ms at K = 4096 and 9.5 / 12.5 / 11.1 / 11.1 ms at K = 14336.
_K_CHUNK = 1024
# How far ahead the M = 1 lookup loops read the weight (vbmi.dot4_e4m3's ``ahead``): the four rows
# about this many bytes on, into L2 (vbmi.emit_prefetch). Measured on the Zen 4 machine, per-tensor
# kernel, weights cold, one thread / two (benchmarks/RESULTS.md, 2026-12-06 12:00-13:10 UTC): the next
# four rows into every level, as before, took 1536 x 2048 at 182-215 / 106-122 us, 2048 x 768 at
# 91-123 / 46-51, 1536 x 4096 at 505-516 / 260-276; 16 KiB ahead into L2, 132-137 / 92-125, 79-90 /
# 50-52, 258-267 / 188-197. The next four rows into L2 alone made 2048 x 768 slower (122-144 / 66-78):
# 3 KiB ahead did not cover memory's latency, and the lines then came from L2 on demand.
READ_AHEAD_BYTES = 16384


@njit(**CPU_INLINE)
def add_bias(y, bias, n):
    """y + bias[n] in float32; a length-0 bias is none."""
    if bias.size != 0:
        y += bias[n]
    return y


@njit(**CPU_INLINE)
def ahead_rows(k_len):
    """Rows of b from a four-row block to the block its loop reads ahead: READ_AHEAD_BYTES, in whole
    blocks of four rows, at least the next one."""
    return _SMALL_M_ROWS * max(1, READ_AHEAD_BYTES // (_SMALL_M_ROWS * max(1, k_len)))


@njit(**CPU_INLINE)
def _epilogue_value(acc, sa, sb, bias, n):
    """The one place the scales and the bias meet the accumulator (see the module docstring)."""
    y = acc * (sa * sb)
    return add_bias(y, bias, n)


@njit(**CPU_INLINE)
def _scale_at(scale, i):
    """A length-1 (per-tensor) scale vector broadcasts; a per-row / per-channel one is indexed."""
    return scale[0] if scale.size == 1 else scale[i]


# -- kernel 1: reference -------------------------------------------------------------------------


@njit(**CPU_SERIAL_KERNEL)
def reference_kernel(a, b, scale_a, scale_b, bias, out):
    """out[m, n] = (sum_k dec(a[m, k]) * dec(b[n, k])) * (sa * sb) + bias[n]; plain loops, k in
    order, any strides."""
    m_rows, k_len = a.shape
    for m in range(m_rows):
        for n in range(b.shape[0]):
            acc = np.float32(0.0)
            for k in range(k_len):
                acc += decode_e4m3(a[m, k]) * decode_e4m3(b[n, k])
            out[m, n] = _epilogue_value(acc, _scale_at(scale_a, m), _scale_at(scale_b, n), bias, n)


# -- kernel 2: small M ---------------------------------------------------------------------------


def gemm_macs(x, b, *_):
    """The work of a GEMM kernel: its multiply-adds, M * N * K."""
    return x.shape[0] * b.shape[0] * b.shape[1]


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs, fastmath=_REASSOC)
def gemv_kernel(x, b, scale_a, scale_b, bias, out):
    """M = 1: out[0, n] = dot(x[0], dec(b[n])), the decode fused into the dot product.

    Four rows of b per step share each load of x: at K = 14336 the activation row (56 KiB) no
    longer fits in L1, and one row at a time took 3.60 ms instead of 2.15 ms (N = 4096, two cores)."""
    n_rows, k_len = b.shape
    xr = x[0]
    for block in prange((n_rows + _SMALL_M_ROWS - 1) // _SMALL_M_ROWS):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        n0 = block * _SMALL_M_ROWS
        if n0 + _SMALL_M_ROWS <= n_rows:
            w0, w1, w2, w3 = b[n0], b[n0 + 1], b[n0 + 2], b[n0 + 3]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for k in range(k_len):
                u = xr[k]
                a0 += u * decode_e4m3(w0[k])
                a1 += u * decode_e4m3(w1[k])
                a2 += u * decode_e4m3(w2[k])
                a3 += u * decode_e4m3(w3[k])
            acc = (a0, a1, a2, a3)
            for j in range(_SMALL_M_ROWS):
                n = n0 + j
                out[0, n] = _epilogue_value(acc[j], scale_a[0], _scale_at(scale_b, n), bias, n)
        else:
            for n in range(n0, n_rows):
                w = b[n]
                acc1 = np.float32(0.0)
                for k in range(k_len):
                    acc1 += xr[k] * decode_e4m3(w[k])
                out[0, n] = _epilogue_value(acc1, scale_a[0], _scale_at(scale_b, n), bias, n)


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs, fastmath=_REASSOC)
def gemv_lookup_kernel(x, b, scale_a, scale_b, bias, out):
    """M = 1 on a byte-lookup path (avx512_bf16, avx512_vbmi, neon_tbl): gemv_kernel's blocking (four
    rows of b share each load of x), the 64-code steps decoded by table lookups (the path's
    ``dot4_e4m3``: ``vbmi.py``'s vpermi2b, into vdpbf16ps on avx512_bf16, or ``neon.py``'s tbl/tbx)
    and the K % 64 tail by the bit-arithmetic decode. Compiled only for a path that runs here (the
    lookups are ISA instructions)."""
    n_rows, k_len = b.shape
    xr = x[0]
    steps = k_len // 64
    k_tail = steps * 64
    flat = b.reshape(-1)  # b's rows as one run of bytes: a later block's are read ahead (dot4_e4m3)
    last = (n_rows - _SMALL_M_ROWS) * k_len  # the last whole block (read ahead past it: itself, in cache)
    skip = ahead_rows(k_len)
    for block in prange((n_rows + _SMALL_M_ROWS - 1) // _SMALL_M_ROWS):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        n0 = block * _SMALL_M_ROWS
        if n0 + _SMALL_M_ROWS <= n_rows:
            w0, w1, w2, w3 = b[n0], b[n0 + 1], b[n0 + 2], b[n0 + 3]
            ahead = flat[min((n0 + skip) * k_len, last) :]
            a0, a1, a2, a3 = dot4_e4m3(xr, w0, w1, w2, w3, steps, ahead)
            for k in range(k_tail, k_len):  # the K % 64 tail (written apart from gemv_kernel's loop:
                t = xr[k]  # tools/mutations_cpu_gemm.toml edits that one by its text)
                a0 += t * decode_e4m3(w0[k])
                a1 += t * decode_e4m3(w1[k])
                a2 += t * decode_e4m3(w2[k])
                a3 += t * decode_e4m3(w3[k])
            acc = (a0, a1, a2, a3)
            for j in range(_SMALL_M_ROWS):
                n = n0 + j
                out[0, n] = _epilogue_value(acc[j], scale_a[0], _scale_at(scale_b, n), bias, n)
        else:
            for n in range(n0, n_rows):
                w = b[n]
                acc1 = np.float32(0.0)
                for k in range(k_len):
                    acc1 += xr[k] * decode_e4m3(w[k])
                out[0, n] = _epilogue_value(acc1, scale_a[0], _scale_at(scale_b, n), bias, n)


@njit(**CPU_INLINE)
def accumulate_rows(x, k0, kc, w0, w1, w2, w3, acc):
    """acc[m, j] += x[m, k0:k0 + kc] . wj for every row m of x and j < 4: the small-M kernels'
    register block, written once (the dense, block-scaled and MX kernels each decode four weight rows
    into w0..w3 and call this).

    Four rows of x at a time against the four decoded rows: 16 accumulators, 8 loads per 16 FMAs,
    which runs near the core's FMA peak. Rows of x past a multiple of 4 take a 1 x 4 loop. Inlined
    (Numba IR), so it compiles with the calling kernel's fastmath flags."""
    m_rows = x.shape[0]
    m_full = m_rows - m_rows % _SMALL_M_ROWS
    for m0 in range(0, m_full, _SMALL_M_ROWS):
        # one row index, then a slice: Numba keeps these 1-D views contiguous ('C')
        x0, x1 = x[m0, k0 : k0 + kc], x[m0 + 1, k0 : k0 + kc]
        x2, x3 = x[m0 + 2, k0 : k0 + kc], x[m0 + 3, k0 : k0 + kc]
        a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = np.float32(0.0)
        a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = np.float32(0.0)
        # fmt: off
        for k in range(kc):
            p, q, r, s = w0[k], w1[k], w2[k], w3[k]
            u = x0[k]
            a00 += u * p; a01 += u * q; a02 += u * r; a03 += u * s  # noqa: E702
            u = x1[k]
            a10 += u * p; a11 += u * q; a12 += u * r; a13 += u * s  # noqa: E702
            u = x2[k]
            a20 += u * p; a21 += u * q; a22 += u * r; a23 += u * s  # noqa: E702
            u = x3[k]
            a30 += u * p; a31 += u * q; a32 += u * r; a33 += u * s  # noqa: E702
        acc[m0, 0] += a00; acc[m0, 1] += a01; acc[m0, 2] += a02; acc[m0, 3] += a03  # noqa: E702
        acc[m0 + 1, 0] += a10; acc[m0 + 1, 1] += a11; acc[m0 + 1, 2] += a12; acc[m0 + 1, 3] += a13  # noqa: E702
        acc[m0 + 2, 0] += a20; acc[m0 + 2, 1] += a21; acc[m0 + 2, 2] += a22; acc[m0 + 2, 3] += a23  # noqa: E702
        acc[m0 + 3, 0] += a30; acc[m0 + 3, 1] += a31; acc[m0 + 3, 2] += a32; acc[m0 + 3, 3] += a33  # noqa: E702
    for m in range(m_full, m_rows):
        xm = x[m, k0 : k0 + kc]
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for k in range(kc):
            u = xm[k]
            a0 += u * w0[k]
            a1 += u * w1[k]
            a2 += u * w2[k]
            a3 += u * w3[k]  # noqa: E702
        acc[m, 0] += a0
        acc[m, 1] += a1
        acc[m, 2] += a2
        acc[m, 3] += a3  # noqa: E702
        # fmt: on


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs, fastmath=_REASSOC)
def small_m_kernel(x, b, scale_a, scale_b, bias, out):
    """Small M > 1: out from x = dec(a) and codes b.

    Four rows of b at a time are decoded into a float32 buffer, then multiplied with every row of x
    by accumulate_rows (the 4 x 4 register block). K is walked in chunks of _K_CHUNK so the buffer
    stays in L1 (see _K_CHUNK); each chunk's partial sums are added into float32 accumulators. Rows
    past the edge of b are zeros in the buffer and are not stored."""
    m_rows, k_len = x.shape
    n_rows = b.shape[0]
    chunk = min(k_len, _K_CHUNK)
    for block in prange((n_rows + _SMALL_M_ROWS - 1) // _SMALL_M_ROWS):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        n0 = block * _SMALL_M_ROWS
        valid = min(_SMALL_M_ROWS, n_rows - n0)
        rows = np.zeros((_SMALL_M_ROWS, chunk), dtype=np.float32)
        acc = np.zeros((m_rows, _SMALL_M_ROWS), dtype=np.float32)
        for k0 in range(0, k_len, chunk):
            kc = min(chunk, k_len - k0)
            for j in range(valid):
                w = b[n0 + j, k0 : k0 + kc]
                dst = rows[j]
                for k in range(kc):
                    dst[k] = decode_e4m3(w[k])
            w0, w1, w2, w3 = rows[0, :kc], rows[1, :kc], rows[2, :kc], rows[3, :kc]
            accumulate_rows(x, k0, kc, w0, w1, w2, w3, acc)
        for m in range(m_rows):
            sa = _scale_at(scale_a, m)
            for j in range(valid):
                n = n0 + j
                out[m, n] = _epilogue_value(acc[m, j], sa, _scale_at(scale_b, n), bias, n)


@njit(**CPU_INLINE)
def _scale_per_row(scale_a, m_rows):
    """scale_a as one value per activation row (a per-tensor scale repeated). np.empty and a loop: an
    array expression before a kernel's prange is a parallel region of its own (tile.transposed)."""
    rows = np.empty(m_rows, dtype=np.float32)
    for m in range(m_rows):
        rows[m] = _scale_at(scale_a, m)
    return rows


@njit(**CPU_STRICT_FUNCTION)
def _scale_tile_sums(acc, sa_rows, scale_b, bias, n0, valid):
    """acc[j, m] = _epilogue_value(acc[j, m], sa_rows[m], sb[n0 + j], bias, n0 + j) in place for j <
    valid and m < len(sa_rows): the register tiles' epilogue, along acc's rows (a weight row each) so it
    vectorizes; the same operations in the same order as _epilogue_value (acc * (sa * sb), then + bias),
    with no fast-math flags (no FMA contraction)."""
    m_rows = sa_rows.size
    for j in range(valid):
        n = n0 + j
        sb = _scale_at(scale_b, n)
        row = acc[j, :m_rows]
        if bias.size == 0:
            for m in range(m_rows):
                row[m] = row[m] * (sa_rows[m] * sb)
        else:
            bn = bias[n]
            for m in range(m_rows):
                row[m] = row[m] * (sa_rows[m] * sb) + bn


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs)
def tiled_kernel(x, b, scale_a, scale_b, bias, out):
    """small_m on the AVX-512 paths (``paths.CpuPath.register_tiles``): ``small_m_kernel``'s contract,
    its sums run by ``tile.py``'s register tiles, each in K order, so the result is bitwise
    ``reference_kernel``'s. x: the activation's float32 values, or its e4m3 codes (``scaled_mm``
    hands them over undecoded: ``tile.activation_columns``). Each thread takes one run of the weight
    blocks of 16 rows (``tile.BLOCK_ROWS``), decoded in K chunks of tile.TILE_K; no fast-math flags
    (nothing here is reassociated)."""
    m_rows, k_len = x.shape
    n_rows = b.shape[0]
    sa_rows = _scale_per_row(scale_a, m_rows)
    nr = tile.BLOCK_ROWS
    blocks = (n_rows + nr - 1) // nr
    runs = team_runs(blocks)
    chunk = min(k_len, tile.TILE_K)
    panel = tile.panel_rows(k_len)
    for run in prange(runs):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        for m0 in range(0, m_rows, panel):  # tile.panel_rows: the activation a panel at a time
            m1 = min(m_rows, m0 + panel)
            xt = tile.activation_columns(x[m0:m1], tile_lookup)  # this thread's own (tile.activation_columns)
            for block in range(run * blocks // runs, (run + 1) * blocks // runs):
                n0 = block * nr
                valid = min(nr, n_rows - n0)
                w = tile.weight_columns(tile.weight_buffer(nr, valid), nr, 0)
                acc = np.zeros((tile.LANES, xt.shape[1]), dtype=np.float32)
                for k0 in range(0, k_len, chunk):
                    kc = min(chunk, k_len - k0)
                    tile_decode(b, n0, valid, k0, kc, w)
                    tile.sum_tiles(xt, k0, kc, w, acc)
                _scale_tile_sums(acc, sa_rows[m0:m1], scale_b, bias, n0, valid)
                tile.store_sums(acc, out[m0:m1], n0, valid)


# -- kernel 3: large M, decoded tiles through BLAS -----------------------------------------------


# The blas kernel's decode and epilogue are serial on purpose: sgemm's threads already use every
# core, and a Numba parallel region between two sgemm calls made the two thread pools wait on each
# other (their workers spin after each call): 460 ms instead of 6 ms at M = 16, N = K = 4096 on two
# cores. Serial decoding costs about 0.25 ms per million weights, a few percent of the sgemm.


@njit(**CPU_SERIAL_KERNEL)
def decode_rows(codes, out):
    """out[r, :] = dec(codes[r, :]) exactly."""
    for r in range(codes.shape[0]):
        row = codes[r]
        dst = out[r]
        for k in range(row.size):
            dst[k] = decode_e4m3(row[k])


@njit(**CPU_SERIAL_KERNEL)
def _blas_epilogue(acc, m0, n0, scale_a, scale_b, bias, out):
    """out[m0 + i, n0 + j] from acc[i, j]. Rows as contiguous 1-D views and the per-tensor test
    taken out of the inner loop, so it vectorizes (1.4x to 2.4x faster than indexing out[m, n] per element)."""
    nb = acc.shape[1]
    for i in range(acc.shape[0]):
        sa = _scale_at(scale_a, m0 + i)
        src = acc[i]
        dst = out[m0 + i, n0 : n0 + nb]
        if scale_b.size == 1:
            for j in range(nb):
                dst[j] = _epilogue_value(src[j], sa, scale_b[0], bias, n0 + j)
        else:
            sb = scale_b[n0 : n0 + nb]
            for j in range(nb):
                dst[j] = _epilogue_value(src[j], sa, sb[j], bias, n0 + j)


@njit(**CPU_SERIAL_KERNEL)
def blas_kernel(a, b, scale_a, scale_b, bias, out, block_rows, panel_rows):
    """Decode a block of a and a panel of b into float32 tiles, sgemm them, scale into out.
    Serial Python-free driver; sgemm brings the threads (see the note above decode_rows)."""
    m_rows, k_len = a.shape
    n_rows = b.shape[0]
    a_tile = np.empty((min(block_rows, m_rows), k_len), dtype=np.float32)
    b_tile = np.empty((min(panel_rows, n_rows), k_len), dtype=np.float32)
    acc_tile = np.empty(a_tile.shape[0] * b_tile.shape[0], dtype=np.float32)
    for m0 in range(0, m_rows, block_rows):
        mb = min(block_rows, m_rows - m0)
        a_dec = a_tile[:mb]
        decode_rows(a[m0 : m0 + mb], a_dec)
        for n0 in range(0, n_rows, panel_rows):
            nb = min(panel_rows, n_rows - n0)
            b_dec = b_tile[:nb]
            decode_rows(b[n0 : n0 + nb], b_dec)
            acc = acc_tile[: mb * nb].reshape((mb, nb))
            np.dot(a_dec, b_dec.T, acc)  # sgemm, float32 accumulate (no fast-accumulate mode)
            _blas_epilogue(acc, m0, n0, scale_a, scale_b, bias, out)


# -- the entry point -----------------------------------------------------------------------------

# Tiles of the blas path: 512 weight rows per panel, and as many activation rows per block as fit in
# 8 Mi float32 values (32 MiB) but never fewer than 1024, since sgemm needs tall blocks. Measured at
# M = 1024, N = 4096, K = 14336 against one sgemm on float32 weights: blocks of 292 / 585 / 1024
# rows ran at 0.69x / 0.80x / 0.87x its speed; panels of 256 / 512 / 1024 rows at 0.85x / 0.87x /
# 0.85x. Panels are capped at 8 Mi values too, so at N = K = 4096 the extra memory is at most
# 32 + 8 + 4 MiB (block, panel, accumulator) for any M.
_PANEL_ROWS = 512
_PANEL_ELEMENTS = 8 * 1024 * 1024
_BLOCK_ELEMENTS = 8 * 1024 * 1024
_MIN_BLOCK_ROWS = 1024


def choose_kernel(m, n, k):
    """The kernel a shape gets when none is forced (the crossover is measured, see SMALL_M_ELEMENTS)."""
    return "small_m" if m * k <= SMALL_M_ELEMENTS else "blas"


def blas_tiles(m, n, k):
    """(activation rows per block, weight rows per panel) of the blas kernel for this shape."""
    panel = min(n, _PANEL_ROWS, max(16, _PANEL_ELEMENTS // k))
    block = min(m, max(_MIN_BLOCK_ROWS, _BLOCK_ELEMENTS // k))
    return block, panel


def scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, kernel):
    """The CPU backend's scaled_mm (see ``vtnumba.ops.scaled_mm`` for the contract)."""
    m, k = a.shape
    n = b.shape[0]
    if kernel is None:
        kernel = choose_kernel(m, n, k)
    elif kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)} on the CPU, got {kernel!r}")
    sa = np.ascontiguousarray(np.asarray(scale_a, dtype=np.float32).reshape(-1))
    sb = np.ascontiguousarray(np.asarray(scale_b, dtype=np.float32).reshape(-1))
    bias32 = bias_vector(bias)
    out = np.empty((m, n), dtype=np.float32)
    if out.size == 0 or k == 0:
        # nothing to sum (the blas tiles and the K chunks would be 0 wide): 0 + bias, as block.py
        out[:] = np.float32(0.0) + bias32 if bias32.size else np.float32(0.0)
    elif kernel == "reference":
        reference_kernel(a, b, sa, sb, bias32, out)
    else:
        # the fast kernels read contiguous rows (vector loads); strided inputs are copied once, so
        # they give the bytes of their contiguous copies
        a = np.ascontiguousarray(a)
        b = np.ascontiguousarray(b)
        if kernel == "blas":
            block_rows, panel_rows = blas_tiles(m, n, k)
            with blas_threads(block_rows * panel_rows * k):  # one sgemm per block and panel
                blas_kernel(a, b, sa, sb, bias32, out, block_rows, panel_rows)
        elif m > 1 and rows_kernel(m) is tiled_kernel:
            # the codes: each thread decodes its own (tile.activation_columns)
            tiled_kernel(a, b, sa, sb, bias32, out)
        else:
            x = np.empty((m, k), dtype=np.float32)
            decode_rows(a, x)
            m1_kernel = gemv_lookup_kernel if paths.active().byte_lookup_decode else gemv_kernel
            (m1_kernel if m == 1 else small_m_kernel)(x, b, sa, sb, bias32, out)
    return to_out_dtype(out, out_dtype)


def rows_kernel(m):
    """The small_m kernel for M = m > 1 on the active path (``paths.takes_register_tiles``)."""
    return tiled_kernel if paths.takes_register_tiles(m) else small_m_kernel


def bias_vector(bias):
    """The kernels' bias: float32 of length N, or length 0 for none (float16 / bfloat16 widen to
    float32 exactly)."""
    return np.zeros(0, np.float32) if bias is None else np.ascontiguousarray(bias, dtype=np.float32)


def to_out_dtype(out, out_dtype):
    """The float32 result rounded to ``out_dtype``: numpy / ml_dtypes casts round to nearest, ties to
    even; past the dtype's largest finite value that rounding gives inf, which is the defined result,
    not a warning."""
    if out.dtype != out_dtype:
        with np.errstate(over="ignore"):
            out = out.astype(out_dtype)
    return out
