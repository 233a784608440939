"""``Fp8Linear``: an ``nn.Linear`` whose weight is FP8 and whose forward is ``seam.matmul_fp8``
(the package docstring: buffers, how a GPU forward runs, the custom op under ``torch.compile``)."""

import numpy as np
import torch
from torch import nn

from .._format import E4M3_MAX, F32_GROUP_EPS
from .._interop import on_torch_stream
from ..ops import ActivationScheme, encode_e4m3
from ..seam import Fp8Weight, ResidentFp8, load_fp8_linear
from ..seam._finite import refuse_nonfinite
from ..seam.bound import linear_for_stream
from ..seam.host_linear import HostLinear
from ._common import (
    _DTYPE_NAMES,
    _NUMPY_OUT,
    _host_scalar,
    _is_compiling,
    _on_device,
    _out_dtype,
    _raw_stream,
    _scheme,
    _tensor,
    _view,
)
from .custom_ops import _cpu_forward, _gpu_forward, _GpuState, _host_forward, _linear_key, _seam_weight, fp8_linear

__all__ = ["Fp8Linear"]


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
            raise ValueError(
                f"weight must have float32 scales for vtnumba.torch's Fp8Linear, got an E8M0-scaled "
                f"weight (scale_format {weight.scale_format!r}, activation_scale_format "
                f"{weight.activation_scale_format!r}: MXFP8 or UE8M0 blocks); run it through "
                f"seam.matmul_fp8, which takes torch tensors too"
            )
        self.out_features, self.in_features = weight.shape
        self.format = weight.format  # seam.Fp8Format: what save_checkpoint records; the fields below are its
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
        self._host = None  # (seam HostLinear, the buffers it views) of the CPU forward (``_host_linear``)
        scheme = self.activation_scheme
        self._fixed_quant_key = (
            None
            if scheme == ActivationScheme.STATIC
            else (scheme, self.block_size[1], self.scale_ue8m0)
            if scheme == ActivationScheme.PER_GROUP
            else (scheme,)
        )

    # -- constructors ----------------------------------------------------------------------------
    @classmethod
    def from_linear(
        cls,
        linear,
        scheme="dynamic",
        *,
        input_scale=None,
        per_channel=None,
        out_dtype=None,
        block_size=None,
        scale_ue8m0=False,
        allow_nonfinite=False,
    ):
        """Quantize ``linear``'s weight where it lives (CPU or GPU; online, as
        ``seam.Fp8Weight.from_float``; its bias kept exactly) for activations quantized by ``scheme``:

        - 'dynamic': per-tensor weight scale, one dynamic scale per input tensor;
        - 'per_token': per-channel weight scales, one dynamic scale per token (ModelOpt's
          FP8_PER_CHANNEL_PER_TOKEN);
        - 'static': per-tensor weight scale and the given ``input_scale`` (e.g. from ``calibrate``);
        - 'per_group': one weight scale per ``block_size`` block (default 128 x 128) and one dynamic
          scale per 1 x bk activation group (DeepSeek-V3's and Qwen3-FP8's format).

        ``per_channel`` overrides the weight's granularity. ``linear`` is not changed; on a GPU the
        weight never visits the host. A NaN or Inf in the weight is refused (its index named) unless
        ``allow_nonfinite=True`` (``seam.Fp8Weight.from_float``'s rule).
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        scheme = _scheme(scheme)
        if scheme == ActivationScheme.STATIC and input_scale is None:
            raise ValueError(
                "input_scale must be given for scheme 'static', got None; measure one with "
                "vtnumba.torch.calibrate(model, run)"
            )
        if per_channel is None:
            per_channel = scheme == ActivationScheme.PER_TOKEN
        w = linear.weight.detach()
        refuse_nonfinite(w, "linear.weight", allow_nonfinite)
        bias = None if linear.bias is None else linear.bias.detach()
        with torch.no_grad():
            if scheme == ActivationScheme.PER_GROUP:
                block = block_size or (128, 128)
                if w.is_cuda:
                    codes, scale = _quantize_blocks_on_gpu(w, block)
                    weight = Fp8Weight(
                        _view(codes),
                        _view(scale),
                        bias=None if bias is None else _view(bias),
                        block_size=block,
                        scale_ue8m0=scale_ue8m0,
                    )
                else:
                    weight = Fp8Weight.from_float(
                        w, bias=bias, block_size=block, scale_ue8m0=scale_ue8m0, allow_nonfinite=True
                    )
            else:
                weight = Fp8Weight.from_float(
                    w,
                    input_scale=_host_scalar(input_scale, "input_scale"),
                    per_channel=per_channel,
                    activation_scheme=scheme,
                    bias=bias,
                    block_size=block_size,
                    allow_nonfinite=True,  # checked above
                )
        return cls(weight, out_dtype=out_dtype)

    @classmethod
    def from_checkpoint(
        cls, path, prefix, *, activation_scheme=None, out_dtype=None, block_size=None, scale_ue8m0=None
    ):
        """The FP8 layer ``prefix`` of a safetensors checkpoint (``seam.load_fp8_linear``;
        ``block_size`` for a block-scaled one). A checkpoint vtnumba saved (``save_checkpoint``)
        records the layer's format: the keywords left None are then the saved ones, so a per_token
        layer comes back per_token."""
        return cls(
            load_fp8_linear(
                path, prefix, activation_scheme=activation_scheme, block_size=block_size, scale_ue8m0=scale_ue8m0
            ),
            out_dtype=out_dtype,
        )

    # -- what the layer is ---------------------------------------------------------------------------
    def _parts(self):
        return (
            self.weight,
            self.weight_scale,
            self.input_scale,
            self.bias,
            self.activation_scheme.value,
            self.block_size,
            self.scale_ue8m0,
            self.source,
        )

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
                    raise ValueError(
                        f"x must be on the layer's device {self.weight.device}, got a tensor on cuda:{index}"
                    )
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
        self._states, self._resident, self._host_seam, self._host = {}, {}, None, None
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
        self._host_seam, self._resident, self._host = None, {}, None
        if not self.weight.is_cuda:
            self._states = {}
        return super()._load_from_state_dict(*args, **kwargs)

    def forward(self, x):
        if _is_compiling():
            return fp8_linear(
                x,
                self.weight,
                self.weight_scale,
                self.input_scale,
                self.bias,
                self.activation_scheme.value,
                None if self.block_size is None else list(self.block_size),
                self.scale_ue8m0,
                _DTYPE_NAMES.get(self.out_dtype, ""),
            )
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        index = x.get_device()
        if index >= 0:
            state = self._states.get(index)
            return _gpu_forward(
                state if state is not None else self._gpu_state(index), x, self.out_dtype, self._quant_key()
            )
        if self.weight.is_cuda:
            raise ValueError(f"x must be on the layer's device {self.weight.device}, got a tensor on {x.device}")
        host = self._host_linear() if x.dtype in _NUMPY_OUT and x.is_cpu else None
        if host is None:  # float64 (cast to float32 by the full path), or another device
            return _cpu_forward(self._parts(), x, self.out_dtype)
        scale = None if self._fixed_quant_key is not None else self._static_scale()  # 'static' has no fixed key
        return _host_forward(host, x, self.out_dtype, scale)

    def _host_linear(self):
        """The CPU forward's prepared call (``seam.host_linear``: views of the buffers, checked
        once), made again when a buffer is replaced or its memory moved (``copy.deepcopy`` copies the
        views' memory apart from the new buffers'). In-place writes need nothing: the views see them."""
        buffers = self._buffers
        weight, scale, bias = buffers["weight"], buffers["weight_scale"], buffers["bias"]
        held = self._host
        if (
            held is not None
            and held[1] is weight
            and held[2] is scale
            and held[3] is bias
            and held[4] == weight.data_ptr()
        ):
            return held[0]
        call = HostLinear.of(_seam_weight(self._parts()))
        self._host = (call, weight, scale, bias, weight.data_ptr())
        return call

    def _static_scale(self):
        """The static input scale's value as float32, read from the buffer: once per change of it
        (``_version``), or at every call for a tensor made under inference mode (no version counter)."""
        scale = self._buffers["input_scale"]
        if scale.is_inference():
            return np.float32(scale.item())
        cached = self._scale_value
        if cached is None or cached[0] != scale._version or cached[1] is not scale:
            cached = self._scale_value = (scale._version, scale, float(scale.item()))
        return np.float32(cached[2])

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
        return ActivationScheme.STATIC, float(self._static_scale())

    def kernels(self, x):
        """The kernels a forward on inputs like ``x`` runs, in order: the activation quantization's,
        then the GEMM's name. On a GPU, e.g. ``('quantize_per_token', 'cublaslt')`` (the signature is
        bound by the call if it was not); on the CPU, the CPU backend's quantizer and the kernel its
        shape rule picks, e.g. ``('cpu quantize_dynamic', 'cpu small_m')``. For profiling and for
        tests that pin which kernel runs."""
        with torch.no_grad():
            self(x)  # validates x (device, shape, dtype) as a forward would, and binds a GPU call
        if x.get_device() < 0:
            return self._cpu_kernels(x)
        state = self._states[x.get_device()]
        binding = state.calls[_linear_key(x, self.out_dtype or x.dtype, state.index)]
        return linear_for_stream(binding, _raw_stream(state.index)).kernels

    def explain(self):
        """What this layer's forwards run on the GPU, input signature by input signature: the kernels
        of an eager call and of a call captured into a CUDA graph, and why a call is not bound or
        not the one fused decode launch (``seam.explain``); on the CPU, which kernels its rules pick."""
        lines = [
            f"cuda:{index}: {line}"
            for index, state in self._states.items()
            for line in state.calls.explain().split("\n")
        ]
        return "\n".join(lines) if lines else "no GPU call yet (Fp8Linear.kernels(x) names the CPU's)"

    def _cpu_kernels(self, x):
        # The CPU runs no bound call to read the names from: they follow from the same rules its
        # forward applies (cpu.quantize_* by scheme, then the GEMM module's choose_kernel by shape).
        # Fp8Linear refuses E8M0 scale formats, so per-group weights are float32-scaled blocks (UE8M0
        # ones too: powers of two held as float32) and take the block GEMM, never the MX one.
        from ..cpu import block, gemm

        k = self.in_features
        m = x.numel() // k
        chooser = block if self.activation_scheme == ActivationScheme.PER_GROUP else gemm
        return f"cpu quantize_{self.activation_scheme.value}", f"cpu {chooser.choose_kernel(m, self.out_features, k)}"

    def extra_repr(self):
        if self.block_size is not None:
            scale = f"block {self.block_size}"
        else:
            scale = "per-channel" if self.weight_scale.numel() > 1 else "per-tensor"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"activation_scheme={self.activation_scheme.value!r}, weight_scale={scale}, "
            f"bias={self.bias is not None}"
        )


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
