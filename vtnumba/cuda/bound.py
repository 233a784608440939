"""A layer's GPU call, bound: prepared once for one input signature, then replayed cheaply (a linear
layer's ``BoundLinear``; a mixture-of-experts layer's ``BoundMoe``, at the end).

An FP8 layer at decode does 4-36 us of GPU work, while one trip through the validating ops costs
~100 us of host time (benchmarks/gpu/profile_gpu_host.py: the device resolved several times, shapes
re-validated, scales wrapped, the kernel choice walked, parameters packed, several allocations). A
model calls the same layer with the same input signature token after token, so the seam binds the
call once per (input shape, dtype, output dtype, device, lever): ``BoundLinear`` holds

- the activation quantization's launches, prepared (``launch.PreparedLaunch``),
- the GEMM the kernel choice picked, as its steps (``gemm.py``): prepared Numba launches and cuBLASLt
  matmuls on a descriptor of their own whose heuristic ran once,

and a call gives it three device pointers -- the input x, the output y and one *scratch* block for
the activation's codes and scales (and the f32-staged accumulator) -- which it writes into the
prepared parameters before enqueueing. The work enqueued is the unbound call's, launch for launch,
so the result is bitwise the same. At decode in eager code (``bind_linear``, ``LinearBinding``) the
binding is instead the one fused launch of the tensor-core GEMV, which quantizes x as it reads it:
two pointers (x, y), no scratch; the same signature captured into a CUDA graph replays the form
above. ``seam.bound`` keeps the bindings (the table, the key, the regime).

The caller allocates y and the scratch for each call, from whatever allocator it uses: cupy's pool
for cupy callers, torch's caching allocator for torch callers (``vtnumba.torch``). Nothing the call
writes outlives it, so one binding serves every stream, a CUDA graph captured from it owns its
memory like any captured work, and no buffer is ever shared by two calls in flight.

What a binding assumes (the seam checks it per call, and falls back to the full path otherwise):
the input is C-contiguous and 16-byte aligned with the bound shape and dtype; the device and lever
settings are the bound ones.

An MoE layer (``seam.moe_fp8``) at decode makes two launches where the routed decode takes it
(gate_up and down, each pair its own group: docs/DESIGN.md, "MoE decode: two launches") and nine
otherwise -- align, the active-experts map, quantize, two gathers, gate_up, SiLU-and-quantize, down,
combine; unbound, its eager call cost 343 us of host time on the H200 (benchmarks/gpu/profile_moe_host.py,
2026-12-01), where transformers' bf16 experts module cost 271 us (batched_mm) to 740 us
(grouped_mm). ``BoundMoe`` is the same idea over those launches, with two more per-call inputs (the
routing's ids and weights).
"""

import threading

import numpy as np

from .. import _arrays, _config
from . import block, gemm
from .kernels import tc_gemv
from .kernels.epilogue import out_bits
from .ptx.target import SIMULATOR
from .quantize import quantize_launches
from .runtime import device
from .runtime.launch import Buffer

# Parts of the scratch block start on 256-byte boundaries, as allocations do (cuBLASLt's operands
# and the kernels' 16-byte accesses keep their alignment).
_ALIGN = 256
_X, _Y, _QUANT, _GEMM = 0, 1, 2, 3  # which per-call pointer an argument is relative to
_FIXED = -1


def _pointer(arg):
    """The device address of an array argument (a Buffer, cupy or numpy array), or None."""
    if type(arg) is Buffer:
        return arg.ptr
    if isinstance(arg, np.ndarray):  # the simulator's arrays (numpy's .data is a memoryview)
        return arg.__array_interface__["data"][0]
    ptr = getattr(getattr(arg, "data", None), "ptr", None)
    return ptr


def _aligned(nbytes):
    return -(-nbytes // _ALIGN) * _ALIGN


class _Scratch:
    """Hands out arrays for the bound call's temporaries at bind time, each recorded at an aligned
    offset of a region of the scratch block a call allocates (``nbytes`` in all)."""

    def __init__(self, source):
        self.source = source  # _QUANT (the activation's codes and scales) or _GEMM (the GEMM's own)
        self.parts = []  # (address of the bind-time array, bytes, offset in the region, the array)
        self.nbytes = 0

    def __call__(self, shape, dtype):
        a = device.xp.empty(shape, dtype=dtype)
        offset = _aligned(self.nbytes)
        self.parts.append((_pointer(a), a.nbytes, offset, a))
        self.nbytes = offset + a.nbytes
        return a


class _Layout:
    """Where each bind-time array lives: inside x, inside y, inside a scratch part, or elsewhere (a
    weight, a scale, a placeholder: fixed)."""

    def __init__(self, x, y, *scratches):
        self.ranges = [(_pointer(x), x.nbytes, _X, 0), (_pointer(y), y.nbytes, _Y, 0)]
        self.ranges += [
            (ptr, nbytes, scratch.source, offset) for scratch in scratches for ptr, nbytes, offset, _ in scratch.parts
        ]

    def locate(self, arg):
        """(source, offset) of an argument's address: source _X / _Y / _QUANT / _GEMM, or (_FIXED,
        address); None for a non-array argument."""
        ptr = _pointer(arg)
        if ptr is None:
            return None
        for start, nbytes, source, offset in self.ranges:
            if start <= ptr < start + max(nbytes, 1):
                return source, offset + ptr - start
        return _FIXED, ptr


class _LaunchStep:
    """A prepared kernel launch whose x / y / scratch pointers are rewritten per call."""

    __slots__ = ("prepared", "patches", "views")

    def __init__(self, launch, layout, shared_mem=0):
        kernel, grid, block_dim, args = launch
        self.prepared = kernel.prepare(grid, block_dim, *args, shared_mem=shared_mem)
        patches, views = [], []
        for index, arg in enumerate(args):
            where = layout.locate(arg)
            if where is not None and where[0] != _FIXED:
                if not SIMULATOR:
                    patches.append((self.prepared._data_slot[index], where[0], where[1]))
                views.append((index, where[0], where[1], arg))
        self.patches, self.views = tuple(patches), tuple(views)
        if not SIMULATOR:  # hold the fixed arguments (weights, scales), not the bind-time x / y / scratch
            for index, _, _, _ in views:
                self.prepared.args[index] = None

    def __call__(self, bases, stream_ptr, alloc):
        slots = self.prepared._slots
        for slot, source, offset in self.patches:
            slots[slot] = bases[source] + offset
        self.prepared.launch(stream_ptr)

    def simulate(self, arrays):
        """Under the simulator: the same launch on views of this call's arrays (x, y and the scratch
        block twice: its quantization and GEMM regions, as offsets into it)."""
        for index, source, offset, template in self.views:
            self.prepared.set_arg(index, _view_like(template, arrays[source], offset))
        self.prepared.launch(0)


def _view_like(template, buffer, offset):
    """A numpy view of ``buffer``'s bytes from ``offset`` with the template's shape, dtype, strides."""
    raw = buffer.reshape(-1).view(np.uint8)
    return np.ndarray(template.shape, template.dtype, buffer=raw, offset=offset, strides=template.strides)


class _MatmulStep:
    """A cuBLASLt matmul on a descriptor of its own, its operand pointers resolved per call."""

    __slots__ = ("state", "handle", "plan", "operands", "last", "held")

    def __init__(self, matmul, layout):
        self.state = matmul.state
        self.handle = matmul.state.handle
        arrays = (matmul.a, matmul.b, matmul.scale_a, matmul.scale_b, matmul.bias, matmul.d)
        self.operands = tuple(layout.locate(a) or (_FIXED, 0) for a in arrays)
        # the fixed operands (the weight, its scales, a padded or contiguous copy made for this call)
        self.held = tuple(a for a, (source, _) in zip(arrays, self.operands) if source == _FIXED)
        pointers = tuple(_pointer(a) or 0 for a in (matmul.scale_a, matmul.scale_b, matmul.bias))
        # vector and block scales need pointers before the heuristic query; the bind-time ones serve
        self.plan = matmul.state.new_plan(matmul.plan.key, pointers)
        self.last = None

    def __call__(self, bases, stream_ptr, alloc):
        a, b, sa, sb, bias, d = (offset if source < 0 else bases[source] + offset for source, offset in self.operands)
        if (sa, sb, bias) != self.last:
            self.plan.set_pointers(sa, sb, bias)
            self.last = (sa, sb, bias)
        ws = self.state.workspace_for(stream_ptr, alloc)
        self.plan.enqueue(self.handle, a, b, d, ws[0], ws[1], stream_ptr)

    def simulate(self, arrays):
        raise RuntimeError("a cuBLASLt step cannot run under the CUDA simulator")


class BoundLinear:
    """quantize(x) then the GEMM with a fixed weight, prepared once (see the module docstring).

    ``BoundLinear(x, weight, out_dtype)`` binds ``weight`` (an ``Fp8Weight`` whose arrays are on x's
    GPU) for inputs like ``x`` (a contiguous, aligned [M, K] float array). Per call:
    ``enqueue(x_ptr, y_ptr, scratch_ptr, stream_ptr, alloc)`` with y [M, N] of ``out_dtype`` and a
    scratch block of ``scratch_bytes`` (``alloc(nbytes)``: a temporary the call may need, e.g.
    cuBLASLt's workspace while a new stream is captured); ``bound(x, stream_ptr)`` does it with
    cupy allocations and returns y. ``kernels`` names what runs, in order.

    The block's first ``quant_bytes`` hold the activation's codes and scales. A caller that knows
    another call already quantized the very same x the same way (same scheme and scale) may pass
    that call's block as ``quant_ptr``: the quantization launches are skipped and the GEMM reads
    those codes (the layers that share an input -- q, k, v; gate, up -- quantize it once)."""

    __slots__ = (
        "quant_steps",
        "gemm_steps",
        "quant_bytes",
        "scratch_bytes",
        "out_shape",
        "out_dtype",
        "kernels",
        "_gemm_offset",
        "_lock",
    )

    def __init__(self, x, weight, out_dtype, fused=False, regime="graph"):
        self.out_dtype = np.dtype(out_dtype)
        m, n = x.shape[0], weight.shape[0]
        self.out_shape = (m, n)
        self._lock = threading.Lock()  # the prepared parameters are rewritten per call
        if fused:
            self._bind_fused(x, weight)
            return
        quant_scratch, gemm_scratch = _Scratch(_QUANT), _Scratch(_GEMM)
        fmt = weight.format  # the weight's one format object (seam.Fp8Format): scheme, blocks, scales
        e8m0 = fmt.activation_scale_rounding if fmt.activation_scale_format == "e8m0" else None
        launches, codes, scale_a = quantize_launches(
            x,
            str(fmt.activation_scheme),
            weight.input_scale,
            None if fmt.block_size is None else fmt.block_size[1],
            fmt.scale_ue8m0,
            quant_scratch,
            e8m0,
        )
        y = device.xp.empty(self.out_shape, dtype=self.out_dtype)
        if weight.block_size is None:
            call = gemm.GemmCall(codes, weight.data, scale_a, weight.weight_scale, self.out_dtype, weight.bias)
            kernel = gemm.select(call, regime=regime)
        else:
            call = block.BlockCall(
                codes, weight.data, scale_a, weight.weight_scale, weight.block_size, self.out_dtype, weight.bias
            )
            kernel = block.select(call, regime=regime)
        gemm_steps = kernel.steps(call, y, gemm_scratch)
        layout = _Layout(x, y, quant_scratch, gemm_scratch)
        self.quant_steps = tuple(_LaunchStep(launch, layout) for launch in launches)
        self.gemm_steps = tuple(
            _LaunchStep(step, layout) if type(step) is gemm.Launch else _MatmulStep(step, layout) for step in gemm_steps
        )
        self.quant_bytes = quant_scratch.nbytes
        self._gemm_offset = _aligned(quant_scratch.nbytes)
        self.scratch_bytes = self._gemm_offset + gemm_scratch.nbytes
        self.kernels = tuple(launch[0].pyfunc.__name__ for launch in launches) + (kernel.name,)

    def _bind_fused(self, x, weight):
        """The one-launch form: the tensor-core GEMV quantizes x as it reads it and writes y, so a
        call needs no scratch block and no other launch (``fused_reason`` said it serves)."""
        device.current()  # the device record (and its array module) for x's GPU
        y = device.xp.empty(self.out_shape, dtype=self.out_dtype)
        scale_b, input_scale, per_token, scale_ub, block_scales = _fused_arguments(weight)
        launches = tc_gemv.fused_launches(
            x,
            weight.data,
            scale_b,
            input_scale,
            per_token,
            scale_ub,
            self.out_dtype,
            weight.bias,
            out_bits(y),
            block_scales,
        )
        layout = _Layout(x, y)
        self.quant_steps = ()
        self.gemm_steps = tuple(_LaunchStep(launch[:4], layout, launch[4]) for launch in launches)
        self.quant_bytes = self.scratch_bytes = self._gemm_offset = 0
        self.kernels = tuple(
            tc_gemv.DENSE_WGMMA_KERNEL if launch[0].pyfunc.__name__ == tc_gemv.DENSE_WGMMA_KERNEL else FUSED_KERNEL
            for launch in launches
        )

    def enqueue(self, x_ptr, y_ptr, scratch_ptr, stream_ptr, alloc=None, quant_ptr=None):
        with self._lock:
            if quant_ptr is None:
                bases = (x_ptr, y_ptr, scratch_ptr, scratch_ptr + self._gemm_offset)
                for step in self.quant_steps:
                    step(bases, stream_ptr, alloc)
            else:
                bases = (x_ptr, y_ptr, quant_ptr, scratch_ptr + self._gemm_offset)
            for step in self.gemm_steps:
                step(bases, stream_ptr, alloc)

    def __call__(self, x, stream_ptr):
        xp = device.xp
        y = xp.empty(self.out_shape, dtype=self.out_dtype)
        scratch = xp.empty(self.scratch_bytes, dtype=np.uint8) if self.scratch_bytes else None
        if SIMULATOR:
            arrays = (np.ascontiguousarray(x), y, scratch, None if scratch is None else scratch[self._gemm_offset :])
            with self._lock:
                for step in self.quant_steps + self.gemm_steps:
                    step.simulate(arrays)
        else:
            self.enqueue(x.data.ptr, y.data.ptr, 0 if scratch is None else scratch.data.ptr, stream_ptr)
        return y


# -- the decode path: one fused launch in eager, the fastest kernels in a graph ------------------

FUSED_KERNEL = "fused_tensorcore_gemv"  # the name ``kernels`` gives the one-launch form


def _fused_arguments(weight):
    """(scale_b, input_scale, per_token, scale_ub, block_scales) of ``tc_gemv.fused_launches`` for
    the weight's activation scheme."""
    scheme = str(weight.format.activation_scheme)
    if scheme == "per_group":
        return None, None, False, None, weight.weight_scale
    return weight.weight_scale, weight.input_scale, scheme == "per_token", None, None


def dense_wgmma_serves(x, weight):
    """Whether ``weight``'s fused call on x [M, K] runs the dense wgmma launch (sm_90;
    ``tc_gemv.dense_wgmma_reason``), in eager code and in a graph alike."""
    scale_b, input_scale, per_token, _, block_scales = _fused_arguments(weight)
    mode = tc_gemv.fused_mode(block_scales is not None, per_token, input_scale)
    return tc_gemv.dense_wgmma_reason(x.shape[0], x.shape[1], mode, device.current(), weight.data.shape[0]) is None


def fused_reason(x, weight):
    """Why ``weight``'s call on x [M, K] (C-contiguous, 16-byte aligned) cannot be bound as the one
    fused launch (None when it can): the fused GEMV takes 1..16 rows, per-tensor or per-channel
    float32 weight scales (any activation scheme but MXFP8's), or 128 x 128 float32 blocks with float32
    1 x 128 activation groups, rounded as the CPU rounds them (not UE8M0)."""
    if "tensorcore_gemv" in gemm.disabled_kernels():
        return "the tensor-core GEMV is disabled by VT_DISABLE_KERNELS"
    fmt = weight.format
    block_size = fmt.block_size
    if block_size is not None:
        if block_size != (128, 128):
            return f"the fused GEMV takes 128 x 128 weight blocks, got {block_size}"
        if fmt.weight_scale_format != "float32" or fmt.activation_scale_format != "float32" or fmt.scale_ue8m0:
            return "the fused GEMV takes float32 block scales and float32 activation group scales (no E8M0, no UE8M0)"
    why = tc_gemv.fused_linear_reason(x, weight.data, block_scaled=block_size is not None)
    scheme = str(fmt.activation_scheme)
    m, k = x.shape
    if why is None and dense_wgmma_serves(x, weight):
        return None  # the one dense wgmma launch: any M <= 8 in one launch, the amax found in it
    if why is None and block_size is None:
        why = tc_gemv.fusion_reason(m, k, scheme == "per_token", scheme == "dynamic")
    if why is None:
        rows = tc_gemv.fused_rows(k, block_size is not None, scheme == "per_token", scheme == "dynamic")
        if rows < m:
            # sliced, each launch re-reads the whole weight: at M = 16, K = 4096 two slices took
            # 35.9 / 54.6 us (static / per_group) against 9.5-9.7 us for quantize + the GEMV (H200,
            # benchmarks/gpu/bench_host_decode.py, 2026-12-02)
            why = f"{rows} rows of K = {k} fit one fused launch's shared memory, got M = {m}"
    return why


class LinearBinding:
    """What one input signature of a linear layer binds: ``eager``, the call replayed when the stream
    is not capturing, and ``graph``, the one a CUDA graph captures -- the same object unless the
    kernel choice differs by regime (``gemm.decode_gemv_reason``; ``VT_DECODE_PATH``). At decode in
    eager code the GPU waits on the host, so there the one fused launch wins (no quantization launch,
    no cuBLASLt call, no scratch block); in a graph only device time counts, and the quantization
    kernel plus cuBLASLt is faster there (docs/DESIGN.md has the figures). ``why_not_fused`` says why
    the eager call is not the fused one (None when it is)."""

    __slots__ = ("eager", "graph", "why_not_fused", "by_regime")

    def __init__(self, eager, graph, why_not_fused):
        self.eager, self.graph, self.why_not_fused = eager, graph, why_not_fused
        # True when eager calls and captures run different kernels (then a call asks which it is)
        self.by_regime = eager is not graph

    def explain(self):
        text = f"eager: {' + '.join(self.eager.kernels)}"
        if self.by_regime:
            text += f"; graph capture: {' + '.join(self.graph.kernels)}"
        if self.why_not_fused is not None:
            text += f" (not the fused launch: {self.why_not_fused})"
        return text


def bind_linear(x, weight, out_dtype):
    """A ``LinearBinding`` for ``weight`` (an ``Fp8Weight`` whose arrays are on x's GPU) and inputs
    like ``x`` [M, K] (C-contiguous, 16-byte aligned), quantized by the weight's activation scheme:
    for each regime the GEMM its kernel order puts first (``gemm.decode_gemv_reason``), and where the
    tensor-core GEMV goes first, the one fused launch when it serves (``fused_reason``)."""
    out = _arrays.out_dtype_of(out_dtype)
    m = x.shape[0]

    # the dense wgmma launch (sm_90) is the fastest on the device too: both regimes take it, unless
    # VT_DECODE_PATH=split asks for the split path
    wgmma = _config.decode_path() != "split" and fused_reason(x, weight) is None and dense_wgmma_serves(x, weight)

    def bound_for(regime):
        why = None if wgmma else gemm.decode_gemv_reason(m, regime)
        if why is None:
            why = fused_reason(x, weight)
            if why is None:
                return BoundLinear(x, weight, out, fused=True), None
        return BoundLinear(x, weight, out, regime=regime), why

    eager, why = bound_for("eager")
    if wgmma or (gemm.decode_gemv_reason(m, "eager") is None) == (gemm.decode_gemv_reason(m, "graph") is None):
        return LinearBinding(eager, eager, why)  # one choice for both regimes
    graph, _ = bound_for("graph")
    return LinearBinding(eager, graph, why)


# -- the mixture-of-experts layer -------------------------------------------------------------------

_IDS, _WEIGHTS = 4, 5  # the routing inputs' per-call pointers (after x, y and the two scratch regions)


class _MoeLayout(_Layout):
    """``_Layout`` with the routing inputs as two more per-call sources."""

    def __init__(self, x, y, scratch, topk_ids, topk_weights):
        super().__init__(x, y, scratch)
        self.ranges += [(_pointer(topk_ids), topk_ids.nbytes, _IDS, 0)]
        self.ranges += [(_pointer(topk_weights), topk_weights.nbytes, _WEIGHTS, 0)]


class _AllocationCount:
    """Counts cupy pool allocations on this thread (cupy's memory hooks are per thread)."""

    def __init__(self):
        import cupy

        class Hook(cupy.cuda.MemoryHook):
            name = "vtnumba_bind_count"

            def __init__(self):
                self.count = 0

            def malloc_postprocess(self, **kwargs):
                self.count += 1

        self.hook = Hook()

    def __enter__(self):
        self.hook.__enter__()
        return self.hook

    def __exit__(self, *exc):
        return self.hook.__exit__(*exc)


class BoundMoe:
    """One ``moe_fp8`` call's launches for a signature (x's shape and dtype, the routing's shapes and
    dtypes, the two experts), prepared once: ``vtnumba.cuda.experts`` recorded them while the seam ran
    its steps (``bind_moe``). Per call, ``enqueue(x_ptr, ids_ptr, weights_ptr, y_ptr, scratch_ptr,
    stream_ptr)`` rewrites the five per-call pointers (y [T, H] of ``out_dtype``, a scratch block of
    ``scratch_bytes`` for every temporary: offsets, routed rows, codes, scales, the hidden
    activations) and enqueues the launches, bitwise the unbound call's. ``bound(x, ids, weights,
    stream_ptr)`` does it with cupy allocations and returns y. Nothing synchronizes, so a CUDA graph
    captures a bound call like any other."""

    __slots__ = ("steps", "scratch_bytes", "out_shape", "out_dtype", "kernels", "_lock")

    def __init__(self, steps, scratch_bytes, out_shape, out_dtype, kernels):
        self.steps = steps
        self.scratch_bytes = scratch_bytes
        self.out_shape, self.out_dtype = out_shape, out_dtype
        self.kernels = kernels
        self._lock = threading.Lock()  # the prepared parameters are rewritten per call

    def explain(self):
        return f"{len(self.kernels)} launches: {' + '.join(self.kernels)}"

    def enqueue(self, x_ptr, ids_ptr, weights_ptr, y_ptr, scratch_ptr, stream_ptr):
        bases = (x_ptr, y_ptr, scratch_ptr, scratch_ptr, ids_ptr, weights_ptr)
        with self._lock:
            for step in self.steps:
                step(bases, stream_ptr, None)

    def __call__(self, x, topk_ids, topk_weights, stream_ptr):
        xp = device.xp
        if SIMULATOR or self.out_dtype != _arrays.BFLOAT16:
            y = xp.empty(self.out_shape, dtype=self.out_dtype)
        else:  # cupy makes no bfloat16
            y = xp.empty(self.out_shape, dtype=np.uint16).view(self.out_dtype)
        scratch = xp.empty(max(self.scratch_bytes, 1), dtype=np.uint8)
        if SIMULATOR:
            arrays = (x, y, scratch, scratch, topk_ids, topk_weights)
            with self._lock:
                for step in self.steps:
                    step.simulate(arrays)
        else:
            self.enqueue(x.data.ptr, topk_ids.data.ptr, topk_weights.data.ptr, y.data.ptr, scratch.data.ptr, stream_ptr)
        return y


def bind_moe(x, topk_ids, topk_weights, run):
    """A ``BoundMoe`` of ``run()``, one ``moe_fp8`` call on exactly these arrays (C-contiguous, x
    16-byte aligned), recorded rather than run; or (None, why) when that call cannot be replayed by
    pointer: a step that reads the device on the host (``per_expert``), or one that made a device
    array of its own (a dtype conversion, a contiguous copy), which later calls would read stale.
    Returns (bound, None) or (None, reason)."""
    from . import experts

    scratch = _Scratch(_QUANT)
    try:
        if SIMULATOR:
            with experts.recording(scratch) as rec:
                run()
            foreign = 0
        else:
            import cupy

            # the bind-time arrays come from cupy's own pool (a torch caller's interop would hand out
            # torch's), where the count sees them; they are freed when the binding returns
            pool = cupy.cuda.using_allocator(cupy.get_default_memory_pool().malloc)
            with pool, _AllocationCount() as count, experts.recording(scratch) as rec:
                run()
            foreign = count.count - sum(1 for _, nbytes, _, _ in scratch.parts if nbytes) - (rec.output.nbytes > 0)
    except experts.Unbindable as why:
        return None, str(why)
    if foreign:
        return None, f"{foreign} device array(s) made outside the steps' scratch (a conversion or a copy)"
    y = rec.output
    layout = _MoeLayout(x, y, scratch, topk_ids, topk_weights)
    steps = tuple(_LaunchStep(launch, layout, shared) for launch, shared in rec.launches)
    kernels = tuple(launch[0].pyfunc.__name__ for launch, _ in rec.launches)
    return BoundMoe(steps, scratch.nbytes, tuple(y.shape), np.dtype(y.dtype), kernels), None


__all__ = ["BoundLinear", "LinearBinding", "bind_linear", "fused_reason", "FUSED_KERNEL", "BoundMoe", "bind_moe"]
