"""Block-scaled FP8 on the CPU: per-group activation quantization and the block-scaled GEMM.

These are the formats of DeepSeek-V3/R1, Qwen3-FP8 and compressed-tensors' FP8_BLOCK preset
(DESIGN.md, "per-group activations" and "block-scaled weights"):

- **group quantization**: each run of ``g`` elements along a row gets its own dynamic scale,
  ``max(amax, 1e-10) / 448`` (``vtnumba._format.per_group_scale``, optionally rounded up to a power of
  two), and ``codes = encode(x / scale)``, a divide, as upstream vLLM's ``per_token_group_quant_fp8``.
  A last group shorter than ``g`` (K % g != 0) takes its own amax (upstream's torch-native QuantFP8
  zero-pads to the same effect; its CUDA kernel refuses such K).
- **block-scaled GEMM**: ``y[m, n] = bias[n] + sum_kb (P[m, n, kb] * sa[m, kb]) * sb[n // bn, kb]``,
  P the float32 sum of the exact products in K-block kb, the scaled blocks summed in float32 in kb
  order, as upstream's Triton ``_w8a8_triton_block_scaled_mm`` does
  (``accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :]``), then the bias in float32, then
  rounded (RNE) to the out dtype. Any (bn, bk); the last blocks along N and K may be short.

The GEMM's kernels follow ``vtnumba.cpu.gemm`` (read its docstring for the measured choices: the
crossover, the register blocking, the serial decode around sgemm) and share its pieces:

- ``reference``: plain loops in the exact order above, no reassociation; the tests' second oracle.
- ``small_m``: each weight byte decoded once; at M = 1 straight into four dot products, above that
  into a small buffer shared by 4 x 4 register blocks. The sums inside a K-block may be reassociated
  (they are float32 sums of exact products, G3 allows any order); the block step is not
  (``_block_steps``, compiled strict).
- ``blas``: a block of a and a panel of b decoded exactly into float32 tiles stored K-block by
  K-block, one sgemm per K-block, then the block step over the tile.

Kernels never validate (the boundary does); they take uint8 codes, float32 scale_a [M, nkb] and
scale_b [ceil(N / bn), nkb] (C-contiguous), and a float32 bias of length N or 0 (none).
"""

import math

import numpy as np
from numba import njit, prange

from .._config import (
    CPU_CHUNK,
    CPU_INLINE,
    CPU_PARALLEL_MIN_ELEMENTS,
    CPU_PARALLEL_MIN_MACS,
    CPU_SERIAL_KERNEL,
    CPU_STRICT_FUNCTION,
)
from . import _kernel_input, paths, tile
from .codec import decode_e4m3, per_group_scale
from .gemm import (
    _K_CHUNK,
    _REASSOC,
    _SMALL_M_ROWS,
    KERNELS,
    SMALL_M_ELEMENTS,
    accumulate_rows,
    add_bias,
    ahead_rows,
    bias_vector,
    blas_tiles,
    decode_rows,
    gemm_macs,
    to_out_dtype,
)
from .paths import cpu_kernel, run_sgemm_driver, team_runs, vector_width_hint
from .quant import _elements, _encode_divided, _finite_amax
from .tile import TILE_LOOKUP as tile_lookup
from .tile import decode_block as tile_decode
from .vbmi import dot4_e4m3_blocks_bf16 as dot4_e4m3_blocks
from .vbmi import prefetch

# Whether this path's M = 1 kernel sums whole 64-code K-blocks with a byte-lookup loop
# (``dot4_e4m3_blocks``): a path's kernel_globals turn it on (paths.py); False here prunes the call
# from every other path's kernel, which never compiles the instructions it lacks.
block_lookup = False

__all__ = ["quantize_per_group", "block_scaled_mm", "KERNELS"]


# -- group quantization ----------------------------------------------------------------------------


@cpu_kernel(CPU_PARALLEL_MIN_ELEMENTS, _elements)
def quantize_per_group_kernel(x, group_size, ue8m0, out, scales, scale_row_stride, scale_group_stride):
    """out = encode(x / s) per group of ``group_size`` along each row of x [rows, K]; the group's scale
    goes to ``scales[row * scale_row_stride + group * scale_group_stride]`` (flat), which serves the
    row-major [rows, groups] and the column-major [groups, rows] layouts alike.

    Work items are runs of whole groups, about CPU_CHUNK elements each, so both cores share a
    single long row (decode: M = 1) as well as many short ones. Each group is read twice, the
    second time from L1."""
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
            s = per_group_scale(_finite_amax(xs), ue8m0)
            scales[r * scale_row_stride + j * scale_group_stride] = s
            _encode_divided(xs, s, out[r, lo:hi])
            j += 1
            if j == groups:  # next row, without an integer divide per group
                j = 0
                r += 1


def quantize_per_group(x, group_size, scale_ue8m0=False, column_major_scales=False):
    """Per-group dynamic quantization of x (float32 / float16 / bfloat16, shape [..., K]) in groups
    of ``group_size`` along the last axis. Returns (codes uint8 of x's shape, scales float32 of shape
    x.shape[:-1] + (ceil(K / group_size),)). ``column_major_scales`` (2-D x only): the scales array
    has the same shape but column-major memory ([groups, M] underneath, m contiguous), the layout
    upstream's cutlass / DeepGEMM paths and cuBLASLt's VEC128 activation scales read."""
    return run_group_kernel(
        quantize_per_group_kernel, x, group_size, bool(scale_ue8m0), column_major_scales, np.float32
    )


def run_group_kernel(kernel, x, group_size, rule, column_major_scales, scale_dtype):
    """Run a per-group quantization kernel (``quantize_per_group_kernel``, ``mx.quantize_kernel``) over x
    [..., K] in groups of ``group_size``; ``rule`` is the kernel's scale rule argument. Returns (codes of
    x's shape, scales of ``scale_dtype`` and shape x.shape[:-1] + (ceil(K / group_size),), row-major or
    column-major)."""
    xin = _kernel_input(x)
    k = xin.shape[-1]
    m = math.prod(xin.shape[:-1])
    rows = xin.reshape(m, k)
    groups = -(-k // group_size)
    codes = np.empty(rows.shape, dtype=np.uint8)
    flat = np.empty(groups * m, dtype=scale_dtype)
    if column_major_scales:
        kernel(rows, group_size, rule, codes, flat, 1, m)
        scales = flat.reshape(groups, m).T
    else:
        kernel(rows, group_size, rule, codes, flat, groups, 1)
        scales = flat.reshape(xin.shape[:-1] + (groups,))
    return codes.reshape(xin.shape), scales


# -- the block-scaled GEMM -------------------------------------------------------------------------


@njit(**CPU_STRICT_FUNCTION)
def _block_step(total, p, sa, sb):
    """total + (p * sa) * sb in float32, in that order (upstream's Triton block kernel; Triton may
    fuse the last multiply-add into an FMA, which the G3-per-block bound also covers)."""
    return total + (p * sa) * sb


@njit(**CPU_STRICT_FUNCTION)
def _block_steps(total, p, sat, scale_b, kb0, n0, bn, valid, m0, m1):
    """total[j, m] = total[j, m] + (p[i, j, m] * sat[kb, m0 + m]) * sb_j for kb = kb0 + i, j < valid and
    the activation rows m0 .. m1 - 1, in kb order; sb_j = scale_b[(n0 + j) // bn, kb], the weight
    row-block of the tile's row j (totals and sums may be padded past m1 - m0: the small-M kernels' one
    block step).

    The fast kernels reassociate (their sums inside a K-block are float32 sums of exact products, which
    G3 lets run in any order); this function is compiled with fastmath=False (CPU_STRICT_FUNCTION: a
    callee otherwise takes its caller's flags) and called, not inlined, so the block step keeps its
    order and roundings inside them: LLVM may neither fold sa * sb into one factor, nor fuse the add
    into an FMA, nor reorder the sum over K-blocks. Its m loop vectorizes as it is (element-wise).
    Called once a K-block for a whole tile: a call per row made both block kernels 1.3-1.6x slower at
    16 x 256 x 512 (each call takes three array views; their reference counts are the likely cost)."""
    for i in range(p.shape[0]):
        kb = kb0 + i
        sa = sat[kb, m0:m1]
        for j in range(valid):
            sb = scale_b[(n0 + j) // bn, kb]
            t = total[j]
            q = p[i, j]
            for m in range(sa.size):
                t[m] = t[m] + (q[m] * sa[m]) * sb


@njit(**CPU_INLINE)
def _row_blocks(n0, n_rows, bn):
    """The weight row-blocks of rows n0 .. n0 + 3 (rows past the end repeat the last one)."""
    last = n_rows - 1
    return n0 // bn, min(n0 + 1, last) // bn, min(n0 + 2, last) // bn, min(n0 + 3, last) // bn


@njit(**CPU_SERIAL_KERNEL)
def reference_kernel(a, b, scale_a, scale_b, bn, bk, bias, out):
    """Plain loops in the contract's order: k in order inside each block, blocks in order."""
    m_rows, k_len = a.shape
    nkb = scale_a.shape[1]
    for m in range(m_rows):
        for n in range(b.shape[0]):
            total = np.float32(0.0)
            for kb in range(nkb):
                p = np.float32(0.0)
                for k in range(kb * bk, min(k_len, (kb + 1) * bk)):
                    p += decode_e4m3(a[m, k]) * decode_e4m3(b[n, k])
                total = _block_step(total, p, scale_a[m, kb], scale_b[n // bn, kb])
            out[m, n] = add_bias(total, bias, n)


@njit(**CPU_STRICT_FUNCTION)
def _block_steps_m1(p, sat, scale_b, nb0, nb1, nb2, nb3, valid, bias, out, n0):
    """M = 1, the last rows (valid < 4): out[0, n0 + j] = bias + the block steps of p[kb, j] in kb
    order, j < valid (as ``_block_steps``, with scalars: at M = 1 the array views of the general
    form cost 10%)."""
    t = np.zeros(4, dtype=np.float32)
    for kb in range(p.shape[0]):
        sa = sat[kb, 0]
        for j in range(valid):
            t[j] = t[j] + (p[kb, j] * sa) * scale_b[nb0 if j == 0 else nb1 if j == 1 else nb2 if j == 2 else nb3, kb]
    for j in range(valid):
        out[0, n0 + j] = add_bias(t[j], bias, n0 + j)


@njit(**CPU_STRICT_FUNCTION)
def _block_steps_four(p, kb0, sat, scale_b, nb0, nb1, nb2, nb3, t0, t1, t2, t3):
    """M = 1, four rows: totals t_j carried on by the block steps of p[i, j], kb = kb0 + i, in kb
    order. Four scalars, not an array: the array's allocation and its loop over j cost 18 of the 155
    us at 1536 x 2048 (one Zen 4 thread, weights in cache)."""
    for i in range(p.shape[0]):
        kb = kb0 + i
        sa = sat[kb, 0]
        t0 = t0 + (p[i, 0] * sa) * scale_b[nb0, kb]
        t1 = t1 + (p[i, 1] * sa) * scale_b[nb1, kb]
        t2 = t2 + (p[i, 2] * sa) * scale_b[nb2, kb]
        t3 = t3 + (p[i, 3] * sa) * scale_b[nb3, kb]
    return t0, t1, t2, t3


@njit(**CPU_STRICT_FUNCTION)
def _write_four(t0, t1, t2, t3, bias, out, n0):
    """out[0, n0 + j] = t_j + bias[n0 + j], the bias added in a strict function as every block
    kernel adds it."""
    out[0, n0] = add_bias(t0, bias, n0)
    out[0, n0 + 1] = add_bias(t1, bias, n0 + 1)
    out[0, n0 + 2] = add_bias(t2, bias, n0 + 2)
    out[0, n0 + 3] = add_bias(t3, bias, n0 + 3)


@njit(**CPU_INLINE)
def _block_sums_four(xr, b, n0, bk, kb0, nkb, ahead):
    """p[i, j] = sum_{k in K-block kb0 + i} x[k] * dec(b[n0 + j, k]), kb0 <= kb < nkb, four rows: the
    bit-arithmetic decode, for a path with no lookup loop or the K-blocks it leaves."""
    k_len = b.shape[1]
    p = np.empty((nkb - kb0, _SMALL_M_ROWS), dtype=np.float32)
    for kb in range(kb0, nkb):
        lo = kb * bk
        hi = min(k_len, lo + bk)
        # the next four rows' bytes at this block's pace, a line at a time (as gemm's lookup
        # kernel, vbmi.dot4_e4m3): 4.3 -> 5.6 G weights/s at 1536 x 2048 with cold weights
        for i in range(_SMALL_M_ROWS * lo, _SMALL_M_ROWS * hi, 64):
            prefetch(ahead, i)
        xs = xr[lo:hi]
        w0, w1, w2, w3 = b[n0, lo:hi], b[n0 + 1, lo:hi], b[n0 + 2, lo:hi], b[n0 + 3, lo:hi]
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for k in range(hi - lo):
            u = xs[k]
            a0 += u * decode_e4m3(w0[k])
            a1 += u * decode_e4m3(w1[k])
            a2 += u * decode_e4m3(w2[k])
            a3 += u * decode_e4m3(w3[k])
        i = kb - kb0
        p[i, 0], p[i, 1], p[i, 2], p[i, 3] = a0, a1, a2, a3
    return p


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs, fastmath=_REASSOC)
def gemv_kernel(x, b, sat, scale_b, bn, bk, bias, out):
    """M = 1: four rows of b per step share each load of x (as ``gemm.gemv_kernel``), the decode
    fused into the dot products. On a path with a lookup loop (``block_lookup``) it runs every whole
    64-code K-block, block steps included; otherwise each block's four sums are kept, then one call
    applies the block steps: with that call inside the loop over blocks the dot products stopped
    vectorizing (7.9 vs 1.3 ms at N = K = 4096), and so they did when indexed x[k] over range(lo, hi)
    instead of sliced (7.0 vs 2.3 ms, one thread)."""
    n_rows, k_len = b.shape
    nkb = sat.shape[0]
    xr = x[0]
    flat = b.reshape(-1)  # b's rows as one run of bytes: a later block's are read ahead
    last = max(0, n_rows - _SMALL_M_ROWS) * k_len  # the last whole block (read ahead past it: itself)
    skip = ahead_rows(k_len)
    for block in prange((n_rows + _SMALL_M_ROWS - 1) // _SMALL_M_ROWS):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        n0 = block * _SMALL_M_ROWS
        valid = min(_SMALL_M_ROWS, n_rows - n0)
        nb0, nb1, nb2, nb3 = _row_blocks(n0, n_rows, bn)
        if valid == _SMALL_M_ROWS:
            ahead = flat[min((n0 + skip) * k_len, last) :]
            whole = 0  # K-blocks run by the path's lookup loop; the rest below
            t0 = t1 = t2 = t3 = np.float32(0.0)
            if block_lookup:
                if bk % 64 == 0:
                    whole = k_len // bk
                    w0, w1, w2, w3 = b[n0], b[n0 + 1], b[n0 + 2], b[n0 + 3]
                    s0, s1, s2, s3 = scale_b[nb0], scale_b[nb1], scale_b[nb2], scale_b[nb3]
                    t0, t1, t2, t3 = dot4_e4m3_blocks(xr, w0, w1, w2, w3, bk // 64, whole, sat, s0, s1, s2, s3, ahead)
            if whole < nkb:
                p = _block_sums_four(xr, b, n0, bk, whole, nkb, ahead)
                t0, t1, t2, t3 = _block_steps_four(p, whole, sat, scale_b, nb0, nb1, nb2, nb3, t0, t1, t2, t3)
            _write_four(t0, t1, t2, t3, bias, out, n0)
        else:
            p = np.empty((nkb, _SMALL_M_ROWS), dtype=np.float32)
            for j in range(valid):
                for kb in range(nkb):
                    lo = kb * bk
                    hi = min(k_len, lo + bk)
                    xs, w = xr[lo:hi], b[n0 + j, lo:hi]
                    acc = np.float32(0.0)
                    for k in range(hi - lo):
                        acc += xs[k] * decode_e4m3(w[k])
                    p[kb, j] = acc
            _block_steps_m1(p, sat, scale_b, nb0, nb1, nb2, nb3, valid, bias, out, n0)


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs, fastmath=_REASSOC)
def small_m_kernel(x, b, sat, scale_b, bn, bk, bias, out):
    """Small M > 1, from x = dec(a) and codes b: ``gemm.small_m_kernel``'s 4 x 4 register blocks over
    a buffer of four decoded weight rows, walked K-block by K-block (a block in passes of at most
    _K_CHUNK, so the buffer stays in L1), each block's sums then scaled into the totals by one call.

    Measured against the per-tensor kernel on one thread (N = K = 4096, bk = 128, CPU time, AVX-512):
    0.74-0.78x at M = 16, 0.64x at M = 64. The cost is the block itself: LLVM vectorizes each of the
    16 sums along k in 16 lanes, so every 128 values of k (8 vector steps) it reduces 16 vectors across
    their lanes, where the per-tensor kernel does so every 1024; that kernel run in 128-wide passes
    measured 0.85x and 0.66x. Vectorizing along m instead (32 scalar accumulators for LLVM's SLP
    vectorizer to pack) came out 3x slower: it packed them only partly."""
    m_rows, k_len = x.shape
    n_rows = b.shape[0]
    nkb = sat.shape[0]
    chunk = min(bk, _K_CHUNK, k_len)
    for block in prange((n_rows + _SMALL_M_ROWS - 1) // _SMALL_M_ROWS):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        n0 = block * _SMALL_M_ROWS
        valid = min(_SMALL_M_ROWS, n_rows - n0)
        rows = np.zeros((_SMALL_M_ROWS, chunk), dtype=np.float32)
        p = np.empty((1, _SMALL_M_ROWS, m_rows), dtype=np.float32)
        acc = p[0]  # [4, M]: row j of the tile, m contiguous (the block step runs along m)
        total = np.zeros((_SMALL_M_ROWS, m_rows), dtype=np.float32)
        for kb in range(nkb):
            acc[:] = 0.0
            k_hi = min(k_len, (kb + 1) * bk)
            for k0 in range(kb * bk, k_hi, chunk):
                kc = min(chunk, k_hi - k0)
                for j in range(valid):
                    w = b[n0 + j, k0 : k0 + kc]
                    dst = rows[j]
                    for k in range(kc):
                        dst[k] = decode_e4m3(w[k])
                w0, w1, w2, w3 = rows[0, :kc], rows[1, :kc], rows[2, :kc], rows[3, :kc]
                accumulate_rows(x, k0, kc, w0, w1, w2, w3, acc.T)  # acc.T: acc is [4, M]
            _block_steps(total, p, sat, scale_b, kb, n0, bn, valid, 0, sat.shape[1])
        for m in range(m_rows):
            for j in range(valid):
                out[m, n0 + j] = add_bias(total[j, m], bias, n0 + j)


@njit(**CPU_INLINE)
def store_tile_sums(total, bias, out, n0, valid):
    """out[m, n0 + j] = total[j, m] + bias[n0 + j] for the tile's rows j < valid and every row m of
    out: a tiled kernel's last step where the scales are already in the totals (block-scaled, MXFP8)."""
    if bias.size != 0:
        for j in range(valid):
            row = total[j, : out.shape[0]]
            bn = bias[n0 + j]
            for m in range(row.size):
                row[m] = row[m] + bn  # add_bias, along the tile's rows
    tile.store_sums(total, out, n0, valid)


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs)
def tiled_kernel(x, b, sat, scale_b, bn, bk, bias, out):
    """small_m on the AVX-512 paths (``paths.CpuPath.register_tiles``): ``small_m_kernel``'s contract,
    each K-block summed in K order by ``tile.py``'s register tiles, then the strict block step, blocks
    in order: bitwise ``reference_kernel``'s result."""
    m_rows, k_len = x.shape
    n_rows = b.shape[0]
    nkb = sat.shape[0]
    nr = tile.BLOCK_ROWS
    blocks = (n_rows + nr - 1) // nr
    runs = team_runs(blocks)
    # K-blocks narrower than a pass go through it together: one decode of the pass's codes, then each
    # block's sums from its own columns (a decode a block was a decode call per weight row per block:
    # at bk = 32, 1 x 32 blocks, the tiles took 3.3x their bk = 128 time at M = 16, 512 x 256). A block
    # wider than a pass runs in passes of its own.
    group = tile.TILE_K // bk if bk <= tile.TILE_K else 1
    span = group * bk if bk <= tile.TILE_K else tile.TILE_K
    panel = tile.panel_rows(k_len)
    for run in prange(runs):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        for m0 in range(0, m_rows, panel):  # tile.panel_rows: the activation a panel at a time
            m1 = min(m_rows, m0 + panel)
            xt = tile.activation_columns(x[m0:m1], tile_lookup)  # this thread's own (tile.activation_columns)
            for block in range(run * blocks // runs, (run + 1) * blocks // runs):
                n0 = block * nr
                valid = min(nr, n_rows - n0)
                buffer = tile.weight_buffer(nr, valid)
                w = tile.weight_columns(buffer, nr, 0)
                sums = np.empty((group, nr, xt.shape[1]), dtype=np.float32)  # a pass's K-blocks (_block_steps)
                total = np.zeros((tile.LANES, xt.shape[1]), dtype=np.float32)
                for kb0 in range(0, nkb, group):
                    in_pass = min(group, nkb - kb0)
                    k_end = min(k_len, (kb0 + in_pass) * bk)
                    sums[:in_pass] = 0.0
                    for k_lo in range(kb0 * bk, k_end, span):
                        k_hi = min(k_end, k_lo + span)
                        tile_decode(b, n0, valid, k_lo, k_hi - k_lo, w)
                        for i in range(in_pass):
                            lo = max(k_lo, (kb0 + i) * bk)
                            hi = min(k_hi, (kb0 + i + 1) * bk)
                            tile.sum_tiles(xt, lo, hi - lo, tile.weight_columns(buffer, nr, lo - k_lo), sums[i])
                    _block_steps(total, sums[:in_pass], sat, scale_b, kb0, n0, bn, valid, m0, m1)
                store_tile_sums(total, bias, out[m0:m1], n0, valid)


@njit(**CPU_SERIAL_KERNEL)
def _decode_blocked(codes, bk, out):
    """out[kb, r, :] = dec(codes[r, kb * bk:(kb + 1) * bk]) exactly; a short last block is padded
    with zeros (exact zero products, so P is unchanged). Each K-block's tile is then C-contiguous,
    which sgemm wants."""
    k_len = codes.shape[1]
    for kb in range(out.shape[0]):
        lo = kb * bk
        width = min(bk, k_len - lo)
        for r in range(codes.shape[0]):
            src = codes[r, lo : lo + width]
            dst = out[kb, r]
            for k in range(width):
                dst[k] = decode_e4m3(src[k])
            for k in range(width, bk):
                dst[k] = np.float32(0.0)


@njit(**CPU_STRICT_FUNCTION)
def _block_epilogue(p, total, sa_col, sb_row):
    """total[i, j] = total[i, j] + (p[i, j] * sa_col[i]) * sb_row[j] in float32: the block step over a
    tile, with no fast-math flags (so in that order); it vectorizes along j as it is."""
    for i in range(p.shape[0]):
        src = p[i]
        dst = total[i]
        sa = sa_col[i]
        for j in range(src.size):
            dst[j] = dst[j] + (src[j] * sa) * sb_row[j]


@cpu_kernel(CPU_PARALLEL_MIN_MACS, gemm_macs)
def blas_kernel(a, b, sat, scale_b, bn, bk, bias, out, block_rows, panel_rows, slots):
    """Decode a block of a and a panel of b into K-block-major float32 tiles, then per K-block one
    sgemm (P) and the block step into a float32 panel of totals; the bias last. The serial twin (one
    slot) is a driver whose sgemm brings the threads (see the note above ``gemm.decode_rows``); the
    parallel twin deals a block's panels to ``slots`` workers (panel i to slot i % slots), each with
    tiles of its own and one BLAS thread, which is how it runs inside a torch forward on torch's
    OpenMP team (``paths.team_blas_threads``). A panel's sums do not depend on its slot. (Slots, not
    Numba's thread ids: a kernel that asks for those cannot be cached on disk.)"""
    m_rows, k_len = a.shape
    n_rows = b.shape[0]
    nkb = sat.shape[0]
    mb_max = min(block_rows, m_rows)
    nb_max = min(panel_rows, n_rows)
    # flat buffers, reshaped per block / panel: every K-block's tile stays C-contiguous for sgemm
    a_tile = np.empty(nkb * mb_max * bk, dtype=np.float32)
    b_tiles = np.empty((slots, nkb * nb_max * bk), dtype=np.float32)
    p_tiles = np.empty((slots, mb_max * nb_max), dtype=np.float32)
    t_tiles = np.empty((slots, mb_max * nb_max), dtype=np.float32)
    sb_rows = np.empty((slots, nb_max), dtype=np.float32)
    panels = (n_rows + panel_rows - 1) // panel_rows
    for m0 in range(0, m_rows, block_rows):
        mb = min(block_rows, m_rows - m0)
        a_dec = a_tile[: nkb * mb * bk].reshape((nkb, mb, bk))
        _decode_blocked(a[m0 : m0 + mb], bk, a_dec)
        for slot in prange(slots):
            for panel in range(slot, panels, slots):
                n0 = panel * panel_rows
                nb = min(panel_rows, n_rows - n0)
                b_dec = b_tiles[slot, : nkb * nb * bk].reshape((nkb, nb, bk))
                _decode_blocked(b[n0 : n0 + nb], bk, b_dec)
                p = p_tiles[slot, : mb * nb].reshape((mb, nb))
                total = t_tiles[slot, : mb * nb].reshape((mb, nb))
                sb_row = sb_rows[slot, :nb]
                total[:] = 0.0
                for kb in range(nkb):
                    np.dot(a_dec[kb], b_dec[kb].T, p)  # sgemm, float32 accumulate
                    for j in range(nb):
                        sb_row[j] = scale_b[(n0 + j) // bn, kb]
                    _block_epilogue(p, total, sat[kb, m0 : m0 + mb], sb_row)
                for i in range(mb):
                    dst = out[m0 + i, n0 : n0 + nb]
                    src = total[i]
                    for j in range(nb):
                        dst[j] = add_bias(src[j], bias, n0 + j)


# The 4 x 4 small_m kernel takes M below 64; from there decode + one sgemm per K-block is faster, far
# sooner than for the per-tensor GEMM (whose small_m kernel runs to M * K = 3 Mi), because the block
# costs small_m a lane reduction every bk values of k. Measured (N = K = 4096, bk = 128, one thread,
# CPU ms): M = 32: small_m 19.8, blas 25.3; 48: 31.7 / 38.7; 64: 45.3 / 38.5; 256: 162 / 110.
SMALL_M_ROWS = 64
# The register tiles (the AVX-512 paths' small_m from 16 rows, tile.py) reduce no lanes, and take M
# below 160. Measured inside a torch forward, two threads, per_group and MXFP8 layers against the blas
# kernels' panels (benchmarks/RESULTS.md, 2026-12-07 09:00): at K x N = 256-512 x 128-512 the tiles
# took 0.72-0.89x their time at M = 64, 0.80-0.97x at 128, 0.85-1.07x at 192, 0.92-1.09x at 256 and
# 0.50-1.56x at 512; at N = K = 4096 (per_group) 0.59x at M = 64, 0.93x at 128, 1.17x at 192.
TILED_SMALL_M_ROWS = 160
# Past those rows, and past SMALL_M_ELEMENTS, the tiles keep every call whose weight is small: N x K
# <= 1 Mi. Until the tiles took the activation a panel at a time (tile.panel_rows) they lost at large M
# x K, and a bound of M x K <= 128 Ki kept them (the tiny Llama's per_group forward at 2,048 tokens,
# 82.52-87.50 ms on the blas kernels, took 98.63-101.49 with the bound at 512 Ki). With the panels,
# inside a torch forward at two threads (benchmarks/RESULTS.md, 2026-12-07 15:04-15:29), the tiles took 0.90x /
# 0.93x the blas kernels' time at 1024 x 1024 with M = 1,024 / 2,048, 0.53-0.57x at 512 x 256 with
# M = 8,192; the tiny Llama's forward at 2,048 tokens went 84.76-89.83 -> 79.24-79.68 ms (per_group)
# and 103.22-103.75 -> 90.47-91.62 (MXFP8). A larger weight keeps the rows rule: at 2048 x 2048 the
# tiles took 0.92x at M = 192 and 1.22x at 512, at 4096 x 4096 1.02-1.06x at M = 192-512.
TILED_MAX_WEIGHT = 1 << 20  # N x K


def small_m_rows():
    """The rows below which a block-scaled (or MX) GEMM takes small_m on the active path."""
    return TILED_SMALL_M_ROWS if paths.active().register_tiles else SMALL_M_ROWS


def takes_small_m(m, n, k):
    """Whether a block-scaled (or MX) GEMM of this shape takes small_m on the active path: on the
    register tiles at any M while N x K <= TILED_MAX_WEIGHT, else below ``small_m_rows()`` rows with
    M x K at most SMALL_M_ELEMENTS."""
    if n * k <= TILED_MAX_WEIGHT and paths.active().register_tiles:
        return True
    return m < small_m_rows() and m * k <= SMALL_M_ELEMENTS


def rows_kernel(m):
    """The small_m kernel for M = m > 1 on the active path (``paths.takes_register_tiles``)."""
    return tiled_kernel if paths.takes_register_tiles(m) else small_m_kernel


def choose_kernel(m, n, k):
    """The block-scaled GEMM's kernel for a shape when none is forced (``takes_small_m``)."""
    return "small_m" if takes_small_m(m, n, k) else "blas"


def block_scaled_mm(a, b, scale_a, scale_b, block_size, out_dtype, bias, kernel=None):
    """The CPU backend's block-scaled GEMM. a [M, K] and b [N, K] uint8 codes; scale_a float32
    [M, ceil(K / bk)]; scale_b float32 [ceil(N / bn), ceil(K / bk)]; block_size (bn, bk); bias
    [N] or None; ``kernel`` None (picked by shape, as the per-tensor GEMM), 'reference', 'small_m'
    or 'blas'. Returns y [M, N] in ``out_dtype``."""
    m, k = a.shape
    n = b.shape[0]
    bn, bk = (int(v) for v in block_size)
    if kernel is None:
        kernel = choose_kernel(m, n, k)
    elif kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)} on the CPU, got {kernel!r}")
    sb = np.ascontiguousarray(scale_b, dtype=np.float32)
    bias32 = bias_vector(bias)
    out = np.empty((m, n), dtype=np.float32)
    if out.size == 0 or k == 0:
        out[:] = np.float32(0.0) + bias32 if bias32.size else np.float32(0.0)  # no blocks: 0 + bias
    elif kernel == "reference":
        reference_kernel(a, b, np.asarray(scale_a, dtype=np.float32), sb, bn, bk, bias32, out)
    else:
        # the fast kernels read the activation scales K-block by K-block: [nkb, M], m contiguous
        sat = np.ascontiguousarray(np.asarray(scale_a, dtype=np.float32).T)
        a = np.ascontiguousarray(a)
        b = np.ascontiguousarray(b)
        if kernel == "blas":
            block_rows, panel_rows = blas_tiles(m, n, k)
            run_sgemm_driver(
                blas_kernel,
                (a, b),
                n,
                panel_rows,
                min(m, block_rows) * min(n, panel_rows) * bk,  # one sgemm per K-block
                lambda threads, rows: blas_kernel.call_with(
                    threads, a, b, sat, sb, bn, bk, bias32, out, block_rows, rows, threads
                ),
            )
        elif m > 1 and rows_kernel(m) is tiled_kernel:
            # the codes: each thread decodes its own (tile.activation_columns)
            tiled_kernel(a, b, sat, sb, bn, bk, bias32, out)
        else:
            x = np.empty((m, k), dtype=np.float32)
            decode_rows(a, x)
            (gemv_kernel if m == 1 else small_m_kernel)(x, b, sat, sb, bn, bk, bias32, out)
    return to_out_dtype(out, out_dtype)
