"""A linear layer's GPU call, bound: prepared once for one input signature, then replayed cheaply.

An FP8 layer at decode does 4-36 us of GPU work, while one trip through the validating ops costs
~100 us of host time (benchmarks/profile_gpu_host.py: the device resolved several times, shapes
re-validated, scales wrapped, the kernel choice walked, parameters packed, two allocations). A
model calls the same layer with the same input signature token after token, so the seam binds the
call once per (input shape, dtype, output dtype, device, stream, lever): ``BoundLinear`` holds

- the activation quantization as prepared launches (``launch.PreparedLaunch``) writing into codes
  and scale buffers the binding owns,
- the GEMM the kernel choice picked for those buffers, bound (``gemm.py``'s ``bind``: a cuBLASLt
  descriptor of its own with the scale and bias pointers set once, or a prepared Numba launch),

and a call patches the input pointer, allocates the output from cupy's pool and enqueues. The
work enqueued is the unbound call's, launch for launch, so the result is bitwise the same.

What a binding assumes (the seam checks it per call, and falls back to the full path otherwise):
the input is C-contiguous and 16-byte aligned with the bound shape and dtype; the current stream,
device and lever settings are the bound ones. The owned buffers are reused call after call in the
bound stream's order, which is why the stream is part of the key.
"""

import threading

import numpy as np

from .. import _arrays
from . import device, gemm
from .target import SIMULATOR


class BoundLinear:
    """quantize(x) then the GEMM with a fixed weight, prepared once (see the module docstring).

    ``BoundLinear(x, weight_data, weight_scale, input_scale, per_token, out_dtype, bias)`` binds
    for inputs like ``x`` (a contiguous, aligned cupy [M, K] float array); ``bound(x, stream_ptr)``
    returns y [M, N]."""

    __slots__ = ("_launches", "_buffers", "_gemm", "_out_shape", "_out_dtype", "_lock")

    def __init__(self, x, weight_data, weight_scale, input_scale, per_token, out_dtype, bias):
        from . import prepare_quantize

        launches, codes, scale_a = prepare_quantize(x, input_scale, per_token, None)
        call = gemm.GemmCall(codes, weight_data, scale_a, weight_scale, np.dtype(out_dtype), bias)
        self._gemm = gemm.select(call).bind(call)
        self._launches = launches
        self._buffers = (codes, scale_a)  # owned: written by the launches, read by the GEMM
        self._out_shape = (x.shape[0], weight_data.shape[0])
        self._out_dtype = np.dtype(out_dtype)
        self._lock = threading.Lock()  # the prepared parameters are patched per call

    def __call__(self, x, stream_ptr):
        with self._lock:
            if SIMULATOR:
                for launch in self._launches:
                    launch.set_arg(0, _flat_simulated(x))
                    launch.launch(stream_ptr)
            else:
                x_ptr = x.data.ptr
                for launch in self._launches:
                    launch.launch_with(0, x_ptr, stream_ptr)
            y = device.xp.empty(self._out_shape, dtype=self._out_dtype)
            self._gemm(y, stream_ptr)
        return y


def _flat_simulated(x):
    """The simulator's kernels take the flat array itself (16-bit floats as their bits)."""
    flat = np.asarray(x).reshape(-1)
    return flat.view(np.uint16) if flat.dtype.itemsize == 2 else flat


def bind_linear(x, weight, out_dtype):
    """A ``BoundLinear`` for ``weight`` (an ``Fp8Weight`` whose arrays are on x's GPU) and inputs
    like ``x``, quantized by the weight's activation scheme; None for a block-scaled weight (its
    calls take the full path)."""
    scheme = weight.activation_scheme
    if weight.block_size is not None:
        return None
    return BoundLinear(x, weight.data, weight.weight_scale, weight.input_scale if scheme == "static" else None,
                       scheme == "per_token", _arrays.out_dtype_of(out_dtype), weight.bias)


__all__ = ["BoundLinear", "bind_linear"]
