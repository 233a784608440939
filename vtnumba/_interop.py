"""Arrays from other frameworks at the public boundary: torch tensors, and any object with
``__dlpack__`` or ``__cuda_array_interface__``, in; the same kind out; no copies.

``@interop`` wraps each public op (``vtnumba.ops``) and the seam's entry points. On each call:

1. A type check per argument (the fast path): numpy and cupy arrays, scalars, dtypes, weights and
   ``QuantizedActivation``s of numpy/cupy arrays go straight to the op. Nothing else is done, so
   numpy and cupy callers pay 0.2-0.9 us per call (2 to 6 arguments, on CI's 2-core box;
   benchmarks/gpu/bench_interop.py).
2. Otherwise the foreign arguments are viewed as numpy (CPU) or cupy (GPU) arrays, zero-copy:
   torch CPU tensors through ``Tensor.numpy()``, torch CUDA tensors through a DLPack capsule
   (``torch.utils.dlpack.to_dlpack`` -> ``cupy.from_dlpack``), other objects through
   ``np.from_dlpack`` / ``cupy.from_dlpack`` (their ``__dlpack_device__`` says which) or, lacking
   ``__dlpack__``, ``cupy.asarray`` on their ``__cuda_array_interface__``. torch's bfloat16 and
   float8_e4m3fn have no numpy/cupy dtype: their bits are viewed as int16 / uint8, then as
   ml_dtypes.bfloat16 and as uint8 e4m3 codes.
3. With torch CUDA tensors the op runs on torch's current stream of the tensors' GPU (that GPU made
   cupy's current device, the stream wrapped as a ``cupy.cuda.ExternalStream``), so it is ordered
   after the caller's torch work and before what the caller queues next. Nothing synchronizes.
   Other GPU arrays run on cupy's current device and stream, as cupy arrays always have.
4. With torch CUDA tensors, every device allocation the op makes -- its results and its
   temporaries -- comes from torch's caching allocator on that stream (cupy's allocator is routed
   to ``torch.empty`` for the call): results are counted by ``torch.cuda.memory_allocated``, the
   caller's cupy pool is left alone, and inside ``torch.cuda.graph`` the memory is the graph's, as
   a capture in its default mode requires (cupy's pool may ``cudaMalloc``, which a capture refuses).
5. The op's array results go back to the caller's framework: torch in, torch out (through
   ``torch.from_numpy`` on the CPU and a DLPack capsule on the GPU, no copy); every other input
   kind gets numpy or cupy arrays.

Choices (also in the README):

- Results in torch keep their dtype: float32 / float16 / bfloat16 tensors, and e4m3 codes as
  ``torch.uint8`` -- the dtype numpy and cupy callers get, on which every torch op works;
  ``codes.view(torch.float8_e4m3fn)`` is free where a float8 tensor is wanted (``torch._scaled_mm``).
  Inputs may be either: ``torch.float8_e4m3fn`` codes are viewed as uint8.
- float64 inputs (any framework, numpy included) are cast to float32 with round-to-nearest-even
  first (upstream's quantization kernels take float32 at the widest: vLLM dispatches them on
  float32, float16 and bfloat16), so the result is exactly that of the op on
  ``x.astype(float32)``. The cast copies (float64 has no float32 view); results are float32 where
  they follow the input's dtype.
- A torch tensor with ``requires_grad`` under grad mode is refused: the ops are not differentiable,
  so the gradient would be lost without a word. Under ``torch.no_grad()`` / ``inference_mode()``
  (or after ``.detach()``) it is accepted.
- One framework per call: torch tensors mixed with numpy / cupy / other arrays are refused (the
  kind to return would be a guess); so are torch tensors on two GPUs.

torch is never imported here: a tensor can only exist once its module is in ``sys.modules``.
"""

import contextlib
import functools
import inspect
import sys

import numpy as np

from . import _arrays

__all__ = ["interop", "to_native", "to_torch", "on_torch_stream"]

_F64 = np.dtype(np.float64)
_BF16 = _arrays.BFLOAT16

# Argument kinds, found once per type (``_kind``).
_PLAIN, _NATIVE, _CONTAINER, _TORCH, _TORCH_DTYPE, _DLPACK, _CAI = range(7)

# The fast path's sets: types that pass untouched, numpy/cupy array types (passed unless float64),
# containers (QuantizedActivation) passed when their arrays are native. Grown by ``_kind``.
_PLAIN_TYPES = {type(None), bool, int, float, str, type, np.float32, np.float64, np.float16}
_NATIVE_TYPES = {np.ndarray}
_CONTAINER_TYPES = set()
_KIND_OF_TYPE = {}

_DL_CPU, _DL_CUDA, _DL_CUDA_MANAGED = 1, 2, 13  # DLPack device types (dlpack.h DLDeviceType)


def _kind(a):
    """What ``a`` is to the interop layer; cached per type where the type alone decides."""
    t = type(a)
    kind = _KIND_OF_TYPE.get(t)
    if kind is not None:
        return kind
    torch = sys.modules.get("torch")
    cupy = sys.modules.get("cupy")
    ops = sys.modules.get("vtnumba.ops")
    cacheable = True
    if isinstance(a, np.ndarray) or (cupy is not None and isinstance(a, cupy.ndarray)):
        kind = _NATIVE
        _NATIVE_TYPES.add(t)
    elif torch is not None and isinstance(a, torch.Tensor):
        kind = _TORCH
        _torch_views(torch)
    elif torch is not None and isinstance(a, torch.dtype):
        kind = _TORCH_DTYPE
    elif ops is not None and isinstance(a, ops.QuantizedActivation):
        kind = _CONTAINER
        _CONTAINER_TYPES.add(t)
    elif hasattr(a, "__dlpack__") and hasattr(a, "__dlpack_device__"):
        kind, cacheable = _DLPACK, hasattr(t, "__dlpack__")
    elif hasattr(a, "__cuda_array_interface__"):
        kind, cacheable = _CAI, hasattr(t, "__cuda_array_interface__")
    else:
        kind = _PLAIN
        # an instance may carry the protocols as attributes its type lacks: cache only types that
        # cannot be arrays at all
        cacheable = not (hasattr(t, "__dlpack__") or hasattr(t, "__cuda_array_interface__"))
        if cacheable:
            _PLAIN_TYPES.add(t)
    if cacheable:
        _KIND_OF_TYPE[t] = kind
    return kind


def _qualname(a):
    t = type(a)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__.split('.')[0]}.{t.__name__}"


class _Call:
    """One call's foreign arguments: converted in as they are met (views only: no work is launched,
    except float64 casts, on the stream the op will run on), then checked (one framework, one GPU);
    results converted out."""

    # class-level defaults: a call sets only what it meets (most set two of these)
    torch = None  # the torch module, once a torch tensor is met
    torch_key = other_key = other = None  # the first tensor's and the first other array's argument
    gpu = gpu_key = None  # the torch tensors' GPU ordinal, and which argument set it

    def __init__(self, names):
        self.names = names  # the wrapped function's positional parameter names, for error messages

    def label(self, key):
        """An argument's name: ``key`` is a position, a keyword, or (key, field) inside a container."""
        if isinstance(key, tuple):
            return f"{self.label(key[0])}.{key[1]}"
        if isinstance(key, int):
            return self.names[key] if key < len(self.names) else f"args[{key}]"
        return key

    # -- in
    def inbound(self, a, key):
        kind = _KIND_OF_TYPE.get(type(a))
        if kind is None:
            kind = _kind(a)
        if kind == _PLAIN:
            return a
        if kind == _TORCH:
            return self._tensor(a, key)
        if kind == _CONTAINER:
            return _replace_arrays(a, self.inbound(a.data, (key, "data")), self.inbound(a.scale, (key, "scale")))
        if kind == _TORCH_DTYPE:
            return _TORCH_DTYPE_NAMES.get(str(a), str(a))
        if self.other_key is None:
            self.other_key, self.other = key, a
        if kind == _NATIVE:
            arr = a
        elif kind == _DLPACK:
            arr = _dlpack_to_native(a, self.label(key))
        else:
            arr = _cupy_module(self.label(key)).asarray(a)
        return arr.astype(np.float32) if arr.dtype == _F64 else arr

    def _tensor(self, t, key):
        """A numpy (CPU) or cupy (CUDA) view of tensor ``t``: the same memory, bf16 as
        ml_dtypes.bfloat16, float8_e4m3fn as uint8 codes; float64 cast to float32 (RNE)."""
        torch = self.torch
        if torch is None:
            torch = self.torch = sys.modules["torch"]
            self.torch_key = key
        if t.requires_grad:
            if torch.is_grad_enabled():
                name = self.label(key)
                raise ValueError(
                    f"{name} must not require grad: vtnumba's ops are not differentiable, so its "
                    f"gradient would be lost; got a tensor with requires_grad=True. Call under "
                    f"torch.no_grad() or torch.inference_mode(), or pass {name}.detach()"
                )
            t = t.detach()  # .numpy() refuses a tensor that requires grad
        view = _TORCH_VIEWS.get(t.dtype)
        if view is None and t.is_cpu:
            try:
                return t.numpy()  # the common case first: numpy views the tensor as it is
            except (TypeError, RuntimeError):
                pass  # a dtype numpy lacks: the general path below names it
        if view == "bfloat16":
            t = t.view(torch.int16)
        elif view == "float8_e4m3fn":
            t = t.view(torch.uint8)
        try:
            if t.is_cuda:
                index = t.get_device()
                if self.gpu is None:
                    self.gpu, self.gpu_key = index, key
                elif index != self.gpu:
                    raise ValueError(
                        f"arrays must all be on one GPU, got {self.label(self.gpu_key)} on "
                        f"cuda:{self.gpu} and {self.label(key)} on cuda:{index}"
                    )
                arr = (_cupy or _cupy_module(self.label(key))).from_dlpack(_torch_api.to_dlpack(t))
            elif t.is_cpu:
                arr = t.numpy()
            else:
                raise ValueError(f"{self.label(key)} must be a CPU or CUDA tensor, got a tensor on {t.device}")
        except (TypeError, RuntimeError, BufferError, NotImplementedError) as exc:
            raise TypeError(
                f"{self.label(key)} must be a tensor numpy/cupy can view (float32, float16, bfloat16, "
                f"float64, or uint8 / float8_e4m3fn codes), got dtype {t.dtype} "
                f"({exc.__class__.__name__}: {exc})"
            ) from None
        if view is None or view == "float8_e4m3fn":
            return arr
        if view == "bfloat16":
            return arr.view(_BF16)
        if t.is_cuda:  # float64: cast on the stream the op will run on (torch's, on the tensor's GPU)
            cupy = _cupy_module("")
            with (
                cupy.cuda.Device(self.gpu),
                _torch_stream(torch, self.gpu),
                cupy.cuda.using_allocator(_torch_allocator(torch, self.gpu)),
            ):
                return arr.astype(np.float32)
        return arr.astype(np.float32)

    def refuse_mixed(self):
        """A torch tensor and another framework's array in one call: the kind to return is a guess."""
        other = self.label(self.other_key)
        raise TypeError(
            f"arrays must all come from one framework, got {self.label(self.torch_key)} (torch.Tensor) with "
            f"{other} ({_qualname(self.other)}); pass {other} as a tensor too "
            f"(torch.from_numpy / torch.from_dlpack), or every array as numpy/cupy"
        )

    # -- out
    def outbound(self, result):
        if self.torch is None:
            return result
        t = type(result)
        if t is np.ndarray and result.dtype is not _BF16:
            return self.torch.from_numpy(result)
        if t in _CONTAINER_TYPES:
            data, scale = result.data, result.scale
            if type(data) is np.ndarray and type(scale) is np.ndarray:  # codes and float32 scales (CPU)
                from_numpy = self.torch.from_numpy
                return _replace_arrays(result, from_numpy(data), from_numpy(scale))
        kind = _KIND_OF_TYPE.get(t)
        if kind is None:
            kind = _kind(result)  # e.g. the first cupy array: cupy may have been imported by this very call
        if kind == _NATIVE:
            return to_torch(result, self.torch)
        if kind == _CONTAINER:
            return _replace_arrays(result, self.outbound(result.data), self.outbound(result.scale))
        if isinstance(result, tuple):
            return tuple(self.outbound(r) for r in result)
        return result


def _replace_arrays(q, data, scale):
    """A copy of QuantizedActivation ``q`` with other arrays; every other field kept as it is (a
    quarter of ``dataclasses.replace``'s cost, which re-runs __init__)."""
    new = object.__new__(type(q))
    fields = new.__dict__
    fields.update(q.__dict__)
    fields["data"], fields["scale"] = data, scale
    return new


# torch dtypes that need more than a view: bfloat16 and float8_e4m3fn (no numpy/cupy dtype: their bits
# are viewed), float64 (cast). Filled when the first tensor is met (torch is never imported here).
_TORCH_VIEWS = {}


class _TorchApi:
    """torch functions on the per-call path, looked up once (attribute chains cost per call)."""

    tensor = to_dlpack = from_dlpack = raw_stream = None


_torch_api = _TorchApi()


def _torch_views(torch):
    """Fill _TORCH_VIEWS and _torch_api once. Another thread may be reading both meanwhile: the API
    is set first and the views are published by one update of a complete dict, so a reader that
    sees any view sees them all (and the API they go with)."""
    if not _TORCH_VIEWS:
        views = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn", torch.float64: "float64"}
        if hasattr(torch, "float8_e8m0fnu"):  # MX scale bytes: viewed as uint8, as e4m3 codes are
            views[torch.float8_e8m0fnu] = "float8_e4m3fn"
        _torch_api.to_dlpack, _torch_api.from_dlpack = torch.utils.dlpack.to_dlpack, torch.from_dlpack
        _torch_api.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _torch_api.tensor = torch.Tensor
        _TORCH_VIEWS.update(views)


# float out_dtype given as a torch dtype; others go on as their names, which the op refuses by name
_TORCH_DTYPE_NAMES = {
    "torch.float32": np.dtype(np.float32),
    "torch.float16": np.dtype(np.float16),
    "torch.bfloat16": _arrays.BFLOAT16,
}


_cupy = None  # the cupy module, once a GPU array has needed it


def _cupy_module(name):
    global _cupy
    if _cupy is None:
        try:
            import cupy
        except ImportError:
            from .cuda.ptx.target import require_gpu

            require_gpu()  # the library's one message for why the GPU path cannot run (here: no cupy)
            raise
        _cupy = cupy
    return _cupy


def _dlpack_to_native(a, name):
    """numpy or cupy view of a DLPack producer, by the device it reports."""
    try:
        device_type = a.__dlpack_device__()[0]
        if device_type == _DL_CPU:
            return np.from_dlpack(a)
        if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
            return _cupy_module(name).from_dlpack(a)
    except (TypeError, ValueError, RuntimeError, BufferError, NotImplementedError) as exc:
        raise TypeError(
            f"{name} must be exportable through DLPack, got a {_qualname(a)} whose export was "
            f"refused ({exc.__class__.__name__}: {exc}); a contiguous copy usually exports"
        ) from None
    raise TypeError(
        f"{name} must live on the CPU or a CUDA GPU, got a {_qualname(a)} on DLPack device type {device_type}"
    )


def to_native(a, name="array"):
    """``a`` (torch tensor, DLPack or CUDA Array Interface object, numpy or cupy array) as a numpy or
    cupy array sharing its memory (float64 cast to float32). A tensor that requires grad is refused
    under grad mode, as the ops refuse it."""
    return _Call((name,)).inbound(a, 0)


def to_torch(arr, torch=None):
    """A torch tensor sharing the memory of numpy / cupy array ``arr`` (bfloat16 kept as
    torch.bfloat16, uint8 codes as torch.uint8)."""
    torch = torch or sys.modules["torch"]
    if type(arr) is np.ndarray and arr.dtype is not _BF16:
        return torch.from_numpy(arr)
    _torch_views(torch)
    bf16 = arr.dtype == _BF16
    if bf16:
        arr = arr.view(np.int16)
    if isinstance(arr, np.ndarray):
        t = torch.from_numpy(arr)
    else:
        # stream=-1: no stream order is set up, and none is needed: the array was made on torch's
        # current stream (the op ran there), where torch will use the tensor
        t = _torch_api.from_dlpack(arr.__dlpack__(stream=-1))
    return t.view(torch.bfloat16) if bf16 else t


@contextlib.contextmanager
def on_torch_stream(index):
    """Within: GPU ``index`` is cupy's current device and torch's current stream there is cupy's
    current stream (for work outside the ops that must be ordered with the caller's torch work,
    e.g. ``vtnumba.torch.Fp8Linear`` uploading its weight)."""
    cupy = _cupy_module(f"cuda:{index}")
    with cupy.cuda.Device(index), _torch_stream(sys.modules["torch"], index):
        yield


def _run_foreign(fn, names, args, kwargs):
    """The slow path: convert in, check, run (on torch's stream for torch CUDA tensors), convert out."""
    call = _Call(names)
    inbound, tensor, plain, tensor_type = call.inbound, call._tensor, _PLAIN_TYPES, _torch_api.tensor
    args = [
        a if type(a) in plain else tensor(a, i) if type(a) is tensor_type else inbound(a, i) for i, a in enumerate(args)
    ]
    if kwargs:
        kwargs = {
            k: v if type(v) in plain else tensor(v, k) if type(v) is tensor_type else inbound(v, k)
            for k, v in kwargs.items()
        }
    if call.torch is not None and call.other_key is not None:
        call.refuse_mixed()
    if call.gpu is None:
        return call.outbound(fn(*args, **kwargs))
    cupy = _cupy or _cupy_module(call.label(call.gpu_key))
    stream = _torch_stream(call.torch, call.gpu)
    allocator = cupy.cuda.using_allocator(_torch_allocator(call.torch, call.gpu))
    if cupy.cuda.runtime.getDevice() == call.gpu:
        with stream, allocator:
            return call.outbound(fn(*args, **kwargs))
    with cupy.cuda.Device(call.gpu), stream, allocator:
        return call.outbound(fn(*args, **kwargs))


_TORCH_ALLOCATORS = {}  # GPU ordinal -> a cupy allocator drawing on torch's caching allocator


def _torch_allocator(torch, index):
    """A cupy allocator (nbytes -> MemoryPointer) whose memory is a torch uint8 tensor on GPU
    ``index``, allocated on torch's current stream and held by the cupy memory (so by the array,
    and by a tensor made from it through DLPack) until the last of them goes."""
    alloc = _TORCH_ALLOCATORS.get(index)
    if alloc is None:
        cupy = _cupy_module(f"cuda:{index}")
        device, empty, uint8 = torch.device("cuda", index), torch.empty, torch.uint8
        unowned, pointer = cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer

        def alloc(nbytes):
            t = empty(nbytes, dtype=uint8, device=device)
            return pointer(unowned(t.data_ptr(), nbytes, t, index), 0)

        alloc = _TORCH_ALLOCATORS[index] = alloc
    return alloc


_STREAMS = {}  # (device, stream pointer) -> cupy ExternalStream wrapping torch's stream


def _torch_stream(torch, index):
    """torch's current stream on GPU ``index`` as a cupy stream (a wrapper; torch keeps owning it)."""
    raw = _torch_api.raw_stream  # what torch's compiled code calls: no Stream object built per call
    ptr = raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream
    stream = _STREAMS.get((index, ptr))
    if stream is None:
        cupy = _cupy_module("a CUDA tensor")
        if len(_STREAMS) > 256:  # streams come and go in some programs; wrappers are cheap to remake
            _STREAMS.clear()
        stream = _STREAMS[(index, ptr)] = cupy.cuda.ExternalStream(ptr, index)
    return stream


def interop(fn):
    """Let ``fn`` take torch tensors and any DLPack / CUDA Array Interface array, and float64 input
    (module docstring). numpy and cupy arguments pass after one type check each."""
    names = tuple(
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    plain, native, containers, f64 = _PLAIN_TYPES, _NATIVE_TYPES, _CONTAINER_TYPES, _F64

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for a in args:
            t = type(a)
            if (
                t in plain
                or (t in native and a.dtype is not f64)
                or (t in containers and type(a.data) in native and type(a.scale) in native)
            ):
                continue
            return _run_foreign(fn, names, args, kwargs)
        if kwargs:
            for a in kwargs.values():
                t = type(a)
                if (
                    t in plain
                    or (t in native and a.dtype is not f64)
                    or (t in containers and type(a.data) in native and type(a.scale) in native)
                ):
                    continue
                return _run_foreign(fn, names, args, kwargs)
        return fn(*args, **kwargs)

    if fn.__doc__:
        wrapper.__doc__ = fn.__doc__.rstrip() + _DOC_NOTE
    return wrapper


_DOC_NOTE = """

    Arrays may be numpy or cupy arrays, torch tensors (CPU or CUDA) or any ``__dlpack__`` /
    ``__cuda_array_interface__`` object, taken without a copy; results come back as the caller's
    kind (torch in, torch out; e4m3 codes as torch.uint8), on torch's current stream for CUDA
    tensors. float64 input is cast to float32 (round-to-nearest-even) first. (vtnumba._interop)
    """
