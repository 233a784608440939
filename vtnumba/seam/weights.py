"""FP8 weights: ``Fp8Weight`` (codes + scales, validated once) and ``ResidentFp8`` (a weight made
resident on a device, uploaded once, accounted to the byte). Devices are named as
``vtnumba._arrays`` names them: 'cpu' or 'cuda:N'.

Where this differs from the C++ seam it comes from: that seam's ``ResidentFp8`` uploaded weight bytes
without recording them and kept the host copy alive, while every sibling loader did both. Here every
upload and every released host copy is recorded in ``load_stats()``.
"""

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from .. import _arrays, _format
from .._arrays import Array, DType, Scale
from .._interop import interop, to_native
from ..ops import (
    ActivationScheme,
    _e8m0_rounding,
    _flag,
    _scale_format,
    block_size_of,
    decode_e8m0,
    dequantize_fp8,
    encode_e4m3,
    quant_scale,
    quantize_fp8,
)
from ._finite import refuse_nonfinite
from .fp8_format import Fp8Format, activation_scheme_of

__all__ = ["Fp8Weight", "ResidentFp8", "DeviceLoadStats", "load_stats", "reset_load_stats"]


def _is_host_scalar(value):
    return isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, bool)


def _host_values(arr):
    """A small array's values on the host (one device-to-host copy for a GPU array: construction
    time only, never per call)."""
    if isinstance(arr, np.ndarray):
        return arr
    return arr.get() if hasattr(arr, "get") else np.asarray(arr)


@dataclass(frozen=True, eq=False)
class Fp8Weight:
    """An FP8 (e4m3fn) linear weight in nn.Linear's layout, validated on construction.

    - ``data``: e4m3 codes [N, K] (uint8, or ml_dtypes.float8_e4m3fn viewed as uint8), numpy or cupy.
    - ``weight_scale``: the dequantization multiplier (w = decode(codes) * weight_scale): a scalar
      (per-tensor) or [N] / [N, 1] (per-channel). Stored as float32 of shape (1,) or (N,), > 0 and
      finite.
    - ``input_scale``: the static activation scale (a positive finite scalar) or None.
    - ``bias``: None or a float array [N].
    - ``activation_scheme``: how activations are quantized before the GEMM: 'static' (per-tensor,
      ``input_scale``), 'dynamic' (per-tensor, from each input's amax), 'per_token' (dynamic, one
      scale per row) or 'per_group' (dynamic, one scale per 1 x bk group along K; block-scaled
      weights only). Defaults to 'static' when ``input_scale`` is given, 'per_group' for a
      block-scaled weight, else 'dynamic'.
    - ``block_size``: (bn, bk) for a block-scaled weight (DeepSeek-V3/R1, Qwen3-FP8): then
      ``weight_scale`` is [ceil(N / bn), ceil(K / bk)] (float32, bfloat16 or float16, widened
      exactly to float32), one multiplier per bn x bk block, and activations are quantized per group
      of bk. ``scale_ue8m0``: those activation scales are rounded up to powers of two (DeepGEMM).
      The block scales may instead be uint8 E8M0 bytes (2^(byte - 127); ml_dtypes.float8_e8m0fnu is
      viewed as them), kept as bytes: ``block_size=(1, 32)`` is an MXFP8 weight (OCP MX), ``(128, 128)``
      DeepSeek's UE8M0 checkpoints. Byte 0xFF (NaN) is refused.
    - ``activation_scale_format``: 'e8m0' quantizes the activations MXFP8-style (E8M0 group scales,
      ``vt.quantize_fp8(x, group_size=bk, scale_format="e8m0")``), 'float32' as above. Default: 'e8m0'
      for E8M0 weight scales in 1 x bk blocks (MXFP8: both operands scaled per group of K), else
      'float32'. ``activation_scale_rounding`` ('rceil' by default, or 'floor'): the E8M0 rule for them.
    - ``source``: free-form provenance (the checkpoint loader records which tensors and which scale
      convention it read); not compared.

    Equality and hashing are by identity: a weight is a resource (the resident cache is keyed by it).
    The one mutation is ``ResidentFp8(..., release_host=True)``, which drops ``data`` after upload
    (``released_to`` then names the device holding the codes).
    """

    data: Any
    weight_scale: Any
    input_scale: Any = None
    bias: Any = None
    activation_scheme: str | None = None
    source: Any = field(default=None, repr=False)
    block_size: tuple[int, int] | None = None
    scale_ue8m0: bool = False
    activation_scale_format: str | None = None
    activation_scale_rounding: str | None = None
    device: str = field(init=False, repr=False)
    shape: tuple[int, int] = field(init=False, repr=False)
    per_channel: bool = field(init=False, repr=False)
    released_to: str | None = field(init=False, default=None, repr=False)
    # the GPU calls bound for this weight (vtnumba.cuda.bound), by input signature; see seam.matmul
    bound_calls: dict | None = field(init=False, default=None, repr=False)
    # the prepared host call (seam.host_linear) of a host weight, made at its first numpy call;
    # False where the format takes none (E8M0 scales)
    host_call: Any = field(init=False, default=None, repr=False)
    # how the weight is quantized, built once from the fields above (seam.Fp8Format)
    format: Fp8Format = field(init=False, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        # torch tensors and other frameworks' arrays are held as numpy / cupy views of their memory,
        # what every op takes (the constructor is not @interop: it returns no array to convert back)
        for name in ("data", "weight_scale", "input_scale", "bias"):
            value = getattr(self, name)
            if value is not None and not _is_host_scalar(value) and not isinstance(value, np.ndarray):
                set_(self, name, to_native(value, name))
        data = self.data
        device = _arrays.device_of(data, "data")
        data = _arrays.codes_uint8(data, "data")
        if len(data.shape) != 2:
            raise ValueError(f"data must be 2-D codes [N, K] (nn.Linear layout), got shape {tuple(data.shape)}")
        n, k = (int(d) for d in data.shape)
        if n < 1 or k < 1:
            raise ValueError(f"data must have N >= 1 rows and K >= 1 columns, got shape {(n, k)}")
        set_(self, "data", data)
        set_(self, "device", device)
        set_(self, "shape", (n, k))

        if self.block_size is not None:
            block = block_size_of(self.block_size)
            set_(self, "block_size", block)
            scale, per_channel = _block_weight_scale(self.weight_scale, (n, k), block, device), False
        else:
            scale, per_channel = _weight_scale(self.weight_scale, n, device)
        set_(self, "weight_scale", scale)
        set_(self, "per_channel", per_channel)

        if self.input_scale is not None:
            value = self.input_scale
            if hasattr(value, "__cuda_array_interface__"):  # read once, here: it is passed by value
                value = _host_values(value)
            set_(self, "input_scale", np.float32(quant_scale(value, "input_scale")))

        # the format (scheme, block size, scale formats and rounding) is decided and checked by
        # Fp8Format, once; the input scale is the one check that needs the weight's value
        scheme = self.activation_scheme
        if scheme is None:
            scheme = Fp8Format.resolve(
                block_size=self.block_size, static=self.input_scale is not None
            ).activation_scheme
        scheme = activation_scheme_of(scheme)
        if scheme == ActivationScheme.STATIC and self.input_scale is None:
            raise ValueError("input_scale must be given for activation_scheme='static', got None")
        if scheme != ActivationScheme.STATIC and self.input_scale is not None:
            raise ValueError(
                f"input_scale must be None for activation_scheme={scheme!r} "
                f"(its scales come from each input), got {self.input_scale!r}"
            )
        fmt = Fp8Format.resolve(
            scheme,
            self.block_size,
            per_channel=per_channel,
            weight_scale_format=self.scale_format,
            activation_scale_format=self.activation_scale_format,
            activation_scale_rounding=self.activation_scale_rounding,
            scale_ue8m0=self.scale_ue8m0,
        )
        set_(self, "format", fmt)
        # the loose fields stay, for compatibility: each is the format's
        set_(self, "activation_scheme", fmt.activation_scheme)
        set_(self, "scale_ue8m0", fmt.scale_ue8m0)
        set_(self, "activation_scale_format", fmt.activation_scale_format)
        set_(self, "activation_scale_rounding", fmt.activation_scale_rounding)

        if self.bias is not None:
            bias = self.bias
            if _arrays.device_of(bias, "bias") != device:
                raise ValueError(f"bias must be on the weight's device {device}, got {_arrays.device_of(bias, 'bias')}")
            set_(self, "bias", _arrays.bias_vector(bias, n))

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    @interop
    def from_float(
        cls,
        w: Array,
        input_scale: Scale | None = None,
        per_channel: bool = False,
        *,
        activation_scheme: str | None = None,
        bias: Array | None = None,
        block_size: tuple[int, int] | None = None,
        scale_ue8m0: bool = False,
        scale_format: str = "float32",
        scale_rounding: str | None = None,
        allow_nonfinite: bool = False,
    ) -> "Fp8Weight":
        """Quantize a float weight [N, K] (online quantization, as upstream does for checkpoints
        that are not FP8-serialized). A NaN or Inf in ``w`` is refused (naming its index) unless
        ``allow_nonfinite=True``, which stores NaN as code 0x7F and saturates Inf to +-448.

        - per-tensor (default): ``weight_scale = max(amax / 448, 1 / (448 * 512))`` and codes from
          ``vt.quantize_fp8(w)`` -- mirrors vLLM's ``Fp8LinearMethod.process_weights_after_loading``
          (``ops.scaled_fp8_quant(layer.weight, scale=None)``) for unserialized checkpoints.
        - ``per_channel=True``: one scale per output row, ``amax_row / 448`` (same floor), each row
          quantized with its own scale by ``vt.quantize_fp8(w, per_token=True)`` -- mirrors vLLM's
          ``PTPCFp8LinearMethod.process_weights_after_loading``
          (``ops.scaled_fp8_quant(weight, scale=None, use_per_token_if_dynamic=True)``), which treats
          the weight's output channels as tokens.
        The floor (upstream has none) keeps an all-zero row from getting scale 0 and NaN codes.
        - ``block_size=(bn, bk)``: one scale per bn x bk block, ``max(amax_block, 1e-10) / 448`` in
          float32, and ``codes = encode(w / scale)`` by a true division -- the block quantization
          DeepSeek-V3's and vLLM's ``per_block_cast_to_fp8`` use; activations then go per group of bk.
        - ``block_size=(bn, bk), scale_format="e8m0"``: one E8M0 byte per block from its finite amax by
          ``scale_rounding`` ('rceil' by default, or 'floor'; DESIGN.md "MXFP8") and codes
          ``encode(w / 2^(byte - 127))``. ``block_size=(1, 32)`` makes an MXFP8 weight (exactly
          ``vt.quantize_fp8(w, group_size=32, scale_format="e8m0")``), whose activations are quantized
          MXFP8 with the same rule.
        """
        _arrays.device_of(w, "w")
        _arrays.float_dtype(w, "w")
        if len(w.shape) != 2 or 0 in w.shape:
            raise ValueError(f"w must be 2-D [N, K] (nn.Linear layout), N, K >= 1, got shape {tuple(w.shape)}")
        refuse_nonfinite(w, "w", allow_nonfinite)
        per_channel = _flag(per_channel, "per_channel")
        e8m0 = _scale_format(scale_format) == "e8m0"
        if not e8m0 and scale_rounding is not None:
            raise ValueError(f"scale_rounding applies to scale_format='e8m0' only, got {scale_rounding!r}")
        if block_size is not None:
            if per_channel or input_scale is not None:
                raise ValueError(
                    "per_channel and input_scale do not apply to a block-scaled weight, got "
                    f"per_channel={per_channel!r}, input_scale={input_scale!r}"
                )
            block = block_size_of(block_size)
            rounding = _e8m0_rounding("rceil" if scale_rounding is None else scale_rounding) if e8m0 else None
            if e8m0 and block[0] == 1:  # MX: per row, groups of bk -- the activation quantizer itself
                q = quantize_fp8(w, group_size=block[1], scale_format="e8m0", scale_rounding=rounding)
                codes, scale = q.data, q.scale
            else:
                codes, scale = _quantize_blocks(w, block, rounding)
            mx = e8m0 and block[0] == 1
            return cls(
                codes,
                scale,
                bias=bias,
                activation_scheme=activation_scheme,
                block_size=block_size,
                scale_ue8m0=scale_ue8m0,
                activation_scale_rounding=rounding if mx else None,
            )
        if e8m0:
            raise ValueError(
                "scale_format='e8m0' must come with block_size (E8M0 scales are per block; MXFP8 is "
                "block_size=(1, 32)), got block_size=None"
            )
        if per_channel:
            q = quantize_fp8(w, per_token=True)
            scale = q.scale.reshape(-1)
        else:
            q = quantize_fp8(w)
            scale = q.scale
        return cls(q.data, scale, input_scale=input_scale, bias=bias, activation_scheme=activation_scheme)

    @classmethod
    def _trusted(
        cls,
        data,
        weight_scale,
        input_scale,
        bias,
        activation_scheme,
        source,
        per_channel,
        block_size=None,
        scale_ue8m0=False,
        activation_scale_format="float32",
        activation_scale_rounding=None,
    ):
        """Build from parts already validated (a resident copy of a validated weight): no checks,
        no device synchronization."""
        self = object.__new__(cls)
        set_ = object.__setattr__
        for name, value in (
            ("data", data),
            ("weight_scale", weight_scale),
            ("input_scale", input_scale),
            ("bias", bias),
            ("activation_scheme", activation_scheme),
            ("source", source),
            ("device", _arrays.device_of(data, "data")),
            ("shape", tuple(int(d) for d in data.shape)),
            ("per_channel", per_channel),
            ("released_to", None),
            ("bound_calls", None),
            ("host_call", None),
            ("block_size", block_size),
            ("scale_ue8m0", scale_ue8m0),
            ("activation_scale_format", activation_scale_format),
            ("activation_scale_rounding", activation_scale_rounding),
        ):
            set_(self, name, value)
        set_(
            self,
            "format",
            Fp8Format.of(
                activation_scheme,
                block_size,
                bool(per_channel),
                self.scale_format,
                activation_scale_format,
                activation_scale_rounding,
                bool(scale_ue8m0),
            ),
        )
        return self

    def __repr__(self):
        kind = (
            f"block {self.block_size}" + (" e8m0" if self.scale_format == "e8m0" else "")
            if self.block_size is not None
            else "per-channel"
            if self.per_channel
            else "per-tensor"
        )
        return (
            f"Fp8Weight(shape={self.shape}, device={self.device!r}, weight_scale={kind}, "
            f"activation_scheme={self.activation_scheme!r}, bias={self.bias is not None}"
            + (f", released_to={self.released_to!r})" if self.released_to else ")")
        )

    # -- views -------------------------------------------------------------------------------
    @property
    def scale_format(self) -> str:
        """'e8m0' when ``weight_scale`` holds E8M0 bytes (uint8), else 'float32'."""
        return "e8m0" if _arrays.dtype_of(self.weight_scale) == np.uint8 else "float32"

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def in_features(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays a resident copy holds: codes, weight scale, bias (as float32)."""
        n = self.shape[0]
        return n * self.shape[1] + int(self.weight_scale.nbytes) + (0 if self.bias is None else 4 * n)

    def host_data(self, name: str = "weight") -> Array:
        """The codes, or a clear error if they were released after an upload."""
        if self.data is None:
            raise ValueError(
                f"{name}.data must be present, got None: the host codes were released after "
                f"upload to {self.released_to} (ResidentFp8(..., release_host=True)); "
                f"use that ResidentFp8 instead"
            )
        return self.data

    def dequantize(self, dtype: DType = np.float32) -> Array:
        """decode(codes) * weight_scale per row (per block), in float32, rounded to ``dtype`` (no bias)."""
        if self.block_size is not None:
            bn, bk = self.block_size
            n, k = self.shape
            scale = decode_e8m0(self.weight_scale) if self.scale_format == "e8m0" else self.weight_scale
            scale = scale.repeat(bn, axis=0).repeat(bk, axis=1)[:n, :k]
            return dequantize_fp8(self.host_data(), scale, dtype)
        scale = self.weight_scale.reshape(-1, 1)
        return dequantize_fp8(self.host_data(), scale, dtype)


def _weight_scale(value, n, device):
    """(float32 array of shape (1,) or (n,), per_channel) on ``device``; '> 0 and finite' checked."""
    xp_host = _is_host_scalar(value) or isinstance(value, np.ndarray)
    if not xp_host and _arrays.device_of(value, "weight_scale") != device:
        raise ValueError(
            f"weight_scale must be on the weight's device {device}, got {_arrays.device_of(value, 'weight_scale')}"
        )
    shape = () if _is_host_scalar(value) else tuple(int(d) for d in value.shape)
    if int(np.prod(shape)) == 1 and len(shape) <= 2:
        per_channel = False
    elif shape in ((n,), (n, 1)):
        per_channel = True
    else:
        raise ValueError(
            f"weight_scale must be a scalar, shape (1,) (per-tensor), ({n},) or ({n}, 1) "
            f"(per-channel), got shape {shape}"
        )
    host = np.asarray(value if xp_host else _host_values(value))
    if host.dtype.kind != "f" and host.dtype != _arrays.BFLOAT16:
        if _is_host_scalar(value):
            host = host.astype(np.float64)
        else:
            raise TypeError(f"weight_scale must be a float array, got dtype {host.dtype}")
    host32 = host.astype(np.float32).reshape(-1)
    bad = ~(np.isfinite(host32) & (host32 > 0))
    if bad.any():
        raise ValueError(
            f"weight_scale must be positive and finite, got {host32[bad][:4].tolist()} "
            f"at {np.flatnonzero(bad)[:4].tolist()}"
        )
    if device == "cpu":
        return host32, per_channel
    if not xp_host and np.dtype(value.dtype) == np.float32:
        return value.reshape(-1), per_channel
    return _to_device(host32, device), per_channel


def _block_weight_scale(value, shape, block, device):
    """The block scales [ceil(N / bn), ceil(K / bk)] as float32 on ``device``; positive and finite
    (the first bad block is named)."""
    n, k = shape
    bn, bk = block
    want = (-(-n // bn), -(-k // bk))
    got = tuple(int(d) for d in getattr(value, "shape", ()))
    if got != want:
        raise ValueError(
            f"weight_scale must have shape {want} for a weight {shape} in {bn} x {bk} blocks, got "
            f"{got if hasattr(value, 'shape') else type(value).__name__}"
        )
    on_host = isinstance(value, np.ndarray)
    if not on_host and _arrays.device_of(value, "weight_scale") != device:
        raise ValueError(
            f"weight_scale must be on the weight's device {device}, got {_arrays.device_of(value, 'weight_scale')}"
        )
    dt = _arrays.dtype_of(value)
    if dt == np.uint8 or dt == _arrays.FLOAT8_E8M0:
        return _e8m0_block_scale(_arrays.e8m0_bytes(value, "weight_scale"), on_host, device)
    if dt.kind != "f" and dt != _arrays.BFLOAT16:
        raise TypeError(f"weight_scale must be a float array or uint8 E8M0 bytes, got dtype {dt}")
    host = (value if on_host else _host_values(value)).astype(np.float32)  # bf16 / f16 widen exactly
    _refuse_blocks(
        ~(np.isfinite(host) & (host > 0)), "be positive and finite in every block", lambda at: repr(host[at]), "bad"
    )
    if device == "cpu":
        return np.ascontiguousarray(host)
    if not on_host and dt == np.float32:
        return value
    return _to_device(np.ascontiguousarray(host), device)


def _refuse_blocks(bad, rule, shown, kind):
    """ValueError naming the first block where ``bad`` holds, what it holds (``shown(index)``) and how
    many blocks are ``kind``."""
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"weight_scale must {rule}, got {shown(first)} at block {first} ({int(bad.sum())} {kind} blocks)"
        )


def _e8m0_block_scale(value, on_host, device):
    """E8M0 block scales as uint8 on ``device``; every byte but 0xFF (NaN) is a valid scale."""
    host = value if on_host else _host_values(value)
    _refuse_blocks(host == _format.E8M0_NAN, "hold finite E8M0 scales", lambda at: "0xFF (NaN)", "NaN")
    if device == "cpu":
        return np.ascontiguousarray(host)
    return value if not on_host else _to_device(np.ascontiguousarray(host), device)


def _quantize_blocks(w, block, e8m0_rounding=None):
    """(codes, scales) of a float weight [N, K] in bn x bk blocks: scale = max(amax, 1e-10) / 448 in
    float32 (finite amax), codes = encode(w / scale), a float32 division. ``e8m0_rounding`` ('rceil',
    'floor'): the scale is instead the E8M0 byte of the block's amax by that rule
    (``_format.e8m0_scale_byte``), and codes = encode(w / 2^(byte - 127))."""
    bn, bk = block
    on_host = isinstance(w, np.ndarray)
    w32 = (w if on_host else _host_values(w)).astype(np.float32)
    n, k = w32.shape
    nb, kb = -(-n // bn), -(-k // bk)
    padded = np.zeros((nb * bn, kb * bk), dtype=np.float32)
    padded[:n, :k] = np.where(np.isfinite(w32), np.abs(w32), np.float32(0))
    amax = padded.reshape(nb, bn, kb, bk).max(axis=(1, 3))
    if e8m0_rounding is not None:
        rceil = e8m0_rounding == "rceil"
        scale = np.array([_format.e8m0_scale_byte(a, rceil) for a in amax.reshape(-1)], np.uint8).reshape(amax.shape)
        divisor = decode_e8m0(scale)
    else:
        scale = divisor = (np.maximum(amax, _format.F32_GROUP_EPS) / np.float32(448.0)).astype(np.float32)
    codes = encode_e4m3((w32 / divisor.repeat(bn, axis=0).repeat(bk, axis=1)[:n, :k]).astype(np.float32))
    if not on_host:
        device = _arrays.device_of(w, "w")
        return _to_device(codes, device), _to_device(scale, device)
    return codes, scale


def _to_device(host, device):
    """A host array copied to ``device`` ('cuda:N') on the current cupy stream."""
    import cupy

    with cupy.cuda.Device(_arrays.cuda_index(device)):
        return cupy.asarray(host)


# -- resident weights and load accounting ----------------------------------------------------


@dataclass(frozen=True)
class DeviceLoadStats:
    """What ``ResidentFp8`` moved onto one device: uploads (count, bytes) and host copies released
    after upload (count, bytes of codes dropped)."""

    uploads: int = 0
    upload_bytes: int = 0
    released_host: int = 0
    released_host_bytes: int = 0


_LOCK = threading.RLock()
_STATS: dict = {}
# host Fp8Weight -> {device: ResidentFp8}; weak on the weight so the cache never keeps one alive
# (a ResidentFp8 holds no reference back to its host weight).
_RESIDENT = weakref.WeakKeyDictionary()


def _record(device, **add):
    old = _STATS.get(device, DeviceLoadStats())
    _STATS[device] = DeviceLoadStats(
        **{
            k: getattr(old, k) + add.get(k, 0)
            for k in ("uploads", "upload_bytes", "released_host", "released_host_bytes")
        }
    )


def load_stats() -> dict[str, DeviceLoadStats]:
    """{device: DeviceLoadStats} for every device something was uploaded to ('cpu', 'cuda:0', ...)."""
    with _LOCK:
        return dict(_STATS)


def reset_load_stats() -> None:
    """Zero the counters (tests and benchmarks); resident weights stay cached."""
    with _LOCK:
        _STATS.clear()


class ResidentFp8:
    """An ``Fp8Weight`` made resident on a device ('cpu', 'cuda', 'cuda:1'), uploaded once.

    ``ResidentFp8(w, device)`` a second time (any thread) returns the same object without copying:
    the cache is keyed by the weight's identity and the device. The resident copy is a snapshot owned
    by the seam (codes, float32 weight scale, bias widened to float32 -- exact, and the GEMM adds bias
    in float32 anyway); on 'cpu' its arrays are read-only. ``input_scale`` stays a host scalar (it is
    passed by value). ``release_host=True`` drops the host weight's codes after the upload (the host
    ``Fp8Weight`` then refuses to be used and names this device); both are recorded in
    ``load_stats()``.

    Attributes: ``weight`` (the ``Fp8Weight`` on the device), ``device``, ``nbytes``.
    """

    __slots__ = ("weight", "device", "nbytes")

    weight: Fp8Weight
    device: str
    nbytes: int

    def __new__(
        cls, weight: "Fp8Weight | ResidentFp8", device: str = "cpu", *, release_host: bool = False
    ) -> "ResidentFp8":
        if isinstance(weight, ResidentFp8):
            if weight.device != _arrays.parse_device(device):
                raise ValueError(
                    f"device must be {weight.device} for a ResidentFp8 already there, got {device!r}; "
                    f"make the host Fp8Weight resident on the other device instead"
                )
            return weight
        # seam.Fp8Experts (E experts in one object) is made resident the same way, by its _upload_copy
        experts = not isinstance(weight, Fp8Weight) and hasattr(type(weight), "_upload_copy")
        if not isinstance(weight, Fp8Weight) and not experts:
            raise TypeError(f"weight must be an Fp8Weight or a seam.Fp8Experts, got {type(weight).__name__}")
        dev = _arrays.parse_device(device)
        with _LOCK:
            per_device = _RESIDENT.get(weight)
            self = None if per_device is None else per_device.get(dev)
            if self is None:
                if weight.device != "cpu":
                    raise ValueError(
                        f"weight must hold host (numpy) arrays to be uploaded, got arrays on "
                        f"{weight.device}; a device Fp8Weight is used as is by matmul_fp8"
                    )
                data = weight.host_data()
                self = object.__new__(cls)
                self.device = dev
                # an Fp8Experts (seam.experts imports this module, so its type is not named here)
                self.weight = cast(Any, weight)._upload_copy(data, dev) if experts else _upload(weight, data, dev)
                self.nbytes = self.weight.nbytes
                _record(dev, uploads=1, upload_bytes=self.nbytes)
                _RESIDENT.setdefault(weight, {})[dev] = self
            if release_host and weight.data is not None:
                _record(dev, released_host=1, released_host_bytes=int(weight.data.nbytes))
                object.__setattr__(weight, "data", None)
                object.__setattr__(weight, "released_to", dev)
                if not experts:
                    object.__setattr__(weight, "host_call", None)  # it views the codes: they go too
        return self

    @property
    def shape(self) -> tuple[int, int]:
        return self.weight.shape

    @property
    def activation_scheme(self) -> ActivationScheme:
        return cast(ActivationScheme, self.weight.activation_scheme)  # resolved by Fp8Weight.__post_init__

    def __repr__(self):
        return f"ResidentFp8(shape={self.weight.shape}, device={self.device!r}, nbytes={self.nbytes})"


def _upload(weight, data, device):
    bias = None if weight.bias is None else np.asarray(weight.bias, dtype=np.float32)
    scale = weight.weight_scale
    if device == "cpu":
        parts = [
            np.array(data, order="C", copy=True),
            np.array(scale, copy=True),
            None if bias is None else np.array(bias, copy=True),
        ]
        for part in parts:
            if part is not None:
                part.flags.writeable = False
    else:
        parts = [
            _to_device(np.ascontiguousarray(data), device),
            _to_device(scale, device),
            None if bias is None else _to_device(bias, device),
        ]
    return Fp8Weight._trusted(
        parts[0],
        parts[1],
        weight.input_scale,
        parts[2],
        weight.activation_scheme,
        weight.source,
        weight.per_channel,
        weight.block_size,
        weight.scale_ue8m0,
        weight.activation_scale_format,
        weight.activation_scale_rounding,
    )
