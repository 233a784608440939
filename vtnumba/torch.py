"""FP8 linear layers for torch models: ``Fp8Linear`` and ``convert`` (the optional extra ``torch``).

    import vtnumba.torch as vtt
    model = vtt.convert(model, "per_token")           # every nn.Linear -> Fp8Linear, in place
    with torch.inference_mode():
        y = model(x)

``Fp8Linear.forward`` is ``seam.matmul_fp8`` on the tensor as it is: zero-copy, on the tensor's
device, on torch's current stream there, the result a tensor of the input's dtype (module
``vtnumba._interop``). The FP8 weight is kept as the seam keeps it (an ``Fp8Weight``; numpy on the
host) and made resident on a GPU the first time a forward runs there (once: ``ResidentFp8``,
accounted in ``seam.load_stats()``), so ``model.to("cuda")`` needs nothing from these layers: the
weight is not a parameter or buffer, and ``state_dict()`` does not hold it (save an FP8 checkpoint
instead and load it with ``Fp8Linear.from_checkpoint`` / ``convert(..., checkpoint=path)``).

Inference only: training is not a goal. vtnumba's ops are not differentiable, so a forward under
grad mode whose input requires grad raises (the gradient would be lost without a word); run the
model under ``torch.no_grad()`` or ``torch.inference_mode()``.

This module's ``import torch`` is the real torch: Python 3 imports are absolute, so the name is not
this module's own (tests/test_interop.py checks it).
"""

import dataclasses

import numpy as np

try:
    import torch
except ImportError:
    raise ImportError("vtnumba.torch needs torch, which is not installed: pip install 'vtnumba[torch]'") from None
from torch import nn

from ._format import E4M3_MAX
from ._interop import on_torch_stream
from .ops import ActivationScheme
from .seam import Fp8Config, Fp8Weight, ResidentFp8, load_fp8_linear, matmul_fp8

__all__ = ["Fp8Linear", "convert", "calibrate"]

_CPU_KEY = -1  # torch.Tensor.get_device() of a CPU tensor


def _device_key(device):
    """get_device()'s number for a seam device name: -1 for 'cpu', N for 'cuda:N'."""
    return _CPU_KEY if device == "cpu" else int(device.split(":")[1])


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


class Fp8Linear(nn.Module):
    """An ``nn.Linear`` whose weight is FP8 (e4m3fn) and whose forward is the seam's FP8 W8A8 GEMM:
    the activation is quantized by the weight's scheme ('static', 'dynamic' or 'per_token'), then
    ``vt.scaled_mm`` with the weight's codes, scale and bias, exactly as ``seam.matmul_fp8``.

    Build it with ``Fp8Linear.from_linear(linear, scheme)``, ``Fp8Linear(fp8_weight)`` (a seam
    ``Fp8Weight`` or ``ResidentFp8``) or ``Fp8Linear.from_checkpoint(path, prefix)``.
    ``forward(x)``: x [..., in_features], a torch tensor on the CPU or a GPU (float32, float16,
    bfloat16; float64 is cast to float32) -> [..., out_features] of x's dtype (``out_dtype`` to
    choose). Inference only (module docstring).
    """

    def __init__(self, weight, *, out_dtype=None):
        super().__init__()
        if isinstance(weight, ResidentFp8):
            seam_weight = weight.weight
        elif isinstance(weight, Fp8Weight):
            seam_weight = weight
        else:
            raise TypeError(f"weight must be a seam Fp8Weight or ResidentFp8, got {type(weight).__name__}")
        self.weight = weight
        self.in_features, self.out_features = seam_weight.in_features, seam_weight.out_features
        self.out_dtype = out_dtype
        self._host = weight if isinstance(weight, Fp8Weight) and weight.device == "cpu" else None
        self._placed = {_device_key(seam_weight.device): weight}  # get_device() -> the weight there

    @classmethod
    def from_linear(cls, linear, scheme="dynamic", *, input_scale=None, per_channel=None, out_dtype=None,
                    block_size=None, scale_ue8m0=False):
        """Quantize ``linear``'s weight (online, as ``seam.Fp8Weight.from_float``; its bias kept
        exactly) for activations quantized by ``scheme``:

        - 'dynamic': per-tensor weight scale, one dynamic scale per input tensor;
        - 'per_token': per-channel weight scales, one dynamic scale per token (ModelOpt's
          FP8_PER_CHANNEL_PER_TOKEN);
        - 'static': per-tensor weight scale and the given ``input_scale`` (e.g. from ``calibrate``);
        - 'per_group': one weight scale per ``block_size`` block (default 128 x 128) and one dynamic
          scale per 1 x bk activation group (DeepSeek-V3's and Qwen3-FP8's format).

        ``per_channel`` overrides the weight's granularity. The weight is quantized where it lives
        (CPU or GPU); ``linear`` is not changed.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        scheme = _scheme(scheme)
        if scheme == ActivationScheme.STATIC and input_scale is None:
            raise ValueError("input_scale must be given for scheme 'static', got None; measure one with "
                             "vtnumba.torch.calibrate(model, run)")
        if per_channel is None:
            per_channel = scheme == ActivationScheme.PER_TOKEN
        bias = None if linear.bias is None else linear.bias.detach()
        with torch.no_grad():
            if scheme == ActivationScheme.PER_GROUP:
                weight = Fp8Weight.from_float(linear.weight.detach(), bias=bias, block_size=block_size or (128, 128),
                                              scale_ue8m0=scale_ue8m0)
            else:
                weight = Fp8Weight.from_float(
                    linear.weight.detach(), input_scale=_host_scalar(input_scale, "input_scale"),
                    per_channel=per_channel, activation_scheme=scheme, bias=bias, block_size=block_size)
        return cls(weight, out_dtype=out_dtype)

    @classmethod
    def from_checkpoint(cls, path, prefix, *, activation_scheme=None, out_dtype=None, block_size=None,
                        scale_ue8m0=False):
        """The FP8 layer ``prefix`` of a safetensors checkpoint (``seam.load_fp8_linear``;
        ``block_size`` for a block-scaled one)."""
        return cls(load_fp8_linear(path, prefix, activation_scheme=activation_scheme, block_size=block_size,
                                   scale_ue8m0=scale_ue8m0), out_dtype=out_dtype)

    @property
    def activation_scheme(self):
        return self.weight.activation_scheme

    def _place(self, x):
        """The weight on x's device: the host weight made resident there (once)."""
        key = x.get_device()
        if self._host is None or key == _CPU_KEY:
            where = self.weight.device
            raise ValueError(f"x must be on the weight's device {where}, got a tensor on {x.device}")
        with on_torch_stream(key):  # the upload is ordered before this forward's GEMM, on torch's stream
            resident = self._placed[key] = ResidentFp8(self._host, f"cuda:{key}")
        return resident

    def forward(self, x):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        weight = self._placed.get(x.get_device())
        if weight is None:
            weight = self._place(x)
        return matmul_fp8(x, weight, self.out_dtype)

    def extra_repr(self):
        w = self.weight.weight if isinstance(self.weight, ResidentFp8) else self.weight
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"activation_scheme={w.activation_scheme.value!r}, "
                f"weight_scale={'per-channel' if w.per_channel else 'per-tensor'}, bias={w.bias is not None}")


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
    raise TypeError(f"config must be a seam.Fp8Config or a scheme ('dynamic', 'static', 'per_token'), "
                    f"got {type(config).__name__}")


def convert(model, config="dynamic", *, input_scales=None, ignore=(), checkpoint=None, out_dtype=None):
    """Replace, in place, every ``nn.Linear`` of ``model`` that ``config`` quantizes with an
    ``Fp8Linear``; return ``model`` (the new layer when ``model`` is itself an ``nn.Linear``).

    - ``config``: a ``seam.Fp8Config`` (``Fp8Config.from_hf(path)``: its activation scheme, weight
      granularity or block size and ignore list) or a scheme: 'dynamic' (per-tensor weights and
      activations), 'per_token' (per-channel weights, per-token activations), 'static' (per-tensor
      weights, static activation scales from ``input_scales``) or 'per_group' (128 x 128 weight
      blocks, 1 x 128 activation groups).
    - A layer is skipped (kept as it is) when its name in ``model.named_modules()`` matches the
      config's ignore list or ``ignore`` (names, globs, 're:' regexes), as upstream vLLM's
      ``get_quant_method`` gives ignored layers the unquantized method.
    - ``input_scales``: {layer name: scale} for static activations (``calibrate`` measures them).
    - ``checkpoint``: read each converted layer's FP8 weight from this safetensors checkpoint under
      its name (``Fp8Linear.from_checkpoint``) instead of quantizing the float weight.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    scheme, per_channel, rules = _plan(config, ignore)
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and not rules.is_ignored(name)]
    block = dict(block_size=rules.weight_block_size, scale_ue8m0=getattr(rules, "activation_scale_ue8m0", False))
    replacements = {}
    for name, linear in targets:
        if checkpoint is not None:
            replacements[name] = Fp8Linear.from_checkpoint(checkpoint, name, activation_scheme=scheme,
                                                           out_dtype=out_dtype, **block)
            continue
        scale = None
        if scheme == ActivationScheme.STATIC:
            if input_scales is None or name not in input_scales:
                raise ValueError(f"input_scales must give a scale for layer {name!r} (static activations), got "
                                 f"{'none' if input_scales is None else 'no entry for it'}; measure them with "
                                 f"vtnumba.torch.calibrate(model, run)")
            scale = input_scales[name]
        replacements[name] = Fp8Linear.from_linear(linear, scheme, input_scale=scale, per_channel=per_channel,
                                                   out_dtype=out_dtype, **block)
    if "" in replacements:  # model is itself a Linear
        return replacements[""]
    for name, layer in replacements.items():
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, layer)
    return model


def calibrate(model, run):
    """Static activation scales for ``convert(model, 'static', input_scales=...)``: the amax of every
    ``nn.Linear``'s input over the finite values seen while ``run()`` drives the model (e.g.
    ``lambda: st_model.encode(samples)``), divided by 448 -- upstream's static ``input_scale``.
    Returns {layer name: float32 scale}; a layer that saw only zeros gets the dynamic scheme's floor
    ``1 / (448 * 512)``."""
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
