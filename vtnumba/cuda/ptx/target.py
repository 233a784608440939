"""The one module that imports Numba's CUDA target (numba-cuda).

Everything GPU-side imports ``cuda`` (and ``types``, ``libdevice``, ``intrinsic``) from here, so
moving to numba-cuda's successor (numba-cuda-mlir) is a change to this file once it passes the
exhaustive gate (ANCHORS.md: on 2026-11-29 it did not).

``require_gpu()`` is the one check a GPU call makes before any work: it raises a single
``RuntimeError`` that says why the GPU path cannot run (numba-cuda missing or clashing with numpy,
no cupy, no driver, no device).
"""

import functools
import os
from typing import Any

# Numba otherwise synchronizes a foreign array's stream on every launch, which both costs host
# time and breaks CUDA graph capture (DEVICE.md). vtnumba orders work on the current cupy stream.
os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

# VTNUMBA_CUDA_TARGET=numba-cuda-mlir puts numba-cuda-mlir behind this import instead of numba-cuda,
# opt-in, to measure it against the gates (benchmarks/probes/probe_numba_cuda_mlir.py; docs/DEVICE.md,
# "Porting the intrinsics to numba-cuda-mlir"); unset (or empty) keeps numba-cuda, the only target
# the gates pass on. A typo is refused rather than falling back, so a measurement never silently
# runs the default.
TARGETS = ("numba-cuda", "numba-cuda-mlir")
TARGET = os.environ.get("VTNUMBA_CUDA_TARGET") or TARGETS[0]
if TARGET not in TARGETS:
    raise ValueError(f"VTNUMBA_CUDA_TARGET must be one of {', '.join(TARGETS)} (or unset), got {TARGET!r}")

# Whichever compiler imports (or None where none does): typed Any, since their types differ by target
intrinsic: Any
IMPORT_ERROR: Exception | None

if TARGET == "numba-cuda-mlir":
    try:
        if SIMULATOR:
            raise ImportError("numba-cuda-mlir has no CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")
        import importlib

        from numba_cuda_mlir import cuda
        from numba_cuda_mlir.cuda import libdevice

        # the public types package, not the attribute ``cuda.types`` (which importing the
        # submodule replaces); its types are numba-cuda-mlir's own, not numba-cuda's
        types = importlib.import_module("numba_cuda_mlir.cuda.types")
        # Its @intrinsic takes the same (typingctx, *args) -> (sig, codegen) form, but codegen is
        # called with an MLIR builder: vtnumba's llvmlite InlineAsm codegen imports and decorates fine
        # and fails when a kernel using it compiles -- the failure the measurement records, per kernel.
        from numba_cuda_mlir.extending import intrinsic as _mlir_intrinsic
    except Exception as exc:  # ImportError without numba-cuda-mlir (or a release without its extending API)
        cuda = libdevice = types = None  # type: ignore[assignment]
        IMPORT_ERROR = exc
    else:
        IMPORT_ERROR = None
else:
    try:
        from numba import cuda
        from numba.cuda import libdevice, types
    except Exception as exc:  # AttributeError 'row_stack' under numpy 2.5, ImportError without numba-cuda
        cuda = libdevice = types = None  # type: ignore[assignment]
        IMPORT_ERROR = exc
    else:
        IMPORT_ERROR = None

# Options of every vtnumba device helper: inlined by NVVM (forceinline), not by Numba's IR inliner
# (inline=True), which re-types each call site -- with the encoder inlined 16 times per kernel that
# made one kernel take 10-20 s to compile. The simulator has no forceinline (nor needs one).
DEVICE_INLINE = dict(device=True) if SIMULATOR else dict(device=True, forceinline=True)

intrinsic = None
if IMPORT_ERROR is None and TARGET == "numba-cuda-mlir":
    intrinsic = _mlir_intrinsic
elif IMPORT_ERROR is None and not SIMULATOR:
    try:
        from numba.cuda.extending import intrinsic
    except ImportError:  # numba-cuda before the core was vendored
        from numba.core.extending import intrinsic


@functools.cache
def gpu_unavailable_reason():
    """None when the GPU path can run here, else one sentence saying why not."""
    if IMPORT_ERROR is not None and TARGET == "numba-cuda-mlir":
        return (
            f"numba-cuda-mlir (VTNUMBA_CUDA_TARGET) could not be imported "
            f"({IMPORT_ERROR.__class__.__name__}: {IMPORT_ERROR})"
        )
    if IMPORT_ERROR is not None:
        import numpy as np

        return (
            f"numba-cuda could not be imported ({IMPORT_ERROR.__class__.__name__}: {IMPORT_ERROR}); "
            f"with numpy {np.__version__} this is usually the numba-cuda/numpy version clash "
            f"(numba-cuda 0.30 needs numpy < 2.5) or numba-cuda not being installed"
        )
    if SIMULATOR:
        return None  # the simulator needs neither cupy nor a driver
    try:
        import cupy
    except Exception as exc:  # ImportError, or a cupy built for another CUDA
        return f"cupy is not importable ({exc.__class__.__name__}: {exc}); install cupy-cuda12x or cupy-cuda13x"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # cudaErrorNoDevice / InsufficientDriver / no libcuda
        return f"no usable CUDA driver ({exc.__class__.__name__}: {exc})"
    if count < 1:
        return "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"
    return None


def require_gpu():
    """Raise one clear RuntimeError when the GPU path cannot run here."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"vtnumba's GPU path needs a usable CUDA GPU: {reason}")


__all__ = [
    "cuda",
    "libdevice",
    "types",
    "intrinsic",
    "DEVICE_INLINE",
    "IMPORT_ERROR",
    "SIMULATOR",
    "TARGET",
    "TARGETS",
    "gpu_unavailable_reason",
    "require_gpu",
]
