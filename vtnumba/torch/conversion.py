"""``convert`` (a model's linear layers and MoE experts to FP8, in place), ``calibrate`` (static
activation scales) and ``conversion_report`` (what was converted, what is left in float)."""

import dataclasses
import warnings

import numpy as np
import torch
from torch import nn

from .._format import E4M3_MAX
from ..ops import ActivationScheme
from ..seam import Checkpoint, Fp8Config
from ..seam._finite import refuse_nonfinite
from ._common import _scheme
from .experts import _FLOAT_DTYPES, _FORWARD_ARGS, _WEIGHTS, Fp8Experts, _unsupported_reason
from .linear import Fp8Linear

__all__ = ["convert", "calibrate", "conversion_report", "ConversionReport"]

# a 2-D float weight this large that nothing converted is worth a word (smaller ones: biases' kin,
# the odd projection to one logit)
_REPORTED_2D_BYTES = 1 << 20


def _plan(config, ignore):
    """(activation scheme, per-channel weights, Fp8Config: the ignore rules and block size) of a config."""
    if isinstance(config, Fp8Config):
        if ignore:
            config = dataclasses.replace(config, ignore=config.ignore + tuple(ignore))
        return ActivationScheme(config.activation_scheme), config.weight_strategy == "channel", config
    if isinstance(config, str):
        scheme = _scheme(config, "config")
        block = (128, 128) if scheme == ActivationScheme.PER_GROUP else None
        rules = Fp8Config(
            "fp8",
            "channel" if scheme == ActivationScheme.PER_TOKEN else "block" if block else "tensor",
            scheme.value,
            tuple(ignore),
            block,
        )
        return scheme, scheme == ActivationScheme.PER_TOKEN, rules
    raise TypeError(
        f"config must be a seam.Fp8Config or a scheme ('dynamic', 'static', 'per_token', 'per_group'), "
        f"got {type(config).__name__}"
    )


# -- what a module is -----------------------------------------------------------------------------


def _holds_3d_float(module):
    return any(p.dim() == 3 and p.dtype in _FLOAT_DTYPES for p in module.parameters(recurse=False))


def _is_router(name, module, modules):
    """A MoE router: a router class (Qwen3MoeTopKRouter, DeepseekV3TopkRouter, DeepSeek's MoEGate)
    or a module named ``gate`` / ``*_gate`` beside an ``experts`` module (an older Mixtral's
    ``gate`` nn.Linear, Qwen2-MoE's ``shared_expert_gate``). Routers stay in float, as vLLM keeps
    them (ReplicatedLinear without a quant config): a few logits decide which experts run."""
    cls = type(module).__name__
    if "Router" in cls or cls.endswith("Gate"):
        return True
    parent_name, _, leaf = name.rpartition(".")
    if leaf == "gate" or leaf.endswith("_gate"):
        parent = modules.get(parent_name)
        return parent is not None and hasattr(parent, "experts")
    return False


def _is_exempt_2d(name, module, modules):
    """Embeddings, norms and routers: 2-D weights left in float on purpose."""
    cls = type(module).__name__
    leaf = name.rpartition(".")[2]
    return (
        isinstance(module, nn.Embedding)
        or "Embedding" in cls
        or "embed" in leaf
        or "Norm" in cls
        or _is_router(name, module, modules)
    )


def _left_in_float(model, is_ignored, why_ignored=None):
    """The weights convert warns about, as 'name [shape] dtype: why': every 3-D floating-point
    parameter, and every 2-D one of at least 1 MiB not ignored, an embedding, a norm or a router.
    ``why_ignored(name)`` says which rule ignored a layer (convert's ``ignore=`` or the config's
    list)."""
    modules = dict(model.named_modules())
    seen, found = set(), []
    for mname, module in modules.items():
        if isinstance(module, (Fp8Linear, Fp8Experts)):
            continue
        for pname, p in module.named_parameters(recurse=False):
            if p.dtype not in _FLOAT_DTYPES or id(p) in seen or p.dim() not in (2, 3):
                continue
            seen.add(id(p))
            full = f"{mname}.{pname}" if mname else pname
            what = f"{full} {list(p.shape)} {str(p.dtype).removeprefix('torch.')}"
            if p.dim() == 3:
                why = _unsupported_reason(module)
                if is_ignored(mname):
                    why = why_ignored(mname) if why_ignored is not None else "ignored"
                elif why is None:
                    why = "not converted"
                else:
                    why = f"{type(module).__name__} is not a layout vtnumba converts: {why}"
                found.append(f"{what}: {why}")
            elif (
                p.numel() * p.element_size() >= _REPORTED_2D_BYTES
                and not is_ignored(mname)
                and not _is_exempt_2d(mname, module, modules)
            ):
                found.append(f"{what}: a {type(module).__name__} weight, not an nn.Linear")
    return found


def _replace(model, name, layer):
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, layer)  # the float layer goes (if nobody holds it)


# -- convert --------------------------------------------------------------------------------------


def _ignore_reason(config, ignore):
    """why(name): which rule ignores layer ``name``: convert's ``ignore=`` argument or the config's
    own ignore list (a checkpoint's ``modules_to_not_convert``, say)."""
    by_argument = Fp8Config("fp8", "tensor", "dynamic", tuple(ignore))
    listed = tuple(ignore)

    def why(name):
        if listed and by_argument.is_ignored(name):
            return f"ignored: it matches convert's ignore={list(listed)!r}"
        return "ignored: it matches the config's ignore list"

    return why


def _scheme_of(layer):
    """What a converted layer was converted to, in words convert's messages use."""
    text = f"activation_scheme={layer.activation_scheme.value!r}"
    if layer.block_size is not None:
        text += f", block_size={tuple(layer.block_size)}"
    if getattr(layer, "activation_scale_format", "float32") == "e8m0":
        text += " (MXFP8)"
    return text


def _refuse_reconversion(model, scheme, rules, mxfp8):
    """Refuse a model that already holds vtnumba FP8 layers of another scheme than this call's.

    Refused rather than reconverted: convert released each float weight once its FP8 layer was in,
    so a new scheme could only be quantized from the FP8 codes -- a second rounding on top of the
    first, worse than quantizing the float weights, and not what a user asking for a scheme gets
    from a float model. A layer already in the requested scheme is kept (converting twice is a
    no-op)."""
    for name, module in model.named_modules():
        if not isinstance(module, (Fp8Linear, Fp8Experts)) or rules.is_ignored(name):
            continue
        block = rules.weight_block_size if scheme == ActivationScheme.PER_GROUP else None
        want_block = None if block is None else tuple(block)
        have_block = None if module.block_size is None else tuple(module.block_size)
        same = module.activation_scheme == scheme and have_block == want_block
        if isinstance(module, Fp8Experts):
            same = same and (module.activation_scale_format == "e8m0") == mxfp8
        if not same:
            raise ValueError(
                f"model must hold float layers to convert to {scheme.value!r}, got {name or 'model'!r} "
                f"already converted ({type(module).__name__}, {_scheme_of(module)}): its float weight "
                f"is gone, and re-quantizing FP8 codes would round twice; load the float model again "
                f"and convert that"
            )


def convert(
    model,
    config=None,
    *,
    input_scales=None,
    ignore=(),
    checkpoint=None,
    out_dtype=None,
    allow_nonfinite=False,
):
    """Replace, in place, every ``nn.Linear`` of ``model`` that ``config`` quantizes with an
    ``Fp8Linear``, and every fused MoE experts module with an ``Fp8Experts``; return ``model`` (the
    new layer when ``model`` is itself one of them).

    - ``config``: a ``seam.Fp8Config`` (``Fp8Config.from_hf(path)``: its activation scheme, weight
      granularity or block size and ignore list), None (the default: the config a vtnumba
      ``checkpoint`` records, ``Fp8Config.from_checkpoint``, else 'dynamic') or a scheme:
      'dynamic' (per-tensor weights and activations), 'per_token' (per-channel weights, per-token activations), 'static' (per-tensor
      weights, static activation scales from ``input_scales``) or 'per_group' (128 x 128 weight
      blocks, 1 x 128 activation groups: DeepSeek-V3's format). An MXFP8 config,
      ``Fp8Config("mxfp8", "block", "per_group", (), (1, 32), activation_scale_format="e8m0")``
      (or ``Fp8Config.from_hf`` of an MXFP8 checkpoint; its ``mxfp8`` property is then True),
      makes the experts MXFP8 (E8M0 scales per 1 x 32 on weights and activations); its linear
      layers get float32 scales per 1 x 32 block, as before (``Fp8Linear`` takes no E8M0 scales).
    - Experts: transformers' fused experts (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I],
      SiLU, no bias: Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral, DeepSeek-V3 and their kin;
      ``vtnumba.torch.experts`` says which). Other layouts (gpt-oss's [E, H, 2I] with biases and a
      clamped SwiGLU, anything unknown) stay in float. Routers (``gate``, ``shared_expert_gate``
      beside an experts module, router classes) and norms stay in float; shared experts are
      ``nn.Linear`` and convert as any.
    - Each layer is quantized where its weight lives: a model already on a GPU is converted there,
      layer by layer (experts expert by expert), and each float weight is released once its
      replacement is in (unless the caller holds it), so the GPU needs room for the float model
      plus one layer's work.
    - A layer is skipped (kept as it is) when its name in ``model.named_modules()`` matches the
      config's ignore list or ``ignore`` (names, globs, 're:' regexes), as upstream vLLM's
      ``get_quant_method`` gives ignored layers the unquantized method.
    - ``input_scales``: for static activations, {layer name: scale} (``calibrate`` measures them);
      experts take '<name>.gate_up_proj' and '<name>.down_proj', each one scale or one per expert.
    - ``checkpoint``: read each converted layer's FP8 weight from this safetensors checkpoint under
      its name (``Fp8Linear.from_checkpoint``, ``Fp8Experts.from_checkpoint``) instead of
      quantizing the float weight; the new layer is placed on the float layer's device.
    - A float weight holding a NaN or an Inf is refused, naming it and the index of the first bad
      value, unless ``allow_nonfinite=True`` (then NaN is stored as code 0x7F and Inf saturates to
      +-448, as ``seam.Fp8Weight.from_float`` does under the same keyword).
    - A model already converted is refused when it holds an FP8 layer of another scheme than
      ``config``'s (its float weights are gone: load the float model again); one already in that
      scheme is kept as it is.

    Then it warns (one ``UserWarning`` naming each) about every weight it leaves in floating point:
    every 3-D floating-point parameter, and every 2-D one of at least 1 MiB that is not ignored, an
    embedding, a norm or a router. ``conversion_report(model)`` tells the rest.

    After conversion ``state_dict()`` holds each layer's FP8 buffers (``Fp8Linear``: ``weight``
    float8_e4m3fn, ``weight_scale``, ``input_scale``, ``bias``; ``Fp8Experts``: its module
    docstring) under the layer's name.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if config is None:  # what save_checkpoint recorded, so the layers come back as saved
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            checkpoint = Checkpoint(checkpoint)
        config = (checkpoint is not None and Fp8Config.from_checkpoint(checkpoint)) or "dynamic"
    scheme, per_channel, rules = _plan(config, ignore)
    mxfp8 = getattr(rules, "activation_scale_format", "float32") == "e8m0"
    _refuse_reconversion(model, scheme, rules, mxfp8)
    modules = dict(model.named_modules())
    experts = [
        name
        for name, module in modules.items()
        if _holds_3d_float(module) and not rules.is_ignored(name) and _unsupported_reason(module) is None
    ]
    targets = [
        name
        for name, module in modules.items()
        if isinstance(module, nn.Linear) and not rules.is_ignored(name) and not _is_router(name, module, modules)
    ]
    del modules
    block = dict(block_size=rules.weight_block_size, scale_ue8m0=getattr(rules, "activation_scale_ue8m0", False))
    if checkpoint is None:  # every weight checked before any is quantized: a refusal changes nothing
        for name in experts:
            module = model.get_submodule(name)
            for w in _WEIGHTS:
                refuse_nonfinite(getattr(module, w), f"{name}.{w}" if name else w, allow_nonfinite)
        for name in targets:
            refuse_nonfinite(model.get_submodule(name).weight, f"{name}.weight" if name else "weight", allow_nonfinite)
    static = scheme == ActivationScheme.STATIC and checkpoint is None
    if static:
        for name in targets:
            if input_scales is None or name not in input_scales:
                raise ValueError(
                    f"input_scales must give a scale for layer {name!r} (static activations), got "
                    f"{'none' if input_scales is None else 'no entry for it'}; measure them with "
                    f"vtnumba.torch.calibrate(model, run)"
                )
        for name in experts:
            missing = [f"{name}.{w}" for w in _WEIGHTS if input_scales is None or f"{name}.{w}" not in input_scales]
            if missing:
                raise ValueError(
                    f"input_scales must give the scales of experts {name!r} (static activations: "
                    f"{', '.join(repr(m) for m in missing)}), got "
                    f"{'none' if input_scales is None else 'no entry for them'}; measure them with "
                    f"vtnumba.torch.calibrate(model, run)"
                )
    converted = None
    if checkpoint is not None and experts and not isinstance(checkpoint, Checkpoint):
        checkpoint = Checkpoint(checkpoint)  # every experts layer reads its tensors by the headers parsed once
    for name in experts:
        module = model.get_submodule(name)
        if checkpoint is not None:
            layer = Fp8Experts.from_checkpoint(
                checkpoint,
                name,
                num_experts=module.gate_up_proj.shape[0],
                activation_scheme=scheme,
                block_size=rules.weight_block_size,
                scale_ue8m0=block["scale_ue8m0"],
                activation_scale_format=getattr(rules, "activation_scale_format", None),
            ).to(module.gate_up_proj.device)
        else:
            scales = {w: input_scales[f"{name}.{w}"] for w in _WEIGHTS} if static else None
            layer = Fp8Experts.from_experts(
                module,
                scheme,
                input_scales=scales,
                block_size=rules.weight_block_size,
                mxfp8=mxfp8,
                scale_ue8m0=block["scale_ue8m0"],
                release=True,
                allow_nonfinite=True,  # checked above, by the weights' names in the model
            )
        if name == "":
            converted = layer
            continue
        _replace(model, name, layer)
        del module, layer
    for name in targets:  # names only: a float layer is released as soon as its replacement is in
        linear = model.get_submodule(name)
        if checkpoint is not None:
            layer = Fp8Linear.from_checkpoint(
                checkpoint, name, activation_scheme=scheme, out_dtype=out_dtype, **block
            ).to(linear.weight.device)
        else:
            scale = input_scales[name] if scheme == ActivationScheme.STATIC else None
            layer = Fp8Linear.from_linear(
                linear,
                scheme,
                input_scale=scale,
                per_channel=per_channel,
                out_dtype=out_dtype,
                allow_nonfinite=True,  # checked above, by the weight's name in the model
                **block,
            )
        if name == "":  # model is itself a Linear
            converted = layer
            continue
        _replace(model, name, layer)
        del linear, layer
    result = converted if converted is not None else model
    left = _left_in_float(result, rules.is_ignored, _ignore_reason(config, ignore))
    if left:
        warnings.warn(
            f"vtnumba.torch.convert left {len(left)} weight(s) in floating point:\n  " + "\n  ".join(left),
            UserWarning,
            stacklevel=2,
        )
    return result


# -- what convert did -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConversionReport:
    """What a model holds after ``convert`` (``conversion_report``):

    - ``converted``: {module type: count} of the FP8 layers (``Fp8Linear``, ``Fp8Experts``);
    - ``fp8_bytes``: the bytes of their codes and scales;
    - ``float_bytes``: {module type: bytes} of floating-point parameters and buffers left, by the
      type of the module holding them (an ``Fp8Linear``'s float bias under 'Fp8Linear');
    - ``left_in_float``: the weights ``convert`` warns about ('name [shape] dtype: why'), ignored
      layers included (the report knows no config).
    """

    converted: dict
    fp8_bytes: int
    float_bytes: dict
    left_in_float: tuple

    def __str__(self) -> str:
        lines = [
            f"converted: {', '.join(f'{n} {t}' for t, n in sorted(self.converted.items())) or 'nothing'} "
            f"({self.fp8_bytes / 2**20:.1f} MiB of FP8 codes and scales)"
        ]
        total = sum(self.float_bytes.values())
        lines.append(f"left in floating point: {total / 2**20:.1f} MiB")
        for kind, nbytes in sorted(self.float_bytes.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {kind}: {nbytes / 2**20:.2f} MiB")
        if self.left_in_float:
            lines.append("weights convert warns about:")
            lines.extend(f"  {w}" for w in self.left_in_float)
        return "\n".join(lines)


_FP8_KINDS = (Fp8Linear, Fp8Experts)


def conversion_report(model: nn.Module) -> ConversionReport:
    """What ``convert`` made of ``model``: the FP8 layers by type, their bytes, and the
    floating-point bytes left by module type (``ConversionReport``; ``print`` it for a table)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    converted, float_bytes = {}, {}
    fp8_bytes, seen = 0, set()
    for module in model.modules():
        kind = type(module).__name__
        is_fp8 = isinstance(module, _FP8_KINDS)
        if is_fp8:
            converted[kind] = converted.get(kind, 0) + 1
        tensors: list[tuple[str, torch.Tensor]] = [(n, t) for n, t in module.named_parameters(recurse=False)]
        tensors += [(n, t) for n, t in module.named_buffers(recurse=False)]
        for name, t in tensors:
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            nbytes = t.numel() * t.element_size()
            if is_fp8 and name != "bias":
                fp8_bytes += nbytes
            elif t.dtype in _FLOAT_DTYPES:
                float_bytes[kind] = float_bytes.get(kind, 0) + nbytes
    return ConversionReport(converted, fp8_bytes, float_bytes, tuple(_left_in_float(model, lambda name: False)))


# -- calibrate ------------------------------------------------------------------------------------


def _finite_amax(x):
    finite = x[torch.isfinite(x)]
    return float(finite.abs().max()) if finite.numel() else None


def _experts_observer(name, amax):
    """A pre-hook measuring, per expert, the amax of the tokens routed to it (gate_up's input) and
    of SiLU(gate) * up (down's input), computed here from the float weights as the layer does."""

    def hook(module, args, kwargs):
        given = dict(zip(_FORWARD_ARGS, args), **kwargs)
        x, ids = given["hidden_states"].detach(), given["top_k_index"]
        x = x.reshape(-1, x.shape[-1])
        ids = ids.reshape(x.shape[0], -1)
        e = module.gate_up_proj.shape[0]
        seen_in = amax.setdefault(f"{name}.gate_up_proj", np.zeros(e))
        seen_mid = amax.setdefault(f"{name}.down_proj", np.zeros(e))
        for expert in torch.unique(ids).tolist():
            if not 0 <= expert < e:
                continue
            rows = x[(ids == expert).any(dim=-1)]
            a = _finite_amax(rows)
            if a is not None:
                seen_in[expert] = max(seen_in[expert], a)
            gate, up = nn.functional.linear(rows, module.gate_up_proj[expert].detach()).chunk(2, dim=-1)
            a = _finite_amax(module.act_fn(gate) * up)
            if a is not None:
                seen_mid[expert] = max(seen_mid[expert], a)

    return hook


def calibrate(model, run):
    """Static activation scales for ``convert(model, 'static', input_scales=...)``: the amax of every
    ``nn.Linear``'s input over the finite values seen while ``run()`` drives the model. ``run``
    takes no argument (e.g. ``lambda: st_model.encode(samples)`` or
    ``lambda: [model(x) for x in batches]``). The amax divided by 448 is upstream's static
    ``input_scale``. Returns {layer name: float32 scale}; a layer that saw only zeros gets the
    dynamic scheme's floor ``1 / (448 * 512)``.

    Fused experts modules (those ``convert`` takes) get one scale per expert under
    '<name>.gate_up_proj' (the tokens routed to the expert) and '<name>.down_proj' (SiLU(gate) * up
    of those tokens, computed from the float weights): float32 [E]. An expert no token reached gets
    the largest scale of its layer (it has none of its own, and a small one would clip whatever
    reaches it later), or the floor if no expert of the layer saw a token."""
    amax = {}

    def observer(name):
        def hook(module, args):
            a = _finite_amax(args[0].detach())
            if a is not None:
                amax[name] = max(amax.get(name, 0.0), a)

        return hook

    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            handles.append(module.register_forward_pre_hook(observer(name)))
        elif _holds_3d_float(module) and _unsupported_reason(module) is None:
            handles.append(module.register_forward_pre_hook(_experts_observer(name, amax), with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    floor = 1.0 / (E4M3_MAX * 512)
    scales = {}
    for name, a in amax.items():
        if isinstance(a, np.ndarray):
            a = np.where(a > 0, a, a.max())
            scales[name] = np.maximum(a / E4M3_MAX, floor).astype(np.float32)
        else:
            scales[name] = np.float32(max(a / E4M3_MAX, floor))
    return scales
