"""The quantization configs of real FP8 checkpoints, read into one ``Fp8Config``.

The formats read (the ``quantization_config`` of a Hugging Face config.json, or ModelOpt's
hf_quant_config.json) follow upstream vLLM's readers and are a registry, one module per format in
``seam/formats/`` (as vLLM's ``get_quantization_config(name)``): ModelOpt ("modelopt", ``modelopt.py``),
compressed-tensors (``compressed_tensors.py``), vLLM's own "fp8" per-tensor and block-wise (DeepSeek-V3,
Qwen3-*-FP8, transformers' FineGrainedFP8Config; ``fp8.py``) and "mxfp8" (``mxfp8.py``). This module
finds the quantization section in a config (or its file) and hands it to ``formats.parse``; a new
format is a new module there, registered with ``formats.register(name)``.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._arrays import Array
from .._format import MX_BLOCK
from ..ops import ActivationScheme
from .checkpoint import Checkpoint
from .experts import Fp8Experts
from .fp8_format import Fp8Format
from .linear import LinearMethod, UnquantizedLinearMethod, make_linear_method
from .weights import Fp8Weight, ResidentFp8

__all__ = ["Fp8Config"]

_ACTIVATION_SCHEMES = ("static", "dynamic", "per_token", "per_group")


def _read_json(path, name):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise ValueError(f"{name} must be a readable JSON file, got {path!r} ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name} must be valid JSON, got {path!r} ({exc})") from None


def _quantization_section(config, where=""):
    """``(section, where)``: the quantization dict of a config.json / hf_quant_config.json dict, or of
    a path to one (or to a model directory), and `` in '<file>'`` naming the file it came from ("" for
    a dict), for error messages."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            # quantization_config.json: the section itself, as vtnumba's savers write it beside the shards
            for fname in ("config.json", "hf_quant_config.json", "quantization_config.json"):
                candidate = os.path.join(path, fname)
                if os.path.isfile(candidate):
                    found = _quantization_section(_read_json(candidate, "config"), f" in {candidate!r}")
                    if found[0] is not None:
                        return found
            raise ValueError(
                f"config must be a model directory with a quantization_config in config.json "
                f"or an hf_quant_config.json, got {path!r} without either"
            )
        config, where = _read_json(path, "config"), f" in {path!r}"
    if not isinstance(config, dict):
        if where:  # the file's content is at fault, not the argument
            raise ValueError(f"config must be a JSON object, got a {type(config).__name__}{where}")
        raise TypeError(f"config must be a dict or a path to a JSON file, got {type(config).__name__}")
    if "quantization_config" in config:  # a full config.json
        return config["quantization_config"], where
    if "quantization" in config and isinstance(config.get("producer"), dict):
        # ModelOpt's hf_quant_config.json: {"producer": {"name": "modelopt"}, "quantization": {...}}
        if not isinstance(config["quantization"], dict):
            raise ValueError(
                f"quantization must be a dict (ModelOpt's hf_quant_config.json), got "
                f"{type(config['quantization']).__name__}{where}"
            )
        return {"quant_method": "modelopt", **config["quantization"]}, where
    if isinstance(config.get("quantization"), dict) and "quant_algo" in config["quantization"]:
        # ModelOpt's section without the producer that says who wrote it: say what is missing, not
        # that the checkpoint is unquantized
        raise ValueError(
            f"config's 'producer' must be a dict naming who wrote the ModelOpt 'quantization' section "
            f"(hf_quant_config.json: {{\"producer\": {{\"name\": \"modelopt\", ...}}, \"quantization\": {{...}}}}), "
            f"got {repr(config['producer']) if 'producer' in config else 'none'}{where}; add it to the file, or pass the section itself: "
            f"Fp8Config.from_hf({{\"quant_method\": \"modelopt\", **config[\"quantization\"]}})"
        )
    if "quant_method" in config:  # the quantization_config itself
        return config, where
    return None, where


@dataclass(frozen=True)
class Fp8Config:
    """How a checkpoint's linear layers are quantized.

    - ``quant_method``: the format it was read from, a name registered in ``seam.formats``
      ('modelopt', 'compressed-tensors', 'fp8', 'mxfp8', and any registered since).
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
    - ``weight_scale_format``: 'e8m0' where the format says the block scales are stored as E8M0 bytes
      (MXFP8; transformers' ``scale_fmt`` 'ue8m0'), else 'float32'. What the loaders read is decided
      by each scale tensor's dtype; this is what a saved config says.

    ``format`` is the ``seam.Fp8Format`` of the config's quantized layers, built once from these
    fields; ``to_hf()`` the ``quantization_config`` a saver writes for it (``Fp8Format.quantization_config``),
    which ``from_hf`` reads back to an equal config.
    """

    quant_method: str
    weight_strategy: str | None = None
    activation_scheme: str = "dynamic"
    ignore: tuple[str, ...] = ()
    weight_block_size: tuple[int, int] | None = None
    activation_group_size: int | None = None
    activation_scale_ue8m0: bool = False
    activation_scale_format: str = "float32"
    weight_scale_format: str = "float32"
    format: Fp8Format = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        methods = _formats().names()
        if self.quant_method not in methods:
            raise ValueError(f"quant_method must be one of {', '.join(methods)}, got {self.quant_method!r}")
        if self.weight_strategy is None:
            object.__setattr__(self, "weight_strategy", "tensor" if self.weight_block_size is None else "block")
        if self.weight_strategy not in ("tensor", "channel", "block"):
            raise ValueError(f"weight_strategy must be 'tensor', 'channel' or 'block', got {self.weight_strategy!r}")
        if self.activation_scheme not in _ACTIVATION_SCHEMES:
            raise ValueError(
                f"activation_scheme must be one of {', '.join(map(repr, _ACTIVATION_SCHEMES))}, "
                f"got {self.activation_scheme!r}"
            )
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
                raise ValueError(
                    f"weight_block_size must be two positive ints [rows, cols], got {self.weight_block_size!r}"
                )
            object.__setattr__(self, "weight_block_size", block)
        self._check_block_scheme()
        if self.activation_scale_format not in ("float32", "e8m0"):
            raise ValueError(
                f"activation_scale_format must be 'float32' or 'e8m0', got {self.activation_scale_format!r}"
            )
        if self.activation_scale_format == "e8m0" and (
            self.activation_scheme != "per_group" or self.activation_scale_ue8m0
        ):
            raise ValueError(
                f"activation_scale_format 'e8m0' needs activation_scheme 'per_group' without "
                f"activation_scale_ue8m0, got {self.activation_scheme!r}, {self.activation_scale_ue8m0!r}"
            )
        if self.weight_scale_format not in ("float32", "e8m0"):
            raise ValueError(f"weight_scale_format must be 'float32' or 'e8m0', got {self.weight_scale_format!r}")
        object.__setattr__(
            self,
            "format",
            Fp8Format(
                ActivationScheme(self.activation_scheme),
                self.weight_block_size,
                self.weight_strategy == "channel",
                self.weight_scale_format,
                self.activation_scale_format,
                None,
                self.activation_scale_ue8m0,
            ),
        )

    @classmethod
    def from_format(cls, fmt: Fp8Format, ignore: tuple[str, ...] = ()) -> "Fp8Config":
        """The config of a model whose quantized layers all have format ``fmt`` (``ignore``: the layers
        left in float), under the public ``quant_method`` that describes it (``Fp8Format.layout``)."""
        if not isinstance(fmt, Fp8Format):
            raise TypeError(f"fmt must be a seam.Fp8Format, got {type(fmt).__name__}")
        return cls(
            fmt.layout,
            fmt.weight_strategy,
            fmt.activation_scheme.value,
            tuple(ignore),
            fmt.block_size,
            None,
            fmt.scale_ue8m0,
            fmt.activation_scale_format,
            fmt.weight_scale_format,
        )

    def to_hf(self) -> dict[str, Any]:
        """The ``quantization_config`` section (a transformers config.json's) this config is saved as:
        ``Fp8Format.quantization_config`` of ``format`` with the ignore list; ``from_hf`` reads it back."""
        return self.format.quantization_config(self.ignore)

    @classmethod
    def from_checkpoint(cls, checkpoint: "str | os.PathLike | Checkpoint") -> "Fp8Config | None":
        """The config a vtnumba saver wrote in a checkpoint's metadata (``Checkpoint.quantization_config``,
        read by ``from_hf``), or None when it holds none (a checkpoint written by anything else:
        pass its config.json to ``from_hf``)."""
        from .checkpoint import _checkpoint

        section = _checkpoint(checkpoint).quantization_config()
        if section is None:
            return None
        try:
            return _formats().parse(section)
        except ValueError as exc:
            raise ValueError(f"{exc} (the quantization_config in the metadata of {checkpoint!r})") from None

    @property
    def mxfp8(self) -> bool:
        """Whether the config is MXFP8: E8M0 scales per 1 x 32 on weights and activations."""
        return self.activation_scale_format == "e8m0"

    def _check_block_scheme(self):
        """Block-scaled weights and per-group activations come together, with group size = bk."""
        block = self.weight_block_size
        if (self.weight_strategy == "block") != (block is not None):
            raise ValueError(
                f"weight_block_size must be given exactly when weight_strategy is 'block', got "
                f"weight_strategy={self.weight_strategy!r} with weight_block_size={block!r}"
            )
        if block is not None and self.activation_scheme != "per_group":
            raise ValueError(
                f"activation_scheme must be 'per_group' with block-scaled weights (weight_block_size "
                f"{list(block)}), got {self.activation_scheme!r}"
            )
        group = self.activation_group_size
        if self.activation_scheme != "per_group":
            if group is not None:
                raise ValueError(
                    f"activation_group_size must be None unless activation_scheme is 'per_group', "
                    f"got {group!r} with {self.activation_scheme!r}"
                )
            if self.activation_scale_ue8m0:
                raise ValueError(
                    f"activation_scale_ue8m0 needs activation_scheme 'per_group', got {self.activation_scheme!r}"
                )
            return
        if block is None:
            raise ValueError(
                "activation_scheme 'per_group' needs block-scaled weights: weight_block_size must be given, got None"
            )
        if group is None:
            object.__setattr__(self, "activation_group_size", block[1])
        elif isinstance(group, bool) or not isinstance(group, int) or group != block[1]:
            raise ValueError(
                f"activation_group_size must equal the weight's bk = {block[1]} (weight_block_size "
                f"{list(block)}), got {group!r}"
            )

    # -- reading -----------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: dict[str, Any] | str | os.PathLike) -> "Fp8Config":
        """Read the quantization config of a checkpoint: a config.json dict (its
        ``quantization_config``), the ``quantization_config`` dict itself, ModelOpt's
        hf_quant_config.json dict, or a path to either file or to the model directory."""
        section, where = _quantization_section(config)
        if section is None:
            raise ValueError(
                "config must contain a quantization_config (config.json) or a ModelOpt "
                f"'quantization' section (hf_quant_config.json), got none{where}: the checkpoint "
                "is not quantized"
            )
        if not isinstance(section, dict):
            if where:  # the file's content is at fault, not the argument
                raise ValueError(f"quantization_config must be a dict, got {type(section).__name__}{where}")
            raise TypeError(f"quantization_config must be a dict, got {type(section).__name__}")
        try:
            return _formats().parse(section)
        except ValueError as exc:
            if not where:
                raise
            raise ValueError(f"{exc}{where}") from None

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

    def linear_method(
        self, prefix: str, weight: Fp8Weight | ResidentFp8 | Array, bias: Array | None = None
    ) -> LinearMethod:
        """The linear method for layer ``prefix`` (e.g. 'model.layers.0.mlp.down_proj').

        Ignored layers get ``UnquantizedLinearMethod`` and need a float weight; quantized layers need an
        ``Fp8Weight`` / ``ResidentFp8`` whose activation scheme is the config's (and, for a
        block-scaled config, whose ``block_size`` is the config's ``weight_block_size``).
        """
        pattern = self.ignored_by(prefix)
        if pattern is not None:
            if isinstance(weight, (Fp8Weight, ResidentFp8)):
                raise TypeError(
                    f"weight of layer {prefix!r} must be a float array: the config leaves it "
                    f"unquantized (ignore entry {pattern!r}), got {type(weight).__name__}"
                )
            if not isinstance(weight, np.ndarray) and not hasattr(weight, "__cuda_array_interface__"):
                raise TypeError(f"weight of layer {prefix!r} must be a float array, got {type(weight).__name__}")
            return UnquantizedLinearMethod(weight, bias)
        if not isinstance(weight, (Fp8Weight, ResidentFp8)):
            raise TypeError(
                f"weight of layer {prefix!r} must be an Fp8Weight (the {self.quant_method} config "
                f"quantizes it; read it with seam.load_fp8_linear), got {type(weight).__name__}"
            )
        if weight.activation_scheme != self.activation_scheme:
            raise ValueError(
                f"weight of layer {prefix!r} must have activation_scheme "
                f"{self.activation_scheme!r} like the config, got {weight.activation_scheme!r}"
            )
        w = weight.weight if isinstance(weight, ResidentFp8) else weight
        if w.block_size != self.weight_block_size:
            raise ValueError(
                f"weight of layer {prefix!r} must have block_size {self.weight_block_size} like the "
                f"config's weight_block_size, got {w.block_size}"
            )
        if w.block_size is not None and w.activation_scale_format != self.activation_scale_format:
            raise ValueError(
                f"weight of layer {prefix!r} must have activation_scale_format "
                f"{self.activation_scale_format!r} like the config, got {w.activation_scale_format!r}"
            )
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
            return self.linear_method(
                prefix, Fp8Weight.from_float(weight, bias=bias, block_size=MX_BLOCK, scale_format="e8m0")
            )
        return self.linear_method(
            prefix,
            load_fp8_linear(path, prefix, **self._loader_kwargs()),
        )

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

    def load_experts(
        self, checkpoint: str | os.PathLike | Checkpoint, prefix: str, *, num_experts: int | None = None
    ) -> tuple[Fp8Experts, Fp8Experts]:
        """``(gate_up, down)`` ``seam.Fp8Experts`` of the MoE layer ``prefix``, read by
        ``seam.load_fp8_experts`` with this config's activation scheme and block size (for
        ``seam.moe_fp8``). ``num_experts``: the model config's expert count, so a missing last expert
        is named. Experts the config leaves unquantized (an ``ignore`` entry matching ``prefix`` or
        one expert's projection) are refused: ``moe_fp8`` takes FP8 experts only."""
        from .experts_checkpoint import _checkpoint, _expert_indices, load_fp8_experts

        ckpt = _checkpoint(checkpoint, prefix)
        layers = [prefix] + [
            f"{prefix}.{e}.{p}"
            for e in sorted(_expert_indices(ckpt, prefix))
            for p in ("gate_proj", "up_proj", "down_proj")
        ]
        for layer in layers:
            pattern = self.ignored_by(layer)
            if pattern is not None:
                raise ValueError(
                    f"experts {prefix!r} must be FP8-quantized to load as seam.Fp8Experts, got {layer!r} "
                    f"left unquantized by the ignore entry {pattern!r} (the checkpoint {ckpt.path!r})"
                )
        return load_fp8_experts(ckpt, prefix, num_experts=num_experts, **self._loader_kwargs())

    def _loader_kwargs(self):
        """The loaders' keywords for this config's format (no rounding: a config names none, so a
        saved layer's recorded one is read)."""
        kw = self.format.loader_kwargs()
        kw["activation_scale_rounding"] = None
        return kw


def _float_weight(path, prefix):
    """Whether layer ``prefix``'s weight is stored in a float dtype (not FP8-serialized)."""
    from .checkpoint import _FLOAT_DTYPES, _checkpoint

    ckpt = _checkpoint(path, prefix)
    name = f"{prefix}.weight"
    return name in ckpt and ckpt.dtype(name) in _FLOAT_DTYPES


def _formats():
    """The format registry, imported when first used: its modules build ``Fp8Config`` objects, so they
    import this module and it cannot import them at its top."""
    from . import formats

    return formats
