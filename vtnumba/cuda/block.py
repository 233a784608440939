"""The block-scaled FP8 GEMM on the GPU: which kernel runs a call (DESIGN.md, "block-scaled weights").

    y[m, n] = bias[n] + sum_kb (P[m, n, kb] * sa[m, kb]) * sb[n // bn, kb]

with a [M, K] codes quantized per group of bk along K (scale_a [M, ceil(K / bk)]) and b [N, K]
quantized per bn x bk block (scale_b [ceil(N / bn), ceil(K / bk)]). The kernels, tried in order
(as ``gemm.py`` does for per-tensor scales: each says whether it can run a call and why not):

``cublaslt_block``  cuBLASLt's 128 x 128 block scaling (BLK128x128_32F for the weight, VEC128_32F for
                    the activation; sm_90, cuBLASLt >= 12.9). Needs bn = bk = 128, K % 128 == 0,
                    N % 16 == 0, M % 4 == 0 (M = 1 is refused by cuBLASLt: decode takes the next
                    kernel). Its layouts, measured on the H200: the weight scales [ceil(N/128)][L4]
                    row-major with the K-block count padded to L4, a multiple of 4 (a copy only
                    where the count is not one already); the activation scales [K/128][M], m contiguous (the
                    column-major layout ``vt.quantize_fp8(x, group_size=128,
                    column_major_scales=True)`` writes; a row-major one is transposed first). The
                    scale pointers are set before the heuristic query. Its accumulation is Hopper's
                    tensor cores' (see gemm.py): held to the tensor-core bound.
``tensorcore_block_gemv``, ``tensorcore_block``  the tensor-core decode GEMV (M <= 16) and tiled
                    GEMM (tc_gemv.py, tc_gemm.py) with 128 x 128 blocks: each K-block's partial
                    promoted as ``acc += (P * sa) * sb``, exact (G3 per block); sm_89+, 16-byte rows.
``tensorcore_mx``   MXFP8 (E8M0 bytes per 1 x 32 on both operands): the tiled tensor-core GEMM
                    (tc_gemm.py) with one scale per k32 mma. On sm_120 / sm_121 the block-scaled mma
                    (``kind::mxf8f6f4.block_scale``, ptx/sm120_mma.py; its step in
                    kernels/sm120_block_scaled.py) applies the scales itself at the full FP8 rate;
                    elsewhere (sm_89, sm_90) the plain mma's k32 partial is scaled in float32,
                    ``acc += (P * sa) * sb``. Each k32 partial from C = 0 (G3 per block).
``tiled_block``     the tiled CUDA-core GEMM with a block step at each K-block's end: any block
                    size, shape and GPU, exact float32 accumulation within each block (G3 per block);
                    E8M0 scales read as bytes.

E8M0 scales (uint8; DESIGN.md "MXFP8"): an MX call keeps both as bytes; otherwise E8M0 weight scales
(DeepSeek's UE8M0 128 x 128 blocks) are decoded to float32 once per call (every kernel takes them),
and E8M0 activation scales with another block size leave the call to ``tiled_block``.
"""

import numpy as np

from .. import _arrays, _config
from .._format import MX_BLOCK
from .gemm import Kernel, Launch, Matmul, decode_gemv_reason, execute
from .kernels import sm90_wgmma_gemm as wg_gemm
from .kernels import tc_gemm, tc_gemv
from .kernels.epilogue import OUT_KIND, bias_bits, out_bits
from .kernels.tiled import TILE_M, TILE_N, TILED_THREADS, tiled_block_kernel
from .ptx.target import SIMULATOR
from .registry import choose
from .runtime import cublaslt, device

_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)
_E8M0_ACTIVATION = "the activation's scales are E8M0 bytes: tiled_block or tensorcore_mx (MXFP8) take them"


class BlockCall:
    """One block-scaled call, normalized once for every kernel's can_implement / run."""

    __slots__ = (
        "a",
        "b",
        "scale_a",
        "scale_b",
        "block_n",
        "block_k",
        "out_dtype",
        "bias",
        "m",
        "n",
        "k",
        "device",
        "plan",
        "state",
        "scale_b_padded",
        "scale_a_cols",
        "mx",
        "e8m0_a",
    )

    def __init__(self, a, b, scale_a, scale_b, block_size, out_dtype, bias):
        self.device = device.current()
        self.a, self.b = a, b
        self.m, self.k = a.shape
        self.n = b.shape[0]
        e8m0_a, e8m0_b = scale_a.dtype == _U8, scale_b.dtype == _U8
        self.mx = e8m0_a and e8m0_b and tuple(block_size) == MX_BLOCK
        self.e8m0_a = e8m0_a
        if not self.mx and e8m0_b:  # E8M0 weight blocks beside float activation scales: decoded, exact
            scale_b = _arrays.decode_e8m0(scale_b)
        self.scale_a = scale_a if scale_a.dtype in (_F32, _U8) else scale_a.astype(_F32)
        self.scale_b = scale_b if scale_b.dtype in (_F32, _U8) else scale_b.astype(_F32)
        self.block_n, self.block_k = block_size
        self.out_dtype = np.dtype(out_dtype)
        self.bias = bias
        self.plan = self.state = self.scale_b_padded = self.scale_a_cols = None


def _padded_weight_scales(scale_b):
    """[ceil(N/128)][L4] row-major, L4 = ceil(K-blocks / 4) * 4, zeros in the padding: the array
    itself where it already is (every K a multiple of 512, the checkpoints in use), else a copy."""
    rows, cols = scale_b.shape
    if cols % 4 == 0 and scale_b.strides == (4 * cols, 4):
        return scale_b
    padded = device.xp.zeros((rows, -(-cols // 4) * 4), dtype=np.float32)
    padded[:, :cols] = scale_b
    return padded


class CublasLtBlock(Kernel):
    name = "cublaslt_block"

    def can_implement(self, call, named=False):
        if call.e8m0_a:
            return False, _E8M0_ACTIVATION
        if not _config.dense_cublaslt_fp8_enabled():
            return False, "turned off by the lever VT_DENSE_CUBLASLT_FP8"
        if SIMULATOR:
            return False, "cuBLASLt needs a real GPU (running under the CUDA simulator)"
        reason = cublaslt.unavailable_reason() or call.device.cublaslt().block_reason
        if reason:
            return False, reason
        if (call.block_n, call.block_k) != (128, 128):
            return False, f"cuBLASLt's block scaling is 128 x 128, got block_size {(call.block_n, call.block_k)}"
        if call.k % 128 or call.n % 16:
            return False, f"cuBLASLt's block scaling needs K % 128 == 0 and N % 16 == 0, got K = {call.k}, N = {call.n}"
        if call.m % 4:
            return False, f"cuBLASLt's block scaling needs M % 4 == 0 (it refuses M = 1), got M = {call.m}"
        a, b = call.a, call.b
        if (
            a.strides[1] != 1
            or b.strides[1] != 1
            or a.strides[0] % 16
            or b.strides[0] % 16
            or a.data.ptr % 16
            or b.data.ptr % 16
        ):
            return False, "cuBLASLt FP8 needs 16-byte aligned rows with contiguous K"
        if call.bias is not None:
            bias_dt = np.dtype(call.bias.dtype)
            if (
                bias_dt != cublaslt.BIAS_TYPE_FOR_OUT[call.out_dtype]
                or not call.bias.flags.c_contiguous
                or call.bias.data.ptr % 16
            ):
                return (
                    False,
                    f"cuBLASLt's bias epilogue takes a contiguous aligned {cublaslt.BIAS_TYPE_FOR_OUT[call.out_dtype]} bias for {call.out_dtype} output",
                )
        # the layouts cuBLASLt reads: activation scales m-contiguous, weight scales padded
        sa = call.scale_a
        call.scale_a_cols = sa if sa.strides == (4, 4 * call.m) else device.xp.ascontiguousarray(sa.T).T
        call.scale_b_padded = _padded_weight_scales(call.scale_b)
        state = call.device.cublaslt()
        key = cublaslt.plan_key(
            call.a,
            call.b,
            call.out_dtype,
            None if call.bias is None else np.dtype(call.bias.dtype),
            cublaslt.GROUP_128,
            cublaslt.BLOCK_128x128,
        )
        plan = state.plan_or_reason(
            key,
            (call.scale_a_cols.data.ptr, call.scale_b_padded.data.ptr, 0 if call.bias is None else call.bias.data.ptr),
        )
        if isinstance(plan, str):
            return False, plan
        call.plan, call.state = plan, state
        return True, ""

    def steps(self, call, y, scratch):
        return [Matmul(call.plan, call.state, call.a, call.b, call.scale_a_cols, call.scale_b_padded, call.bias, y)]


def _tensorcore_block_reason(call, simulate):
    if call.e8m0_a:
        return _E8M0_ACTIVATION
    if (call.block_n, call.block_k) != (128, 128):
        return f"the tensor-core kernels take 128 x 128 blocks, got block_size {(call.block_n, call.block_k)}"
    return tc_gemm.unavailable_reason(call.device, simulate) or tc_gemm.shape_reason(call)


class TensorCoreBlockGemv(Kernel):
    name = "tensorcore_block_gemv"

    def __init__(self, simulate=False):
        self.simulate = simulate

    def can_implement(self, call, named=False):
        reason = _tensorcore_block_reason(call, self.simulate) or tc_gemv.gemv_reason(call, self.simulate)
        return (False, reason) if reason else (True, "")

    def steps(self, call, y, scratch):
        return [Launch(*tc_gemv.gemv_codes_launch(call, out_bits(y), True))]


class TensorCoreBlock(Kernel):
    name = "tensorcore_block"

    def __init__(self, promotion=tc_gemm.PER_MMA, simulate=False):
        self.promotion, self.simulate = promotion, simulate

    def can_implement(self, call, named=False):
        reason = _tensorcore_block_reason(call, self.simulate)
        return (False, reason) if reason else (True, "")

    def steps(self, call, y, scratch):
        return [Launch(*tc_gemm.gemm_launch(call, out_bits(y), True, self.promotion))]


class WgmmaBlock(Kernel):
    """The block-scaled GEMM on wgmma (kernels/sm90_wgmma_gemm.py), per-128 promotion: by name only
    (``kernel="wgmma_block"``), as gemm.WgmmaGemm."""

    name = "wgmma_block"

    def can_implement(self, call, named=False):
        if call.e8m0_a:
            return False, _E8M0_ACTIVATION
        if (call.block_n, call.block_k) != (128, 128):
            return False, f"the wgmma kernel takes 128 x 128 blocks, got block_size {(call.block_n, call.block_k)}"
        reason = wg_gemm.unavailable_reason(call.device) or wg_gemm.shape_reason(call)
        return (False, reason) if reason else (True, "")

    def steps(self, call, y, scratch):
        return [Launch(*wg_gemm.gemm_launch(call, out_bits(y), True))]


class TensorCoreMx(Kernel):
    """MXFP8 on the tiled tensor-core GEMM, one E8M0 scale pair per k32 mma (module docstring)."""

    name = "tensorcore_mx"

    def __init__(self, mma_kind=None, simulate=False):
        self.mma_kind, self.simulate = mma_kind, simulate  # None: tc_gemm.mma_kind_for the device

    def can_implement(self, call, named=False):
        if not call.mx:
            return False, (
                f"the MX kernel takes E8M0 scales on both operands with block_size {MX_BLOCK}, got "
                f"block_size {(call.block_n, call.block_k)}"
                f"{'' if call.scale_a.dtype == _U8 and call.scale_b.dtype == _U8 else ' and float scales'}"
            )
        reason = tc_gemm.unavailable_reason(call.device, self.simulate) or tc_gemm.shape_reason(call)
        return (False, reason) if reason else (True, "")

    def steps(self, call, y, scratch):
        return [Launch(*tc_gemm.gemm_launch(call, out_bits(y), False, mma_kind=self.mma_kind))]


class TiledBlock(Kernel):
    name = "tiled_block"

    def can_implement(self, call, named=False):
        return True, ""  # any block size, shape, strides and GPU; E8M0 or float scales

    def steps(self, call, y, scratch):
        bias, bias_kind = bias_bits(call.bias, call.device)
        grid = ((call.n + TILE_N - 1) // TILE_N, (call.m + TILE_M - 1) // TILE_M)
        kernel = tiled_block_kernel(call.out_dtype == np.float32, call.scale_a.dtype == _U8, call.scale_b.dtype == _U8)
        return [
            Launch(
                kernel,
                grid,
                TILED_THREADS,
                (
                    call.a,
                    call.b,
                    call.scale_a,
                    call.scale_b,
                    call.block_n,
                    call.block_k,
                    bias,
                    bias_kind,
                    out_bits(y),
                    OUT_KIND[call.out_dtype],
                ),
            )
        ]


KERNELS = (CublasLtBlock(), TensorCoreBlockGemv(), TensorCoreBlock(), TensorCoreMx(), TiledBlock())
KERNELS_BY_NAME = {k.name: k for k in KERNELS + (WgmmaBlock(),)}  # wgmma: by name only


# the tensor-core block GEMV first at decode in eager code, as gemm's order does (gemm.decode_gemv_reason)
_DECODE_KERNELS = (KERNELS_BY_NAME["tensorcore_block_gemv"],) + tuple(
    k for k in KERNELS if k.name != "tensorcore_block_gemv"
)


def select(call, kernel=None, regime=None):
    """The kernel that runs ``call`` (``kernel`` by name if given) in ``regime`` ('eager', 'graph';
    None: the current stream's); ValueError listing every reason when none can (``registry.choose``)."""
    decode = call.m <= tc_gemv.GEMV_MAX_M and decode_gemv_reason(call.m, regime) is None
    return choose(call, kernel, _DECODE_KERNELS if decode else KERNELS, KERNELS_BY_NAME, "block-scaled GEMM")


def block_scaled_mm(a, b, scale_a, scale_b, block_size, out_dtype, bias, kernel=None):
    """The GPU's block-scaled GEMM, arguments as ``vtnumba.ops.scaled_mm`` normalizes them."""
    if a.shape[0] == 0 or b.shape[0] == 0:
        return device.array_module().empty((a.shape[0], b.shape[0]), dtype=out_dtype)
    call = BlockCall(a, b, scale_a, scale_b, block_size, out_dtype, bias)
    return execute(select(call, kernel), call)


__all__ = ["block_scaled_mm", "select", "BlockCall", "KERNELS", "KERNELS_BY_NAME", "MX_BLOCK"]
