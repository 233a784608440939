"""vtnumba: the FP8 (e4m3fn) W8A8 linear path as a Numba kernel library.

numpy arrays run on the CPU (``@njit`` kernels); cupy arrays run on the GPU (``@cuda.jit`` kernels
and cuBLASLt). See DESIGN.md for the exact semantics every function follows.
"""

from ._format import E4M3_MAX
from .ops import (
    QuantizedActivation,
    decode_e4m3,
    dequantize_fp8,
    encode_e4m3,
    quantize_fp8,
    scaled_mm,
)

__version__ = "0.1.0"

__all__ = [
    # format
    "E4M3_MAX",
    "encode_e4m3",
    "decode_e4m3",
    # quantization
    "QuantizedActivation",
    "quantize_fp8",
    "dequantize_fp8",
    # GEMM
    "scaled_mm",
]
