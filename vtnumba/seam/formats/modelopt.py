"""ModelOpt (``quant_method`` "modelopt"; vLLM ``quantization/modelopt.py``).

``quant_algo`` "FP8" (per-tensor weight scale, static per-tensor activation scale),
"FP8_PER_CHANNEL_PER_TOKEN" (per-channel weight scale, dynamic per-token activations) or "MXFP8"
(vLLM's ModelOptMxFp8Config: ``weight_scale`` E8M0 bytes, U8 [N, K / 32]; activations quantized MXFP8
at run time); skipped layers in ``exclude_modules`` (hf_quant_config.json) or ``ignore``
(config.json), ModelOpt wildcards. hf_quant_config.json's ``quantization`` section reaches this
parser as a quantization_config with ``quant_method`` "modelopt" (``seam.config`` rewrites it so).
"""

from ..._format import MX_BLOCK
from ..config import Fp8Config
from . import layer_list, register

_MODELOPT_ALGOS = {
    # quant_algo -> (weight strategy, activation scheme), per vLLM's ModelOptFp8LinearMethod and
    # ModelOptFp8PcPtLinearMethod
    "FP8": ("tensor", "static"),
    "FP8_PER_CHANNEL_PER_TOKEN": ("channel", "per_token"),
    "MXFP8": ("block", "per_group"),  # vLLM's ModelOptMxFp8Config: E8M0 scales per 1 x 32
}


# every "modelopt..." method (vLLM's "modelopt_fp4" too) comes here, so that what is refused is named
# by its quant_algo ("NVFP4"), not as an unknown format
@register("modelopt", matches=lambda method: method.startswith("modelopt"))
def parse_modelopt(section):
    algo = section.get("quant_algo")
    if algo is None:
        raise ValueError("quant_algo must be given in a ModelOpt quantization config, got none")
    key = str(algo).upper()  # ModelOpt may emit lowercase (vLLM normalizes the same way)
    if key not in _MODELOPT_ALGOS:
        raise ValueError(f"quant_algo must be one of {', '.join(_MODELOPT_ALGOS)}, got {algo!r}")
    strategy, scheme = _MODELOPT_ALGOS[key]
    # "exclude_modules" in hf_quant_config.json, "ignore" in config.json (vLLM reads both)
    ignore = layer_list(section, "exclude_modules" if "exclude_modules" in section else "ignore")
    if key == "MXFP8":
        group = section.get("group_size", MX_BLOCK[1])
        if group != MX_BLOCK[1]:
            raise ValueError(f"group_size must be {MX_BLOCK[1]} for ModelOpt MXFP8, got {group!r}")
        return Fp8Config(
            "modelopt", strategy, scheme, ignore, MX_BLOCK, activation_scale_format="e8m0", weight_scale_format="e8m0"
        )
    return Fp8Config("modelopt", strategy, scheme, ignore)
