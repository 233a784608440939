"""cuBLASLt FP8 (e4m3) GEMM through nvmath-python's low-level bindings, on cupy arrays.

The mapping (verified on the H200, DEVICE.md): cuBLASLt is column-major and vtnumba row-major, so
the row-major y[M, N] is the column-major D[N, M], and

    D[N, M] = op(A) @ op(B),  A = the weight b [N, K] (row-major = column-major [K, N]), TRANSA = T
                              B = the activation a [M, K] (row-major = column-major [K, M]), TRANSB = N

the "TN" form, the only FP8 layout Hopper's cuBLASLt implements. Hence the swaps below: cuBLASLt's
A scale is the weight's scale ``scale_b`` (per-channel = per row of op(A)), its B scale the
activation's ``scale_a`` (per-row = per column of op(B)), and its bias vector runs along D's rows,
that is along y's columns n.

What one call costs: a plan (matmul descriptor, three layouts, the heuristic's algorithm) is built
once per (shape, leading dimensions, dtypes, bias type, scale modes, pointer alignments) and cached
per device; a call then sets the scale and bias pointers on the cached descriptor and enqueues
``cublasLtMatmul`` on cupy's current stream. Nothing synchronizes the host, so the call can be
captured into a CUDA graph once its plan and workspace exist (warm it up first).

Precision contract: FAST_ACCUM off (f32 accumulation, DESIGN.md); for per-tensor scales the result
is bit-identical to torch._scaled_mm, which calls the same cuBLASLt routine the same way.

Kernels never validate: ``vtnumba.cuda.gemm`` decides whether a call fits here (``plan_or_reason``)
before running it.
"""

import threading

import numpy as np

from ... import _arrays, _faults

_HEURISTIC = _faults.register("cublaslt.heuristic", "cuBLASLt's algorithm query, when a plan is made")
_MATMUL = _faults.register("cublaslt.matmul", "the cublasLtMatmul call that enqueues a GEMM")

_lt = _cublas = _nvmath = None
_IMPORT_ERROR = None


def _bindings():
    """nvmath's cuBLASLt bindings, imported on first use (nvmath loads libcublasLt itself)."""
    global _lt, _cublas, _nvmath, _IMPORT_ERROR
    if _lt is None and _IMPORT_ERROR is None:
        try:
            import nvmath
            from nvmath.bindings import cublas, cublasLt
        except Exception as exc:  # ImportError, or libcublasLt not found
            _IMPORT_ERROR = exc
        else:
            _lt, _cublas, _nvmath = cublasLt, cublas, nvmath
    return _lt


def unavailable_reason():
    """None when cuBLASLt can be used, else why not (one sentence)."""
    if _bindings() is None:
        return (
            f"nvmath-python's cuBLASLt bindings are not importable "
            f"({_IMPORT_ERROR.__class__.__name__}: {_IMPORT_ERROR}); install nvmath-python"
        )
    return None


# Workspace per (device, stream): 32 MiB, what torch gives cuBLASLt on Hopper. One per stream so that
# two streams never share scratch memory.
WORKSPACE_BYTES = 32 << 20

# cuBLASLt's bias type for FP8 inputs (cublasLtMatmul's FP8 type table): bf16 D -> bf16 bias, f16 D
# -> f16 bias, f32 D -> bf16 bias. Any other bias dtype cannot be expressed exactly by the library's
# epilogue (a float32 bias would have to be rounded first), so such calls go to the f32-staged path
# (``gemm.py``: cuBLASLt accumulates into float32, a Numba epilogue adds the exact bias).
BIAS_TYPE_FOR_OUT = {
    np.dtype(np.float32): _arrays.BFLOAT16,
    np.dtype(np.float16): np.dtype(np.float16),
    _arrays.BFLOAT16: _arrays.BFLOAT16,
}

# Scale modes (the plan key speaks in these; mapped to cublasLtMatmulMatrixScale_t at plan time)
SCALAR, VECTOR = "scalar", "vector"
# Block scaling (cuBLASLt >= 12.9 on sm_90): the weight (cuBLASLt's A) in 128 x 128 blocks
# (BLK128x128_32F), the activation (B) in 1 x 128 groups along K (VEC128_32F)
BLOCK_128x128, GROUP_128 = "block128x128", "group128"
_BLOCK_MODES = {SCALAR: "SCALAR_32F", VECTOR: "OUTER_VEC_32F", BLOCK_128x128: "BLK128x128_32F", GROUP_128: "VEC128_32F"}

# cuBLASLt 12.9 added OUTER_VEC_32F (per-row x per-column f32 scales) for FP8 on Hopper.
_OUTER_VEC_MIN_VERSION = 120900


def outer_vec_reason(cc, version):
    """None when cuBLASLt ``version`` (cublasLtGetVersion's integer) runs OUTER_VEC_32F scales on
    compute capability ``cc``, else why not."""
    if tuple(cc) < (9, 0):
        return f"per-row/per-channel scales need sm_90+ in cuBLASLt (OUTER_VEC_32F), this GPU is sm_{cc[0]}{cc[1]}"
    if version < _OUTER_VEC_MIN_VERSION:
        return f"per-row/per-channel scales need cuBLASLt >= 12.9 (OUTER_VEC_32F), found version {version}"
    return None


def block_reason(cc, version):
    """None when cuBLASLt ``version`` runs 128 x 128 block scales (VEC128_32F x BLK128x128_32F) on
    compute capability ``cc``, else why not. cuBLAS 12.9 added them for Hopper ("channel- and
    block-scaled FP8 matmuls on NVIDIA Hopper"); Blackwell's block-scaled tensor cores (sm_10x,
    GB10's sm_12x) take the MX formats instead (32-element blocks with UE8M0 scales), another
    checkpoint format."""
    if cc[0] != 9:
        extra = (
            " (it has cuBLASLt's MXFP8 block modes instead: 32-element blocks with UE8M0 scales, a different format)"
            if cc[0] >= 10
            else ""
        )
        return (
            f"cuBLASLt's 128x128 block scales (VEC128_32F x BLK128x128_32F) run on Hopper (sm_90) only, "
            f"this GPU is sm_{cc[0]}{cc[1]}{extra}"
        )
    if version < _OUTER_VEC_MIN_VERSION:
        return (
            f"128x128 block scales need cuBLASLt >= 12.9, found "
            f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
        )
    return None


_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)
_ONE_ADDR = _ONE.ctypes.data
_ZERO_ADDR = _ZERO.ctypes.data


def alignment(ptr):
    """The largest power of two (up to 256) dividing a device pointer: cuBLASLt's alignment preference."""
    ptr = int(ptr)
    return 256 if ptr % 256 == 0 else ptr & -ptr


def _cuda_type(dt):
    t = _nvmath.CudaDataType
    return {np.dtype(np.float32): t.CUDA_R_32F, np.dtype(np.float16): t.CUDA_R_16F, _arrays.BFLOAT16: t.CUDA_R_16BF}[
        np.dtype(dt)
    ]


class CublasLtError(RuntimeError):
    """A cuBLASLt call failed; the message names the call and cuBLASLt's status."""


# Statuses that say something about the moment (memory, the device), not about the call: a plan that
# failed with one of them is not remembered as impossible (the call may get its plan next time)
_TRANSIENT = ("ALLOC_FAILED", "EXECUTION_FAILED", "INTERNAL_ERROR", "NOT_INITIALIZED")


def _check(what, fn, *args):
    try:
        return fn(*args)
    except _lt.cuBLASLtError as exc:  # its message carries the status name (CUBLAS_STATUS_...)
        raise CublasLtError(f"cuBLASLt {what} failed: {exc}") from None


def _set_attr(setter, obj, attr, value, get_dtype):
    buf = np.array([value], dtype=get_dtype(attr))
    _check(f"setting {attr.name}", setter, obj, attr, buf.ctypes.data, buf.nbytes)


class Plan:
    """One cuBLASLt matmul configuration: descriptor, layouts, algorithm. Reused across calls of the
    same key; only the scale and bias pointers change per call."""

    __slots__ = (
        "key",
        "desc",
        "layout_a",
        "layout_b",
        "layout_d",
        "heuristic",
        "algo_addr",
        "has_bias",
        "_ptr",
        "_ptr_addr",
        "_attr_scale_a",
        "_attr_scale_b",
        "_attr_bias",
        "_last_pointers",
        "__weakref__",
    )

    def __init__(self, handle, key, workspace_bytes, pointers=None):
        lt, cublas = _lt, _cublas
        self.key = key
        (m, n, k, lda, ldb, out_dt, bias_dt, mode_a, mode_b, align_a, align_b, align_d) = key
        A = lt.MatmulDescAttribute
        dtype_of = lt.get_matmul_desc_attribute_dtype
        self.desc = self.layout_a = self.layout_b = self.layout_d = None
        self.desc = _check(
            "matmul_desc_create", lt.matmul_desc_create, cublas.ComputeType.COMPUTE_32F, _nvmath.CudaDataType.CUDA_R_32F
        )
        setd = lt.matmul_desc_set_attribute
        _set_attr(setd, self.desc, A.TRANSA, cublas.Operation.T, dtype_of)
        _set_attr(setd, self.desc, A.TRANSB, cublas.Operation.N, dtype_of)
        _set_attr(setd, self.desc, A.FAST_ACCUM, 0, dtype_of)  # the f32-accumulate contract
        scale_mode = lt.MatmulMatrixScale
        # cuBLASLt's A is our weight: its scale is scale_b; its B is our activation: scale_a.
        if mode_b != SCALAR or mode_a != SCALAR:
            _set_attr(setd, self.desc, A.A_SCALE_MODE, getattr(scale_mode, _BLOCK_MODES[mode_b]), dtype_of)
            _set_attr(setd, self.desc, A.B_SCALE_MODE, getattr(scale_mode, _BLOCK_MODES[mode_a]), dtype_of)
        self.has_bias = bias_dt is not None
        if self.has_bias:
            _set_attr(setd, self.desc, A.EPILOGUE, lt.Epilogue.BIAS, dtype_of)
            _set_attr(setd, self.desc, A.BIAS_DATA_TYPE, _cuda_type(bias_dt), dtype_of)
        # one reusable 8-byte host cell for the per-call pointer attributes (no allocation per call)
        self._ptr = np.zeros(1, dtype=np.uint64)
        self._ptr_addr = self._ptr.ctypes.data
        self._attr_scale_a = A.A_SCALE_POINTER
        self._attr_scale_b = A.B_SCALE_POINTER
        self._attr_bias = A.BIAS_POINTER
        self._last_pointers = (None, None, None)  # (scale_b, scale_a, bias) as last set on desc
        if pointers is not None:  # block scaling wants its scale pointers before the heuristic query
            self.set_pointers(*pointers)
        e4m3 = _nvmath.CudaDataType.CUDA_R_8F_E4M3
        self.layout_a = _check("matrix_layout_create", lt.matrix_layout_create, e4m3, k, n, ldb)
        self.layout_b = _check("matrix_layout_create", lt.matrix_layout_create, e4m3, k, m, lda)
        self.layout_d = _check("matrix_layout_create", lt.matrix_layout_create, _cuda_type(out_dt), n, m, n)
        pref = _check("matmul_preference_create", lt.matmul_preference_create)
        try:
            P = lt.MatmulPreferenceAttribute
            pdtype = lt.get_matmul_preference_attribute_dtype
            setp = lt.matmul_preference_set_attribute
            _set_attr(setp, pref, P.MAX_WORKSPACE_BYTES, workspace_bytes, pdtype)
            # alignment of the actual pointers (sliced views are less aligned than allocations)
            _set_attr(setp, pref, P.MIN_ALIGNMENT_A_BYTES, align_b, pdtype)
            _set_attr(setp, pref, P.MIN_ALIGNMENT_B_BYTES, align_a, pdtype)
            _set_attr(setp, pref, P.MIN_ALIGNMENT_C_BYTES, align_d, pdtype)
            _set_attr(setp, pref, P.MIN_ALIGNMENT_D_BYTES, align_d, pdtype)
            self.heuristic = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
            count = np.zeros(1, dtype=np.int32)
            if _faults.armed:
                _faults.fire(_HEURISTIC, f"plan of [M, N, K] = {key[:3]}")
            # C is D (beta = 0), so C takes D's layout
            _check(
                "matmul_algo_get_heuristic",
                lt.matmul_algo_get_heuristic,
                handle,
                self.desc,
                self.layout_a,
                self.layout_b,
                self.layout_d,
                self.layout_d,
                pref,
                1,
                self.heuristic.ctypes.data,
                count.ctypes.data,
            )
            if count[0] < 1:
                raise CublasLtError("cuBLASLt matmul_algo_get_heuristic found no algorithm")
        finally:
            lt.matmul_preference_destroy(pref)
        self.algo_addr = self.heuristic.ctypes.data  # the algo is the result struct's first field

    def _set_pointer(self, attr, ptr):
        self._ptr[0] = ptr
        _lt.matmul_desc_set_attribute(self.desc, attr, self._ptr_addr, 8)

    def run(self, handle, a_ptr, b_ptr, scale_a_ptr, scale_b_ptr, bias_ptr, d_ptr, workspace, stream_ptr):
        """Enqueue D = (a @ b^T) * scales (+ bias). All pointers are device pointers (ints);
        ``workspace`` is (pointer, bytes, ...) as ``DeviceState.workspace_for`` gives it.

        The descriptor keeps the pointer attributes between calls, and cuBLASLt reads them when a
        matmul is enqueued, so only those that changed are set again (a layer's weight scale, bias
        and a static activation scale keep their buffers: ~1 us of host time per call saved).
        Callers hold the device state's lock."""
        if (scale_b_ptr, scale_a_ptr, bias_ptr) != self._last_pointers:
            self.set_pointers(scale_a_ptr, scale_b_ptr, bias_ptr)
        self.enqueue(handle, a_ptr, b_ptr, d_ptr, workspace[0], workspace[1], stream_ptr)

    def set_pointers(self, scale_a_ptr, scale_b_ptr, bias_ptr):
        """Set the scale and bias pointer attributes that differ from those set last."""
        last = self._last_pointers
        if scale_b_ptr != last[0]:
            self._set_pointer(self._attr_scale_a, scale_b_ptr)  # cuBLASLt's A is the weight b
        if scale_a_ptr != last[1]:
            self._set_pointer(self._attr_scale_b, scale_a_ptr)
        if self.has_bias and bias_ptr != last[2]:
            self._set_pointer(self._attr_bias, bias_ptr)
        self._last_pointers = (scale_b_ptr, scale_a_ptr, bias_ptr)

    def enqueue(self, handle, a_ptr, b_ptr, d_ptr, workspace_ptr, workspace_bytes, stream_ptr):
        """Enqueue the matmul with the pointer attributes as set (the per-call part of ``run``)."""
        if _faults.armed:
            _faults.fire(_MATMUL, f"[M, N, K] = {self.key[:3]}")
        try:
            _lt.matmul(
                handle,
                self.desc,
                _ONE_ADDR,
                b_ptr,
                self.layout_a,
                a_ptr,
                self.layout_b,
                _ZERO_ADDR,
                d_ptr,
                self.layout_d,
                d_ptr,
                self.layout_d,
                self.algo_addr,
                workspace_ptr,
                workspace_bytes,
                stream_ptr,
            )
        except _lt.cuBLASLtError as exc:
            raise CublasLtError(f"cuBLASLt matmul failed: {exc}") from None

    def destroy(self):
        lt = _lt
        for layout in (self.layout_a, self.layout_b, self.layout_d):
            if layout is not None:
                lt.matrix_layout_destroy(layout)
        if self.desc is not None:
            lt.matmul_desc_destroy(self.desc)
        self.desc = self.layout_a = self.layout_b = self.layout_d = None


class DeviceState:
    """One cuBLASLt handle per device, with that device's plans and workspaces (held by the
    device's record, ``vtnumba.cuda.device.GpuDevice.cublaslt``)."""

    def __init__(self, device):
        if _bindings() is None:
            raise RuntimeError(unavailable_reason())
        import cupy

        with cupy.cuda.Device(device.ordinal):
            self.handle = _check("create", _lt.create)
        self.cc = device.cc
        self.version = _lt.get_version()
        self.lock = threading.Lock()
        self.plans = {}  # key -> Plan, or the reason (str) the key cannot run
        self.workspaces = {}  # stream ptr -> (pointer, bytes, owner): see workspace_for

    @property
    def outer_vec_reason(self):
        return outer_vec_reason(self.cc, self.version)

    @property
    def block_reason(self):
        return block_reason(self.cc, self.version)

    def plan_or_reason(self, key, pointers=None):
        found = self.plans.get(key)
        if found is not None:
            return found
        with self.lock:
            found = self.plans.get(key)
            if found is None:
                try:
                    found = Plan(self.handle, key, WORKSPACE_BYTES, pointers)
                except CublasLtError as exc:
                    if any(status in str(exc) for status in _TRANSIENT):
                        raise  # not a property of the call: caching it would route it elsewhere for good
                    found = f"cuBLASLt has no plan for this call ({exc})"
                self.plans[key] = found
        return found

    def new_plan(self, key, pointers=None):
        """A plan of its own for ``key`` (one that can run: ``plan_or_reason`` said so), for a bound
        call that keeps its pointer attributes; ``pointers`` as ``plan_or_reason`` takes them."""
        return Plan(self.handle, key, WORKSPACE_BYTES, pointers)

    def workspace_for(self, stream_ptr, alloc=None):
        """(pointer, bytes, owner) of cuBLASLt's workspace for a matmul on this stream.

        Each stream has one of its own, allocated at its first matmul from cupy's default memory
        pool -- never from torch's or a graph's pool, and never freed -- so that a CUDA graph
        captured later on the stream may hold its address. A stream first met while it is being
        captured gets a workspace for this call only, from ``alloc(nbytes)`` (default: cupy's
        current allocator), in the graph's memory: a persistent one there would pin the graph's
        pool, and torch's CUDA-graph trees reclaim such memory. torch scopes its own cuBLAS
        workspaces to captured calls the same way (pytorch/pytorch#193832)."""
        ws = self.workspaces.get(stream_ptr)
        if ws is not None:
            return ws
        import cupy

        if cupy.cuda.runtime.streamIsCapturing(stream_ptr):
            owner = alloc(WORKSPACE_BYTES) if alloc is not None else cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)
            return _pointer(owner), WORKSPACE_BYTES, owner
        with self.lock:
            ws = self.workspaces.get(stream_ptr)
            if ws is None:
                memory = cupy.get_default_memory_pool().malloc(WORKSPACE_BYTES)
                ws = self.workspaces[stream_ptr] = (memory.ptr, WORKSPACE_BYTES, memory)
        return ws


def _pointer(owner):
    """The device pointer of a cupy array or a torch tensor."""
    data = getattr(owner, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return data.ptr
    return owner.data_ptr()


def plan_key(a, b, out_dtype, bias_dtype, mode_a, mode_b, d_align=256):
    """The plan cache key of a call: shape, leading dimensions (in elements = bytes for e4m3),
    out dtype, bias dtype (or None), scale modes and pointer alignments."""
    m, k = a.shape
    n = b.shape[0]
    return (
        m,
        n,
        k,
        a.strides[0],
        b.strides[0],
        out_dtype,
        bias_dtype,
        mode_a,
        mode_b,
        alignment(a.data.ptr),
        alignment(b.data.ptr),
        d_align,
    )


_get_current_stream = None  # cupy.cuda.get_current_stream, bound at the first call


def matmul(plan, state, a, b, scale_a, scale_b, bias, d):
    """Run ``plan`` on cupy arrays: a [M, K] / b [N, K] uint8 (row stride = leading dimension,
    contiguous rows), scale_a / scale_b float32 device arrays (1,) or (M,) / (N,), bias None or a
    contiguous device vector of the plan's bias type, d the contiguous [M, N] output."""
    global _get_current_stream
    if _get_current_stream is None:
        import cupy

        _get_current_stream = cupy.cuda.get_current_stream
    stream_ptr = _get_current_stream().ptr
    workspace = state.workspace_for(stream_ptr)
    with state.lock:  # the descriptor's pointer attributes are shared state
        plan.run(
            state.handle,
            a.data.ptr,
            b.data.ptr,
            scale_a.data.ptr,
            scale_b.data.ptr,
            0 if bias is None else bias.data.ptr,
            d.data.ptr,
            workspace,
            stream_ptr,
        )
    return d


__all__ = [
    "unavailable_reason",
    "outer_vec_reason",
    "block_reason",
    "DeviceState",
    "plan_key",
    "matmul",
    "alignment",
    "Plan",
    "CublasLtError",
    "BIAS_TYPE_FOR_OUT",
    "SCALAR",
    "VECTOR",
    "BLOCK_128x128",
    "GROUP_128",
    "WORKSPACE_BYTES",
]
