"""vtnumba: the FP8 (e4m3fn) W8A8 linear path as a Numba kernel library.

numpy arrays run on the CPU (``@njit`` kernels); cupy arrays run on the GPU (``@cuda.jit`` kernels
and cuBLASLt). docs/DESIGN.md states the exact semantics every function follows; docs/DEVICE.md
says what runs where on a GPU and how to time it.
"""

import importlib.machinery as _machinery
import sys as _sys


class _VtnumbaCudaFinder:
    """numba-cuda 0.30 installs an import redirector that claims every module whose name CONTAINS
    "numba.cuda" (``_numba_cuda_redirector.py``: ``if "numba.cuda" in name``), so ``vtnumba.cuda``
    would be sent looking for itself until RecursionError. This finder, first on sys.meta_path,
    resolves vtnumba's own subpackage the ordinary way before the redirector sees the name (and
    says plainly that a module is missing, where the redirector would recurse)."""

    @staticmethod
    def find_spec(name, path, target=None):
        if name == "vtnumba.cuda" or name.startswith("vtnumba.cuda."):
            spec = _machinery.PathFinder.find_spec(name, path, target)
            if spec is None:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return spec
        return None


if not any(getattr(f, "__name__", "") == "_VtnumbaCudaFinder" for f in _sys.meta_path):
    _sys.meta_path.insert(0, _VtnumbaCudaFinder)

from ._format import E4M3_MAX  # noqa: E402
from .ops import (  # noqa: E402
    ActivationScheme,
    QuantizedActivation,
    decode_e4m3,
    decode_e8m0,
    dequantize_fp8,
    encode_e4m3,
    fp8_linear,
    quantize_fp8,
    scaled_mm,
)

__version__: str = "0.1.0"

__all__ = [
    # format
    "E4M3_MAX",
    "encode_e4m3",
    "decode_e4m3",
    "decode_e8m0",
    # quantization
    "ActivationScheme",
    "QuantizedActivation",
    "quantize_fp8",
    "dequantize_fp8",
    # GEMM and the fused linear layer
    "scaled_mm",
    "fp8_linear",
]
