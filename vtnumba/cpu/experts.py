"""The CPU backend of the mixture-of-experts ops (``vtnumba.seam.experts``): numpy in, numpy out.

The six steps a MoE layer is made of, each a function both backends offer with the same arguments
(``vtnumba.cuda.experts`` is the GPU's):

- ``moe_align(topk_ids, num_experts)``: the routed (token, slot) pairs sorted by expert;
- ``gather_rows(src, row_token)``: rows of ``src`` in that order (codes, scales or floats);
- ``quantize_rows_static(x, offsets, input_scales)``: each expert's rows by its own static scale;
- ``grouped_scaled_mm(a, scale_a, b, scale_b, offsets, out_dtype, block_size)``: every expert's
  rows times its weight;
- ``silu_mul(h, offsets)``: vLLM's ``silu_and_mul`` on the gate_up output, padding rows zeroed;
- ``moe_combine(y, pair_row, topk_weights, out_dtype)``: each token's k outputs, weighted, summed.

Layout every step shares: P = T * k pair slots. ``offsets`` int32 [E + 1]: rows
offsets[e]:offsets[e + 1] of the sorted activation are expert e's; R = offsets[E] <= P rows are
routed (pairs naming an expert outside [0, E) are skipped), rows R..P are padding, which
``grouped_scaled_mm`` writes as 0 and no other step reads.

**The grouped GEMM** is the per-expert ``vt.scaled_mm`` loop (``vtnumba.cpu.scaled_mm`` /
``block_scaled_mm`` on each expert's rows) made one call, and equal to it bit for bit, for every
scale kind: per-tensor or per-row activation scales with per-tensor or per-channel weight scales,
float32 block scales, E8M0 weight blocks beside float32 activation groups, and MXFP8 (E8M0 on both
sides). Each expert's rows take the kernel that loop would give them (``choose_kernel`` of
``gemm`` / ``block`` / ``mx`` on the expert's row count): at the small-M sizes -- one row per expert
at decode, a handful in a 16-token step -- one parallel region over (routed expert, 256-row N tile)
work items runs, in each item, the *serial* twin of the dense small-M kernel of that kind on that
expert's rows and that tile of its weight (``gemm.gemv_lookup_kernel`` / ``gemv_kernel`` at one row,
``small_m_kernel`` above; ``block.gemv_kernel`` / ``small_m_kernel``; ``mx.gemv_lookup_kernel`` /
``small_m_kernel``). So each routed expert's weight bytes are decoded once per call whatever its row
count (the small-M kernels decode four weight rows into an L1 buffer, or straight into the dot
products at one row), empty experts cost nothing, and both cores share the experts instead of each
expert's small call running alone on one (a 1 x 1536 x 2048 expert GEMM is under the 4 Mi
multiply-add threshold). Calling the dense kernels, rather than a grouped copy of their loops, is
what makes the result bitwise: the same compiled inner loops over the same rows in the same order.
Tiles start at multiples of 4 (and of the block height bn) of the expert's N, so every weight row
falls in the same 4-row register block as in the dense call, with the same scale row-block.
Experts with more rows (where the dense loop picks the ``blas`` kernel: M * K over 3 Mi, or M >= 64
with block scales) are called one by one through the dense entry points -- sgemm already spreads
them over the cores -- and so are MXFP8 experts whose scale bytes leave the exact shortcut's window
(``mx.py``'s module docstring), whose dense call then runs the block-scaled kernels; bitwise too.
Measured in tests/test_experts_cpu.py: bitwise against the per-expert loop for every kind above at
1-17 rows per expert (the M = 1 kernels, 4 x 4 blocks and their 1 x 4 tails), at 70 rows (block and
MX experts past the small-M kernels) and 11000 (a per-tensor one), with float32 and bfloat16 out,
the drivers' parallel twins too; within G3 (G3 per block) of the float64 reference, which the loop
meets. Not bitwise against a per-*row* loop (``scaled_mm`` of one row at a time): a row's sum order
depends on how many rows its expert has (the M = 1 kernel, a 4 x 4 block or its 1 x 4 tail), which
G3 allows. So ``moe_fp8`` equals its composite of dense seam ops bit for bit when each expert's rows
go through one dense call, and a pair-by-pair composite only where every expert has one row.

Kernels never validate (the seam does).
"""

import math
import types

import numpy as np
from numba import njit, prange

from .._config import CPU_INLINE, CPU_PARALLEL_MIN_ELEMENTS, CPU_PARALLEL_MIN_MACS, CPU_SERIAL_KERNEL
from .._format import MX_GROUP
from . import _kernel_input, block, gemm, mx, paths
from .paths import CpuKernel, cpu_kernel, vector_width_hint
from .quant import _encode_times
from .tile import MIN_ROWS as TILE_MIN_ROWS

__all__ = [
    "moe_align",
    "active_experts",
    "gather_rows",
    "quantize_rows_static",
    "grouped_scaled_mm",
    "silu_mul",
    "moe_combine",
]

# Weight rows per work item of the grouped GEMM: a multiple of the 4-row register block (and of 64,
# the M = 1 MX kernel's rows per item) that gives a 1536 x 2048 gate_up expert 6 items, enough for
# two cores to share one expert evenly. Not smaller: the M = 1 kernels read the next 4-row block
# ahead while they work (vbmi.dot4_e4m3), but an item's first block comes cold, and the items a
# thread runs in turn belong to different experts. Measured on one Xeon thread, the 8 routed gate_up
# experts of a token (1536 x 2048 each) with cold weights: 9.5 / 10.5 / 11.1 / 11.6 G weights/s at
# 64 / 128 / 256 / 512 rows an item (the dense call on each expert alone: 11.6).
_TILE_ROWS = 256


# -- align, gather, static quantization ----------------------------------------------------------


@njit(**CPU_SERIAL_KERNEL)
def _align_kernel(ids, num_experts, k, offsets, pair_row, row_token):
    """A counting sort of the pairs by expert (stable: ties stay in pair order, as numpy's stable
    argsort of the reference keeps them). ``offsets`` is filled from a histogram shifted by one."""
    n_pairs = ids.size
    valid = np.empty(n_pairs, dtype=np.bool_)
    for i in range(n_pairs):
        e = ids[i]
        valid[i] = (e >= 0) & (e < num_experts)  # -1 (vLLM's padding), E (transformers' sentinel): no row
        if valid[i]:
            offsets[e + 1] += 1
    for e in range(num_experts):
        offsets[e + 1] += offsets[e]
    cursor = offsets[:num_experts].copy()
    for i in range(n_pairs):
        if valid[i]:
            e = ids[i]
            r = cursor[e]
            cursor[e] = r + 1
            pair_row[i] = r
            row_token[r] = i // k
        else:
            pair_row[i] = -1
    for r in range(offsets[num_experts], n_pairs):
        row_token[r] = 0  # padding rows name token 0, so a gather by them stays in bounds


def moe_align(topk_ids, num_experts):
    """(offsets int32 [E + 1], pair_row int32 [T, k], row_token int32 [P]) for ``topk_ids`` [T, k].

    A pair whose id is outside [0, E) (vLLM's -1 padding, transformers' sentinel E, an expert another
    rank holds) gets no row: ``pair_row`` is -1 there. The routed pairs are sorted by expert, ties in
    pair order (token-major): pair (t, j) is row ``pair_row[t, j]``, whose token is
    ``row_token[row]``. Padding rows (R..P) name token 0, so a gather by them stays in bounds."""
    t, k = topk_ids.shape
    ids = np.asarray(topk_ids).reshape(-1).astype(np.int64)
    offsets = np.zeros(num_experts + 1, dtype=np.int32)
    pair_row = np.empty(t * k, dtype=np.int32)
    row_token = np.empty(t * k, dtype=np.int32)
    _align_kernel(ids, num_experts, max(k, 1), offsets, pair_row, row_token)
    return offsets, pair_row.reshape(t, k), row_token


def gather_rows(src, row_token):
    """``src[row_token]``: [P, ...] rows of ``src`` [T, ...] (any dtype), C-contiguous."""
    return np.ascontiguousarray(src[row_token])


def _row_elements(x, *_):
    return x.size


@cpu_kernel(CPU_PARALLEL_MIN_ELEMENTS, _row_elements)
def _static_rows_kernel(x, row_inv, out):
    """out[r] = encode(float32(x[r]) * row_inv[r]): ``quant.quantize_static``'s element loop, with the
    reciprocal of the row's expert."""
    for r in prange(x.shape[0]):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        _encode_times(x[r], row_inv[r], out[r])


def quantize_rows_static(x, offsets, input_scales):
    """(codes uint8 [P, K], per-row scale float32 [P]) of x [P, K] (float32, float16 or bfloat16):
    expert e's rows by ``input_scales[e]`` exactly as ``vt.quantize_fp8(rows, input_scales[e])``
    quantizes them (static per-tensor: a multiply by the float32 reciprocal). Padding rows get code
    0 and scale 1."""
    p = x.shape[0]
    offs = np.asarray(offsets, dtype=np.int64)
    routed = int(offs[-1])
    counts = np.diff(offs)
    scales_e = np.asarray(input_scales, dtype=np.float32).reshape(-1)
    # float32(1) / float32(scale), formed once per expert, as quantize_static forms it (DESIGN.md)
    inv = np.float32(1.0) / scales_e
    codes = np.zeros(x.shape, dtype=np.uint8)
    scales = np.ones(p, dtype=np.float32)
    scales[:routed] = np.repeat(scales_e, counts)
    if routed:
        xin = _kernel_input(x[:routed])
        _static_rows_kernel(xin, np.repeat(inv, counts), codes[:routed])
    return codes, scales


# -- the grouped GEMM ------------------------------------------------------------------------------


def _driver_work(macs, *_):
    """The work of a grouped driver: the multiply-adds of its items, passed in as its first argument."""
    return macs


@njit(**CPU_INLINE)
def _item_work(items, offsets, it):
    """Work item ``it``'s multiply-adds per K: its expert's routed rows times its weight rows."""
    e = items[it, 0]
    return (offsets[e + 1] - offsets[e]) * (items[it, 2] - items[it, 1])


@njit(**CPU_INLINE)
def _balanced_runs(items, offsets, parts):
    """Bounds [parts + 1] that cut the items into ``parts`` contiguous runs of near-equal work (an
    item's rows times its weight rows; an item goes to the run holding its midpoint). A driver's
    threads each take one run: Numba's prange over the items gave each thread an equal count of them,
    and items differ. The tiny Qwen3-MoE's gate_up (N = 320) is 256- and 64-row items, one thread took
    the 256s: two threads ran its 128-token layer's gate_up in 691 us where one took 789."""
    n = items.shape[0]
    total = 0
    for it in range(n):
        total += _item_work(items, offsets, it)
    runs = np.empty(parts + 1, dtype=np.int64)
    runs[0] = 0
    done = 0
    it = 0
    for part in range(1, parts):
        goal = total * part // parts
        while it < n:
            w = _item_work(items, offsets, it)
            if 2 * done + w > 2 * goal:
                break
            done += w
            it += 1
        runs[part] = it
    runs[parts] = n
    return runs


# The dense kernels a grouped driver calls: bound per CPU path by ``_with_globals`` (``_inner_kernels``
# names them). None here, so the names exist for readers and linters, and an unbound driver fails at once.
_rows_kernel = _tiles_kernel = _one_row_kernel = _lookup_kernel = None


def _with_globals(fn, suffix, names):
    """``fn`` with ``names`` among its globals and ``suffix`` on its name (Numba's disk cache keys a
    function by module, qualified name and bytecode, not by what its globals hold)."""
    namespace = dict(fn.__globals__)
    namespace.update(names)
    twin = types.FunctionType(fn.__code__, namespace, fn.__name__ + suffix, fn.__defaults__, fn.__closure__)
    twin.__qualname__ = fn.__qualname__ + suffix
    twin.__module__ = fn.__module__
    return twin


def _tensor_driver(macs, parts, x, b, items, offsets, scale_a, scale_b, bias, out):
    """Item (e, n0, n1): rows offsets[e]:offsets[e + 1] of out, columns n0:n1, by the dense small-M
    kernel of that many rows (``_rows_kernel``, or ``_one_row_kernel`` at one row) on the same rows
    of x = dec(a), the same weight rows, the same scale vectors. Each item's result goes through a
    C-contiguous tile: the dense kernels then run as the very specializations ``scaled_mm`` compiled
    (a strided view of out would compile each kernel a second time)."""
    runs = _balanced_runs(items, offsets, parts)
    for part in prange(parts):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        for it in range(runs[part], runs[part + 1]):
            e, n0, n1 = items[it, 0], items[it, 1], items[it, 2]
            lo = offsets[e]
            rows = offsets[e + 1] - lo
            sb = scale_b[e] if scale_b.shape[1] == 1 else scale_b[e, n0:n1]
            if rows > 1:
                sa = scale_a if scale_a.size == 1 else scale_a[lo : lo + rows]
                tile = np.empty((rows, n1 - n0), dtype=np.float32)
                if rows >= TILE_MIN_ROWS:
                    _tiles_kernel(x[lo : lo + rows], b[e, n0:n1], sa, sb, bias, tile)
                else:
                    _rows_kernel(x[lo : lo + rows], b[e, n0:n1], sa, sb, bias, tile)
                out[lo : lo + rows, n0:n1] = tile
            else:
                sa = scale_a if scale_a.size == 1 else scale_a[lo : lo + 1]
                tile = np.empty((1, n1 - n0), dtype=np.float32)
                _one_row_kernel(x[lo : lo + 1], b[e, n0:n1], sa, sb, bias, tile)
                out[lo : lo + 1, n0:n1] = tile


def _block_driver(macs, parts, x, b, items, offsets, sat, scale_b, bn, bk, bias, out):
    """Item (e, n0, n1, s): as ``_tensor_driver`` with ``block``'s kernels; ``sat`` holds each expert's
    activation scales transposed ([nkb, rows], what those kernels read) at offset offsets[e] * nkb,
    ``scale_b[s]`` the expert's float32 block scales."""
    nkb = scale_b.shape[2]
    runs = _balanced_runs(items, offsets, parts)
    for part in prange(parts):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        for it in range(runs[part], runs[part + 1]):
            e, n0, n1, s = items[it, 0], items[it, 1], items[it, 2], items[it, 3]
            lo = offsets[e]
            rows = offsets[e + 1] - lo
            sb = scale_b[s, n0 // bn : (n1 + bn - 1) // bn]
            if rows > 1:
                sat_e = sat[lo * nkb : (lo + rows) * nkb].reshape((nkb, rows))
                tile = np.empty((rows, n1 - n0), dtype=np.float32)
                if rows >= TILE_MIN_ROWS:
                    _tiles_kernel(x[lo : lo + rows], b[e, n0:n1], sat_e, sb, bn, bk, bias, tile)
                else:
                    _rows_kernel(x[lo : lo + rows], b[e, n0:n1], sat_e, sb, bn, bk, bias, tile)
                out[lo : lo + rows, n0:n1] = tile
            else:
                sat_e = sat[lo * nkb : (lo + 1) * nkb].reshape((nkb, 1))
                tile = np.empty((1, n1 - n0), dtype=np.float32)
                _one_row_kernel(x[lo : lo + 1], b[e, n0:n1], sat_e, sb, bn, bk, bias, tile)
                out[lo : lo + 1, n0:n1] = tile


def _mx_driver(macs, parts, x, b, items, offsets, scale_b, bn, bk, edges, windows, bias, out, bad):
    """Item (e, n0, n1): as ``_tensor_driver`` with ``mx``'s kernels on x = dec(a) * 2^(sa - 127);
    ``windows[e]`` the expert's weight-byte window, ``bad[e]`` set when a weight byte falls outside
    it (the caller then runs that expert's dense call)."""
    runs = _balanced_runs(items, offsets, parts)
    for part in prange(parts):
        vector_width_hint()  # the path's vector width (paths.py), in the threads' function
        for it in range(runs[part], runs[part + 1]):
            e, n0, n1 = items[it, 0], items[it, 1], items[it, 2]
            lo = offsets[e]
            rows = offsets[e + 1] - lo
            sb = scale_b[e, n0 // bn : (n1 + bn - 1) // bn]
            w_lo, w_hi = windows[e, 0], windows[e, 1]
            if rows > 1:
                tile = np.empty((rows, n1 - n0), dtype=np.float32)
                xs, bs, flag = x[lo : lo + rows], b[e, n0:n1], bad[e : e + 1]
                if rows >= TILE_MIN_ROWS:
                    _tiles_kernel(xs, bs, sb, bn, bk, edges, w_lo, w_hi, bias, tile, flag)
                else:
                    _rows_kernel(xs, bs, sb, bn, bk, edges, w_lo, w_hi, bias, tile, flag)
                out[lo : lo + rows, n0:n1] = tile
            else:
                tile = np.empty((1, n1 - n0), dtype=np.float32)
                _one_row_kernel(x[lo : lo + 1], b[e, n0:n1], sb, bn, bk, edges, w_lo, w_hi, bias, tile, bad[e : e + 1])
                out[lo : lo + 1, n0:n1] = tile


def _mx_one_row(x, b, sb, bn, bk, edges, lo, hi, bias, out, bad):
    """One row on a byte-lookup path: ``mx._fast``'s choice, the lookup kernel for 32-wide blocks."""
    if bk == MX_GROUP:
        _lookup_kernel(x, b, sb, bn, lo, hi, bias, out, bad)
    else:
        _rows_kernel(x, b, sb, bn, bk, edges, lo, hi, bias, out, bad)


def _inner_kernels(kind, path):
    """The dense kernels (serial twins) a grouped driver of ``kind`` calls on ``path``: the ones the
    dense entry point would run for that row count (``gemm.scaled_mm``, ``block.block_scaled_mm``,
    ``mx._fast``)."""
    name = path.name

    def tiles(module):
        """The kernel of TILE_MIN_ROWS rows and more: the register tiles where the path has them."""
        return (module.tiled_kernel if path.register_tiles else module.small_m_kernel).variant(name, False)

    if kind == "tensor":
        one = gemm.gemv_lookup_kernel if path.byte_lookup_decode else gemm.gemv_kernel
        rows = {"_rows_kernel": gemm.small_m_kernel.variant(name, False), "_tiles_kernel": tiles(gemm)}
        return dict(rows, _one_row_kernel=one.variant(name, False))
    if kind == "block":
        rows = {"_rows_kernel": block.small_m_kernel.variant(name, False), "_tiles_kernel": tiles(block)}
        return dict(rows, _one_row_kernel=block.gemv_kernel.variant(name, False))
    rows = mx.small_m_kernel.variant(name, False)
    both = {"_rows_kernel": rows, "_tiles_kernel": tiles(mx)}
    if "dot4_e4m3_mx" not in path.kernel_globals:  # mx._lookup_path: no lookup kernel on this path
        return dict(both, _one_row_kernel=rows)
    one = _with_globals(
        _mx_one_row, "_" + name, {"_lookup_kernel": mx.gemv_lookup_kernel.variant(name, False), "_rows_kernel": rows}
    )
    return dict(both, _one_row_kernel=njit(**CPU_SERIAL_KERNEL)(one))


_DRIVERS = {"tensor": _tensor_driver, "block": _block_driver, "mx": _mx_driver}
_compiled = {}


def _driver(kind):
    """The grouped driver of ``kind`` for the active path: a ``CpuKernel`` (its parallel twin above
    CPU_PARALLEL_MIN_MACS of the items' work, its serial twin below), built once per path, under
    ``paths.BUILD_LOCK`` whichever threads ask first (a second driver would compile again)."""
    path = paths.active()
    key = (kind, path.name)
    found = _compiled.get(key)
    if found is not None:
        return found
    with paths.BUILD_LOCK:
        found = _compiled.get(key)
        if found is None:
            fn = _with_globals(_DRIVERS[kind], "", _inner_kernels(kind, path))
            found = _compiled[key] = CpuKernel(fn, {}, CPU_PARALLEL_MIN_MACS, _driver_work)
    return found


def _run_driver(kind, macs, *args):
    """Run the grouped driver of ``kind`` on the threads its work gets (``CpuKernel.threads_for``),
    its items cut into that many runs of equal work (``_balanced_runs``)."""
    driver = _driver(kind)
    threads = driver.threads_for(macs)
    driver.call_with(threads, macs, threads, *args)


@njit(**CPU_SERIAL_KERNEL)
def _items_kernel(experts, n, tile, items):
    i = 0
    for n0 in range(0, n, tile):
        for slot in range(experts.size):
            items[i, 0] = experts[slot]
            items[i, 1] = n0
            items[i, 2] = min(n0 + tile, n)
            items[i, 3] = slot
            i += 1


def _items(experts, n, tile):
    """Work items [(e, n0, n1, slot)] for ``experts`` over N in tiles of ``tile`` rows, tile-major:
    each thread takes a contiguous run of items (``_balanced_runs``), so a thread's experts differ
    where an expert-major order would hand one thread a whole expert's rows. ``slot`` is the expert's index in ``experts``. Filled by
    one compiled loop: numpy's tile / repeat / minimum took 14 us a call, twice in each MoE layer."""
    items = np.empty((-(-n // tile) * experts.size, 4), dtype=np.int64)
    _items_kernel(np.ascontiguousarray(experts, dtype=np.int64), n, tile, items)
    return items


def _tile_rows(bn):
    """_TILE_ROWS rounded up to a multiple of the 4-row register block and of the block height bn,
    so every weight row keeps its dense register block and its scale row-block."""
    step = math.lcm(gemm._SMALL_M_ROWS, bn)
    return step * max(1, -(-_TILE_ROWS // step))


def active_experts(offsets, num_experts, rows):
    """The GPU's grid map of the experts with rows (``vtnumba.cuda.experts.active_experts``); the CPU's
    work items skip empty experts by themselves, so it has none."""
    return None


def grouped_scaled_mm(a, scale_a, b, scale_b, offsets, out_dtype, block_size=None, active=None):
    """y [P, N]: rows offsets[e]:offsets[e + 1] of y are ``vt.scaled_mm`` of the same rows of ``a``
    (codes [P, K]) with expert e's weight ``b[e]`` (codes [E, N, K]); padding rows are 0.

    scale_a: float32 [1] (every row), [P] (per row), [P, ceil(K / bk)] float32 group scales or
    uint8 E8M0 group scales (with ``block_size``). scale_b: float32 [E] (per expert), [E, N]
    (per channel), or with ``block_size`` (bn, bk) the block scales [E, ceil(N / bn), ceil(K / bk)]
    (float32 or uint8 E8M0; (1, 32) with E8M0 on both sides is MXFP8). Bitwise the per-expert loop
    of ``vtnumba.cpu.scaled_mm`` / ``block_scaled_mm`` (module docstring)."""
    p, k = a.shape
    n = b.shape[1]
    offs = np.asarray(offsets, dtype=np.int64)
    routed_rows = int(offs[-1])
    out = np.empty((p, n), dtype=np.float32)
    out[routed_rows:] = 0.0  # padding rows belong to no expert
    counts = np.diff(offs)
    routed = np.flatnonzero(counts > 0)
    if routed.size and n:
        a = np.ascontiguousarray(a)
        b = np.ascontiguousarray(b)
        if block_size is None:
            _grouped_tensor(a, scale_a, b, scale_b, offs, counts, routed, out)
        elif np.dtype(scale_a.dtype) == np.uint8 and np.dtype(scale_b.dtype) == np.uint8:
            _grouped_mx(a, scale_a, b, scale_b, offs, counts, routed, block_size, out)
        else:
            _grouped_block(a, scale_a, b, scale_b, offs, counts, routed, block_size, out)
    return gemm.to_out_dtype(out, out_dtype)


def _split(routed, counts, choose, n, k):
    """(small, large): the routed experts whose dense call would take a small-M kernel, and the rest
    (``blas``), by the dense entry point's own ``choose_kernel``."""
    large = np.array([choose(int(counts[e]), n, k) == "blas" for e in routed], dtype=bool)
    return routed[~large], routed[large]


def _macs(experts, counts, n, k):
    return int(counts[experts].sum()) * n * k


def _grouped_tensor(a, scale_a, b, scale_b, offs, counts, routed, out):
    p, k = a.shape
    e_count, n, _ = b.shape
    sa = np.ascontiguousarray(np.asarray(scale_a, dtype=np.float32).reshape(-1))
    sb = np.ascontiguousarray(np.asarray(scale_b, dtype=np.float32).reshape(e_count, -1))  # [E, 1] or [E, N]
    small, large = _split(routed, counts, gemm.choose_kernel, n, k)
    for e in large:
        lo, hi = offs[e], offs[e + 1]
        out[lo:hi] = gemm.scaled_mm(a[lo:hi], b[e], sa if sa.size == 1 else sa[lo:hi], sb[e], np.float32, None, None)
    if small.size:
        x = np.empty((p, k), dtype=np.float32)
        gemm.decode_rows(a, x)
        items = _items(small, n, _tile_rows(1))[:, :3].copy()
        _run_driver("tensor", _macs(small, counts, n, k), x, b, items, offs, sa, sb, gemm.bias_vector(None), out)


def _grouped_block(a, scale_a, b, scale_b, offs, counts, routed, block_size, out):
    p, k = a.shape
    n = b.shape[1]
    bn, bk = (int(v) for v in block_size)
    routed_rows = int(offs[-1])
    # E8M0 bytes on one side decode exactly to float32 (cpu.block_scaled_mm does the same per call);
    # only the routed experts' weight scales are decoded
    sa = scale_a[:routed_rows]
    sa = mx.decode_e8m0_array(sa) if sa.dtype == np.uint8 else np.asarray(sa, dtype=np.float32)
    sb = scale_b[routed]
    sb = np.ascontiguousarray(mx.decode_e8m0_array(sb) if sb.dtype == np.uint8 else sb, dtype=np.float32)
    slot = np.empty(scale_b.shape[0], dtype=np.int64)
    slot[routed] = np.arange(routed.size)
    small, large = _split(routed, counts, block.choose_kernel, n, k)
    for e in large:
        lo, hi = offs[e], offs[e + 1]
        out[lo:hi] = block.block_scaled_mm(a[lo:hi], b[e], sa[lo:hi], sb[slot[e]], (bn, bk), np.float32, None, None)
    if small.size:
        nkb = sb.shape[2]
        # each routed expert's [rows, nkb] scales as [nkb, rows] at offset lo * nkb (dense: sat = sa.T)
        row_expert = np.repeat(np.arange(counts.size), counts)
        lo_of_row = offs[row_expert]
        within = np.arange(routed_rows) - lo_of_row
        where = (lo_of_row * nkb + within)[:, None] + np.arange(nkb)[None, :] * counts[row_expert][:, None]
        sat = np.empty(routed_rows * nkb, dtype=np.float32)
        sat[where] = sa
        x = np.empty((p, k), dtype=np.float32)
        gemm.decode_rows(a, x)
        items = _items(small, n, _tile_rows(bn))
        items[:, 3] = slot[items[:, 0]]
        _run_driver(
            "block", _macs(small, counts, n, k), x, b, items, offs, sat, sb, bn, bk, gemm.bias_vector(None), out
        )


def _grouped_mx(a, scale_a, b, scale_b, offs, counts, routed, block_size, out):
    p, k = a.shape
    e_count, n, _ = b.shape
    bn, bk = (int(v) for v in block_size)
    routed_rows = int(offs[-1])
    sa = np.ascontiguousarray(scale_a[:routed_rows], dtype=np.uint8)
    sb = np.ascontiguousarray(scale_b, dtype=np.uint8)
    small, large = _split(routed, counts, mx.choose_kernel, n, k)
    # each expert's window of weight bytes, from the bytes of its own rows (mx._window, per expert)
    starts = offs[routed]
    a_min = np.minimum.reduceat(sa.min(axis=1), starts).astype(np.int64)
    a_max = np.maximum.reduceat(sa.max(axis=1), starts).astype(np.int64)
    windows = np.zeros((e_count, 2), dtype=np.int64)
    windows[routed, 0] = np.maximum(mx._BYTE_MIN, mx._PAIR_MIN - a_min)
    windows[routed, 1] = np.minimum(mx._BYTE_MAX, mx._PAIR_MAX - a_max)
    shortcut = np.zeros(e_count, dtype=bool)
    shortcut[routed] = (a_min >= mx._BYTE_MIN) & (a_max <= mx._BYTE_MAX)
    shortcut &= windows[:, 0] <= windows[:, 1]
    dense = list(large) + [e for e in small if not shortcut[e]]
    small = small[shortcut[small]]
    if small.size:
        x = np.empty((p, k), dtype=np.float32)
        mx.decode_scaled_rows(a, np.ascontiguousarray(scale_a, dtype=np.uint8), bk, x)
        items = _items(small, n, _tile_rows(bn))[:, :3].copy()
        bad = np.zeros(e_count, dtype=np.uint8)
        _run_driver(
            "mx",
            _macs(small, counts, n, k),
            x,
            b,
            items,
            offs,
            sb,
            bn,
            bk,
            mx._chunk_bounds(k, bk),
            windows,
            gemm.bias_vector(None),
            out,
            bad,
        )
        dense += [e for e in small if bad[e]]  # a weight byte outside the window: the dense call's fallback
    for e in dense:
        lo, hi = offs[e], offs[e + 1]
        out[lo:hi] = mx.mx_scaled_mm(a[lo:hi], b[e], sa[lo:hi], sb[e], (bn, bk), np.float32, None)


# -- activation and combine ------------------------------------------------------------------------


def silu_mul(h, offsets):
    """act [P, I] float32 of the gate_up output h [P, 2I] (gate columns first, then up, as
    transformers' ``gate_up_proj`` stores them): ``g / (1 + exp(-g)) * u`` in float32, vLLM's
    ``silu_and_mul`` (csrc/activation_kernels.cu, ``silu_kernel`` then the multiply). Padding rows
    (offsets[E]..P) are 0, so a per-tensor amax over all P rows is the amax of the routed ones."""
    half = h.shape[1] // 2
    routed = int(offsets[-1])
    g = h[:routed, :half]
    u = h[:routed, half:]
    if g.dtype != np.float32:
        g, u = g.astype(np.float32), u.astype(np.float32)
    out = np.zeros((h.shape[0], half), dtype=np.float32)
    # the formula's ufuncs in its order, each into the output rows: the same bits as the expression,
    # without its four temporaries (128 routed rows x 768: 207 -> 131 us; 1024 x 160: 907 -> 283)
    act = out[:routed]
    np.negative(g, out=act)
    with np.errstate(over="ignore"):
        np.exp(act, out=act)
    np.add(np.float32(1.0), act, out=act)
    np.divide(g, act, out=act)
    np.multiply(act, u, out=act)
    return out


def _combine_elements(y, pair_row, *_):
    return pair_row.size * y.shape[1]


@cpu_kernel(CPU_PARALLEL_MIN_ELEMENTS, _combine_elements)
def _combine_kernel(y, pair_row, w, out):
    """out[t] = ((0 + w[t, 0] * y[r0]) + w[t, 1] * y[r1]) + ...: the reference's float32 products and
    sums in slot order (no fastmath: no FMA, no reassociation, so it is bitwise numpy's)."""
    for t in prange(pair_row.shape[0]):
        dst = out[t]
        for j in range(pair_row.shape[1]):
            r = pair_row[t, j]
            if r >= 0:
                wj = w[t, j]
                src = y[r]
                for i in range(dst.size):
                    dst[i] = dst[i] + wj * src[i]


def moe_combine(y, pair_row, topk_weights, out_dtype):
    """out [T, H] = sum over j of ``topk_weights[t, j] * y[pair_row[t, j]]`` in float32, j in
    order, skipped pairs (row -1) adding nothing; rounded once to ``out_dtype``."""
    t, _ = pair_row.shape
    w = np.ascontiguousarray(topk_weights, dtype=np.float32)
    y32 = np.ascontiguousarray(y, dtype=np.float32)
    out = np.zeros((t, y.shape[1]), dtype=np.float32)
    _combine_kernel(y32, np.ascontiguousarray(pair_row, dtype=np.int32), w, out)
    return out.astype(out_dtype) if np.dtype(out_dtype) != np.float32 else out
