"""Mixture-of-experts in FP8: ``Fp8Experts`` (E experts' weights in one object), the grouped GEMM
``grouped_matmul_fp8`` and the whole MoE layer ``moe_fp8``.

What a MoE layer computes here (docs/DESIGN.md, "Mixture of experts"):

1. **Align** (vLLM's ``moe_align_block_size``, without the block padding): the routed (token, slot)
   pairs sorted by expert. ``offsets`` int32 [E + 1] says which sorted rows are whose; an id outside
   [0, E) -- vLLM's -1 padding, transformers' sentinel E, an expert another rank holds -- routes
   nothing.
2. **Quantize the routed rows** by the experts' activation scheme. Dynamic per-tensor takes one
   scale over the whole input (vLLM's fused_moe quantizes hidden_states once, before the
   permutation); per-token, per-group and MXFP8 scales are row-local, so each token is quantized
   once and its codes gathered; static scales are per expert ([E], as ModelOpt and
   compressed-tensors store ``input_scale``), so each row is quantized by its expert's scale.
3. **gate_up grouped GEMM** into float32 [P, 2I] (gate rows first, then up, as transformers'
   ``gate_up_proj`` stores them).
4. **SiLU-and-multiply** in float32 (vLLM's ``silu_and_mul``), quantized by the down experts'
   scheme (the GPU does both in one kernel).
5. **down grouped GEMM** into float32 [P, H].
6. **Combine**: each token's k outputs weighted by ``topk_weights`` and summed in float32, slot
   order, rounded once to x's dtype.

At decode on the GPU (a few routed pairs, static, per-token or 128 x 128 block scales) the steps are
two launches instead (docs/DESIGN.md, "MoE decode: two launches"): gate_up with the quantization of
x and SiLU-and-multiply fused in, down with the quantization of act and the combine fused in;
``MoeCall(...).routed_reason`` says why a call takes the six steps above.

Every step is a function of the device's backend (``vtnumba.cpu.experts``, ``vtnumba.cuda.experts``),
called with arrays already checked here. On the GPU nothing synchronizes with the host: the row
counts stay on the device, and a whole ``moe_fp8`` call can be captured into a CUDA graph.
"""

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _arrays
from .._arrays import Array, DType, Scale
from .._interop import interop
from ..ops import ActivationScheme, quantize_fp8
from . import bound
from ._finite import refuse_nonfinite
from .fp8_format import Fp8Format
from .weights import Fp8Weight, ResidentFp8, _host_values, _is_host_scalar, _to_device

__all__ = ["Fp8Experts", "grouped_matmul_fp8", "moe_fp8", "MoeCall", "moe_debug_checks"]


def moe_debug_checks() -> bool:
    """Whether GPU calls check ``topk_ids`` and device ``offsets`` on the host (env VT_MOE_CHECKS=1).

    Off by default: the check copies the ids back, a synchronization that decode and CUDA graphs
    cannot afford. Without it an id outside [0, E) routes nothing (the pair adds zero to its
    token), the same as the sentinels -1 and E, so a bad id never reads out of bounds; offsets that
    decrease or overrun the rows give rows no expert (left 0) or an expert's rows cut short."""
    return os.environ.get("VT_MOE_CHECKS", "0").startswith("1")


def _backend(device):
    if device == "cpu":
        from ..cpu import experts
    else:
        from ..cuda import experts
    return experts


@dataclass(frozen=True, eq=False)
class Fp8Experts:
    """E experts' FP8 weights in one object, each in nn.Linear's layout.

    - ``data``: e4m3 codes [E, N, K] (uint8, or ml_dtypes.float8_e4m3fn viewed as uint8), numpy or
      cupy.
    - ``weight_scale``, per expert, in any scheme ``Fp8Weight`` has: per-tensor [E] (or [E, 1]),
      per-channel [E, N] (or [E, N, 1]), or with ``block_size`` (bn, bk) block scales
      [E, ceil(N / bn), ceil(K / bk)]: float32 (bfloat16 / float16 widen exactly) or uint8 E8M0
      bytes (``(1, 32)``: MXFP8; ``(128, 128)``: DeepSeek-V3's UE8M0).
    - ``input_scale``: static activation scales, one number for every expert or [E]; stored as host
      float32 [E].
    - ``activation_scheme``, ``scale_ue8m0``, ``activation_scale_format``,
      ``activation_scale_rounding``: as ``Fp8Weight`` takes them, one value for all experts.

    Expert e is ``experts.expert(e)``, an ``Fp8Weight`` view; ``ResidentFp8(experts, device)``
    uploads the whole object once and accounts its bytes in ``seam.load_stats()``. Equality and
    hashing are by identity, as for ``Fp8Weight``.
    """

    data: Any
    weight_scale: Any
    input_scale: Any = None
    activation_scheme: str | None = None
    source: Any = field(default=None, repr=False)
    block_size: tuple[int, int] | None = None
    scale_ue8m0: bool = False
    activation_scale_format: str | None = None
    activation_scale_rounding: str | None = None
    device: str = field(init=False, repr=False)
    shape: tuple[int, int, int] = field(init=False, repr=False)
    per_channel: bool = field(init=False, repr=False)
    released_to: str | None = field(init=False, default=None, repr=False)
    # the grouped calls bound for these experts (vtnumba.cuda.experts), by input signature
    bound_calls: dict | None = field(init=False, default=None, repr=False)
    # how every expert is quantized (seam.Fp8Format), expert 0's as its Fp8Weight view settled it
    format: Fp8Format = field(init=False, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        device = _arrays.device_of(self.data, "data")
        data = _arrays.codes_uint8(self.data, "data")
        if len(data.shape) != 3:
            raise ValueError(
                f"data must be 3-D codes [E, N, K] (one nn.Linear weight per expert), got shape {tuple(data.shape)}"
            )
        e, n, k = (int(d) for d in data.shape)
        if e < 1 or n < 1 or k < 1:
            raise ValueError(f"data must have E >= 1 experts of N >= 1 rows and K >= 1 columns, got shape {(e, n, k)}")
        scale = self.weight_scale
        if _is_host_scalar(scale) or not hasattr(scale, "shape"):
            raise ValueError(
                f"weight_scale must be an array with one scale (or one set of scales) per expert, "
                f"leading dimension E = {e}, got {type(scale).__name__}"
            )
        shape = tuple(int(d) for d in scale.shape)
        if self.block_size is None and shape[-1:] == (1,) and len(shape) in (2, 3):
            scale = scale.reshape(shape[:-1])
            shape = shape[:-1]
        if not shape or shape[0] != e:
            raise ValueError(
                f"weight_scale must have leading dimension E = {e} (one entry per expert), got shape {shape}"
            )
        if self.block_size is None and shape not in ((e,), (e, n)):
            raise ValueError(
                f"weight_scale must be [E] = ({e},) (per-tensor) or [E, N] = ({e}, {n}) (per-channel), "
                f"got shape {shape}"
            )
        input_scale = self.input_scale
        if input_scale is not None:
            host = np.asarray(input_scale if _is_host_scalar(input_scale) else _host_values(input_scale))
            host = host.astype(np.float32).reshape(-1)
            if host.size == 1:
                host = np.repeat(host, e)
            if host.size != e:
                raise ValueError(
                    f"input_scale must be one number or [E] = ({e},) static scales, got shape "
                    f"{tuple(np.shape(input_scale))}"
                )
            bad = ~(np.isfinite(host) & (host > 0))
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"input_scale must be positive and finite for every expert, got {host[first]!r} for expert {first}"
                )
            input_scale = host
        # Expert 0 as an Fp8Weight settles the activation scheme and formats with Fp8Weight's own
        # checks and words; every expert's scales are then checked the way that weight's were.
        probe = Fp8Weight(
            data[0],
            scale[0:1] if len(shape) == 1 else scale[0],
            input_scale=None if input_scale is None else float(input_scale[0]),
            activation_scheme=self.activation_scheme,
            block_size=self.block_size,
            scale_ue8m0=self.scale_ue8m0,
            activation_scale_format=self.activation_scale_format,
            activation_scale_rounding=self.activation_scale_rounding,
        )
        checked = _checked_scales(scale, probe, device, e)
        set_(self, "data", data)
        set_(self, "device", device)
        set_(self, "shape", (e, n, k))
        set_(self, "weight_scale", checked)
        set_(self, "input_scale", input_scale)
        set_(self, "per_channel", probe.per_channel)
        for name in (
            "activation_scheme",
            "block_size",
            "scale_ue8m0",
            "activation_scale_format",
            "activation_scale_rounding",
            "format",
        ):
            set_(self, name, getattr(probe, name))

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
        block_size: tuple[int, int] | None = None,
        scale_ue8m0: bool = False,
        scale_format: str = "float32",
        scale_rounding: str | None = None,
        allow_nonfinite: bool = False,
    ) -> "Fp8Experts":
        """Quantize float expert weights [E, N, K], each expert exactly as ``Fp8Weight.from_float``
        quantizes ``w[e]`` with the same keywords (so expert e's codes and scales are that
        weight's). ``input_scale``: one number or [E]. A NaN or Inf in ``w`` is refused, naming its
        index [e, n, k], unless ``allow_nonfinite=True`` (``Fp8Weight.from_float``'s rule)."""
        _arrays.float_dtype(w, "w")
        if len(w.shape) != 3:
            raise ValueError(f"w must be 3-D [E, N, K] (one nn.Linear weight per expert), got shape {tuple(w.shape)}")
        refuse_nonfinite(w, "w", allow_nonfinite)
        e = int(w.shape[0])
        scales_in = None
        if input_scale is not None:
            host = np.asarray(
                input_scale if _is_host_scalar(input_scale) else _host_values(input_scale), dtype=np.float64
            ).reshape(-1)
            if host.size not in (1, e):
                raise ValueError(
                    f"input_scale must be one number or [E] = ({e},) static scales, got shape "
                    f"{tuple(np.shape(input_scale))}"
                )
            scales_in = np.broadcast_to(host, (e,))
        weights = [
            Fp8Weight.from_float(
                w[i],
                None if scales_in is None else float(scales_in[i]),
                per_channel,
                activation_scheme=activation_scheme,
                block_size=block_size,
                scale_ue8m0=scale_ue8m0,
                scale_format=scale_format,
                scale_rounding=scale_rounding,
                allow_nonfinite=True,  # checked above, with the expert's index
            )
            for i in range(e)
        ]
        return cls.stack(weights)

    @classmethod
    def stack(cls, weights: "list[Fp8Weight]", source: Any = None) -> "Fp8Experts":
        """E expert weights (``Fp8Weight``s of one shape, scheme and device) as one ``Fp8Experts``;
        a weight that differs from the first is named."""
        if not weights:
            raise ValueError("weights must hold at least one expert's Fp8Weight, got none")
        first = weights[0]
        keys = (
            "shape",
            "activation_scheme",
            "block_size",
            "scale_ue8m0",
            "activation_scale_format",
            "activation_scale_rounding",
            "per_channel",
            "device",
            "scale_format",
        )
        for i, w in enumerate(weights):
            if not isinstance(w, Fp8Weight):
                raise TypeError(f"weights[{i}] must be an Fp8Weight, got {type(w).__name__}")
            for key in keys:
                if getattr(w, key) != getattr(first, key):
                    raise ValueError(
                        f"weights[{i}].{key} must be {getattr(first, key)!r} like expert 0's (one "
                        f"scheme for all experts), got {getattr(w, key)!r}"
                    )
            if w.bias is not None:
                raise ValueError(f"weights[{i}].bias must be None: experts take no bias here, got a bias")
        xp = _arrays.array_module(first.data)
        data = xp.stack([w.host_data(f"weights[{i}]") for i, w in enumerate(weights)])
        scale = xp.stack([w.weight_scale for w in weights])
        if first.block_size is None and not first.per_channel:
            scale = scale.reshape(-1)
        input_scale = None
        if first.input_scale is not None:
            input_scale = np.array([w.input_scale for w in weights], dtype=np.float32)
        return cls(
            data,
            scale,
            input_scale=input_scale,
            activation_scheme=first.activation_scheme,
            source=source,
            block_size=first.block_size,
            scale_ue8m0=first.scale_ue8m0,
            activation_scale_format=first.activation_scale_format,
            activation_scale_rounding=first.activation_scale_rounding,
        )

    # -- views -------------------------------------------------------------------------------
    @property
    def num_experts(self) -> int:
        return self.shape[0]

    @property
    def out_features(self) -> int:
        return self.shape[1]

    @property
    def in_features(self) -> int:
        return self.shape[2]

    @property
    def scale_format(self) -> str:
        """'e8m0' when ``weight_scale`` holds E8M0 bytes (uint8), else 'float32'."""
        return "e8m0" if _arrays.dtype_of(self.weight_scale) == np.uint8 else "float32"

    @property
    def nbytes(self) -> int:
        """Bytes a resident copy holds: codes and weight scales."""
        return int(self.data.nbytes) + int(self.weight_scale.nbytes)

    def expert(self, e: int) -> Fp8Weight:
        """Expert ``e`` as an ``Fp8Weight`` (views of this object's arrays, no copy)."""
        if not 0 <= int(e) < self.shape[0]:
            raise ValueError(f"e must be in [0, {self.shape[0]}), got {e!r}")
        e = int(e)
        scale = self.weight_scale[e : e + 1] if self.weight_scale.ndim == 1 else self.weight_scale[e]
        return Fp8Weight._trusted(
            self.data[e],
            scale,
            None if self.input_scale is None else self.input_scale[e],
            None,
            self.activation_scheme,
            self.source,
            self.per_channel,
            self.block_size,
            self.scale_ue8m0,
            self.activation_scale_format,
            self.activation_scale_rounding,
        )

    def dequantize(self, dtype: DType = np.float32) -> Array:
        """decode(codes) * scale, expert by expert: [E, N, K] in ``dtype``."""
        xp = _arrays.array_module(self.data)
        return xp.stack([self.expert(e).dequantize(dtype) for e in range(self.shape[0])])

    def host_data(self, name: str = "experts") -> Array:
        """The codes, or a clear error if they were released after an upload."""
        if self.data is None:
            raise ValueError(
                f"{name}.data must be present, got None: the host codes were released after upload "
                f"to {self.released_to} (ResidentFp8(..., release_host=True)); use that ResidentFp8"
            )
        return self.data

    def _upload_copy(self, data, device):
        """The resident copy on ``device`` (``ResidentFp8``): codes and scales copied, read-only on
        the CPU."""
        if device == "cpu":
            parts = [np.array(data, order="C", copy=True), np.array(self.weight_scale, copy=True)]
            for part in parts:
                part.flags.writeable = False
        else:
            parts = [_to_device(np.ascontiguousarray(data), device), _to_device(self.weight_scale, device)]
        copy = object.__new__(type(self))
        set_ = object.__setattr__
        for name in (
            "input_scale",
            "activation_scheme",
            "source",
            "block_size",
            "scale_ue8m0",
            "activation_scale_format",
            "activation_scale_rounding",
            "shape",
            "per_channel",
            "format",
        ):
            set_(copy, name, getattr(self, name))
        set_(copy, "data", parts[0])
        set_(copy, "weight_scale", parts[1])
        set_(copy, "device", device)
        set_(copy, "bound_calls", None)
        set_(copy, "released_to", None)
        return copy

    def __repr__(self):
        kind = (
            f"block {self.block_size}" + (" e8m0" if self.scale_format == "e8m0" else "")
            if self.block_size is not None
            else "per-channel"
            if self.per_channel
            else "per-tensor"
        )
        return (
            f"Fp8Experts(shape={self.shape}, device={self.device!r}, weight_scale={kind}, "
            f"activation_scheme={self.activation_scheme!r})"
        )


def _checked_scales(scale, probe, device, e):
    """The weight scales of every expert, checked as ``probe`` (expert 0's Fp8Weight) was: float32
    positive and finite, or E8M0 bytes other than 0xFF; on ``device``. The first bad expert is named."""
    if _arrays.device_of(scale, "weight_scale") != device and not isinstance(scale, np.ndarray):
        raise ValueError(
            f"weight_scale must be on the data's device {device}, got {_arrays.device_of(scale, 'weight_scale')}"
        )
    dt = _arrays.dtype_of(scale)
    host = np.asarray(scale if isinstance(scale, np.ndarray) else _host_values(scale))
    if probe.scale_format == "e8m0":
        host = _arrays.e8m0_bytes(host, "weight_scale")
        bad = host == 0xFF
        rule = "hold finite E8M0 scales (0xFF is NaN)"
    else:
        if dt.kind != "f" and dt != _arrays.BFLOAT16:
            raise TypeError(f"weight_scale must be a float array or uint8 E8M0 bytes, got dtype {dt}")
        host = host.astype(np.float32)
        bad = ~(np.isfinite(host) & (host > 0))
        rule = "be positive and finite"
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"weight_scale must {rule} for every expert, got {host[at]!r} at {at} (expert {at[0]}, "
            f"{int(bad.sum())} bad entries)"
        )
    host = np.ascontiguousarray(host)
    if device == "cpu":
        return host
    if not isinstance(scale, np.ndarray) and _arrays.dtype_of(scale) == host.dtype:
        return scale
    return _to_device(host, device)


# -- on which device, and checks ---------------------------------------------------------------


def _experts_for(experts, x, name):
    """The ``Fp8Experts`` whose arrays live where ``x`` does (a host object is made resident on x's
    GPU once, as ``matmul_fp8`` does for a weight)."""
    if isinstance(experts, ResidentFp8):
        ex = experts.weight
    else:
        ex = experts
    if not isinstance(ex, Fp8Experts):
        raise TypeError(f"{name} must be a seam.Fp8Experts or a ResidentFp8 of one, got {type(ex).__name__}")
    x_device = "cpu" if isinstance(x, np.ndarray) else _arrays.device_of(x, "x")
    if ex.device == x_device:
        return ex
    if ex is experts and ex.device == "cpu":
        return ResidentFp8(ex, x_device).weight
    raise ValueError(f"{name} must be on x's device {x_device}, got experts on {ex.device}")


def _host_ints(value, name):
    """A small integer array's values on the host, or a TypeError naming it."""
    host = np.asarray(value if isinstance(value, (list, tuple, np.ndarray)) else _host_values(value))
    if host.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {host.dtype}")
    return host


def _offsets_array(offsets, e, m, device):
    """``offsets`` as int32 [E + 1] on ``device``; checked where it is on the host (or with
    ``moe_debug_checks()``)."""
    on_host = isinstance(offsets, (list, tuple, np.ndarray))
    if on_host or device == "cpu" or moe_debug_checks():
        host = _host_ints(offsets, "offsets")
        if host.shape != (e + 1,):
            raise ValueError(f"offsets must be [E + 1] = ({e + 1},) row offsets, got shape {host.shape}")
        steps = np.diff(host.astype(np.int64))
        if host[0] != 0 or (steps < 0).any() or host[-1] != m:
            where = int(np.flatnonzero(steps < 0)[0]) if (steps < 0).any() else None
            what = (
                f"offsets[{where + 1}] = {int(host[where + 1])} < offsets[{where}] = {int(host[where])}"
                if where is not None
                else f"offsets[0] = {int(host[0])}, offsets[{e}] = {int(host[-1])}"
            )
            raise ValueError(f"offsets must start at 0, never decrease and end at M = {m} (the rows of x), got {what}")
        host = host.astype(np.int32)
        if device == "cpu":
            return host
        if on_host:
            return _to_device(host, device)
    if tuple(offsets.shape) != (e + 1,):
        raise ValueError(f"offsets must be [E + 1] = ({e + 1},) row offsets, got shape {tuple(offsets.shape)}")
    if _arrays.dtype_of(offsets).kind not in "iu":
        raise TypeError(f"offsets must be an integer array, got dtype {_arrays.dtype_of(offsets)}")
    return offsets if _arrays.dtype_of(offsets) == np.int32 else offsets.astype(np.int32)


def _float_rows(x, name, layout="[M, K]"):
    """x, checked: a float array of two dimensions, ``layout`` naming them as the caller's docs do."""
    _arrays.float_dtype(x, name)
    if len(x.shape) != 2:
        raise ValueError(
            f"{name} must be 2-D {layout}, got shape {tuple(x.shape)}; flatten the leading dimensions "
            f"first ({name}.reshape(-1, {name}.shape[-1]))"
        )
    return x


# -- quantizing routed rows ----------------------------------------------------------------------


def _quantize_rows(x, ex, offsets, backend):
    """(codes [M, K], scale) of rows x [M, K] already in expert order, quantized by ``ex``'s
    activation scheme: scale float32 [1] (dynamic), [M] (per-token, static per expert), [M, KB]
    row-major group scales (float32, or E8M0 bytes)."""
    scheme = ex.activation_scheme
    if scheme == ActivationScheme.STATIC:
        return backend.quantize_rows_static(x, offsets, ex.input_scale)
    q = _quantize_tokens(x, ex)
    return q.data, q.scale


def _quantize_tokens(x, ex):
    """``vt.quantize_fp8`` of token rows by a row-local or global scheme (not static)."""
    scheme = ex.activation_scheme
    if scheme == ActivationScheme.DYNAMIC:
        return quantize_fp8(x)
    if scheme == ActivationScheme.PER_TOKEN:
        return quantize_fp8(x, per_token=True)
    return quantize_fp8(
        x,
        group_size=ex.block_size[1],
        scale_ue8m0=ex.scale_ue8m0,
        column_major_scales=False,
        scale_format=ex.activation_scale_format,
        scale_rounding=ex.activation_scale_rounding,
    )


def _row_scale(scale, ex):
    """A per-token scale [M, 1] as [M]; every other scale as it is (a per-group scale [M, 1], one
    group spanning K, stays 2-D: the scheme says which it is, not the shape)."""
    if ex.activation_scheme == ActivationScheme.PER_TOKEN and scale.ndim == 2:
        return scale.reshape(-1)
    return scale


# -- the grouped GEMM ------------------------------------------------------------------------------


@interop
def grouped_matmul_fp8(
    x: Array, experts: "Fp8Experts | ResidentFp8", offsets: Array, out_dtype: DType | None = None
) -> Array:
    """``y[offsets[e]:offsets[e + 1]] = matmul_fp8(x[offsets[e]:offsets[e + 1]], experts.expert(e))``
    for every expert, in one call: x [M, K] (float32, float16 or bfloat16; rows sorted by expert),
    ``offsets`` int [E + 1] (0 first, never decreasing, M last; empty experts allowed). The rows are
    quantized by the experts' scheme (dynamic per-tensor: one scale over all of x; static: each
    expert's rows by its own ``input_scale``). Returns [M, N] in ``out_dtype`` (default x's dtype).

    On the GPU a device ``offsets`` is read on the device only (checked on the host under
    ``moe_debug_checks()``); a host one is checked, then uploaded."""
    x = _float_rows(x, "x")
    ex = _experts_for(experts, x, "experts")
    e, n, k = ex.shape
    m = int(x.shape[0])
    if int(x.shape[1]) != k:
        raise ValueError(
            f"x must be [M, K] with K = {k} (the experts are [E, N, K] = {ex.shape}), got shape {tuple(x.shape)}"
        )
    device = "cpu" if isinstance(x, np.ndarray) else _arrays.device_of(x, "x")
    offs = _offsets_array(offsets, e, m, device)
    out_dt = _arrays.out_dtype_of(x.dtype if out_dtype is None else out_dtype)
    xp = _arrays.array_module(x)
    if m == 0:
        return xp.zeros((0, n), dtype=out_dt)
    backend = _backend(device)
    codes, scale = _quantize_rows(x, ex, offs, backend)
    return backend.grouped_scaled_mm(
        codes, _row_scale(scale, ex), ex.data, ex.weight_scale, offs, out_dt, ex.block_size
    )


# -- the MoE layer --------------------------------------------------------------------------------


def _pair_shapes(gate_up, down):
    """Whether shapes gate_up [E, 2I, H] and down [E, H, I] make a pair."""
    return down[0] == gate_up[0] and gate_up[1] % 2 == 0 and down[1] == gate_up[2] and down[2] == gate_up[1] // 2


def _check_pair(gate_up, down):
    """gate_up [E, 2I, H] and down [E, H, I]: one scheme, agreeing shapes (a swapped pair named as
    such, before anything is blamed on x)."""
    e, two_i, h = gate_up.shape
    if not _pair_shapes(gate_up.shape, down.shape) and _pair_shapes(down.shape, gate_up.shape):
        raise ValueError(
            f"gate_up must be [E, 2I, H] and down [E, H, I], got gate_up {gate_up.shape} and down "
            f"{down.shape}: they are swapped (down has the 2I = {down.shape[1]} rows); pass "
            f"moe_fp8(x, gate_up, down, ...) in that order"
        )
    if down.shape[0] != e:
        raise ValueError(f"down must hold E = {e} experts like gate_up, got {down.shape[0]} (down is {down.shape})")
    if two_i % 2:
        raise ValueError(
            f"gate_up must have an even N = 2I (gate rows, then up rows), got N = {two_i} (gate_up is {gate_up.shape})"
        )
    if down.shape[1] != h or down.shape[2] != two_i // 2:
        raise ValueError(
            f"down must be [E, H, I] = ({e}, {h}, {two_i // 2}) for gate_up {gate_up.shape}, got {down.shape}"
        )
    for key in ("activation_scheme", "block_size", "scale_format", "activation_scale_format", "scale_ue8m0"):
        if getattr(gate_up, key) != getattr(down, key):
            raise ValueError(
                f"down.{key} must be gate_up's {getattr(gate_up, key)!r} (experts with mixed schemes "
                f"are not one layer), got {getattr(down, key)!r}"
            )


def _check_routing(topk_ids, topk_weights, t, e, device):
    for name, value in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if not hasattr(value, "shape"):
            raise TypeError(
                f"{name} must be an array [T, k] (numpy on the CPU, cupy or torch on a GPU), got "
                f"{type(value).__name__}; pass np.asarray({name})"
            )
    if len(topk_ids.shape) != 2 or int(topk_ids.shape[0]) != t:
        raise ValueError(f"topk_ids must be [T, k] with T = {t} (the rows of x), got shape {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(
            f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, got {tuple(topk_weights.shape)}"
        )
    if _arrays.dtype_of(topk_ids).kind not in "iu":
        raise TypeError(f"topk_ids must be an integer array, got dtype {_arrays.dtype_of(topk_ids)}")
    _arrays.float_dtype(topk_weights, "topk_weights")
    if device == "cpu" or moe_debug_checks():
        ids = _host_ints(topk_ids, "topk_ids")
        bad = (ids < -1) | (ids > e)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"topk_ids must be in [-1, {e}] (an expert, or -1 / {e} for none), got {int(ids[at])} at "
                f"{at} ({int(bad.sum())} such ids)"
            )
        # checked where the ids are (on the GPU only under VT_MOE_CHECKS=1: the copy is a sync):
        # a NaN or Inf weight makes its token's output NaN without a word
        weights = np.asarray(topk_weights if isinstance(topk_weights, np.ndarray) else _host_values(topk_weights))
        finite = np.isfinite(weights.astype(np.float32))
        if not finite.all():
            at = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise ValueError(
                f"topk_weights must be finite, got {float(weights[at])} at {at} "
                f"({int((~finite).sum())} such weights); check the router's output (softmax of "
                f"non-finite logits) before moe_fp8"
            )


@interop
def moe_fp8(
    x: Array,
    gate_up: "Fp8Experts | ResidentFp8",
    down: "Fp8Experts | ResidentFp8",
    topk_ids: Array,
    topk_weights: Array,
    activation: str = "silu",
) -> Array:
    """The whole FP8 mixture-of-experts layer (module docstring): x [T, H] (float32, float16 or
    bfloat16), ``gate_up`` experts [E, 2I, H] (gate rows, then up rows), ``down`` experts [E, H, I],
    ``topk_ids`` int [T, k] (ids -1 and E route nothing) and ``topk_weights`` [T, k]. Returns
    [T, H] in x's dtype: ``sum_j topk_weights[t, j] * down_e(silu(gate_e x) * up_e x)`` with
    e = topk_ids[t, j], in FP8 W8A8 with float32 accumulation and a float32 combine.

    On the GPU a call whose signature (shapes and dtypes of x and the routing, the two experts, the
    device and lever settings) was seen before replays the call bound at its first occurrence
    (``vtnumba.cuda.bound.BoundMoe``): the same launches, bitwise the same result, a fraction of
    the host time. A prefill-sized call that runs ``per_expert`` is never bound (it reads the offsets
    on the host)."""
    cupy_ndarray = _arrays._cupy_ndarray()
    if cupy_ndarray is not None and type(x) is cupy_ndarray and activation == "silu":
        key = _cupy_moe_key(x, down, topk_ids, topk_weights, cupy_ndarray)
        if key is not None:
            calls = _bound_holder(gate_up).bound_calls
            replay = calls.get(key, _UNSEEN) if calls else _UNSEEN  # one read: another thread may clear it
            if replay is not _UNSEEN:
                if replay is None:  # a signature bind_moe refused: the full path, not bound again
                    return MoeCall(x, gate_up, down, topk_ids, topk_weights, activation).run()
                import cupy

                return replay(x, topk_ids, topk_weights, cupy.cuda.get_current_stream().ptr)
            out = MoeCall(x, gate_up, down, topk_ids, topk_weights, activation).run()
            bind_moe_call(x, gate_up, down, topk_ids, topk_weights, key)
            return out
    return MoeCall(x, gate_up, down, topk_ids, topk_weights, activation).run()


# -- bound calls (seam.bound: the table, the key, the eviction) -------------------------------------

_UNSEEN: Any = object()  # a signature not met yet (None: met, and refused by bind_moe)


def _bound_holder(gate_up):
    """The object a pair's bound calls live on: the Fp8Experts itself (a ResidentFp8's device copy)."""
    return gate_up.weight if type(gate_up) is ResidentFp8 else gate_up


def _cupy_moe_key(x, down, topk_ids, topk_weights, cupy_ndarray):
    """The key of a cupy call that a bound call can replay, or None: x [T, H] C-contiguous and
    16-byte aligned, the routing C-contiguous cupy arrays, T and k nonzero, no debug checks."""
    if (
        type(topk_ids) is not cupy_ndarray
        or type(topk_weights) is not cupy_ndarray
        or len(x.shape) != 2
        or not (x._c_contiguous and topk_ids._c_contiguous and topk_weights._c_contiguous)
        or x.data.ptr & 15
        or not x.size
        or not topk_ids.size
        or moe_debug_checks()
    ):
        return None
    return bound.moe_key(
        x.shape, x.dtype, topk_ids.shape, topk_ids.dtype, topk_weights.shape, topk_weights.dtype, down, x.data.device_id
    )


def bind_moe_call(x, gate_up, down, topk_ids, topk_weights, key):
    """Bind ``moe_fp8(x, gate_up, down, topk_ids, topk_weights)`` (cupy arrays on the current GPU, after
    a full call of the same arguments succeeded, so its tables and kernels exist) under ``key``: the
    ``BoundMoe`` for later calls, or None where ``bind_moe`` refuses (those calls take the full path)."""
    import cupy

    from ..cuda import bound as cuda_bound

    if cupy.cuda.runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr):
        return None  # bound at the next eager call: a capture records the full path's launches
    replay, why = cuda_bound.bind_moe(
        x, topk_ids, topk_weights, lambda: MoeCall(x, gate_up, down, topk_ids, topk_weights).run()
    )
    bound.table_of(_bound_holder(gate_up)).put(key, replay, why)
    return replay


class MoeCall:
    """One ``moe_fp8`` call as its named steps (``steps``: (name, callable) in order, each reading
    and writing ``state``), checked on construction. ``run()`` runs them and returns the output;
    ``vtnumba.profile.profile_moe`` times them one by one."""

    def __init__(self, x, gate_up, down, topk_ids, topk_weights, activation="silu"):
        if activation != "silu":
            raise ValueError(
                f"activation must be 'silu' (SiLU-and-multiply, the gated MLP of Qwen3-MoE, Mixtral, "
                f"DeepSeek-V3), got {activation!r}"
            )
        x = _float_rows(x, "x", "[T, H]")
        gu = _experts_for(gate_up, x, "gate_up")
        dn = _experts_for(down, x, "down")
        e, _, h = gu.shape
        _check_pair(gu, dn)  # first: a swapped pair is the pair's fault, not x's
        if int(x.shape[1]) != h:
            raise ValueError(
                f"x must be [T, H] with H = {h} (gate_up is [E, 2I, H] = {gu.shape}), got shape {tuple(x.shape)}"
            )
        t = int(x.shape[0])
        self.device = "cpu" if isinstance(x, np.ndarray) else _arrays.device_of(x, "x")
        _check_routing(topk_ids, topk_weights, t, e, self.device)
        self.gate_up, self.down = gu, dn
        self.empty = t == 0 or int(topk_ids.shape[1]) == 0
        self.state = dict(x=x, topk_ids=topk_ids, topk_weights=topk_weights)
        backend = _backend(self.device)
        fused = getattr(backend, "silu_mul_quantize", None)
        tokens = getattr(backend, "quantize_tokens", None)  # the GPU's: quantize_fp8's launches, recordable
        st = self.state

        def align():
            st["offsets"], st["pair_row"], st["row_token"] = backend.moe_align(topk_ids, e)
            # which experts the two GEMMs' grids run (the GPU's: at decode, the 8 of 128 that have rows)
            st["active"] = backend.active_experts(st["offsets"], e, int(st["row_token"].shape[0]))

        def quantize():
            if gu.activation_scheme == ActivationScheme.STATIC:
                st["a"], st["sa"] = backend.quantize_rows_static(
                    backend.gather_rows(x, st["row_token"]), st["offsets"], gu.input_scale
                )
                return
            if tokens is not None:
                data, scale = tokens(x, gu)
            else:
                q = _quantize_tokens(x, gu)
                data, scale = q.data, q.scale
            st["a"] = backend.gather_rows(data, st["row_token"])
            st["sa"] = (
                scale
                if gu.activation_scheme == ActivationScheme.DYNAMIC
                else backend.gather_rows(_row_scale(scale, gu), st["row_token"])
            )

        def gemm_gate_up():
            st["hidden"] = backend.grouped_scaled_mm(
                st["a"],
                _row_scale(st["sa"], gu),
                gu.data,
                gu.weight_scale,
                st["offsets"],
                np.dtype(np.float32),
                gu.block_size,
                active=st["active"],
            )

        def act_quantize():
            if fused is not None:
                st["act"], st["sact"] = fused(st["hidden"], st["offsets"], dn)
            else:
                st["act"], st["sact"] = _quantize_rows(
                    backend.silu_mul(st["hidden"], st["offsets"]), dn, st["offsets"], backend
                )

        def gemm_down():
            st["y"] = backend.grouped_scaled_mm(
                st["act"],
                _row_scale(st["sact"], dn),
                dn.data,
                dn.weight_scale,
                st["offsets"],
                np.dtype(np.float32),
                dn.block_size,
                active=st["active"],
            )

        def combine():
            st["out"] = backend.moe_combine(st["y"], st["pair_row"], topk_weights, x.dtype)

        # at decode (a few routed pairs) the GPU routes each pair itself: two launches
        routed = getattr(backend, "routed_reason", None)
        self.routed_reason = routed(x, gu, dn, topk_ids) if routed is not None else "the aligned steps run on the CPU"
        if self.routed_reason is None:

            def gate_up_routed():
                st["act"], st["arrivals"] = backend.routed_gate_up(x, gu, topk_ids, h, dn.block_size is not None)

            def down_routed():  # with the combine
                st["out"], st["y"] = backend.routed_down(st["act"], st["arrivals"], dn, topk_ids, topk_weights, x.dtype)

            self.steps = (("routed_gate_up", gate_up_routed), ("routed_down", down_routed))
            return
        self.steps = (
            ("align", align),
            ("quantize", quantize),
            ("gate_up", gemm_gate_up),
            ("act_quantize", act_quantize),
            ("down", gemm_down),
            ("combine", combine),
        )

    def run(self):
        if self.empty:
            xp = _arrays.array_module(self.state["x"])
            return xp.zeros((int(self.state["x"].shape[0]), self.gate_up.shape[2]), dtype=self.state["x"].dtype)
        for _, step in self.steps:
            step()
        return self.state["out"]
