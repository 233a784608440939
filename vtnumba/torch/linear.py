"""FP8 linear layers for torch models: ``Fp8Linear``, ``convert`` and ``calibrate`` (the extra ``torch``).

    import torch, vtnumba.torch as vtt
    model = vtt.convert(model, "per_token")      # every nn.Linear -> Fp8Linear, in place (on its device)
    with torch.inference_mode():
        y = model(x)
    compiled = torch.compile(model, fullgraph=True)            # the layers are torch custom ops
    graphed = torch.compile(model, mode="reduce-overhead")     # ... that CUDA graphs capture

An ``Fp8Linear`` holds its FP8 weight as torch buffers -- ``weight`` (torch.float8_e4m3fn [N, K]),
``weight_scale`` (float32: [1] per-tensor, [N] per-channel, [ceil(N/bn), ceil(K/bk)] per block),
``input_scale`` (float32 [1], static activations only) and ``bias`` -- so ``model.to(...)``,
``state_dict()`` and ``load_state_dict`` treat them as torch treats any buffer. Its forward is exactly
``seam.matmul_fp8`` (quantize the activation by the layer's scheme, then the FP8 GEMM), bitwise.

How a GPU forward runs (the path a decode step takes, token after token): the first call with an
input signature (shape, dtype, output dtype, device, lever) binds the layer's work once
(``vtnumba.cuda.bound``: prepared quantization launches, the chosen GEMM with its cuBLASLt
descriptor); every later call allocates the output and one scratch block from torch's caching
allocator on torch's current stream, writes three pointers and enqueues. So results are ordinary
torch tensors (counted by ``torch.cuda.memory_allocated``), nothing synchronizes, and
``torch.cuda.graph`` captures a converted model in its default mode. Under ``torch.compile`` the
forward is the custom op ``torch.ops.vtnumba.fp8_linear`` (``torch.library``, with a fake
implementation for shapes and dtypes), so a converted model traces with no graph break.

A layer whose buffers are on the CPU and meets a GPU input makes its weight resident on that GPU
once (``seam.ResidentFp8``, accounted in ``seam.load_stats()``) and runs there, as earlier versions
did; ``model.to("cuda")`` moves the buffers instead.

Inference only: vtnumba's ops are not differentiable, so a forward under grad mode whose input
requires grad raises (the gradient would be lost); run under ``torch.no_grad()`` or
``torch.inference_mode()``.

This module's ``import torch`` is the real torch: Python 3 imports are absolute, so the name is not
this module's own (tests/test_interop.py checks it).
"""

import dataclasses
import weakref
from typing import Optional

import numpy as np

try:
    import torch
except ImportError:
    raise ImportError("vtnumba.torch needs torch, which is not installed: pip install 'vtnumba[torch]'") from None
from torch import nn

if not hasattr(torch.library, "custom_op"):  # the layers are torch custom ops (torch.library, 2.4+)
    raise ImportError(f"vtnumba.torch needs torch >= 2.4 (torch.library.custom_op), found torch {torch.__version__}: "
                      f"pip install 'torch>=2.4'")

from .. import _arrays
from .._config import kernel_settings
from .._format import E4M3_MAX, F32_GROUP_EPS
from .._interop import on_torch_stream, to_native, to_torch
from ..ops import ActivationScheme, encode_e4m3
from ..seam import Fp8Config, Fp8Weight, ResidentFp8, load_fp8_linear, matmul_fp8
from ..seam import parallel as _parallel

__all__ = ["Fp8Linear", "RowParallelFp8Linear", "convert", "calibrate", "shard_linear", "shard_model"]

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
_NUMPY_OUT = {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
              torch.bfloat16: _arrays.BFLOAT16}


def _scheme(scheme, name="scheme"):
    try:
        return ActivationScheme(scheme)
    except ValueError:
        raise ValueError(f"{name} must be one of {', '.join(ActivationScheme)}, got {scheme!r}") from None


def _host_scalar(value, name):
    """A scale given as a number or a one-element tensor / array, as a Python float."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar or a one-element tensor, got shape {tuple(value.shape)}")
        return float(value.detach().reshape(()).cpu())
    return value


def _out_dtype(out_dtype):
    """A torch float dtype, a numpy dtype or a name, as a torch dtype (None stays None)."""
    if out_dtype is None or isinstance(out_dtype, torch.dtype) and out_dtype in _DTYPE_NAMES:
        return out_dtype
    try:
        return _DTYPES[_arrays.out_dtype_of(out_dtype).name]
    except (TypeError, ValueError, KeyError):
        raise ValueError(f"out_dtype must be torch.float32, torch.float16 or torch.bfloat16 (or None: x's dtype), "
                         f"got {out_dtype!r}") from None


def _tensor(arr):
    """A torch tensor owning a copy of a host array, or sharing a device array's memory."""
    if isinstance(arr, np.ndarray):
        return to_torch(np.array(arr, copy=True), torch)
    return to_torch(arr, torch)


# -- the layer's state on a device ------------------------------------------------------------------
# A layer's forward on a device needs its weight as the seam sees it there (an Fp8Weight whose
# arrays view the buffers) and, on a GPU, its bound calls. That state is keyed by the buffers it
# views: the eager path keeps it on the module (dropped when the buffers move); the custom op finds
# it by the tensors' addresses (``_state_for``).

class _GpuState:
    """The FP8 weight on one GPU as the seam sees it, and its bound calls by input signature."""

    __slots__ = ("index", "device", "weight", "bound", "alloc")

    def __init__(self, weight, index):
        self.index, self.device = index, torch.device("cuda", index)
        self.weight = weight
        self.bound = {}
        self.alloc = _torch_bytes(self.device)


def _torch_bytes(device):
    """alloc(nbytes) -> a torch uint8 tensor on ``device`` (a temporary a bound call may need)."""
    return lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=device)


def _view(t):
    """A numpy (CPU) or cupy (GPU) array viewing tensor ``t`` (float8 as uint8 codes, bfloat16
    through its bits)."""
    return to_native(t.detach(), "tensor")


def _seam_weight(parts):
    """A trusted Fp8Weight viewing the layer's buffers where they are (they were validated when the
    layer was built). A GPU layer's static scale stays on the device (read there, never copied);
    a CPU layer's is read as a host float32."""
    weight, weight_scale, input_scale, bias, scheme, block, ue8m0, source = parts
    if input_scale is not None:
        input_scale = _view(input_scale) if input_scale.is_cuda else np.float32(input_scale.item())
    per_channel = block is None and weight_scale.numel() > 1
    return Fp8Weight._trusted(_view(weight.view(torch.uint8)), _view(weight_scale), input_scale,
                              None if bias is None else _view(bias), ActivationScheme(scheme), source, per_channel,
                              None if block is None else tuple(block), ue8m0)


_STATES = {}  # the custom op's states: (buffer addresses, scheme, block, ue8m0) -> _GpuState
_MAX_STATES = 4096


def _state_for(weight, weight_scale, input_scale, bias, scheme, block, ue8m0, index):
    key = (weight.data_ptr(), weight_scale.data_ptr(), 0 if input_scale is None else input_scale.data_ptr(),
           0 if bias is None else bias.data_ptr(), tuple(weight.shape), scheme, block, ue8m0, index)
    state = _STATES.get(key)
    if state is None:
        if len(_STATES) >= _MAX_STATES:
            _STATES.clear()
        parts = (weight, weight_scale, input_scale, bias, scheme, block, ue8m0, None)
        state = _STATES[key] = _GpuState(_on_device(index, lambda: _seam_weight(parts)), index)
    return state


def _on_device(index, fn):
    import cupy

    with cupy.cuda.Device(index):
        return fn()


# -- the forward ----------------------------------------------------------------------------------

_grad_enabled = torch.is_grad_enabled
_current_device = torch._C._cuda_getDevice if hasattr(torch._C, "_cuda_getDevice") else torch.cuda.current_device
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _refuse_grad(x):
    raise ValueError("x must not require grad: vtnumba's ops are not differentiable, so its gradient would be "
                     "lost; got a tensor with requires_grad=True. Call under torch.no_grad() or "
                     "torch.inference_mode(), or pass x.detach()")


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
    entry = state.bound.get((x.shape, x.dtype, out_dtype, kernel_settings()))
    if entry is not None and x.is_contiguous() and not x.data_ptr() & 15 and _current_device() == state.index:
        return _run_bound(state, entry, x, out_dtype, quant_key)
    return _gpu_full(state, x, out_dtype)


# The last activation quantized on each GPU by an eager forward: (x, its version, how it was
# quantized, the stream, the scratch block holding its codes and scales). The layers that read one
# input -- q, k and v; gate and up -- quantize it once: the next layer given the very same tensor,
# unchanged (torch bumps ``_version`` on every in-place write), quantized the same way on the same
# stream, takes these codes instead of making them again. The bytes are the same by construction.
# Only eager forwards share, and never while a CUDA graph is being captured: a graph must hold its
# own quantization (its input is rewritten between replays, and nothing runs during a capture to
# fill codes another call could read). Inside torch.compile each op stays self-contained. Tensors
# made under ``torch.inference_mode()`` keep no version counter, so an in-place write to one could
# not be seen: they never share (``torch.no_grad()``, as transformers' ``generate`` runs, does).
_LAST_QUANT = {}
# Signatures bound per layer and GPU, as the seam keeps them (prompts of many lengths would otherwise
# grow the table without end; a decode step's signature is bound again at once after a reset)
_MAX_BOUND_PER_LAYER = 16


def _stream_is_capturing(stream):
    global _stream_is_capturing
    import cupy

    _stream_is_capturing = cupy.cuda.runtime.streamIsCapturing
    return _stream_is_capturing(stream)


def _run_bound(state, entry, x, out_dtype, quant_key=None):
    """The bound call: y and the scratch block from torch's allocator, on torch's current stream."""
    bound, y_shape = entry
    y = torch.empty(y_shape, dtype=out_dtype, device=state.device)
    scratch = torch.empty(bound.scratch_bytes, dtype=torch.uint8, device=state.device)
    stream = _raw_stream(state.index)
    if quant_key is None or x.is_inference() or _stream_is_capturing(stream):
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

    from ..cuda import bound as cuda_bound

    _check_input(x, state.weight.shape[1])
    index = state.index
    with cupy.cuda.Device(index), torch.cuda.device(index):
        if (x.dtype in _DTYPE_NAMES and x.is_contiguous() and not x.data_ptr() & 15 and x.numel() > 0
                and not cupy.cuda.runtime.streamIsCapturing(_raw_stream(index))):
            x2d = _view(x.reshape(-1, x.shape[-1]))
            # what the binding keeps (a copy of a scale, say) comes from cupy's own pool, never
            # from torch's or a graph's
            with cupy.cuda.using_allocator(cupy.get_default_memory_pool().malloc), on_torch_stream(index):
                bound = cuda_bound.bind_linear(x2d, state.weight, _NUMPY_OUT[out_dtype])
            if len(state.bound) >= _MAX_BOUND_PER_LAYER:  # a caller sweeping over shapes: start over
                state.bound.clear()
            entry = state.bound[(x.shape, x.dtype, out_dtype, kernel_settings())] = (
                bound, (*x.shape[:-1], state.weight.shape[0]))
            return _run_bound(state, entry, x, out_dtype)
        return matmul_fp8(x, state.weight, out_dtype)  # results and temporaries from torch's allocator


def _cpu_forward(parts, x, out_dtype):
    if x.requires_grad and _grad_enabled():
        _refuse_grad(x)
    _check_input(x, parts[0].shape[1])
    return matmul_fp8(x, _seam_weight(parts), out_dtype)


# -- the custom op (torch.compile) -------------------------------------------------------------------

@torch.library.custom_op("vtnumba::fp8_linear", mutates_args=())
def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], scheme: str, block_size: Optional[list[int]], scale_ue8m0: bool,
               out_dtype: str) -> torch.Tensor:
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


_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


class Fp8Linear(nn.Module):
    """An ``nn.Linear`` whose weight is FP8 (e4m3fn) and whose forward is the seam's FP8 W8A8 GEMM:
    the activation is quantized by the layer's scheme ('static', 'dynamic', 'per_token' or
    'per_group'), then ``vt.scaled_mm`` with the weight's codes, scales and bias, exactly as
    ``seam.matmul_fp8``.

    Build it with ``Fp8Linear.from_linear(linear, scheme)``, ``Fp8Linear(fp8_weight)`` (a seam
    ``Fp8Weight`` or ``ResidentFp8``) or ``Fp8Linear.from_checkpoint(path, prefix)``.
    ``forward(x)``: x [..., in_features], a torch tensor on the CPU or a GPU (float32, float16,
    bfloat16; float64 is cast to float32) -> [..., out_features] of x's dtype (``out_dtype`` to
    choose). Buffers: ``weight``, ``weight_scale``, ``input_scale`` (static only), ``bias``
    (module docstring). ``fp8_weight`` is the seam ``Fp8Weight`` viewing them. Inference only.
    """

    def __init__(self, weight, *, out_dtype=None):
        super().__init__()
        if isinstance(weight, ResidentFp8):
            weight = weight.weight
        elif not isinstance(weight, Fp8Weight):
            raise TypeError(f"weight must be a seam Fp8Weight or ResidentFp8, got {type(weight).__name__}")
        if weight.scale_format == "e8m0" or weight.activation_scale_format == "e8m0":
            # the custom op's signature carries no E8M0 scale format: refused, never computed otherwise
            raise ValueError(f"weight must have float32 scales for vtnumba.torch's Fp8Linear, got an E8M0-scaled "
                             f"weight (scale_format {weight.scale_format!r}, activation_scale_format "
                             f"{weight.activation_scale_format!r}: MXFP8 or UE8M0 blocks); run it through "
                             f"seam.matmul_fp8, which takes torch tensors too")
        self.out_features, self.in_features = weight.shape
        self.activation_scheme = weight.activation_scheme
        self.block_size = weight.block_size
        self.scale_ue8m0 = weight.scale_ue8m0
        self.out_dtype = _out_dtype(out_dtype)
        self.source = weight.source
        self.register_buffer("weight", _tensor(weight.host_data()).view(torch.float8_e4m3fn))
        scale = weight.weight_scale
        self.register_buffer("weight_scale", _tensor(scale if self.block_size is not None else scale.reshape(-1)))
        input_scale = None
        if weight.input_scale is not None:
            input_scale = torch.tensor([float(weight.input_scale)], dtype=torch.float32, device=self.weight.device)
        self.register_buffer("input_scale", input_scale)
        self.register_buffer("bias", None if weight.bias is None else _tensor(weight.bias))
        self._states = {}  # device index -> _GpuState (dropped when the buffers move)
        self._resident = {}  # device index -> ResidentFp8 of the host weight (CPU buffers, GPU input)
        self._scale_value = None  # (version, buffer, value) of the static scale (``_quant_key``)
        scheme = self.activation_scheme
        self._fixed_quant_key = (None if scheme == ActivationScheme.STATIC else
                                 (scheme, self.block_size[1], self.scale_ue8m0) if scheme == ActivationScheme.PER_GROUP
                                 else (scheme,))

    # -- constructors ----------------------------------------------------------------------------
    @classmethod
    def from_linear(cls, linear, scheme="dynamic", *, input_scale=None, per_channel=None, out_dtype=None,
                    block_size=None, scale_ue8m0=False):
        """Quantize ``linear``'s weight where it lives (CPU or GPU; online, as
        ``seam.Fp8Weight.from_float``; its bias kept exactly) for activations quantized by ``scheme``:

        - 'dynamic': per-tensor weight scale, one dynamic scale per input tensor;
        - 'per_token': per-channel weight scales, one dynamic scale per token (ModelOpt's
          FP8_PER_CHANNEL_PER_TOKEN);
        - 'static': per-tensor weight scale and the given ``input_scale`` (e.g. from ``calibrate``);
        - 'per_group': one weight scale per ``block_size`` block (default 128 x 128) and one dynamic
          scale per 1 x bk activation group (DeepSeek-V3's and Qwen3-FP8's format).

        ``per_channel`` overrides the weight's granularity. ``linear`` is not changed; on a GPU the
        weight never visits the host.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        scheme = _scheme(scheme)
        if scheme == ActivationScheme.STATIC and input_scale is None:
            raise ValueError("input_scale must be given for scheme 'static', got None; measure one with "
                             "vtnumba.torch.calibrate(model, run)")
        if per_channel is None:
            per_channel = scheme == ActivationScheme.PER_TOKEN
        w = linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach()
        with torch.no_grad():
            if scheme == ActivationScheme.PER_GROUP:
                block = block_size or (128, 128)
                if w.is_cuda:
                    codes, scale = _quantize_blocks_on_gpu(w, block)
                    weight = Fp8Weight(_view(codes), _view(scale), bias=None if bias is None else _view(bias),
                                       block_size=block, scale_ue8m0=scale_ue8m0)
                else:
                    weight = Fp8Weight.from_float(w, bias=bias, block_size=block, scale_ue8m0=scale_ue8m0)
            else:
                weight = Fp8Weight.from_float(
                    w, input_scale=_host_scalar(input_scale, "input_scale"), per_channel=per_channel,
                    activation_scheme=scheme, bias=bias, block_size=block_size)
        return cls(weight, out_dtype=out_dtype)

    @classmethod
    def from_checkpoint(cls, path, prefix, *, activation_scheme=None, out_dtype=None, block_size=None,
                        scale_ue8m0=False):
        """The FP8 layer ``prefix`` of a safetensors checkpoint (``seam.load_fp8_linear``;
        ``block_size`` for a block-scaled one)."""
        return cls(load_fp8_linear(path, prefix, activation_scheme=activation_scheme, block_size=block_size,
                                   scale_ue8m0=scale_ue8m0), out_dtype=out_dtype)

    # -- what the layer is ---------------------------------------------------------------------------
    def _parts(self):
        return (self.weight, self.weight_scale, self.input_scale, self.bias, self.activation_scheme.value,
                self.block_size, self.scale_ue8m0, self.source)

    @property
    def fp8_weight(self):
        """The seam ``Fp8Weight`` viewing this layer's buffers where they are (numpy on the CPU,
        cupy on a GPU): what ``seam.matmul_fp8`` takes."""
        if self.weight.is_cuda:
            return self._gpu_state(self.weight.get_device()).weight
        return _seam_weight(self._parts())

    def _gpu_state(self, index):
        state = self._states.get(index)
        if state is None:
            if self.weight.is_cuda:
                if self.weight.get_device() != index:
                    raise ValueError(f"x must be on the layer's device {self.weight.device}, got a tensor on "
                                     f"cuda:{index}")
                weight = _on_device(index, lambda: _seam_weight(self._parts()))
            else:  # CPU buffers, a GPU input: the host weight made resident there once (ResidentFp8)
                with on_torch_stream(index):  # the upload is ordered before this forward's work
                    resident = self._resident.get(index)
                    if resident is None:
                        resident = self._resident[index] = ResidentFp8(self._host_weight(), f"cuda:{index}")
                weight = resident.weight
            state = self._states[index] = _GpuState(weight, index)
        return state

    def _host_weight(self):
        """The layer's weight as a host seam Fp8Weight of its own (the key of its resident copies)."""
        host = getattr(self, "_host_seam", None)
        if host is None:
            host = self._host_seam = _seam_weight(self._parts())
        return host

    # the buffers whose dtype is the format itself: they move with the module, but a module-wide
    # dtype change (``model.half()``, ``model.to(torch.bfloat16)``) must not cast them (an FP8 weight
    # is float8_e4m3fn, its scales float32); the bias follows the module, as nn.Linear's does
    _FORMAT_BUFFERS = ("weight", "weight_scale", "input_scale")

    def _apply(self, fn, *args, **kwargs):  # .to(), .cuda(), .half(): the buffers move, states go
        self._states, self._resident, self._host_seam = {}, {}, None
        kept = {}
        for name in self._FORMAT_BUFFERS:
            t = self._buffers.get(name)
            if t is not None:
                moved = fn(t)
                kept[name] = moved if moved.dtype == t.dtype else t.to(moved.device)
        for name in kept:
            self._buffers[name] = None  # skipped by Module._apply; the entry keeps its place
        result = super()._apply(fn, *args, **kwargs)
        self._buffers.update(kept)
        return result

    def _load_from_state_dict(self, *args, **kwargs):
        # values change in place: views of GPU buffers stay valid, uploads of the host values do not
        self._host_seam, self._resident = None, {}
        if not self.weight.is_cuda:
            self._states = {}
        return super()._load_from_state_dict(*args, **kwargs)

    def forward(self, x):
        if _is_compiling():
            return fp8_linear(x, self.weight, self.weight_scale, self.input_scale, self.bias,
                              self.activation_scheme.value, None if self.block_size is None else list(self.block_size),
                              self.scale_ue8m0, _DTYPE_NAMES.get(self.out_dtype, ""))
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        index = x.get_device()
        if index >= 0:
            state = self._states.get(index)
            return _gpu_forward(state if state is not None else self._gpu_state(index), x, self.out_dtype,
                                self._quant_key())
        if self.weight.is_cuda:
            raise ValueError(f"x must be on the layer's device {self.weight.device}, got a tensor on {x.device}")
        return _cpu_forward(self._parts(), x, self.out_dtype)

    def _quant_key(self):
        """What decides this layer's activation codes beside x itself: its scheme and group size, or
        its static scale's value (read once per change of the buffer: ``_version`` counts in-place
        writes). On every eager forward, so the buffer is taken from ``_buffers`` (not through
        nn.Module's attribute lookup, a microsecond each)."""
        key = self._fixed_quant_key
        if key is not None:
            return key
        scale = self._buffers["input_scale"]
        if scale.is_inference():  # no version counter: this buffer's own scale only
            return ActivationScheme.STATIC, scale.data_ptr()
        cached = self._scale_value
        if cached is None or cached[0] != scale._version or cached[1] is not scale:
            cached = self._scale_value = (scale._version, scale, float(scale.item()))
        return ActivationScheme.STATIC, cached[2]

    def kernels(self, x):
        """The kernels a GPU forward on inputs like ``x`` runs, in order: the activation
        quantization's, then the GEMM's name (e.g. ``('quantize_per_token', 'cublaslt')``); the
        signature is bound by the call if it was not. For profiling and for tests that pin which
        kernel runs."""
        with torch.no_grad():
            self(x)
        state = self._states[x.get_device()]
        out = self.out_dtype or x.dtype
        return state.bound[(x.shape, x.dtype, out, kernel_settings())][0].kernels

    def extra_repr(self):
        if self.block_size is not None:
            scale = f"block {self.block_size}"
        else:
            scale = "per-channel" if self.weight_scale.numel() > 1 else "per-tensor"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"activation_scheme={self.activation_scheme.value!r}, weight_scale={scale}, "
                f"bias={self.bias is not None}")


def _quantize_blocks_on_gpu(w, block):
    """(codes, scales) of a CUDA weight [N, K] in bn x bk blocks, on the GPU: exactly the host
    rule of ``seam.Fp8Weight.from_float(..., block_size=...)`` -- scale = max(amax_block, 1e-10) /
    448 in float32 over finite values, codes = encode(w / scale) by a float32 division (IEEE, as
    torch divides on the GPU) -- so the codes and scales are the host's, byte for byte."""
    bn, bk = block
    n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    w32 = w.to(dtype=torch.float32, copy=True)  # divided in place below: never the caller's tensor
    finite = torch.where(torch.isfinite(w32), w32.abs(), torch.zeros((), device=w.device))
    padded = torch.zeros((nb * bn, kb * bk), dtype=torch.float32, device=w.device)
    padded[:n, :k] = finite
    amax = padded.view(nb, bn, kb, bk).amax(dim=(1, 3))
    del padded, finite
    scale = torch.clamp_min(amax, float(F32_GROUP_EPS)) / torch.tensor(E4M3_MAX, dtype=torch.float32, device=w.device)
    if n % bn == 0 and k % bk == 0:
        w32.view(nb, bn, kb, bk).div_(scale.view(nb, 1, kb, 1))
    else:
        w32.div_(scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k])
    return encode_e4m3(w32), scale


def _plan(config, ignore):
    """(activation scheme, per-channel weights, Fp8Config: the ignore rules and block size) of a config."""
    if isinstance(config, Fp8Config):
        if ignore:
            config = dataclasses.replace(config, ignore=config.ignore + tuple(ignore))
        return ActivationScheme(config.activation_scheme), config.weight_strategy == "channel", config
    if isinstance(config, str):
        scheme = _scheme(config, "config")
        block = (128, 128) if scheme == ActivationScheme.PER_GROUP else None
        rules = Fp8Config("fp8", "channel" if scheme == ActivationScheme.PER_TOKEN else "block" if block else "tensor",
                          scheme.value, tuple(ignore), block)
        return scheme, scheme == ActivationScheme.PER_TOKEN, rules
    raise TypeError(f"config must be a seam.Fp8Config or a scheme ('dynamic', 'static', 'per_token', 'per_group'), "
                    f"got {type(config).__name__}")


def convert(model, config="dynamic", *, input_scales=None, ignore=(), checkpoint=None, out_dtype=None):
    """Replace, in place, every ``nn.Linear`` of ``model`` that ``config`` quantizes with an
    ``Fp8Linear``; return ``model`` (the new layer when ``model`` is itself an ``nn.Linear``).

    - ``config``: a ``seam.Fp8Config`` (``Fp8Config.from_hf(path)``: its activation scheme, weight
      granularity or block size and ignore list) or a scheme: 'dynamic' (per-tensor weights and
      activations), 'per_token' (per-channel weights, per-token activations), 'static' (per-tensor
      weights, static activation scales from ``input_scales``) or 'per_group' (128 x 128 weight
      blocks, 1 x 128 activation groups: DeepSeek-V3's format).
    - Each layer is quantized where its weight lives: a model already on a GPU is converted there,
      layer by layer, and each float weight is released once its layer is replaced (unless the
      caller holds it), so the GPU needs room for the float model plus one layer's work.
    - A layer is skipped (kept as it is) when its name in ``model.named_modules()`` matches the
      config's ignore list or ``ignore`` (names, globs, 're:' regexes), as upstream vLLM's
      ``get_quant_method`` gives ignored layers the unquantized method.
    - ``input_scales``: {layer name: scale} for static activations (``calibrate`` measures them).
    - ``checkpoint``: read each converted layer's FP8 weight from this safetensors checkpoint under
      its name (``Fp8Linear.from_checkpoint``) instead of quantizing the float weight; the new
      layer is placed on the float layer's device.

    After conversion ``state_dict()`` holds each layer's FP8 buffers (``weight`` float8_e4m3fn,
    ``weight_scale``, ``input_scale``, ``bias``) under the layer's name.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    scheme, per_channel, rules = _plan(config, ignore)
    targets = [name for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and not rules.is_ignored(name)]
    block = dict(block_size=rules.weight_block_size, scale_ue8m0=getattr(rules, "activation_scale_ue8m0", False))
    if scheme == ActivationScheme.STATIC and checkpoint is None:
        for name in targets:
            if input_scales is None or name not in input_scales:
                raise ValueError(f"input_scales must give a scale for layer {name!r} (static activations), got "
                                 f"{'none' if input_scales is None else 'no entry for it'}; measure them with "
                                 f"vtnumba.torch.calibrate(model, run)")
    converted = None
    for name in targets:  # names only: a float layer is released as soon as its replacement is in
        linear = model.get_submodule(name)
        if checkpoint is not None:
            layer = Fp8Linear.from_checkpoint(checkpoint, name, activation_scheme=scheme, out_dtype=out_dtype,
                                              **block).to(linear.weight.device)
        else:
            scale = input_scales[name] if scheme == ActivationScheme.STATIC else None
            layer = Fp8Linear.from_linear(linear, scheme, input_scale=scale, per_channel=per_channel,
                                          out_dtype=out_dtype, **block)
        if name == "":  # model is itself a Linear
            converted = layer
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, layer)  # the float layer goes (if nobody holds it)
        del linear, layer
    return converted if converted is not None else model


def calibrate(model, run):
    """Static activation scales for ``convert(model, 'static', input_scales=...)``: the amax of every
    ``nn.Linear``'s input over the finite values seen while ``run()`` drives the model. ``run``
    takes no argument (e.g. ``lambda: st_model.encode(samples)`` or
    ``lambda: [model(x) for x in batches]``). The amax divided by 448 is upstream's static
    ``input_scale``. Returns {layer name: float32 scale}; a layer that saw only zeros gets the
    dynamic scheme's floor ``1 / (448 * 512)``."""
    amax = {}

    def observer(name):
        def hook(module, args):
            x = args[0].detach()
            finite = x[torch.isfinite(x)]
            if finite.numel():
                amax[name] = max(amax.get(name, 0.0), float(finite.abs().max()))
        return hook

    handles = [module.register_forward_pre_hook(observer(name)) for name, module in model.named_modules()
               if isinstance(module, nn.Linear)]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    floor = 1.0 / (E4M3_MAX * 512)
    return {name: np.float32(max(a / E4M3_MAX, floor)) for name, a in amax.items()}


# -- tensor parallelism (seam.parallel) ---------------------------------------------------------------

class RowParallelFp8Linear(nn.Module):
    """Rank ``rank``'s part of a row-parallel ``Fp8Linear`` (vLLM's ``RowParallelLinear``,
    ``input_is_parallel=True``): ``forward(x_r)`` takes this rank's slice of the input features,
    computes the float32 partial product (an ``Fp8Linear`` of the shard, ``out_dtype=float32``, no
    bias), sums it over ``group`` with ``torch.distributed.all_reduce`` (NCCL runs it on torch's
    current stream, no host sync), then adds the bias and rounds to the layer's out dtype (default:
    x's): ``seam.combine_partials``, where the choices (float32 reduce, bias after it) are argued."""

    def __init__(self, layer: "Fp8Linear", rank: int, world_size: int, group: object = None) -> None:
        super().__init__()
        if not isinstance(layer, Fp8Linear):
            raise TypeError(f"layer must be an Fp8Linear, got {type(layer).__name__}")
        shard = _parallel.shard_weight(layer.fp8_weight, rank, world_size, mode=_parallel.ROW)
        self.partial = Fp8Linear(shard, out_dtype=torch.float32)
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().clone())
        self.out_dtype, self.rank, self.world_size, self.group = layer.out_dtype, rank, world_size, group
        # made once, not per forward (a decode step calls it per layer); one rank has nothing to reduce
        self._all_reduce = _parallel.torch_all_reduce(group) if world_size > 1 else None
        self.in_features, self.out_features = shard.shape[1], shard.shape[0]

    def forward(self, x):
        return _parallel.combine_partials(self.partial(x), self._all_reduce, bias=self.bias,
                                          out_dtype=x.dtype if self.out_dtype is None else self.out_dtype)

    def extra_repr(self):
        return (f"in_features={self.in_features} (of {self.in_features * self.world_size}), "
                f"out_features={self.out_features}, rank={self.rank}/{self.world_size}, bias={self.bias is not None}")


def shard_linear(layer: "Fp8Linear", rank: int, world_size: int, *, mode: str, group: object = None,
                 logical_widths: Optional[list] = None) -> nn.Module:
    """Rank ``rank``'s part of ``layer`` (an ``Fp8Linear``) for tensor parallelism over ``group``
    (a ``torch.distributed`` process group; None: the default one) of ``world_size`` ranks:

    - ``mode='column'``: an ``Fp8Linear`` of the rank's output features (``seam.shard_weight``:
      scales and bias split with them; ``logical_widths`` for fused q/k/v, gate/up);
    - ``mode='row'``: a ``RowParallelFp8Linear`` taking the rank's input features, with one
      all-reduce per forward.

    Start the ranks with torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and
    ``torch.distributed.init_process_group("nccl")`` on GPUs (keep NCCL_NVLS_ENABLE=0 in each
    process); the CPU tests use the gloo backend."""
    if not isinstance(layer, Fp8Linear):
        raise TypeError(f"layer must be an Fp8Linear, got {type(layer).__name__}")
    if mode == _parallel.COLUMN:
        weight = layer.fp8_weight
        if logical_widths is None and isinstance(weight.source, dict):  # a fused q/k/v or gate/up layer
            logical_widths = weight.source.get("logical_widths")  # as seam.ColumnParallelLinearMethod
        return Fp8Linear(_parallel.shard_weight(weight, rank, world_size, mode=mode, logical_widths=logical_widths),
                         out_dtype=layer.out_dtype)
    if mode == _parallel.ROW:
        if logical_widths is not None:
            raise ValueError(f"logical_widths applies to mode='column' only, got {logical_widths!r}")
        return RowParallelFp8Linear(layer, rank, world_size, group)
    raise ValueError(f"mode must be 'column' or 'row', got {mode!r}")


def shard_model(model: nn.Module, plan: dict, rank: int, world_size: int, *, group: object = None) -> nn.Module:
    """Replace, in place, each ``Fp8Linear`` named in ``plan`` ({name in ``model.named_modules()``:
    'column' or 'row'}) with its rank's part (``shard_linear``); return ``model``. As torch's own
    ``parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})``
    takes a plan, and vLLM's models name the split of each layer (q/k/v, gate/up: column; o, down:
    row). A name that is not an ``Fp8Linear`` of ``model`` is an error."""
    modules = dict(model.named_modules())
    for name, mode in plan.items():
        layer = modules.get(name)
        if not isinstance(layer, Fp8Linear):
            raise ValueError(f"plan names {name!r}, which must be an Fp8Linear of model, got "
                             f"{type(layer).__name__ if layer is not None else 'no such module'}")
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child,
                shard_linear(layer, rank, world_size, mode=mode, group=group))
    return model
