"""The quantization configs of real FP8 checkpoints, read into one ``Fp8Config``.

Formats read (the ``quantization_config`` of a Hugging Face config.json, or ModelOpt's
hf_quant_config.json), following upstream vLLM's readers:

- ModelOpt (``quant_method`` "modelopt"; vLLM ``quantization/modelopt.py``): ``quant_algo`` "FP8"
  (per-tensor weight scale, static per-tensor activation scale), "FP8_PER_CHANNEL_PER_TOKEN"
  (per-channel weight scale, dynamic per-token activations) or "MXFP8" (vLLM's ModelOptMxFp8Config:
  ``weight_scale`` E8M0 bytes, U8 [N, K / 32]; activations quantized MXFP8 at run time); skipped
  layers in ``exclude_modules`` (hf_quant_config.json) or ``ignore`` (config.json), ModelOpt wildcards.
- compressed-tensors (``quant_method`` "compressed-tensors"; vLLM
  ``quantization/compressed_tensors/compressed_tensors.py``): ``config_groups`` whose ``weights`` are
  8-bit float with strategy "tensor" or "channel" and whose ``input_activations`` are static
  "tensor" or dynamic "token" / "tensor"; skipped layers in ``ignore`` (names, or "re:" regexes).
  The FP8_BLOCK preset: weights strategy "block" with ``block_structure`` [bn, bk], input
  activations dynamic strategy "group" with ``group_size`` bk (per-token groups of 1 x bk). MXFP8
  (the "mxfp8-pack-quantized" format; vLLM's CompressedTensorsW8A8Mxfp8): weights strategy "group"
  with ``group_size`` 32, ``weight_scale`` E8M0 bytes U8 [N, K / 32]; activations, dynamic group-32 or
  absent, are quantized MXFP8 at run time, as vLLM does.
- vLLM's own "fp8" (``quantization/fp8.py``; AutoFP8 checkpoints): ``activation_scheme`` "static" or
  "dynamic" (per-tensor), per-tensor weight scales, skipped layers in ``ignored_layers`` (else
  ``modules_to_not_convert``, as vLLM falls back).
- the same "fp8" key with ``weight_block_size`` [bn, bk]: DeepSeek-V3/R1, Qwen3-*-FP8, and
  transformers' ``FineGrainedFP8Config`` (``activation_scheme``, ``weight_block_size``,
  ``modules_to_not_convert``). Weights are block-scaled and "dynamic" activations mean per-token groups
  of 1 x bk (vLLM's block path quantizes them so; static activations are refused with block weights, as
  vLLM refuses them). ``scale_fmt`` "ue8m0" (DeepSeek-V3.1 and later) asks for power-of-two activation
  scales; the weight's block scales may then be stored as E8M0 bytes (F8_E8M0 or U8, DeepSeek's later
  releases), which the loader keeps as bytes.
- "mxfp8" (transformers' MXFP8 checkpoints, read by vLLM through its ModelOpt MXFP8 path): E8M0
  ``weight_scale_inv`` (or ``weight_scale``) U8 / F8_E8M0 [N, K / 32]; a checkpoint whose weights are
  not FP8 (vLLM's online "mxfp8") is quantized MXFP8 as it is read.

Block-scaled weights are parsed (``weight_strategy`` "block", ``activation_scheme`` "per_group") and
then refused per layer by ``linear_method`` ("not supported yet"), so a model whose quantized layers
are all block-scaled still loads its unquantized ones.

Mixture-of-experts layers: the same config quantizes the experts (every format above names them
like dense layers), but how they are stored is told by the checkpoint's tensor names, not the config:
``experts_layout(checkpoint, prefix)`` says 'per_expert', 'fused' (transformers' FP8Experts) or None,
and ``load_experts(checkpoint, prefix)`` reads either into ``seam.Fp8Experts`` with this config's
scheme (``seam.load_fp8_experts``). The router (``mlp.gate``) is a dense float layer, usually in
``ignore``.
"""

import fnmatch
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arrays import Array
from .._format import MX_BLOCK
from .checkpoint import Checkpoint
from .experts import Fp8Experts
from .linear import LinearMethod, UnquantizedLinearMethod, make_linear_method
from .weights import Fp8Weight, ResidentFp8

__all__ = ["Fp8Config"]

_METHODS = ("modelopt", "compressed-tensors", "fp8", "mxfp8")
_ACTIVATION_SCHEMES = ("static", "dynamic", "per_token", "per_group")
_MODELOPT_ALGOS = {
    # quant_algo -> (weight strategy, activation scheme), per vLLM's ModelOptFp8LinearMethod and
    # ModelOptFp8PcPtLinearMethod
    "FP8": ("tensor", "static"),
    "FP8_PER_CHANNEL_PER_TOKEN": ("channel", "per_token"),
    "MXFP8": ("block", "per_group"),  # vLLM's ModelOptMxFp8Config: E8M0 scales per 1 x 32
}


def _read_json(path, name):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise ValueError(f"{name} must be a readable JSON file, got {path!r} ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} must be valid JSON, got {path!r} ({exc})") from None


def _quantization_section(config, where=""):
    """The quantization dict of a config.json / hf_quant_config.json dict, or of a path to one (or to
    a model directory). ``where`` names the file read, for error messages."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            for fname in ("config.json", "hf_quant_config.json"):
                candidate = os.path.join(path, fname)
                if os.path.isfile(candidate):
                    section = _quantization_section(_read_json(candidate, "config"), f" in {candidate!r}")
                    if section is not None:
                        return section
            raise ValueError(f"config must be a model directory with a quantization_config in config.json "
                             f"or an hf_quant_config.json, got {path!r} without either")
        config, where = _read_json(path, "config"), f" in {path!r}"
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict or a path to a JSON file, got {type(config).__name__}")
    if "quantization_config" in config:  # a full config.json
        return config["quantization_config"]
    if "quantization" in config and isinstance(config.get("producer"), dict):
        # ModelOpt's hf_quant_config.json: {"producer": {"name": "modelopt"}, "quantization": {...}}
        return {"quant_method": "modelopt", **config["quantization"]}
    if isinstance(config.get("quantization"), dict) and "quant_algo" in config["quantization"]:
        # ModelOpt's section without the producer that says who wrote it: say what is missing, not
        # that the checkpoint is unquantized
        raise ValueError(
            f"config's 'producer' must be a dict naming who wrote the ModelOpt 'quantization' section "
            f"(hf_quant_config.json: {{\"producer\": {{\"name\": \"modelopt\", ...}}, \"quantization\": {{...}}}}), "
            f"got {repr(config['producer']) if 'producer' in config else 'none'}{where}; add it to the file, or pass the section itself: "
            f"Fp8Config.from_hf({{\"quant_method\": \"modelopt\", **config[\"quantization\"]}})")
    if "quant_method" in config:  # the quantization_config itself
        return config
    return None


@dataclass(frozen=True)
class Fp8Config:
    """How a checkpoint's linear layers are quantized.

    - ``quant_method``: 'modelopt', 'compressed-tensors' or 'fp8' (the format it was read from).
    - ``weight_strategy``: 'tensor' (one weight scale per layer or shard), 'channel' (one per row) or
      'block' (one per bn x bk block); None picks 'block' when ``weight_block_size`` is given, else
      'tensor'.
    - ``activation_scheme``: 'static', 'dynamic', 'per_token' (as ``Fp8Weight``) or 'per_group'
      (dynamic, per token in groups of ``activation_group_size`` along K: the scheme of block-scaled
      weights, and only theirs).
    - ``ignore``: layer names and patterns left unquantized: exact names, globs ('*lm_head*',
      ModelOpt's style) and 're:<regex>' (compressed-tensors' style, matched with ``re.match``).
    - ``weight_block_size``: (bn, bk) for block-scaled checkpoints (scales [ceil(N/bn), ceil(K/bk)]),
      else None.
    - ``activation_group_size``: the per-group activations' group size; it must be bk (the GEMM
      scales each K-block by one activation scale). None picks bk for 'per_group'.
    - ``activation_scale_ue8m0``: per-group activation scales rounded up to powers of two (DeepSeek's
      ``scale_fmt`` "ue8m0").
    - ``activation_scale_format``: 'e8m0' for MXFP8 (activations quantized with E8M0 group scales, the
      weight's scales E8M0 bytes), else 'float32'.
    """

    quant_method: str
    weight_strategy: str | None = None
    activation_scheme: str = "dynamic"
    ignore: tuple[str, ...] = ()
    weight_block_size: tuple[int, int] | None = None
    activation_group_size: int | None = None
    activation_scale_ue8m0: bool = False
    activation_scale_format: str = "float32"

    def __post_init__(self) -> None:
        if self.quant_method not in _METHODS:
            raise ValueError(f"quant_method must be one of {', '.join(_METHODS)}, got {self.quant_method!r}")
        if self.weight_strategy is None:
            object.__setattr__(self, "weight_strategy", "tensor" if self.weight_block_size is None else "block")
        if self.weight_strategy not in ("tensor", "channel", "block"):
            raise ValueError(f"weight_strategy must be 'tensor', 'channel' or 'block', got {self.weight_strategy!r}")
        if self.activation_scheme not in _ACTIVATION_SCHEMES:
            raise ValueError(f"activation_scheme must be one of {', '.join(map(repr, _ACTIVATION_SCHEMES))}, "
                             f"got {self.activation_scheme!r}")
        ignore = self.ignore
        if isinstance(ignore, str) or not all(isinstance(p, str) for p in ignore):
            raise TypeError(f"ignore must be a sequence of layer names or patterns, got {ignore!r}")
        object.__setattr__(self, "ignore", tuple(ignore))
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                try:
                    re.compile(pattern[3:])
                except re.error as exc:
                    raise ValueError(f"ignore pattern must be a valid regex, got {pattern!r} ({exc})") from None
        if self.weight_block_size is not None:
            block = tuple(self.weight_block_size)
            if len(block) != 2 or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block):
                raise ValueError(f"weight_block_size must be two positive ints [rows, cols], got {self.weight_block_size!r}")
            object.__setattr__(self, "weight_block_size", block)
        self._check_block_scheme()
        if self.activation_scale_format not in ("float32", "e8m0"):
            raise ValueError(f"activation_scale_format must be 'float32' or 'e8m0', got {self.activation_scale_format!r}")
        if self.activation_scale_format == "e8m0" and (self.activation_scheme != "per_group" or self.activation_scale_ue8m0):
            raise ValueError(f"activation_scale_format 'e8m0' needs activation_scheme 'per_group' without "
                             f"activation_scale_ue8m0, got {self.activation_scheme!r}, {self.activation_scale_ue8m0!r}")

    @property
    def mxfp8(self) -> bool:
        """Whether the config is MXFP8: E8M0 scales per 1 x 32 on weights and activations."""
        return self.activation_scale_format == "e8m0"

    def _check_block_scheme(self):
        """Block-scaled weights and per-group activations come together, with group size = bk."""
        block = self.weight_block_size
        if (self.weight_strategy == "block") != (block is not None):
            raise ValueError(f"weight_block_size must be given exactly when weight_strategy is 'block', got "
                             f"weight_strategy={self.weight_strategy!r} with weight_block_size={block!r}")
        if block is not None and self.activation_scheme != "per_group":
            raise ValueError(f"activation_scheme must be 'per_group' with block-scaled weights (weight_block_size "
                             f"{list(block)}), got {self.activation_scheme!r}")
        group = self.activation_group_size
        if self.activation_scheme != "per_group":
            if group is not None:
                raise ValueError(f"activation_group_size must be None unless activation_scheme is 'per_group', "
                                 f"got {group!r} with {self.activation_scheme!r}")
            if self.activation_scale_ue8m0:
                raise ValueError(f"activation_scale_ue8m0 needs activation_scheme 'per_group', got "
                                 f"{self.activation_scheme!r}")
            return
        if block is None:
            raise ValueError("activation_scheme 'per_group' needs block-scaled weights: weight_block_size must be "
                             "given, got None")
        if group is None:
            object.__setattr__(self, "activation_group_size", block[1])
        elif isinstance(group, bool) or not isinstance(group, int) or group != block[1]:
            raise ValueError(f"activation_group_size must equal the weight's bk = {block[1]} (weight_block_size "
                             f"{list(block)}), got {group!r}")

    # -- reading -----------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: dict[str, Any] | str | os.PathLike) -> "Fp8Config":
        """Read the quantization config of a checkpoint: a config.json dict (its
        ``quantization_config``), the ``quantization_config`` dict itself, ModelOpt's
        hf_quant_config.json dict, or a path to either file or to the model directory."""
        section = _quantization_section(config)
        if section is None:
            raise ValueError("config must contain a quantization_config (config.json) or a ModelOpt "
                             "'quantization' section (hf_quant_config.json), got none: the checkpoint "
                             "is not quantized")
        if not isinstance(section, dict):
            raise TypeError(f"quantization_config must be a dict, got {type(section).__name__}")
        method = str(section.get("quant_method", "")).lower()
        if method.startswith("modelopt"):
            return cls._from_modelopt(section)
        if method == "compressed-tensors":
            return cls._from_compressed_tensors(section)
        if method == "fp8":
            return cls._from_vllm_fp8(section)
        if method == "mxfp8":
            return cls._from_mxfp8(section)
        raise ValueError(f"quant_method must be one of {', '.join(_METHODS)} (the FP8 formats vtnumba reads), "
                         f"got {section.get('quant_method')!r}")

    @classmethod
    def _from_modelopt(cls, section):
        algo = section.get("quant_algo")
        if algo is None:
            raise ValueError("quant_algo must be given in a ModelOpt quantization config, got none")
        key = str(algo).upper()  # ModelOpt may emit lowercase (vLLM normalizes the same way)
        if key not in _MODELOPT_ALGOS:
            raise ValueError(f"quant_algo must be one of {', '.join(_MODELOPT_ALGOS)}, got {algo!r}")
        strategy, scheme = _MODELOPT_ALGOS[key]
        # "exclude_modules" in hf_quant_config.json, "ignore" in config.json (vLLM reads both)
        ignore = section.get("exclude_modules", section.get("ignore")) or ()
        if key == "MXFP8":
            group = section.get("group_size", MX_BLOCK[1])
            if group != MX_BLOCK[1]:
                raise ValueError(f"group_size must be {MX_BLOCK[1]} for ModelOpt MXFP8, got {group!r}")
            return cls("modelopt", strategy, scheme, tuple(ignore), MX_BLOCK, activation_scale_format="e8m0")
        return cls("modelopt", strategy, scheme, tuple(ignore))

    @classmethod
    def _from_compressed_tensors(cls, section):
        groups = section.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise ValueError(f"config_groups must be a non-empty dict in a compressed-tensors config, got {groups!r}")
        found = set()
        for gname, group in groups.items():
            weights = group.get("weights") or {}
            acts = group.get("input_activations")
            if weights.get("type") != "float" or weights.get("num_bits") != 8:
                raise ValueError(f"config_groups.{gname}.weights must be 8-bit float (FP8), got "
                                 f"type={weights.get('type')!r} num_bits={weights.get('num_bits')!r}")
            w_strategy = weights.get("strategy")
            block = None
            if w_strategy == "group":
                found.add(cls._mxfp8_group(f"config_groups.{gname}", weights, acts))
                continue
            if w_strategy == "block":
                block = weights.get("block_structure")
                if not isinstance(block, (list, tuple)) or len(block) != 2:
                    raise ValueError(f"config_groups.{gname}.weights.block_structure must be [bn, bk] for "
                                     f"strategy 'block', got {block!r}")
                block = tuple(block)
            elif w_strategy not in ("tensor", "channel"):
                raise ValueError(f"config_groups.{gname}.weights.strategy must be 'tensor', 'channel' or "
                                 f"'block', got {w_strategy!r}")
            if not acts:
                raise ValueError(f"config_groups.{gname}.input_activations must be given (W8A8); weight-only "
                                 f"FP8 (W8A16) is not supported yet")
            if acts.get("type") != "float" or acts.get("num_bits") != 8:
                raise ValueError(f"config_groups.{gname}.input_activations must be 8-bit float, got "
                                 f"type={acts.get('type')!r} num_bits={acts.get('num_bits')!r}")
            a_key = (acts.get("strategy"), bool(acts.get("dynamic")))
            if block is not None:
                scheme = cls._block_activations(f"config_groups.{gname}.input_activations", acts, a_key, block)
            else:
                schemes = {("tensor", False): "static", ("tensor", True): "dynamic", ("token", True): "per_token"}
                if a_key not in schemes:
                    hint = (" (per-group activations come with block-scaled weights, strategy 'block')"
                            if a_key[0] == "group" else "")
                    raise ValueError(f"config_groups.{gname}.input_activations must be static 'tensor', dynamic "
                                     f"'tensor' or dynamic 'token', got strategy={a_key[0]!r} dynamic={a_key[1]}{hint}")
                scheme = schemes[a_key]
            found.add((w_strategy, scheme, block))
        if len(found) != 1:
            raise ValueError(f"config_groups must share one FP8 scheme (mixed schemes are not supported yet), "
                             f"got {sorted(found, key=str)}")
        (strategy, scheme, block), = found
        fmt = "e8m0" if block == MX_BLOCK and strategy == "block" and scheme == "per_group_e8m0" else "float32"
        if fmt == "e8m0":
            scheme = "per_group"
        return cls("compressed-tensors", strategy, scheme, tuple(section.get("ignore") or ()), block,
                   activation_scale_format=fmt)

    @staticmethod
    def _mxfp8_group(name, weights, acts):
        """compressed-tensors' MXFP8 (vLLM ``_is_mxfp8``: float 8-bit weights, strategy 'group', group_size
        32; CompressedTensorsW8A8Mxfp8 quantizes the activations MXFP8 whatever the config says of them,
        so only a contradicting input_activations is refused)."""
        if weights.get("group_size") != MX_BLOCK[1]:
            raise ValueError(f"{name}.weights.group_size must be {MX_BLOCK[1]} for FP8 group weights (MXFP8), got "
                             f"{weights.get('group_size')!r}")
        if acts and (acts.get("type") != "float" or acts.get("num_bits") != 8 or not acts.get("dynamic")
                     or acts.get("strategy") not in ("group", "token", "tensor")):
            raise ValueError(f"{name}.input_activations must be dynamic 8-bit float (MXFP8 activations are quantized "
                             f"per group of 32 at run time), got {acts!r}")
        return ("block", "per_group_e8m0", MX_BLOCK)

    @staticmethod
    def _block_activations(name, acts, a_key, block):
        """The activation scheme beside block-scaled weights: dynamic, quantized per token in groups of bk.

        vLLM's block path quantizes the activations of a block-scaled layer in 1 x bk groups whatever
        dynamic strategy the config names ('group' in the FP8_BLOCK preset; 'token' and 'tensor' mean
        the same there), and refuses static ones (compressed_tensors_w8a8_fp8.py asserts it)."""
        strategy, dynamic = a_key
        if not dynamic:
            raise ValueError(f"{name} must be dynamic with block-scaled weights (block_structure {list(block)}), "
                             f"got static strategy={strategy!r}")
        if strategy not in ("group", "token", "tensor"):
            raise ValueError(f"{name}.strategy must be 'group' with block-scaled weights, got {strategy!r}")
        if strategy == "group" and acts.get("group_size") != block[1]:
            raise ValueError(f"{name}.group_size must equal the weights' bk = {block[1]} (block_structure "
                             f"{list(block)}), got {acts.get('group_size')!r}")
        return "per_group"

    @classmethod
    def _from_vllm_fp8(cls, section):
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
        ignore = tuple(section.get("ignored_layers") or section.get("modules_to_not_convert") or ())
        block = section.get("weight_block_size")
        scale_fmt = section.get("scale_fmt")
        if scale_fmt not in (None, "float", "ue8m0"):
            raise ValueError(f"scale_fmt must be 'float' or 'ue8m0', got {scale_fmt!r}")
        if block is None:
            if scale_fmt == "ue8m0":
                raise ValueError("scale_fmt 'ue8m0' needs block-scaled weights: weight_block_size must be given, "
                                 "got none")
            return cls("fp8", "tensor", scheme, ignore)
        if not isinstance(block, (list, tuple)) or len(block) != 2:
            raise ValueError(f"weight_block_size must be two positive ints [rows, cols], got {block!r}")
        if scheme != "dynamic":
            # vLLM's Fp8Config: "The block-wise quantization only supports dynamic activation scheme for now"
            raise ValueError(f"activation_scheme must be 'dynamic' with weight_block_size {list(block)} (block-scaled "
                             f"weights take dynamic per-token-group activations), got {scheme!r}")
        return cls("fp8", "block", "per_group", ignore, block,
                   activation_scale_ue8m0=scale_fmt == "ue8m0")

    @classmethod
    def _from_mxfp8(cls, section):
        """``quant_method`` "mxfp8": transformers' MXFP8 checkpoints (E8M0 ``weight_scale_inv`` per 1 x 32)
        and vLLM's online "mxfp8" (``activation_scheme`` dynamic only, skipped layers in ``ignored_layers``
        or ``modules_to_not_convert``; vllm/model_executor/layers/quantization/mxfp8.py)."""
        scheme = section.get("activation_scheme", "dynamic")
        if str(scheme).lower() != "dynamic":
            raise ValueError(f"activation_scheme must be 'dynamic' for mxfp8 (as vLLM's Mxfp8Config requires), got {scheme!r}")
        block = section.get("weight_block_size", list(MX_BLOCK))
        if block is not None and tuple(block) != MX_BLOCK:
            raise ValueError(f"weight_block_size must be {list(MX_BLOCK)} for mxfp8, got {block!r}")
        ignore = tuple(section.get("ignored_layers") or section.get("modules_to_not_convert") or ())
        return cls("mxfp8", "block", "per_group", ignore, MX_BLOCK, activation_scale_format="e8m0")

    # -- per layer ---------------------------------------------------------------------------
    def ignored_by(self, prefix: str) -> str | None:
        """The ignore entry that leaves layer ``prefix`` unquantized, or None."""
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], prefix):
                    return pattern
            elif pattern == prefix or fnmatch.fnmatchcase(prefix, pattern):
                return pattern
        return None

    def is_ignored(self, prefix: str) -> bool:
        return self.ignored_by(prefix) is not None

    def linear_method(self, prefix: str, weight: Fp8Weight | ResidentFp8 | Array,
                      bias: Array | None = None) -> LinearMethod:
        """The linear method for layer ``prefix`` (e.g. 'model.layers.0.mlp.down_proj').

        Ignored layers get ``UnquantizedLinearMethod`` and need a float weight; quantized layers need an
        ``Fp8Weight`` / ``ResidentFp8`` whose activation scheme is the config's (and, for a
        block-scaled config, whose ``block_size`` is the config's ``weight_block_size``).
        """
        pattern = self.ignored_by(prefix)
        if pattern is not None:
            if isinstance(weight, (Fp8Weight, ResidentFp8)):
                raise TypeError(f"weight of layer {prefix!r} must be a float array: the config leaves it "
                                f"unquantized (ignore entry {pattern!r}), got {type(weight).__name__}")
            if not isinstance(weight, np.ndarray) and not hasattr(weight, "__cuda_array_interface__"):
                raise TypeError(f"weight of layer {prefix!r} must be a float array, got {type(weight).__name__}")
            return UnquantizedLinearMethod(weight, bias)
        if not isinstance(weight, (Fp8Weight, ResidentFp8)):
            raise TypeError(f"weight of layer {prefix!r} must be an Fp8Weight (the {self.quant_method} config "
                            f"quantizes it; read it with seam.load_fp8_linear), got {type(weight).__name__}")
        if weight.activation_scheme != self.activation_scheme:
            raise ValueError(f"weight of layer {prefix!r} must have activation_scheme "
                             f"{self.activation_scheme!r} like the config, got {weight.activation_scheme!r}")
        w = weight.weight if isinstance(weight, ResidentFp8) else weight
        if w.block_size != self.weight_block_size:
            raise ValueError(f"weight of layer {prefix!r} must have block_size {self.weight_block_size} like the "
                             f"config's weight_block_size, got {w.block_size}")
        if w.block_size is not None and w.activation_scale_format != self.activation_scale_format:
            raise ValueError(f"weight of layer {prefix!r} must have activation_scale_format "
                             f"{self.activation_scale_format!r} like the config, got {w.activation_scale_format!r}")
        return make_linear_method(weight, bias)

    def load_linear(self, path: str | os.PathLike, prefix: str) -> LinearMethod:
        """Read layer ``prefix`` from a safetensors checkpoint and return its linear method: the float
        weight (and bias) for ignored layers, the ``Fp8Weight`` with the config's activation scheme
        otherwise."""
        from .checkpoint import load_float_linear, load_fp8_linear

        if self.is_ignored(prefix):
            weight, bias = load_float_linear(path, prefix)
            return self.linear_method(prefix, weight, bias)
        if self.quant_method == "mxfp8" and _float_weight(path, prefix):
            # vLLM's online mxfp8 (Mxfp8OnlineLinearMethod): a checkpoint in float, quantized as it loads
            weight, bias = load_float_linear(path, prefix)
            return self.linear_method(prefix, Fp8Weight.from_float(weight, bias=bias, block_size=MX_BLOCK,
                                                                   scale_format="e8m0"))
        return self.linear_method(prefix, load_fp8_linear(
            path, prefix, activation_scheme=self.activation_scheme, block_size=self.weight_block_size,
            scale_ue8m0=self.activation_scale_ue8m0, activation_scale_format=self.activation_scale_format))

    # -- mixture-of-experts layers -------------------------------------------------------------
    @staticmethod
    def experts_layout(checkpoint: str | os.PathLike | Checkpoint, prefix: str) -> str | None:
        """How a checkpoint stores the MoE experts under ``prefix`` (e.g. 'model.layers.3.mlp.experts'):
        'per_expert' (``{prefix}.{e}.gate_proj.weight`` ...: Qwen3-*-FP8, DeepSeek-V3, ModelOpt,
        compressed-tensors), 'fused' (transformers' ``{prefix}.gate_up_proj`` / ``{prefix}.down_proj``)
        or None (no experts there: a dense layer). The quantization config does not say this, the
        tensor names do; either layout is read by ``load_experts``. ``checkpoint``: a path or a
        ``seam.Checkpoint``."""
        from .experts_checkpoint import experts_layout

        return experts_layout(checkpoint, prefix)

    def load_experts(self, checkpoint: str | os.PathLike | Checkpoint, prefix: str, *,
                     num_experts: int | None = None) -> tuple[Fp8Experts, Fp8Experts]:
        """``(gate_up, down)`` ``seam.Fp8Experts`` of the MoE layer ``prefix``, read by
        ``seam.load_fp8_experts`` with this config's activation scheme and block size (for
        ``seam.moe_fp8``). ``num_experts``: the model config's expert count, so a missing last expert
        is named. Experts the config leaves unquantized (an ``ignore`` entry matching ``prefix`` or
        one expert's projection) are refused: ``moe_fp8`` takes FP8 experts only."""
        from .experts_checkpoint import _checkpoint, _expert_indices, load_fp8_experts

        ckpt = _checkpoint(checkpoint, prefix)
        layers = [prefix] + [f"{prefix}.{e}.{p}" for e in sorted(_expert_indices(ckpt, prefix))
                             for p in ("gate_proj", "up_proj", "down_proj")]
        for layer in layers:
            pattern = self.ignored_by(layer)
            if pattern is not None:
                raise ValueError(f"experts {prefix!r} must be FP8-quantized to load as seam.Fp8Experts, got {layer!r} "
                                 f"left unquantized by the ignore entry {pattern!r}")
        return load_fp8_experts(ckpt, prefix, num_experts=num_experts, activation_scheme=self.activation_scheme,
                                block_size=self.weight_block_size, scale_ue8m0=self.activation_scale_ue8m0,
                                activation_scale_format=self.activation_scale_format)


def _float_weight(path, prefix):
    """Whether layer ``prefix``'s weight is stored in a float dtype (not FP8-serialized)."""
    from .checkpoint import _FLOAT_DTYPES, _checkpoint

    ckpt = _checkpoint(path, prefix)
    name = f"{prefix}.weight"
    return name in ckpt and ckpt.dtype(name) in _FLOAT_DTYPES
