"""The GPU FP8 GEMM: which kernel runs a call, and the fused FP8 linear layer for decode.

``scaled_mm`` computes DESIGN.md's ``y = round_out((sum_k dec(a) dec(b)) * sa * sb + bias)`` on
cupy arrays. Kernels are tried in priority order by ``registry.choose``, in the style of vLLM's
scaled-mm kernel selection (``vllm/model_executor/layers/quantization/kernels/scaled_mm/__init__.py``): each kernel says whether
it can run this call and, if not, why; the first that can, runs; when none can, one error lists
every reason. ``VT_DISABLE_KERNELS=name1,name2`` (read at every call) takes kernels out of the list;
``kernel=`` forces one by name (tests, benchmarks).

The kernels, and where each applies:

``cublaslt``               cuBLASLt does everything: scales (per-tensor scalars, or per-row x
                           per-channel vectors through OUTER_VEC_32F on sm_90 with cuBLASLt >= 12.9,
                           from M = OUTER_VEC_MIN_M on),
                           the bias epilogue when the bias has cuBLASLt's type for the output
                           (bf16 -> bf16, f16 -> f16, f32 -> bf16), rounding to the output type.
                           Needs K % 16 == 0, N % 16 == 0, 16-byte aligned pointers and rows.
``cublaslt_f32_epilogue``  cuBLASLt accumulates into float32, then a Numba epilogue applies the
                           scales, adds the bias and rounds: every call cuBLASLt's own epilogue cannot
                           express exactly (a float32 bias with a bf16 output would otherwise have to
                           be rounded to bf16 first; scale vectors where OUTER_VEC is unavailable or
                           slower: M < OUTER_VEC_MIN_M).
``decode_gemv``            the Numba decode kernel for M <= 4 (gemv.py): streams the weight
                           with 128-bit loads, aiming at memory speed where cuBLASLt reads the
                           weight at 45-92% of the ceiling (ANCHORS.md); tried before cuBLASLt for
                           M <= DECODE_GEMV_PREFERRED_MAX_M (see its comment for the measurement).
``tiled``                  the Numba tiled GEMM: any shape, any strides; the path for shapes
                           cuBLASLt refuses and for the lever (VT_DENSE_CUBLASLT_FP8=0) turned off.
``wgmma``, ``wgmma_k32``   (by name only) the GEMM on Hopper's native FP8 warpgroup MMA (kernels/sm90_wgmma_gemm.py,
                           sm_90): 0.5x cuBLASLt at 4096^3 with promotion per 128 of K (``wgmma_k32``:
                           per k32, 0.35x), within the tensor-core bound cuBLASLt is held to rather
                           than strict G3.

Precision (measured on the H200, 2026-11-29): cuBLASLt's FP8 GEMM is bit-identical to
torch._scaled_mm, but it does not accumulate every product in float32 (FAST_ACCUM is off): on codes
drawn uniformly over the whole e4m3 range its error reached ~16x DESIGN.md's G3 bound at K = 256,
in the in-library and the f32-staged path alike (same bits), and layers whose weight rows span a
10x range of magnitudes under one per-tensor scale exceed G3 too (tests/test_seam_gpu.py). That
points at the Hopper tensor cores summing each k-group of FP8 products at reduced precision before
the float32 accumulation; ``vtnumba.testing.reference.tensor_core_bound`` is the bound the tests
hold it to. The Numba kernels meet G3 everywhere. A caller who needs the strict float32-accumulation
contract turns cuBLASLt off with the lever (VT_DENSE_CUBLASLT_FP8=0).

Scales given as host scalars are uploaded once into a small cached device buffer (per device and
value), so a call never transfers or synchronizes once warm; graph capture needs a warm-up call
with the same scale values first (the plan, the workspace and the scale buffers then exist).
"""

from typing import NamedTuple

import numpy as np

from .. import _config
from . import quantize
from .kernels import gemv, tc_gemm, tc_gemv, tiled
from .kernels import sm90_wgmma_gemm as wg_gemm
from .kernels.epilogue import OUT_KIND, bias_bits, epilogue_launch, out_bits, scale_vector
from .ptx.target import SIMULATOR
from .registry import choose
from .runtime import cublaslt, device

# Up to this M the decode GEMV is tried before cuBLASLt. 0 = cuBLASLt first at every M, by the H200
# (benchmarks/gpu/bench_gpu_gemm.py and sweep_gemv.py, 2026-11-29): at M = 1, N = K = 4096 the GEMV takes
# 8.9-9.4 us against cuBLASLt's 6.2 (= torch._scaled_mm); 1.2-1.6x slower on every shape, 3.5-5.6x
# at M = 4. The reason is arithmetic, not memory: an exact float32 accumulation on CUDA cores decodes
# every weight byte (3 integer operations at half the FMA rate) and every activation value per
# block, ~240 issue slots per 16 weight bytes, which at the H200's ~33 T lane-operations/s is ~7 us
# for 16 MiB before a byte is late; cuBLASLt's tensor cores decode for free (and accumulate less
# exactly, see above). The GEMV runs wherever cuBLASLt cannot (the lever off, misaligned operands)
# and it is the one-launch path of ``fp8_linear``.
DECODE_GEMV_PREFERRED_MAX_M = 0

_F32 = np.dtype(np.float32)

# From this M on, per-row x per-channel scales run in cuBLASLt's OUTER_VEC_32F plans; below it in the
# f32-staged path (cuBLASLt into float32, then the 8-wide Numba epilogue). On the H200 (2026-12-01,
# benchmarks/gpu/bench_torch_model.py, the Llama-3-8B MLP) cuBLASLt's heuristic gave OUTER_VEC one
# 128 x 128 tile at every M ("..._ovscale_TNT"): 107 / 103 us at M = 1 / 16 against the f32-staged
# path's 78 / 79 us; at M = 256 and 4096 OUTER_VEC won (125 against 142 us, 1288 against 1555 us).
# The crossover lies between 16 and 256; 128 is between them, not measured there.
OUTER_VEC_MIN_M = 128


class GemmCall:
    """One scaled_mm call, normalized once and shared by every kernel's can_implement / run."""

    __slots__ = (
        "a",
        "b",
        "scale_a",
        "sa_step",
        "scale_b",
        "sb_step",
        "out_dtype",
        "bias",
        "m",
        "n",
        "k",
        "device",
        "plan",
        "state",
    )

    def __init__(self, a, b, scale_a, scale_b, out_dtype, bias):
        self.device = dev = device.current()
        self.a, self.b = a, b
        self.m, self.k = a.shape
        self.n = b.shape[0]
        self.scale_a, self.sa_step = scale_vector(scale_a, self.m, dev)
        self.scale_b, self.sb_step = scale_vector(scale_b, self.n, dev)
        self.out_dtype = np.dtype(out_dtype)
        self.bias = bias
        self.plan = self.state = None


# ------------------------------------------------------------------------------------------------
# the kernels


def _cublaslt_reason(call):
    """Why cuBLASLt cannot take this call's operands at all (None if it can)."""
    if not _config.dense_cublaslt_fp8_enabled():
        return "turned off by the lever VT_DENSE_CUBLASLT_FP8"
    if SIMULATOR:
        return "cuBLASLt needs a real GPU (running under the CUDA simulator)"
    reason = cublaslt.unavailable_reason()
    if reason:
        return reason
    a, b = call.a, call.b
    if call.k % 16 or call.n % 16:
        return f"cuBLASLt FP8 needs K and N to be multiples of 16, got K = {call.k}, N = {call.n}"
    if a.strides[1] != 1 or b.strides[1] != 1:
        return "cuBLASLt needs rows with contiguous K (unit column stride)"
    if a.strides[0] % 16 or b.strides[0] % 16:
        return f"cuBLASLt FP8 needs row strides that are multiples of 16 bytes, got {a.strides[0]} and {b.strides[0]}"
    if a.data.ptr % 16 or b.data.ptr % 16:
        return "cuBLASLt FP8 needs 16-byte aligned a and b (a view starting mid-row is not)"
    return None


def _take_plan(call, out_dtype, bias_dtype, mode_a, mode_b, pointers=None):
    """(True, "") with cuBLASLt's cached plan for ``call`` in these settings kept on the call for
    ``steps``, or (False, why) when cuBLASLt has none. ``pointers`` (scale_a, scale_b, bias) are set
    on a new plan's descriptor before its heuristic query (vector and block scales need them)."""
    state = call.device.cublaslt()
    plan = state.plan_or_reason(cublaslt.plan_key(call.a, call.b, out_dtype, bias_dtype, mode_a, mode_b), pointers)
    if isinstance(plan, str):
        return False, plan
    call.plan, call.state = plan, state
    return True, ""


def _bias_for_cublaslt(call):
    """The bias as cuBLASLt's epilogue reads it (contiguous, 16-byte aligned), or None."""
    bias = call.bias
    if bias is not None and not bias.flags.c_contiguous:
        bias = device.xp.ascontiguousarray(bias)
    return bias


# Each kernel says what a call enqueues as a list of steps (``steps(call, y, scratch)``): kernel
# launches and cuBLASLt matmuls, on the call's operands, into the output y, with any temporary it
# needs (the f32-staged path's accumulator) taken from ``scratch(shape, dtype)``. ``run`` enqueues
# them at once; ``vtnumba.cuda.bound`` prepares them once and replays them with new pointers for the
# activation, its scales, the output and the temporaries, call after call: the very same work.


class Launch(NamedTuple):
    """A kernel launch: ``kernel(grid, block, *args)``."""

    kernel: object
    grid: object
    block: object
    args: tuple


class Matmul(NamedTuple):
    """A cuBLASLt matmul of ``plan`` (``cublaslt.matmul``'s arguments)."""

    plan: object
    state: object
    a: object
    b: object
    scale_a: object
    scale_b: object
    bias: object
    d: object


def fresh_scratch(shape, dtype):
    """The scratch of an immediate call: a new array (cupy's current allocator)."""
    return device.xp.empty(shape, dtype=dtype)


def run_steps(steps):
    """Enqueue ``steps`` on cupy's current stream."""
    for step in steps:
        if type(step) is Launch:
            step.kernel(step.grid, step.block, *step.args)
        else:
            cublaslt.matmul(*step)


def execute(kernel, call):
    """Run ``call`` on ``kernel`` (one that said it can): y [M, N] of the call's output dtype."""
    y = device.xp.empty((call.m, call.n), dtype=call.out_dtype)
    run_steps(kernel.steps(call, y, fresh_scratch))
    return y


class Kernel:
    """What every GEMM kernel choice is: ``name``, ``can_implement(call)`` -> (ok, why not),
    ``steps(call, y, scratch)``; ``run(call)`` enqueues its steps now and returns y."""

    name = ""

    def run(self, call):
        return execute(self, call)


class _NumbaKernel(Kernel):
    """A kernel written in Numba: ``launch(call, y_bits)`` says what it enqueues (kernel, grid,
    block, arguments), ``y_bits`` among the arguments."""

    def steps(self, call, y, scratch):
        return [Launch(*self.launch(call, out_bits(y)))]


def _vector_pointers(call, bias):
    """The scale (and bias) pointers cuBLASLt must see before its heuristic query when a scale is a
    vector: its OUTER_VEC_32F mode refuses a plan without them ("The scaling mode for A scale
    (OUTER_VEC_32F) requires a custom pointer for A scale", its log says), the rule block scaling has
    too. Any valid pointers serve: a plan's pointers are set again per call."""
    if not (call.sa_step or call.sb_step):
        return None
    return call.scale_a.data.ptr, call.scale_b.data.ptr, 0 if bias is None else bias.data.ptr


class _OnCublasLt(Kernel):
    """A kernel whose GEMM is cuBLASLt's: it takes a call only where cuBLASLt takes the operands
    (``_cublaslt_reason``) and has a plan for the call's settings (``take_plan``)."""

    def can_implement(self, call, named=False):
        reason = _cublaslt_reason(call)
        return (False, reason) if reason else self.take_plan(call)


class CublasLt(_OnCublasLt):
    name = "cublaslt"

    def take_plan(self, call):
        bias_dt = None
        if call.bias is not None:
            bias_dt = np.dtype(call.bias.dtype)
            want = cublaslt.BIAS_TYPE_FOR_OUT[call.out_dtype]
            if bias_dt != want:
                return False, (
                    f"cuBLASLt's FP8 bias epilogue takes a {want} bias for {call.out_dtype} "
                    f"output, got {bias_dt} (it would be rounded)"
                )
            if call.bias.data.ptr % 16:
                return False, "cuBLASLt's bias must be 16-byte aligned"
        mode_a = mode_b = cublaslt.SCALAR
        if call.sa_step or call.sb_step:
            reason = call.device.cublaslt().outer_vec_reason
            if reason:
                return False, reason
            # OUTER_VEC_32F scales both operands or neither: a scalar beside a vector found no plan on
            # the H200 (every per-token call at M = 1 fell to the f32-staged path). A scalar is the
            # vector of a one-row operand; a per-tensor weight scale beside per-row ones is not.
            if (not call.sb_step and call.n > 1) or (not call.sa_step and call.m > 1):
                return False, (
                    "cuBLASLt's per-row x per-channel scales (OUTER_VEC_32F) need a vector on both "
                    "sides: a per-tensor scale beside per-row ones takes the f32-staged path"
                )
            if call.m < OUTER_VEC_MIN_M:
                return False, (
                    f"cuBLASLt's OUTER_VEC_32F plans are slower than the f32-staged path below "
                    f"M = {OUTER_VEC_MIN_M} (measured), got M = {call.m}"
                )
            mode_a = mode_b = cublaslt.VECTOR
        return _take_plan(call, call.out_dtype, bias_dt, mode_a, mode_b, _vector_pointers(call, call.bias))

    def steps(self, call, y, scratch):
        return [Matmul(call.plan, call.state, call.a, call.b, call.scale_a, call.scale_b, _bias_for_cublaslt(call), y)]


class CublasLtF32Epilogue(_OnCublasLt):
    name = "cublaslt_f32_epilogue"

    def take_plan(self, call):
        return _take_plan(call, np.dtype(np.float32), None, cublaslt.SCALAR, cublaslt.SCALAR)

    def steps(self, call, y, scratch):
        acc = scratch((call.m, call.n), _F32)
        one = call.device.scalar(1.0)
        return [
            Matmul(call.plan, call.state, call.a, call.b, one, one, None, acc),  # f32(sum_k ...)
            Launch(
                *epilogue_launch(
                    acc,
                    out_bits(y),
                    call.scale_a,
                    call.sa_step,
                    call.scale_b,
                    call.sb_step,
                    *bias_bits(call.bias, call.device),
                    OUT_KIND[call.out_dtype],
                )
            ),
        ]


class DecodeGemv(_NumbaKernel):
    name = "decode_gemv"

    def can_implement(self, call, named=False):
        reason = gemv.gemv_reason(call.m, call.k, call.b, a=call.a)
        return (False, reason) if reason else (True, "")

    def launch(self, call, y_bits):
        return gemv.gemv_codes_launch(call, y_bits)


class Tiled(_NumbaKernel):
    name = "tiled"

    def can_implement(self, call, named=False):
        return True, ""  # any shape, any strides: the path of last resort

    def launch(self, call, y_bits):
        bias, bias_kind = bias_bits(call.bias, call.device)
        grid = ((call.n + tiled.TILE_N - 1) // tiled.TILE_N, (call.m + tiled.TILE_M - 1) // tiled.TILE_M)
        return (
            tiled.tiled_kernel(call.out_dtype == np.float32),
            grid,
            tiled.TILED_THREADS,
            (
                call.a,
                call.b,
                call.scale_a,
                call.sa_step,
                call.scale_b,
                call.sb_step,
                bias,
                bias_kind,
                y_bits,
                OUT_KIND[call.out_dtype],
            ),
        )


class TensorCoreGemv(_NumbaKernel):
    """The decode GEMV on tensor cores (tc_gemv.py), M <= 16: exact where cuBLASLt is not (G3)."""

    name = "tensorcore_gemv"

    def __init__(self, simulate=False):
        self.simulate = simulate  # the simulator runs it only when asked (tests of its tile logic)

    def can_implement(self, call, named=False):
        reason = tc_gemv.gemv_reason(call, self.simulate)
        return (False, reason) if reason else (True, "")

    def launch(self, call, y_bits):
        return tc_gemv.gemv_codes_launch(call, y_bits, False)


class DenseWgmmaGemv(_NumbaKernel):
    """The dense wgmma launch's codes form (tc_gemv.py; sm_90, M <= 8): the fused decode launch's
    arithmetic for codes quantized before, so quantize-then-GEMV gives the fused launch's bytes. It
    holds the tensor-core bound, not strict G3: it runs where the lever lets cuBLASLt run."""

    name = tc_gemv.DENSE_WGMMA_KERNEL

    def can_implement(self, call, named=False):
        reason = tc_gemv.gemv_reason(call) or tc_gemv.dense_wgmma_reason(
            call.m, call.k, tc_gemv.MODE_CODES, call.device, call.n
        )
        return (False, reason) if reason else (True, "")

    def launch(self, call, y_bits):
        return tc_gemv.dense_wgmma_codes_launch(call, y_bits, False)[:4]  # (the kernel carries its shared bytes)


class TensorCoreGemm(_NumbaKernel):
    """The tiled GEMM on tensor cores (tc_gemm.py): the lever's path for prefill, exact (G3)."""

    name = "tensorcore"

    def __init__(self, promotion=tc_gemm.PER_MMA, config=None, simulate=False):
        if promotion not in tc_gemm.PROMOTIONS:
            raise ValueError(f"promotion must be one of {tc_gemm.PROMOTIONS}, got {promotion!r}")
        self.promotion, self.config, self.simulate = promotion, config, simulate

    def can_implement(self, call, named=False):
        reason = tc_gemm.unavailable_reason(call.device, self.simulate) or tc_gemm.shape_reason(call)
        return (False, reason) if reason else (True, "")

    def launch(self, call, y_bits):
        return tc_gemm.gemm_launch(call, y_bits, False, self.promotion, self.config)


class WgmmaGemm(_NumbaKernel):
    """The GEMM on Hopper's native FP8 warpgroup MMA (kernels/sm90_wgmma_gemm.py), by name only: ``kernel="wgmma"``
    promotes into float32 every 128 of K (DeepSeek-V3's interval, cuBLASLt's accuracy at half its
    speed), ``kernel="wgmma_k32"`` after every wgmma (2.6x more accurate at K = 256, 0.7x the speed).
    Both hold the tensor-core bound, not strict G3, so the automatic order behind the lever keeps the
    exact tc_gemm kernel."""

    NAMES = {wg_gemm.PER_128: "wgmma", wg_gemm.PER_WGMMA: "wgmma_k32"}

    def __init__(self, promotion=wg_gemm.PER_128, config=None):
        if promotion not in wg_gemm.PROMOTIONS:
            raise ValueError(f"promotion must be one of {wg_gemm.PROMOTIONS}, got {promotion!r}")
        self.promotion, self.config = promotion, config
        self.name = self.NAMES[promotion]

    def can_implement(self, call, named=False):
        reason = wg_gemm.unavailable_reason(call.device) or wg_gemm.shape_reason(call)
        return (False, reason) if reason else (True, "")

    def launch(self, call, y_bits):
        return wg_gemm.gemm_launch(call, y_bits, False, self.promotion, self.config)


# cuBLASLt first (fastest everywhere it runs; measured in benchmarks/gpu/bench_gpu_gemm.py); then the
# tensor-core kernels (exact); the CUDA-core kernels for what they refuse (odd K, unaligned rows,
# GPUs before sm_89, the simulator).
KERNELS = (CublasLt(), CublasLtF32Epilogue(), TensorCoreGemv(), TensorCoreGemm(), DecodeGemv(), Tiled())
# and, chosen by name only, the wgmma GEMM (not exact in G3's sense; see WgmmaGemm)
KERNELS_BY_NAME: dict[str, Kernel] = {
    k.name: k for k in KERNELS + (WgmmaGemm(), WgmmaGemm(wg_gemm.PER_WGMMA), DenseWgmmaGemv())
}
_LARGE_M_ORDER = KERNELS
_SMALL_M_ORDER = (KERNELS_BY_NAME["decode_gemv"],) + tuple(k for k in KERNELS if k.name != "decode_gemv")


disabled_kernels = _config.disabled_kernels  # (kernels/ read it there: they sit below this module)


# At decode in eager code the tensor-core GEMV goes first (docs/DESIGN.md, "Decode: one launch in eager"):
# there the GPU waits on the host, and a prepared Numba
# launch costs the host a fraction of a cuBLASLt call, while a graph replays device time alone,
# where cuBLASLt is 0-23% faster at M = 1 and up to 1.9x at M = 16 (benchmarks/RESULTS.md, 2026-11-30 17:47).
# On sm_90 the dense wgmma launch's codes form goes ahead of it at M = 1 (where the lever lets it
# run), so quantize-then-GEMV gives the fused dense wgmma launch's bytes (tc_gemv.py).
_DECODE_ORDER = (KERNELS_BY_NAME[DenseWgmmaGemv.name], KERNELS_BY_NAME["tensorcore_gemv"]) + tuple(
    k for k in KERNELS if k.name != "tensorcore_gemv"
)


def current_regime():
    """'graph' while cupy's current stream is being captured into a CUDA graph, else 'eager'."""
    import cupy

    return "graph" if cupy.cuda.runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr) else "eager"


def decode_gemv_reason(m, regime=None):
    """Why an M-row GEMM in ``regime`` ('eager', 'graph'; None: ``current_regime()``) does not put
    the tensor-core GEMV first (None when it does): M <= 16 (the GEMV's rows), VT_DECODE_PATH 'fused',
    or 'auto' (the default) in eager code; never under the simulator, whose order stays the plain one."""
    if m > tc_gemv.GEMV_MAX_M:
        return f"M = {m} rows: the decode path takes 1..{tc_gemv.GEMV_MAX_M}"
    if SIMULATOR:
        return "the simulator keeps the plain kernel order"
    path = _config.decode_path()
    if path == "split":
        return "VT_DECODE_PATH=split"
    if path == "auto" and (regime or current_regime()) == "graph":
        return "a CUDA graph capture: device time alone counts, and the split path is faster there"
    return None


def kernel_order(m, regime=None):
    """The kernels in the order they are tried for an M-row call in ``regime`` (``decode_gemv_reason``)."""
    if m <= tc_gemv.GEMV_MAX_M and decode_gemv_reason(m, regime) is None:
        return _DECODE_ORDER
    return _SMALL_M_ORDER if m <= DECODE_GEMV_PREFERRED_MAX_M else _LARGE_M_ORDER


def select(call, kernel=None, regime=None):
    """The kernel that runs ``call``: ``kernel`` (a name) if given, else the first in priority
    order (``kernel_order``) that can; ValueError listing every reason when none can."""
    return choose(call, kernel, kernel_order(call.m, regime), KERNELS_BY_NAME, "FP8 GEMM")


def scaled_mm(a, b, scale_a, scale_b, out_dtype=np.float32, bias=None, kernel=None):
    """y[M, N] = round_out((a @ b^T in float32) * scale_a * scale_b + bias) on the GPU.

    Arguments as ``vtnumba.ops.scaled_mm`` normalizes them: a [M, K] and b [N, K] uint8 e4m3 codes
    (cupy, possibly strided views), scales host float32 scalars or float32 device arrays (1,) /
    (M,) / (N,), bias None or a float32 / float16 / bfloat16 (N,) device vector, out_dtype a numpy
    dtype, kernel None or a kernel name (see the module docstring)."""
    if a.shape[0] == 0 or b.shape[0] == 0:  # nothing to compute (and no kernel takes an empty grid)
        return device.array_module().empty((a.shape[0], b.shape[0]), dtype=out_dtype)
    call = GemmCall(a, b, scale_a, scale_b, out_dtype, bias)
    return execute(select(call, kernel), call)


# ------------------------------------------------------------------------------------------------
# the FP8 linear layer: the backend half of ``vtnumba.ops.fp8_linear``


def fused_linear_reason(x, b):
    """Why the quantize+GEMM of x [M, K] against b [N, K] cannot be one CUDA-core GEMV launch (None
    if it can)."""
    if "decode_gemv" in disabled_kernels():
        return "the decode GEMV is disabled by VT_DISABLE_KERNELS"
    return gemv.gemv_reason(x.shape[0], x.shape[1], b)


def fp8_linear(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias):
    """One launch where a decode GEMV can take the call (it quantizes x as it reads it): the
    tensor-core one (M <= 16), else the CUDA-core one (M <= 4); else the quantization kernel, then
    ``scaled_mm``. Arguments as ``vtnumba.ops.fp8_linear`` normalizes them."""

    def quantize_x(x_):
        return quantize.quantize_activation(x_, input_scale, per_token, scale_ub)

    if "tensorcore_gemv" not in disabled_kernels() and tc_gemv.fused_linear_reason(x, b) is None:
        return tc_gemv.fused_linear(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias, quantize_x)
    if fused_linear_reason(x, b) is None:
        return gemv.fused_linear(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias)
    codes, scale_a = quantize_x(x)
    return scaled_mm(codes, b, scale_a, scale_b, out_dtype, bias)


__all__ = [
    "Kernel",
    "Launch",
    "Matmul",
    "run_steps",
    "execute",
    "fresh_scratch",
    "out_bits",
    "scaled_mm",
    "fp8_linear",
    "fused_linear_reason",
    "select",
    "choose",
    "kernel_order",
    "current_regime",
    "decode_gemv_reason",
    "disabled_kernels",
    "GemmCall",
    "KERNELS",
    "KERNELS_BY_NAME",
    "DECODE_GEMV_PREFERRED_MAX_M",
    "OUTER_VEC_MIN_M",
]
