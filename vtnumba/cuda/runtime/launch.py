"""Cheap kernel launches: compile with Numba, load with cupy, launch through the CUDA driver.

Why: a numba-cuda launch with cupy arrays costs ~96 us of host time, and none of numba-cuda's own
launch paths gets under ~25 us (ANCHORS.md), while an FP8 layer's GPU work at decode is 4-30 us.
So vtnumba compiles a kernel once per (kernel, signature, device) with Numba to PTX, loads that
PTX with cupy (``cupy.cuda.function.Module``) and launches it with ``cuLaunchKernel`` on cupy's
*current* stream, so CUDA graphs capture it on a cupy stream like any cupy kernel.

The launch itself packs the flattened parameters into one buffer with one ``struct.pack_into``
and calls ``cuLaunchKernel`` through cupy's driver binding (``cupy.cuda.driver.launchKernel``).

The API (for every vtnumba GPU module)::

    from vtnumba.cuda.launch import compile_kernel
    from vtnumba.cuda.target import cuda, types

    def my_kernel(x, out, alpha):          # plain Python, @cuda.jit kernel body
        ...

    kernel = compile_kernel(my_kernel, (types.float32[::1], types.uint8[:, ::1], types.float32))
    kernel(grid, block, x, out, 0.5)                      # x, out: cupy arrays
    kernel(grid, block, x, out, 0.5, shared_mem=4096)     # dynamic shared memory, bytes

- ``signature`` is a tuple of Numba types, fixed at compile time (no per-call type inference).
  Array arguments must match their declared dtype and rank (the caller's job: the launcher does
  not type-check, only counts); a ``C`` layout (``[::1]``, ``[:, ::1]``) is a promise the caller
  keeps. Scalars are converted to the declared C type (Python or numpy numbers).
- Arrays are cupy arrays, any object with ``__cuda_array_interface__`` (torch tensors), or a
  ``Buffer(ptr, shape, strides)`` (the cheapest: no view object is made).
- ``grid`` / ``block`` are ints or tuples of up to 3 ints.
- The launch goes to cupy's current stream (``with stream:``), never synchronizes, and works
  inside ``stream.begin_capture()`` / ``end_capture()``. Compile and load happen at the first
  launch on a device: warm a kernel up before capturing a graph.
- Under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) the same call runs Numba's own dispatcher
  with numpy arrays, so kernels are testable without a GPU.

The array ABI: Numba flattens each array argument into ``meminfo, parent, nitems, itemsize, data,
shape[0..ndim), strides[0..ndim)`` (all 64-bit; strides in bytes). ``compile_kernel`` checks the
count and widths against the ``.entry`` parameter list of the PTX it compiled, so a change of
Numba's ABI fails loudly at load time instead of launching garbage. Under numba-cuda-mlir
(``VTNUMBA_CUDA_TARGET``, ``ptx/target.py``) an array is its MLIR memref descriptor instead:
``allocated pointer, aligned pointer, offset, shape[0..ndim), strides[0..ndim)``, strides in
elements (``_MemrefArg``); the same check holds it to that.

Import trap (numba-cuda 0.30): its import hook ``_numba_cuda_redirector`` treats every module name
containing "numba.cuda" -- "vtnumba.cuda.launch" does -- as part of numba.cuda and recurses until
RecursionError; ``vtnumba/__init__.py`` installs a finder for ``vtnumba.cuda*`` ahead of it.
"""

import re
import struct
import threading
from collections import namedtuple

import numpy as np

from ... import _faults
from ..ptx.target import MLIR, SIMULATOR, cuda, require_gpu, types

_LAUNCH = _faults.register("cuda.launch", "a kernel launch (cuLaunchKernel), bound or not")

# Scalar types a kernel may take: their struct code in an 8-byte parameter slot, and their width.
# (explicit codes: numpy's int64 char 'l' is 4 bytes in struct's standard sizes)
_SCALARS = {
    types.float32: ("f4x", 4),
    types.float64: ("d", 8),
    types.int8: ("b7x", 1),
    types.int16: ("h6x", 2),
    types.int32: ("i4x", 4),
    types.int64: ("q", 8),
    types.uint8: ("B7x", 1),
    types.uint16: ("H6x", 2),
    types.uint32: ("I4x", 4),
    types.uint64: ("Q", 8),
    types.boolean: ("?7x", 1),
}
# PTX parameter widths, in bytes (bools travel as a byte; .u8 appears for them)
_PTX_PARAM_BYTES = {
    "u8": 1,
    "s8": 1,
    "b8": 1,
    "u16": 2,
    "s16": 2,
    "b16": 2,
    "u32": 4,
    "s32": 4,
    "b32": 4,
    "f32": 4,
    "u64": 8,
    "s64": 8,
    "b64": 8,
    "f64": 8,
}
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\((.*?)\)", re.S)
_PARAM = re.compile(r"\.param\s+\.(\w+)")


# numba-cuda-mlir 0.6.0's dynamic shared memory (``cuda.shared.array(0, ...)``): MLIR's
# ``gpu.dynamic_shared_memory`` becomes a zero-sized global of the module's own, which NVVM writes as
# a one-byte *static* shared variable (``.shared .align 16 .b8 __dynamic_shmem__0;``, often
# "demoted" into the kernel's body) instead of the extern array the dynamic region begins at. ptxas
# then places it among the kernel's static shared arrays (at offset 0, before them), so the dynamic
# array's elements are those arrays' bytes: the fused GEMV's x codes overwrote its scales (G3, err
# inf), the MoE align's counters its scan (docs/DEVICE.md, reproducer 9).
_MLIR_DYNAMIC_SHARED = re.compile(
    r"^[ \t]*(?:\.visible[ \t]+)?\.shared[ \t]+(\.align[ \t]+\d+[ \t]+)?\.b8[ \t]+"
    r"(__dynamic_shmem__\d+)(?:\[\d*\])?[ \t]*;[ \t]*\n",
    re.M,
)
_ADDRESS_SIZE = re.compile(r"^\.address_size[ \t]+\d+[ \t]*\n", re.M)


def extern_dynamic_shared(ptx):
    """``ptx`` with numba-cuda-mlir's dynamic shared variables declared as numba-cuda declares its
    own, ``.extern .shared .align A .b8 NAME[];`` at module scope (see ``_MLIR_DYNAMIC_SHARED``): the
    dynamic region then starts past every static array. PTX without them is returned unchanged."""
    found = _MLIR_DYNAMIC_SHARED.findall(ptx)
    if not found:
        return ptx
    ptx = _MLIR_DYNAMIC_SHARED.sub("", ptx)
    decls = "".join(f".extern .shared {align or ''}.b8 {name}[];\n" for align, name in dict.fromkeys(found))
    module = _ADDRESS_SIZE.search(ptx)
    if module is None:
        raise RuntimeError("numba-cuda-mlir's PTX has no .address_size line to declare its dynamic shared memory after")
    return ptx[: module.end()] + decls + ptx[module.end() :]


_ENTRY_BODY = re.compile(r"\.entry\s+[^(]+\([^)]*\)[^{]*")


def with_cluster_dims(ptx, dims):
    """``ptx`` with its one kernel declaring the thread block cluster ``dims`` (x, y, z) at compile
    time, ``.reqnctapercluster`` before its body: a plain cuLaunchKernel then runs its blocks in
    clusters of that shape (what CUDA C++'s ``__cluster_dims__`` emits; sm_90 on), and the grid must
    divide by it."""
    found = _ENTRY_BODY.search(ptx)
    if found is None:
        raise RuntimeError("compiled PTX has no .entry to declare a cluster shape for")
    directive = ".reqnctapercluster {}, {}, {}\n".format(*dims)
    return ptx[: found.end()] + directive + ptx[found.end() :]


Buffer = namedtuple("Buffer", "ptr shape strides")
Buffer.__doc__ = """A device buffer seen as an array argument: data pointer, shape and strides in bytes.
Cheaper to make than a cupy view, e.g. ``Buffer(a.data.ptr, (a.size,), (a.itemsize,))`` passes a
C-contiguous cupy array of any shape (and any dtype of the kernel's itemsize) as a flat 1-D array."""


def _array_ptr_shape_strides(arr):
    """(data pointer, shape, strides in bytes) of a cupy array or a __cuda_array_interface__ object."""
    data = getattr(arr, "data", None)
    ptr = getattr(data, "ptr", None)
    if ptr is not None:  # cupy.ndarray: attribute reads only, the cheap path
        return ptr, arr.shape, arr.strides
    cai = arr.__cuda_array_interface__
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    if strides is None:  # C-contiguous by the interface's definition
        itemsize = np.dtype(cai["typestr"]).itemsize
        strides, step = [], itemsize
        for extent in reversed(shape):
            strides.append(step)
            step *= extent
        strides = tuple(reversed(strides))
    return cai["data"][0], shape, tuple(strides)


class _ArrayArg:
    __slots__ = ("ndim", "itemsize", "code")
    data_slot = 4  # the parameter, among the array's, that holds its data pointer

    def __init__(self, arrtype):
        self.ndim = arrtype.ndim
        self.itemsize = arrtype.dtype.bitwidth // 8
        self.code = "qqqqQ" + "q" * (2 * self.ndim)

    def flatten(self, arr, out):
        ptr, shape, strides = arr if type(arr) is Buffer else _array_ptr_shape_strides(arr)
        if self.ndim == 1 and len(shape) == 1:  # the common case, in one step
            out += (0, 0, shape[0], self.itemsize, ptr, shape[0], strides[0])
            return
        if len(shape) != self.ndim:
            raise ValueError(f"array argument must be {self.ndim}-D, got shape {tuple(shape)}")
        nitems = 1
        for extent in shape:
            nitems *= extent
        out += (0, 0, nitems, self.itemsize, ptr)  # meminfo and parent are unused on the device
        out += shape
        out += strides

    @property
    def ptx_widths(self):
        return [8] * (5 + 2 * self.ndim)


class _MemrefArg(_ArrayArg):
    """An array argument under numba-cuda-mlir: the memref descriptor MLIR lowers it to (allocated
    and aligned pointer, offset in elements, shape, strides in elements). The kernel reads the
    aligned pointer; the allocated one (for deallocation, which a kernel never does) is the same
    pointer, and ``PreparedLaunch.set_arg`` replaces only the aligned one."""

    __slots__ = ()
    data_slot = 1

    def __init__(self, arrtype):
        super().__init__(arrtype)
        self.code = "QQq" + "q" * (2 * self.ndim)

    def flatten(self, arr, out):
        ptr, shape, strides = arr if type(arr) is Buffer else _array_ptr_shape_strides(arr)
        if len(shape) != self.ndim:
            raise ValueError(f"array argument must be {self.ndim}-D, got shape {tuple(shape)}")
        size = self.itemsize
        if any(s % size for s in strides):
            raise ValueError(f"array strides {tuple(strides)} are not multiples of the element size {size}")
        out += (ptr, ptr, 0)
        out += shape
        out += tuple(s // size for s in strides)

    @property
    def ptx_widths(self):
        return [8] * (3 + 2 * self.ndim)


class _ScalarArg:
    __slots__ = ("width", "code")

    def __init__(self, scalartype):
        self.code, self.width = _SCALARS[scalartype]

    def flatten(self, value, out):
        out.append(value)  # struct.pack_into converts it to the parameter's C type

    @property
    def ptx_widths(self):
        return [self.width]


def _arg_plan(signature):
    plan = []
    for t in signature:
        if isinstance(t, types.Array):
            plan.append(_MemrefArg(t) if MLIR else _ArrayArg(t))
        elif t in _SCALARS:
            plan.append(_ScalarArg(t))
        else:
            raise TypeError(f"kernel argument types must be arrays or {sorted(map(str, _SCALARS))}, got {t}")
    return plan


def entry_params(ptx):
    """(entry name, [param widths in bytes]) of the single kernel in ``ptx``."""
    entries = _ENTRY.findall(ptx)
    if len(entries) != 1:
        raise RuntimeError(f"compiled PTX must hold exactly one .entry, found {len(entries)}")
    name, params = entries[0]
    return name, [_PTX_PARAM_BYTES[p] for p in _PARAM.findall(params)]


class Kernel:
    """A kernel compiled once per device and launched through the CUDA driver (see the module
    docstring)."""

    def __init__(self, pyfunc, signature, *, lineinfo=False, launch_bounds=None, arch="", cluster=None):
        self.pyfunc = pyfunc
        self.signature = tuple(signature)
        self.name = getattr(pyfunc, "__qualname__", repr(pyfunc))
        self._plan = _arg_plan(self.signature)
        self._lineinfo = lineinfo
        # (max threads per block, min resident blocks per SM): ptxas then caps the registers
        self._launch_bounds = launch_bounds
        # "a": the arch-specific target (sm_90a), for instructions only it has (ptx/sm90_wgmma.py); its PTX
        # loads on that exact compute capability only
        self._arch = arch
        # (x, y, z): blocks a thread block cluster, declared in the PTX (``with_cluster_dims``)
        self._cluster = cluster
        self._functions = {}  # device id -> cupy Function (it keeps its module loaded)
        self._lock = threading.Lock()
        self._dispatcher = None  # simulator only
        # Every parameter gets its own 8-byte slot of one buffer, packed by one struct call; the
        # driver reads each parameter through its pointer with the width the kernel declares.
        # (cupy's Function converts each argument to a numpy scalar: ~1 us each, 26 us for the
        # 23 parameters of a quantize kernel on the H200's host.)
        self._format = "<" + "".join(arg.code for arg in self._plan)
        nparams = struct.calcsize(self._format) // 8
        self._slots = np.zeros(nparams, dtype=np.uint64)
        self._slot_bytes = memoryview(self._slots).cast("B")
        base = self._slots.ctypes.data
        self._param_ptrs = np.array([base + 8 * i for i in range(nparams)], dtype=np.uint64)
        self._param_ptrs_address = self._param_ptrs.ctypes.data

    # -- compile and load -------------------------------------------------------------------
    def ptx(self, cc):
        """PTX for compute capability ``cc`` (a (major, minor) tuple; with ``arch``, its
        arch-specific target)."""
        cc = (cc[0], cc[1], self._arch) if self._arch else tuple(cc)
        ptx, _ = cuda.compile(
            self.pyfunc,
            self.signature,
            device=False,
            abi="numba",
            cc=cc,
            output="ptx",
            lineinfo=self._lineinfo,
            launch_bounds=self._launch_bounds,
        )
        # numba-cuda-mlir 0.6.0 ends its PTX for compute capability 10.0 on (sm_12x included) with
        # NVVM's C-string terminator; the driver stops there, but ptxas reads a file with it as a
        # truncated statement ("Unexpected EOF", docs/DEVICE.md)
        ptx = ptx.rstrip("\x00")
        if self._cluster is not None:
            ptx = with_cluster_dims(ptx, self._cluster)
        return extern_dynamic_shared(ptx) if MLIR else ptx

    def _load(self, device_id):
        require_gpu()
        cupy = _cupy()
        with self._lock:
            fn = self._functions.get(device_id)
            if fn is not None:
                return fn
            from .device import get

            ptx = self.ptx(get(device_id).cc)
            name, widths = entry_params(ptx)
            expected = [w for arg in self._plan for w in arg.ptx_widths]
            if widths != expected:
                raise RuntimeError(
                    f"Numba's kernel ABI changed: {self.name}{self.signature} has PTX parameters of "
                    f"{widths} bytes, the launcher expected {expected}"
                )
            module = cupy.cuda.function.Module()
            module.load(ptx.encode() + b"\0")  # cuModuleLoadData JIT-compiles PTX text once
            fn = module.get_function(name)
            self._functions[device_id] = fn
            return fn

    def function(self):
        """The cupy Function on the current device (compiled and loaded on first use)."""
        device_id = _cupy().cuda.runtime.getDevice()
        fn = self._functions.get(device_id)
        return fn if fn is not None else self._load(device_id)

    # -- launch -----------------------------------------------------------------------------
    def flatten(self, args):
        """The kernel's parameter values for ``args``, in Numba's flattened order."""
        plan = self._plan
        if len(args) != len(plan):
            raise TypeError(f"{self.name} takes {len(plan)} arguments, got {len(args)}")
        values = []
        for arg, value in zip(plan, args):
            arg.flatten(value, values)
        return values

    def __call__(self, grid, block, *args, shared_mem=0):
        if _faults.armed:  # a test's injected fault (vtnumba._faults); one dict test otherwise
            _faults.fire(_LAUNCH, self.name)
        if SIMULATOR:
            return self._simulate(grid, block, args, shared_mem)
        values = self.flatten(args)
        gx, gy, gz = (grid, 1, 1) if type(grid) is int else (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (block, 1, 1) if type(block) is int else (tuple(block) + (1, 1))[:3]
        fn = self._functions.get(_get_device()) if _get_device is not None else None
        if fn is None:
            fn = self.function()
        stream = _current_stream().ptr  # cupy's current stream: `with stream:` and graph capture
        with self._lock:  # the slots are shared; the driver copies them during the call
            struct.pack_into(self._format, self._slot_bytes, 0, *values)
            try:
                _launch_kernel(fn.ptr, gx, gy, gz, bx, by, bz, shared_mem, stream, self._param_ptrs_address, 0)
            except _DriverError:
                # a thread that never touched cupy has no current context: make the device's
                # primary context current (what cupy's own launch does), then try once more
                _cupy().cuda.Device(_get_device()).use()
                _launch_kernel(fn.ptr, gx, gy, gz, bx, by, bz, shared_mem, stream, self._param_ptrs_address, 0)

    def _simulate(self, grid, block, args, shared_mem):
        if self._dispatcher is None:
            self._dispatcher = cuda.jit(self.signature)(self.pyfunc)
        self._dispatcher[grid, block, 0, shared_mem](*args)

    def prepare(self, grid, block, *args, shared_mem=0):
        """This launch with its parameters packed once (see ``PreparedLaunch``)."""
        return PreparedLaunch(self, grid, block, args, shared_mem)


class PreparedLaunch:
    """One kernel launch whose parameters are packed once, in a buffer of its own.

    A caller that launches the same kernel again and again with arguments that differ only in a few
    data pointers (a layer's input and output, call after call) replaces those with ``set_arg`` and
    calls ``launch``: no flattening, no packing, no type dispatch -- the driver call and a few slot
    writes. ``set_arg(i, value)`` takes what the kernel call would take for argument ``i`` (a cupy
    array or a ``Buffer`` of the same shape); only its data pointer is read. The caller keeps the
    arrays alive until the launch is queued, and serializes concurrent use of one object.
    Under the simulator the arguments are kept and the kernel runs in the simulator."""

    __slots__ = (
        "kernel",
        "grid",
        "block",
        "shared_mem",
        "args",
        "_fn_ptr",
        "_dims",
        "_slots",
        "_param_ptrs",
        "_ptrs_address",
        "_data_slot",
    )

    def __init__(self, kernel, grid, block, args, shared_mem):
        self.kernel, self.grid, self.block, self.shared_mem = kernel, grid, block, shared_mem
        self.args = list(args)
        if SIMULATOR:
            return
        self._fn_ptr = kernel.function().ptr
        gx, gy, gz = (grid, 1, 1) if type(grid) is int else (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (block, 1, 1) if type(block) is int else (tuple(block) + (1, 1))[:3]
        self._dims = (gx, gy, gz, bx, by, bz)
        values = kernel.flatten(args)
        self._slots = np.zeros(len(values), dtype=np.uint64)
        struct.pack_into(kernel._format, memoryview(self._slots).cast("B"), 0, *values)
        base = self._slots.ctypes.data
        self._param_ptrs = np.array([base + 8 * i for i in range(len(values))], dtype=np.uint64)
        self._ptrs_address = self._param_ptrs.ctypes.data
        # the slot of each array argument's data pointer (Numba's ABI: meminfo, parent, nitems,
        # itemsize, data, shape..., strides...; numba-cuda-mlir's: the memref's aligned pointer)
        self._data_slot = []
        slot = 0
        for arg in kernel._plan:
            if isinstance(arg, _ArrayArg):
                self._data_slot.append(slot + arg.data_slot)
                slot += len(arg.ptx_widths)
            else:
                self._data_slot.append(None)
                slot += 1

    def set_arg(self, index, value):
        if SIMULATOR:
            self.args[index] = value
            return
        self._slots[self._data_slot[index]] = value.ptr if type(value) is Buffer else value.data.ptr

    def launch_with(self, index, ptr, stream_ptr):
        """``set_arg(index, ...)`` by the data pointer itself, then ``launch`` (a GPU only)."""
        self._slots[self._data_slot[index]] = ptr
        self.launch(stream_ptr)

    def launch(self, stream_ptr):
        """Queue the launch on the stream with this pointer (never synchronizes)."""
        if _faults.armed:
            _faults.fire(_LAUNCH, self.kernel.name)
        if SIMULATOR:
            return self.kernel(self.grid, self.block, *self.args, shared_mem=self.shared_mem)
        gx, gy, gz, bx, by, bz = self._dims
        try:
            _launch_kernel(self._fn_ptr, gx, gy, gz, bx, by, bz, self.shared_mem, stream_ptr, self._ptrs_address, 0)
        except _DriverError:  # a thread that never touched cupy: as in Kernel.__call__
            _cupy().cuda.Device(_get_device()).use()
            _launch_kernel(self._fn_ptr, gx, gy, gz, bx, by, bz, self.shared_mem, stream_ptr, self._ptrs_address, 0)


# bound once cupy is imported (the first load): cupy.cuda.runtime.getDevice,
# cupy.cuda.get_current_stream, cupy.cuda.driver.launchKernel, cupy.cuda.driver.CUDADriverError
_get_device = _current_stream = _launch_kernel = _DriverError = None


def _cupy():
    global _get_device, _current_stream, _launch_kernel, _DriverError
    import cupy
    from cupy.cuda import driver

    _current_stream = cupy.cuda.get_current_stream
    _launch_kernel = driver.launchKernel
    _DriverError = driver.CUDADriverError
    _get_device = cupy.cuda.runtime.getDevice  # last: it gates the fast path in Kernel.__call__
    return cupy


_KERNELS = {}
_KERNELS_LOCK = threading.Lock()


def compile_kernel(pyfunc, signature, **options):
    """The ``Kernel`` for ``pyfunc`` at ``signature`` (one object per pair, so callers may ask
    again cheaply); compiled lazily, once per device, at its first launch there."""
    key = (pyfunc, tuple(signature), tuple(sorted(options.items())))
    kernel = _KERNELS.get(key)
    if kernel is None:
        with _KERNELS_LOCK:
            kernel = _KERNELS.setdefault(key, Kernel(pyfunc, signature, **options))
    return kernel


__all__ = [
    "Buffer",
    "Kernel",
    "PreparedLaunch",
    "compile_kernel",
    "entry_params",
    "extern_dynamic_shared",
    "with_cluster_dims",
]
