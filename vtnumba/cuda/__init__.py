"""The GPU backend of vtnumba's ops (``vtnumba.ops.Backend``): cupy in, cupy out, numba-cuda kernels
launched through cupy on cupy's current stream, and cuBLASLt.

This module is the top of five layers; each imports only its own layer and those below it
(``tests/test_cuda_layers.py``; ARCHITECTURE.md draws them):

    vtnumba.cuda (this file)  the backend: the functions ``vtnumba.ops`` calls, nothing else
    quantize.py   which quantization kernels a call launches, per scheme
    gemm.py       which GEMM kernel runs a call (cuBLASLt or a Numba kernel), and the fused layer
    block.py      which block-scaled GEMM kernel runs a call
    bound.py      a linear layer's call prepared once per input signature (the seam's fast path)
    graphs.py     ``capture``: CUDA graphs as an API
    capabilities.py  what the GPU here can run, path by path
    kernels/      the ``@cuda.jit`` kernels, each with how it is launched (sm90_*: Hopper only)
    runtime/      how work reaches a GPU: the launcher, one record per device, cuBLASLt's binding
    ptx/          what kernels are written with: numba-cuda's target, bit and PTX primitives

- Inputs, scales, the encoder and streams: see ``quantize.py`` and docs/DEVICE.md. Nothing
  synchronizes: dynamic scales are reduced and consumed on the GPU.
- A call without a usable GPU raises one RuntimeError saying why (``ptx.target.require_gpu``);
  importing this module needs neither numba-cuda nor a GPU.

Under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) the same functions take and return numpy arrays
and run the same kernels in the simulator (the portable encoder only).
"""

from .capabilities import capabilities  # what runs on this GPU, path by path
from .ptx.target import gpu_unavailable_reason
from .quantize import (
    decode,
    dequantize,
    encoder_in_use,
    quantize_dynamic,
    quantize_launches,
    quantize_per_group,
    quantize_per_group_e8m0,
    quantize_per_token,
    quantize_static,
    scale_array,
)

_gemm = None  # vtnumba.cuda.gemm: the GEMM kernels and cuBLASLt load only when first used


def _gemm_module():
    global _gemm
    if _gemm is None:
        from .quantize import _backend

        _backend()
        from . import gemm as _gemm
    return _gemm


def scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, kernel):
    return _gemm_module().scaled_mm(a, b, scale_a, scale_b, out_dtype, bias, kernel)


def block_scaled_mm(a, b, scale_a, scale_b, block_size, out_dtype, bias, kernel):
    _gemm_module()
    from . import block

    return block.block_scaled_mm(a, b, scale_a, scale_b, block_size, out_dtype, bias, kernel)


def fp8_linear(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias):
    """One launch where a decode GEMV can take the call (it quantizes x as it reads it), else the
    quantization, then ``scaled_mm`` (``gemm.fp8_linear``)."""
    return _gemm_module().fp8_linear(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias)


def capture(fn, *example_args, stream=None, warmup=1):
    """Capture ``fn(*example_args)`` (GPU arrays in, GPU arrays out) into a CUDA graph and return
    a callable that replays it for new arguments of the same shapes (``vtnumba.cuda.graphs``)."""
    from . import graphs

    return graphs.capture(fn, *example_args, stream=stream, warmup=warmup)


__all__ = [
    "scale_array",
    "quantize_static",
    "quantize_dynamic",
    "quantize_per_token",
    "decode",
    "dequantize",
    "quantize_per_group",
    "quantize_per_group_e8m0",
    "quantize_launches",
    "scaled_mm",
    "block_scaled_mm",
    "fp8_linear",
    "capture",
    "encoder_in_use",
    "gpu_unavailable_reason",
    "capabilities",
]
