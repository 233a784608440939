"""CUDA graphs as an API: capture a function of GPU arrays once, replay it for new inputs.

    step = vtnumba.cuda.capture(lambda x: layer2.apply(silu(layer1.apply(x))), x_example)
    y = step(x)          # copies x into the graph's input, replays, returns the graph's output

Why: a decode step through vtnumba eagerly costs tens of microseconds of host time per layer,
more than the layer's GPU work; replayed from a graph, the host pays one launch for the whole
step (DEVICE.md: ~0.07 us of host time per captured kernel).

How ``capture(fn, *example_args, stream=None)`` works:

1. ``fn(*static_args)`` runs once uncaptured on a private stream (``warmup`` times): kernels
   compile, cuBLASLt plans and workspaces are made, the seam binds its calls for that stream.
2. ``fn(*static_args)`` is captured into a graph on that stream. Every allocation made during the
   warm-up and the capture comes from a memory pool private to the graph, so memory a captured
   kernel writes on replay is never handed to anyone else (a freed temporary in the default pool
   would be: the next allocation could receive it while the graph still writes there).
3. A call copies each new argument into its static twin (device-to-device, on the replay stream)
   and launches the graph on the replay stream: cupy's current stream by default, or ``stream``
   (a cupy stream, or a torch stream: anything with ``cuda_stream`` or ``ptr``). The small
   arguments (up to ``FUSED_COPY_MAX_BYTES``, whole 32-bit words, up to ``FUSED_COPY_SLOTS``) are
   copied by one kernel launch (``_copy_words``), the others by ``cudaMemcpyAsync`` each: every
   memcpy is a device operation of its own, about 2.3 us for a few bytes. On an H100 the
   Qwen3-30B-A3B MoE layer's replay at one token took 29.0 us with its three inputs copied one by
   one, of which the graph itself 22.1 (benchmarks/RESULTS.md, 2026-12-07 08:40).

What may not change between replays, because the graph holds pointers and launch shapes:
- each argument's shape, dtype and contiguity (a call with another is refused, naming it);
- the layers' weights, scales and settings (the lever, VT_DISABLE_KERNELS) as they were at capture;
- the returned arrays are the graph's own outputs, overwritten by the next replay: copy what you
  keep. Python scalars and other non-array arguments are baked in at capture.
"""

from .ptx.target import SIMULATOR, cuda, types
from .runtime import device
from .runtime.launch import Buffer, compile_kernel

__all__ = ["capture", "CapturedCall", "FUSED_COPY_MAX_BYTES", "FUSED_COPY_SLOTS"]

FUSED_COPY_MAX_BYTES = 1 << 16  # past this an argument keeps its memcpy (a copy engine moves it at full rate)
FUSED_COPY_SLOTS = 4  # arguments one copy launch takes (a captured call has x, ids, weights: three)
_COPY_THREADS = 256


def _copy_words(s0, d0, s1, d1, s2, d2, s3, d3):
    """d_i[j] = s_i[j] for every 32-bit word of each of the four pairs (an unused pair is empty): the
    replay's small argument copies in one launch, a grid-stride loop over each."""
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for j in range(start, d0.size, step):
        d0[j] = s0[j]
    for j in range(start, d1.size, step):
        d1[j] = s1[j]
    for j in range(start, d2.size, step):
        d2[j] = s2[j]
    for j in range(start, d3.size, step):
        d3[j] = s3[j]


_COPY_SIGNATURE = (types.uint32[::1],) * (2 * FUSED_COPY_SLOTS)


def _stream_ptr_of(stream):
    """The CUDA stream pointer of a cupy stream, a torch stream or None (cupy's current stream)."""
    if stream is None:
        import cupy

        return cupy.cuda.get_current_stream().ptr
    for attr in ("ptr", "cuda_stream"):  # cupy.cuda.Stream, torch.cuda.Stream
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise TypeError(
        f"stream must be a cupy or torch CUDA stream (or None for cupy's current one), got {type(stream).__name__}"
    )


def _is_gpu_array(value):
    return hasattr(value, "__cuda_array_interface__")


def _twin(cupy, a, stream_ptr):
    """A new cupy array holding a copy of GPU array ``a`` (C-contiguous), enqueued on the stream."""
    a = cupy.asarray(a)
    twin = cupy.empty(a.shape, dtype=a.dtype)
    cupy.cuda.runtime.memcpyAsync(twin.data.ptr, a.data.ptr, a.nbytes, 3, stream_ptr)  # 3: device to device
    return twin


def _end_failed_capture(stream):
    """End a capture that an exception interrupted. CUDA invalidates a capture that met an illegal
    call, but the stream stays in capture mode until it is ended: every later launch on it would
    fail, and in the global mode every other stream's allocations too. Ending it discards the graph;
    its own error (the capture was invalidated) says nothing the first one did not."""
    try:
        stream.end_capture()
    except Exception:
        pass


class CapturedCall:
    """A captured function: call it with arguments like the example's (see the module docstring).
    ``outputs`` holds the graph's output arrays; ``graph`` the cupy graph."""

    def __init__(self, fn, example_args, stream, warmup):
        import cupy

        self._cupy = cupy
        self._pool = cupy.cuda.MemoryPool()  # private to this graph (see the module docstring)
        self._capture_stream = cupy.cuda.Stream(non_blocking=True)
        current = cupy.cuda.get_current_stream()
        with cupy.cuda.using_allocator(self._pool.malloc):
            # the inputs' static twins, copied as bytes (any dtype, bfloat16 included) in the
            # caller's stream order, then handed over to the capture stream
            self.static_args = tuple(_twin(cupy, a, current.ptr) if _is_gpu_array(a) else a for a in example_args)
            ready = current.record()
            self._capture_stream.wait_event(ready)
            with self._capture_stream:
                for _ in range(warmup):
                    fn(*self.static_args)
                self._capture_stream.begin_capture()
                try:
                    outputs = fn(*self.static_args)
                except BaseException as exc:
                    _end_failed_capture(self._capture_stream)
                    raise RuntimeError(
                        f"capturing {getattr(fn, '__name__', fn)!r} into a CUDA graph failed ({type(exc).__name__}: "
                        f"{exc}); the capture was ended, so the stream and the process stay usable. A call "
                        f"that synchronizes (a copy to the host, .get(), .item()) cannot be captured"
                    ) from exc
                self.graph = self._capture_stream.end_capture()
        self.outputs = outputs
        # the replay stream as cupy launches the graph on it (made once: a torch stream is wrapped)
        if stream is None or isinstance(stream, cupy.cuda.Stream):
            self._launch_stream = stream
        else:
            self._launch_stream = cupy.cuda.ExternalStream(_stream_ptr_of(stream))
        self.graph.upload(self._capture_stream)
        self._capture_stream.synchronize()  # once, at capture time: replays never synchronize
        self._arg_specs = [(i, a.shape, a.dtype, a.nbytes) for i, a in enumerate(self.static_args) if _is_gpu_array(a)]
        self._fused, self._copy = self._fused_copy()

    def _fused_copy(self):
        """(argument indices, prepared launch) of the replay's one-launch copy of its small arguments
        (module docstring), or ((), None) where fewer than two arguments qualify or under the simulator."""
        if SIMULATOR:
            return (), None
        small = [
            i
            for i, _, _, nbytes in self._arg_specs
            if 0 < nbytes <= FUSED_COPY_MAX_BYTES and nbytes % 4 == 0 and self.static_args[i].data.ptr % 4 == 0
        ][:FUSED_COPY_SLOTS]
        if len(small) < 2:
            return (), None  # one memcpy costs what one launch does
        empty = Buffer(self.static_args[small[0]].data.ptr, (0,), (4,))
        pairs = []
        for slot in range(FUSED_COPY_SLOTS):
            if slot < len(small):
                twin = self.static_args[small[slot]]
                words = Buffer(twin.data.ptr, (twin.nbytes // 4,), (4,))
                pairs += [words, words]  # the source's pointer is set by each call
            else:
                pairs += [empty, empty]
        most = max(self.static_args[i].nbytes // 4 for i in small)
        grid = -(-most // _COPY_THREADS)
        return tuple(small), compile_kernel(_copy_words, _COPY_SIGNATURE).prepare(grid, _COPY_THREADS, *pairs)

    def __call__(self, *args):
        if len(args) != len(self.static_args):
            raise TypeError(f"the captured function takes {len(self.static_args)} arguments, got {len(args)}")
        stream = self._launch_stream if self._launch_stream is not None else self._cupy.cuda.get_current_stream()
        stream_ptr = stream.ptr
        memcpy = self._cupy.cuda.runtime.memcpyAsync
        for i, shape, dtype, _ in self._arg_specs:
            new = args[i]
            if new.shape != shape or new.dtype != dtype:
                raise ValueError(
                    f"argument {i} must have the captured shape {shape} and dtype {dtype}, "
                    f"got shape {tuple(new.shape)} and dtype {new.dtype}"
                )
            if not new.flags.c_contiguous:
                raise ValueError(f"argument {i} must be C-contiguous like the captured one, got a strided view")
        fused = self._fused
        if fused and any(args[i].data.ptr % 4 for i in fused):
            fused = ()  # a source off a word boundary (a view into a buffer): this call copies by memcpy
        for slot, i in enumerate(fused):
            self._copy.set_arg(2 * slot, args[i])
        if fused:
            self._copy.launch(stream_ptr)
        for i, _, _, nbytes in self._arg_specs:
            if i not in fused:
                memcpy(self.static_args[i].data.ptr, args[i].data.ptr, nbytes, 3, stream_ptr)  # 3: device to device
        self.graph.launch(stream)
        return self.outputs


def capture(fn, *example_args, stream=None, warmup=1):
    """Capture ``fn(*example_args)`` into a CUDA graph; returns a ``CapturedCall`` that replays it
    for new arguments of the same shapes on ``stream`` (default: cupy's current stream at each
    call). See the module docstring for what may not change between replays."""
    device.array_module()  # the one clear error when no GPU can run this
    if not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup must be an int >= 1 (kernels compile and plans are made there), got {warmup!r}")
    for i, a in enumerate(example_args):
        if _is_gpu_array(a) and not a.flags.c_contiguous:
            raise ValueError(
                f"example_args[{i}] must be C-contiguous (the graph reads it in place), got a strided view"
            )
    if stream is not None:
        _stream_ptr_of(stream)  # refuse a wrong type now, not at the first replay
    return CapturedCall(fn, example_args, stream, warmup)
