"""``Fp8Format``: how one FP8 layer is quantized, checked once, and everything that follows from it.

A layer's format is its activation scheme, its weight scales' granularity (per-tensor, per-channel
or ``block_size`` blocks) and storage (float32 or E8M0 bytes), and how its activation scales are
formed (float32 or E8M0, the E8M0 rounding, UE8M0 powers of two). ``Fp8Weight``, ``Fp8Experts``
and ``Fp8Config`` build one from their fields; what the format decides is decided here and nowhere
else:

- how x is quantized for a weight of this format (``quantize`` and the text of that call,
  ``quantize_call``: ``seam.matmul_fp8`` and ``seam.quantize_activation`` use them);
- its key (``key``: the fields as a tuple; the object is frozen and hashable too) and display
  text (``str(fmt)``);
- how it is saved and read: the tensor names and dtypes of a dense layer (``dense_names``) and of
  fused experts (``experts_names``), the public ``quantization_config`` that describes it
  (``quantization_config``), and the record a vtnumba checkpoint keeps of it (``to_record`` /
  ``from_record``), which the loaders read back so that nothing is guessed.

docs/DESIGN.md, "Where the format is decoded", lists the other places that still branch on a
scheme and why.
"""

import functools
import json
from dataclasses import dataclass
from typing import Any

from .._format import MX_BLOCK
from ..ops import (
    ActivationScheme,
    QuantizedActivation,
    _e8m0_rounding,
    _flag,
    _scale_format,
    block_size_of,
    quantize_fp8,
)

__all__ = ["Fp8Format", "activation_scheme_of", "RECORD_KEY", "QUANTIZATION_CONFIG_KEY"]

# the safetensors ``__metadata__`` entries a vtnumba checkpoint carries: {name: record} of every
# FP8 layer (this module's words), and the public quantization_config that describes the model
RECORD_KEY = "vtnumba_fp8_formats"
QUANTIZATION_CONFIG_KEY = "quantization_config"
_RECORD_VERSION = 1


def activation_scheme_of(value: Any, name: str = "activation_scheme") -> ActivationScheme:
    """``value`` ('static', 'dynamic', 'per_token', 'per_group' or the enum) as an ``ActivationScheme``."""
    try:
        return ActivationScheme(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {', '.join(ActivationScheme)}, got {value!r}") from None


@dataclass(frozen=True)
class Fp8Format:
    """How an FP8 layer is quantized (module docstring), validated on construction.

    - ``activation_scheme``: 'static', 'dynamic', 'per_token' or 'per_group' (``ActivationScheme``).
    - ``block_size``: (bn, bk) for block-scaled weights, which go with 'per_group' activations and
      only with them; else None.
    - ``per_channel``: one weight scale per output row (no blocks), else one per tensor.
    - ``weight_scale_format``: 'float32', or 'e8m0' (block scales held as E8M0 bytes).
    - ``activation_scale_format``: 'float32', or 'e8m0' (MXFP8 activation scales; per-group only).
    - ``activation_scale_rounding``: the E8M0 rule ('rceil', the default, or 'floor') for 'e8m0'
      activation scales; None otherwise.
    - ``scale_ue8m0``: float32 per-group activation scales rounded up to powers of two (DeepGEMM's).

    ``Fp8Format.resolve(...)`` fills the defaults ``Fp8Weight`` documents (the scheme from the
    block size and the input scale, the activation scale format from the weight's).
    """

    activation_scheme: ActivationScheme
    block_size: tuple[int, int] | None = None
    per_channel: bool = False
    weight_scale_format: str = "float32"
    activation_scale_format: str = "float32"
    activation_scale_rounding: str | None = None
    scale_ue8m0: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        scheme = activation_scheme_of(self.activation_scheme)
        set_(self, "activation_scheme", scheme)
        block = None if self.block_size is None else block_size_of(self.block_size)
        set_(self, "block_size", block)
        if (scheme == ActivationScheme.PER_GROUP) != (block is not None):
            raise ValueError(
                f"activation_scheme 'per_group' goes with block-scaled weights and only with them: "
                f"got activation_scheme={str(scheme)!r} with block_size={block!r}"
            )
        per_channel = _flag(self.per_channel, "per_channel")
        if per_channel and block is not None:
            raise ValueError(
                f"per_channel must be False for block-scaled weights (block_size {block} sets the "
                f"scales' granularity), got True"
            )
        set_(self, "per_channel", per_channel)
        wfmt = _scale_format(self.weight_scale_format, "weight_scale_format")
        if wfmt == "e8m0" and block is None:
            raise ValueError(
                "weight_scale_format 'e8m0' needs block-scaled weights (E8M0 bytes are block scales), "
                "got block_size=None"
            )
        if _flag(self.scale_ue8m0, "scale_ue8m0") and scheme != ActivationScheme.PER_GROUP:
            raise ValueError(
                f"scale_ue8m0 applies to per-group activations only, got activation_scheme={str(scheme)!r}"
            )
        set_(self, "scale_ue8m0", bool(self.scale_ue8m0))
        afmt = _scale_format(self.activation_scale_format, "activation_scale_format")
        rounding = self.activation_scale_rounding
        if afmt == "e8m0":
            if scheme != ActivationScheme.PER_GROUP:
                raise ValueError(
                    f"activation_scale_format 'e8m0' needs per-group activations (a block-scaled weight), "
                    f"got activation_scheme={str(scheme)!r}"
                )
            if self.scale_ue8m0:
                raise ValueError(
                    "scale_ue8m0 must be False with activation_scale_format='e8m0' (an E8M0 scale is "
                    "rounded by activation_scale_rounding), got True"
                )
            rounding = _e8m0_rounding("rceil" if rounding is None else rounding, "activation_scale_rounding")
        elif rounding is not None:
            raise ValueError(
                f"activation_scale_rounding applies to activation_scale_format='e8m0' only, got "
                f"{rounding!r} with {afmt!r}"
            )
        set_(self, "activation_scale_rounding", rounding)

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def resolve(
        cls,
        activation_scheme: Any = None,
        block_size: Any = None,
        *,
        per_channel: bool = False,
        weight_scale_format: str = "float32",
        activation_scale_format: str | None = None,
        activation_scale_rounding: str | None = None,
        scale_ue8m0: bool = False,
        static: bool = False,
    ) -> "Fp8Format":
        """The format with ``Fp8Weight``'s defaults filled: the scheme 'per_group' for a block size,
        else 'static' when ``static`` (an input scale is given), else 'dynamic'; the activation
        scale format 'e8m0' for E8M0 weight scales in 1 x bk blocks (MXFP8), else 'float32'."""
        if activation_scheme is None:
            activation_scheme = (
                ActivationScheme.PER_GROUP
                if block_size is not None
                else ActivationScheme.STATIC
                if static
                else ActivationScheme.DYNAMIC
            )
        if activation_scale_format is None:
            mx = block_size is not None and tuple(block_size)[0] == 1 and weight_scale_format == "e8m0"
            activation_scale_format = "e8m0" if mx else "float32"
        return cls(
            activation_scheme,
            None if block_size is None else tuple(block_size),
            per_channel,
            weight_scale_format,
            activation_scale_format,
            activation_scale_rounding,
            scale_ue8m0,
        )

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def of(
        activation_scheme: Any,
        block_size: tuple[int, int] | None,
        per_channel: bool,
        weight_scale_format: str,
        activation_scale_format: str | None,
        activation_scale_rounding: str | None,
        scale_ue8m0: bool,
    ) -> "Fp8Format":
        """``resolve`` of these fields, cached by them: what a trusted constructor (a resident copy, a
        view of a torch layer's buffers) calls on every build, so each distinct format is checked once."""
        return Fp8Format.resolve(
            activation_scheme,
            block_size,
            per_channel=per_channel,
            weight_scale_format=weight_scale_format,
            activation_scale_format=activation_scale_format,
            activation_scale_rounding=activation_scale_rounding,
            scale_ue8m0=scale_ue8m0,
        )

    # -- what it is ----------------------------------------------------------------------------
    @property
    def key(self) -> tuple:
        """The fields as a hashable tuple, in declaration order (the scheme as its string)."""
        return (
            self.activation_scheme.value,
            self.block_size,
            self.per_channel,
            self.weight_scale_format,
            self.activation_scale_format,
            self.activation_scale_rounding,
            self.scale_ue8m0,
        )

    @property
    def mxfp8(self) -> bool:
        """E8M0 scales per 1 x 32 on both operands (OCP MXFP8)."""
        return (
            self.block_size == MX_BLOCK
            and self.weight_scale_format == "e8m0"
            and self.activation_scale_format == "e8m0"
        )

    @property
    def weight_strategy(self) -> str:
        """'tensor', 'channel' or 'block': the weight scales' granularity (``Fp8Config``'s word)."""
        return "block" if self.block_size is not None else "channel" if self.per_channel else "tensor"

    def __str__(self) -> str:
        scheme = self.activation_scheme.value
        if self.mxfp8:
            return f"{scheme} MXFP8 (1 x 32 E8M0 scales on weights and activations, {self.activation_scale_rounding})"
        if self.block_size is not None:
            bn, bk = self.block_size
            parts = [f"{self.weight_scale_format} weight scales per {bn} x {bk} block"]
            if self.activation_scale_format == "e8m0":
                parts.append(f"E8M0 activation scales per 1 x {bk} ({self.activation_scale_rounding})")
            else:
                parts.append(f"{'UE8M0' if self.scale_ue8m0 else 'float32'} activation scales per 1 x {bk}")
            return f"{scheme} ({', '.join(parts)})"
        return f"{scheme} ({'per-channel' if self.per_channel else 'per-tensor'} weight scales)"

    # -- how x is quantized for a weight of this format ------------------------------------------
    def quantize(self, x: Any, input_scale: Any = None) -> QuantizedActivation:
        """x [M, K] quantized as a weight of this format expects it (``input_scale``: the weight's,
        for 'static'). The one place the format maps to a ``vt.quantize_fp8`` call."""
        scheme = self.activation_scheme
        if scheme == ActivationScheme.PER_GROUP:
            # column-major float32 group scales: the layout cuBLASLt's block scaling reads, and the CPU's
            # block kernels' K-block-major one, so no kernel has to transpose them; E8M0 ones row-major,
            # the layout of the OCP MX formats and of the MX kernels
            return quantize_fp8(
                x,
                group_size=self.block_size[1],  # type: ignore[index]  # per_group has a block_size
                scale_ue8m0=self.scale_ue8m0,
                column_major_scales=self.activation_scale_format == "float32",
                scale_format=self.activation_scale_format,
                scale_rounding=self.activation_scale_rounding,
            )
        if scheme == ActivationScheme.PER_TOKEN:
            return quantize_fp8(x, per_token=True)
        if scheme == ActivationScheme.STATIC:
            return quantize_fp8(x, input_scale)
        return quantize_fp8(x)

    def quantize_host(self, x: Any, input_scale: Any = None) -> tuple[Any, Any]:
        """``quantize`` of a host array x [M, K] (numpy float32, float16 or bfloat16) that its caller
        has checked, made by the CPU backend's quantizer directly: (codes, scale) as ``quantize``'s
        ``QuantizedActivation`` holds them, without the argument checks of ``vt.quantize_fp8``. For the
        prepared host call (``seam.host_linear``), whose tests hold it bitwise to ``quantize``."""
        from .. import cpu  # the CPU backend; imported here, as ops.backend imports it

        scheme = self.activation_scheme
        if scheme == ActivationScheme.PER_GROUP:
            group = self.block_size[1]  # type: ignore[index]  # per_group has a block_size
            if self.activation_scale_format == "e8m0":
                # E8M0 group scales, row-major (MXFP8): as ``quantize`` asks for them
                return cpu.quantize_per_group_e8m0(x, group, self.activation_scale_rounding, False)
            # float32 group scales, column-major: as ``quantize`` asks for them
            return cpu.quantize_per_group(x, group, self.scale_ue8m0, True)
        if scheme == ActivationScheme.PER_TOKEN:
            return cpu.quantize_per_token(x, None)
        if scheme == ActivationScheme.STATIC:
            return cpu.quantize_static(x, input_scale), cpu.scale_array(input_scale)
        return cpu.quantize_dynamic(x)

    @property
    def quantize_call(self) -> str:
        """The ``vt.quantize_fp8`` call ``quantize`` makes, as a caller would write it (error messages)."""
        return _QUANTIZE_CALLS[self.activation_scheme]

    # -- how it is saved and read ------------------------------------------------------------------
    @property
    def layout(self) -> str:
        """The public checkpoint family whose names, dtypes and quantization_config this format is
        saved in: 'fp8' (transformers' fine-grained FP8, ``FineGrainedFP8Config``: per-tensor and
        block-scaled weights, static or dynamic activations), 'mxfp8' (MXFP8) or
        'compressed-tensors' (llm-compressor's float-quantized format: per-channel weights or
        per-token activations, which the 'fp8' family cannot say)."""
        if self.block_size == MX_BLOCK and self.activation_scale_format == "e8m0":
            return "mxfp8"  # the scales' dtype in the file says whether the weight's are E8M0 bytes
        if self.per_channel or self.activation_scheme == ActivationScheme.PER_TOKEN:
            return "compressed-tensors"
        return "fp8"

    @property
    def scale_dtype(self) -> str:
        """The safetensors dtype of the saved weight scales: 'F8_E8M0' for E8M0 bytes (transformers'
        ``float8_e8m0fnu``), else 'F32'."""
        return "F8_E8M0" if self.weight_scale_format == "e8m0" else "F32"

    def dense_names(self, prefix: str) -> dict[str, str]:
        """{role: tensor name} of a dense layer saved in this format: 'weight', 'weight_scale',
        'input_scale' (static only), 'bias'. The 'fp8' and 'mxfp8' families use transformers'
        ``FP8Linear`` names (``weight_scale_inv``, ``activation_scale``), compressed-tensors its own
        (``weight_scale``, ``input_scale``)."""
        names = {"weight": f"{prefix}.weight", "bias": f"{prefix}.bias"}
        if self.layout == "compressed-tensors":
            names["weight_scale"] = f"{prefix}.weight_scale"
            input_scale = f"{prefix}.input_scale"
        else:
            names["weight_scale"] = f"{prefix}.weight_scale_inv"
            input_scale = f"{prefix}.activation_scale"
        if self.activation_scheme == ActivationScheme.STATIC:
            names["input_scale"] = input_scale
        return names

    def dense_scale_shape(self, n: int, k: int) -> tuple[int, ...]:
        """The saved shape of a dense layer's weight scale: [] per-tensor (transformers' FP8Linear
        scalar) or [1] (compressed-tensors), [N, 1] per-channel (compressed-tensors), the block grid."""
        if self.block_size is not None:
            bn, bk = self.block_size
            return (-(-n // bn), -(-k // bk))
        if self.per_channel:
            return (n, 1)
        return (1,) if self.layout == "compressed-tensors" else ()

    def experts_names(self, name: str) -> dict[str, str]:
        """{role: tensor name} of fused experts saved under ``name`` ('...experts.gate_up_proj' or
        '...experts.down_proj'): transformers' ``FP8Experts`` parameters, the codes, ``{name}_scale_inv``
        and (static) ``{name}_activation_scale``."""
        names = {"weight": name, "weight_scale": f"{name}_scale_inv"}
        if self.activation_scheme == ActivationScheme.STATIC:
            names["input_scale"] = f"{name}_activation_scale"
        return names

    def experts_scale_shape(self, e: int, n: int, k: int, halves: bool) -> tuple[int, ...]:
        """The saved shape of fused experts' weight scales: the block grid [E, ceil(N/bn), ceil(K/bk)],
        [E, N, 1] per-channel, and per-tensor [E, 2, 1] for a gate_up (``halves``: transformers
        allocates one scale per half, here both the expert's one scale) or [E, 1, 1]."""
        if self.block_size is not None:
            bn, bk = self.block_size
            return (e, -(-n // bn), -(-k // bk))
        if self.per_channel:
            return (e, n, 1)
        return (e, 2, 1) if halves else (e, 1, 1)

    def quantization_config(self, ignore: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
        """The public ``quantization_config`` (a transformers config.json's section) describing a model
        whose quantized layers all have this format; ``ignore``: the layers left in float.

        - 'fp8' (transformers' ``FineGrainedFP8Config``, vLLM's "fp8"): ``activation_scheme``
          'static' / 'dynamic', ``weight_block_size`` (null: per-tensor), ``scale_fmt`` 'ue8m0' for
          E8M0 weight scales (transformers' meaning: their storage), ``modules_to_not_convert``; and
          ``activation_scale_ue8m0``, vtnumba's own key (ignored by other readers), for what vLLM
          reads ``scale_fmt`` as.
        - 'mxfp8' (E8M0 activation scales per 1 x 32): ``weight_block_size`` [1, 32], dynamic activations.
        - 'compressed-tensors': one config group, weights 'tensor' / 'channel' / 'block' and input
          activations static 'tensor', dynamic 'tensor' / 'token' / 'group' (llm-compressor's
          FP8 and FP8_DYNAMIC presets).
        """
        ignore = list(ignore)
        layout = self.layout
        if layout == "mxfp8":
            return {
                "quant_method": "mxfp8",
                "activation_scheme": "dynamic",
                "weight_block_size": list(MX_BLOCK),
                "modules_to_not_convert": ignore,
            }
        if layout == "fp8":
            return {
                "quant_method": "fp8",
                "activation_scheme": "static" if self.activation_scheme == ActivationScheme.STATIC else "dynamic",
                "weight_block_size": None if self.block_size is None else list(self.block_size),
                "scale_fmt": "ue8m0" if self.weight_scale_format == "e8m0" else "float",
                "activation_scale_ue8m0": self.scale_ue8m0,
                "modules_to_not_convert": ignore,
            }
        weights: dict[str, Any] = {
            "type": "float",
            "num_bits": 8,
            "symmetric": True,
            "dynamic": False,
            "strategy": self.weight_strategy,
        }
        if self.block_size is not None:
            weights["block_structure"] = list(self.block_size)
        scheme = self.activation_scheme
        acts: dict[str, Any] = {"type": "float", "num_bits": 8, "symmetric": True}
        if scheme == ActivationScheme.STATIC:
            acts.update(strategy="tensor", dynamic=False)
        elif scheme == ActivationScheme.DYNAMIC:
            acts.update(strategy="tensor", dynamic=True)
        elif scheme == ActivationScheme.PER_TOKEN:
            acts.update(strategy="token", dynamic=True)
        else:
            acts.update(strategy="group", dynamic=True, group_size=self.block_size[1])  # type: ignore[index]
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}},
            "ignore": ignore,
        }

    def to_record(self) -> dict[str, Any]:
        """The record a vtnumba checkpoint keeps of this format (JSON-able; ``from_record`` reads it)."""
        return {
            "version": _RECORD_VERSION,
            "activation_scheme": self.activation_scheme.value,
            "block_size": None if self.block_size is None else list(self.block_size),
            "per_channel": self.per_channel,
            "weight_scale_format": self.weight_scale_format,
            "activation_scale_format": self.activation_scale_format,
            "activation_scale_rounding": self.activation_scale_rounding,
            "scale_ue8m0": self.scale_ue8m0,
        }

    @classmethod
    def from_record(cls, record: Any, where: str = "") -> "Fp8Format":
        """The format a checkpoint recorded (``to_record``'s dict); ``where`` names it in errors."""
        fields = (
            "activation_scheme",
            "block_size",
            "per_channel",
            "weight_scale_format",
            "activation_scale_format",
            "activation_scale_rounding",
            "scale_ue8m0",
        )
        expected = {"version", *fields}
        if not isinstance(record, dict) or record.get("version") != _RECORD_VERSION or set(record) != expected:
            raise ValueError(
                f"the format record{where} must be a dict of version {_RECORD_VERSION} and {', '.join(fields)}, "
                f"got {json.dumps(record)[:200]}: the file was not written by this vtnumba's saver, or was edited"
            )
        try:
            values = {f: record[f] for f in fields}
            if values["block_size"] is not None:
                values["block_size"] = tuple(values["block_size"])
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the format record{where} must describe a valid format, got {exc}") from None

    def loader_kwargs(self) -> dict[str, Any]:
        """The keywords ``seam.load_fp8_linear`` / ``load_fp8_experts`` take for this format."""
        return {
            "activation_scheme": self.activation_scheme.value,
            "block_size": self.block_size,
            "scale_ue8m0": self.scale_ue8m0,
            "activation_scale_format": self.activation_scale_format,
            "activation_scale_rounding": self.activation_scale_rounding,
        }


_QUANTIZE_CALLS = {
    ActivationScheme.STATIC: "vt.quantize_fp8(x, weight.input_scale)",
    ActivationScheme.DYNAMIC: "vt.quantize_fp8(x)",
    ActivationScheme.PER_TOKEN: "vt.quantize_fp8(x, per_token=True)",
    ActivationScheme.PER_GROUP: (
        "vt.quantize_fp8(x, group_size=weight.block_size[1], scale_ue8m0=weight.scale_ue8m0, "
        "scale_format=weight.activation_scale_format, "
        "scale_rounding=weight.activation_scale_rounding)"
    ),
}
