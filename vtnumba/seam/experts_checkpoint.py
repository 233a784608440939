"""Reading a mixture-of-experts layer's FP8 experts from safetensors checkpoints into two
``seam.Fp8Experts``: ``gate_up`` [E, 2I, H] (gate rows first, then up rows, transformers' order) and
``down`` [E, H, I]. The router (``mlp.gate``) is not read: it stays float, as vLLM and llm-compressor
keep it.

Two layouts, told apart by the tensor names under ``prefix`` (e.g. 'model.layers.3.mlp.experts';
``experts_layout``):

- 'per_expert': ``{prefix}.{e}.gate_proj``, ``{prefix}.{e}.up_proj``, ``{prefix}.{e}.down_proj``, each a
  dense FP8 layer (``.weight`` F8_E4M3 [N, K] with its scale, optional ``.input_scale``), e = 0 .. E-1:
  Qwen3-*-FP8 and DeepSeek-V3/R1 (``weight_scale_inv`` block scales, float32 / bfloat16, or UE8M0
  bytes F8_E8M0 / U8), ModelOpt FP8 (per-tensor ``weight_scale`` and a static ``input_scale`` per
  projection), compressed-tensors FP8 / FP8_DYNAMIC (per-tensor or per-channel ``weight_scale``).
  Every projection is read by ``load_fp8_linear`` (so by its one interpretation of each scale
  convention), and each expert's gate and up are fused by ``fuse_fp8_shards``, as vLLM fuses w1 and
  w3: per-tensor scales that differ are requantized to the larger one (``requantize_with_max_scale``),
  per-channel and block scales are concatenated, the static input scale is the max of the two.
- 'fused': transformers' ``FP8Experts`` parameters (transformers/integrations/finegrained_fp8.py):
  ``{prefix}.gate_up_proj`` F8_E4M3 [E, 2I, H] with ``{prefix}.gate_up_proj_scale_inv``, and
  ``{prefix}.down_proj`` [E, H, I] with ``{prefix}.down_proj_scale_inv``; block scales
  [E, ceil(N / bn), ceil(K / bk)] (float32, or E8M0 for ``scale_fmt`` "ue8m0"), or without blocks
  one scale per expert ([E], [E, 1], [E, 1, 1]) -- for gate_up transformers allocates [E, 2, 1], one
  scale for the gate half and one for the up half, which are fused per expert as above. Static
  activation scales: ``{prefix}.gate_up_proj_activation_scale`` and ``{prefix}.down_proj_activation_scale``
  [E]. Expert e's slices are read by ``load_fp8_linear`` too, through a view of the checkpoint in
  which they are a dense layer; errors name the real tensor and the slice, e.g.
  'model.layers.0.mlp.experts.gate_up_proj_scale_inv[3]'.

The number of experts E comes from the names (the largest index + 1, or the fused tensors' first
dimension); pass ``num_experts`` (the config's ``num_experts`` / ``n_routed_experts``) to catch a
missing last expert too. Refused, naming the tensor and the file: a missing expert, experts or
projections quantized differently (one scheme for the layer), shapes that do not make one MoE
layer, a bias (``Fp8Experts`` takes none), bad scales or NaN codes (as ``load_fp8_linear`` refuses
them). Only this layer's tensors are read, each by its own offset: never a whole shard.
"""

import math
import os

import numpy as np

from .checkpoint import _E8M0_DTYPES, Checkpoint, CheckpointLike, _checkpoint, _recorded_kwargs, load_fp8_linear
from .experts import Fp8Experts
from .fusion import fuse_fp8_shards

__all__ = ["load_fp8_experts", "experts_layout"]

_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_SCALE_SUFFIXES = ("weight_scale", "weight_scale_inv", "scale")  # load_fp8_linear's names, in its order


def _expert_tensors(ckpt, prefix):
    """{e: a tensor named '{prefix}.{e}.*'} for every expert index e the names hold."""
    start = len(prefix) + 1
    found = {}
    for name in ckpt.names(prefix + "."):
        head = name[start:].split(".", 1)[0]
        # not '²' (str.isdigit takes it, int refuses it), nor digits past any expert count
        if head.isascii() and head.isdigit() and len(head) < 10:
            found.setdefault(int(head), name)
    return found


def _expert_indices(ckpt, prefix):
    """The expert indices e named by tensors '{prefix}.{e}.*'."""
    return set(_expert_tensors(ckpt, prefix))


def experts_layout(path: CheckpointLike, prefix: str) -> str | None:
    """How the checkpoint stores the experts under ``prefix``: 'per_expert' ('{prefix}.{e}.gate_proj.weight'
    ...), 'fused' (transformers' '{prefix}.gate_up_proj' / '{prefix}.down_proj'), or None (neither:
    not a MoE layer, or its experts are elsewhere). Both at once is refused (which one to read is
    ambiguous)."""
    ckpt = _checkpoint(path, prefix)
    fused = [n for n in (f"{prefix}.gate_up_proj", f"{prefix}.down_proj") if n in ckpt]
    per_expert = _expert_tensors(ckpt, prefix)
    if fused and per_expert:
        one = per_expert[min(per_expert)]
        raise ValueError(
            f"experts under {prefix!r} must be stored either per expert ({prefix}.<e>.gate_proj.weight "
            f"...) or fused ({prefix}.gate_up_proj ...), got both ({fused[0]!r} in {ckpt.file(fused[0])!r} "
            f"and per-expert tensors, {one!r} in {ckpt.file(one)!r})"
        )
    return "fused" if fused else "per_expert" if per_expert else None


def load_fp8_experts(
    path: CheckpointLike,
    prefix: str,
    *,
    num_experts: int | None = None,
    activation_scheme: str | None = None,
    block_size: tuple[int, int] | None = None,
    scale_ue8m0: bool | None = None,
    activation_scale_format: str | None = None,
    activation_scale_rounding: str | None = None,
) -> tuple[Fp8Experts, Fp8Experts]:
    """``(gate_up, down)``: the FP8 experts of the MoE layer ``prefix`` (e.g.
    'model.layers.3.mlp.experts') from a safetensors checkpoint (file, directory, sharded index, or a
    ``Checkpoint`` -- pass one ``Checkpoint`` for every layer of a model so its headers are parsed
    once), for ``seam.moe_fp8``.

    ``activation_scheme``, ``block_size``, ``scale_ue8m0``, ``activation_scale_format``: as
    ``load_fp8_linear`` takes them (usually from ``Fp8Config``; ``Fp8Config.load_experts`` passes
    them), applied to every projection. ``num_experts``: E, if known; by default the largest
    index found + 1. ``source`` of each result records the layout, files, tensors and the scale
    convention read.

    Fused experts saved by vtnumba (``seam.save_fp8_checkpoint``, ``vtnumba.torch.save_checkpoint``)
    carry the ``Fp8Format`` of ``{prefix}.gate_up_proj`` and ``{prefix}.down_proj`` in the file's
    metadata: keywords left None are the saved ones, and one that contradicts the record is refused
    (``load_fp8_linear``). The scale and static input scale may be named as transformers names them
    (``_scale_inv``, ``_activation_scale``) or as ``vtnumba.torch.Fp8Experts``' ``state_dict`` does
    (``_scale``, ``_input_scale``), so a converted model's plain ``state_dict()`` saved with
    safetensors loads too.
    """
    ckpt = _checkpoint(path, prefix)
    if num_experts is not None and (
        isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1
    ):
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    layout = experts_layout(ckpt, prefix)
    if layout is None:
        near = ckpt.names(prefix + ".")[:4]
        raise ValueError(
            f"checkpoint must hold the experts of {prefix!r} ({prefix}.0.gate_proj.weight ..., or "
            f"{prefix}.gate_up_proj), got none in {ckpt.path!r}"
            + (f" (tensors under it: {near})" if near else f" (no tensor starts with {prefix!r})")
        )
    given = dict(
        activation_scheme=activation_scheme,
        block_size=block_size,
        scale_ue8m0=scale_ue8m0,
        activation_scale_format=activation_scale_format,
        activation_scale_rounding=activation_scale_rounding,
    )
    if layout == "per_expert":
        kw = _recorded_kwargs(ckpt, prefix, **given)
        kw.pop("format")
        return _load_per_expert(ckpt, prefix, num_experts, kw)
    kws = [_recorded_kwargs(ckpt, f"{prefix}.{proj}", **given) for proj in ("gate_up_proj", "down_proj")]
    formats = [kw.pop("format") for kw in kws]
    pair = _load_fused(ckpt, prefix, num_experts, *kws)
    for proj, fmt, experts in zip(("gate_up_proj", "down_proj"), formats, pair):
        if fmt is not None and experts.format != fmt:
            raise ValueError(
                f"experts {prefix}.{proj}: the tensors in {ckpt.path!r} must hold the format recorded in the "
                f"file's metadata ({fmt}), got {experts.format}: the file was edited after it was saved; "
                f"save it again"
            )
    return pair


# -- per-expert tensors ------------------------------------------------------------------------


def _scheme(ckpt, layer, with_input_scale):
    """A projection's quantization scheme, from the headers alone: which scale, its granularity, E8M0
    bytes or floats, and (where the activation scheme reads it) whether it has an input scale. None
    where ``load_fp8_linear`` will refuse the layer anyway (no scale, several), so its words are the
    ones seen."""
    present = [f"{layer}.{s}" for s in _SCALE_SUFFIXES if f"{layer}.{s}" in ckpt]
    wshape = ckpt.shape(f"{layer}.weight")
    if len(present) != 1 or len(wshape) != 2:
        return None
    sname = present[0]
    sshape = ckpt.shape(sname)
    n = wshape[0]
    if math.prod(sshape) == 1 and len(sshape) <= 2:
        kind = "per-tensor"
    elif sshape in ((n,), (n, 1)):
        kind = "per-channel"
    else:
        kind = "block"
    words = f"{kind} {sname.rsplit('.', 1)[1]}" + (" (E8M0 bytes)" if ckpt.dtype(sname) in _E8M0_DTYPES else "")
    if with_input_scale:
        words += " with input_scale" if f"{layer}.input_scale" in ckpt else " without input_scale"
    return words


def _load_per_expert(ckpt, prefix, num_experts, kw):
    indices = _expert_indices(ckpt, prefix)
    e_count = max(indices) + 1 if num_experts is None else num_experts
    if max(indices) >= e_count:
        raise ValueError(
            f"num_experts must cover every expert stored under {prefix!r}, got {num_experts} with "
            f"expert {max(indices)} in {ckpt.path!r}"
        )
    # Every name and shape is checked on the headers first, so a bad checkpoint fails before any
    # expert's data is read.
    for e in range(e_count):
        for proj in _PROJECTIONS:
            name = f"{prefix}.{e}.{proj}.weight"
            if name not in ckpt:
                raise ValueError(f"checkpoint must hold {name} (expert {e} of {e_count}), got none in {ckpt.path!r}")
            bname = f"{prefix}.{e}.{proj}.bias"
            if bname in ckpt:
                raise ValueError(
                    f"tensor {bname!r} must be absent (seam.Fp8Experts takes no bias), got one in {ckpt.file(bname)!r}"
                )
    gate0 = f"{prefix}.0.gate_proj.weight"
    gshape = ckpt.shape(gate0)
    if len(gshape) != 2:
        raise ValueError(f"tensor {gate0!r} must be 2-D [I, H], got shape {list(gshape)} in {ckpt.file(gate0)!r}")
    i_dim, h_dim = gshape
    want = {"gate_proj": [i_dim, h_dim], "up_proj": [i_dim, h_dim], "down_proj": [h_dim, i_dim]}
    with_input_scale = kw["activation_scheme"] in (None, "static")
    scheme0 = _scheme(ckpt, f"{prefix}.0.gate_proj", with_input_scale)
    for e in range(e_count):
        for proj in _PROJECTIONS:
            name = f"{prefix}.{e}.{proj}.weight"
            if list(ckpt.shape(name)) != want[proj]:
                what = "[I, H]" if proj != "down_proj" else "[H, I]"
                raise ValueError(
                    f"tensor {name!r} must have shape {what} = {want[proj]} (expert 0's gate_proj is "
                    f"[I, H] = {[i_dim, h_dim]}), got {list(ckpt.shape(name))} in {ckpt.file(name)!r}"
                )
            scheme = _scheme(ckpt, f"{prefix}.{e}.{proj}", with_input_scale)
            if scheme0 is not None and scheme is not None and scheme != scheme0:
                raise ValueError(
                    f"expert {e}'s {proj} ({prefix}.{e}.{proj}) must be quantized like expert 0's "
                    f"gate_proj ({scheme0}; one scheme for the whole MoE layer), got {scheme} in "
                    f"{ckpt.file(name)!r}"
                )
    gate_ups, downs, read = [], [], {"gate_up": [], "down": []}
    for e in range(e_count):
        gate, up, down = (load_fp8_linear(ckpt, f"{prefix}.{e}.{proj}", **kw) for proj in _PROJECTIONS)
        gate_ups.append(fuse_fp8_shards([gate, up]))
        downs.append(down)
        read["gate_up"] += [gate.source, up.source]
        read["down"].append(down.source)
    return (
        _stack(gate_ups, ckpt, prefix, "gate_up", _source(ckpt, "per_expert", read["gate_up"], gate_ups, True)),
        _stack(downs, ckpt, prefix, "down", _source(ckpt, "per_expert", read["down"], downs, False)),
    )


def _stack(weights, ckpt, prefix, what, source):
    """``Fp8Experts.stack``, its refusal ('weights[e]...') said of the layer and expert."""
    try:
        return Fp8Experts.stack(weights, source=source)
    except ValueError as exc:
        raise ValueError(
            f"experts {prefix!r} ({what}) in {ckpt.path!r}: {str(exc).replace('weights[', 'expert [')}"
        ) from None


_FUSION = (
    "gate rows [0, I) then up rows [I, 2I) of each expert, fused by fuse_fp8_shards as vLLM fuses "
    "w1 / w3: per-tensor scales requantized to the larger of the two, per-channel and block scales "
    "concatenated, the static input scale the max of gate's and up's"
)


def _source(ckpt, layout, sources, weights, fused):
    """Provenance of one ``Fp8Experts``: the dense loaders' record (files, tensors, scale and its
    convention, input scale) over every expert, expert 0's words for what they share."""
    tensors = list(dict.fromkeys(t for s in sources for t in s["tensors"]))
    source = {
        "layout": layout,
        "num_experts": len(weights),
        "files": sorted({os.path.basename(ckpt.file(t)) for t in tensors}),
        "tensors": tensors,
        "weight_scale": sources[0]["weight_scale"],
        "scale_convention": sources[0]["scale_convention"],
        "input_scale": "per expert" + (" (max of gate's and up's)" if fused else "")
        if weights[0].input_scale is not None
        else sources[0].get("input_scale"),
    }
    if fused:
        source["fusion"] = _FUSION
    return source


# -- transformers' fused tensors ---------------------------------------------------------------


class _ExpertSlices(Checkpoint):
    """A view of a checkpoint in which slices of 3-D expert tensors are dense layers: virtual tensor
    name -> (real name, expert, rows or None). Each real tensor is read once, when first needed, into
    ``arrays`` (shared by the views of every expert)."""

    def __init__(self, base, views, arrays):
        self.path = base.path
        self._base = base
        self._views = views
        self._arrays = arrays

    def __contains__(self, name):
        return name in self._views

    def format_of(self, layer):
        return None  # a slice is read with the keywords its experts' record settled (load_fp8_experts)

    def names(self, prefix=""):
        return sorted(n for n in self._views if n.startswith(prefix))

    def _slice_shape(self, name):
        real, _, rows = self._views[name]
        shape = list(self._base.shape(real)[1:])
        if rows is not None:
            shape[0] = len(range(*rows.indices(shape[0])))
        return tuple(shape)

    def dtype(self, name):
        return self._base.dtype(self._views[name][0])

    def shape(self, name):
        return self._slice_shape(name)

    def file(self, name):
        return self._base.file(self._views[name][0])

    def read(self, name):
        real, e, rows = self._views[name]
        if real not in self._arrays:
            self._arrays[real] = self._base.read(real)
        part = np.asarray(self._arrays[real][e])
        return part if rows is None else part[rows]


# Each role's names, the first transformers' (FP8Experts' parameters), the second the buffers of
# vtnumba.torch.Fp8Experts, so that its state_dict() saved as it is reads back
_FUSED_SUFFIXES = {"weight_scale_inv": ("_scale_inv", "_scale"), "input_scale": ("_activation_scale", "_input_scale")}


def _fused_names(ckpt, prefix, proj):
    """{role: tensor name} of the fused projection ``proj``: the one name of each role present (the
    first when none is); both names of a role present is refused (which one to read is ambiguous)."""
    base = f"{prefix}.{proj}"
    names = {"weight": base, "bias": f"{base}_bias"}
    for role, suffixes in _FUSED_SUFFIXES.items():
        present = [base + s for s in suffixes if base + s in ckpt]
        if len(present) > 1:
            raise ValueError(
                f"tensors {' and '.join(map(repr, present))} must not both be present (transformers' name and "
                f"vtnumba.torch.Fp8Experts' buffer name for one tensor: which one to read is ambiguous), got "
                f"both in {sorted({ckpt.file(n) for n in present})}"
            )
        names[role] = present[0] if present else base + suffixes[0]
    return names


def _load_fused(ckpt, prefix, num_experts, kw_gate_up, kw_down):
    gu, dn = _fused_names(ckpt, prefix, "gate_up_proj"), _fused_names(ckpt, prefix, "down_proj")
    for names in (gu, dn):
        for part in ("weight", "weight_scale_inv"):
            if names[part] not in ckpt:
                raise ValueError(
                    f"checkpoint must hold {names[part]} (transformers' fused FP8 experts: "
                    f"{gu['weight']}, {dn['weight']} and their _scale_inv, or vtnumba.torch.Fp8Experts' "
                    f"_scale), got none in {ckpt.path!r}"
                )
        if names["bias"] in ckpt:
            raise ValueError(
                f"tensor {names['bias']!r} must be absent (seam.Fp8Experts takes no bias), got one in "
                f"{ckpt.file(names['bias'])!r}"
            )
    gshape, dshape = ckpt.shape(gu["weight"]), ckpt.shape(dn["weight"])
    if len(gshape) != 3 or gshape[1] % 2:
        raise ValueError(
            f"tensor {gu['weight']!r} must be [E, 2I, H] (gate rows, then up rows), got shape "
            f"{list(gshape)} in {ckpt.file(gu['weight'])!r}"
        )
    e_count, two_i, h_dim = gshape
    if list(dshape) != [e_count, h_dim, two_i // 2]:
        raise ValueError(
            f"tensor {dn['weight']!r} must be [E, H, I] = {[e_count, h_dim, two_i // 2]} for "
            f"{gu['weight']} [E, 2I, H] = {list(gshape)}, got {list(dshape)} in "
            f"{ckpt.file(dn['weight'])!r}"
        )
    if num_experts is not None and e_count != num_experts:
        raise ValueError(
            f"tensor {gu['weight']!r} must hold num_experts = {num_experts} experts, got {e_count} in "
            f"{ckpt.file(gu['weight'])!r}"
        )
    for names in (gu, dn):
        for part in ("weight_scale_inv", "input_scale"):
            name = names[part]
            if name in ckpt and (not ckpt.shape(name) or ckpt.shape(name)[0] != e_count):
                raise ValueError(
                    f"tensor {name!r} must have leading dimension E = {e_count} (one entry per expert), "
                    f"got shape {list(ckpt.shape(name))} in {ckpt.file(name)!r}"
                )
    # Without blocks transformers keeps one scale per half of gate_up ([E, 2, 1]): the halves are two
    # per-tensor layers to fuse, as per-expert gate and up are.
    halves = kw_gate_up["block_size"] is None and ckpt.shape(gu["weight_scale_inv"]) == (e_count, 2, 1)
    half = two_i // 2
    arrays = {}
    same_halves = np.zeros(e_count, dtype=bool)
    if halves:
        # halves of one scale (vtnumba's saver writes the expert's one scale twice, as transformers
        # allocates two) are one per-tensor layer: read so, the codes are kept as they are
        arrays[gu["weight_scale_inv"]] = scales = ckpt.read(gu["weight_scale_inv"])
        same_halves = scales[:, 0, 0] == scales[:, 1, 0]
    gate_ups, downs, read = [], [], {"gate_up": [], "down": []}
    kw = kw_gate_up
    for e in range(e_count):
        if halves and same_halves[e]:
            w = _load_slice(ckpt, arrays, gu, e, f"{gu['weight']}[{e}]", None, 0, kw)
            read["gate_up"].append(w.source)
            gate_ups.append(w)
        elif halves:
            parts = [
                (f"{gu['weight']}[{e}].gate", slice(0, half), 0),
                (f"{gu['weight']}[{e}].up", slice(half, two_i), 1),
            ]
            shards = [_load_slice(ckpt, arrays, gu, e, layer, rows, row, kw) for layer, rows, row in parts]
            read["gate_up"] += [s.source for s in shards]
            gate_ups.append(fuse_fp8_shards(shards))
        else:
            w = _load_slice(ckpt, arrays, gu, e, f"{gu['weight']}[{e}]", None, None, kw)
            read["gate_up"].append(w.source)
            gate_ups.append(w)
        w = _load_slice(ckpt, arrays, dn, e, f"{dn['weight']}[{e}]", None, None, kw_down)
        read["down"].append(w.source)
        downs.append(w)
    return (
        _stack(gate_ups, ckpt, prefix, "gate_up", _source(ckpt, "fused", read["gate_up"], gate_ups, halves)),
        _stack(downs, ckpt, prefix, "down", _source(ckpt, "fused", read["down"], downs, False)),
    )


def _load_slice(ckpt, arrays, names, e, layer, rows, scale_row, kw):
    """Expert e's slice of a fused projection (rows of it, for a gate_up half) read by
    ``load_fp8_linear`` as the dense layer ``layer``; its errors and source name the real tensors."""
    scale_rows = None if scale_row is None else slice(scale_row, scale_row + 1)
    parts = {"weight": rows, "weight_scale_inv": scale_rows}
    if names["input_scale"] in ckpt:
        parts["input_scale"] = None
    views = {f"{layer}.{k}": (names[k], e, r) for k, r in parts.items()}
    shown = {v: f"{real}[{e}]" + ("" if r is None else f"[{r.start}:{r.stop}]") for v, (real, _, r) in views.items()}
    shown[layer] = f"{names['weight']}[{e}]" + ("" if rows is None else f"[{rows.start}:{rows.stop}]")
    try:
        w = load_fp8_linear(_ExpertSlices(ckpt, views, arrays), layer, **kw)
    except ValueError as exc:
        raise ValueError(_real_names(str(exc), shown)) from None
    src = w.source
    src["tensors"] = [views[t][0] for t in src["tensors"]]
    for key in ("weight_scale", "scale_convention", "input_scale"):
        if isinstance(src.get(key), str):
            src[key] = _real_names(src[key], shown)
    return w


def _real_names(message, real):
    """``message`` with each view's name replaced by the real tensor and slice it stands for."""
    for virtual in sorted(real, key=len, reverse=True):
        message = message.replace(virtual, real[virtual])
    return message
