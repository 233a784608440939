"""The GPU's quantization: which kernels a call launches, per activation scheme.

Each scheme is written as the launches it makes -- (kernel, grid, block, args), the flat input
first -- so that an immediate call (``quantize_static`` ...) and a prepared one
(``quantize_launches``, which ``bound.py`` replays) run the very same launches. The kernels are
``kernels/quant.py``'s; the backend (``vtnumba.cuda``) exposes these functions to ``vtnumba.ops``.

- Inputs: cupy arrays of float32, float16 or ml_dtypes.bfloat16 (torch CUDA tensors are taken
  zero-copy through ``__cuda_array_interface__`` / DLPack). Strided inputs are copied to C order
  first, so they give the bytes of their contiguous copies.
- Scales: a host float32, or a float32 size-1 device array that the kernels read on the device (never
  synchronized, never written). A static activation's ``scale`` is a device array shared by every
  activation quantized with the same host value (``scale_array``): read-only.
- Encoder: ``VT_CUDA_ENCODER`` = ``auto`` (default: the hardware ``cvt`` on sm_89+, else the
  portable encoder), ``hardware`` or ``portable``; the ``encoder=`` argument of the functions below
  overrides it (tests use it to prove both).
- Nothing synchronizes: dynamic scales are reduced and consumed on the GPU.
"""

import os

import numpy as np

from .. import _arrays
from .ptx.target import SIMULATOR, require_gpu

_ENCODER_SETTING = os.environ.get("VT_CUDA_ENCODER", "auto").lower()
_KINDS = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", _arrays.BFLOAT16: "bfloat16"}

_quant = None  # vtnumba.cuda.kernels.quant, imported after require_gpu() (it needs numba-cuda)
_device = None  # vtnumba.cuda.runtime.device
_Buffer = None


def _backend():
    """Import what the GPU path needs, once; raise the one clear error if it cannot run."""
    global _quant, _device, _Buffer
    if _quant is None:
        require_gpu()
        from .kernels import quant
        from .runtime import device, launch

        _Buffer = launch.Buffer
        _device = device
        device.array_module()
        _quant = quant
    return _quant


def _encoder(requested, dev):
    if requested is None:
        requested = _ENCODER_SETTING
    if requested == "auto":
        return dev.default_encoder
    if requested not in ("hardware", "portable"):
        raise ValueError(f"encoder must be 'auto', 'hardware' or 'portable' (env VT_CUDA_ENCODER), got {requested!r}")
    return requested


def _as_device_array(x):
    """A cupy array viewing ``x`` (numpy under the simulator)."""
    if SIMULATOR:
        return np.asarray(x)
    cupy = _device.xp
    if isinstance(x, cupy.ndarray):
        return x
    if str(getattr(x, "dtype", "")) == "torch.bfloat16":  # bf16 has no __cuda_array_interface__ typestr
        import torch

        return cupy.asarray(x.view(torch.int16)).view(_arrays.BFLOAT16)
    return cupy.asarray(x)


def _flat(a):
    """A C-contiguous array as the kernels' flat 1-D argument (16-bit floats as their uint16 bits)."""
    if SIMULATOR:
        flat = a.reshape(-1)
        return flat.view(np.uint16) if flat.dtype.itemsize == 2 else flat
    return _Buffer(a.data.ptr, (a.size,), (a.itemsize,))


def _scalar_arg(scale):
    """(is a device array, kernel argument) for a scale given as host float32 or a size-1 array."""
    if isinstance(scale, (float, np.floating)):
        return False, np.float32(scale)
    a = _as_device_array(scale)
    return True, (a.reshape(1) if SIMULATOR else _Buffer(a.data.ptr, (1,), (4,)))


def _input(x):
    """(flat kernel input, kind, shape, size, 16-byte groups usable, owner) for a float input array.

    ``owner`` is the array the flat input points into: a caller must hold it until the kernel is
    launched. When x is strided it is a fresh contiguous copy, and a ``Buffer`` keeps no reference:
    dropped early, its memory goes back to cupy's pool and the very next allocation (the output)
    may receive it, so the kernel would read its own output (seen on the H200 as a few wrong codes
    on strided per-token inputs, now and then)."""
    x = _as_device_array(x)
    kind = _KINDS[np.dtype(x.dtype)]
    try:
        contiguous = x._c_contiguous  # cupy's cached flag: x.flags builds an object per call
    except AttributeError:
        contiguous = x.flags.c_contiguous
    if not contiguous:
        x = _device.xp.ascontiguousarray(x)
    aligned = SIMULATOR or x.data.ptr % 16 == 0
    return _flat(x), kind, x.shape, x.size, aligned, x


def _blocks(units, cap):
    return max(1, min(-(-units // _quant.THREADS), cap))


def _elementwise_grid(n, ngroups):
    return _blocks(ngroups + (n - ngroups * _quant.GROUP), _quant.MAX_BLOCKS)


def scale_array(scale):
    """The activation's (1,) float32 scale array on the device.

    A host scale is uploaded once per (device, value) and the array shared by every activation
    quantized with it -- as upstream returns the layer's own ``input_scale`` tensor as the
    activation's scale -- so a static quantization allocates nothing for its scale: treat
    ``q.scale`` as read-only."""
    if not isinstance(scale, (float, np.floating)):
        a = _as_device_array(scale)
        return a if a.shape == (1,) else a.reshape(1)
    _backend()
    return _device.current().scalar(scale)


# Each quantization is written as the launches it makes -- (kernel, grid, block, args), the flat
# input first -- so that a call and a prepared (bound) call run the very same launches.


def _static_launches(xin, kind, n, aligned, out, scale, encoder):
    quant = _quant
    device_scale, scale_arg = _scalar_arg(scale)
    ngroups = n // quant.GROUP if aligned else 0
    kernel = quant.static_kernel(kind, encoder, device_scale)
    return [(kernel, _elementwise_grid(n, ngroups), quant.THREADS, (xin, _flat(out), scale_arg, ngroups))]


def _fresh(shape, dtype):
    """A new device array from the current allocator (the scratch of an immediate call)."""
    return _device.xp.empty(shape, dtype=dtype)


def _dynamic_buffers(n, aligned, dev, scratch=_fresh):
    """(scale (1,), partials argument, partial count). The amax partials live in the scale's own
    allocation (scale = buf[:1]), so that whoever holds the scale holds them (a captured CUDA graph
    keeps writing them on replay)."""
    quant = _quant
    ngroups = n // quant.GROUP if aligned else 0
    parts = _blocks(ngroups + (n - ngroups * quant.GROUP), dev.sm_count * quant.AMAX_BLOCKS_PER_SM)
    buf = scratch((1 + parts,), np.float32)
    partials = buf[1:] if SIMULATOR else _Buffer(buf.data.ptr + 4, (parts,), (4,))
    return buf[:1], partials, parts


def _dynamic_launches(xin, kind, n, aligned, out, scale, partials, parts, encoder, dev):
    quant = _quant
    ngroups = n // quant.GROUP if aligned else 0
    if n <= quant.SMALL_DYNAMIC_MAX:  # one launch (quant.py says why)
        return [(quant.dynamic_small_kernel(kind, encoder), 1, quant.SMALL_THREADS, (xin, _flat(out), scale, ngroups))]
    blocks = min(_elementwise_grid(n, ngroups), dev.sm_count * quant.DYNAMIC_BLOCKS_PER_SM)
    return [
        (quant.amax_kernel(kind), parts, quant.THREADS, (xin, partials, ngroups)),
        (quant.dynamic_kernel(kind, encoder), blocks, quant.THREADS, (xin, _flat(out), partials, scale, ngroups)),
    ]


def _per_token_launches(xin, kind, shape, aligned, out, scales, scale_ub, encoder):
    quant = _quant
    rows, cols = shape
    device_ub, ub_arg = _scalar_arg(np.float32(0.0) if scale_ub is None else scale_ub)  # 0: no bound
    row_groups = cols // quant.GROUP if aligned and cols % quant.GROUP == 0 else 0
    kernel = quant.per_token_kernel(kind, encoder, device_ub)
    return [(kernel, rows, quant.THREADS, (xin, _flat(out), _flat(scales), ub_arg, cols, row_groups))]


def _run(launches):
    for kernel, grid, block, args in launches:
        kernel(grid, block, *args)


def quantize_static(x, scale, *, encoder=None):
    _backend()
    xin, kind, shape, n, aligned, owner = _input(x)
    out = _device.xp.empty(shape, dtype=np.uint8)
    _run(_static_launches(xin, kind, n, aligned, out, scale, _encoder(encoder, _device.current())))
    del owner  # a strided input's copy may go back to the pool only now that its kernel is queued
    return out


def quantize_dynamic(x, *, encoder=None):
    _backend()
    xin, kind, shape, n, aligned, owner = _input(x)
    dev = _device.current()
    out = _device.xp.empty(shape, dtype=np.uint8)
    scale, partials, parts = _dynamic_buffers(n, aligned, dev)
    _run(_dynamic_launches(xin, kind, n, aligned, out, scale, partials, parts, _encoder(encoder, dev), dev))
    del owner  # see quantize_static
    return out, scale


def quantize_per_token(x, scale_ub, *, encoder=None):
    _backend()
    xin, kind, shape, n, aligned, owner = _input(x)
    xp = _device.xp
    out = xp.empty(shape, dtype=np.uint8)
    scales = xp.empty((shape[0], 1), dtype=np.float32)
    if shape[0] == 0:
        return out, scales
    _run(_per_token_launches(xin, kind, shape, aligned, out, scales, scale_ub, _encoder(encoder, _device.current())))
    del owner  # see quantize_static
    return out, scales


def _per_group_launches(
    xin, kind, shape, aligned, out, scales, group_size, scale_ue8m0, column_major_scales, encoder, e8m0=None
):
    """The per-group quantization launch; ``e8m0`` ('rceil' / 'floor'): MX, E8M0 byte scales."""
    quant = _quant
    rows, cols = shape
    groups = -(-cols // group_size)
    width = quant.group_width(group_size)
    mx = () if e8m0 is None else (e8m0,)  # the factories' cache keys: the float path's as before
    if aligned and cols % group_size == 0 and group_size == quant.GROUP * width:  # a chunk a lane, one read
        kernel, threads, per_block = quant.per_group_vector_kernel(kind, encoder, bool(scale_ue8m0), width, True, *mx)
    elif aligned and cols % quant.GROUP == 0 and group_size % quant.GROUP == 0:  # the 16-wide form
        kernel, threads, per_block = quant.per_group_vector_kernel(kind, encoder, bool(scale_ue8m0), width, False, *mx)
    else:
        kernel, threads = quant.per_group_kernel(kind, encoder, bool(scale_ue8m0), *mx)
        per_block = quant.GROUP_WARPS
    blocks = max(1, min(-(-rows * groups // per_block), quant.MAX_BLOCKS))
    row_stride, group_stride = (1, rows) if column_major_scales else (groups, 1)
    flat_scales = scales.T if column_major_scales else scales
    return [
        (
            kernel,
            blocks,
            threads,
            (xin, _flat(out), _flat(flat_scales), rows, cols, group_size, row_stride, group_stride),
        )
    ]


def _group_scales(rows, groups, column_major, scratch=_fresh, dtype=np.float32):
    """Per-group scales [rows, groups]: column-major ([groups, rows] underneath, m contiguous) or not."""
    return scratch((groups, rows), dtype).T if column_major else scratch((rows, groups), dtype)


def quantize_per_group(x, group_size, scale_ue8m0, column_major_scales, *, encoder=None):
    _backend()
    xin, kind, shape, n, aligned, owner = _input(x)
    rows, cols = shape
    out = _device.xp.empty(shape, dtype=np.uint8)
    scales = _group_scales(rows, -(-cols // group_size), column_major_scales)
    if rows == 0 or cols == 0:
        return out, scales
    _run(
        _per_group_launches(
            xin,
            kind,
            shape,
            aligned,
            out,
            scales,
            group_size,
            scale_ue8m0,
            column_major_scales,
            _encoder(encoder, _device.current()),
        )
    )
    del owner  # see quantize_static
    return out, scales


def quantize_per_group_e8m0(x, group_size, rounding, column_major_scales, *, encoder=None):
    """MX quantization: per group of ``group_size``, an E8M0 byte by ``rounding`` ('rceil', 'floor') and
    codes = encode(x / 2^(byte - 127)); the scales uint8 [rows, groups]."""
    _backend()
    xin, kind, shape, n, aligned, owner = _input(x)
    rows, cols = shape
    out = _device.xp.empty(shape, dtype=np.uint8)
    scales = _group_scales(rows, -(-cols // group_size), column_major_scales, dtype=np.uint8)
    if rows == 0 or cols == 0:
        return out, scales
    _run(
        _per_group_launches(
            xin,
            kind,
            shape,
            aligned,
            out,
            scales,
            group_size,
            False,
            column_major_scales,
            _encoder(encoder, _device.current()),
            rounding,
        )
    )
    del owner  # see quantize_static
    return out, scales


def quantize_launches(x, scheme, input_scale, group_size, scale_ue8m0, scratch, e8m0=None, column_major_scales=True):
    """A linear layer's activation quantization for inputs shaped, typed and aligned like ``x``
    (contiguous [M, K], 16-byte aligned) as launches (kernel, grid, block, args) whose codes and
    scales are taken from ``scratch(shape, dtype)``: (launches, codes, scale_a as scaled_mm takes
    it). The flat input is argument 0 of every launch. ``scheme`` is the weight's activation
    scheme; per-group float32 scales are column-major (the layout cuBLASLt's block scaling reads)
    unless ``column_major_scales`` is False (the grouped GEMMs read them row-major). These are the
    launches ``quantize_*`` make, on buffers the caller owns (``vtnumba.cuda.bound``, the MoE steps)."""
    _backend()
    xin, kind, shape, n, aligned, _ = _input(x)
    dev = _device.current()
    encoder = _encoder(None, dev)
    codes = scratch(shape, np.uint8)
    if scheme == "per_token":
        scales = scratch((shape[0], 1), np.float32)
        return _per_token_launches(xin, kind, shape, aligned, codes, scales, None, encoder), codes, scales.reshape(-1)
    if scheme == "dynamic":
        scale_a, partials, parts = _dynamic_buffers(n, aligned, dev, scratch)
        return _dynamic_launches(xin, kind, n, aligned, codes, scale_a, partials, parts, encoder, dev), codes, scale_a
    if scheme == "static":
        return _static_launches(xin, kind, n, aligned, codes, input_scale, encoder), codes, scale_array(input_scale)
    if e8m0 is not None:  # MX: E8M0 bytes, row-major (the seam's layout for them)
        scales = _group_scales(shape[0], -(-shape[1] // group_size), False, scratch, np.uint8)
        return (
            _per_group_launches(xin, kind, shape, aligned, codes, scales, group_size, False, False, encoder, e8m0),
            codes,
            scales,
        )
    major = bool(column_major_scales)
    scales = _group_scales(shape[0], -(-shape[1] // group_size), major, scratch)
    return (
        _per_group_launches(xin, kind, shape, aligned, codes, scales, group_size, scale_ue8m0, major, encoder),
        codes,
        scales,
    )


def decode(codes):
    _backend()
    return _device.current().decode_table[_as_device_array(codes)]


def dequantize(codes, scale, dtype):
    values = decode(codes)
    if isinstance(scale, (float, np.floating)):
        values = values * np.float32(scale)
    else:
        values = values * _as_device_array(scale).astype(np.float32, copy=False)
    return _arrays.round_float32(values, np.dtype(dtype))


def quantize_activation(x, input_scale, per_token, scale_ub):
    """(codes, scale_a as scaled_mm takes it) of x by the activation's scheme (``fp8_linear``'s)."""
    if per_token:
        codes, scales = quantize_per_token(x, scale_ub)
        return codes, scales.reshape(-1)
    if input_scale is None:
        return quantize_dynamic(x)
    return quantize_static(x, input_scale), scale_array(input_scale)


def encoder_in_use():
    """The encoder quantization uses on the current device ('hardware' or 'portable')."""
    _backend()
    return _encoder(None, _device.current())


__all__ = [
    "scale_array",
    "quantize_static",
    "quantize_dynamic",
    "quantize_per_token",
    "quantize_per_group",
    "quantize_per_group_e8m0",
    "quantize_launches",
    "quantize_activation",
    "decode",
    "dequantize",
    "encoder_in_use",
]
