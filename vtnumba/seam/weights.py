"""FP8 weights: ``Fp8Weight`` (codes + scales, validated once), ``ResidentFp8`` (a weight made
resident on a device, uploaded once, accounted to the byte) and the fusion of q/k/v or gate/up
shards into one weight (upstream vLLM's ``requantize_with_max_scale``).

Where this differs from the C++ seam it comes from: that seam's ``ResidentFp8`` uploaded weight bytes
without recording them and kept the host copy alive, while every sibling loader did both. Here every
upload and every released host copy is recorded in ``load_stats()``.
"""

import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _arrays
from ..ops import SCHEMES, dequantize_fp8, quant_scale, quantize_fp8

__all__ = [
    "Fp8Weight", "ResidentFp8", "DeviceLoadStats", "load_stats", "reset_load_stats",
    "requantize_with_max_scale", "fuse_fp8_shards",
]


_CUDA_KEYS = tuple(f"cuda:{i}" for i in range(64))  # formatted once: this runs on every call


def _device_key(arr, name):
    """'cpu' for a numpy array, 'cuda:N' for a GPU array (N read from the array itself). On every
    call's path: a cupy array's device id is an int on its pointer (no Device object is built)."""
    cupy_ndarray = _arrays._cupy_ndarray()
    if cupy_ndarray is not None and type(arr) is cupy_ndarray:
        idx = arr.data.device_id
    elif _arrays.device_of(arr, name) == "cpu":
        return "cpu"
    else:
        idx = _cuda_index(arr)
    return _CUDA_KEYS[idx] if idx < len(_CUDA_KEYS) else f"cuda:{idx}"


def _cuda_index(arr):
    dev = getattr(arr, "device", None)
    for attr in ("id", "index"):  # cupy.cuda.Device.id, torch.device.index
        idx = getattr(dev, attr, None)
        if isinstance(idx, int):
            return idx
    return 0  # a bare __cuda_array_interface__ object does not say; numba uses the current device


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
      ``input_scale``), 'dynamic' (per-tensor, from each input's amax) or 'per_token' (dynamic, one
      scale per row). Defaults to 'static' when ``input_scale`` is given, else 'dynamic'.
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
    device: str = field(init=False, repr=False)
    shape: tuple = field(init=False, repr=False)
    per_channel: bool = field(init=False, repr=False)
    released_to: str | None = field(init=False, default=None, repr=False)

    def __post_init__(self):
        set_ = object.__setattr__
        data = self.data
        device = _device_key(data, "data")
        data = _arrays.codes_uint8(data, "data")
        if len(data.shape) != 2:
            raise ValueError(f"data must be 2-D codes [N, K] (nn.Linear layout), got shape {tuple(data.shape)}")
        n, k = (int(d) for d in data.shape)
        if n < 1 or k < 1:
            raise ValueError(f"data must have N >= 1 rows and K >= 1 columns, got shape {(n, k)}")
        set_(self, "data", data)
        set_(self, "device", device)
        set_(self, "shape", (n, k))

        scale, per_channel = _weight_scale(self.weight_scale, n, device)
        set_(self, "weight_scale", scale)
        set_(self, "per_channel", per_channel)

        if self.input_scale is not None:
            value = self.input_scale
            if not _is_host_scalar(value):
                value = _host_values(value)
            set_(self, "input_scale", np.float32(quant_scale(value, "input_scale")))

        scheme = self.activation_scheme
        if scheme is None:
            scheme = "dynamic" if self.input_scale is None else "static"
        if scheme not in SCHEMES:
            raise ValueError(f"activation_scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
        if scheme == "static" and self.input_scale is None:
            raise ValueError("input_scale must be given for activation_scheme='static', got None")
        if scheme != "static" and self.input_scale is not None:
            raise ValueError(f"input_scale must be None for activation_scheme={scheme!r} "
                             f"(its scales come from each input), got {self.input_scale!r}")
        set_(self, "activation_scheme", scheme)

        if self.bias is not None:
            bias = self.bias
            if _device_key(bias, "bias") != device:
                raise ValueError(f"bias must be on the weight's device {device}, got {_device_key(bias, 'bias')}")
            _arrays.float_dtype(bias, "bias")
            if tuple(bias.shape) not in ((n,), (1, n)):
                raise ValueError(f"bias must have shape ({n},), got shape {tuple(bias.shape)}")
            set_(self, "bias", bias.reshape(n))

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def from_float(cls, w, input_scale=None, per_channel=False, *, activation_scheme=None, bias=None):
        """Quantize a float weight [N, K] (online quantization, as upstream does for checkpoints
        that are not FP8-serialized).

        - per-tensor (default): ``weight_scale = max(amax / 448, 1 / (448 * 512))`` and codes from
          ``vt.quantize_fp8(w)`` -- mirrors vLLM's ``Fp8LinearMethod.process_weights_after_loading``
          (``ops.scaled_fp8_quant(layer.weight, scale=None)``) for unserialized checkpoints.
        - ``per_channel=True``: one scale per output row, ``amax_row / 448`` (same floor), each row
          quantized with its own scale by ``vt.quantize_fp8(w, per_token=True)`` -- mirrors vLLM's
          ``PTPCFp8LinearMethod.process_weights_after_loading``
          (``ops.scaled_fp8_quant(weight, scale=None, use_per_token_if_dynamic=True)``), which treats
          the weight's output channels as tokens.
        The floor (upstream has none) keeps an all-zero row from getting scale 0 and NaN codes.
        """
        _arrays.float_dtype(w, "w")
        if len(w.shape) != 2:
            raise ValueError(f"w must be 2-D [N, K] (nn.Linear layout), got shape {tuple(w.shape)}")
        if per_channel:
            q = quantize_fp8(w, per_token=True)
            scale = q.scale.reshape(-1)
        else:
            q = quantize_fp8(w)
            scale = q.scale
        return cls(q.data, scale, input_scale=input_scale, bias=bias, activation_scheme=activation_scheme)

    @classmethod
    def _trusted(cls, data, weight_scale, input_scale, bias, activation_scheme, source, per_channel):
        """Build from parts already validated (a resident copy of a validated weight): no checks,
        no device synchronization."""
        self = object.__new__(cls)
        set_ = object.__setattr__
        for name, value in (("data", data), ("weight_scale", weight_scale), ("input_scale", input_scale),
                            ("bias", bias), ("activation_scheme", activation_scheme), ("source", source),
                            ("device", _device_key(data, "data")), ("shape", tuple(int(d) for d in data.shape)),
                            ("per_channel", per_channel), ("released_to", None)):
            set_(self, name, value)
        return self

    def __repr__(self):
        kind = "per-channel" if self.per_channel else "per-tensor"
        return (f"Fp8Weight(shape={self.shape}, device={self.device!r}, weight_scale={kind}, "
                f"activation_scheme={self.activation_scheme!r}, bias={self.bias is not None}"
                + (f", released_to={self.released_to!r})" if self.released_to else ")"))

    # -- views -------------------------------------------------------------------------------
    @property
    def out_features(self):
        return self.shape[0]

    @property
    def in_features(self):
        return self.shape[1]

    @property
    def nbytes(self):
        """Bytes of the arrays a resident copy holds: codes, weight scale, bias (as float32)."""
        n = self.shape[0]
        return n * self.shape[1] + 4 * int(self.weight_scale.shape[0]) + (0 if self.bias is None else 4 * n)

    def host_data(self, name="weight"):
        """The codes, or a clear error if they were released after an upload."""
        if self.data is None:
            raise ValueError(f"{name}.data must be present, got None: the host codes were released after "
                             f"upload to {self.released_to} (ResidentFp8(..., release_host=True)); "
                             f"use that ResidentFp8 instead")
        return self.data

    def dequantize(self, dtype=np.float32):
        """decode(codes) * weight_scale per row, in float32, rounded to ``dtype`` (no bias)."""
        scale = self.weight_scale.reshape(-1, 1)
        return dequantize_fp8(self.host_data(), scale, dtype)


def _weight_scale(value, n, device):
    """(float32 array of shape (1,) or (n,), per_channel) on ``device``; '> 0 and finite' checked."""
    xp_host = _is_host_scalar(value) or isinstance(value, np.ndarray)
    if not xp_host and _device_key(value, "weight_scale") != device:
        raise ValueError(f"weight_scale must be on the weight's device {device}, "
                         f"got {_device_key(value, 'weight_scale')}")
    shape = () if _is_host_scalar(value) else tuple(int(d) for d in value.shape)
    if int(np.prod(shape)) == 1 and len(shape) <= 2:
        per_channel = False
    elif shape in ((n,), (n, 1)):
        per_channel = True
    else:
        raise ValueError(f"weight_scale must be a scalar, shape (1,) (per-tensor), ({n},) or ({n}, 1) "
                         f"(per-channel), got shape {shape}")
    host = np.asarray(value if xp_host else _host_values(value))
    if host.dtype.kind != "f" and host.dtype != _arrays.BFLOAT16:
        if _is_host_scalar(value):
            host = host.astype(np.float64)
        else:
            raise TypeError(f"weight_scale must be a float array, got dtype {host.dtype}")
    host32 = host.astype(np.float32).reshape(-1)
    bad = ~(np.isfinite(host32) & (host32 > 0))
    if bad.any():
        raise ValueError(f"weight_scale must be positive and finite, got {host32[bad][:4].tolist()} "
                         f"at {np.flatnonzero(bad)[:4].tolist()}")
    if device == "cpu":
        return host32, per_channel
    if not xp_host and np.dtype(value.dtype) == np.float32:
        return value.reshape(-1), per_channel
    return _to_device(host32, device), per_channel


def _to_device(host, device):
    """A host array copied to ``device`` ('cuda:N') on the current cupy stream."""
    import cupy
    with cupy.cuda.Device(int(device.split(":")[1])):
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
    _STATS[device] = DeviceLoadStats(**{k: getattr(old, k) + add.get(k, 0) for k in
                                        ("uploads", "upload_bytes", "released_host", "released_host_bytes")})


def load_stats():
    """{device: DeviceLoadStats} for every device something was uploaded to ('cpu', 'cuda:0', ...)."""
    with _LOCK:
        return dict(_STATS)


def reset_load_stats():
    """Zero the counters (tests and benchmarks); resident weights stay cached."""
    with _LOCK:
        _STATS.clear()


_DEVICE_RE = re.compile(r"cuda(?::(\d+))?")


def normalize_device(device):
    """'cpu' or 'cuda:N' ('cuda' means cupy's current device)."""
    if device == "cpu":
        return "cpu"
    m = _DEVICE_RE.fullmatch(device) if isinstance(device, str) else None
    if m is None:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, or a CUDA install without a usable driver
        raise RuntimeError(f"device {device!r} needs cupy and a CUDA GPU, got {exc.__class__.__name__}: {exc}") from None
    idx = int(m.group(1)) if m.group(1) is not None else cupy.cuda.runtime.getDevice()
    if idx >= count:
        raise ValueError(f"device must name one of the {count} CUDA devices (cuda:0..cuda:{count - 1}), got {device!r}")
    return f"cuda:{idx}"


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

    def __new__(cls, weight, device="cpu", *, release_host=False):
        if isinstance(weight, ResidentFp8):
            if weight.device != normalize_device(device):
                raise ValueError(f"device must be {weight.device} for a ResidentFp8 already there, got {device!r}; "
                                 f"make the host Fp8Weight resident on the other device instead")
            return weight
        if not isinstance(weight, Fp8Weight):
            raise TypeError(f"weight must be an Fp8Weight, got {type(weight).__name__}")
        dev = normalize_device(device)
        with _LOCK:
            per_device = _RESIDENT.get(weight)
            self = None if per_device is None else per_device.get(dev)
            if self is None:
                if weight.device != "cpu":
                    raise ValueError(f"weight must hold host (numpy) arrays to be uploaded, got arrays on "
                                     f"{weight.device}; a device Fp8Weight is used as is by matmul_fp8")
                data = weight.host_data()
                self = object.__new__(cls)
                self.device = dev
                self.weight = _upload(weight, data, dev)
                self.nbytes = self.weight.nbytes
                _record(dev, uploads=1, upload_bytes=self.nbytes)
                _RESIDENT.setdefault(weight, {})[dev] = self
            if release_host and weight.data is not None:
                _record(dev, released_host=1, released_host_bytes=int(weight.data.nbytes))
                object.__setattr__(weight, "data", None)
                object.__setattr__(weight, "released_to", dev)
        return self

    @property
    def shape(self):
        return self.weight.shape

    @property
    def activation_scheme(self):
        return self.weight.activation_scheme

    def __repr__(self):
        return f"ResidentFp8(shape={self.weight.shape}, device={self.device!r}, nbytes={self.nbytes})"


def _upload(weight, data, device):
    bias = None if weight.bias is None else np.asarray(weight.bias, dtype=np.float32)
    scale = weight.weight_scale
    if device == "cpu":
        parts = [np.array(data, order="C", copy=True), np.array(scale, copy=True),
                 None if bias is None else np.array(bias, copy=True)]
        for part in parts:
            if part is not None:
                part.flags.writeable = False
    else:
        import cupy
        with cupy.cuda.Device(int(device.split(":")[1])):
            parts = [cupy.asarray(np.ascontiguousarray(data)), cupy.asarray(scale),
                     None if bias is None else cupy.asarray(bias)]
    return Fp8Weight._trusted(parts[0], parts[1], weight.input_scale, parts[2], weight.activation_scheme,
                              weight.source, weight.per_channel)


# -- fused shards (q/k/v, gate/up) -----------------------------------------------------------

def requantize_with_max_scale(codes, weight_scales, logical_widths):
    """Requantize stacked shards [sum(widths), K] that each have their own per-tensor scale to the
    largest of those scales; returns ``(max_scale float32, new codes)``.

    Mirrors vLLM's ``w8a8_utils.requantize_with_max_scale``: each shard is dequantized with its own
    scale and quantized statically with the max scale. Deviations, on purpose: upstream dequantizes
    to float16 first (``per_tensor_dequantize``), which rounds the value a second time; here the
    dequantized value is float32 (decode is exact, one float32 product), so only the final e4m3
    rounding remains. The input is not modified (upstream writes in place). Upstream's "unfused
    checkpoint" sentinel (scales left at finfo.min) does not arise: every shard's scale is given.
    """
    codes = _arrays.codes_uint8(codes, "codes")
    if not isinstance(codes, np.ndarray) or codes.ndim != 2:
        raise ValueError(f"codes must be a 2-D numpy array [sum(logical_widths), K], got "
                         f"{type(codes).__name__} of shape {tuple(getattr(codes, 'shape', ()))}")
    widths = [int(w) for w in logical_widths]
    scales = np.asarray(weight_scales, dtype=np.float32).reshape(-1)
    if len(widths) < 1 or min(widths) < 1:
        raise ValueError(f"logical_widths must be positive shard heights, got {list(logical_widths)}")
    if scales.size != len(widths):
        raise ValueError(f"weight_scales must have one scale per shard ({len(widths)}), got {scales.size}")
    if sum(widths) != codes.shape[0]:
        raise ValueError(f"logical_widths must sum to the {codes.shape[0]} rows of codes, got {widths} (sum {sum(widths)})")
    bad = ~(np.isfinite(scales) & (scales > 0))
    if bad.any():
        raise ValueError(f"weight_scales must be positive and finite, got {scales.tolist()}")
    max_scale = np.float32(scales.max())
    out = np.empty_like(codes)
    start = 0
    for width, scale in zip(widths, scales):
        rows = slice(start, start + width)
        out[rows] = quantize_fp8(dequantize_fp8(codes[rows], scale), max_scale).data
        start += width
    return max_scale, out


def fuse_fp8_shards(shards):
    """One ``Fp8Weight`` from shards stacked along N (q, k, v or gate, up), as upstream's fused
    QKV / gate-up layers load them.

    - all shards per-tensor: requantized to the max scale (``requantize_with_max_scale``), so the
      fused weight keeps one per-tensor scale (what the per-tensor GEMM needs);
    - any shard per-channel: scales are expanded channel-wise and concatenated, codes unchanged
      (upstream's ``convert_to_channelwise``; exact);
    - static input scales: the max of the shards' (upstream: ``layer.input_scale.max()`` in
      ``process_weights_after_loading``), saturation-safe for every shard;
    - bias: concatenated when every shard has one (float32).
    """
    shards = list(shards)
    if not shards or not all(isinstance(s, Fp8Weight) for s in shards):
        raise TypeError(f"shards must be a non-empty sequence of Fp8Weight, got {[type(s).__name__ for s in shards]}")
    for i, s in enumerate(shards):
        if s.device != "cpu":
            raise ValueError(f"shards[{i}] must hold host (numpy) arrays, got arrays on {s.device}")
        s.host_data(f"shards[{i}]")
    k = shards[0].shape[1]
    for i, s in enumerate(shards):
        if s.shape[1] != k:
            raise ValueError(f"shards[{i}] must have K = {k} columns like shards[0], got shape {s.shape}")
    schemes = {s.activation_scheme for s in shards}
    if len(schemes) != 1:
        raise ValueError(f"shards must share one activation_scheme, got {sorted(schemes)}")
    with_bias = [s.bias is not None for s in shards]
    if any(with_bias) and not all(with_bias):
        raise ValueError(f"shards must all have a bias or none, got bias on shards {[i for i, b in enumerate(with_bias) if b]}")
    widths = [s.shape[0] for s in shards]
    if any(s.per_channel for s in shards):
        data = np.concatenate([s.data for s in shards], axis=0)
        scale = np.concatenate([np.broadcast_to(s.weight_scale, (s.shape[0],)) for s in shards])
    else:
        scale, data = requantize_with_max_scale(np.concatenate([s.data for s in shards], axis=0),
                                                [s.weight_scale[0] for s in shards], widths)
    input_scale = None
    if schemes == {"static"}:
        input_scale = max(np.float32(s.input_scale) for s in shards)
    bias = np.concatenate([np.asarray(s.bias, dtype=np.float32) for s in shards]) if all(with_bias) else None
    return Fp8Weight(data, scale, input_scale=input_scale, bias=bias, activation_scheme=schemes.pop(),
                     source={"fused_from": [s.source for s in shards], "logical_widths": widths})
