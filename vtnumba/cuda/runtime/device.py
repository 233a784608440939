"""One record per GPU: everything vtnumba keeps per device, made once and cached.

The model is nvmath-python's ``get_handle`` tier: state that belongs to a device (its compute
capability, its cuBLASLt handle and plans, small device buffers) lives in one object per device,
looked up by the current device's ordinal. ``current()`` is on every call's path: one ordinal query
and one dict lookup.

Under the CUDA simulator there is one record (ordinal -1) whose arrays are numpy arrays.
"""

import threading

import numpy as np

from ... import _format
from ..ptx.codec import hardware_available
from ..ptx.target import SIMULATOR, require_gpu

# The 256 e4m3 values, from the one scalar decoder; a device copy serves ``decode`` by a gather.
DECODE_TABLE = np.array([_format.decode_e4m3_scalar(c) for c in range(256)], dtype=np.float32)

# Host scalars uploaded as device float32 (1,) arrays, per device and value: a layer's weight scale,
# a static activation scale, 1.0 for the f32-staged path. Bounded so that a caller sweeping over
# many values cannot grow it without end (an upload costs a cupy fill, 10+ us; a lookup 0.2 us).
MAX_CACHED_SCALARS = 4096

# Tiny device arrays passed for arguments a kernel variant does not read.
_PLACEHOLDER_SHAPES = {
    "u16": ((1,), np.uint16),
    "f32": ((1,), np.float32),
    "i32": ((1,), np.int32),
    "u8_2d": ((1, 16), np.uint8),
    "u16_2d": ((1, 2), np.uint16),
    "f32_2d": ((1, 1), np.float32),
}

xp = None  # the array module of device arrays: cupy, or numpy under the simulator
_get_device = None  # cupy.cuda.runtime.getDevice
_RECORDS = {}
_RECORDS_LOCK = threading.Lock()


class GpuDevice:
    """A GPU as vtnumba sees it: ``ordinal``, ``name``, ``cc`` (compute capability, a (major, minor)
    tuple), ``sm_count``, ``default_encoder`` ('hardware' where the e4m3 cvt exists), the device's
    ``decode_table``, and its caches (``scalar``, ``placeholder``, ``cublaslt``)."""

    def __init__(self, ordinal):
        self.ordinal = ordinal
        if SIMULATOR:
            self.name, self.cc, self.sm_count = "CUDA simulator", (0, 0), 1
            self.decode_table = DECODE_TABLE
        else:
            props = xp.cuda.runtime.getDeviceProperties(ordinal)
            self.name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            self.cc = (int(props["major"]), int(props["minor"]))
            self.sm_count = int(props["multiProcessorCount"])
            with xp.cuda.Device(ordinal):
                self.decode_table = xp.asarray(DECODE_TABLE)
        self.default_encoder = "hardware" if hardware_available(self.cc) else "portable"
        self._lock = threading.Lock()
        self._scalars = {}
        self._placeholders = {}
        self._cublaslt = None
        # made now, not at first need: a kernel first needing one inside a CUDA graph capture
        # (its warm-up call took another path) could not copy it from the host there
        for kind in _PLACEHOLDER_SHAPES:
            self.placeholder(kind)

    def scalar(self, value):
        """A float32 device array (1,) holding ``value``, uploaded once per device and value, shared
        by every caller: read-only (a static activation's ``q.scale`` is one)."""
        value = np.float32(value)
        key = int(value.view(np.uint32))
        buf = self._scalars.get(key)
        if buf is None:
            with self._lock:
                buf = self._scalars.get(key)
                if buf is None:
                    if len(self._scalars) >= MAX_CACHED_SCALARS:
                        self._scalars.clear()
                    buf = self._scalars[key] = self._upload(np.array([value], dtype=np.float32))
        return buf

    def placeholder(self, kind):
        """A tiny zeroed device array for an argument a kernel variant ignores ('u16', 'f32',
        'i32', 'u8_2d', 'u16_2d')."""
        arr = self._placeholders.get(kind)
        if arr is None:
            shape, dtype = _PLACEHOLDER_SHAPES[kind]
            arr = self._placeholders[kind] = self._upload(np.zeros(shape, dtype=dtype))
        return arr

    def cublaslt(self):
        """This device's cuBLASLt state (handle, plans, workspaces), made on first use."""
        state = self._cublaslt
        if state is None:
            from . import cublaslt

            with self._lock:
                if self._cublaslt is None:
                    self._cublaslt = cublaslt.DeviceState(self)
                state = self._cublaslt
        return state

    def _upload(self, host):
        """A device copy of a small host array, kept for the process: from cupy's own pool, never
        from an allocator a caller routed cupy to for one call (torch's, a graph's private pool)."""
        if SIMULATOR:
            return host
        with xp.cuda.Device(self.ordinal), xp.cuda.using_allocator(xp.get_default_memory_pool().malloc):
            return xp.asarray(host)

    def __repr__(self):
        return f"GpuDevice({self.ordinal}: {self.name}, sm_{self.cc[0]}{self.cc[1]}, {self.sm_count} SMs)"


def _bind():
    """Import what device records need, once; raise the one clear error if the GPU cannot run."""
    global xp, _get_device
    require_gpu()
    if SIMULATOR:
        xp = np
        _get_device = lambda: -1  # noqa: E731
    else:
        import cupy

        xp = cupy
        _get_device = cupy.cuda.runtime.getDevice


def get(ordinal):
    """The record of GPU ``ordinal``."""
    record = _RECORDS.get(ordinal)
    if record is None:
        if xp is None:
            _bind()
        with _RECORDS_LOCK:
            record = _RECORDS.get(ordinal)
            if record is None:
                record = _RECORDS[ordinal] = GpuDevice(ordinal)
    return record


def current():
    """The record of cupy's current device."""
    if _get_device is None:
        _bind()
    ordinal = _get_device()
    record = _RECORDS.get(ordinal)
    return record if record is not None else get(ordinal)


def array_module():
    """cupy (numpy under the simulator), imported once."""
    if xp is None:
        _bind()
    return xp


__all__ = ["GpuDevice", "current", "get", "array_module", "DECODE_TABLE", "MAX_CACHED_SCALARS"]
