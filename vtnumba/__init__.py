"""vtnumba: the FP8 (e4m3fn) W8A8 linear path as a Numba kernel library.

numpy arrays run on the CPU (``@njit`` kernels); cupy arrays run on the GPU (``@cuda.jit`` kernels
and cuBLASLt). docs/DESIGN.md states the exact semantics every function follows; docs/DEVICE.md
says what runs where on a GPU and how to time it.
"""

import importlib as _importlib
import importlib.machinery as _machinery
import sys as _sys

# The modules issue 24 moved into vtnumba.cuda's layers (ARCHITECTURE.md), by their old names. The
# repository imports the new names (tests/test_cuda_layers.py); code written before the move keeps
# working: an old name gives the moved module itself, one module with one set of kernel caches.
_MOVED = {
    f"vtnumba.cuda.{old}": f"vtnumba.cuda.{new}"
    for old, new in {
        "target": "ptx.target",
        "codec": "ptx.codec",
        "mma": "ptx.mma",
        "wgmma": "ptx.sm90_wgmma",
        "launch": "runtime.launch",
        "device": "runtime.device",
        "cublaslt": "runtime.cublaslt",
        "quant": "kernels.quant",
        "epilogue": "kernels.epilogue",
        "tiled": "kernels.tiled",
        "gemv": "kernels.gemv",
        "tc_gemm": "kernels.tc_gemm",
        "tc_gemv": "kernels.tc_gemv",
        "wg_gemm": "kernels.sm90_wgmma_gemm",
    }.items()
}


class _MovedModule:
    """The loader of an old name: imports the module where it lives now and hands that over."""

    def __init__(self, new_name):
        self.new_name = new_name
        self.spec = None

    def create_module(self, spec):
        module = _importlib.import_module(self.new_name)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec  # the import system stamped the old name's spec on it


class _VtnumbaCudaFinder:
    """numba-cuda 0.30 installs an import redirector that claims every module whose name CONTAINS
    "numba.cuda" (``_numba_cuda_redirector.py``: ``if "numba.cuda" in name``), so ``vtnumba.cuda``
    would be sent looking for itself until RecursionError. This finder, first on sys.meta_path,
    resolves vtnumba's own subpackage the ordinary way before the redirector sees the name (and
    says plainly that a module is missing, where the redirector would recurse)."""

    @staticmethod
    def find_spec(name, path, target=None):
        if name in _MOVED:
            return _machinery.ModuleSpec(name, _MovedModule(_MOVED[name]))
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
