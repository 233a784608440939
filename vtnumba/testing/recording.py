"""A recording runtime: the GPU code path run on a machine without a GPU, far enough to count what a
call does on the host.

``with RecordingRuntime() as rt:`` replaces the lowest tier only -- what vtnumba reaches a GPU
through -- and leaves everything above it as it is:

- ``cupy``: a stand-in module whose ndarray is backed by host memory (``.data.ptr`` is the host
  address, so the launcher's real parameter packing writes real pointers), with the stream, device,
  runtime, memory-pool, memory-hook and ``using_allocator`` entry points vtnumba calls. Every array
  an operation makes comes from the current allocator (the default pool's ``malloc`` unless a
  caller routed it), as cupy's do, so the pool's mallocs are the call's device allocations.
- the driver launch, ``cupy.cuda.driver.launchKernel``: each launch is recorded (its function,
  grid, block, dynamic shared memory, stream and parameter pointer), nothing runs.
- module loading, ``cupy.cuda.function.Module``: ``load`` keeps the PTX, ``get_function`` gives a
  fake function with a ``.ptr``. The kernels are still compiled to PTX by Numba (NVVM needs no
  driver; numba-cuda's "current device" is stood in for, docs/DEVICE.md), so ``Kernel._load``'s
  check of the PTX ``.entry`` against Numba's ABI still runs.
- nvmath's ``nvmath.bindings.cublasLt`` (and the ``cublas`` / ``CudaDataType`` enums it is used
  with): every call is recorded, ``matmul`` and ``matmul_desc_set_attribute`` counted apart, and the
  heuristic query answers one plausible algorithm.

Nothing is executed on a device: outputs hold whatever the host memory held. The recorder counts
host work; it never stands in for a run, so no test may read a result computed under it.

``rt.record()`` counts one stretch of calls (``Counts``): kernel launches by kernel name, cuBLASLt
matmuls, cuBLASLt attribute sets, pool allocations, and Python function calls (``sys.setprofile``
'call' events, the stand-ins' frames and everything they call left out: cupy and the driver are
compiled code, whose calls the profiler does not see as Python calls either; a cupy memory hook a
caller entered is the one Python code real cupy would call back, and it goes uncounted here). The
decode calls at the end (``dense_decode``, ``moe_decode``) are the calls the tests pin and the CPU
benchmark times; their own frames are the caller's side, neither counted nor hiding what they call.

vtnumba binds cupy, the driver's launch and cuBLASLt into module globals at their first use and
caches kernels per device, so the stand-ins cannot be taken back out of a process that used them:
run code under a ``RecordingRuntime`` in a process of its own (the tests start a subprocess). This
module is never imported by vtnumba itself: it lives beside the other test helpers.
"""

import ctypes
import enum
import itertools
import math
import os
import re
import sys
import threading
import time
import types
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.array_utils import byte_bounds

__all__ = [
    "RecordingRuntime",
    "Counts",
    "Launch",
    "DENSE_SCHEMES",
    "MOE_SCHEMES",
    "dense_decode",
    "moe_decode",
    "time_call",
]

_ALIGN = 512  # cupy's pool hands out 512-byte aligned blocks: the bound calls' alignment checks see the same


# -- what a recording holds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One ``cuLaunchKernel``: the kernel's name, grid, block, dynamic shared memory, stream pointer,
    the address of the parameter-pointer array, and (when the recording asked) the parameter slots'
    64-bit values at the time of the launch."""

    name: str
    grid: tuple
    block: tuple
    shared_mem: int
    stream: int
    params_address: int
    params: tuple | None = None


@dataclass
class Counts:
    """What one recorded stretch did (``RecordingRuntime.record``)."""

    launches: list = field(default_factory=list)  # Launch, in order
    matmuls: int = 0  # cublasLtMatmul calls
    matmul_pointers: list = field(default_factory=list)  # (A, B, D, stream) of each, cuBLASLt's names
    attribute_sets: int = 0  # cublasLtMatmulDescSetAttribute calls
    attributes: Counter = field(default_factory=Counter)  # attribute name -> sets
    cublaslt_calls: Counter = field(default_factory=Counter)  # every cuBLASLt function -> calls
    allocations: int = 0  # device memory pool mallocs
    allocated_bytes: int = 0
    python_calls: int = 0  # 'call' events outside the recorder's frames
    python_functions: Counter = field(default_factory=Counter)  # "file:function" -> calls

    @property
    def launch_names(self):
        """The launched kernels' names, in order."""
        return [launch.name for launch in self.launches]

    def summary(self):
        """The counts a test pins, as a dict."""
        return {
            "launches": len(self.launches),
            "kernels": tuple(self.launch_names),
            "matmuls": self.matmuls,
            "attribute_sets": self.attribute_sets,
            "allocations": self.allocations,
        }


class _State:
    """The recorder's mutable state, shared by every stand-in (one per runtime)."""

    def __init__(self):
        self.counts = None  # the Counts being recorded into, or None
        self.snapshot_params = False
        self.functions = {}  # fake function ptr -> (entry name, PTX parameter widths)
        self.names = {}  # fake function ptr -> kernel name, resolved at the first launch
        self.local = _Local()


# -- the stand-in cupy: memory ----------------------------------------------------------------------


class MemoryPointer:
    """A "device" pointer: a host address inside ``mem`` (the owning host buffer)."""

    __slots__ = ("mem", "ptr", "device_id")

    def __init__(self, mem, offset):
        self.mem = mem
        self.ptr = mem.ptr + offset
        self.device_id = mem.device_id

    @property
    def device(self):
        return Device(self.device_id)

    def __add__(self, offset):
        return MemoryPointer(self.mem, self.ptr - self.mem.ptr + offset)


class _Memory:
    """A block of host memory standing in for a device allocation (aligned as cupy's pool aligns),
    given back to its pool when the last array on it is gone."""

    __slots__ = ("block", "buffer", "offset", "ptr", "size", "device_id", "pool")

    def __init__(self, block, size, device_id, pool=None):
        self.block = block  # (host buffer, offset of its first aligned byte, that byte's address)
        self.buffer, self.offset, self.ptr = block
        self.size = size
        self.device_id = device_id
        self.pool = pool

    def __del__(self):
        if self.pool is not None:
            self.pool._release(self.block, self.size)


def _host_block(size):
    """(host buffer, offset, address) of ``size`` bytes starting on an ``_ALIGN`` boundary."""
    buffer = np.empty(size + _ALIGN, dtype=np.uint8)
    base = buffer.__array_interface__["data"][0]
    offset = -base % _ALIGN
    return buffer, offset, base + offset


class UnownedMemory:
    """Memory owned by someone else (cupy's ``UnownedMemory``): a pointer and a size."""

    __slots__ = ("ptr", "size", "owner", "device_id")

    def __init__(self, ptr, size, owner, device_id=0):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


def _make_memory_module(state):
    class MemoryHook:
        """cupy's memory hook: ``malloc_preprocess`` / ``malloc_postprocess`` around each pool
        malloc on this thread while the hook is entered."""

        name = "MemoryHook"

        def __enter__(self):
            _hooks(state).append(self)
            return self

        def __exit__(self, *exc):
            _hooks(state).remove(self)

        def malloc_preprocess(self, **kwargs):
            pass

        def malloc_postprocess(self, **kwargs):
            pass

        def free_preprocess(self, **kwargs):
            pass

        def free_postprocess(self, **kwargs):
            pass

    class MemoryPool:
        """cupy's device memory pool: every ``malloc`` is one device allocation to the recorder. As
        cupy's, it rounds sizes up to 512 bytes and hands a freed block of the same size out again
        (last freed, first reused): a block returns to the pool when the last array on it goes, which
        CPython's reference counting makes deterministic, so a call's addresses -- and what the code
        does when an address changes (a cuBLASLt pointer attribute set again) -- are the same run
        after run."""

        def __init__(self, allocator=None):
            self._free = {}  # rounded size -> [host block (_host_block), ...], the last freed last
            self._used = 0

        def malloc(self, size):
            device_id = _current_device(state)
            hooks = _hooks(state)
            for hook in hooks:
                hook.malloc_preprocess(device_id=device_id, size=size, mem_size=size)
            rounded = -(-max(size, 1) // _ALIGN) * _ALIGN
            free = self._free.get(rounded)
            block = free.pop() if free else _host_block(rounded)
            memptr = MemoryPointer(_Memory(block, rounded, device_id, self), 0)
            self._used += rounded
            counts = state.counts
            if counts is not None:
                counts.allocations += 1
                counts.allocated_bytes += size
            for hook in hooks:
                hook.malloc_postprocess(device_id=device_id, size=size, mem_size=rounded, mem_ptr=memptr.ptr, pmem_id=0)
            return memptr

        def _release(self, block, rounded):
            self._used -= rounded
            self._free.setdefault(rounded, []).append(block)

        def used_bytes(self):
            return self._used

        def total_bytes(self):
            return self._used + sum(k * len(v) for k, v in self._free.items())

        def free_all_blocks(self, stream=None):
            self._free.clear()

        def set_limit(self, size=None, fraction=None):
            pass

    return MemoryHook, MemoryPool


class _Local(threading.local):
    """Per-thread state, as cupy keeps it per thread: the current device, the entered streams and
    allocators, the memory hooks (``__init__`` runs once in each thread that reads it)."""

    def __init__(self):
        self.device = 0
        self.streams = []
        self.allocators = []
        self.hooks = []


def _local(state):
    return state.local


def _hooks(state):
    return _local(state).hooks


def _current_device(state):
    return _local(state).device


# -- the stand-in cupy: arrays ----------------------------------------------------------------------


def _unwrap(value):
    """A stand-in array's host numpy array; containers are unwrapped element by element."""
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v) for v in value)
    return value


def _within(a, mem):
    """Whether numpy's ``a`` lies in ``mem`` (a view of it, not a copy numpy made)."""
    if mem is None or a.base is None:
        return False
    if a.size == 0:
        ptr = a.__array_interface__["data"][0]
        return mem.ptr <= ptr <= mem.ptr + mem.size
    low, high = byte_bounds(a)
    return mem.ptr <= low and high <= mem.ptr + max(mem.size, 1)


def _new_from(host):
    """A stand-in array holding a copy of the numpy array ``host`` in a fresh allocation."""
    host = np.asarray(host)
    arr = empty(host.shape, host.dtype)
    if host.size:
        np.copyto(arr._a, host, casting="unsafe")
    return arr


def _wrap(result, mem):
    """An operation's numpy result as a stand-in: a view where it lies in ``mem`` (no allocation, as
    a cupy view makes none), else a copy in a new allocation (an array cupy would have allocated);
    scalars and other values pass as they are."""
    if isinstance(result, np.ndarray):
        if _within(result, mem):
            return ndarray._view(result, mem)
        return _new_from(result)
    if isinstance(result, tuple):
        return tuple(_wrap(r, mem) for r in result)
    if isinstance(result, list):
        return [_wrap(r, mem) for r in result]
    return result


class ndarray(np.lib.mixins.NDArrayOperatorsMixin):  # noqa: N801 -- cupy's name
    """A cupy array whose memory is host memory: ``.data.ptr`` is the host address. Views share the
    memory (no allocation); every other result is a new allocation from the current allocator."""

    __slots__ = ("_a", "_mem", "data", "_c_contiguous", "__weakref__")

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if memptr is None:
            memptr = _allocate(nbytes)
        mem = memptr.mem
        if isinstance(mem, _Memory):
            offset = mem.offset + memptr.ptr - mem.ptr
            a = np.ndarray(shape, dtype, buffer=mem.buffer, offset=offset, strides=strides, order=order)
        else:  # memory someone else owns (UnownedMemory): viewed at its address
            buffer = (ctypes.c_uint8 * nbytes).from_address(memptr.ptr) if nbytes else b""
            a = np.ndarray(shape, dtype, buffer=buffer, strides=strides, order=order)
        self._a = a
        self._mem = mem
        self.data = memptr
        self._c_contiguous = (strides is None and order == "C") or a.flags.c_contiguous

    @classmethod
    def _view(cls, a, mem):
        arr = cls.__new__(cls)
        arr._set(a, mem)
        return arr

    def _set(self, a, mem):
        self._a = a
        self._mem = mem
        self.data = MemoryPointer(mem, a.__array_interface__["data"][0] - mem.ptr)
        self._c_contiguous = a.flags.c_contiguous

    # attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    strides = property(lambda self: self._a.strides)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    ndim = property(lambda self: self._a.ndim)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray._view(self._a.T, self._mem))

    @property
    def device(self):
        return Device(self.data.device_id)

    @property
    def __cuda_array_interface__(self):
        a = self._a
        return {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (self.data.ptr, False),
            "strides": None if self._c_contiguous else a.strides,
            "version": 3,
        }

    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return f"recording.ndarray(shape={self.shape}, dtype={self.dtype}, ptr={self.data.ptr:#x})"

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_unwrap(o) for o in out)
        result = getattr(ufunc, method)(*_unwrap(inputs), **kwargs)
        return out[0] if out is not None and len(out) == 1 else _wrap(result, None)

    # real cupy refuses an implicit host copy; so does the stand-in
    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` instead.")

    def get(self, stream=None, order="C", out=None):
        return np.array(self._a, order=order)

    def __getitem__(self, index):
        return _wrap(self._a[_unwrap(index)], self._mem)

    def __setitem__(self, index, value):
        self._a[_unwrap(index)] = _unwrap(value)

    def view(self, dtype=None):
        return ndarray._view(self._a.view(dtype), self._mem)

    def reshape(self, *shape, order="C"):
        return _wrap(self._a.reshape(*shape, order=order), self._mem)

    def ravel(self, order="C"):
        return _wrap(self._a.ravel(order=order), self._mem)

    def astype(self, dtype, copy=True, **kwargs):
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return _new_from(self._a.astype(dtype, **kwargs))

    def copy(self, order="C"):
        return _new_from(self._a)

    def fill(self, value):
        self._a.fill(value)

    def __getattr__(self, name):
        # the rest of cupy's ndarray API (sum, max, transpose, ...): numpy's, with results wrapped
        if name in ndarray.__slots__:
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return attr

        def method(*args, **kwargs):
            return _wrap(attr(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}), self._mem)

        return method


_RUNTIME = None  # the active RecordingRuntime's state


def _allocate(nbytes):
    """``nbytes`` from the current allocator (the default pool unless ``using_allocator`` routed it).
    An empty array allocates nothing, as in cupy (``bound.bind_moe`` counts on that)."""
    if nbytes == 0:
        return MemoryPointer(_Memory(_host_block(0), 0, _current_device(_RUNTIME)), 0)
    allocators = _local(_RUNTIME).allocators
    allocator = allocators[-1] if allocators else _DEFAULT_POOL[0].malloc
    return allocator(nbytes)


_DEFAULT_POOL = [None]


def empty(shape, dtype=float, order="C"):
    return ndarray(shape, dtype, order=order)


def zeros(shape, dtype=float, order="C"):
    arr = ndarray(shape, dtype, order=order)
    arr._a.fill(0)
    return arr


def ones(shape, dtype=float, order="C"):
    arr = ndarray(shape, dtype, order=order)
    arr._a.fill(1)
    return arr


def full(shape, fill_value, dtype=None, order="C"):
    arr = ndarray(shape, np.asarray(fill_value).dtype if dtype is None else dtype, order=order)
    arr._a.fill(fill_value)
    return arr


def empty_like(a, dtype=None, order="K", shape=None):
    return ndarray(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def zeros_like(a, dtype=None, order="K", shape=None):
    arr = empty_like(a, dtype, order, shape)
    arr._a.fill(0)
    return arr


def asarray(a, dtype=None, order=None, *, blocking=False):
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    if hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray):
        raise TypeError("the recording runtime takes no foreign device arrays")
    return _new_from(np.asarray(a, dtype=dtype, order=order))


def array(a, dtype=None, copy=True, order="K"):
    if isinstance(a, ndarray) and not copy:
        return asarray(a, dtype)
    return _new_from(np.array(_unwrap(a), dtype=dtype, order=order))


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return a if a._c_contiguous else _new_from(np.ascontiguousarray(a._a))


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


def copyto(dst, src, casting="same_kind", where=True):
    np.copyto(dst._a, _unwrap(src), casting=casting, where=_unwrap(where))


def _numpy_function(name):
    fn = getattr(np, name)

    def function(*args, **kwargs):
        return _wrap(fn(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}), None)

    function.__name__ = name
    return function


# -- the stand-in cupy: devices, streams, the driver --------------------------------------------------


class Device:
    """cupy's ``Device``: entering it (or ``use()``) makes it this thread's current device."""

    def __init__(self, device=None):
        self.id = _current_device(_RUNTIME) if device is None else int(device)
        self._previous = []

    @property
    def compute_capability(self):
        major, minor = _RUNTIME_CC[0]
        return f"{major}{minor}"

    def use(self):
        _local(_RUNTIME).device = self.id

    def synchronize(self):
        pass

    def __enter__(self):
        local = _local(_RUNTIME)
        self._previous.append(local.device)
        local.device = self.id
        return self

    def __exit__(self, *exc):
        _local(_RUNTIME).device = self._previous.pop()

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)


_RUNTIME_CC = [(9, 0)]
_STREAM_PTRS = itertools.count(0x7000_0000, 0x100)


class Stream:
    """A cupy stream: a fake handle; ``with stream:`` makes it the current one. ``Stream.null`` is
    the legacy default stream (pointer 0), the current stream until another is entered."""

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=0):
        self.ptr = 0 if null else next(_STREAM_PTRS)
        self.device_id = _current_device(_RUNTIME) if _RUNTIME is not None else 0

    def __enter__(self):
        _local(_RUNTIME).streams.append(self)
        return self

    def __exit__(self, *exc):
        _local(_RUNTIME).streams.pop()

    def use(self):
        streams = _local(_RUNTIME).streams
        if streams:
            streams[-1] = self
        else:
            streams.append(self)
        return self

    def synchronize(self):
        pass

    def record(self, event=None):
        return event if event is not None else Event()

    def wait_event(self, event):
        pass

    def begin_capture(self, mode=None):
        raise RuntimeError("the recording runtime does not capture CUDA graphs")

    def is_capturing(self):
        return False

    def __eq__(self, other):
        return isinstance(other, Stream) and other.ptr == self.ptr

    def __hash__(self):
        return hash(self.ptr)


class ExternalStream(Stream):
    def __init__(self, ptr, device_id=-1):
        self.ptr = int(ptr)
        self.device_id = device_id


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.ptr = next(_STREAM_PTRS)

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


_NULL_STREAM = [None]


def get_current_stream(device_id=-1):
    streams = _local(_RUNTIME).streams
    return streams[-1] if streams else _NULL_STREAM[0]


class using_allocator:  # noqa: N801 -- cupy's name
    """Route this thread's allocations to ``allocator`` inside the block (a class, not a generator:
    cupy's is compiled code, and contextlib's frames would count as the caller's Python calls)."""

    __slots__ = ("allocator",)

    def __init__(self, allocator=None):
        self.allocator = allocator if allocator is not None else _DEFAULT_POOL[0].malloc

    def __enter__(self):
        _local(_RUNTIME).allocators.append(self.allocator)

    def __exit__(self, *exc):
        _local(_RUNTIME).allocators.pop()


def get_allocator():
    allocators = _local(_RUNTIME).allocators
    return allocators[-1] if allocators else _DEFAULT_POOL[0].malloc


class CUDADriverError(RuntimeError):
    pass


class CUDARuntimeError(RuntimeError):
    pass


_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(", re.S)


class _Function:
    """A loaded kernel: a fake ``CUfunction`` (``ptr``), its PTX entry name."""

    _ptrs = itertools.count(0x6000_0000, 0x10)

    def __init__(self, name):
        self.name = name
        self.ptr = next(self._ptrs)


class Module:
    """cupy's ``Module``: ``load`` keeps the PTX (nothing is JIT-compiled), ``get_function`` finds
    its entry and gives a fake function."""

    def __init__(self):
        self.ptx = None

    def load(self, image):
        self.ptx = image.decode().rstrip("\0") if isinstance(image, bytes) else image

    def load_file(self, path):
        with open(path) as f:
            self.ptx = f.read()

    def get_function(self, name):
        if self.ptx is None or name not in _ENTRY.findall(self.ptx):
            raise CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name})")
        from ..cuda.runtime.launch import entry_params

        fn = _Function(name)
        _RUNTIME.functions[fn.ptr] = (name, entry_params(self.ptx)[1])
        return fn


def _kernel_name(state, fn_ptr):
    """The Python name of the kernel behind a fake function: the launch.Kernel that loaded it, else
    the name Numba mangled into the PTX entry."""
    name = state.names.get(fn_ptr)
    if name is None:
        from ..cuda.runtime import launch

        for kernel in list(launch._KERNELS.values()):
            for fn in list(kernel._functions.values()):
                state.names[fn.ptr] = getattr(kernel.pyfunc, "__name__", kernel.name)
        name = state.names.get(fn_ptr)
        if name is None:
            name = state.names[fn_ptr] = _demangle(state.functions.get(fn_ptr, ("?",))[0])
    return name


def _demangle(entry):
    """The last name of an Itanium-mangled Numba entry (``_ZN6cudapy...3fooB2v1...E...``)."""
    if not entry.startswith("_ZN"):
        return entry
    parts, i = [], 3
    while i < len(entry) and entry[i].isdigit():
        j = i
        while entry[j].isdigit():
            j += 1
        n = int(entry[i:j])
        parts.append(entry[j : j + n])
        i = j + n
        while i < len(entry) and entry[i] == "B":  # ABI tags
            j = i + 1
            while entry[j].isdigit():
                j += 1
            i = j + int(entry[i + 1 : j])
    return parts[-1] if parts else entry


def _launch_kernel(f, gx, gy, gz, bx, by, bz, shared_mem, stream, kernel_params, extra):
    """``cuLaunchKernel``, recorded: nothing runs."""
    state = _RUNTIME
    counts = state.counts
    if f not in state.functions:
        raise CUDADriverError("CUDA_ERROR_INVALID_HANDLE: launch of a function that was never loaded")
    if counts is None:
        return
    params = None
    if state.snapshot_params:
        widths = state.functions[f][1]
        pointers = (ctypes.c_uint64 * len(widths)).from_address(kernel_params)
        params = tuple(ctypes.c_uint64.from_address(p).value for p in pointers)
    counts.launches.append(
        Launch(_kernel_name(state, f), (gx, gy, gz), (bx, by, bz), shared_mem, stream, kernel_params, params)
    )


# -- the stand-in cupy: the runtime API ---------------------------------------------------------------


class _PointerAttributes:
    def __init__(self, device):
        self.device = device
        self.type = 2  # cudaMemoryTypeDevice


def _make_runtime_module(state, props):
    rt = types.ModuleType("cupy.cuda.runtime")
    rt.CUDARuntimeError = CUDARuntimeError
    rt.getDevice = lambda: _current_device(state)
    rt.getDeviceCount = lambda: props["count"]
    rt.setDevice = lambda device: setattr(_local(state), "device", int(device))
    rt.getDeviceProperties = lambda ordinal: dict(props["properties"])
    rt.streamIsCapturing = lambda stream_ptr: False
    rt.pointerGetAttributes = lambda ptr: _PointerAttributes(_current_device(state))
    rt.deviceSynchronize = lambda: None
    rt.runtimeGetVersion = lambda: 12080
    rt.driverGetVersion = lambda: 12080

    def memcpy_async(dst, src, size, kind, stream):
        ctypes.memmove(dst, src, size)

    rt.memcpyAsync = memcpy_async
    rt.is_hip = False
    return rt


class _Cupy(types.ModuleType):
    """The stand-in ``cupy``: the functions above, and numpy's others (results wrapped)."""

    def __getattr__(self, name):
        if name.startswith("__") or not callable(getattr(np, name, None)):
            raise AttributeError(f"the recording cupy has no {name!r}")
        fn = _numpy_function(name)
        setattr(self, name, fn)
        return fn


def _make_cupy(state, props):
    memory_hook, memory_pool = _make_memory_module(state)
    cupy = _Cupy("cupy")
    cupy.__file__ = __file__
    cuda = types.ModuleType("cupy.cuda")
    driver = types.ModuleType("cupy.cuda.driver")
    function = types.ModuleType("cupy.cuda.function")
    runtime = _make_runtime_module(state, props)
    memory = types.ModuleType("cupy.cuda.memory")
    hook = types.ModuleType("cupy.cuda.memory_hook")

    driver.launchKernel = _launch_kernel
    driver.CUDADriverError = CUDADriverError
    function.Module = Module
    function.Function = _Function
    memory.MemoryPointer = MemoryPointer
    memory.UnownedMemory = UnownedMemory
    memory.MemoryPool = memory_pool
    hook.MemoryHook = memory_hook

    for name, value in {
        "driver": driver,
        "function": function,
        "runtime": runtime,
        "memory": memory,
        "memory_hook": hook,
        "Device": Device,
        "Stream": Stream,
        "ExternalStream": ExternalStream,
        "Event": Event,
        "get_current_stream": get_current_stream,
        "using_allocator": using_allocator,
        "get_allocator": get_allocator,
        "MemoryPointer": MemoryPointer,
        "UnownedMemory": UnownedMemory,
        "MemoryPool": memory_pool,
        "MemoryHook": memory_hook,
        "is_available": lambda: True,
    }.items():
        setattr(cuda, name, value)

    pool = _DEFAULT_POOL[0] = memory_pool()
    _NULL_STREAM[0] = Stream(null=True)
    Stream.null = _NULL_STREAM[0]
    for name, value in {
        "cuda": cuda,
        "ndarray": ndarray,
        "empty": empty,
        "zeros": zeros,
        "ones": ones,
        "full": full,
        "empty_like": empty_like,
        "zeros_like": zeros_like,
        "asarray": asarray,
        "array": array,
        "ascontiguousarray": ascontiguousarray,
        "asnumpy": asnumpy,
        "copyto": copyto,
        "get_default_memory_pool": lambda: pool,
        "get_default_pinned_memory_pool": lambda: pool,
        "dtype": np.dtype,
        "__version__": "13.0.0-recording",
    }.items():
        setattr(cupy, name, value)
    for name in ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "float32"):
        setattr(cupy, name, getattr(np, name))
    cupy.float64 = np.float64
    cupy.bool_ = np.bool_
    return {
        "cupy": cupy,
        "cupy.cuda": cuda,
        "cupy.cuda.driver": driver,
        "cupy.cuda.function": function,
        "cupy.cuda.runtime": runtime,
        "cupy.cuda.memory": memory,
        "cupy.cuda.memory_hook": hook,
    }


# -- the stand-in nvmath: cuBLASLt ------------------------------------------------------------------


class cuBLASLtError(RuntimeError):  # noqa: N801 -- nvmath's name
    pass


def _enum(name, members):
    return enum.IntEnum(name, {m: i for i, m in enumerate(members)})


_DESC_ATTRS = _enum(
    "MatmulDescAttribute",
    [
        "COMPUTE_TYPE",
        "SCALE_TYPE",
        "POINTER_MODE",
        "TRANSA",
        "TRANSB",
        "TRANSC",
        "FILL_MODE",
        "EPILOGUE",
        "BIAS_POINTER",
        "BIAS_BATCH_STRIDE",
        "EPILOGUE_AUX_POINTER",
        "EPILOGUE_AUX_LD",
        "A_SCALE_POINTER",
        "B_SCALE_POINTER",
        "C_SCALE_POINTER",
        "D_SCALE_POINTER",
        "AMAX_D_POINTER",
        "FAST_ACCUM",
        "BIAS_DATA_TYPE",
        "A_SCALE_MODE",
        "B_SCALE_MODE",
        "C_SCALE_MODE",
        "D_SCALE_MODE",
    ],
)
_POINTER_ATTRS = {"BIAS_POINTER", "EPILOGUE_AUX_POINTER", "A_SCALE_POINTER", "B_SCALE_POINTER"}
_POINTER_ATTRS |= {"C_SCALE_POINTER", "D_SCALE_POINTER", "AMAX_D_POINTER"}
_PREF_ATTRS = _enum(
    "MatmulPreferenceAttribute",
    [
        "SEARCH_MODE",
        "MAX_WORKSPACE_BYTES",
        "MIN_ALIGNMENT_A_BYTES",
        "MIN_ALIGNMENT_B_BYTES",
        "MIN_ALIGNMENT_C_BYTES",
        "MIN_ALIGNMENT_D_BYTES",
    ],
)
# cublasLtMatmulHeuristicResult_t: the algorithm (64 opaque bytes) first, as cuBLASLt lays it out
_HEURISTIC_DTYPE = np.dtype(
    [("algo", np.uint64, 8), ("workspace_size", np.uint64), ("state", np.int32), ("waves_count", np.float32)]
    + [("reserved", np.int32, 4)],
    align=True,
)


def _make_nvmath(state, version):
    handles = itertools.count(0x5000_0000, 0x10)

    def recorded(name, fn=None):
        def call(*args):
            counts = state.counts
            if counts is not None:
                counts.cublaslt_calls[name] += 1
            return fn(*args) if fn is not None else next(handles)

        call.__name__ = name
        return call

    def desc_set_attribute(desc, attr, buf, size):
        counts = state.counts
        if counts is not None:
            counts.cublaslt_calls["matmul_desc_set_attribute"] += 1
            counts.attribute_sets += 1
            counts.attributes[_DESC_ATTRS(attr).name] += 1

    def heuristic(handle, desc, la, lb, lc, ld, pref, requested, results_ptr, count_ptr):
        result = np.zeros(1, dtype=_HEURISTIC_DTYPE)
        result["waves_count"] = 1.0
        ctypes.memmove(results_ptr, result.ctypes.data, min(_HEURISTIC_DTYPE.itemsize, result.nbytes))
        ctypes.c_int32.from_address(count_ptr).value = 1

    def matmul(
        handle, desc, alpha, a, layout_a, b, layout_b, beta, c, layout_c, d, layout_d, algo, ws, ws_bytes, stream
    ):
        counts = state.counts
        if counts is not None:
            counts.cublaslt_calls["matmul"] += 1
            counts.matmuls += 1
            counts.matmul_pointers.append((a, b, d, stream))

    def nothing(*args):
        return None

    lt = types.ModuleType("nvmath.bindings.cublasLt")
    lt.cuBLASLtError = cuBLASLtError
    lt.MatmulDescAttribute = _DESC_ATTRS
    lt.MatmulPreferenceAttribute = _PREF_ATTRS
    lt.MatmulMatrixScale = _enum(
        "MatmulMatrixScale",
        ["SCALAR_32F", "VEC16_UE4M3", "VEC32_UE8M0", "OUTER_VEC_32F", "VEC128_32F", "BLK128x128_32F"],
    )
    lt.Epilogue = enum.IntEnum("Epilogue", {"DEFAULT": 1, "RELU": 2, "BIAS": 4, "RELU_BIAS": 6, "GELU": 32})
    lt.matmul_heuristic_result_dtype = _HEURISTIC_DTYPE
    lt.get_matmul_desc_attribute_dtype = lambda attr: np.dtype(
        np.uint64 if _DESC_ATTRS(attr).name in _POINTER_ATTRS else np.int32
    )
    lt.get_matmul_preference_attribute_dtype = lambda attr: np.dtype(
        np.uint64 if _PREF_ATTRS(attr).name == "MAX_WORKSPACE_BYTES" else np.uint32
    )
    lt.get_version = lambda: version
    lt.create = recorded("create")
    lt.destroy = recorded("destroy", nothing)
    lt.matmul_desc_create = recorded("matmul_desc_create")
    lt.matmul_desc_destroy = recorded("matmul_desc_destroy", nothing)
    lt.matmul_desc_set_attribute = desc_set_attribute
    lt.matrix_layout_create = recorded("matrix_layout_create")
    lt.matrix_layout_destroy = recorded("matrix_layout_destroy", nothing)
    lt.matrix_layout_set_attribute = recorded("matrix_layout_set_attribute", nothing)
    lt.matmul_preference_create = recorded("matmul_preference_create")
    lt.matmul_preference_destroy = recorded("matmul_preference_destroy", nothing)
    lt.matmul_preference_set_attribute = recorded("matmul_preference_set_attribute", nothing)
    lt.matmul_algo_get_heuristic = recorded("matmul_algo_get_heuristic", heuristic)
    lt.matmul = matmul

    cublas = types.ModuleType("nvmath.bindings.cublas")
    cublas.ComputeType = _enum("ComputeType", ["COMPUTE_16F", "COMPUTE_32F", "COMPUTE_64F", "COMPUTE_32I"])
    cublas.Operation = enum.IntEnum("Operation", {"N": 0, "T": 1, "C": 2})

    bindings = types.ModuleType("nvmath.bindings")
    bindings.cublas, bindings.cublasLt = cublas, lt
    nvmath = types.ModuleType("nvmath")
    nvmath.__file__ = __file__
    nvmath.bindings = bindings
    nvmath.CudaDataType = enum.IntEnum(
        "CudaDataType", {"CUDA_R_16F": 2, "CUDA_R_32F": 0, "CUDA_R_16BF": 14, "CUDA_R_8F_E4M3": 28}
    )
    return {
        "nvmath": nvmath,
        "nvmath.bindings": bindings,
        "nvmath.bindings.cublas": cublas,
        "nvmath.bindings.cublasLt": lt,
    }


# -- the runtime ------------------------------------------------------------------------------------


class RecordingRuntime:
    """The stand-ins above in ``sys.modules`` for the duration of a ``with`` block (see the module
    docstring): a GPU of compute capability ``cc`` with ``sm_count`` SMs, cuBLASLt ``version``."""

    def __init__(self, cc=(9, 0), sm_count=132, name="recording stand-in (no GPU)", cublaslt_version=130100, count=1):
        self.cc = tuple(cc)
        self.props = {
            "count": count,
            "properties": {"name": name.encode(), "major": cc[0], "minor": cc[1], "multiProcessorCount": sm_count},
        }
        self.cublaslt_version = cublaslt_version
        self._state = _State()
        self._saved = None

    def __enter__(self):
        global _RUNTIME
        if _RUNTIME is not None:
            raise RuntimeError("a RecordingRuntime is already active in this process")
        from ..cuda.ptx.target import SIMULATOR

        if SIMULATOR:
            raise RuntimeError("the recording runtime stands in for a GPU, not for the CUDA simulator")
        for name in ("cupy", "nvmath"):
            if name in sys.modules and not getattr(sys.modules[name], "__file__", "") == __file__:
                raise RuntimeError(f"the real {name} is already imported: record in a process of its own")
        _RUNTIME, _RUNTIME_CC[0] = self._state, self.cc
        modules = {**_make_cupy(self._state, self.props), **_make_nvmath(self._state, self.cublaslt_version)}
        import numba.cuda.dispatcher as dispatcher

        class _Device:  # numba-cuda compiles device functions for "the current device" (DEVICE.md)
            compute_capability = self.cc

        self._saved = ({name: sys.modules.get(name) for name in modules}, dispatcher.get_current_device)
        sys.modules.update(modules)
        dispatcher.get_current_device = lambda: _Device()
        return self

    def __exit__(self, *exc):
        global _RUNTIME
        import numba.cuda.dispatcher as dispatcher

        saved, dispatcher.get_current_device = self._saved
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        _RUNTIME = None

    def record(self, *, python_calls=True, snapshot_params=False):
        """Count what the ``with`` block does into the ``Counts`` it yields: ``python_calls`` runs
        the profiler (it slows the block), ``snapshot_params`` keeps each launch's parameter values."""
        return _Recording(self._state, python_calls, snapshot_params)


class _Recording:
    """``RecordingRuntime.record``'s context manager (a class of this file, so that entering and
    leaving it are the recorder's frames, not counted calls)."""

    def __init__(self, state, python_calls, snapshot_params):
        self.state, self.python_calls, self.snapshot_params = state, python_calls, snapshot_params
        self.previous = None

    def __enter__(self):
        state = self.state
        if state.counts is not None:
            raise RuntimeError("record() blocks do not nest")
        counts = state.counts = Counts()
        state.snapshot_params = self.snapshot_params
        if self.python_calls:
            self.previous = sys.getprofile()
            sys.setprofile(_CallCounter(counts))
        return counts

    def __exit__(self, *exc):
        if self.python_calls:
            sys.setprofile(self.previous)
        self.state.counts = None
        self.state.snapshot_params = False


class _CallCounter:
    """A ``sys.setprofile`` function counting 'call' events outside the recorder's frames: a frame
    whose code is this file, and every call made below it, is the stand-ins' work, not vtnumba's."""

    def __init__(self, counts):
        self.counts = counts
        self.depth = 0  # how many recorder frames are on the stack

    def __call__(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename == _THIS_FILE:
                if code not in _HARNESS:
                    self.depth += 1
            elif not self.depth:
                self.counts.python_calls += 1
                self.counts.python_functions[f"{os.path.basename(code.co_filename)}:{code.co_name}"] += 1
        elif event == "return" and self.depth:
            code = frame.f_code
            if code.co_filename == _THIS_FILE and code not in _HARNESS:
                self.depth -= 1


_THIS_FILE = _CallCounter.__call__.__code__.co_filename  # as the profiler sees this module's frames


def time_call(fn, *, repeat=2000, rounds=7):
    """Best-of-``rounds`` host microseconds per ``fn()`` over ``repeat`` calls each."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1e6


# -- the decode calls whose host work is pinned (tests/test_host_counts.py) and timed
# (benchmarks/cpu/bench_host_cost.py): one definition, so the two always speak of the same call ------

DENSE_SCHEMES = ("static", "dynamic", "per_token", "per_group")
MOE_SCHEMES = ("static", "dynamic", "per_token", "per_group")


def _bf16_on_device(cupy, host):
    """A bfloat16 host array on the device, as callers move one (cupy has no bfloat16: its bits)."""
    import ml_dtypes

    bits = np.ascontiguousarray(host.astype(ml_dtypes.bfloat16)).view(np.uint16)
    return cupy.asarray(bits).view(ml_dtypes.bfloat16)


class DecodeCall:
    """One decode-sized layer call and its inputs: ``call()`` runs it through the seam on ``x`` (the
    path a cupy caller takes); ``enqueue()`` is its bound call's ``enqueue`` with y and the scratch
    allocated beforehand -- what the torch modules run per call after their two ``torch.empty``
    (``vtnumba.torch.custom_ops._run_bound`` / ``_moe_bound``) -- available once bound. ``other_x``
    is a second activation of the same signature at another address (``use`` switches to it)."""

    def __init__(self, run, bound_of, x, other_x, owner=None):
        self._run, self._bound_of, self.x, self.other_x = run, bound_of, x, other_x
        self.owner = owner  # what holds the bound calls (``seam.explain(owner)`` says what they run)
        self.current = x
        self.bound = None
        self._enqueue = None

    def call(self):
        return self._run(self.current)

    def use(self, x):
        self.current = x

    def bind(self):
        """Call twice (the first runs the full path and binds, the second is bound) and keep the
        binding."""
        self.call()
        self.call()
        self.bound, self._enqueue = self._bound_of()
        return self.bound

    def enqueue(self):
        return self._enqueue()

    def graph_enqueue(self):
        """The enqueue of what a CUDA graph capture of this call records (at decode the split path,
        not the eager call's fused launch), with its y and scratch allocated beforehand."""
        return self._bound_of("graph")[1]


def dense_decode(cupy, scheme, m=1, n=256, k=256, seed=0):
    """``seam.matmul_fp8(x, w)`` at decode: x [m, k] bfloat16 on the device, w a host ``Fp8Weight``
    [n, k] of activation ``scheme`` (per_group: 128 x 128 blocks; per_token: per-channel weight
    scales), no bias."""
    from .. import seam

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    opts = {
        "static": dict(activation_scheme="static", input_scale=np.float32(0.02)),
        "dynamic": dict(activation_scheme="dynamic"),
        "per_token": dict(activation_scheme="per_token", per_channel=True),
        "per_group": dict(block_size=(128, 128)),
    }[scheme]
    weight = seam.Fp8Weight.from_float(w, **opts)
    x, other = (_bf16_on_device(cupy, rng.standard_normal((m, k))) for _ in range(2))

    def run(x):
        return seam.matmul_fp8(x, weight)

    def bound_of(regime="eager"):
        (binding,) = weight.bound_calls.values()
        # what an eager call replays, or what a CUDA graph capture of the call records
        bound = binding.graph if regime == "graph" else binding.eager
        y = cupy.empty(bound.out_shape, dtype=bound.out_dtype)
        scratch = cupy.empty(bound.scratch_bytes, dtype=np.uint8) if bound.scratch_bytes else None
        stream = cupy.cuda.get_current_stream().ptr
        x_ptr, y_ptr, s_ptr = x.data.ptr, y.data.ptr, 0 if scratch is None else scratch.data.ptr
        return bound, lambda: bound.enqueue(x_ptr, y_ptr, s_ptr, stream)

    return DecodeCall(run, bound_of, x, other, owner=weight)


def moe_decode(cupy, scheme, experts=8, hidden=256, intermediate=256, top_k=2, seed=0):
    """``seam.moe_fp8`` at one token: x [1, hidden] bfloat16, ``experts`` resident experts of
    activation ``scheme`` (gate_up [E, 2I, H], down [E, H, I]), ``top_k`` of them routed."""
    from .. import seam
    from ..seam import experts as seam_experts

    rng = np.random.default_rng(seed)
    opts = {
        "static": dict(input_scale=list(np.linspace(0.008, 0.012, experts))),
        "dynamic": dict(),
        "per_token": dict(activation_scheme="per_token", per_channel=True),
        "per_group": dict(block_size=(128, 128)),
    }[scheme]
    e, h, i = experts, hidden, intermediate
    gate_up = seam.Fp8Experts.from_float((rng.standard_normal((e, 2 * i, h)) / np.sqrt(h)).astype(np.float32), **opts)
    down = seam.Fp8Experts.from_float((rng.standard_normal((e, h, i)) / np.sqrt(i)).astype(np.float32), **opts)
    gate_up, down = seam.ResidentFp8(gate_up, "cuda:0"), seam.ResidentFp8(down, "cuda:0")
    x, other = (_bf16_on_device(cupy, rng.standard_normal((1, h))) for _ in range(2))
    ids = cupy.asarray(rng.choice(e, size=(1, top_k), replace=False).astype(np.int64))
    weights = cupy.asarray(rng.uniform(0.1, 1.0, size=(1, top_k)).astype(np.float32))

    def run(x):
        return seam.moe_fp8(x, gate_up, down, ids, weights)

    def bound_of(regime="eager"):  # one MoE binding serves both regimes
        (bound,) = seam_experts._bound_holder(gate_up).bound_calls.values()
        y = cupy.empty(bound.out_shape, dtype=np.uint16)
        scratch = cupy.empty(max(bound.scratch_bytes, 1), dtype=np.uint8)
        stream = cupy.cuda.get_current_stream().ptr
        ptrs = (x.data.ptr, ids.data.ptr, weights.data.ptr, y.data.ptr, scratch.data.ptr, stream)
        return bound, lambda: bound.enqueue(*ptrs)

    return DecodeCall(run, bound_of, x, other, owner=gate_up)


def _codes(*functions):
    """The code objects of ``functions`` and of every function defined inside them."""
    found, todo = set(), [f.__code__ for f in functions]
    while todo:
        code = todo.pop()
        found.add(code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return frozenset(found)


# The decode calls' own frames (DecodeCall's methods and the closures the builders make): the caller's
# side of the call, neither counted (they are the test's harness, not vtnumba) nor hiding the vtnumba
# calls below them (they are not stand-ins).
_HARNESS = _codes(DecodeCall.call, DecodeCall.enqueue, dense_decode, moe_decode)
