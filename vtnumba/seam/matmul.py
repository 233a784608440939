"""The seam's matmul entry points (the C++ seam's ``MatmulFp8CutlassD`` / ``MatmulFp8CutlassPreQuantD``)
and its lever.

``matmul_fp8(x, w)`` is exactly ``vt.quantize_fp8`` by the weight's activation scheme followed by
``vt.scaled_mm`` -- no arithmetic of its own, so ``matmul_fp8(x, w)`` and
``matmul_fp8_prequant(vt.quantize_fp8(x, ...), w)`` are bitwise equal on every device. Scales are
applied as ``vt.scaled_mm`` applies them (DESIGN.md: the backend documents whether it folds
``scale_a * scale_b`` into one alpha). This module stays thin on purpose: it is on every linear
layer's path, and its budget is 2 us of host time per call over the ops it wraps.
"""

import numpy as np

from .. import _arrays
from .._arrays import Array, DType
from .._config import dense_cublaslt_fp8_enabled
from .._interop import interop
from ..ops import QuantizedActivation, scaled_mm
from . import bound
from .host_linear import HostLinear
from .weights import Fp8Weight, ResidentFp8

__all__ = ["quantize_activation", "matmul_fp8", "matmul_fp8_prequant", "dense_cublaslt_fp8_enabled"]

# How x [M, K] is quantized for a weight w is its format's to say (w.format.quantize, and the text a
# caller is told to write, w.format.quantize_call: seam.Fp8Format).


def _fp8_weight(weight):
    """The ``Fp8Weight`` of ``weight`` (itself, or a ``ResidentFp8``'s); TypeError for anything else."""
    if isinstance(weight, ResidentFp8):
        return weight.weight
    if isinstance(weight, Fp8Weight):
        return weight
    raise TypeError(f"weight must be an Fp8Weight or a ResidentFp8, got {type(weight).__name__}")


def _weight_for(weight, x, name):
    """The ``Fp8Weight`` whose arrays live where ``x`` does.

    A host weight used with a GPU input is made resident on that GPU once (``ResidentFp8`` caches it,
    so later calls reuse the upload); every other device mismatch is an error."""
    w = _fp8_weight(weight)
    if isinstance(x, np.ndarray):
        if w.device != "cpu":
            raise ValueError(f"{name} must be on the weight's device {w.device}, got a numpy array (cpu)")
        if w.data is None:
            w.host_data()  # raises: the codes were released after an upload
        return w
    x_device = _arrays.device_of(x, name)
    if w.device == x_device:
        return w
    if w is weight and w.device == "cpu":
        return ResidentFp8(w, x_device).weight
    raise ValueError(f"{name} must be on the weight's device {w.device}, got an array on {x_device}")


@interop
def quantize_activation(x: Array, weight: Fp8Weight | ResidentFp8) -> QuantizedActivation:
    """``x`` [M, K] quantized as ``weight`` (an ``Fp8Weight`` / ``ResidentFp8``) expects its
    activations: by its ``activation_scheme``, with its ``input_scale`` when static. The result
    feeds ``matmul_fp8_prequant(q, weight)``."""
    w = _fp8_weight(weight)
    _arrays.device_of(x, "x")
    _rows(x, w, "x")  # K must be the weight's: codes of another width would only fail at the GEMM
    return w.format.quantize(x, w.input_scale)


# -- the bound fast path on the GPU ------------------------------------------------------------
# A layer called again with an input of the same signature replays the call bound after its first
# full call (``seam.bound``, ``vtnumba.cuda.bound``): the full path below validates and chooses once
# per signature. The per-call checks are what could change between calls: the input's type,
# contiguity, alignment, shape and dtype, the output dtype, the device, and the settings that steer
# the kernel choice (in the key). Anything else falls back to the full path. A binding writes nothing
# that outlives a call (its temporaries are allocated per call), so it serves every stream.
_gpu = None  # (cupy.ndarray, cupy.cuda.get_current_stream), bound once cupy is in use


def _gpu_parts():
    global _gpu
    cupy_ndarray = _arrays._cupy_ndarray()
    if cupy_ndarray is not None and _gpu is None:
        import cupy

        _gpu = (cupy_ndarray, cupy.cuda.get_current_stream)
    return _gpu


def _bound_key(x, w, out_dtype):
    """The signature a bound call is kept under, or None when x cannot take the bound path."""
    if not x._c_contiguous or x.data.ptr & 15 or w.data is None:
        return None
    return bound.linear_key(x.shape, x.dtype, out_dtype, x.data.device_id)


def _host_weight(weight):
    return weight.weight if type(weight) is ResidentFp8 else weight


def _replay(binding, x, stream_ptr):
    """y of the bound call for x (cupy), shaped as x's leading dimensions."""
    y = bound.linear_for_stream(binding, stream_ptr)(x if len(x.shape) == 2 else x.reshape(-1, x.shape[-1]), stream_ptr)
    return y if len(x.shape) == 2 else y.reshape(*x.shape[:-1], y.shape[1])


def _bind_after_full_call(x, weight, out_dtype, w_device):
    """Bind ``weight``'s call for x's signature (called after a full-path call succeeded)."""
    w = _host_weight(weight)
    key = _bound_key(x, w, out_dtype)
    if key is None or not x.size:
        return
    x2d = x if len(x.shape) == 2 else x.reshape(-1, x.shape[-1])
    bound.bind_linear(w, key, x2d, w_device, x.dtype if out_dtype is None else out_dtype)


@interop
def matmul_fp8(x: Array, weight: Fp8Weight | ResidentFp8, out_dtype: DType | None = None) -> Array:
    """``y = dequant(quant(x)) @ dequant(weight).T + bias`` as FP8 W8A8: ``x`` [..., K] (float32,
    float16 or bfloat16; numpy or cupy) is quantized by the weight's ``activation_scheme`` ('static':
    ``weight.input_scale``; 'dynamic': per-tensor; 'per_token': one scale per row of the flattened
    [M, K]), then ``vt.scaled_mm`` with the weight's codes, scale and bias. Returns [..., N] in
    ``out_dtype`` (default: x's dtype), on x's device.

    ``weight`` is an ``Fp8Weight`` or a ``ResidentFp8``; a host ``Fp8Weight`` with a GPU ``x`` is
    uploaded once (cached) and reused. On the GPU the ops run on cupy's current device and stream,
    as cupy's own calls do: make x's device current (``with cupy.cuda.Device(i):``). A GPU call
    with an input signature seen before replays the call bound at its first occurrence
    (``seam.bound``): the same arithmetic, a fraction of the host time. At decode (M <= 16) an eager
    call is then one fused launch, and a call captured into a CUDA graph the quantization kernel and
    the GEMM (``VT_DECODE_PATH``; ``seam.explain(weight)`` says what each signature runs).
    """
    gpu = _gpu if _gpu is not None else _gpu_parts()
    if gpu is not None and type(x) is gpu[0]:
        w = _host_weight(weight)
        calls = w.bound_calls
        if calls:
            binding = calls.get(_bound_key(x, w, out_dtype))
            if binding is not None:
                return _replay(binding, x, gpu[1]().ptr)
        y, w_device = _matmul_fp8(x, weight, out_dtype)
        if type(w) is Fp8Weight:
            _bind_after_full_call(x, weight, out_dtype, w_device)
        return y
    if type(x) is np.ndarray and x.dtype in _HOST_DTYPES:
        w = _host_weight(weight)
        if (
            type(w) is Fp8Weight
            and w.data is not None
            and w.device == _arrays.CPU
            and x.shape
            and x.shape[-1] == w.shape[1]
        ):
            call = w.host_call
            if call is None:
                call = HostLinear.of(w) or False
                object.__setattr__(w, "host_call", call)  # a frozen dataclass: its one cache
            if call:
                out = x.dtype if out_dtype is None else _arrays.out_dtype_of(out_dtype)
                if len(x.shape) == 2:
                    return call(x, out)
                return call(x.reshape(-1, x.shape[-1]), out).reshape(*x.shape[:-1], w.shape[0])
    return _matmul_fp8(x, weight, out_dtype)[0]


# numpy inputs the prepared host call takes as they are (float64 is cast by the interop layer first,
# and anything else is refused by the full path's checks)
_HOST_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), _arrays.BFLOAT16)


def _matmul_fp8(x, weight, out_dtype=None):
    """The full path of ``matmul_fp8``: (y, the Fp8Weight used, on x's device)."""
    w = _weight_for(weight, x, "x")
    q = w.format.quantize(_rows(x, w, "x"), w.input_scale)
    y = scaled_mm(
        q.data,
        w.data,
        q.scale,
        w.weight_scale,
        out_dtype=x.dtype if out_dtype is None else out_dtype,
        bias=w.bias,
        block_size=w.block_size,
    )
    return _unflatten(y, x.shape, w), w


def _rows(x, w, name):
    """x [..., K] as [M, K], as upstream's apply_fp8_linear does (input.view(-1, K)); per-token
    scales are then one per flattened row."""
    shape = x.shape
    k = w.shape[1]
    if len(shape) < 1 or shape[-1] != k:
        raise ValueError(
            f"{name} must be [..., K] with K = {k} (the weight is [N, K] = {w.shape}), got shape {tuple(shape)}"
        )
    return x if len(shape) == 2 else x.reshape(-1, k)


def _unflatten(y, shape, w):
    """y [M, N] back to the input's leading dimensions: [..., N]."""
    return y if len(shape) == 2 else y.reshape(*shape[:-1], w.shape[0])


@interop
def matmul_fp8_prequant(
    q: QuantizedActivation, weight: Fp8Weight | ResidentFp8, out_dtype: DType | None = None
) -> Array:
    """The GEMM of ``matmul_fp8`` on an activation already quantized (``vt.QuantizedActivation``,
    codes [..., K]), for a caller that quantizes once and feeds several layers. ``q.scheme`` must
    be the weight's ``activation_scheme``; the GEMM uses ``q.scale`` as it is. ``out_dtype``
    defaults to float32 (codes carry no float dtype to inherit).
    """
    if not isinstance(q, QuantizedActivation):
        raise TypeError(f"q must be a vt.QuantizedActivation (from vt.quantize_fp8), got {type(q).__name__}")
    w = _weight_for(weight, q.data, "q.data")
    if q.scheme != w.activation_scheme:
        raise ValueError(
            f"q.scheme must be the weight's activation_scheme {w.activation_scheme!r}, "
            f"got {q.scheme!r}; quantize with {w.format.quantize_call} "
            f"(or seam.quantize_activation(x, weight))"
        )
    if w.block_size is not None and q.group_size != w.block_size[1]:
        raise ValueError(
            f"q.group_size must be the weight's bk = {w.block_size[1]} (block_size {w.block_size}): "
            f"the GEMM scales each K-block by one activation scale, got {q.group_size}"
        )
    if w.block_size is not None and q.scale_format != w.activation_scale_format:
        raise ValueError(
            f"q.scale_format must be the weight's activation_scale_format {w.activation_scale_format!r}, "
            f"got {q.scale_format!r}; quantize with {w.format.quantize_call} "
            f"(or seam.quantize_activation(x, weight))"
        )
    y = scaled_mm(
        _rows(q.data, w, "q.data"),
        w.data,
        q.scale,
        w.weight_scale,
        out_dtype=np.float32 if out_dtype is None else out_dtype,
        bias=w.bias,
        block_size=w.block_size,
    )
    return _unflatten(y, q.data.shape, w)
