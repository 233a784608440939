"""The quantization configs of real FP8 checkpoints, read into one ``Fp8Config``.

Formats read (the ``quantization_config`` of a Hugging Face config.json, or ModelOpt's
hf_quant_config.json), following upstream vLLM's readers:

- ModelOpt (``quant_method`` "modelopt"; vLLM ``quantization/modelopt.py``): ``quant_algo`` "FP8"
  (per-tensor weight scale, static per-tensor activation scale) or "FP8_PER_CHANNEL_PER_TOKEN"
  (per-channel weight scale, dynamic per-token activations); skipped layers in ``exclude_modules``
  (hf_quant_config.json) or ``ignore`` (config.json), ModelOpt wildcards.
- compressed-tensors (``quant_method`` "compressed-tensors"; vLLM
  ``quantization/compressed_tensors/compressed_tensors.py``): ``config_groups`` whose ``weights`` are
  8-bit float with strategy "tensor" or "channel" and whose ``input_activations`` are static
  "tensor" or dynamic "token" / "tensor"; skipped layers in ``ignore`` (names, or "re:" regexes).
- vLLM's own "fp8" (``quantization/fp8.py``; AutoFP8 and DeepSeek-style checkpoints):
  ``activation_scheme`` "static" or "dynamic" (per-tensor), per-tensor weight scales, skipped
  layers in ``ignored_layers``; ``weight_block_size`` marks block-scaled weights.

Block-scaled weights are recognized and refused per layer ("not supported yet"), so a model whose
quantized layers are all block-scaled still loads its unquantized ones.
"""

import fnmatch
import json
import os
import re
from dataclasses import dataclass

import numpy as np

from .linear import UnquantizedLinearMethod, make_linear_method
from .weights import Fp8Weight, ResidentFp8

__all__ = ["Fp8Config"]

_METHODS = ("modelopt", "compressed-tensors", "fp8")
_MODELOPT_ALGOS = {
    # quant_algo -> (weight strategy, activation scheme), per vLLM's ModelOptFp8LinearMethod and
    # ModelOptFp8PcPtLinearMethod
    "FP8": ("tensor", "static"),
    "FP8_PER_CHANNEL_PER_TOKEN": ("channel", "per_token"),
}


def _read_json(path, name):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise ValueError(f"{name} must be a readable JSON file, got {path!r} ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} must be valid JSON, got {path!r} ({exc})") from None


def _quantization_section(config):
    """The quantization dict of a config.json / hf_quant_config.json dict, or of a path to one (or to
    a model directory)."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            for fname in ("config.json", "hf_quant_config.json"):
                candidate = os.path.join(path, fname)
                if os.path.isfile(candidate):
                    section = _quantization_section(_read_json(candidate, "config"))
                    if section is not None:
                        return section
            raise ValueError(f"config must be a model directory with a quantization_config in config.json "
                             f"or an hf_quant_config.json, got {path!r} without either")
        config = _read_json(path, "config")
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict or a path to a JSON file, got {type(config).__name__}")
    if "quantization_config" in config:  # a full config.json
        return config["quantization_config"]
    if "quantization" in config and isinstance(config.get("producer"), dict):
        # ModelOpt's hf_quant_config.json: {"producer": {"name": "modelopt"}, "quantization": {...}}
        return {"quant_method": "modelopt", **config["quantization"]}
    if "quant_method" in config:  # the quantization_config itself
        return config
    return None


@dataclass(frozen=True)
class Fp8Config:
    """How a checkpoint's linear layers are quantized.

    - ``quant_method``: 'modelopt', 'compressed-tensors' or 'fp8' (the format it was read from).
    - ``weight_strategy``: 'tensor' (one weight scale per layer or shard) or 'channel' (one per row).
    - ``activation_scheme``: 'static', 'dynamic' or 'per_token' (as ``Fp8Weight``).
    - ``ignore``: layer names and patterns left unquantized: exact names, globs ('*lm_head*',
      ModelOpt's style) and 're:<regex>' (compressed-tensors' style, matched with ``re.match``).
    - ``weight_block_size``: (rows, cols) for block-scaled checkpoints (not supported yet), else None.
    """

    quant_method: str
    weight_strategy: str = "tensor"
    activation_scheme: str = "dynamic"
    ignore: tuple = ()
    weight_block_size: tuple | None = None

    def __post_init__(self):
        if self.quant_method not in _METHODS:
            raise ValueError(f"quant_method must be one of {', '.join(_METHODS)}, got {self.quant_method!r}")
        if self.weight_strategy not in ("tensor", "channel"):
            raise ValueError(f"weight_strategy must be 'tensor' or 'channel', got {self.weight_strategy!r}")
        if self.activation_scheme not in ("static", "dynamic", "per_token"):
            raise ValueError(f"activation_scheme must be 'static', 'dynamic' or 'per_token', got {self.activation_scheme!r}")
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
            if len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
                raise ValueError(f"weight_block_size must be two positive ints [rows, cols], got {self.weight_block_size!r}")
            object.__setattr__(self, "weight_block_size", block)

    # -- reading -----------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config):
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
        return cls("modelopt", strategy, scheme, tuple(ignore))

    @classmethod
    def _from_compressed_tensors(cls, section):
        groups = section.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise ValueError(f"config_groups must be a non-empty dict in a compressed-tensors config, got {groups!r}")
        found = set()
        block = None
        for gname, group in groups.items():
            weights = group.get("weights") or {}
            acts = group.get("input_activations")
            if weights.get("type") != "float" or weights.get("num_bits") != 8:
                raise ValueError(f"config_groups.{gname}.weights must be 8-bit float (FP8), got "
                                 f"type={weights.get('type')!r} num_bits={weights.get('num_bits')!r}")
            w_strategy = weights.get("strategy")
            if w_strategy == "block":
                block = tuple(weights.get("block_structure") or ()) or None
                if block is None:
                    raise ValueError(f"config_groups.{gname}.weights.block_structure must be given for "
                                     f"strategy 'block', got none")
                w_strategy = "tensor"  # refused per layer by linear_method
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
            schemes = {("tensor", False): "static", ("tensor", True): "dynamic", ("token", True): "per_token"}
            if a_key not in schemes:
                raise ValueError(f"config_groups.{gname}.input_activations must be static 'tensor', dynamic "
                                 f"'tensor' or dynamic 'token', got strategy={a_key[0]!r} dynamic={a_key[1]}")
            found.add((w_strategy, schemes[a_key]))
        if len(found) != 1:
            raise ValueError(f"config_groups must share one FP8 scheme (mixed schemes are not supported yet), "
                             f"got {sorted(found)}")
        (strategy, scheme), = found
        return cls("compressed-tensors", strategy, scheme, tuple(section.get("ignore") or ()), block)

    @classmethod
    def _from_vllm_fp8(cls, section):
        scheme = section.get("activation_scheme")
        if scheme not in ("static", "dynamic"):
            raise ValueError(f"activation_scheme must be 'static' or 'dynamic' in an 'fp8' config, got {scheme!r}")
        fmt = section.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ValueError(f"fmt must be 'e4m3' (vtnumba's FP8 format is e4m3fn), got {fmt!r}")
        block = section.get("weight_block_size")
        return cls("fp8", "tensor", scheme, tuple(section.get("ignored_layers") or ()),
                   None if block is None else tuple(block))

    # -- per layer ---------------------------------------------------------------------------
    def ignored_by(self, prefix):
        """The ignore entry that leaves layer ``prefix`` unquantized, or None."""
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], prefix):
                    return pattern
            elif pattern == prefix or fnmatch.fnmatchcase(prefix, pattern):
                return pattern
        return None

    def is_ignored(self, prefix):
        return self.ignored_by(prefix) is not None

    def linear_method(self, prefix, weight, bias=None):
        """The linear method for layer ``prefix`` (e.g. 'model.layers.0.mlp.down_proj').

        Ignored layers get ``UnquantizedLinearMethod`` and need a float weight; quantized layers need an
        ``Fp8Weight`` / ``ResidentFp8`` whose activation scheme is the config's. Block-scaled configs
        are refused here, naming the layer.
        """
        pattern = self.ignored_by(prefix)
        if pattern is not None:
            if isinstance(weight, (Fp8Weight, ResidentFp8)):
                raise TypeError(f"weight of layer {prefix!r} must be a float array: the config leaves it "
                                f"unquantized (ignore entry {pattern!r}), got {type(weight).__name__}")
            if not isinstance(weight, np.ndarray) and not hasattr(weight, "__cuda_array_interface__"):
                raise TypeError(f"weight of layer {prefix!r} must be a float array, got {type(weight).__name__}")
            return UnquantizedLinearMethod(weight, bias)
        if self.weight_block_size is not None:
            raise ValueError(f"layer {prefix!r}: block-scaled FP8 (weight_block_size "
                             f"{list(self.weight_block_size)}, {self.quant_method} config) is not supported yet; "
                             f"only per-tensor and per-channel weight scales are")
        if not isinstance(weight, (Fp8Weight, ResidentFp8)):
            raise TypeError(f"weight of layer {prefix!r} must be an Fp8Weight (the {self.quant_method} config "
                            f"quantizes it; read it with seam.load_fp8_linear), got {type(weight).__name__}")
        if weight.activation_scheme != self.activation_scheme:
            raise ValueError(f"weight of layer {prefix!r} must have activation_scheme "
                             f"{self.activation_scheme!r} like the config, got {weight.activation_scheme!r}")
        return make_linear_method(weight, bias)

    def load_linear(self, path, prefix):
        """Read layer ``prefix`` from a safetensors checkpoint and return its linear method: the float
        weight (and bias) for ignored layers, the ``Fp8Weight`` with the config's activation scheme
        otherwise."""
        from .checkpoint import load_float_linear, load_fp8_linear

        if self.is_ignored(prefix):
            weight, bias = load_float_linear(path, prefix)
            return self.linear_method(prefix, weight, bias)
        if self.weight_block_size is not None:
            return self.linear_method(prefix, None)  # raises "not supported yet", naming the layer
        return self.linear_method(prefix, load_fp8_linear(path, prefix, activation_scheme=self.activation_scheme))
