"""compressed-tensors (``quant_method`` "compressed-tensors"; vLLM
``quantization/compressed_tensors/compressed_tensors.py``).

``config_groups`` whose ``weights`` are 8-bit float with strategy "tensor" or "channel" and whose
``input_activations`` are static "tensor" or dynamic "token" / "tensor"; skipped layers in ``ignore``
(names, or "re:" regexes). The FP8_BLOCK preset: weights strategy "block" with ``block_structure``
[bn, bk], input activations dynamic strategy "group" with ``group_size`` bk (per-token groups of
1 x bk). MXFP8 (the "mxfp8-pack-quantized" format; vLLM's CompressedTensorsW8A8Mxfp8): weights
strategy "group" with ``group_size`` 32, ``weight_scale`` E8M0 bytes U8 [N, K / 32]; activations,
dynamic group-32 or absent, are quantized MXFP8 at run time, as vLLM does.
"""

from ..._format import MX_BLOCK
from ..config import Fp8Config
from . import layer_list, register


@register("compressed-tensors")
def parse_compressed_tensors(section):
    groups = section.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"config_groups must be a non-empty dict in a compressed-tensors config, got {groups!r}")
    found = set()
    for gname, group in groups.items():
        if not isinstance(group, dict):
            raise ValueError(f"config_groups.{gname} must be a dict (weights, input_activations), got {group!r}")
        weights = group.get("weights") or {}
        acts = group.get("input_activations")
        for part, value in (("weights", weights), ("input_activations", acts)):
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"config_groups.{gname}.{part} must be a dict, got {value!r}")
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise ValueError(
                f"config_groups.{gname}.weights must be 8-bit float (FP8), got "
                f"type={weights.get('type')!r} num_bits={weights.get('num_bits')!r}"
            )
        w_strategy = weights.get("strategy")
        block = None
        if w_strategy == "group":
            found.add(_mxfp8_group(f"config_groups.{gname}", weights, acts))
            continue
        if w_strategy == "block":
            block = weights.get("block_structure")
            if not (
                isinstance(block, (list, tuple))
                and len(block) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
            ):
                raise ValueError(
                    f"config_groups.{gname}.weights.block_structure must be two positive ints [bn, bk] for "
                    f"strategy 'block', got {block!r}"
                )
            block = tuple(block)
        elif w_strategy not in ("tensor", "channel"):
            raise ValueError(
                f"config_groups.{gname}.weights.strategy must be 'tensor', 'channel' or 'block', got {w_strategy!r}"
            )
        if not acts:
            raise ValueError(
                f"config_groups.{gname}.input_activations must be given (W8A8); weight-only "
                f"FP8 (W8A16) is not supported yet"
            )
        if acts.get("type") != "float" or acts.get("num_bits") != 8:
            raise ValueError(
                f"config_groups.{gname}.input_activations must be 8-bit float, got "
                f"type={acts.get('type')!r} num_bits={acts.get('num_bits')!r}"
            )
        strategy, dynamic = acts.get("strategy"), acts.get("dynamic") or False
        if not isinstance(strategy, str) or not isinstance(dynamic, bool):
            # a string "false" would read as dynamic; a list would not compare as a strategy
            raise ValueError(
                f"config_groups.{gname}.input_activations must have a strategy name and dynamic true or "
                f"false, got strategy={strategy!r} dynamic={acts.get('dynamic')!r}"
            )
        a_key = (strategy, dynamic)
        if block is not None:
            scheme = _block_activations(f"config_groups.{gname}.input_activations", acts, a_key, block)
        else:
            schemes = {("tensor", False): "static", ("tensor", True): "dynamic", ("token", True): "per_token"}
            if a_key not in schemes:
                hint = (
                    " (per-group activations come with block-scaled weights, strategy 'block')"
                    if a_key[0] == "group"
                    else ""
                )
                raise ValueError(
                    f"config_groups.{gname}.input_activations must be static 'tensor', dynamic "
                    f"'tensor' or dynamic 'token', got strategy={a_key[0]!r} dynamic={a_key[1]}{hint}"
                )
            scheme = schemes[a_key]
        found.add((w_strategy, scheme, block))
    if len(found) != 1:
        raise ValueError(
            f"config_groups must share one FP8 scheme (mixed schemes are not supported yet), "
            f"got {sorted(found, key=str)}"
        )
    ((strategy, scheme, block),) = found
    fmt = "e8m0" if block == MX_BLOCK and strategy == "block" and scheme == "per_group_e8m0" else "float32"
    if fmt == "e8m0":
        scheme = "per_group"
    return Fp8Config(
        "compressed-tensors",
        strategy,
        scheme,
        layer_list(section, "ignore"),
        block,
        activation_scale_format=fmt,
        weight_scale_format=fmt,
    )


def _mxfp8_group(name, weights, acts):
    """compressed-tensors' MXFP8 (vLLM ``_is_mxfp8``: float 8-bit weights, strategy 'group', group_size
    32; CompressedTensorsW8A8Mxfp8 quantizes the activations MXFP8 whatever the config says of them,
    so only a contradicting input_activations is refused)."""
    if weights.get("group_size") != MX_BLOCK[1]:
        raise ValueError(
            f"{name}.weights.group_size must be {MX_BLOCK[1]} for FP8 group weights (MXFP8), got "
            f"{weights.get('group_size')!r}"
        )
    if acts and (
        acts.get("type") != "float"
        or acts.get("num_bits") != 8
        or not acts.get("dynamic")
        or acts.get("strategy") not in ("group", "token", "tensor")
    ):
        raise ValueError(
            f"{name}.input_activations must be dynamic 8-bit float (MXFP8 activations are quantized "
            f"per group of 32 at run time), got {acts!r}"
        )
    return ("block", "per_group_e8m0", MX_BLOCK)


def _block_activations(name, acts, a_key, block):
    """The activation scheme beside block-scaled weights: dynamic, quantized per token in groups of bk.

    vLLM's block path quantizes the activations of a block-scaled layer in 1 x bk groups whatever
    dynamic strategy the config names ('group' in the FP8_BLOCK preset; 'token' and 'tensor' mean
    the same there), and refuses static ones (compressed_tensors_w8a8_fp8.py asserts it)."""
    strategy, dynamic = a_key
    if not dynamic:
        raise ValueError(
            f"{name} must be dynamic with block-scaled weights (block_structure {list(block)}), "
            f"got static strategy={strategy!r}"
        )
    if strategy not in ("group", "token", "tensor"):
        raise ValueError(f"{name}.strategy must be 'group' with block-scaled weights, got {strategy!r}")
    if strategy == "group" and acts.get("group_size") != block[1]:
        raise ValueError(
            f"{name}.group_size must equal the weights' bk = {block[1]} (block_structure "
            f"{list(block)}), got {acts.get('group_size')!r}"
        )
    return "per_group"
