"""``quant_method`` "mxfp8": transformers' MXFP8 checkpoints, read by vLLM through its ModelOpt MXFP8
path, and vLLM's online "mxfp8" (vllm/model_executor/layers/quantization/mxfp8.py).

E8M0 ``weight_scale_inv`` (or ``weight_scale``) U8 / F8_E8M0 [N, K / 32]; a checkpoint whose weights
are not FP8 (vLLM's online "mxfp8") is quantized MXFP8 as it is read (``Fp8Config.load_linear``).
"""

from ..._format import MX_BLOCK
from ..config import Fp8Config
from . import layer_list, register


@register("mxfp8")
def parse_mxfp8(section):
    """``activation_scheme`` dynamic only, as vLLM's Mxfp8Config; skipped layers in ``ignored_layers``
    or ``modules_to_not_convert``."""
    scheme = section.get("activation_scheme", "dynamic")
    if str(scheme).lower() != "dynamic":
        raise ValueError(
            f"activation_scheme must be 'dynamic' for mxfp8 (as vLLM's Mxfp8Config requires), got {scheme!r}"
        )
    block = section.get("weight_block_size", list(MX_BLOCK))
    if block is not None and (not isinstance(block, (list, tuple)) or tuple(block) != MX_BLOCK):
        raise ValueError(f"weight_block_size must be {list(MX_BLOCK)} for mxfp8, got {block!r}")
    ignore = layer_list(section, "ignored_layers") or layer_list(section, "modules_to_not_convert")
    return Fp8Config(
        "mxfp8", "block", "per_group", ignore, MX_BLOCK, activation_scale_format="e8m0", weight_scale_format="e8m0"
    )
