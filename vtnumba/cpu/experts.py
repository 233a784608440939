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

The CPU's functions are the reference the GPU is compared with: ``grouped_scaled_mm`` is the
per-expert ``vt.scaled_mm`` loop made one call, bitwise (the same kernels on the same rows).

Layout every step shares: P = T * k pair slots. ``offsets`` int32 [E + 1]: rows
offsets[e]:offsets[e + 1] of the sorted activation are expert e's; R = offsets[E] <= P rows are
routed (pairs naming an expert outside [0, E) are skipped), rows R..P are padding whose values no
step reads.
"""

import numpy as np

__all__ = ["moe_align", "gather_rows", "quantize_rows_static", "grouped_scaled_mm", "silu_mul", "moe_combine"]


def moe_align(topk_ids, num_experts):
    """(offsets int32 [E + 1], pair_row int32 [T, k], row_token int32 [P]) for ``topk_ids`` [T, k].

    A pair whose id is outside [0, E) (vLLM's -1 padding, transformers' sentinel E, an expert another
    rank holds) gets no row: ``pair_row`` is -1 there. The routed pairs are sorted by expert, ties in
    pair order (token-major): pair (t, j) is row ``pair_row[t, j]``, whose token is
    ``row_token[row]``. Padding rows (R..P) name token 0, so a gather by them stays in bounds."""
    t, k = topk_ids.shape
    ids = np.asarray(topk_ids).reshape(-1).astype(np.int64)
    valid = (ids >= 0) & (ids < num_experts)
    counts = np.bincount(ids[valid], minlength=num_experts)
    offsets = np.zeros(num_experts + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    order = np.argsort(np.where(valid, ids, num_experts), kind="stable")
    routed = int(offsets[-1])
    pair_row = np.full(t * k, -1, dtype=np.int32)
    pair_row[order[:routed]] = np.arange(routed, dtype=np.int32)
    row_token = np.zeros(t * k, dtype=np.int32)
    row_token[:routed] = order[:routed] // k
    return offsets, pair_row.reshape(t, k), row_token


def gather_rows(src, row_token):
    """``src[row_token]``: [P, ...] rows of ``src`` [T, ...] (any dtype), C-contiguous."""
    return np.ascontiguousarray(src[row_token])


def quantize_rows_static(x, offsets, input_scales):
    """(codes uint8 [P, K], per-row scale float32 [P]) of x [P, K] (float32, float16 or bfloat16):
    expert e's rows by ``input_scales[e]`` exactly as ``vt.quantize_fp8(rows, input_scales[e])``
    quantizes them (static per-tensor: a multiply by the float32 reciprocal). Padding rows get code
    0 and scale 1."""
    from . import quantize_static

    p = x.shape[0]
    codes = np.zeros(x.shape, dtype=np.uint8)
    scales = np.ones(p, dtype=np.float32)
    for e in range(len(offsets) - 1):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi > lo:
            codes[lo:hi] = quantize_static(x[lo:hi], input_scales[e])
            scales[lo:hi] = input_scales[e]
    return codes, scales


def grouped_scaled_mm(a, scale_a, b, scale_b, offsets, out_dtype, block_size=None):
    """y [P, N]: rows offsets[e]:offsets[e + 1] of y are ``vt.scaled_mm`` of the same rows of ``a``
    (codes [P, K]) with expert e's weight ``b[e]`` (codes [E, N, K]); padding rows are 0.

    scale_a: float32 [1] (every row), [P] (per row), [P, ceil(K / bk)] float32 group scales or
    uint8 E8M0 group scales (with ``block_size``). scale_b: float32 [E] (per expert), [E, N]
    (per channel), or with ``block_size`` (bn, bk) the block scales [E, ceil(N / bn), ceil(K / bk)]
    (float32 or uint8 E8M0; (1, 32) with E8M0 on both sides is MXFP8)."""
    from . import block_scaled_mm, scaled_mm

    p, _ = a.shape
    e_count, n, _ = b.shape
    y = np.zeros((p, n), dtype=out_dtype)
    per_row = scale_a.ndim >= 1 and scale_a.shape[0] == p and not (p == 1 and scale_a.ndim == 1)
    for e in range(e_count):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        sa = scale_a[lo:hi] if per_row else scale_a
        if block_size is None:
            sb = scale_b[e] if scale_b.ndim == 2 else scale_b[e:e + 1]
            y[lo:hi] = scaled_mm(a[lo:hi], b[e], sa, sb, out_dtype, None, None)
        else:
            y[lo:hi] = block_scaled_mm(a[lo:hi], b[e], sa, scale_b[e], block_size, out_dtype, None, None)
    return y


def silu_mul(h, offsets):
    """act [P, I] float32 of the gate_up output h [P, 2I] (gate columns first, then up, as
    transformers' ``gate_up_proj`` stores them): ``g / (1 + exp(-g)) * u`` in float32, vLLM's
    ``silu_and_mul`` (csrc/activation_kernels.cu, ``silu_kernel`` then the multiply). Padding rows
    (offsets[E]..P) are 0, so a per-tensor amax over all P rows is the amax of the routed ones."""
    half = h.shape[1] // 2
    g = h[:, :half].astype(np.float32)
    u = h[:, half:].astype(np.float32)
    with np.errstate(over="ignore"):
        act = g / (np.float32(1.0) + np.exp(-g)) * u
    act[int(offsets[-1]):] = 0
    return np.ascontiguousarray(act, dtype=np.float32)


def moe_combine(y, pair_row, topk_weights, out_dtype):
    """out [T, H] = sum over j of ``topk_weights[t, j] * y[pair_row[t, j]]`` in float32, j in
    order, skipped pairs (row -1) adding nothing; rounded once to ``out_dtype``."""
    t, k = pair_row.shape
    w = np.asarray(topk_weights, dtype=np.float32)
    out = np.zeros((t, y.shape[1]), dtype=np.float32)
    y32 = y.astype(np.float32, copy=False)
    for j in range(k):
        rows = pair_row[:, j]
        routed = rows >= 0
        out[routed] += w[routed, j][:, None] * y32[rows[routed]]
    return out.astype(out_dtype) if np.dtype(out_dtype) != np.float32 else out
