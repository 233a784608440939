"""The torch custom ops -- ``torch.ops.vtnumba.fp8_linear`` (``Fp8Linear``) and
``torch.ops.vtnumba.moe_fp8`` (``Fp8Experts``) -- and the forward paths they share with the
layers' eager calls.

Under ``torch.compile`` a layer's forward is its op (``torch.library``, with a fake implementation
for shapes and dtypes), so a converted model traces with no graph break and ``torch.cuda.graph``
captures it. In eager mode the layers call the same paths directly: a custom op's dispatch costs
microseconds a decode step pays per layer and buys nothing outside tracing.

An op sees only tensors, so it finds the seam's view of a layer's weights by the buffers' addresses
(``_state_for``, ``_experts_state_for``); an eager layer keeps that state on itself.
"""

import weakref

import numpy as np
import torch

from .._config import torch_thread_cap
from .._interop import on_torch_stream, to_torch
from ..ops import ActivationScheme
from ..seam import Fp8Experts as SeamExperts
from ..seam import Fp8Weight, matmul_fp8
from ..seam import bound as seam_bound
from ..seam import moe_fp8 as seam_moe_fp8
from ..seam.experts import _bound_holder, moe_debug_checks
from ._common import (
    _DTYPE_NAMES,
    _DTYPES,
    _NUMPY_OUT,
    _current_device,
    _grad_enabled,
    _host_array,
    _on_device,
    _raw_stream,
    _refuse_grad,
    _torch_bytes,
    _torch_threads,
    _view,
)

# -- the layer's state on a device ------------------------------------------------------------------
# A layer's forward on a device needs its weight as the seam sees it there (an Fp8Weight whose
# arrays view the buffers) and, on a GPU, its bound calls. That state is keyed by the buffers it
# views: the eager path keeps it on the module (dropped when the buffers move); the custom op finds
# it by the tensors' addresses (``_state_for``).


class _GpuState:
    """The FP8 weight on one GPU as the seam sees it (its bound calls live on it: ``seam.bound``)."""

    __slots__ = ("index", "device", "weight", "calls", "alloc")

    def __init__(self, weight, index):
        self.index, self.device = index, torch.device("cuda", index)
        self.weight = weight
        self.calls = seam_bound.table_of(weight)
        self.alloc = _torch_bytes(self.device)


def _seam_weight(parts):
    """A trusted Fp8Weight viewing the layer's buffers where they are (they were validated when the
    layer was built). A GPU layer's static scale stays on the device (read there, never copied);
    a CPU layer's is read as a host float32."""
    weight, weight_scale, input_scale, bias, scheme, block, ue8m0, source = parts
    if input_scale is not None:
        input_scale = _view(input_scale) if input_scale.is_cuda else np.float32(input_scale.item())
    per_channel = block is None and weight_scale.numel() > 1
    return Fp8Weight._trusted(
        _view(weight.view(torch.uint8)),
        _view(weight_scale),
        input_scale,
        None if bias is None else _view(bias),
        ActivationScheme(scheme),
        source,
        per_channel,
        None if block is None else tuple(block),
        ue8m0,
    )


_STATES = {}  # the custom op's states: (buffer addresses, scheme, block, ue8m0) -> _GpuState
_MAX_STATES = 4096


def _state_for(weight, weight_scale, input_scale, bias, scheme, block, ue8m0, index):
    key = (
        weight.data_ptr(),
        weight_scale.data_ptr(),
        0 if input_scale is None else input_scale.data_ptr(),
        0 if bias is None else bias.data_ptr(),
        tuple(weight.shape),
        scheme,
        block,
        ue8m0,
        index,
    )
    state = _STATES.get(key)
    if state is None:
        if len(_STATES) >= _MAX_STATES:
            _STATES.clear()
        parts = (weight, weight_scale, input_scale, bias, scheme, block, ue8m0, None)
        state = _STATES[key] = _GpuState(_on_device(index, lambda: _seam_weight(parts)), index)
    return state


# -- the forward ----------------------------------------------------------------------------------


def _check_input(x, k):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x must be [..., K] with K = {k} (the layer's in_features), got shape {tuple(x.shape)}")


def _gpu_forward(state, x, out_dtype, quant_key=None):
    """The GPU forward: the bound call when x's signature has one (the module docstring), else the
    full path, which binds the signature for the next call."""
    if x.requires_grad and _grad_enabled():
        _refuse_grad(x)
    if out_dtype is None:
        out_dtype = x.dtype
    binding = state.calls.get(_linear_key(x, out_dtype, state.index))
    if binding is not None and x.is_contiguous() and not x.data_ptr() & 15 and _current_device() == state.index:
        return _run_bound(state, binding, x, out_dtype, quant_key)
    return _gpu_full(state, x, out_dtype)


def _linear_key(x, out_dtype, index):
    """The seam's signature key of a torch call (numpy dtypes; None for a dtype no binding takes)."""
    return seam_bound.linear_key(x.shape, _NUMPY_OUT.get(x.dtype), _NUMPY_OUT.get(out_dtype), index)


# The last activation quantized on each GPU by an eager forward: (x, its version, how it was
# quantized, the stream, the scratch block holding its codes and scales). The layers that read one
# input -- q, k and v; gate and up -- quantize it once: the next layer given the very same tensor,
# unchanged (torch bumps ``_version`` on every in-place write), quantized the same way on the same
# stream, takes these codes instead of making them again. The bytes are the same by construction.
# Only eager forwards of the split path share (the fused decode launch quantizes inside the GEMV
# and leaves no codes), and never while a CUDA graph is being captured: a graph must hold its own
# quantization (its input is rewritten between replays, and nothing runs during a capture to fill
# codes another call could read). Inside torch.compile each op stays self-contained. Tensors made
# under ``torch.inference_mode()`` keep no version counter, so an in-place write to one could not
# be seen: they never share (``torch.no_grad()``, as transformers' ``generate`` runs, does).
_LAST_QUANT = {}


def _stream_is_capturing(stream):
    global _stream_is_capturing
    import cupy

    _stream_is_capturing = cupy.cuda.runtime.streamIsCapturing
    return _stream_is_capturing(stream)


def _run_bound(state, binding, x, out_dtype, quant_key=None):
    """The bound call: y (and the split path's scratch block) from torch's allocator, on torch's
    current stream; the eager or the graph call of the binding by whether the stream is capturing."""
    stream = _raw_stream(state.index)
    capturing = _stream_is_capturing(stream) if binding.by_regime else None  # asked once, when it matters
    bound = binding.graph if capturing else binding.eager
    y = torch.empty((*x.shape[:-1], bound.out_shape[1]), dtype=out_dtype, device=state.device)
    if not bound.scratch_bytes:  # the fused decode launch: x in, y out, nothing else
        bound.enqueue(x.data_ptr(), y.data_ptr(), 0, stream)
        return y
    scratch = torch.empty(bound.scratch_bytes, dtype=torch.uint8, device=state.device)
    if quant_key is not None and not x.is_inference() and capturing is None:
        capturing = _stream_is_capturing(stream)
    if quant_key is None or x.is_inference() or capturing:
        bound.enqueue(x.data_ptr(), y.data_ptr(), scratch.data_ptr(), stream, state.alloc)
        return y
    quant_key = (quant_key, x.shape, x.dtype, stream)
    last = _LAST_QUANT.get(state.index)
    if last is not None and last[0]() is x and last[1] == x._version and last[2] == quant_key:
        bound.enqueue(x.data_ptr(), y.data_ptr(), scratch.data_ptr(), stream, state.alloc, last[3].data_ptr())
    else:
        bound.enqueue(x.data_ptr(), y.data_ptr(), scratch.data_ptr(), stream, state.alloc)
        _LAST_QUANT[state.index] = (weakref.ref(x), x._version, quant_key, scratch)
    return y


def _gpu_full(state, x, out_dtype):
    """The first call of a signature (bind it, then run the bound call), or the full path for what
    cannot be bound: a strided or misaligned input, float64, or a signature first met while a CUDA
    graph is being captured (binding allocates what it keeps, which a capture must not)."""
    import cupy

    _check_input(x, state.weight.shape[1])
    index = state.index
    with cupy.cuda.Device(index), torch.cuda.device(index):
        if (
            x.dtype in _DTYPE_NAMES
            and x.is_contiguous()
            and not x.data_ptr() & 15
            and x.numel() > 0
            and not cupy.cuda.runtime.streamIsCapturing(_raw_stream(index))
        ):
            x2d = _view(x.reshape(-1, x.shape[-1]))
            # what the binding keeps (a copy of a scale, say) comes from cupy's own pool, never
            # from torch's or a graph's
            with cupy.cuda.using_allocator(cupy.get_default_memory_pool().malloc), on_torch_stream(index):
                binding = seam_bound.bind_linear(
                    state.weight, _linear_key(x, out_dtype, index), x2d, state.weight, _NUMPY_OUT[out_dtype]
                )
            return _run_bound(state, binding, x, out_dtype)
        return matmul_fp8(x, state.weight, out_dtype)  # results and temporaries from torch's allocator


def _cpu_forward(parts, x, out_dtype):
    """The CPU forward through the full path of ``seam.matmul_fp8`` (the custom op's, and a layer's
    where its prepared call does not serve: ``_host_forward``)."""
    if x.requires_grad and _grad_enabled():
        _refuse_grad(x)
    _check_input(x, parts[0].shape[1])
    with torch_thread_cap(_torch_threads()):  # torch owns the cores (vtnumba._config's note)
        return matmul_fp8(x, _seam_weight(parts), out_dtype)


def _host_forward(host, x, out_dtype, input_scale):
    """The CPU forward through the layer's prepared call ``host`` (``seam.HostLinear``): x a CPU
    tensor of float32, float16 or bfloat16 (its caller looked); the same backend calls, and so the
    same bytes, as ``_cpu_forward`` (seam/host_linear.py)."""
    if x.requires_grad:
        if _grad_enabled():
            _refuse_grad(x)
        x = x.detach()  # numpy() refuses a tensor that requires grad
    n, k = host.codes.shape
    _check_input(x, k)
    # x's rows and y's shape made in numpy views: inside a converted model's forward, torch's view of y
    # took 9.0 us a layer, and x's reshape was part of the 7 us before the call (benchmarks/RESULTS.md,
    # 2026-12-07 15:35-15:56)
    xs = _host_array(x)
    with torch_thread_cap(_torch_threads()):  # torch owns the cores (vtnumba._config's note)
        y = host(
            xs if xs.ndim == 2 else xs.reshape(-1, k),
            _NUMPY_OUT[x.dtype if out_dtype is None else out_dtype],
            input_scale,
        )
    return to_torch(y if xs.ndim == 2 else y.reshape(xs.shape[:-1] + (n,)), torch)


# -- the custom op (torch.compile) -------------------------------------------------------------------


@torch.library.custom_op("vtnumba::fp8_linear", mutates_args=())
def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    scheme: str,
    block_size: list[int] | None,
    scale_ue8m0: bool,
    out_dtype: str,
) -> torch.Tensor:
    """``Fp8Linear``'s forward as a torch op: ``seam.matmul_fp8`` of x with the FP8 weight held by
    these tensors (``weight`` float8_e4m3fn [N, K]; scales and bias as ``Fp8Linear`` holds them),
    ``scheme`` its activation scheme, ``out_dtype`` 'float32', 'float16', 'bfloat16' or '' (x's)."""
    block = None if block_size is None else tuple(block_size)
    out = _DTYPES.get(out_dtype)
    if x.is_cuda:
        state = _state_for(weight, weight_scale, input_scale, bias, scheme, block, scale_ue8m0, x.get_device())
        return _gpu_forward(state, x, out)
    return _cpu_forward((weight, weight_scale, input_scale, bias, scheme, block, scale_ue8m0, None), x, out)


@fp8_linear.register_fake
def _fp8_linear_fake(x, weight, weight_scale, input_scale, bias, scheme, block_size, scale_ue8m0, out_dtype):
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=_DTYPES.get(out_dtype, x.dtype))


# -- the experts (Fp8Experts) ---------------------------------------------------------------------
# An experts layer's state on a device is its two seam.Fp8Experts (gate_up [E, 2I, H], down
# [E, H, I]) as the seam sees them there: on a GPU, views of the buffers, and the seam keeps the
# grouped calls it binds on those objects, so they are built once per device. The seam's
# constructor checks every scale and keeps host copies of the weight scales on the CPU and of the
# static input scales everywhere, so a state also records the buffers' versions (torch bumps
# ``_version`` on every in-place write): a state whose buffers were written since is rebuilt.


def _versions(tensors):
    """The buffers' version counters (-1 for a tensor made under inference mode, which has none)."""
    return tuple(-1 if t is None or t.is_inference() else t._version for t in tensors)


def _seam_experts(codes, scale, input_scale, scheme, block, ue8m0, act_format, source=None):
    """A seam Fp8Experts over one weight's buffers where they are (numpy on the CPU, cupy on a GPU)."""
    return SeamExperts(
        _view(codes.view(torch.uint8)),
        _view(scale),
        input_scale=None if input_scale is None else _view(input_scale),
        activation_scheme=scheme,
        source=source,
        block_size=block,
        scale_ue8m0=ue8m0,
        activation_scale_format=act_format or None,
    )


def _experts_pair(parts, source=None):
    """(gate_up, down) seam Fp8Experts of an experts layer's parts: (gate_up codes, scale, input
    scale, down codes, scale, input scale, scheme, block, ue8m0, activation scale format)."""
    tail = parts[6:]
    return (_seam_experts(*parts[0:3], *tail, source=source), _seam_experts(*parts[3:6], *tail, source=source))


_EXPERT_STATES = {}  # the op's GPU states: (addresses, shapes, versions, formats, device) -> (gate_up, down)


def _experts_state_for(parts, index):
    tensors = parts[:6]
    key = (
        tuple(0 if t is None else t.data_ptr() for t in tensors),
        tuple(parts[0].shape),
        tuple(parts[3].shape),
        _versions(tensors),
        parts[6:],
        index,
    )
    pair = _EXPERT_STATES.get(key)
    if pair is None:
        if len(_EXPERT_STATES) >= _MAX_STATES:
            _EXPERT_STATES.clear()
        pair = _EXPERT_STATES[key] = _on_device(index, lambda: _experts_pair(parts))
    return pair


def _check_experts_input(x, top_k_index, top_k_weights, hidden):
    for name, t in (("hidden_states", x), ("top_k_index", top_k_index), ("top_k_weights", top_k_weights)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() < 1 or x.shape[-1] != hidden:
        raise ValueError(
            f"hidden_states must be [..., H] with H = {hidden} (the experts' hidden size), got shape {tuple(x.shape)}"
        )
    if top_k_index.dim() < 1:
        raise ValueError(f"top_k_index must be [T, k] (k experts per token), got shape {tuple(top_k_index.shape)}")


def _rows(t, k):
    """[..., k] as [T, k] (the seam checks T against the tokens)."""
    return t if t.dim() == 2 else t.reshape(-1, k)


def _moe_forward(pair, x, top_k_index, top_k_weights):
    """``seam.moe_fp8`` of tokens x [..., H] routed by top_k_index / top_k_weights [T, k]:
    [..., H] in x's dtype, from torch's allocator on torch's current stream. On a GPU, a signature
    seen before replays its bound call (``_moe_bound``); else the seam's full path through its
    interop."""
    if x.requires_grad and _grad_enabled():
        _refuse_grad(x, "hidden_states", "Fp8Experts")
    gate_up, down = pair
    hidden = gate_up.shape[2]
    _check_experts_input(x, top_k_index, top_k_weights, hidden)
    k = top_k_index.shape[-1]
    x2, ids, weights = x.reshape(-1, hidden), _rows(top_k_index, k), _rows(top_k_weights, k)
    if not x.is_cuda:
        with torch_thread_cap(_torch_threads()):  # torch owns the cores (vtnumba._config's note)
            return seam_moe_fp8(x2, gate_up, down, ids, weights).reshape(x.shape)
    y = _moe_bound(gate_up, down, x2, ids, weights)
    if y is None:
        y = seam_moe_fp8(x2, gate_up, down, ids, weights)
    return y.reshape(x.shape)


# the dtypes a bound MoE call's key names, as the seam's (numpy) keys do
_KEY_DTYPES = {**_NUMPY_OUT, torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32)}


def _moe_bound(gate_up, down, x, ids, weights):
    """y of the bound call for x [T, H] and the routing [T, k], or None for the full path: a
    signature met for the first time (the seam's full path runs it, then binds it for the next call),
    one the binding refused (``bind_moe``: a prefill-sized call), a strided or misaligned input, or
    one on another device than the current. Bound calls live on the seam experts, under the seam's
    keys (``seam.bound.moe_key``, numpy dtypes), shared with cupy callers; y and the
    scratch come from torch's allocator, the launches go to torch's current stream, with no
    interop on the way."""
    index = x.get_device()
    x_dtype, ids_dtype, w_dtype = _KEY_DTYPES.get(x.dtype), _KEY_DTYPES.get(ids.dtype), _KEY_DTYPES.get(weights.dtype)
    if (
        x_dtype is None
        or ids_dtype is None
        or w_dtype is None
        or not x.numel()
        or not ids.numel()
        or x.data_ptr() & 15
        or not (x.is_contiguous() and ids.is_contiguous() and weights.is_contiguous())
        or ids.get_device() != index
        or weights.get_device() != index
        or _current_device() != index
        or moe_debug_checks()
    ):
        return None
    key = seam_bound.moe_key(x.shape, x_dtype, ids.shape, ids_dtype, weights.shape, w_dtype, down, index)
    calls = _bound_holder(gate_up).bound_calls
    bound = calls.get(key) if calls else None  # one read: another thread may clear the table
    if bound is not None:
        y = torch.empty(bound.out_shape, dtype=x.dtype, device=x.device)
        scratch = torch.empty(bound.scratch_bytes, dtype=torch.uint8, device=x.device)
        bound.enqueue(
            x.data_ptr(), ids.data_ptr(), weights.data_ptr(), y.data_ptr(), scratch.data_ptr(), _raw_stream(index)
        )
        return y
    return None  # the seam's full path binds this signature (seam.experts.bind_moe_call)


@torch.library.custom_op("vtnumba::moe_fp8", mutates_args=())
def moe_fp8(
    x: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scale: torch.Tensor,
    gate_up_input_scale: torch.Tensor | None,
    down: torch.Tensor,
    down_scale: torch.Tensor,
    down_input_scale: torch.Tensor | None,
    scheme: str,
    block_size: list[int] | None,
    scale_ue8m0: bool,
    activation_scale_format: str,
) -> torch.Tensor:
    """``Fp8Experts``' forward as a torch op: ``seam.moe_fp8`` of tokens x [..., H] routed by
    ``top_k_index`` (int [T, k]; ids outside [0, E) route nothing) with ``top_k_weights`` [T, k],
    over the experts these tensors hold (``gate_up`` float8_e4m3fn [E, 2I, H], ``down`` [E, H, I];
    scales as ``Fp8Experts`` holds them: float32, or uint8 E8M0 bytes for MXFP8), ``scheme`` their
    activation scheme, ``activation_scale_format`` 'float32', 'e8m0' or '' (the seam's default for
    the weights' format). Returns [..., H] in x's dtype."""
    block = None if block_size is None else tuple(block_size)
    parts = (
        gate_up,
        gate_up_scale,
        gate_up_input_scale,
        down,
        down_scale,
        down_input_scale,
        scheme,
        block,
        scale_ue8m0,
        activation_scale_format,
    )
    if x.is_cuda:
        return _moe_forward(_experts_state_for(parts, x.get_device()), x, top_k_index, top_k_weights)
    # the CPU's state is rebuilt per call (tens of microseconds against milliseconds of GEMMs): an
    # address alone could name a freed buffer's successor, whose scales a cached state would miss
    return _moe_forward(_experts_pair(parts), x, top_k_index, top_k_weights)


@moe_fp8.register_fake
def _moe_fp8_fake(
    x,
    top_k_index,
    top_k_weights,
    gate_up,
    gate_up_scale,
    gate_up_input_scale,
    down,
    down_scale,
    down_input_scale,
    scheme,
    block_size,
    scale_ue8m0,
    activation_scale_format,
):
    # float64 tokens are computed in float32 (the seam casts them), as the eager path returns
    return x.new_empty(x.shape, dtype=torch.float32 if x.dtype == torch.float64 else x.dtype)
