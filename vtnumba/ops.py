"""vtnumba's ops: each declared once here (signature and checks), implemented per device.

The boundary validates and normalizes; the device's backend module (``vtnumba.cpu`` or
``vtnumba.cuda``) does the work and never validates. What a backend provides is the ``Backend``
protocol below; both backends satisfy it (tests/test_backends.py checks names and signatures).

Errors are shaped "<name> must be <expected>, got <actual>". Nothing is written to a caller's
buffer on error: every check runs before any kernel. docs/DESIGN.md states the arithmetic each op
follows.
"""

import enum
import importlib
import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import ml_dtypes
import numpy as np

from . import _arrays
from ._arrays import Array, DType, Scale
from ._format import E4M3_MAX, E8M0_ROUNDINGS
from ._interop import interop


class ActivationScheme(enum.StrEnum):
    """How an activation's scale is obtained (docs/DESIGN.md): a static per-tensor scale given by the
    caller, a dynamic per-tensor scale from the tensor's amax, one dynamic scale per row, or one
    dynamic scale per group of g elements along each row."""

    STATIC = "static"
    DYNAMIC = "dynamic"
    PER_TOKEN = "per_token"
    PER_GROUP = "per_group"  # dynamic, one scale per 1 x g group along K (block-scaled checkpoints)

    def __repr__(self):  # the value, as the plain strings these once were print (error messages, reprs)
        return repr(self.value)


SCHEMES = tuple(ActivationScheme)


@runtime_checkable
class Backend(Protocol):
    """What a device's backend module implements. Arguments arrive validated and normalized by the
    ops below: arrays on the backend's device, codes as uint8, scales as float32 host scalars or
    float32 device vectors (1,) / (rows,), bias None or a float vector (N,), dtypes as numpy dtypes."""

    def scale_array(self, scale):
        """The (1,) float32 array of a static activation scale, on the device."""

    def quantize_static(self, x, scale):
        """codes = encode(x * (1 / scale))."""

    def quantize_dynamic(self, x):
        """(codes, scale (1,)) with the dynamic per-tensor scale."""

    def quantize_per_token(self, x, scale_ub):
        """(codes, scales (M, 1)); scale_ub a float32 scalar, a device (1,) array or None."""

    def quantize_per_group(self, x, group_size, scale_ue8m0, column_major_scales):
        """(codes, scales (M, ceil(K / group_size))) for 2-D x; column-major scales if asked."""

    def quantize_per_group_e8m0(self, x, group_size, rounding, column_major_scales):
        """(codes, uint8 E8M0 scales (M, ceil(K / group_size))) for 2-D x, the scale rule ``rounding``
        ('rceil' or 'floor'; DESIGN.md "MXFP8"); column-major scales if asked."""

    def decode(self, codes):
        """float32 values of e4m3 codes."""

    def dequantize(self, codes, scale, dtype):
        """decode(codes) * scale in float32, rounded to dtype."""

    def scaled_mm(self, a, b, scale_a, scale_b, out_dtype, bias, kernel):
        """y = round_out((a @ b^T) * scale_a * scale_b + bias); kernel None or a kernel name."""

    def block_scaled_mm(self, a, b, scale_a, scale_b, block_size, out_dtype, bias, kernel):
        """y = bias + sum_kb (P_kb * scale_a[:, kb]) * scale_b[n // bn, kb]; block_size (bn, bk). Each
        scale array is float (float32 on the device, or a host bfloat16 / float16 widened by the
        backend) or uint8 E8M0 bytes (2^(byte - 127), 0xFF NaN)."""

    def fp8_linear(self, x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias):
        """Quantize x by its scheme, then the GEMM with codes b (one launch where the device can)."""


_BACKEND_MODULES = {"cpu": "vtnumba.cpu", "cuda": "vtnumba.cuda"}
_LOADED = {}


def backend(device: str) -> Backend:
    """The module implementing the ops on ``device`` ('cpu' or 'cuda:N'); imported on first use so
    that ``import vtnumba`` pulls in nothing CUDA."""
    module = _LOADED.get(device)
    if module is None:
        kind = "cuda" if _arrays.is_cuda(device) else "cpu"
        module = _LOADED[device] = importlib.import_module(_BACKEND_MODULES[kind])
    return module


@dataclass(frozen=True)
class QuantizedActivation:
    """An activation quantized to e4m3: ``data`` uint8 codes (x's shape) and float32 ``scale``
    of shape (1,) (per-tensor), (M, 1) (per-token) or (M, ceil(K / group_size)) (per-group), on x's
    device. ``scheme`` says how the scale was obtained: 'static', 'dynamic', 'per_token' or
    'per_group' (then ``group_size`` is the group's length). An MX activation
    (``quantize_fp8(x, group_size=32, scale_format="e8m0")``) is per-group with ``scale`` of dtype
    uint8: E8M0 bytes, each the power of two 2^(byte - 127)."""

    data: Any
    scale: Any
    scheme: ActivationScheme
    group_size: int | None = None

    @property
    def per_token(self) -> bool:
        return self.scheme == ActivationScheme.PER_TOKEN

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def scale_format(self) -> str:
        """'e8m0' when ``scale`` holds E8M0 bytes (uint8), else 'float32'."""
        return "e8m0" if _arrays.dtype_of(self.scale) == np.uint8 else "float32"

    def dequantize(self, dtype: DType = np.float32) -> Array:
        """``decode(data) * scale`` (each group's scale over its elements), rounded to ``dtype``."""
        scale = self.scale
        if self.scale_format == "e8m0":
            scale = decode_e8m0(scale)
        if self.scheme == ActivationScheme.PER_GROUP:  # each group's scale over its elements
            k = self.data.shape[-1]
            scale = scale.repeat(self.group_size, axis=-1)[..., :k]
        return dequantize_fp8(self.data, scale, dtype)


def _is_real_dtype(dt):
    """Integers and floats (bfloat16 included): the dtypes whose values are real numbers. bool, complex,
    object and strings are not (float32 of them would be 1.0 for True, the real part, or a parse)."""
    return dt.kind in "iuf" or dt == _arrays.BFLOAT16


_REAL_SCALARS = (int, float, np.integer, np.floating, ml_dtypes.bfloat16)


def _host_float32(value, name):
    """A scalar given as a Python number, numpy scalar or size-1 numpy array of a real dtype, as float32
    (a value past float32's range rounds to inf, which the callers refuse as not finite)."""
    if isinstance(value, np.ndarray):
        if value.size != 1 or value.ndim > 2:
            raise ValueError(f"{name} must be a scalar or a size-1 array, got shape {value.shape}")
        if not _is_real_dtype(value.dtype):
            raise TypeError(f"{name} must be a real number, got an array of dtype {value.dtype}")
        value = value.reshape(())[()]
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, _REAL_SCALARS):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    with np.errstate(over="ignore"):
        return np.float32(value)


def _flag(value, name):
    """A switch given as True or False (numpy's bool too); anything else is refused rather than read
    by its truth value (per_token='no' would mean per-token)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def quant_scale(scale, name="scale"):
    """A quantization scale: > 0 and finite once rounded to float32 (that is what the kernel uses)."""
    if hasattr(scale, "__cuda_array_interface__"):
        if math.prod(scale.shape) != 1:
            raise ValueError(f"{name} must be a scalar or a size-1 array, got shape {tuple(scale.shape)}")
        if np.dtype(scale.dtype) != np.float32:
            raise TypeError(f"{name} on the GPU must be a float32 array, got dtype {scale.dtype}")
        return scale  # read on the device, never synchronized; the caller vouches for its value
    s = _host_float32(scale, name)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"{name} must be a positive finite float32, got {scale!r} (float32 {s!r})")
    return s


def _group_size(value, name="group_size"):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


SCALE_FORMATS = ("float32", "e8m0")


def _scale_format(value, name="scale_format"):
    if value not in SCALE_FORMATS:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, SCALE_FORMATS))}, got {value!r}")
    return value


def _e8m0_rounding(value, name="scale_rounding"):
    if value not in E8M0_ROUNDINGS:
        raise ValueError(
            f"{name} must be one of {', '.join(map(repr, E8M0_ROUNDINGS))} (DESIGN.md, \"MXFP8\"), got {value!r}"
        )
    return value


@interop
def quantize_fp8(
    x: Array,
    scale: Scale | None = None,
    *,
    per_token: bool = False,
    scale_ub: Scale | None = None,
    group_size: int | None = None,
    scale_ue8m0: bool = False,
    column_major_scales: bool = False,
    scale_format: str = "float32",
    scale_rounding: str | None = None,
) -> QuantizedActivation:
    """Quantize ``x`` (float32 / float16 / bfloat16, numpy or GPU array) to e4m3fn codes.

    - ``scale`` given: static per-tensor, ``encode(float32(x) * (float32(1) / float32(scale)))``.
    - ``scale=None``: dynamic per-tensor, ``scale = max(amax / 448, 1 / (448 * 512))``.
    - ``per_token=True`` (2-D x): one scale per row, ``min(amax_row, scale_ub) / 448`` floored as
      above, and ``encode(x / scale_row)`` (a divide, as upstream's per-token kernel).
    - ``group_size=g`` (2-D x [M, K]): one scale per group of g elements along each row, upstream's
      ``per_token_group_quant_fp8``: ``scale = max(amax_group, 1e-10) / 448`` in float32, then
      ``encode(x / scale)`` (a divide). A last group shorter than g (K % g != 0) takes its own amax.
      ``scale_ue8m0=True`` rounds each scale up to a power of two (DeepGEMM's checkpoints).
      ``q.scale`` is float32 [M, ceil(K / g)], row-major, or column-major (m contiguous, the layout
      cuBLASLt's block scaling reads) with ``column_major_scales=True``.
    - ``group_size=32, scale_format="e8m0"``: MXFP8 (OCP MX): each group's scale is one E8M0 byte,
      the power of two 2^(byte - 127), and the codes are ``encode(x / 2^(byte - 127))``. ``q.scale``
      is uint8 [M, ceil(K / g)]. ``scale_rounding`` picks the byte from the group's amax: 'rceil'
      (default: the smallest power of two >= float32(amax * float32(1 / 448)); nothing saturates;
      NVIDIA's and torchao's RCEIL) or 'floor' (the OCP spec's 2^(floor(log2(amax)) - 8); the top of a
      group may saturate). Any group size is accepted; 32 is the MX formats'.
    amax is taken over finite elements. Every NaN encodes to 0x7F; |v| >= 448 saturates.
    """
    device = _arrays.device_of(x, "x")
    _arrays.float_dtype(x, "x")
    impl = backend(device)
    per_token = _flag(per_token, "per_token")
    scale_ue8m0 = _flag(scale_ue8m0, "scale_ue8m0")
    column_major_scales = _flag(column_major_scales, "column_major_scales")
    e8m0 = _scale_format(scale_format) == "e8m0"
    if not e8m0 and scale_rounding is not None:
        raise ValueError(
            f"scale_rounding applies to scale_format='e8m0' only, got scale_rounding={scale_rounding!r} "
            f"with scale_format={scale_format!r}"
        )
    if group_size is not None:
        g = _group_size(group_size)
        if scale is not None or per_token or scale_ub is not None:
            raise ValueError(
                f"group_size={g} takes no scale, per_token or scale_ub (per-group scales are dynamic), "
                f"got scale={scale!r}, per_token={per_token!r}, scale_ub={scale_ub!r}"
            )
        if len(x.shape) != 2:
            raise ValueError(f"x must be 2-D [tokens, features] for group_size, got shape {tuple(x.shape)}")
        if e8m0:
            if scale_ue8m0:
                raise ValueError(
                    "scale_ue8m0 must be False with scale_format='e8m0' (it rounds float32 group scales; "
                    "an E8M0 scale is rounded by scale_rounding), got True"
                )
            rounding = _e8m0_rounding("rceil" if scale_rounding is None else scale_rounding)
            codes, scales = impl.quantize_per_group_e8m0(x, g, rounding, column_major_scales)
        else:
            codes, scales = impl.quantize_per_group(x, g, scale_ue8m0, column_major_scales)
        return QuantizedActivation(codes, scales, ActivationScheme.PER_GROUP, g)
    if e8m0:
        raise ValueError(
            "scale_format='e8m0' must come with group_size (32 for MXFP8: "
            "vt.quantize_fp8(x, group_size=32, scale_format='e8m0')), got group_size=None"
        )
    if scale_ue8m0 or column_major_scales:
        raise ValueError(
            "scale_ue8m0 and column_major_scales apply to group_size quantization only, "
            f"got scale_ue8m0={scale_ue8m0!r}, column_major_scales={column_major_scales!r}"
        )
    if per_token:
        if scale is not None:
            raise ValueError(f"scale must be None with per_token=True (per-token scales are dynamic), got {scale!r}")
        if len(x.shape) != 2:
            raise ValueError(f"x must be 2-D [tokens, features] for per_token=True, got shape {tuple(x.shape)}")
        ub = None if scale_ub is None else quant_scale(scale_ub, "scale_ub")
        codes, scales = impl.quantize_per_token(x, ub)
        return QuantizedActivation(codes, scales, ActivationScheme.PER_TOKEN)
    if scale_ub is not None:
        raise ValueError(f"scale_ub must be None unless per_token=True, got {scale_ub!r}")
    if scale is None:
        codes, s = impl.quantize_dynamic(x)
        return QuantizedActivation(codes, s, ActivationScheme.DYNAMIC)
    s = quant_scale(scale, "scale")
    codes = impl.quantize_static(x, s)
    return QuantizedActivation(codes, impl.scale_array(s), ActivationScheme.STATIC)


@interop
def encode_e4m3(x: Array) -> Array:
    """float32 / float16 / bfloat16 -> e4m3fn uint8 codes, no scaling (RNE, saturating, NaN -> 0x7F)."""
    device = _arrays.device_of(x, "x")
    _arrays.float_dtype(x, "x")
    return backend(device).quantize_static(x, np.float32(1.0))


@interop
def decode_e4m3(codes: Array) -> Array:
    """e4m3fn codes (uint8 or float8_e4m3fn) -> float32, exact; 0x7F / 0xFF -> NaN."""
    device = _arrays.device_of(codes, "codes")
    return backend(device).decode(_arrays.codes_uint8(codes, "codes"))


@interop
def decode_e8m0(scales: Array) -> Array:
    """E8M0 scale bytes (uint8 or ml_dtypes.float8_e8m0fnu) -> float32 2^(byte - 127), exact (byte 0 is the
    subnormal 2^-127); 0xFF -> NaN. Element-wise array arithmetic, the same on numpy and cupy."""
    _arrays.device_of(scales, "scales")
    return _arrays.decode_e8m0(_arrays.e8m0_bytes(scales, "scales"))


@interop
def dequantize_fp8(
    codes: "Array | QuantizedActivation", scale: Scale | None = None, dtype: DType = np.float32
) -> Array:
    """``decode(codes) * scale`` in float32, rounded (RNE) to ``dtype``. ``scale`` is a scalar or
    an array that broadcasts against the codes (per-row (M, 1), per-channel (N,) ...). ``codes`` may
    be a ``vt.QuantizedActivation`` (its own scale is used, each group's over its elements:
    ``q.dequantize(dtype)``); then ``scale`` stays None."""
    if isinstance(codes, QuantizedActivation):
        if scale is not None:
            raise ValueError(
                "scale must be None when codes is a vt.QuantizedActivation (its scale, codes.scale, "
                f"is used), got {type(scale).__name__}"
            )
        return codes.dequantize(dtype)
    if scale is None:
        raise ValueError(
            "scale must be given with raw codes (the dequantization multiplier), got None; or pass "
            "the vt.QuantizedActivation from vt.quantize_fp8 as codes"
        )
    device = _arrays.same_device([("codes", codes), ("scale", scale)])
    codes = _arrays.codes_uint8(codes, "codes")
    dt = _arrays.out_dtype_of(dtype, "dtype")
    impl = backend(device)
    if np.isscalar(scale) or isinstance(scale, (float, int)):
        s = _host_float32(scale, "scale")
        if not math.isfinite(s):
            raise ValueError(f"scale must be finite as a float32, got {scale!r} (float32 {s!r})")
        scale = s
    else:
        if not _is_real_dtype(_arrays.dtype_of(scale)):
            raise TypeError(f"scale must be an array of real numbers, got dtype {_arrays.dtype_of(scale)}")
        try:
            np.broadcast_shapes(tuple(scale.shape), tuple(codes.shape))
        except ValueError:
            raise ValueError(
                f"scale must broadcast against codes of shape {tuple(codes.shape)}, got shape {tuple(scale.shape)}"
            ) from None
    return impl.dequantize(codes, scale, dt)


def mm_scale(scale, name, rows):
    """scaled_mm's dequantization scale as float32 of shape (1,) or (rows,): any finite value."""
    if isinstance(scale, _arrays._SCALAR_TYPES):
        s = _host_float32(scale, name)
        if not math.isfinite(s):
            raise ValueError(f"{name} must be finite as a float32, got {scale!r} (float32 {s!r})")
        return s
    shape = tuple(scale.shape)
    if isinstance(scale, np.ndarray):
        if scale.dtype.kind != "f" and scale.dtype != _arrays.BFLOAT16:
            raise TypeError(f"{name} must be a float array, got dtype {scale.dtype}")
        scale = scale.astype(np.float32)
        if not np.isfinite(scale).all():
            raise ValueError(f"{name} must be finite, got non-finite values {scale[~np.isfinite(scale)][:4]}")
    if shape == (1,) or shape == (rows,):  # already a vector: no reshape (a device view costs us)
        return scale
    if math.prod(shape) == 1 and len(shape) <= 2:
        return scale.reshape(1)
    if shape == (rows, 1):
        return scale.reshape(rows)
    raise ValueError(f"{name} must be a scalar, shape (1,), ({rows},) or ({rows}, 1), got shape {shape}")


def block_size_of(value, name="block_size"):
    """(bn, bk): two positive ints."""
    try:
        bn, bk = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be two positive ints (bn, bk), got {value!r}") from None
    for part in (bn, bk):
        if isinstance(part, bool) or not isinstance(part, (int, np.integer)) or part < 1:
            raise ValueError(f"{name} must be two positive ints (bn, bk), got {tuple(value)!r}")
    return _group_size(bn, name), _group_size(bk, name)


def _block_scale(scale, name, shape):
    """A block or group scale array of exactly ``shape``: float, finite where it can be checked (host
    arrays; a device array is read on the device, never synchronized), or uint8 E8M0 bytes (also given
    as ml_dtypes.float8_e8m0fnu), taken as they are: byte 0xFF is NaN and poisons its block's outputs,
    as a NaN code does."""
    if isinstance(scale, _arrays._SCALAR_TYPES) or len(getattr(scale, "shape", ())) != 2:
        raise ValueError(
            f"{name} must be a 2-D array of shape {shape} for a block-scaled GEMM, got "
            f"{type(scale).__name__} of shape {tuple(getattr(scale, 'shape', ()))}"
        )
    if tuple(scale.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} for these operands and block size, got {tuple(scale.shape)}")
    dt = _arrays.dtype_of(scale)
    if dt == np.uint8 or dt == _arrays.FLOAT8_E8M0:  # E8M0 bytes: every byte is a value (0xFF is NaN)
        return _arrays.e8m0_bytes(scale, name)
    if dt.kind != "f" and dt != _arrays.BFLOAT16:
        raise TypeError(f"{name} must be a float array or uint8 E8M0 bytes, got dtype {dt}")
    if isinstance(scale, np.ndarray):
        scale = scale.astype(np.float32)
        if not np.isfinite(scale).all():
            raise ValueError(f"{name} must be finite, got non-finite values {scale[~np.isfinite(scale)][:4]}")
    return scale


@interop
def scaled_mm(
    a: Array | QuantizedActivation,
    b: Array,
    scale_a: Scale | None = None,
    scale_b: Scale | None = None,
    *,
    out_dtype: DType = np.float32,
    bias: Array | None = None,
    kernel: str | None = None,
    block_size: tuple[int, int] | None = None,
) -> Array:
    """``y[m, n] = (sum_k dec(a[m, k]) * dec(b[n, k])) * scale_a * scale_b + bias[n]``.

    a: [M, K] e4m3 codes, b: [N, K] codes (nn.Linear's weight layout), float32 accumulation, then
    rounded (RNE) to ``out_dtype``. scale_a: scalar or per-row [M, 1]; scale_b: scalar or
    per-channel [N] / [N, 1]; any finite values.

    ``a`` may be the ``QuantizedActivation`` itself (``vt.scaled_mm(q, w, scale_b=sw)``): its codes
    and its scale are used (``scale_a`` stays None), and what it knows is checked: a per-group
    activation needs ``block_size`` with bk equal to its ``group_size``. Raw codes and a raw
    ``scale_a`` carry no group size, so with them only the scales' shapes are checked: per-group
    scales of another group size whose shape happens to match give a wrong result without an error.

    ``block_size=(bn, bk)``: block-scaled FP8 (DeepSeek-V3/R1, Qwen3-FP8): scale_a is the
    activation's per-group scales [M, ceil(K / bk)] and scale_b the weight's block scales
    [ceil(N / bn), ceil(K / bk)], and ``y[m, n] = bias[n] + sum_kb (P[m, n, kb] * scale_a[m, kb]) *
    scale_b[n // bn, kb]`` with P the float32 sum of the exact products in K-block kb, summed over
    kb in float32 (upstream's Triton block kernel's order). Either scale array may be uint8 E8M0 bytes
    (2^(byte - 127); the dtype says so): ``block_size=(1, 32)`` with E8M0 scales on both sides is MXFP8,
    ``(128, 128)`` with E8M0 weight scales DeepSeek's UE8M0 checkpoints. ``kernel`` forces one implementation by name (for
    tests and benchmarks); by default the backend picks by shape. CPU kernels: "reference",
    "small_m", "blas"; GPU kernels: "cublaslt", "cublaslt_f32_epilogue", "tensorcore_gemv", "tensorcore",
    "decode_gemv", "tiled", and "wgmma" / "wgmma_k32" (by name only: Hopper's native FP8 instruction,
    promoting to float32 every 128 of K / every 32, within the tensor-core bound rather than strict
    G3); block-scaled: "cublaslt_block", "tensorcore_block_gemv", "tensorcore_block", "tiled_block",
    "wgmma_block".
    """
    if isinstance(a, QuantizedActivation):
        a, scale_a = _activation_parts(a, scale_a, block_size)
    elif scale_a is None:
        raise ValueError(
            "scale_a must be given with raw codes a (the activation's dequantization scale), got "
            "None; or pass the vt.QuantizedActivation from vt.quantize_fp8 as a"
        )
    if scale_b is None:
        raise ValueError(
            "scale_b must be given (the weight's dequantization scale: a scalar, per-channel [N] or, "
            "with block_size, per-block), got None"
        )
    device = _arrays.same_device([("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b), ("bias", bias)])
    a = _arrays.codes_uint8(a, "a")
    b = _arrays.codes_uint8(b, "b")
    if len(a.shape) != 2:
        raise ValueError(f"a must be 2-D [M, K], got shape {tuple(a.shape)}")
    if len(b.shape) != 2:
        raise ValueError(f"b must be 2-D [N, K], got shape {tuple(b.shape)}")
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"b must have K = {k} columns like a, got shape {tuple(b.shape)} (a is {tuple(a.shape)})")
    out_dt = _arrays.out_dtype_of(out_dtype)
    if bias is not None:
        bias = _arrays.bias_vector(bias, n)
    if block_size is not None:
        bn, bk = block_size_of(block_size)
        kb = -(-k // bk)
        sa = _block_scale(scale_a, "scale_a", (m, kb))
        sb = _block_scale(scale_b, "scale_b", (-(-n // bn), kb))
        return backend(device).block_scaled_mm(a, b, sa, sb, (bn, bk), out_dt, bias, kernel)
    sa = mm_scale(scale_a, "scale_a", m)
    sb = mm_scale(scale_b, "scale_b", n)
    return backend(device).scaled_mm(a, b, sa, sb, out_dt, bias, kernel)


def _activation_parts(q, scale_a, block_size):
    """(codes, scale) of QuantizedActivation ``q`` passed as scaled_mm's ``a``, after the checks its
    scheme and group size allow (raw arrays cannot be checked so)."""
    if scale_a is not None:
        raise ValueError(
            "scale_a must be None when a is a vt.QuantizedActivation (its scale, a.scale, is used), "
            f"got {type(scale_a).__name__}"
        )
    if block_size is not None:
        bk = block_size_of(block_size)[1]
        if q.scheme != ActivationScheme.PER_GROUP:
            raise ValueError(
                f"a must be quantized per group of bk = {bk} for block_size {tuple(block_size)}, got a "
                f"{str(q.scheme)!r} activation; quantize with vt.quantize_fp8(x, group_size={bk})"
            )
        if q.group_size != bk:
            raise ValueError(
                f"a.group_size must be block_size's bk = {bk} (each K-block of {bk} is scaled by one "
                f"activation scale), got {q.group_size}; quantize with vt.quantize_fp8(x, group_size={bk}) "
                f"or pass the block_size the weight was quantized with"
            )
    elif q.scheme == ActivationScheme.PER_GROUP:
        raise ValueError(
            f"block_size must be given for a per-group activation (a.group_size = {q.group_size}), got "
            f"None; pass block_size=(bn, {q.group_size}) with the weight's block scales"
        )
    return q.data, q.scale


@interop
def fp8_linear(
    x: Array,
    b: Array,
    scale_b: Scale,
    input_scale: Scale | None = None,
    *,
    per_token: bool = False,
    scale_ub: Scale | None = None,
    out_dtype: DType = np.float32,
    bias: Array | None = None,
) -> Array:
    """One FP8 W8A8 linear layer: quantize the float activation x [M, K] as ``quantize_fp8`` does
    (``input_scale`` given: static; None: dynamic per-tensor; ``per_token=True``: one scale per row,
    ``scale_ub`` capping amax), then ``scaled_mm`` with the e4m3 weight b [N, K], its dequantization
    scale ``scale_b`` (scalar or per-channel) and ``bias``.

    The same arithmetic as the two ops in sequence; the backend may fuse them (on the GPU, at
    decode, the GEMV quantizes the activation as it reads it: one launch)."""
    device = _arrays.same_device(
        [("x", x), ("b", b), ("scale_b", scale_b), ("input_scale", input_scale), ("bias", bias)]
    )
    _arrays.float_dtype(x, "x")
    if len(x.shape) != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    b = _arrays.codes_uint8(b, "b")
    if len(b.shape) != 2 or b.shape[1] != x.shape[1]:
        raise ValueError(f"b must be [N, {x.shape[1]}] e4m3 codes, got shape {tuple(b.shape)}")
    per_token = _flag(per_token, "per_token")
    if per_token:
        if input_scale is not None:
            raise ValueError(f"input_scale must be None with per_token=True, got {input_scale!r}")
        ub = None if scale_ub is None else quant_scale(scale_ub, "scale_ub")
    else:
        if scale_ub is not None:
            raise ValueError(f"scale_ub must be None unless per_token=True, got {scale_ub!r}")
        ub = None
    s_in = None if input_scale is None else quant_scale(input_scale, "input_scale")
    n = b.shape[0]
    sb = mm_scale(scale_b, "scale_b", n)
    if bias is not None:
        bias = _arrays.bias_vector(bias, n)
    return backend(device).fp8_linear(x, b, sb, s_in, per_token, ub, _arrays.out_dtype_of(out_dtype), bias)


__all__ = [
    "QuantizedActivation",
    "ActivationScheme",
    "Backend",
    "quantize_fp8",
    "dequantize_fp8",
    "encode_e4m3",
    "decode_e4m3",
    "decode_e8m0",
    "SCALE_FORMATS",
    "E8M0_ROUNDINGS",
    "scaled_mm",
    "fp8_linear",
    "backend",
    "E4M3_MAX",
    "SCHEMES",
]
