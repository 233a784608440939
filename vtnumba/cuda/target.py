"""The one module that imports Numba's CUDA target (numba-cuda).

Everything GPU-side imports ``cuda`` from here, so moving to numba-cuda's successor
(numba-cuda-mlir) is a change to this file once it passes the exhaustive gate (ANCHORS.md: on
2026-11-29 it did not).
"""

import os

# Numba otherwise synchronizes a foreign array's stream on every launch, which both costs host
# time and breaks CUDA graph capture (DEVICE.md). vtnumba orders work on the current cupy stream.
os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")

try:
    from numba import cuda
except Exception as exc:  # AttributeError 'row_stack' under numpy 2.5, ImportError without numba-cuda
    cuda = None
    IMPORT_ERROR = exc
else:
    IMPORT_ERROR = None

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
