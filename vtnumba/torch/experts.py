"""``Fp8Experts``: a mixture-of-experts layer's routed experts in FP8, forward ``seam.moe_fp8``.

transformers (5.x) keeps a MoE layer's routed experts as one module holding two 3-D parameters --
``gate_up_proj`` [E, 2I, H] (each expert's gate rows, then its up rows) and ``down_proj``
[E, H, I] -- called as ``experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])``
after the router (``gate``) has chosen k experts per token. ``Fp8Experts`` is that module in FP8:
the same call, computed by ``seam.moe_fp8`` (align, quantize, grouped GEMM, SiLU-and-multiply,
grouped GEMM, float32 combine), exactly, bitwise.

Which modules ``convert`` replaces (``_unsupported_reason`` says why any other is left in float):
parameters exactly ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I] in a float dtype, no
bias, ``act_fn`` SiLU, transformers' default gate (``act_fn(gate) * up`` over concatenated halves,
the ``@use_experts_implementation`` flags at their defaults) and the forward
``(hidden_states, top_k_index, top_k_weights)``. Checked against transformers 5.24's
Qwen3MoeExperts, Qwen2MoeExperts, OlmoeExperts, MixtralExperts and DeepseekV3Experts (``VERIFIED``;
the same layout in Qwen3-Next, GLM-4-MoE, DeepSeek-V2 and Qwen3-VL-MoE's text experts is taken
too). gpt-oss's experts ([E, H, 2I], biases, interleaved gate/up, a clamped SwiGLU) and any layout
not listed are left in float, and ``convert`` warns.

Buffers (so ``state_dict``, ``load_state_dict`` and ``.to()`` treat them as torch treats any):
``gate_up_proj`` / ``down_proj`` float8_e4m3fn codes; ``gate_up_proj_scale`` / ``down_proj_scale``
the weight scales per expert (float32 [E] per-tensor, [E, N] per-channel, [E, ceil(N/bn),
ceil(K/bk)] per block; uint8 E8M0 bytes [E, N, K/32] for MXFP8); ``gate_up_proj_input_scale`` /
``down_proj_input_scale`` float32 [E], static activations only (one scale per expert, as ModelOpt
and compressed-tensors store them).
"""

import inspect

import numpy as np
import torch
from torch import nn

from .._interop import on_torch_stream
from ..ops import ActivationScheme
from ..seam import Fp8Experts as SeamExperts
from ..seam import Fp8Weight, ResidentFp8, load_fp8_experts
from ..seam._finite import refuse_nonfinite
from ._common import _is_compiling, _on_device, _scheme, _tensor, _view
from .custom_ops import _experts_pair, _moe_forward, _versions, moe_fp8
from .linear import _quantize_blocks_on_gpu

__all__ = ["Fp8Experts", "VERIFIED"]

# the transformers classes whose code was read and whose tiny models tests/test_torch_experts.py converts
VERIFIED = ("Qwen3MoeExperts", "Qwen2MoeExperts", "OlmoeExperts", "MixtralExperts", "DeepseekV3Experts")

_FORWARD_ARGS = ("hidden_states", "top_k_index", "top_k_weights")
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# transformers' @use_experts_implementation flags, at the values of the layout moe_fp8 computes
_LAYOUT_FLAGS = {
    "is_transposed": False,
    "is_concatenated": True,
    "has_bias": False,
    "has_gate": True,
    "has_post_expert_norm": False,
}
_MX_BLOCK = (1, 32)
_WEIGHTS = ("gate_up_proj", "down_proj")


def _is_silu(act):
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation" or act is torch.nn.functional.silu


def _unsupported_reason(module):
    """None when ``module`` is a fused experts module ``Fp8Experts`` computes exactly (the module
    docstring), else why it is not, in words for convert's warning."""
    params = dict(module.named_parameters(recurse=False))
    gate_up, down = params.get("gate_up_proj"), params.get("down_proj")
    if gate_up is None or down is None:
        return f"its parameters are {sorted(params)}, not gate_up_proj and down_proj"
    extra = sorted(set(params) - set(_WEIGHTS)) + [
        f"{child}.{p}" for child, sub in module.named_children() for p, _ in sub.named_parameters()
    ]
    if extra:
        return f"it has parameters beside gate_up_proj and down_proj ({', '.join(extra)}: biases or norms)"
    if gate_up.dtype not in _FLOAT_DTYPES or down.dtype not in _FLOAT_DTYPES:
        return f"its weights are {gate_up.dtype} and {down.dtype}, not float32, float16 or bfloat16"
    shapes = f"gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)}"
    if gate_up.dim() != 3 or down.dim() != 3:
        return f"{shapes} are not 3-D [E, 2I, H] and [E, H, I]"
    e, two_i, h = gate_up.shape
    if two_i % 2 or tuple(down.shape) != (e, h, two_i // 2):
        return f"{shapes} are not [E, 2I, H] and [E, H, I]"
    for flag, want in _LAYOUT_FLAGS.items():
        got = getattr(module, flag, want)
        if got != want:
            return f"its layout flag {flag} is {got!r}, not {want!r}"
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and getattr(gate, "__qualname__", "") != "_default_apply_gate":
        return f"it gates with its own {type(module).__name__}._apply_gate, not act_fn(gate) * up"
    act = getattr(module, "act_fn", None)
    if not _is_silu(act):
        return f"act_fn is {type(act).__name__}, not SiLU"
    try:
        params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        params = []
    names = tuple(p.name for p in params)
    if names[:3] != _FORWARD_ARGS or any(
        p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[3:]
    ):
        return f"its forward takes ({', '.join(names)}), not ({', '.join(_FORWARD_ARGS)})"
    return None


def _quantize_expert(w, scheme, block, mx):
    """(codes uint8 [N, K], weight scale) of one expert's float weight [N, K] where it lives: on the
    CPU ``seam.Fp8Weight.from_float`` (so ``seam.Fp8Experts.from_float``, which quantizes expert by
    expert the same way, gives the same bytes); on a GPU the same rule there (DynamicFp8's and
    Fp8Linear's GPU block quantizer), the float weight never visiting the host."""
    # finite or allowed: from_experts checked the whole stack, naming the expert
    if mx:
        fw = Fp8Weight.from_float(w, block_size=_MX_BLOCK, scale_format="e8m0", allow_nonfinite=True)
    elif block is not None:
        if w.is_cuda:
            return _quantize_blocks_on_gpu(w, block)
        fw = Fp8Weight.from_float(w, block_size=block, allow_nonfinite=True)
    else:
        fw = Fp8Weight.from_float(w, per_channel=scheme == ActivationScheme.PER_TOKEN, allow_nonfinite=True)
    scale = fw.weight_scale
    scale = scale if block is not None or mx else scale.reshape(-1 if scheme == ActivationScheme.PER_TOKEN else ())
    return _as_tensor(fw.data, w.device), _as_tensor(scale, w.device)


def _as_tensor(arr, device):
    """A torch tensor of a numpy or cupy array (host arrays copied, device arrays shared)."""
    t = _tensor(arr)
    return t if t.device == device else t.to(device)


def _quantize_stack(w, scheme, block, mx):
    """Codes [E, N, K] and scales [E, ...] of float experts [E, N, K], quantized expert by expert
    into buffers allocated once: a GPU needs room for one expert's temporaries, not for a second
    copy of the layer."""
    codes = scales = None
    with torch.no_grad():
        for e in range(w.shape[0]):
            c, s = _quantize_expert(w[e], scheme, block, mx)
            if codes is None:
                codes = torch.empty((w.shape[0], *c.shape), dtype=torch.uint8, device=w.device)
                scales = torch.empty((w.shape[0], *s.shape), dtype=s.dtype, device=w.device)
            codes[e].copy_(c.view(torch.uint8))
            scales[e].copy_(s)
            del c, s
    return codes, scales


def _input_scales(value, e, name):
    """Static input scales for E experts: one number or [E], as a float32 tensor [E]."""
    if value is None:
        raise ValueError(
            f"{name} must be given for scheme 'static' (one scale or one per expert), got None; "
            f"measure them with vtnumba.torch.calibrate(model, run)"
        )
    host = np.asarray(
        value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value, dtype=np.float32
    ).reshape(-1)
    if host.size == 1:
        host = np.repeat(host, e)
    if host.size != e:
        raise ValueError(f"{name} must be one scale or [E] = ({e},) scales, got {host.size} values")
    if not (np.isfinite(host) & (host > 0)).all():
        raise ValueError(f"{name} must be positive and finite for every expert, got {host.tolist()}")
    return torch.from_numpy(host.copy())


class Fp8Experts(nn.Module):
    """A MoE layer's routed experts in FP8 (the module docstring): ``forward(hidden_states [..., H],
    top_k_index int [T, k], top_k_weights [T, k]) -> [..., H]`` in hidden_states' dtype, exactly
    ``seam.moe_fp8`` over ``gate_up`` [E, 2I, H] and ``down`` [E, H, I] -- transformers' experts
    call, in place of Qwen3MoeExperts and its kind. Ids outside [0, E) (transformers' sentinel E,
    vLLM's -1) route nothing.

    Build it with ``Fp8Experts.from_experts(module, scheme)`` (a transformers experts module),
    ``Fp8Experts(gate_up, down)`` (two ``seam.Fp8Experts`` of one scheme, or ``ResidentFp8`` of
    them) or ``Fp8Experts.from_checkpoint(path, prefix)``. ``fp8_experts`` is the pair of seam
    objects viewing the buffers. A GPU forward runs on torch's current stream with results from
    torch's allocator; under ``torch.compile`` the forward is ``torch.ops.vtnumba.moe_fp8``.
    Inference only.
    """

    _FORMAT_BUFFERS = (
        "gate_up_proj",
        "gate_up_proj_scale",
        "gate_up_proj_input_scale",
        "down_proj",
        "down_proj_scale",
        "down_proj_input_scale",
    )

    def __init__(self, gate_up, down, *, source=None):
        super().__init__()
        pair = []
        for name, ex in (("gate_up", gate_up), ("down", down)):
            if isinstance(ex, ResidentFp8):
                ex = ex.weight
            if not isinstance(ex, SeamExperts):
                raise TypeError(f"{name} must be a seam.Fp8Experts or a ResidentFp8 of one, got {type(ex).__name__}")
            pair.append(ex)
        gate_up, down = pair
        e, two_i, h = gate_up.shape
        if two_i % 2 or down.shape != (e, h, two_i // 2):
            raise ValueError(
                f"down must be [E, H, I] = ({e}, {h}, {two_i // 2}) for gate_up [E, 2I, H] = "
                f"{gate_up.shape}, got {down.shape}"
            )
        for key in (
            "activation_scheme",
            "block_size",
            "scale_ue8m0",
            "scale_format",
            "activation_scale_format",
            "per_channel",
        ):
            if getattr(gate_up, key) != getattr(down, key):
                raise ValueError(
                    f"down.{key} must be gate_up's {getattr(gate_up, key)!r} (one scheme per layer), "
                    f"got {getattr(down, key)!r}"
                )
        if gate_up.activation_scale_rounding not in (None, "rceil"):
            # the op carries no rounding: refused rather than computed with another one
            raise ValueError(
                f"gate_up.activation_scale_rounding must be 'rceil' (the seam's default), got "
                f"{gate_up.activation_scale_rounding!r}"
            )
        self.num_experts, self.hidden_dim, self.intermediate_dim = e, h, two_i // 2
        self.format = gate_up.format  # seam.Fp8Format (down's is the same but for nothing the op carries)
        self.activation_scheme = ActivationScheme(gate_up.activation_scheme)
        self.block_size = gate_up.block_size
        self.scale_ue8m0 = gate_up.scale_ue8m0
        self.activation_scale_format = gate_up.activation_scale_format or "float32"
        self.source = source if source is not None else gate_up.source
        for name, ex in (("gate_up_proj", gate_up), ("down_proj", down)):
            codes = _tensor(ex.host_data(name))
            self.register_buffer(name, codes.view(torch.float8_e4m3fn))
            self.register_buffer(f"{name}_scale", _tensor(ex.weight_scale))
            scale_in = None
            if ex.input_scale is not None:
                scale_in = torch.tensor(np.asarray(ex.input_scale, np.float32), device=codes.device)
            self.register_buffer(f"{name}_input_scale", scale_in)
        self._states = {}  # device index (-1: the CPU) -> (versions, (gate_up, down) seam Fp8Experts)
        self._resident = {}  # device index -> the ResidentFp8 pair of the host experts (CPU buffers, GPU input)

    # -- constructors ------------------------------------------------------------------------------
    @classmethod
    def from_experts(
        cls,
        module,
        scheme="dynamic",
        *,
        input_scales=None,
        block_size=None,
        mxfp8=False,
        scale_ue8m0=False,
        release=False,
        allow_nonfinite=False,
    ):
        """Quantize a transformers experts module (``gate_up_proj`` [E, 2I, H], ``down_proj``
        [E, H, I]; the module docstring says which) where its weights live, expert by expert:

        - 'dynamic': per-tensor scale per expert, one dynamic activation scale per call;
        - 'per_token': per-channel weight scales, one dynamic scale per token;
        - 'static': per-tensor weights and ``input_scales`` {'gate_up_proj': s, 'down_proj': s}, each
          one number or one per expert (``calibrate`` measures them);
        - 'per_group': ``block_size`` blocks (default 128 x 128), activations per 1 x bk group
          (``scale_ue8m0``: activation scales rounded up to powers of two, DeepSeek-V3's);
        - ``mxfp8=True`` (scheme 'per_group'): MXFP8, E8M0 scales per 1 x 32 on weights and
          activations.

        Expert e's codes and scales are ``seam.Fp8Weight.from_float(w[e], ...)``'s, so the layer is
        ``seam.Fp8Experts.from_float``'s. ``release=True`` drops each float parameter from
        ``module`` as soon as its FP8 replacement is made (``convert`` does: a GPU then needs room for
        the float model and one expert's work). A NaN or Inf in a weight is refused (its index [e, n,
        k] named) unless ``allow_nonfinite=True`` (``seam.Fp8Weight.from_float``'s rule)."""
        reason = _unsupported_reason(module)
        if reason is not None:
            raise ValueError(
                f"module must be a fused experts module (gate_up_proj [E, 2I, H], down_proj [E, H, I], "
                f"SiLU, no bias), got a {type(module).__name__}: {reason}"
            )
        scheme = _scheme(scheme)
        if mxfp8:
            if scheme != ActivationScheme.PER_GROUP:
                raise ValueError(
                    f"scheme must be 'per_group' with mxfp8=True (MXFP8 is 1 x 32 E8M0 groups), got {scheme.value!r}"
                )
            if scale_ue8m0:
                raise ValueError(
                    "scale_ue8m0 must be False with mxfp8=True (an E8M0 scale is a power of two already), got True"
                )
        block = None
        if scheme == ActivationScheme.PER_GROUP:
            block = _MX_BLOCK if mxfp8 else tuple(block_size or (128, 128))
        e = module.gate_up_proj.shape[0]
        scales_in = {}
        if scheme == ActivationScheme.STATIC:
            given = input_scales or {}
            for name in _WEIGHTS:
                scales_in[name] = _input_scales(given.get(name), e, f"input_scales['{name}']")
        for name in _WEIGHTS:  # both checked before either is quantized (or released)
            refuse_nonfinite(getattr(module, name), f"module.{name}", allow_nonfinite)
        parts = {}
        for name in _WEIGHTS:
            w = getattr(module, name).detach()
            codes, scale = _quantize_stack(w, scheme, block, mxfp8)
            device = codes.device
            parts[name] = (codes, scale, None if name not in scales_in else scales_in[name].to(device))
            del w
            if release:  # the float weight goes (if nobody else holds it) before the next is quantized
                setattr(module, name, None)
        pair = [
            _seam_experts_of(parts[name], scheme, block, scale_ue8m0, "e8m0" if mxfp8 else None) for name in _WEIGHTS
        ]
        return cls(*pair)

    @classmethod
    def from_checkpoint(
        cls,
        path,
        prefix,
        *,
        num_experts=None,
        activation_scheme=None,
        block_size=None,
        scale_ue8m0=None,
        activation_scale_format=None,
    ):
        """The FP8 experts ``prefix`` (e.g. 'model.layers.0.mlp.experts') of a safetensors
        checkpoint (a path or a ``seam.Checkpoint``), stored per expert ('{prefix}.{e}.gate_proj.weight'
        ...: Qwen3-FP8, DeepSeek-V3, ModelOpt, compressed-tensors) or fused (transformers'
        '{prefix}.gate_up_proj', or this module's own buffers, a ``state_dict()`` saved as it is):
        ``seam.load_fp8_experts``, whose keywords these are (None: the format a vtnumba checkpoint
        recorded)."""
        gate_up, down = load_fp8_experts(
            path,
            prefix,
            num_experts=num_experts,
            activation_scheme=activation_scheme,
            block_size=block_size,
            scale_ue8m0=scale_ue8m0,
            activation_scale_format=activation_scale_format,
        )
        return cls(gate_up, down)

    # -- what the layer is ---------------------------------------------------------------------------
    def _parts(self):
        b = self._buffers
        return (
            b["gate_up_proj"],
            b["gate_up_proj_scale"],
            b["gate_up_proj_input_scale"],
            b["down_proj"],
            b["down_proj_scale"],
            b["down_proj_input_scale"],
            self.activation_scheme.value,
            self.block_size,
            self.scale_ue8m0,
            self.activation_scale_format,
        )

    @property
    def fp8_experts(self):
        """(gate_up, down): the seam ``Fp8Experts`` viewing this layer's buffers where they are
        (numpy on the CPU, cupy on a GPU): what ``seam.moe_fp8`` takes."""
        index = self.gate_up_proj.get_device() if self.gate_up_proj.is_cuda else -1
        return self._state(index)

    def _state(self, index):
        parts = self._parts()
        versions = _versions(parts[:6])
        entry = self._states.get(index)
        if entry is not None and entry[0] == versions:
            return entry[1]
        if index < 0:
            pair = _experts_pair(parts, self.source)
        elif self.gate_up_proj.is_cuda:
            if self.gate_up_proj.get_device() != index:
                raise ValueError(
                    f"hidden_states must be on the layer's device {self.gate_up_proj.device}, got a "
                    f"tensor on cuda:{index}"
                )
            pair = _on_device(index, lambda: _experts_pair(parts, self.source))
        else:  # CPU buffers, a GPU input: the host experts made resident there once
            resident = self._resident.get(index)
            if resident is None or entry is not None:
                host = _experts_pair(parts, self.source)
                with on_torch_stream(index):  # the upload is ordered before this forward's work
                    resident = self._resident[index] = tuple(ResidentFp8(ex, f"cuda:{index}") for ex in host)
            pair = tuple(r.weight for r in resident)
        self._states[index] = (versions, pair)
        return pair

    def _apply(self, fn, *args, **kwargs):  # .to(), .cuda(), .half(): the buffers move, states go
        self._states, self._resident = {}, {}
        kept = {}
        for name in self._FORMAT_BUFFERS:  # codes and scales keep their dtypes under model.half()
            t = self._buffers.get(name)
            if t is not None:
                moved = fn(t)
                kept[name] = moved if moved.dtype == t.dtype else t.to(moved.device)
        for name in kept:
            self._buffers[name] = None
        result = super()._apply(fn, *args, **kwargs)
        self._buffers.update(kept)
        return result

    def _load_from_state_dict(self, *args, **kwargs):
        # the seam keeps host copies of some scales: every state is rebuilt from the new values
        self._states, self._resident = {}, {}
        return super()._load_from_state_dict(*args, **kwargs)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        if _is_compiling():
            return moe_fp8(
                hidden_states,
                top_k_index,
                top_k_weights,
                *self._parts()[:6],
                self.activation_scheme.value,
                None if self.block_size is None else list(self.block_size),
                self.scale_ue8m0,
                self.activation_scale_format,
            )
        if not isinstance(hidden_states, torch.Tensor):
            raise TypeError(f"hidden_states must be a torch.Tensor, got {type(hidden_states).__name__}")
        index = hidden_states.get_device()
        if index < 0 and self.gate_up_proj.is_cuda:
            raise ValueError(
                f"hidden_states must be on the layer's device {self.gate_up_proj.device}, got a tensor "
                f"on {hidden_states.device}"
            )
        return _moe_forward(self._state(index), hidden_states, top_k_index, top_k_weights)

    def extra_repr(self):
        if self.activation_scale_format == "e8m0":
            scale = "MXFP8 (1 x 32 E8M0)"
        elif self.block_size is not None:
            scale = f"block {self.block_size}"
        else:
            scale = "per-channel" if self.gate_up_proj_scale.dim() > 1 else "per-tensor"
        return (
            f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
            f"intermediate_dim={self.intermediate_dim}, activation_scheme={self.activation_scheme.value!r}, "
            f"weight_scale={scale}"
        )


def _seam_experts_of(part, scheme, block, ue8m0, act_format):
    """The seam Fp8Experts of freshly quantized (codes, scales, input scales), on their device."""
    codes, scale, scale_in = part

    def make():
        return SeamExperts(
            _view(codes),
            _view(scale),
            input_scale=None if scale_in is None else _view(scale_in),
            activation_scheme=scheme.value,
            block_size=block,
            scale_ue8m0=ue8m0,
            activation_scale_format=act_format,
        )

    return _on_device(codes.get_device(), make) if codes.is_cuda else make()
