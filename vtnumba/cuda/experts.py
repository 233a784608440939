"""The GPU backend of the mixture-of-experts steps (``vtnumba.seam.experts`` calls them): cupy in,
cupy out (numpy under the CUDA simulator), the signatures of ``vtnumba/cpu/experts.py``, whose
results are the reference.

- ``moe_align``, ``gather_rows``, ``quantize_rows_static``, ``silu_mul``, ``silu_mul_quantize``,
  ``moe_combine``: one launch each (dynamic per-tensor ``silu_mul_quantize``: two), the kernels of
  ``kernels/moe.py``. Align gives the CPU's order exactly; the rest give the CPU's bytes (the SiLU's
  ``expf`` aside, see kernels/moe.py).
- ``grouped_scaled_mm``: the first kernel of ``KERNELS`` that can run the call (each says why not;
  "nothing fits" lists every reason, as ``gemm.select``), or the one named by ``kernel=``:

  ``tensorcore_grouped_gemv``  the tensor-core grouped GEMV of ``kernels/tc_gemv.py``
                               (``grouped_gemv_launch``; it says why not in ``grouped_gemv_reason``):
                               float32 scales, decode row counts (up to ``TILED_MIN_ROWS`` rows
                               per expert on average, or any where no tiled kernel can run)
  ``per_expert``               large prefill: ONE device-to-host read of ``offsets`` (a
                               synchronization), then ``vt.scaled_mm`` of each expert's rows
                               (cuBLASLt where it takes them), written into the output. Only where
                               the call has ``PER_EXPERT_MIN_FLOPS`` per expert on average,
                               never while the stream is being captured into a CUDA graph
  ``wgmma_grouped_gemm``       prefill on sm_90: the grouped wgmma GEMM (kernels/sm90_wgmma_gemm.py),
                               a tile map (kernels/moe.py's ``row_tiles``) then one launch; the
                               tensor-core bound, so only where the lever lets cuBLASLt run
  ``tensorcore_grouped_gemm``  prefill elsewhere (sm_89, sm_12x) or with the lever off: the grouped
                               tiled ``mma.sync`` GEMM (kernels/tc_gemm.py), strict G3, MXFP8 too
  ``grouped``                  the CUDA-core grouped kernel (kernels/grouped_gemm.py): the
                               expert's rows counted on the device, one launch, exact (G3)
  ``grouped_general``          the same on any K, block size and alignment, slower

  ``grouped_kernel_for(...)`` names the kernel a call would run; ``VT_DISABLE_KERNELS`` (read at
  every call) takes kernels out by name, as for ``scaled_mm``.

Nothing here synchronizes but the ``per_expert`` path. Host scales (a static ``input_scale``) are
uploaded once per device and value, so graph capture needs a warm-up call first, as ``scaled_mm``.

Binding (``recording``, for ``vtnumba.cuda.bound.bind_moe``): every step makes its device arrays with
``_new`` and launches with ``_run``. While a thread records, ``_new`` hands out parts of one scratch
block (the layer's output aside) and ``_run`` keeps the launch instead of enqueueing it, so one
``moe_fp8`` call becomes a list of launches whose input, output and scratch pointers a bound call
rewrites. A step that cannot be replayed that way (``per_expert`` reads offsets on the host) raises
``Unbindable`` while recording.
"""

import threading
from contextlib import contextmanager

import numpy as np

from .. import _arrays, _config
from . import quantize
from .ptx.target import SIMULATOR

# From this many FLOPs per expert on average (2 (P / E) N K, known on the host) the per-expert path
# runs: cuBLASLt expert by expert costs ~80 us of host time an expert (the validating scaled_mm and
# the read-back: 6.1-10.9 ms for 128 experts on the H200, 2026-12-01, benchmarks/gpu/bench_grouped_tc.py
# --kernels, at 64-512 rows an expert, where the grouped wgmma GEMM took 0.24-1.05 ms), and runs each
# GEMM about twice as fast as the grouped wgmma tiles (0.5x cuBLASLt at 4096^3). That pays from
# ~80 us x 1.37 PFLOP/s ~ 1e11 FLOPs an expert: Mixtral's 28672 x 4096 experts from ~450 rows each,
# Qwen3-30B-A3B's 1536 x 2048 from ~16,000 (an estimate past the measured 512 rows).
PER_EXPERT_MIN_FLOPS = 1e11
# Past this many rows per expert on average the grouped tiled GEMMs take the call from the grouped
# GEMV, which streams each expert's weight once per 16 rows. On the H200 (same run, Qwen3-30B-A3B's
# gate_up, 128 experts): 16 rows each, wgmma tiles 252 us against the GEMV's 317; the tiles cost
# about as much with fewer rows (260 us at 64: a tile's weight is streamed whatever its rows), and
# at 8 rows the GEMV took 171 us (benchmarks/RESULTS.md, 10:57).
TILED_MIN_ROWS = 8

_moe = _grouped = _device = _gemm = _block = _epilogue = None


def _backend():
    """Import what the GPU path needs, once (quantize._backend raises the one clear error)."""
    global _moe, _grouped, _device, _gemm, _block, _epilogue
    if _moe is None:
        quantize._backend()
        from . import block, gemm
        from .kernels import epilogue, grouped_gemm, moe
        from .runtime import device

        _grouped, _device, _gemm, _block, _epilogue = grouped_gemm, device, gemm, block, epilogue
        _moe = moe
    return _moe


def _array(x):
    """x on the device as a C-contiguous array (numpy under the simulator)."""
    x = quantize._as_device_array(x)
    return x if x.flags.c_contiguous else _device.xp.ascontiguousarray(x)


def _empty(shape, dtype, make=None):
    """A fresh device array (from ``make(shape, dtype)``, default cupy's); bfloat16 made as uint16
    and viewed (cupy makes no bfloat16)."""
    make = make or _device.xp.empty
    dtype = np.dtype(dtype)
    if SIMULATOR or dtype != _arrays.BFLOAT16:
        return make(shape, dtype)
    return make(shape, np.uint16).view(dtype)


def _aligned(a):
    return SIMULATOR or a.data.ptr % 16 == 0


class Unbindable(Exception):
    """Raised while recording by a step a bound call could not replay (the reason is its message)."""


class Recording:
    """A bind in progress on this thread: ``scratch(shape, dtype)`` makes the temporaries, ``output``
    is the layer's result (made apart: the caller allocates it per call), ``launches`` the
    (launch, shared memory bytes) the steps made, in order, not enqueued."""

    def __init__(self, scratch):
        self.scratch = scratch
        self.output = None
        self.launches = []


_RECORDING = threading.local()


@contextmanager
def recording(scratch):
    """Record this thread's MoE steps (module docstring) into a ``Recording`` over ``scratch``."""
    rec = Recording(scratch)
    _RECORDING.active = rec
    try:
        yield rec
    finally:
        _RECORDING.active = None


def _new(shape, dtype, output=False):
    """A step's device array: from the recording's scratch while one records (the ``output`` array
    apart), else a fresh one."""
    rec = getattr(_RECORDING, "active", None)
    if rec is None:
        return _empty(shape, dtype)
    if output:
        rec.output = _empty(shape, dtype)
        return rec.output
    return _empty(shape, dtype, rec.scratch)


def _run(launch, shared_mem=0):
    rec = getattr(_RECORDING, "active", None)
    if rec is not None:
        rec.launches.append((launch, shared_mem))
        return
    kernel, grid, block, args = launch
    kernel(grid, block, *args, shared_mem=shared_mem)


_TABLES = {}  # (device ordinal, bytes) -> float32 device vector: static input scales, uploaded once
_MAX_TABLES = 1024


def _scale_table(values):
    """Per-expert float32 scales as a device vector: a device array as it is, host values uploaded
    once per device and value (from cupy's own pool, as runtime/device.py's scalars), so that a
    call never transfers once warm."""
    if not isinstance(values, (np.ndarray, list, tuple)) and not SIMULATOR:
        return _array(values).astype(np.float32, copy=False).reshape(-1)
    host = np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1))
    if SIMULATOR:
        return host
    dev = _device.current()
    key = (dev.ordinal, host.tobytes())
    table = _TABLES.get(key)
    if table is None:
        if len(_TABLES) >= _MAX_TABLES:
            _TABLES.clear()
        xp = _device.xp
        with xp.cuda.Device(dev.ordinal), xp.cuda.using_allocator(xp.get_default_memory_pool().malloc):
            table = _TABLES[key] = xp.asarray(host)
    return table


# -- routing -----------------------------------------------------------------------------------------


def moe_align(topk_ids, num_experts):
    """(offsets int32 [E + 1], pair_row int32 [T, k], row_token int32 [P]) as the CPU's, in one
    launch (kernels/moe.py: the CPU's stable order, ids outside [0, E) skipped)."""
    moe = _backend()
    ids = _array(topk_ids)
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
    offsets = _new(e + 1, np.int32)
    pair_row = _new((t, k), np.int32)
    row_token = _new(t * k, np.int32)
    blocks = moe.align_blocks(flat.shape[0])
    block_counts = _device.current().placeholder("i32") if blocks == 1 else _new(blocks * e, np.int32)
    for *launch, shared in moe.align_launches(flat, offsets, pair_row.reshape(-1), row_token, block_counts, e, k):
        _run(launch, shared)
    return offsets, pair_row, row_token


def gather_rows(src, row_token):
    """``src[row_token]``: [P, ...] rows of ``src`` [T, ...] (any dtype), C-contiguous."""
    moe = _backend()
    src = _array(src)
    p = int(row_token.shape[0])
    out = _new((p,) + tuple(src.shape[1:]), src.dtype)
    row_bytes = src.itemsize * int(np.prod(src.shape[1:], dtype=np.int64))
    if p == 0 or row_bytes == 0:
        return out
    unit = next(u for u in (16, 4, 2, 1) if row_bytes % u == 0 and (u < 16 or (_aligned(src) and _aligned(out))))
    view = moe.UNIT_DTYPES[unit]
    _run(
        moe.gather_launch(
            src.reshape(-1).view(np.uint8).view(view),
            out.reshape(-1).view(np.uint8).view(view),
            _array(row_token),
            unit,
            row_bytes // unit,
        )
    )
    return out


def quantize_tokens(x, experts):
    """(codes uint8 [T, K], scale) of token rows x [T, K] by ``experts``' activation scheme (dynamic,
    per-token or per-group, not static), as ``vt.quantize_fp8`` gives them for that scheme: its very
    launches (``quantize.quantize_launches``), their arrays made as every step's (``_new``). The
    scale: dynamic [1], per-token [T], per-group [T, ceil(K / g)] row-major (float32, or E8M0 bytes
    for MXFP8)."""
    _backend()
    ex = experts
    scheme = str(ex.activation_scheme)
    mx = ex.activation_scale_format == "e8m0"
    launches, codes, scale = quantize.quantize_launches(
        _array(x),
        scheme,
        None,
        None if ex.block_size is None else int(ex.block_size[1]),
        bool(ex.scale_ue8m0),
        _new,
        (ex.activation_scale_rounding or "rceil") if mx else None,
        column_major_scales=False,
    )
    for launch in launches:
        _run(launch)
    return codes, scale


def quantize_rows_static(x, offsets, input_scales):
    """(codes uint8 [P, K], scale float32 [P]): expert e's rows by ``input_scales[e]`` as
    ``vt.quantize_fp8(rows, input_scales[e])``; padding rows code 0, scale 1."""
    moe = _backend()
    x = _array(x)
    p, k = (int(d) for d in x.shape)
    codes = _new((p, k), np.uint8)
    scales = _new(p, np.float32)
    if p == 0 or k == 0:
        scales[...] = 1
        return codes, scales
    kind = quantize._KINDS[np.dtype(x.dtype)]
    table = _scale_table(input_scales)
    _run(
        moe.static_rows_launch(
            quantize._flat(x),
            kind,
            quantize.encoder_in_use(),
            quantize._flat(codes),
            scales,
            _array(offsets),
            table,
            int(table.shape[0]),
            p,
            k,
            _aligned(x),
        )
    )
    return codes, scales


def _silu(
    h, offsets, mode, codes, scales, scale_bytes, partials, table, group_size, blocks, act=None, ue8m0=False, e8m0=None
):
    moe = _moe
    dev = _device.current()
    f32 = dev.placeholder("f32")
    half = int(h.shape[1]) // 2
    outputs = [a for a in (act, codes) if a is not None]
    grouped = mode == moe.SiluMode.PER_GROUP
    width = moe.silu_width(half, group_size if grouped else moe.WIDE, _aligned(h) and all(_aligned(a) for a in outputs))
    _run(
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
    h = _array(h)
    return h if np.dtype(h.dtype) == np.float32 else h.astype(np.float32)


def silu_mul(h, offsets):
    """act [P, I] float32 = ``g / (1 + exp(-g)) * u`` of h [P, 2I]; padding rows 0."""
    moe = _backend()
    h = _hidden(h)
    p, half = int(h.shape[0]), int(h.shape[1]) // 2
    act = _new((p, half), np.float32)
    if p and half:
        _silu(
            h,
            _array(offsets),
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
    moe = _backend()
    dn = down_experts
    h = _hidden(h)
    offsets = _array(offsets)
    p, half = int(h.shape[0]), int(h.shape[1]) // 2
    codes = _new((p, half), np.uint8)
    scheme = str(dn.activation_scheme)
    mode = moe.SiluMode
    blocks = moe.silu_blocks(p, mode.PER_TOKEN, 1)
    if scheme == "static":
        scales = _new(p, np.float32)
        if p and half:
            _silu(h, offsets, mode.STATIC, codes, scales, None, None, _scale_table(dn.input_scale), 1, blocks)
        elif p:
            scales[...] = 1
        return codes, scales
    if scheme == "dynamic":
        parts = moe.silu_blocks(p, mode.DYNAMIC, _device.current().sm_count)
        buf = _new(1 + parts, np.float32)  # the scale and, after it, the amax partials
        if p and half:
            _silu(h, offsets, mode.DYNAMIC_AMAX, None, None, None, buf[1:], None, 1, parts)
            _silu(h, offsets, mode.DYNAMIC, codes, buf[:1], None, buf[1:], None, 1, parts)
        else:
            buf[...] = np.float32(np.float32(1.0) / (np.float32(448.0) * np.float32(512.0)))
        return codes, buf[:1]
    if scheme == "per_token":
        scales = _new((p, 1), np.float32)
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
        scales = _new((p, groups), np.uint8)
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
    scales = _new((p, groups), np.float32)
    if p and half:
        _silu(h, offsets, mode.PER_GROUP, codes, scales, None, None, None, g, blocks, ue8m0=bool(dn.scale_ue8m0))
    return codes, scales


def _weights_flat(moe, topk_weights):
    """(the routing weights flat, their kernels/moe.py WeightKind): float32 values, or 16-bit bits."""
    w = _array(topk_weights)
    wdt = np.dtype(w.dtype)
    if wdt == np.float32:
        return w.reshape(-1), moe.WeightKind.FLOAT32
    kind = moe.WeightKind.FLOAT16 if wdt == np.float16 else moe.WeightKind.BFLOAT16
    return w.reshape(-1).view(np.uint16), kind


def moe_combine(y, pair_row, topk_weights, out_dtype):
    """out [T, H] = sum over j of ``topk_weights[t, j] * y[pair_row[t, j]]`` in float32, slot order,
    skipped pairs adding nothing, rounded once to ``out_dtype``: the CPU's bytes for the same y."""
    moe = _backend()
    y = _array(y)
    if np.dtype(y.dtype) != np.float32:
        y = y.astype(np.float32)
    t, k = (int(d) for d in pair_row.shape)
    out = _new((t, int(y.shape[1])), out_dtype, output=True)
    if t == 0 or out.size == 0:
        return out
    w_flat, w_kind = _weights_flat(moe, topk_weights)
    out_kind = _epilogue.OUT_KIND[np.dtype(out_dtype)]
    _run(
        moe.combine_launch(
            y, _array(pair_row).reshape(-1), w_flat, w_kind, _epilogue.out_bits(out), out_kind, k, _aligned(y)
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

    _backend()
    if ROUTED_KERNEL in _gemm.disabled_kernels():
        return f"{ROUTED_KERNEL} is disabled by VT_DISABLE_KERNELS"
    dev = _device.current()
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

    _backend()
    dev = dev or _device.current()
    if ROUTED_WGMMA_KERNEL in _gemm.disabled_kernels():
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

    dev = _device.current()
    e, n, kdim = ex.shape
    scheme = str(ex.activation_scheme)
    if scheme == "static":
        mode, qtable, q_step = tc_gemv.MODE_STATIC, _scale_table(ex.input_scale), 1
    elif scheme == "per_token":
        mode, qtable, q_step = tc_gemv.MODE_PER_TOKEN, dev.scalar(0.0), 0  # 0: no upper bound on the scale
    else:
        mode, qtable, q_step = tc_gemv.MODE_PER_GROUP, dev.placeholder("f32"), 0
    ws = _array(ex.weight_scale)
    block_scaled = ex.block_size is not None
    if block_scaled:
        sb, sb_step = ws.reshape(e * ws.shape[1], ws.shape[2]), 0
    elif ws.ndim == 2:
        sb, sb_step = ws.reshape(-1), 1
    else:
        sb, sb_step = ws.reshape(-1), 0
    return mode, qtable, q_step, sb, sb_step, block_scaled, _array(ex.data).reshape(e * n, kdim)


def _routed_run(stage, x_bits, x_dtype, ex, out, topk_ids, arrivals, **extra):
    """One routed launch of ``stage`` (kernels/tc_gemv.py's routed_launch) on experts ``ex``."""
    from .kernels import tc_gemv

    k = int(topk_ids.shape[1])
    mode, qtable, q_step, sb, sb_step, block_scaled, b = _routed_operands(ex)
    x_kind = _epilogue.OUT_KIND[np.dtype(x_dtype)]
    ids, e, dev = _array(topk_ids).reshape(-1), int(ex.shape[0]), _device.current()
    args = (stage, x_bits, x_kind, qtable, q_step, b, sb, sb_step, mode, block_scaled, out, ids, e, k, arrivals, dev)
    _, n, kdim = (int(d) for d in ex.shape)  # gate_up [E, 2I, H], down [E, H, I]
    h, inter = (kdim, n // 2) if stage == "gate_up" else (n, kdim)
    wgmma = routed_wgmma_reason(h, inter, dev) is None
    *launch, shared = tc_gemv.routed_launch(*args, wgmma=wgmma, **extra)
    _run(launch, shared)


def routed_gate_up(x, gate_up, topk_ids, h, down_blocks):
    """(act float32 [T k, I], arrivals int32) in one launch: pair p = t k + j's act row is ``silu_mul``
    of its gate_up GEMV on x[t] quantized by gate_up's scheme (an id outside [0, E): not written);
    ``arrivals``, zeroed, are ``routed_down``'s counters for an output of H columns (``down_blocks``:
    down's weights are block-scaled). Callers check ``routed_reason``."""
    from .kernels import tc_gemv

    _backend()
    x = _array(x)
    t, k = (int(d) for d in topk_ids.shape)
    n2 = int(gate_up.shape[1])
    hidden = _new((t * k, n2), np.float32)
    act = _new((t * k, n2 // 2), np.float32)
    arrivals = _new(t * tc_gemv.routed_tiles(h, down_blocks), np.int32)
    _routed_run("gate_up", x.view(np.uint16), x.dtype, gate_up, hidden, topk_ids, arrivals, act=act)
    return act, arrivals


def routed_down(act, arrivals, down, topk_ids, topk_weights, out_dtype):
    """(out [T, H] of ``out_dtype``, y float32 [T k, H]) in one launch: y[p] is pair p's down GEMV of
    act[p] quantized by down's scheme (an id outside [0, E): not written), and out each token's k
    rows combined as ``moe_combine`` combines them (slot order, float32, rounded once), by the last of
    the token's blocks to finish."""
    moe = _backend()
    t, k = (int(d) for d in topk_ids.shape)
    h = int(down.shape[1])
    y = _new((t * k, h), np.float32)
    out = _new((t, h), out_dtype, output=True)
    w_flat, w_kind = _weights_flat(moe, topk_weights)
    layer_out, out_kind = _epilogue.out_bits(out), _epilogue.OUT_KIND[np.dtype(out_dtype)]
    extra = dict(w=w_flat, w_kind=w_kind, layer_out=layer_out, out_kind=out_kind)
    _routed_run("down", act.view(np.uint16), np.float32, down, y, topk_ids, arrivals, **extra)
    return out, y


# -- the grouped GEMM ----------------------------------------------------------------------------------


class GroupedCall:
    """One grouped_scaled_mm call, normalized once for every kernel's reason / run.

    ``a`` [P, K] codes, ``b`` [E, N, K] (``b2d``: the [E * N, K] view), ``offsets`` int32 [E + 1],
    ``p, n, k, e``; the scales flat: ``sa`` read at ``row * sa_row + kb * sa_kb``, ``sb`` at
    ``e * sb_e + (n // block_n) * sb_nb + kb * sb_kb``, float32 or E8M0 bytes (``sa_e8m0``,
    ``sb_e8m0``); ``blocked`` with K-blocks of ``block_k`` (else one K-block, ``block_k`` = K);
    ``scale_a`` / ``scale_b`` as given but float32 (or uint8) and contiguous; ``block_size`` as given;
    ``out_dtype``; ``device``."""

    __slots__ = (
        "a",
        "b",
        "b2d",
        "offsets",
        "p",
        "n",
        "k",
        "e",
        "sa",
        "sa_e8m0",
        "sa_row",
        "sa_kb",
        "sb",
        "sb_e8m0",
        "sb_e",
        "sb_nb",
        "sb_kb",
        "blocked",
        "block_n",
        "block_k",
        "block_size",
        "scale_a",
        "scale_b",
        "out_dtype",
        "device",
    )

    def __init__(self, a, scale_a, b, scale_b, offsets, out_dtype, block_size):
        self.device = _device.current()
        self.a = a = _array(a)
        self.b = b = _array(b)
        self.p, self.k = (int(d) for d in a.shape)
        self.e, self.n = int(b.shape[0]), int(b.shape[1])
        self.b2d = b.reshape(self.e * self.n, self.k)
        self.offsets = _array(offsets)
        self.out_dtype = np.dtype(out_dtype)
        self.block_size = None if block_size is None else tuple(int(v) for v in block_size)
        self.blocked = block_size is not None
        self.block_n, self.block_k = self.block_size if self.blocked else (1, self.k)
        sa = _array(scale_a)
        sb = _array(scale_b)
        self.sa_e8m0 = np.dtype(sa.dtype) == np.uint8
        if not self.sa_e8m0 and np.dtype(sa.dtype) != np.float32:
            sa = sa.astype(np.float32)
        if sa.ndim == 2 and sa.shape[1] > 1:
            self.sa_row, self.sa_kb = int(sa.shape[1]), 1
        else:
            self.sa_row, self.sa_kb = (0 if sa.size == 1 else 1), 0
        self.sa = sa.reshape(-1)
        self.sb_e8m0 = np.dtype(sb.dtype) == np.uint8
        if not self.sb_e8m0 and np.dtype(sb.dtype) != np.float32:
            sb = sb.astype(np.float32)
        self.scale_a, self.scale_b = sa, sb
        if sb.ndim == 3:
            self.sb_e, self.sb_nb, self.sb_kb = int(sb.shape[1] * sb.shape[2]), int(sb.shape[2]), 1
        elif sb.ndim == 2:
            self.sb_e, self.sb_nb, self.sb_kb = int(sb.shape[1]), 1, 0
            self.block_n = 1
        else:
            self.sb_e, self.sb_nb, self.sb_kb = 1, 0, 0
        self.sb = sb.reshape(-1)


def _capturing():
    """Whether cupy's current stream is being captured into a CUDA graph (a failed query counts as
    capturing: the per-expert path's read-back must never run inside a capture)."""
    if SIMULATOR:
        return False
    cupy = _device.xp
    try:
        return cupy.cuda.runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr) != 0
    except Exception:  # e.g. the legacy stream queried while another stream captures globally
        return True


class TensorCoreGroupedGemv:
    """The tensor-core grouped GEMV (``kernels/tc_gemv.py``'s ``grouped_gemv_launch``, another
    engineer's): float32 scales, per-tensor / per-row / per-channel or 128 x 128 blocks, its own
    reasons (``grouped_gemv_reason``) for the rest. It leaves the padding rows as y held them, so y
    is zeroed first (one memset on the stream). A call large enough for ``per_expert`` goes there
    instead: past ``tc_gemv.grouped_rows_hint`` rows an expert re-reads its weight every pass."""

    name = "tensorcore_grouped_gemv"

    def reason(self, call, forced):
        from .kernels import tc_gemv

        if getattr(tc_gemv, "grouped_gemv_launch", None) is None:
            return "kernels/tc_gemv.py has no grouped_gemv_launch (the tensor-core grouped GEMV)"
        why = tc_gemv.grouped_gemv_reason(call.a, call.scale_a, call.b, call.scale_b, call.block_size, call.device)
        if why is None and not forced and call.p > TILED_MIN_ROWS * call.e:
            disabled = _gemm.disabled_kernels()
            tiled = next((k.name for k in _TILED if k.name not in disabled and k.reason(call, False) is None), None)
            if tiled is not None:
                why = (
                    f"a prefill-sized call ({call.p} rows over {call.e} experts): {tiled} takes it, past "
                    f"{TILED_MIN_ROWS} rows per expert on average"
                )
        return why

    def run(self, call, y, active):
        from .kernels import tc_gemv

        y_bits = _epilogue.out_bits(y)  # (the map's last grid row writes the padding rows as 0)
        # at most 8 rows per expert on average (decode: T <= 8 tokens of top-k): the 8-row passes, which
        # ran 171 against 236 us at 8 rows over 128 experts (H200); an expert with more takes more passes
        hint = 8 if call.p <= 8 * call.e else None
        _run(
            tc_gemv.grouped_gemv_launch(
                call.a,
                call.scale_a,
                call.b,
                call.scale_b,
                call.offsets,
                y_bits,
                call.out_dtype,
                call.block_size,
                call.device,
                rows_hint=hint,
                active=active,
            )
        )


class PerExpert:
    """Large prefill: the offsets read back once (a synchronization), then ``vt.scaled_mm`` (or the
    block-scaled GEMM) of each expert's rows, written into y; padding rows 0."""

    name = "per_expert"

    def reason(self, call, forced):
        if _capturing():
            return "the stream is being captured into a CUDA graph: the per-expert path reads offsets on the host"
        if call.blocked and call.scale_a.ndim != 2:
            return "the per-expert path takes group activation scales [P, KB] with block-scaled weights"
        if forced:
            return None
        if SIMULATOR:
            return "the per-expert path is for cuBLASLt, which needs a real GPU (running under the CUDA simulator)"
        if not _config.dense_cublaslt_fp8_enabled():
            return "turned off by the lever VT_DENSE_CUBLASLT_FP8 (its point is cuBLASLt)"
        flops = 2.0 * call.p / max(call.e, 1) * call.n * call.k
        if flops < PER_EXPERT_MIN_FLOPS:
            return (
                f"its host cost per expert pays from {PER_EXPERT_MIN_FLOPS:.0e} FLOPs an expert on average, got "
                f"{flops:.2e} (P = {call.p} rows over E = {call.e} experts of [{call.n}, {call.k}])"
            )
        return None

    def run(self, call, y, active):
        if getattr(_RECORDING, "active", None) is not None:
            raise Unbindable("per_expert reads the offsets back on the host (a prefill-sized call)")
        offs = np.asarray(call.offsets) if SIMULATOR else _device.xp.asnumpy(call.offsets)  # the one read-back
        per_row_a = call.sa_row != 0
        bits = _epilogue.out_bits(y)  # copies as float32 or 16-bit words: cupy has no bfloat16 arithmetic
        for e in range(call.e):
            lo, hi = int(offs[e]), int(offs[e + 1])
            if hi <= lo:
                continue
            sa = _aligned_copy(call.scale_a[lo:hi]) if per_row_a else call.scale_a
            if call.blocked:
                part = _block.block_scaled_mm(
                    call.a[lo:hi],
                    call.b[e],
                    sa,
                    _aligned_copy(call.scale_b[e]),
                    call.block_size,
                    call.out_dtype,
                    None,
                    None,
                )
            else:
                sb = call.scale_b[e] if call.scale_b.ndim == 2 else call.scale_b[e : e + 1]
                part = _gemm.scaled_mm(call.a[lo:hi], call.b[e], sa, _aligned_copy(sb), call.out_dtype, None, None)
            bits[lo:hi] = _epilogue.out_bits(part)
        bits[max(0, int(offs[call.e])) :] = 0


def _aligned_copy(view):
    """``view``, or a copy of it where its address is not 16-byte aligned: cuBLASLt refused an expert's
    per-tensor scale read in place from the [E] array (CUBLAS_STATUS_NOT_SUPPORTED on the H200 for
    expert e at a 4 e byte offset), and so may any scale vector it reads through a pointer."""
    if SIMULATOR or view.data.ptr % 16 == 0:
        return view
    return view.copy()


class _TiledGrouped:
    """A grouped tiled tensor-core GEMM: a tile map (kernels/moe.py's ``row_tiles``, the counts read
    on the device) and one launch over it, each block one expert's tile of rows."""

    @staticmethod
    def decode_sized(call):
        """Why a call is the GEMV's rather than the tiles' (None past ``TILED_MIN_ROWS`` an expert)."""
        if call.p <= TILED_MIN_ROWS * call.e:
            return (
                f"a decode-sized call ({call.p} rows over {call.e} experts): the grouped GEMV's, up to "
                f"{TILED_MIN_ROWS} rows per expert on average"
            )
        return None

    def run(self, call, y, active):
        rows = self.tile_rows(call)
        tiles = _new((_moe.row_tile_count(call.p, call.e, rows), 3), np.int32)
        _run(_moe.row_tiles_launch(call.offsets, call.e, call.p, rows, tiles))
        _run(self.launch(call, _epilogue.out_bits(y), tiles))


class WgmmaGrouped(_TiledGrouped):
    """The grouped wgmma GEMM (kernels/sm90_wgmma_gemm.py, sm_90): Hopper's native FP8 tensor-core
    instruction, promotion per 128 of K -- the tensor-core bound cuBLASLt holds, not DESIGN.md's strict
    G3 -- so it runs where the lever VT_DENSE_CUBLASLT_FP8 lets cuBLASLt run (the contract of the fast
    path), from ``TILED_MIN_ROWS`` rows per expert on average."""

    name = "wgmma_grouped_gemm"

    def reason(self, call, forced):
        from .kernels import sm90_wgmma_gemm

        why = sm90_wgmma_gemm.grouped_reason(call)
        if why is None and not forced:
            if not _config.dense_cublaslt_fp8_enabled():
                why = "it holds the tensor-core bound, not strict G3: turned off with cuBLASLt by the lever VT_DENSE_CUBLASLT_FP8"
            else:
                why = self.decode_sized(call)
        return why

    def tile_rows(self, call):
        from .kernels import sm90_wgmma_gemm

        return sm90_wgmma_gemm.block_rows(sm90_wgmma_gemm.grouped_config(call))

    def launch(self, call, y_bits, tiles):
        from .kernels import sm90_wgmma_gemm

        return sm90_wgmma_gemm.grouped_gemm_launch(call, y_bits, tiles)


class TensorCoreGroupedGemm(_TiledGrouped):
    """The grouped tiled GEMM on ``mma.sync`` (kernels/tc_gemm.py): strict G3 (promotion per mma), any
    GPU with FP8 mma (sm_89, sm_90, sm_12x), float32 scales or MXFP8, from ``TILED_MIN_ROWS`` rows per
    expert on average."""

    name = "tensorcore_grouped_gemm"

    def reason(self, call, forced):
        from .kernels import tc_gemm

        why = tc_gemm.unavailable_reason(call.device, simulate=forced) or tc_gemm.grouped_shape_reason(call)
        if why is None:
            scales = tc_gemm.grouped_scales(call)
            why = scales if isinstance(scales, str) else None
        if why is None and not forced:
            why = self.decode_sized(call)
        return why

    def tile_rows(self, call):
        from .kernels import tc_gemm

        return tc_gemm.grouped_tile_rows(call)

    def launch(self, call, y_bits, tiles):
        from .kernels import tc_gemm

        return tc_gemm.grouped_gemm_launch(call, y_bits, tiles)


class GroupedCudaCore:
    """The CUDA-core grouped kernel (kernels/grouped_gemm.py's ``grouped_kernel``)."""

    name = "grouped"

    def reason(self, call, forced):
        return _grouped.grouped_reason(call)

    def run(self, call, y, active):
        _run(_grouped.grouped_launch(call, _epilogue.out_bits(y), _epilogue.OUT_KIND[call.out_dtype], active))


class GroupedGeneral:
    """The general CUDA-core grouped kernel: any K, block size and alignment."""

    name = "grouped_general"

    def reason(self, call, forced):
        return None

    def run(self, call, y, active):
        _run(_grouped.general_launch(call, _epilogue.out_bits(y), _epilogue.OUT_KIND[call.out_dtype], active))


def active_map(call):
    """The experts a grouped kernel's grid rows run for ``call`` (``active_experts`` of its offsets)."""
    return active_experts(call.offsets, call.e, call.p)


def active_experts(offsets, num_experts, rows):
    """The experts a grouped kernel's grid rows run, int32 [G + 1] (kernels/moe.py's map): where fewer
    experts can have rows than there are experts (G = P < E: decode), one small launch lists the ones
    that do, so the grid has G rows of blocks instead of E; otherwise every expert in order. Made
    once by a caller whose GEMMs share the offsets (``moe_fp8``'s gate_up and down) and passed to
    each as ``active=``; made from the offsets on the device, so a captured graph remakes it on each
    replay."""
    _backend()
    from .kernels import tc_gemv

    e, slots = int(num_experts), min(int(num_experts), int(rows))
    if slots >= e:
        return tc_gemv.identity_map(_device.current(), e)
    active = _new(slots + 1, np.int32)
    _run(_moe.active_experts_launch(_array(offsets), e, active))
    return active


_TILED = (WgmmaGrouped(), TensorCoreGroupedGemm())
# the order they are tried in:
KERNELS = (
    TensorCoreGroupedGemv(),  # decode: the tensor-core grouped GEMV (kernels/tc_gemv.py)
    PerExpert(),  # large prefill on cuBLASLt, expert by expert (one read-back)
    *_TILED,  # prefill: tensor-core tiles, one launch, the counts on the device
    GroupedCudaCore(),  # what the tensor-core kernels refuse: one launch, the counts on the device
    GroupedGeneral(),  # what the grouped kernel refuses
)
KERNELS_BY_NAME = {k.name: k for k in KERNELS}


def select(call, kernel=None):
    """The kernel that runs ``call``: the one named ``kernel``, else the first of ``KERNELS`` that
    can; ValueError listing every reason when none can. VT_DISABLE_KERNELS leaves kernels out."""
    disabled = _gemm.disabled_kernels()
    if kernel is not None:
        chosen = KERNELS_BY_NAME.get(kernel)
        if chosen is None:
            raise ValueError(
                f"kernel must be one of {sorted(KERNELS_BY_NAME)} or None for a grouped GEMM call, got {kernel!r}"
            )
        if chosen.name in disabled:
            raise ValueError(f"kernel {kernel!r} is disabled by VT_DISABLE_KERNELS")
        why = chosen.reason(call, True)
        if why:
            raise ValueError(f"kernel {kernel!r} cannot run this call: {why}")
        return chosen
    reasons = []
    for candidate in KERNELS:
        if candidate.name in disabled:
            reasons.append(f"{candidate.name}: disabled by VT_DISABLE_KERNELS")
            continue
        why = candidate.reason(call, False)
        if why is None:
            return candidate
        reasons.append(f"{candidate.name}: {why}")
    raise ValueError(
        f"no GPU grouped GEMM kernel can run a [{call.p}, {call.k}] x {call.e} experts of [{call.n}, "
        f"{call.k}]^T call:\n  " + "\n  ".join(reasons)
    )


def grouped_kernel_for(a, scale_a, b, scale_b, offsets, out_dtype, block_size=None, kernel=None):
    """The name of the kernel ``grouped_scaled_mm`` with these arguments runs (nothing is launched)."""
    _backend()
    return select(GroupedCall(a, scale_a, b, scale_b, offsets, out_dtype, block_size), kernel).name


def grouped_scaled_mm(a, scale_a, b, scale_b, offsets, out_dtype, block_size=None, kernel=None, active=None):
    """y [P, N]: rows offsets[e]:offsets[e + 1] are ``vt.scaled_mm`` of those rows of ``a`` with
    expert e's weight ``b[e]``; padding rows 0 (arguments as the CPU's ``grouped_scaled_mm``, plus
    ``kernel=`` to force one by name, and ``active``: the map ``active_experts`` made for these
    offsets, else one is made here). Only ``per_expert`` synchronizes (module docstring)."""
    _backend()
    call = GroupedCall(a, scale_a, b, scale_b, offsets, out_dtype, block_size)
    y = _new((call.p, call.n), call.out_dtype)
    if call.p == 0 or call.n == 0:
        return y
    chosen = select(call, kernel)
    if active is None and not isinstance(chosen, (PerExpert, _TiledGrouped)):  # the tiles read their own map
        active = active_map(call)
    chosen.run(call, y, active)
    return y


def moe_paths():
    """For each MoE path of ``capabilities.MOE_PATHS``: None when it runs on this GPU, else why
    not (``capabilities.moe_path_rules`` with what this machine knows)."""
    from . import capabilities as caps

    base = caps.capabilities()
    if base.gpu is None:
        return {key: f"no usable GPU here ({base.reason})" for key, _ in caps.MOE_PATHS}
    _backend()
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
    "gather_rows",
    "quantize_rows_static",
    "grouped_scaled_mm",
    "silu_mul",
    "silu_mul_quantize",
    "moe_combine",
    "grouped_kernel_for",
    "select",
    "GroupedCall",
    "KERNELS",
    "KERNELS_BY_NAME",
    "PER_EXPERT_MIN_FLOPS",
    "TILED_MIN_ROWS",
    "moe_paths",
    "ROUTED_KERNEL",
    "ROUTED_MAX_PAIRS",
    "routed_reason",
    "ROUTED_WGMMA_KERNEL",
    "routed_wgmma_reason",
    "routed_gate_up",
    "routed_down",
]
