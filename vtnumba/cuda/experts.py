"""The GPU backend of the mixture-of-experts steps (``vtnumba.seam.experts`` calls them): cupy in,
cupy out (numpy under the CUDA simulator), the signatures of ``vtnumba/cpu/experts.py``, whose
results are the reference.

- ``moe_align``, ``gather_rows``, ``quantize_rows_static``, ``silu_mul``, ``silu_mul_quantize``,
  ``moe_combine``: one launch each (dynamic per-tensor ``silu_mul_quantize``: two), the kernels of
  ``kernels/moe.py``. Align gives the CPU's order exactly; the rest give the CPU's bytes (the SiLU's
  ``expf`` aside, see kernels/moe.py).
- the grouped GEMM between them is ``cuda/grouped.py``'s ``grouped_scaled_mm`` (its kernels, and
  how one is chosen, are there).

Nothing here synchronizes. Host scales (a static ``input_scale``) are
uploaded once per device and value, so graph capture needs a warm-up call first, as ``scaled_mm``.

Binding (``recording``, for ``vtnumba.cuda.bound.bind_moe``): every step makes its device arrays with
``steps.new`` and launches with ``steps.run`` (``cuda/steps.py``), which a recording thread keeps
instead of enqueueing.
"""

import numpy as np

from .. import _config
from . import quantize, steps
from .grouped import active_experts, grouped_kernel_for, grouped_scaled_mm  # the backend's grouped GEMM, as the CPU's
from .ptx.target import SIMULATOR
from .steps import Recording, Unbindable, recording

_TABLES = {}  # (device ordinal, bytes) -> float32 device vector: static input scales, uploaded once
_MAX_TABLES = 1024


def _scale_table(values):
    """Per-expert float32 scales as a device vector: a device array as it is, host values uploaded
    once per device and value (from cupy's own pool, as runtime/device.py's scalars), so that a
    call never transfers once warm."""
    if not isinstance(values, (np.ndarray, list, tuple)) and not SIMULATOR:
        return steps.array(values).astype(np.float32, copy=False).reshape(-1)
    host = np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1))
    if SIMULATOR:
        return host
    dev = steps.device.current()
    key = (dev.ordinal, host.tobytes())
    table = _TABLES.get(key)
    if table is None:
        if len(_TABLES) >= _MAX_TABLES:
            _TABLES.clear()
        xp = steps.device.xp
        with xp.cuda.Device(dev.ordinal), xp.cuda.using_allocator(xp.get_default_memory_pool().malloc):
            table = _TABLES[key] = xp.asarray(host)
    return table


# -- routing -----------------------------------------------------------------------------------------


def moe_align(topk_ids, num_experts):
    """(offsets int32 [E + 1], pair_row int32 [T, k], row_token int32 [P]) as the CPU's, in one
    launch (kernels/moe.py: the CPU's stable order, ids outside [0, E) skipped)."""
    moe = steps.load()
    ids = steps.array(topk_ids)
    t, k = (int(d) for d in ids.shape)
    e = int(num_experts)
    if e > moe.MAX_ALIGN_EXPERTS:
        raise ValueError(
            f"num_experts must be <= {moe.MAX_ALIGN_EXPERTS} for the GPU align (its counters live in "
            f"shared memory), got {e}"
        )
    flat = ids.reshape(-1)
    if np.dtype(flat.dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
        flat = flat.astype(np.int64)  # every other integer type widens exactly
    offsets = steps.new(e + 1, np.int32)
    pair_row = steps.new((t, k), np.int32)
    row_token = steps.new(t * k, np.int32)
    blocks = moe.align_blocks(flat.shape[0])
    block_counts = steps.device.current().placeholder("i32") if blocks == 1 else steps.new(blocks * e, np.int32)
    for *launch, shared in moe.align_launches(flat, offsets, pair_row.reshape(-1), row_token, block_counts, e, k):
        steps.run(launch, shared)
    return offsets, pair_row, row_token


def gather_rows(src, row_token):
    """``src[row_token]``: [P, ...] rows of ``src`` [T, ...] (any dtype), C-contiguous."""
    moe = steps.load()
    src = steps.array(src)
    p = int(row_token.shape[0])
    out = steps.new((p,) + tuple(src.shape[1:]), src.dtype)
    row_bytes = src.itemsize * int(np.prod(src.shape[1:], dtype=np.int64))
    if p == 0 or row_bytes == 0:
        return out
    unit = next(
        u for u in (16, 4, 2, 1) if row_bytes % u == 0 and (u < 16 or (steps.aligned(src) and steps.aligned(out)))
    )
    view = moe.UNIT_DTYPES[unit]
    steps.run(
        moe.gather_launch(
            src.reshape(-1).view(np.uint8).view(view),
            out.reshape(-1).view(np.uint8).view(view),
            steps.array(row_token),
            unit,
            row_bytes // unit,
        )
    )
    return out


def quantize_tokens(x, experts):
    """(codes uint8 [T, K], scale) of token rows x [T, K] by ``experts``' activation scheme (dynamic,
    per-token or per-group, not static), as ``vt.quantize_fp8`` gives them for that scheme: its very
    launches (``quantize.quantize_launches``), their arrays made as every step's (``steps.new``). The
    scale: dynamic [1], per-token [T], per-group [T, ceil(K / g)] row-major (float32, or E8M0 bytes
    for MXFP8)."""
    steps.load()
    ex = experts
    scheme = str(ex.activation_scheme)
    mx = ex.activation_scale_format == "e8m0"
    launches, codes, scale = quantize.quantize_launches(
        steps.array(x),
        scheme,
        None,
        None if ex.block_size is None else int(ex.block_size[1]),
        bool(ex.scale_ue8m0),
        steps.new,
        (ex.activation_scale_rounding or "rceil") if mx else None,
        column_major_scales=False,
    )
    for launch in launches:
        steps.run(launch)
    return codes, scale


def quantize_rows_static(x, offsets, input_scales):
    """(codes uint8 [P, K], scale float32 [P]): expert e's rows by ``input_scales[e]`` as
    ``vt.quantize_fp8(rows, input_scales[e])``; padding rows code 0, scale 1."""
    moe = steps.load()
    x = steps.array(x)
    p, k = (int(d) for d in x.shape)
    codes = steps.new((p, k), np.uint8)
    scales = steps.new(p, np.float32)
    if p == 0 or k == 0:
        scales[...] = 1
        return codes, scales
    kind = quantize._KINDS[np.dtype(x.dtype)]
    table = _scale_table(input_scales)
    steps.run(
        moe.static_rows_launch(
            quantize._flat(x),
            kind,
            quantize.encoder_in_use(),
            quantize._flat(codes),
            scales,
            steps.array(offsets),
            table,
            int(table.shape[0]),
            p,
            k,
            steps.aligned(x),
        )
    )
    return codes, scales


def _silu(
    h, offsets, mode, codes, scales, scale_bytes, partials, table, group_size, blocks, act=None, ue8m0=False, e8m0=None
):
    moe = steps.moe
    dev = steps.device.current()
    f32 = dev.placeholder("f32")
    half = int(h.shape[1]) // 2
    outputs = [a for a in (act, codes) if a is not None]
    grouped = mode == moe.SiluMode.PER_GROUP
    width = moe.silu_width(
        half, group_size if grouped else moe.WIDE, steps.aligned(h) and all(steps.aligned(a) for a in outputs)
    )
    steps.run(
        moe.silu_launch(
            mode,
            quantize.encoder_in_use(),
            h,
            dev.placeholder("f32_2d") if act is None else act,
            dev.placeholder("u8_2d") if codes is None else codes,
            f32 if scales is None else scales.reshape(-1),
            dev.placeholder("u8_2d").reshape(-1) if scale_bytes is None else scale_bytes.reshape(-1),
            f32 if partials is None else partials,
            offsets,
            f32 if table is None else table,
            int(offsets.shape[0]) - 1,
            group_size,
            blocks,
            ue8m0,
            e8m0,
            width,
        )
    )


def _hidden(h):
    h = steps.array(h)
    return h if np.dtype(h.dtype) == np.float32 else h.astype(np.float32)


def silu_mul(h, offsets):
    """act [P, I] float32 = ``g / (1 + exp(-g)) * u`` of h [P, 2I]; padding rows 0."""
    moe = steps.load()
    h = _hidden(h)
    p, half = int(h.shape[0]), int(h.shape[1]) // 2
    act = steps.new((p, half), np.float32)
    if p and half:
        _silu(
            h,
            steps.array(offsets),
            moe.SiluMode.PLAIN,
            None,
            None,
            None,
            None,
            None,
            1,
            moe.silu_blocks(p, moe.SiluMode.PLAIN, 1),
            act=act,
        )
    return act


def silu_mul_quantize(h, offsets, down_experts):
    """(codes [P, I], scale) = the down experts' activation quantization of ``silu_mul(h, offsets)``,
    in one launch (dynamic per-tensor: two), the scale as the seam's ``_act_quantize`` returns it:
    static [P], dynamic [1], per-token [P, 1], per-group [P, ceil(I / g)] row-major (float32, or
    E8M0 bytes for MXFP8)."""
    moe = steps.load()
    dn = down_experts
    h = _hidden(h)
    offsets = steps.array(offsets)
    p, half = int(h.shape[0]), int(h.shape[1]) // 2
    codes = steps.new((p, half), np.uint8)
    scheme = str(dn.activation_scheme)
    mode = moe.SiluMode
    blocks = moe.silu_blocks(p, mode.PER_TOKEN, 1)
    if scheme == "static":
        scales = steps.new(p, np.float32)
        if p and half:
            _silu(h, offsets, mode.STATIC, codes, scales, None, None, _scale_table(dn.input_scale), 1, blocks)
        elif p:
            scales[...] = 1
        return codes, scales
    if scheme == "dynamic":
        parts = moe.silu_blocks(p, mode.DYNAMIC, steps.device.current().sm_count)
        buf = steps.new(1 + parts, np.float32)  # the scale and, after it, the amax partials
        if p and half:
            _silu(h, offsets, mode.DYNAMIC_AMAX, None, None, None, buf[1:], None, 1, parts)
            _silu(h, offsets, mode.DYNAMIC, codes, buf[:1], None, buf[1:], None, 1, parts)
        else:
            buf[...] = np.float32(np.float32(1.0) / (np.float32(448.0) * np.float32(512.0)))
        return codes, buf[:1]
    if scheme == "per_token":
        scales = steps.new((p, 1), np.float32)
        if p and half:
            _silu(h, offsets, mode.PER_TOKEN, codes, scales, None, None, None, 1, blocks)
        return codes, scales
    if scheme != "per_group":
        raise ValueError(
            f"down_experts.activation_scheme must be static, dynamic, per_token or per_group, got "
            f"{dn.activation_scheme!r}"
        )
    g = int(dn.block_size[1])
    groups = -(-half // g)
    if dn.activation_scale_format == "e8m0":
        scales = steps.new((p, groups), np.uint8)
        if p and half:
            _silu(
                h,
                offsets,
                mode.PER_GROUP,
                codes,
                None,
                scales,
                None,
                None,
                g,
                blocks,
                e8m0=dn.activation_scale_rounding or "rceil",
            )
        return codes, scales
    scales = steps.new((p, groups), np.float32)
    if p and half:
        _silu(h, offsets, mode.PER_GROUP, codes, scales, None, None, None, g, blocks, ue8m0=bool(dn.scale_ue8m0))
    return codes, scales


def _weights_flat(moe, topk_weights):
    """(the routing weights flat, their kernels/moe.py WeightKind): float32 values, or 16-bit bits."""
    w = steps.array(topk_weights)
    wdt = np.dtype(w.dtype)
    if wdt == np.float32:
        return w.reshape(-1), moe.WeightKind.FLOAT32
    kind = moe.WeightKind.FLOAT16 if wdt == np.float16 else moe.WeightKind.BFLOAT16
    return w.reshape(-1).view(np.uint16), kind


def moe_combine(y, pair_row, topk_weights, out_dtype):
    """out [T, H] = sum over j of ``topk_weights[t, j] * y[pair_row[t, j]]`` in float32, slot order,
    skipped pairs adding nothing, rounded once to ``out_dtype``: the CPU's bytes for the same y."""
    moe = steps.load()
    y = steps.array(y)
    if np.dtype(y.dtype) != np.float32:
        y = y.astype(np.float32)
    t, k = (int(d) for d in pair_row.shape)
    out = steps.new((t, int(y.shape[1])), out_dtype, output=True)
    if t == 0 or out.size == 0:
        return out
    w_flat, w_kind = _weights_flat(moe, topk_weights)
    out_kind = steps.epilogue.OUT_KIND[np.dtype(out_dtype)]
    steps.run(
        moe.combine_launch(
            y,
            steps.array(pair_row).reshape(-1),
            w_flat,
            w_kind,
            steps.epilogue.out_bits(out),
            out_kind,
            k,
            steps.aligned(y),
        )
    )
    return out


# -- the routed decode: two launches, no align -------------------------------------------------------
# At decode each routed (token, slot) pair is its own group (kernels/tc_gemv.py, "the routed GEMVs"):
# gate_up with x's quantization and SiLU-and-multiply fused in, down with act's quantization and the
# combine fused in. The aligned steps (align, active map, quantize, gather, gate_up, SiLU and
# quantize, down, combine) take every other call.

ROUTED_KERNEL = "routed_gemv"  # VT_DISABLE_KERNELS takes the routed decode out by this name
# Up to this many routed pairs (T k) a call is routed, by the activation scheme: each pair streams its
# expert's weight, so as tokens share experts the pairs read them again (from L2 at best) where the
# aligned grouped GEMV reads each routed expert once. From the H200 sweep (bench_moe.py table 3,
# 2026-12-02 12:57, Qwen3-30B-A3B top-8, the layer L2-hot, routed / aligned us): per-token T = 1
# 37.9 / 56.7, T = 2 75.8 / 80.0, T = 4 137.0 / 110.5; 128 x 128 blocks T = 2 59.7 / 86.9, T = 4
# 102.4 / 124.0, T = 8 186.9 / 189.1. Static: per-token's (not measured).
ROUTED_MAX_PAIRS = {"static": 16, "per_token": 16, "per_group": 32}
# ... and on the swapped wgmma pass (sm_90, ``routed_wgmma_reason``), whose pairs cost a third to a
# half of the GEMV's: routed up to T = 8 at top-8 for every scheme. The sweep of 2026-12-03 13:49
# (benchmarks/RESULTS.md; the layer L2-hot, routed / aligned us): per-token T = 2 38.3 / 79.8, T = 4
# 64.6 / 111.0, T = 8 108.6 / 161.3; 128 x 128 blocks T = 4 68.1 / 123.9, T = 8 106.3 / 188.9. Past
# T = 8 the routed path was not timed.
ROUTED_WGMMA_MAX_PAIRS = 64
# The simulator runs the routed decode only when a test asks (its tensor-core emulation is slow).
SIMULATE_ROUTED = False
_ROUTED_SCHEMES = ("static", "per_token", "per_group")


def _routed_format_reason(ex, name):
    scheme = str(ex.activation_scheme)
    if scheme not in _ROUTED_SCHEMES:
        return (
            f"{name}'s {scheme} activations: the routed decode quantizes static, per-token or 1 x 128 "
            "group activations (a dynamic per-tensor scale of the hidden rows is one amax over every pair)"
        )
    if ex.activation_scale_format == "e8m0" or ex.scale_ue8m0:
        return f"{name}'s E8M0 / UE8M0 scales: the routed decode takes float32 scales"
    if ex.block_size is not None and tuple(ex.block_size) != (128, 128):
        return f"{name}'s {tuple(ex.block_size)} blocks: the routed decode takes 128 x 128 blocks"
    if np.dtype(ex.weight_scale.dtype) != np.float32:
        return f"{name}'s {np.dtype(ex.weight_scale.dtype)} weight scales: the routed decode takes float32"
    return None


def routed_reason(x, gate_up, down, topk_ids):
    """Why a ``moe_fp8`` call cannot take the routed decode (None when it can): the tensor-core GEMV on
    this device, both experts' formats (``_routed_format_reason``), at most ``routed_max_pairs`` pairs
    for the scheme and pass, 16-multiples of H and I (128-multiples for blocks), int32 / int64
    ids, and rows the fused GEMV stages in shared memory."""
    from .kernels import tc_gemm, tc_gemv

    steps.load()
    if ROUTED_KERNEL in _config.disabled_kernels():
        return f"{ROUTED_KERNEL} is disabled by VT_DISABLE_KERNELS"
    dev = steps.device.current()
    why = tc_gemm.unavailable_reason(dev, SIMULATE_ROUTED)
    if why:
        return why
    why = _routed_format_reason(gate_up, "gate_up") or _routed_format_reason(down, "down")
    if why:
        return why
    t, k = (int(d) for d in topk_ids.shape)
    _, n2, h = gate_up.shape
    inter = n2 // 2
    scheme = str(gate_up.activation_scheme)
    if t * k > ROUTED_MAX_PAIRS[scheme]:  # (the wgmma pass's reason only read where it decides)
        limit = routed_max_pairs(scheme, h, inter, dev)
        if t * k > limit:
            return (
                f"{t * k} routed pairs: the routed decode takes at most {limit} of {scheme} activations "
                "on this pass (ROUTED_MAX_PAIRS, ROUTED_WGMMA_MAX_PAIRS)"
            )
    unit = 128 if gate_up.block_size is not None or down.block_size is not None else 16
    if h % unit or inter % unit:
        return f"the routed decode needs H and I to be multiples of {unit}, got H = {h}, I = {inter}"
    if np.dtype(topk_ids.dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
        return f"the routed decode reads int32 or int64 ids, got {np.dtype(topk_ids.dtype)}"
    if tc_gemv.fused_rows(max(h, inter), gate_up.block_size is not None, True, False) == 0:
        return f"a row of {max(h, inter)} does not fit the fused GEMV's shared memory"
    if not SIMULATOR:
        for arr, name in ((x, "x"), (gate_up.data, "gate_up"), (down.data, "down"), (topk_ids, "topk_ids")):
            if not arr.flags.c_contiguous or arr.data.ptr % 16:
                return f"the routed decode reads {name} 16 bytes at a time: it must be C-contiguous and 16-byte aligned"
    return None


ROUTED_WGMMA_KERNEL = "routed_wgmma"  # VT_DISABLE_KERNELS takes the swapped wgmma pass out by this name


def routed_max_pairs(scheme, h, inter, dev=None):
    """The most routed pairs (T k) a call of ``scheme`` activations at H = h, I = inter takes the routed
    decode for: the wgmma pass's ROUTED_WGMMA_MAX_PAIRS where it runs, else ROUTED_MAX_PAIRS."""
    if routed_wgmma_reason(h, inter, dev) is None:
        return ROUTED_WGMMA_MAX_PAIRS
    return ROUTED_MAX_PAIRS[scheme]


def routed_wgmma_reason(h, inter, dev=None):
    """Why the routed decode's launches run the tensor-core GEMV's pass rather than the swapped wgmma
    pass (kernels/sm90_wgmma_gemv.py; None: the wgmma pass). The wgmma pass reads the e4m3 codes
    natively on Hopper (the GEMV's mma.sync converts each to f16 there) and holds the tensor-core
    bound, not strict G3: it runs where the lever VT_DENSE_CUBLASLT_FP8 lets cuBLASLt run, on
    sm_90, for rows whose stages fit its shared memory."""
    from .kernels import tc_gemm, tc_gemv
    from .ptx import sm90_wgmma

    steps.load()
    dev = dev or steps.device.current()
    if ROUTED_WGMMA_KERNEL in _config.disabled_kernels():
        return f"{ROUTED_WGMMA_KERNEL} is disabled by VT_DISABLE_KERNELS"
    if not sm90_wgmma.available(dev.cc):
        return f"the swapped wgmma pass needs sm_90 (wgmma), this device is sm_{dev.cc[0]}{dev.cc[1]}"
    if not _config.dense_cublaslt_fp8_enabled():
        return (
            "it holds the tensor-core bound, not strict G3: turned off with cuBLASLt by the lever VT_DENSE_CUBLASLT_FP8"
        )
    for stage, k in (("gate_up", h), ("down", inter)):
        if tc_gemv.routed_shared_bytes(tc_gemv.routed_config(stage, False, True), k) > tc_gemm.F16_SHARED_LIMIT:
            return f"a row of {k} does not fit the swapped wgmma pass's shared memory"
    return None


def _routed_operands(ex):
    """(mode, qtable, q_step, scale_b, sb_step, block_scaled, b [E * N, K]) of experts ``ex`` for
    kernels/tc_gemv.py's routed_launch."""
    from .kernels import tc_gemv

    dev = steps.device.current()
    e, n, kdim = ex.shape
    scheme = str(ex.activation_scheme)
    if scheme == "static":
        mode, qtable, q_step = tc_gemv.MODE_STATIC, _scale_table(ex.input_scale), 1
    elif scheme == "per_token":
        mode, qtable, q_step = tc_gemv.MODE_PER_TOKEN, dev.scalar(0.0), 0  # 0: no upper bound on the scale
    else:
        mode, qtable, q_step = tc_gemv.MODE_PER_GROUP, dev.placeholder("f32"), 0
    ws = steps.array(ex.weight_scale)
    block_scaled = ex.block_size is not None
    if block_scaled:
        sb, sb_step = ws.reshape(e * ws.shape[1], ws.shape[2]), 0
    elif ws.ndim == 2:
        sb, sb_step = ws.reshape(-1), 1
    else:
        sb, sb_step = ws.reshape(-1), 0
    return mode, qtable, q_step, sb, sb_step, block_scaled, steps.array(ex.data).reshape(e * n, kdim)


def _routed_run(stage, x_bits, x_dtype, ex, out, topk_ids, arrivals, **extra):
    """One routed launch of ``stage`` (kernels/tc_gemv.py's routed_launch) on experts ``ex``."""
    from .kernels import tc_gemv

    k = int(topk_ids.shape[1])
    mode, qtable, q_step, sb, sb_step, block_scaled, b = _routed_operands(ex)
    x_kind = steps.epilogue.OUT_KIND[np.dtype(x_dtype)]
    ids, e, dev = steps.array(topk_ids).reshape(-1), int(ex.shape[0]), steps.device.current()
    args = (stage, x_bits, x_kind, qtable, q_step, b, sb, sb_step, mode, block_scaled, out, ids, e, k, arrivals, dev)
    _, n, kdim = (int(d) for d in ex.shape)  # gate_up [E, 2I, H], down [E, H, I]
    h, inter = (kdim, n // 2) if stage == "gate_up" else (n, kdim)
    wgmma = routed_wgmma_reason(h, inter, dev) is None
    *launch, shared = tc_gemv.routed_launch(*args, wgmma=wgmma, **extra)
    steps.run(launch, shared)


def routed_gate_up(x, gate_up, topk_ids, h, down_blocks):
    """(act float32 [T k, I], arrivals int32) in one launch: pair p = t k + j's act row is ``silu_mul``
    of its gate_up GEMV on x[t] quantized by gate_up's scheme (an id outside [0, E): not written);
    ``arrivals``, zeroed, are ``routed_down``'s counters for an output of H columns (``down_blocks``:
    down's weights are block-scaled). Callers check ``routed_reason``."""
    from .kernels import tc_gemv

    steps.load()
    x = steps.array(x)
    t, k = (int(d) for d in topk_ids.shape)
    n2 = int(gate_up.shape[1])
    hidden = steps.new((t * k, n2), np.float32)
    act = steps.new((t * k, n2 // 2), np.float32)
    arrivals = steps.new(t * tc_gemv.routed_tiles(h, down_blocks), np.int32)
    _routed_run("gate_up", x.view(np.uint16), x.dtype, gate_up, hidden, topk_ids, arrivals, act=act)
    return act, arrivals


def routed_down(act, arrivals, down, topk_ids, topk_weights, out_dtype):
    """(out [T, H] of ``out_dtype``, y float32 [T k, H]) in one launch: y[p] is pair p's down GEMV of
    act[p] quantized by down's scheme (an id outside [0, E): not written), and out each token's k
    rows combined as ``moe_combine`` combines them (slot order, float32, rounded once), by the last of
    the token's blocks to finish."""
    moe = steps.load()
    t, k = (int(d) for d in topk_ids.shape)
    h = int(down.shape[1])
    y = steps.new((t * k, h), np.float32)
    out = steps.new((t, h), out_dtype, output=True)
    w_flat, w_kind = _weights_flat(moe, topk_weights)
    layer_out, out_kind = steps.epilogue.out_bits(out), steps.epilogue.OUT_KIND[np.dtype(out_dtype)]
    extra = dict(w=w_flat, w_kind=w_kind, layer_out=layer_out, out_kind=out_kind)
    _routed_run("down", act.view(np.uint16), np.float32, down, y, topk_ids, arrivals, **extra)
    return out, y


def moe_paths():
    """For each MoE path of ``capabilities.MOE_PATHS``: None when it runs on this GPU, else why
    not (``capabilities.moe_path_rules`` with what this machine knows)."""
    from . import capabilities as caps

    base = caps.capabilities()
    if base.gpu is None:
        return {key: f"no usable GPU here ({base.reason})" for key, _ in caps.MOE_PATHS}
    steps.load()
    from .kernels import tc_gemv

    hook = (
        None
        if getattr(tc_gemv, "grouped_gemv_launch", None) is not None
        else ("kernels/tc_gemv.py has no grouped_gemv_launch yet (the tensor-core grouped GEMV is to come)")
    )
    return caps.moe_path_rules(base.cc, base.paths["cublaslt_per_tensor"], SIMULATOR, hook)


__all__ = [
    "moe_align",
    "quantize_tokens",
    "recording",
    "Recording",
    "Unbindable",
    "active_experts",
    "grouped_scaled_mm",
    "grouped_kernel_for",
    "gather_rows",
    "quantize_rows_static",
    "silu_mul",
    "silu_mul_quantize",
    "moe_combine",
    "moe_paths",
    "ROUTED_KERNEL",
    "ROUTED_MAX_PAIRS",
    "routed_reason",
    "ROUTED_WGMMA_KERNEL",
    "routed_wgmma_reason",
    "routed_gate_up",
    "routed_down",
]
