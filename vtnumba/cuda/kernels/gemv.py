"""The decode GEMV on CUDA cores (M <= 4): streams the weight once, exact float32 accumulation.

Layout of the work: a block owns gemv_rows(M) weight rows; its 128 threads split K, each taking 16
weight bytes of every one of those rows per step (that many 128-bit loads in flight before any
arithmetic) and the same 16 activation values, read straight from global memory (every block
reads the same activation, so it is served by the caches). At N = K = 4096 that is two steps of
128 threads x 16 bytes per row, 1024 blocks. The epilogue's scales and bias are read at the start,
beside the first weight loads. The partial sums meet through warp shuffles and one shared-memory
step. The activation is not staged in shared
memory: staging it per block (serially, uncoalesced) measured 13-22 us where this layout takes 8.9
at N = K = 4096 (H200, benchmarks/gpu/sweep_gemv.py), bounded by the exact decode's arithmetic (see
gemm.py's DECODE_GEMV_PREFERRED_MAX_M).

The weight is decoded by bit placement (``codec.e4m3x4_scaled``: code_value * 2^-120, exact for
every finite code), not by cvt.rn.f16x2.e4m3x2 (conversions issue at 16 per clock per SM, integer
operations at 64). The activation
factor is its e4m3 value times 2^60, so every product is code_a * code_b * 2^-60: a normal
float32, exact, far from underflow and overflow, and float32 sums of such products round exactly
as the unscaled sums would (scaling by a power of two commutes with rounding when nothing
underflows). The sum is multiplied back by 2^60 (exact) before the scales. The one code the
placement does not give is NaN (0x7F / 0xFF): flags per weight row and per activation row catch
it, and the affected outputs become NaN, as NaN * x would.

Activation stages (``GemvStage``; one kernel body, compiled per stage; only the activation's
source differs):
  CODES:     a holds e4m3 codes, the dequantization scale is scale_a
  STATIC:    x is float, codes = encode(x * (1 / scale)), scale given (DESIGN.md static)
  DYNAMIC:   per-tensor scale = max(amax / 448, floor) over all of x, then as static
  PER_TOKEN: per-row scale = max(min(amax_row, ub) / 448, floor), codes = encode(x / scale_row)
The last three make an FP8 linear layer at decode one launch: quantization and GEMM fused. DYNAMIC and
PER_TOKEN first read the activation once for its amax (every block does; it is small and cached).
"""

import enum
import functools

import numpy as np

from ... import _format
from ..ptx import codec
from ..ptx.codec import (
    bf16_high,
    bf16_low,
    bits_float32,
    e4m3x4_scaled,
    fill,
    finite_abs,
    hardware_available,
    nan_code_bits,
)
from ..ptx.target import DEVICE_INLINE, SIMULATOR, cuda, types
from ..runtime import device
from ..runtime.launch import compile_kernel
from .epilogue import (
    F32_1D,
    I32,
    I64,
    OUT_KIND,
    U8_2D,
    U16_1D,
    U16_2D,
    BiasKind,
    OutKind,
    bias_bits,
    empty_out,
    load_bias,
    out_type,
    rows_aligned,
    scale_vector,
    scaled_value,
    store_out,
)
from .quant import block_max_for
from .rows import fma_rows_for


class GemvStage(enum.IntEnum):
    """Where the GEMV's activation comes from (see the module docstring)."""

    CODES = 0
    STATIC = 1
    DYNAMIC = 2
    PER_TOKEN = 3


# The float dtype of the GEMV's activation x, read as uint16 bits: the kinds the outputs are written in.
XKind = OutKind
X_KIND = OUT_KIND

_F32_ZERO = np.float32(0.0)
_F32_ONE = np.float32(1.0)
_F32_NAN = np.float32(np.nan)
_U32_ZERO = np.uint32(0)
_F32_2P60 = np.float32(2.0**60)
_F32_2P120 = np.float32(2.0**120)

# 128 threads a block: the fastest of 128 / 256 at every M in benchmarks/gpu/sweep_gemv.py (H200,
# 2026-11-29); the simulator runs each thread as a Python thread, so it gets 64 (still two warps).
GEMV_THREADS = 64 if SIMULATOR else 128
GEMV_MAX_M = 4


def gemv_rows(m):
    """Weight rows per block for M activation rows: 4 (four 128-bit loads in flight per thread, one
    activation read shared by four rows), 2 at M = 3..4, whose 64 activation values per step would
    otherwise push the kernel past 160 registers (ptxas -v, sm_90)."""
    return 4 if gemv_m_tile(m) <= 2 else 2


def gemv_min_blocks(m, mode):
    """Resident blocks per SM the launch bounds ask for (None: no bound). At M = 1, 8 blocks of
    the codes kernel (64 registers, a 16-byte spill) and 6 of the fused static one beat the
    unbounded kernels in benchmarks/gpu/sweep_gemv.py: 8.9 against ~10 us, 11.3 against ~12 us at
    N = K = 4096."""
    if gemv_m_tile(m) != 1:
        return None
    return 8 if mode == GemvStage.CODES else 6


def _shfl_warp_sum(v, scratch, lane, warp):
    """The sum of v over the 32 lanes of a warp, in every lane (butterfly shuffles)."""
    offset = 16
    while offset > 0:
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, offset)
        offset //= 2
    return v


def _simulated_warp_sum(v, scratch, lane, warp):
    """The same sum through shared memory: the CUDA simulator has no warp shuffles. Every thread of
    the block must call it (it synchronizes the block)."""
    scratch[warp * 32 + lane] = v
    cuda.syncthreads()
    total = np.float32(0.0)
    for i in range(32):
        total += scratch[warp * 32 + i]
    cuda.syncthreads()
    return total


_warp_sum = cuda.jit(**DEVICE_INLINE)(_simulated_warp_sum if SIMULATOR else _shfl_warp_sum)


@functools.cache
def x_loader(hardware):
    """``load_x16(x, x_kind, row, c, vals)``: vals[0 .. 16) = x[row, 16 c .. 16 c + 16) as float32,
    x the uint16 view of float32, float16 or bfloat16 rows (``XKind``), read 16 bytes at a time by
    inline PTX with two cvt.f32.f16 per word (``hardware``) or by the portable loads. Both GEMVs
    (this module's and tc_gemv.py's) read their float activation with it. (The 16-value step ``c``,
    not its element offset: with the offset, LLVM kept the portable loads' negative-index checks,
    +62 instructions and up to 41 registers in this module's fused kernels, ptxas -v.)"""
    load16 = codec.load_row_words if hardware else codec.load_row_words_u16
    half2 = codec.half2_to_float32 if hardware else codec.half2_to_float32_portable

    @cuda.jit(**DEVICE_INLINE)
    def load_x16(x, x_kind, row, c, vals):
        if x_kind == XKind.FLOAT32:
            for i in range(4):
                w0, w1, w2, w3 = load16(x, row, 32 * c + 8 * i)
                vals[4 * i] = bits_float32(w0)
                vals[4 * i + 1] = bits_float32(w1)
                vals[4 * i + 2] = bits_float32(w2)
                vals[4 * i + 3] = bits_float32(w3)
        else:
            for i in range(2):
                w0, w1, w2, w3 = load16(x, row, 16 * c + 8 * i)
                j = 8 * i
                if x_kind == XKind.FLOAT16:
                    vals[j], vals[j + 1] = half2(w0)
                    vals[j + 2], vals[j + 3] = half2(w1)
                    vals[j + 4], vals[j + 5] = half2(w2)
                    vals[j + 6], vals[j + 7] = half2(w3)
                else:  # bfloat16: the upper 16 bits of a float32
                    vals[j], vals[j + 1] = bf16_low(w0), bf16_high(w0)
                    vals[j + 2], vals[j + 3] = bf16_low(w1), bf16_high(w1)
                    vals[j + 4], vals[j + 5] = bf16_low(w2), bf16_high(w2)
                    vals[j + 6], vals[j + 7] = bf16_low(w3), bf16_high(w3)

    return load_x16


@functools.cache
def gemv_kernel(m_tile, hardware, mode, rows, threads):
    """The GEMV kernel for up to ``m_tile`` activation rows (1, 2 or 4; compiled per value so the
    accumulators live in registers), with hardware loads and encoder (inline PTX, sm_89+) or
    portable ones, for one activation stage ``mode`` (compiled per stage: the codes-only kernel then
    carries none of the quantizer's registers), owning ``rows`` weight rows per block of
    ``threads`` threads."""
    # inline PTX (hardware): one 128-bit load for any element type
    load_words = codec.load_row_words if hardware else codec.load_row_words_u8
    load_x16 = x_loader(hardware)
    pair = codec.encode_pair("hardware" if hardware else "portable")
    n_acc = rows * m_tile
    warps = threads // 32
    n_partial = warps * n_acc
    n_words = 4 * rows
    n_x = 16 * m_tile
    block_max = block_max_for(threads)
    scratch_size = threads if SIMULATOR else 1

    @cuda.jit(**DEVICE_INLINE)
    def load_rows(b, n_base, n_total, c, words):
        """The 16 weight bytes of step ``c`` of each of the block's rows, as 4 words a row, every
        load issued before any is used (rows past N reread the last one; their sums are dropped)."""
        for r in range(rows):
            w0, w1, w2, w3 = load_words(b, min(n_base + r, n_total - 1), 16 * c)
            words[4 * r] = w0
            words[4 * r + 1] = w1
            words[4 * r + 2] = w2
            words[4 * r + 3] = w3

    @cuda.jit(**DEVICE_INLINE)
    def encode4(vals, i, mult, divide):
        """The codes of vals[4 i .. 4 i + 4) times (or divided by) ``mult``, as one uint32."""
        if divide:
            lo = pair(vals[4 * i] / mult, vals[4 * i + 1] / mult)
            hi = pair(vals[4 * i + 2] / mult, vals[4 * i + 3] / mult)
        else:
            lo = pair(vals[4 * i] * mult, vals[4 * i + 1] * mult)
            hi = pair(vals[4 * i + 2] * mult, vals[4 * i + 3] * mult)
        return np.uint32(lo) | (np.uint32(hi) << np.uint32(16))

    @cuda.jit(**DEVICE_INLINE)
    def epilogue_operands(scale_a, sa_step, scale_b, sb_step, bias, bias_kind, qscale, m_total, out_m, out_n, tid):
        """(sa, sb, bias) of this thread's output, read at the start beside the first weight loads:
        read at the end they would add a memory latency per block."""
        sb = _F32_ONE
        sa = _F32_ONE
        bias_value = _F32_ZERO
        if tid < n_acc:
            sb = scale_b[out_n * sb_step]
            if bias_kind != BiasKind.NONE:
                bias_value = load_bias(bias, bias_kind, out_n)
            if mode == GemvStage.CODES:
                sa = scale_a[min(out_m, m_total - 1) * sa_step]
            elif mode == GemvStage.STATIC:
                sa = qscale[0]
        return sa, sb, bias_value

    @cuda.jit(**DEVICE_INLINE)
    def activation_scales(x, x_kind, qscale, m_total, k16, vals, red, row_scale, row_mult, tid):
        """The dynamic stages' scales from one read of x for its amax (every block does: x is small and
        cached), into row_scale (dequantization) and row_mult (quantization multiplier or divisor).
        Every thread must call."""
        total = _F32_ZERO
        for m in range(m_tile):
            local = _F32_ZERO
            if m < m_total:
                for cc in range(tid, k16, threads):
                    load_x16(x, x_kind, m, cc, vals)
                    for j in range(16):
                        local = max(local, finite_abs(vals[j]))
            amax = block_max(local, red)
            total = max(total, amax)
            if mode == GemvStage.PER_TOKEN and tid == 0:
                ub = qscale[0]
                if ub > _F32_ZERO:
                    amax = min(amax, ub)
                s = max(amax / np.float32(448.0), _format.F32_MIN_SCALE)
                row_scale[m] = s
                row_mult[m] = s
        if mode == GemvStage.DYNAMIC and tid == 0:
            s = max(total / np.float32(448.0), _format.F32_MIN_SCALE)
            for m in range(m_tile):
                row_scale[m] = s
                row_mult[m] = np.float32(_F32_ONE / s)

    @cuda.jit(**DEVICE_INLINE)
    def activation_values(a, x, x_kind, m_total, c, static_mult, row_mult, vals, qw, xv, x_nan):
        """Step ``c``'s 16 activation values of each row, as e4m3 codes (read, or quantized from x)
        decoded by bit placement times 2^60 into xv; zeros past M; NaN codes flagged per row."""
        divide = mode == GemvStage.PER_TOKEN
        for m in range(m_tile):
            if m < m_total:
                if mode == GemvStage.CODES:
                    qw[0], qw[1], qw[2], qw[3] = load_words(a, m, 16 * c)
                else:
                    load_x16(x, x_kind, m, c, vals)
                    mult = static_mult if mode == GemvStage.STATIC else row_mult[m]
                    for i in range(4):
                        qw[i] = encode4(vals, i, mult, divide)
                for i in range(4):
                    x_nan[m] |= nan_code_bits(qw[i])
                    f0, f1, f2, f3 = e4m3x4_scaled(qw[i])  # the e4m3 value times 2^-120, then times 2^60
                    xv[16 * m + 4 * i] = np.float32(np.float32(f0 * _F32_2P120) * _F32_2P60)
                    xv[16 * m + 4 * i + 1] = np.float32(np.float32(f1 * _F32_2P120) * _F32_2P60)
                    xv[16 * m + 4 * i + 2] = np.float32(np.float32(f2 * _F32_2P120) * _F32_2P60)
                    xv[16 * m + 4 * i + 3] = np.float32(np.float32(f3 * _F32_2P120) * _F32_2P60)
            else:
                for j in range(16):
                    xv[16 * m + j] = _F32_ZERO

    fma_rows = fma_rows_for(rows, m_tile)

    @cuda.jit(**DEVICE_INLINE)
    def reduce_and_store(
        acc,
        w_nan,
        x_nan,
        partial,
        scratch,
        y,
        out_kind,
        sa,
        sb,
        bias_value,
        bias_kind,
        row_scale,
        n_base,
        n_total,
        m_total,
        out_r,
        out_m,
        lane,
        warp,
        tid,
    ):
        """NaN codes poison their outputs; the sums meet through warp shuffles and one shared step,
        are multiplied back by 2^60 (exact) and go through the epilogue. Every thread must call."""
        for r in range(rows):
            for m in range(m_tile):
                if w_nan[r] != np.uint32(0) or x_nan[m] != np.uint32(0):
                    acc[r * m_tile + m] = _F32_NAN
        for i in range(n_acc):
            v = _warp_sum(acc[i], scratch, lane, warp)
            if lane == 0:
                partial[warp * n_acc + i] = v
        cuda.syncthreads()
        if tid < n_acc and n_base + out_r < n_total and out_m < m_total:
            total = _F32_ZERO
            for w in range(warps):
                total += partial[w * n_acc + tid]
            total = np.float32(total * _F32_2P60)  # exact: undo the 2^-60
            if mode == GemvStage.DYNAMIC or mode == GemvStage.PER_TOKEN:
                sa = row_scale[out_m]
            store_out(
                y, out_m, n_base + out_r, scaled_value(total, sa, sb, bias_kind != BiasKind.NONE, bias_value), out_kind
            )

    def gemv(a, x, x_kind, qscale, b, scale_a, sa_step, scale_b, sb_step, bias, bias_kind, y, out_kind):
        n_total, k_total = b.shape
        m_total = y.shape[0]
        k16 = k_total // 16
        tid = cuda.threadIdx.x
        lane = tid % 32
        warp = tid // 32
        n_base = cuda.blockIdx.x * rows
        red = cuda.shared.array(threads, types.float32)
        partial = cuda.shared.array(n_partial, types.float32)
        row_scale = cuda.shared.array(m_tile, types.float32)  # dynamic modes: dequantization scale
        row_mult = cuda.shared.array(m_tile, types.float32)  # and quantization multiplier / divisor
        scratch = cuda.shared.array(scratch_size, types.float32)
        vals = cuda.local.array(16, types.float32)
        qw = cuda.local.array(4, types.uint32)
        acc = cuda.local.array(n_acc, types.float32)
        xv = cuda.local.array(n_x, types.float32)
        words = cuda.local.array(n_words, types.uint32)
        w_nan = cuda.local.array(rows, types.uint32)
        x_nan = cuda.local.array(m_tile, types.uint32)
        fill(acc, _F32_ZERO)
        fill(w_nan, _U32_ZERO)
        fill(x_nan, _U32_ZERO)

        # The first step's weight loads go out before anything waits: a scale read, a barrier or
        # an amax pass ahead of them would add a whole memory latency to every block.
        c = tid
        if c < k16:
            load_rows(b, n_base, n_total, c, words)
        out_r = tid // m_tile
        out_m = tid - out_r * m_tile
        out_n = min(n_base + out_r, n_total - 1)
        sa, sb, bias_value = epilogue_operands(
            scale_a, sa_step, scale_b, sb_step, bias, bias_kind, qscale, m_total, out_m, out_n, tid
        )
        static_mult = _F32_ONE
        if mode == GemvStage.STATIC:
            static_mult = np.float32(_F32_ONE / qscale[0])  # each thread: the same float32 quotient
        if mode == GemvStage.DYNAMIC or mode == GemvStage.PER_TOKEN:
            activation_scales(x, x_kind, qscale, m_total, k16, vals, red, row_scale, row_mult, tid)
            cuda.syncthreads()

        # streaming: decode, float32 FMA; the next step's loads after each step
        while c < k16:
            activation_values(a, x, x_kind, m_total, c, static_mult, row_mult, vals, qw, xv, x_nan)
            fma_rows(words, xv, acc, w_nan)
            c += threads
            if c < k16:
                load_rows(b, n_base, n_total, c, words)

        reduce_and_store(
            acc,
            w_nan,
            x_nan,
            partial,
            scratch,
            y,
            out_kind,
            sa,
            sb,
            bias_value,
            bias_kind,
            row_scale,
            n_base,
            n_total,
            m_total,
            out_r,
            out_m,
            lane,
            warp,
            tid,
        )

    return gemv


def gemv_m_tile(m):
    """The compiled row count that covers ``m`` activation rows."""
    for tile in (1, 2, 4):
        if m <= tile:
            return tile
    raise ValueError(f"m must be <= {GEMV_MAX_M} for the decode GEMV, got {m}")


@functools.cache
def gemv_launcher(m, hardware, out_is_float32, mode, rows=None, threads=GEMV_THREADS, min_blocks=None):
    """The GEMV for M activation rows in activation stage ``mode`` (a ``GemvStage``), launched on ceil(N / rows) blocks of
    ``threads``; ``rows`` defaults to gemv_rows(M); ``min_blocks`` (resident per SM; default
    gemv_min_blocks, 0 for none) caps the registers through launch bounds
    (benchmarks/gpu/sweep_gemv.py tries the alternatives)."""
    sig = (U8_2D, U16_2D, I32, F32_1D, U8_2D, F32_1D, I64, F32_1D, I64, U16_1D, I32, out_type(out_is_float32), I32)
    if min_blocks is None:
        min_blocks = gemv_min_blocks(m, mode)
    bounds = None if SIMULATOR or not min_blocks else (threads, min_blocks)
    return compile_kernel(
        gemv_kernel(gemv_m_tile(m), hardware, mode, rows or gemv_rows(m), threads), sig, launch_bounds=bounds
    )


# ------------------------------------------------------------------------------------------------
# host side: whether the GEMV can take a call, its launch, and the fused decode layer


def gemv_reason(m, k, b, a=None):
    """Why the decode GEMV cannot run M activation rows (codes ``a`` if given) against the weight
    b [N, K] (None if it can)."""
    if m > GEMV_MAX_M:
        return f"the decode GEMV takes M <= {GEMV_MAX_M}, got M = {m}"
    if k % 16:
        return f"the decode GEMV reads the weight 16 bytes at a time: K must be a multiple of 16, got {k}"
    if not SIMULATOR:
        if not rows_aligned(b):
            return "the decode GEMV needs 16-byte aligned weight rows (contiguous K, row stride % 16 == 0)"
        if a is not None and not rows_aligned(a):
            return "the decode GEMV needs 16-byte aligned activation rows (contiguous K, row stride % 16 == 0)"
    return None


def gemv_codes_launch(call, y_bits):
    """(kernel, grid, block, args) of the codes GEMV for a ``gemm.GemmCall``."""
    dev = call.device
    bias, bias_kind = bias_bits(call.bias, dev)
    launcher = gemv_launcher(call.m, hardware_available(dev.cc), call.out_dtype == np.float32, GemvStage.CODES)
    return (
        launcher,
        -(-call.n // gemv_rows(call.m)),
        GEMV_THREADS,
        (
            call.a,
            dev.placeholder("u16_2d"),
            0,
            dev.placeholder("f32"),
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


def fused_linear(x, b, scale_b, input_scale, per_token, scale_ub, out_dtype, bias):
    """One FP8 W8A8 linear layer in ONE launch, arguments as ``vtnumba.ops.fp8_linear`` normalizes
    them: the decode GEMV quantizes the activation x [M <= 4, K] as it reads it (callers check
    ``gemv_reason`` first)."""
    dev = device.current()
    # the stage's scalar operand as a device (1,) array: the per-token cap (0: none), or the static scale
    if per_token:
        stage, qscale = GemvStage.PER_TOKEN, scale_vector(np.float32(0.0) if scale_ub is None else scale_ub, 1, dev)[0]
    elif input_scale is None:
        stage, qscale = GemvStage.DYNAMIC, dev.scalar(1.0)
    else:
        stage, qscale = GemvStage.STATIC, scale_vector(input_scale, 1, dev)[0]
    x = device.xp.ascontiguousarray(x)
    if not SIMULATOR and not rows_aligned(x):  # e.g. a view starting mid-row: realign by copying
        x = x.copy()
    x_bits = x.view(np.uint16)  # float32 rows become 2K halves; the kernel reassembles them
    m, n = x.shape[0], b.shape[0]
    scale_b_vec, sb_step = scale_vector(scale_b, n, dev)
    y, y_bits = empty_out(m, n, out_dtype)
    bias_arg, bias_kind = bias_bits(bias, dev)
    launcher = gemv_launcher(m, hardware_available(dev.cc), out_dtype == np.float32, stage)
    launcher(
        -(-n // gemv_rows(m)),
        GEMV_THREADS,
        dev.placeholder("u8_2d"),
        x_bits,
        X_KIND[np.dtype(x.dtype)],
        qscale,
        b,
        dev.placeholder("f32"),
        0,
        scale_b_vec,
        sb_step,
        bias_arg,
        bias_kind,
        y_bits,
        OUT_KIND[out_dtype],
    )
    return y


__all__ = [
    "GemvStage",
    "XKind",
    "X_KIND",
    "GEMV_THREADS",
    "GEMV_MAX_M",
    "gemv_rows",
    "gemv_m_tile",
    "gemv_min_blocks",
    "gemv_kernel",
    "gemv_launcher",
    "gemv_reason",
    "gemv_codes_launch",
    "fused_linear",
    "x_loader",
]
