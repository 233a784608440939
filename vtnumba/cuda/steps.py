"""How a GPU MoE step makes its device arrays and enqueues its launches: the steps of
``cuda/experts.py`` and the grouped GEMMs of ``cuda/grouped.py`` go through ``new`` and ``run``.

Binding (``recording``, for ``vtnumba.cuda.bound.bind_moe``): while a thread records, ``new`` hands
out parts of one scratch block (the layer's output aside) and ``run`` keeps the launch instead of
enqueueing it, so one ``moe_fp8`` call becomes a list of launches whose input, output and scratch
pointers a bound call rewrites. A step that cannot be replayed that way (``per_expert`` reads offsets
on the host) raises ``Unbindable`` while recording.

``load()`` imports the GPU modules the steps use, once, and leaves them here as ``moe``,
``grouped_gemm``, ``device``, ``gemm``, ``block`` and ``epilogue`` (importing them at the top would
fail without cupy, where this package must still import).
"""

import threading
from contextlib import contextmanager

import numpy as np

from .. import _arrays
from . import quantize
from .ptx.target import SIMULATOR

moe = grouped_gemm = device = gemm = block = epilogue = None


def load():
    """Import what the GPU path needs, once (quantize._backend raises the one clear error); returns
    kernels/moe.py."""
    global moe, grouped_gemm, device, gemm, block, epilogue
    if moe is None:
        quantize._backend()
        from . import block as block_module
        from . import gemm as gemm_module
        from .kernels import epilogue as epilogue_module
        from .kernels import grouped_gemm as grouped_module
        from .kernels import moe as moe_module
        from .runtime import device as device_module

        grouped_gemm, device, gemm, block, epilogue = (
            grouped_module,
            device_module,
            gemm_module,
            block_module,
            epilogue_module,
        )
        moe = moe_module
    return moe


def array(x):
    """x on the device as a C-contiguous array (numpy under the simulator)."""
    x = quantize._as_device_array(x)
    return x if x.flags.c_contiguous else device.xp.ascontiguousarray(x)


def empty(shape, dtype, make=None):
    """A fresh device array (from ``make(shape, dtype)``, default cupy's); bfloat16 made as uint16
    and viewed (cupy makes no bfloat16)."""
    make = make or device.xp.empty
    dtype = np.dtype(dtype)
    if SIMULATOR or dtype != _arrays.BFLOAT16:
        return make(shape, dtype)
    return make(shape, np.uint16).view(dtype)


def aligned(a):
    """Whether ``a`` starts on a 16-byte boundary (always, under the simulator)."""
    return SIMULATOR or a.data.ptr % 16 == 0


class Unbindable(Exception):
    """Raised while recording by a step a bound call could not replay (the reason is its message)."""


class Recording:
    """A bind in progress on this thread: ``scratch(shape, dtype)`` makes the temporaries, ``output``
    is the layer's result (made apart: the caller allocates it per call), ``launches`` the
    (launch, shared memory bytes) the steps made, in order, not enqueued."""

    def __init__(self, scratch):
        self.scratch = scratch
        self.output = None
        self.launches = []


_RECORDING = threading.local()


@contextmanager
def recording(scratch):
    """Record this thread's MoE steps (module docstring) into a ``Recording`` over ``scratch``."""
    rec = Recording(scratch)
    _RECORDING.active = rec
    try:
        yield rec
    finally:
        _RECORDING.active = None


def active_recording():
    """This thread's ``Recording`` in progress, or None."""
    return getattr(_RECORDING, "active", None)


def new(shape, dtype, output=False):
    """A step's device array: from the recording's scratch while one records (the ``output`` array
    apart), else a fresh one."""
    rec = getattr(_RECORDING, "active", None)
    if rec is None:
        return empty(shape, dtype)
    if output:
        rec.output = empty(shape, dtype)
        return rec.output
    return empty(shape, dtype, rec.scratch)


def run(launch, shared_mem=0):
    """Enqueue ``launch`` (kernel, grid, block, args) on cupy's current stream, or keep it in the
    recording in progress."""
    rec = getattr(_RECORDING, "active", None)
    if rec is not None:
        rec.launches.append((launch, shared_mem))
        return
    kernel, grid, block_dims, args = launch
    kernel(grid, block_dims, *args, shared_mem=shared_mem)


__all__ = [
    "load",
    "array",
    "empty",
    "aligned",
    "new",
    "run",
    "recording",
    "active_recording",
    "Recording",
    "Unbindable",
]
