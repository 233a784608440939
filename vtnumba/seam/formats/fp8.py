"""vLLM's own "fp8" (``quantization/fp8.py``; AutoFP8 checkpoints), per-tensor and block-wise.

Per-tensor: ``activation_scheme`` "static" or "dynamic" (per-tensor), per-tensor weight scales,
skipped layers in ``ignored_layers`` (else ``modules_to_not_convert``, as vLLM falls back).

Block-wise, the same "fp8" key with ``weight_block_size`` [bn, bk]: DeepSeek-V3/R1, Qwen3-*-FP8, and
transformers' ``FineGrainedFP8Config`` (``activation_scheme``, ``weight_block_size``,
``modules_to_not_convert``). Weights are block-scaled and "dynamic" activations mean per-token groups
of 1 x bk (vLLM's block path quantizes them so; static activations are refused with block weights, as
vLLM refuses them). ``scale_fmt`` "ue8m0" (DeepSeek-V3.1 and later) asks for power-of-two activation
scales; the weight's block scales may then be stored as E8M0 bytes (F8_E8M0 or U8, DeepSeek's later
releases), which the loader keeps as bytes.
"""

from ..config import Fp8Config
from . import layer_list, register


@register("fp8")
def parse_fp8(section):
    """vLLM's "fp8" (fp8.py ``Fp8Config.from_config``), which also reads DeepSeek-V3/R1, Qwen3-FP8
    and transformers' FineGrainedFP8Config: the same keys."""
    scheme = section.get("activation_scheme")
    scheme = scheme.lower() if isinstance(scheme, str) else scheme  # transformers lower-cases it
    if scheme not in ("static", "dynamic"):
        raise ValueError(f"activation_scheme must be 'static' or 'dynamic' in an 'fp8' config, got {scheme!r}")
    fmt = section.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' (vtnumba's FP8 format is e4m3fn), got {fmt!r}")
    # vLLM reads ignored_layers, and modules_to_not_convert (transformers' key) when that is empty
    ignore = layer_list(section, "ignored_layers") or layer_list(section, "modules_to_not_convert")
    block = section.get("weight_block_size")
    scale_fmt = section.get("scale_fmt")
    if scale_fmt not in (None, "float", "ue8m0"):
        raise ValueError(f"scale_fmt must be 'float' or 'ue8m0', got {scale_fmt!r}")
    if block is None:
        if scale_fmt == "ue8m0":
            raise ValueError("scale_fmt 'ue8m0' needs block-scaled weights: weight_block_size must be given, got none")
        return Fp8Config("fp8", "tensor", scheme, ignore)
    if not isinstance(block, (list, tuple)) or len(block) != 2:
        raise ValueError(f"weight_block_size must be two positive ints [rows, cols], got {block!r}")
    if scheme != "dynamic":
        # vLLM's Fp8Config: "The block-wise quantization only supports dynamic activation scheme for now"
        raise ValueError(
            f"activation_scheme must be 'dynamic' with weight_block_size {list(block)} (block-scaled "
            f"weights take dynamic per-token-group activations), got {scheme!r}"
        )
    # scale_fmt "ue8m0": vLLM reads it as power-of-two activation scales (DeepSeek-V3.1), transformers
    # as E8M0 weight scale bytes (its FineGrainedFP8Config); vtnumba's saver writes the first meaning
    # as its own key, activation_scale_ue8m0, which other readers ignore
    ue8m0 = section.get("activation_scale_ue8m0", scale_fmt == "ue8m0")
    if not isinstance(ue8m0, bool):
        raise ValueError(f"activation_scale_ue8m0 must be true or false, got {ue8m0!r}")
    return Fp8Config(
        "fp8",
        "block",
        "per_group",
        ignore,
        block,
        activation_scale_ue8m0=ue8m0,
        weight_scale_format="e8m0" if scale_fmt == "ue8m0" else "float32",
    )
