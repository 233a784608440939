"""Linear methods and the factory every model gets them from (the C++ seam's ``Fp8W8A8LinearMethod``
and ``MakeLinearMethod``; vLLM's ``LinearMethodBase`` / ``UnquantizedLinearMethod``).

A linear method is anything with ``name``, ``apply(x, out_dtype=None)`` and
``apply_prequant(q, out_dtype=None)``. ``make_linear_method(weight)`` is a
``functools.singledispatch`` on the weight's type, so a model or another package adds its own
weight types with ``@make_linear_method.register``.
"""

import functools
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .. import _arrays
from .._arrays import Array, DType
from ..ops import QuantizedActivation, dequantize_fp8
from .matmul import matmul_fp8, matmul_fp8_prequant
from .weights import Fp8Weight, ResidentFp8

__all__ = ["LinearMethod", "Fp8W8A8LinearMethod", "UnquantizedLinearMethod", "make_linear_method"]


@runtime_checkable
class LinearMethod(Protocol):
    """What a model calls: ``y = method.apply(x)`` for x [..., K] -> y [..., N]."""

    name: str

    def apply(self, x: Array, out_dtype: DType | None = None) -> Array: ...

    def apply_prequant(self, q: QuantizedActivation, out_dtype: DType | None = None) -> Array: ...


class Fp8W8A8LinearMethod:
    """FP8 weights and FP8 activations: ``apply`` is ``seam.matmul_fp8``, ``apply_prequant`` is
    ``seam.matmul_fp8_prequant``. Holds an ``Fp8Weight`` or a ``ResidentFp8``."""

    name = "fp8_w8a8"
    __slots__ = ("weight",)

    def __init__(self, weight: Fp8Weight | ResidentFp8) -> None:
        if not isinstance(weight, (Fp8Weight, ResidentFp8)):
            raise TypeError(f"weight must be an Fp8Weight or a ResidentFp8, got {type(weight).__name__}")
        self.weight = weight

    def apply(self, x: Array, out_dtype: DType | None = None) -> Array:
        return matmul_fp8(x, self.weight, out_dtype)

    def apply_prequant(self, q: QuantizedActivation, out_dtype: DType | None = None) -> Array:
        return matmul_fp8_prequant(q, self.weight, out_dtype)

    def __repr__(self):
        return f"Fp8W8A8LinearMethod({self.weight!r})"


class UnquantizedLinearMethod:
    """Float weights [N, K] (layers a checkpoint leaves unquantized: lm_head, routers ...):
    ``y = x @ w.T + bias`` with float32 operands and float32 accumulation (BLAS sgemm on numpy,
    cuBLAS on cupy), rounded to ``out_dtype`` (default: x's dtype). The weight is widened to float32
    once, at construction (exact for float16 / bfloat16)."""

    name = "unquantized"
    __slots__ = ("weight", "bias", "device", "_w32_t", "_bias32")

    def __init__(self, weight: Array, bias: Array | None = None) -> None:
        self.device = _arrays.device_of(weight, "weight")
        _arrays.float_dtype(weight, "weight")
        if len(weight.shape) != 2:
            raise ValueError(f"weight must be 2-D [N, K] (nn.Linear layout), got shape {tuple(weight.shape)}")
        n = int(weight.shape[0])
        if bias is not None:
            if _arrays.device_of(bias, "bias") != self.device:
                raise ValueError(
                    f"bias must be on the weight's device {self.device}, got {_arrays.device_of(bias, 'bias')}"
                )
            _arrays.bias_vector(bias, n)
        self.weight, self.bias = weight, bias
        self._w32_t = weight.astype(np.float32).T
        self._bias32 = None if bias is None else bias.reshape(n).astype(np.float32)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def apply(self, x: Array, out_dtype: DType | None = None) -> Array:
        if _arrays.device_of(x, "x") != self.device:
            raise ValueError(f"x must be on the weight's device {self.device}, got {_arrays.device_of(x, 'x')}")
        dt = _arrays.float_dtype(x, "x") if out_dtype is None else _arrays.out_dtype_of(out_dtype)
        k = self._w32_t.shape[0]
        if len(x.shape) < 1 or x.shape[-1] != k:
            raise ValueError(
                f"x must be [..., K] with K = {k} (the weight is [N, K] = {self.shape}), got shape {tuple(x.shape)}"
            )
        y = x.astype(np.float32) @ self._w32_t
        if self._bias32 is not None:
            y += self._bias32
        return y.astype(dt)

    def apply_prequant(self, q: QuantizedActivation, out_dtype: DType | None = None) -> Array:
        """An FP8 activation fed to an unquantized layer (a model that quantizes once for several
        layers): dequantized exactly to float32, then ``apply``. out_dtype defaults to float32."""
        if not isinstance(q, QuantizedActivation):
            raise TypeError(f"q must be a vt.QuantizedActivation, got {type(q).__name__}")
        scale = q.scale if q.scale.shape[0] == 1 else q.scale.reshape(-1, 1)
        x = dequantize_fp8(q.data, scale, np.float32)
        return self.apply(x, np.float32 if out_dtype is None else out_dtype)

    def __repr__(self):
        return f"UnquantizedLinearMethod(shape={self.shape}, device={self.device!r}, bias={self.bias is not None})"


@functools.singledispatch
def make_linear_method(weight: Any, bias: Array | None = None) -> LinearMethod:
    """The linear method for ``weight``, chosen by its type:

    - ``Fp8Weight`` / ``ResidentFp8`` -> ``Fp8W8A8LinearMethod`` (bias travels inside the weight);
    - a float numpy or GPU array [N, K] -> ``UnquantizedLinearMethod(weight, bias)``;
    - anything else: register it, ``@make_linear_method.register`` on a function taking
      ``(weight, bias=None)`` and returning an object with ``name``, ``apply``, ``apply_prequant``.
    """
    if hasattr(weight, "__cuda_array_interface__"):  # cupy / numba / torch CUDA: no import needed
        return _float_array(weight, bias)
    raise TypeError(
        f"weight must be an Fp8Weight, a ResidentFp8 or a float array (numpy or cupy), "
        f"got {type(weight).__name__}; register other types with @make_linear_method.register"
    )


def _fp8(weight, bias=None):
    if bias is not None:
        raise ValueError(
            "bias must be None for an FP8 weight (it travels inside the Fp8Weight: "
            f"Fp8Weight(..., bias=b)), got {type(bias).__name__}"
        )
    return Fp8W8A8LinearMethod(weight)


make_linear_method.register(Fp8Weight, _fp8)
make_linear_method.register(ResidentFp8, _fp8)


@make_linear_method.register(np.ndarray)
def _float_array(weight, bias=None):
    dt = np.dtype(weight.dtype)
    if dt in (np.dtype(np.uint8), _arrays.FLOAT8_E4M3):
        raise TypeError(
            "weight must be a float array or an Fp8Weight, got e4m3 codes without scales "
            f"(dtype {dt}); wrap them: seam.Fp8Weight(codes, weight_scale, ...)"
        )
    return UnquantizedLinearMethod(weight, bias)
