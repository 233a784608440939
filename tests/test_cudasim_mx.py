"""MXFP8 on the GPU's Numba kernels under the CUDA simulator (run in CI, which has no GPU): the MX quantization kernels
give the CPU's bytes (codes and E8M0 scales, both rules, every kernel form); the block-scaled mma's
emulation applies the scale of the lane the sm_121a fragment map names, and with unit scales equals
the plain mma bit for bit; the tiled tensor-core GEMM in its MX kinds (the block-scaled mma of sm_12x,
and the plain mma scaled per k32 of sm_89 / sm_90) and the tiled CUDA-core kernel on E8M0 bytes meet
the G3-per-block bound of ``reference.block_scaled_mm``, and a NaN scale byte poisons its outputs.

The hardware is not here: tests/test_sm120_compile.py proves the sm_121a kernels assemble to QMMA.SF.
"""

import ml_dtypes
import numpy as np
import pytest

from vtnumba.testing import reference
from vtnumba.testing.gates import assert_block_g3

pytestmark = [pytest.mark.cudasim, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
# (64, 32): a chunk a lane, two lanes a group; (96, 32) and (160, 32): the same, more groups; (70, 32):
# rows no multiple of 16, the element-per-lane kernel, a short last group
@pytest.mark.parametrize("k", [64, 96, 70])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("column_major", [False, True])
def test_mx_quant_gives_the_cpu_bytes(dtype, k, rounding, column_major):
    import vtnumba.cuda as gpu
    from vtnumba import cpu

    rng = np.random.default_rng(k)
    x = (rng.standard_normal((3, k)) * 10.0 ** rng.uniform(-8, 8, size=(3, k))).astype(np.float32)
    x[0, :32] *= np.float32(1.9) / np.abs(x[0, :32]).max()  # amax significand > 1.75: the rules part
    x[0, 40] = np.nan
    x[1, 5] = np.inf
    x[2, :32] = 0  # an all-zero group: byte 0
    x = x.astype(dtype)
    codes, scales = gpu.quantize_per_group_e8m0(x, 32, rounding, column_major)
    want_codes, want_scales = cpu.quantize_per_group_e8m0(x, 32, rounding, False)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(scales, want_scales)
    assert scales.dtype == np.uint8 and scales.shape == (3, -(-k // 32))
    oracle = reference.quantize_mx(x, 32, rounding)
    np.testing.assert_array_equal(codes, oracle.data)
    np.testing.assert_array_equal(scales, oracle.scale)
    assert scales[2, 0] == 0 and len(np.unique(scales)) > 3 and np.count_nonzero(codes) > x.size // 2


def _fragments(a16, b8):
    """The m16n8k32 fragment words of each lane (mma.py's layout): a [16, 32], b [8, 32] codes."""
    words = np.zeros((32, 6), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4

        def pack(row, k0):
            return np.uint32(sum(int(row[k0 + j]) << (8 * j) for j in range(4)))

        words[lane] = [
            pack(a16[g], 4 * t),
            pack(a16[g + 8], 4 * t),
            pack(a16[g], 4 * t + 16),
            pack(a16[g + 8], 4 * t + 16),
            pack(b8[g], 4 * t),
            pack(b8[g], 4 * t + 16),
        ]
    return words


cuda = mma = sm120_mma = None  # bound by _bind(): the simulator swaps the cuda module only in globals
_KINDS = {"mx": 0, "unit": 1, "plain": 2}


def _bind():
    global cuda, mma, sm120_mma
    from vtnumba.cuda.ptx import mma as mma_module
    from vtnumba.cuda.ptx import sm120_mma as sm120_module
    from vtnumba.cuda.ptx.target import cuda as cuda_module

    cuda, mma, sm120_mma = cuda_module, mma_module, sm120_module


def _mma_kernel(words, lane_sfa, lane_sfb, kind, out):
    scratch = cuda.shared.array(256, np.uint32)  # sm120_mma.SCRATCH_WORDS
    lane = cuda.threadIdx.x
    w = words[lane]
    one = np.float32(1.0)
    if kind == 0:
        d0, d1, d2, d3 = sm120_mma.mma_e4m3_mx(
            w[0], w[1], w[2], w[3], w[4], w[5], one, one, one, one, lane_sfa[lane], lane_sfb[lane], scratch, 0, lane
        )
    elif kind == 1:
        d0, d1, d2, d3 = sm120_mma.mma_e4m3_unit(
            w[0], w[1], w[2], w[3], w[4], w[5], one, one, one, one, scratch, 0, lane
        )
    else:
        d0, d1, d2, d3 = mma.mma_e4m3(w[0], w[1], w[2], w[3], w[4], w[5], one, one, one, one, scratch, 0, lane)
    out[lane, 0] = d0
    out[lane, 1] = d1
    out[lane, 2] = d2
    out[lane, 3] = d3


def _run_mma(kind, a16, b8, sfa, sfb):
    """D [16, 8] of one emulated mma (``kind`` 'mx': the block-scaled one with the row / column scale
    bytes placed as the sm_121a map says; 'unit': unit scales; 'plain': mma.py's), C = 1."""
    _bind()
    assert sm120_mma.SCRATCH_WORDS == 256
    words = _fragments(a16, b8)
    lane_sfa = np.full(32, 0xAB, np.uint32)  # lanes the map does not read hold a scale that would show
    lane_sfb = np.full(32, 0xAB, np.uint32)
    if sfa is not None:
        for g in range(8):
            lane_sfa[4 * g], lane_sfa[4 * g + 1] = sfa[g], sfa[g + 8]
            lane_sfb[4 * g] = sfb[g]
    out = np.zeros((32, 4), np.float32)
    cuda.jit(_mma_kernel)[1, 32](words, lane_sfa, lane_sfb, _KINDS[kind], out)
    y = np.zeros((16, 8), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        y[g, 2 * t], y[g, 2 * t + 1], y[g + 8, 2 * t], y[g + 8, 2 * t + 1] = out[lane]
    return y


def test_block_scaled_mma_emulation_follows_the_sm121a_scale_map():
    """Every row of A and column of B its own scale (lanes t = 0, 1 rows g, g + 8; t = 0 column g): the
    result is C + 2^(sa + sb - 254) * the exact product, bit for bit on small exact values; the bytes of
    the lanes the map does not read (0xAB, 2^44) never show."""
    rng = np.random.default_rng(3)
    a = rng.choice(np.array([0x00, 0x30, 0x38, 0x50, 0xB8], np.uint8), size=(16, 32))  # 0, 0.5, 1, 8, -1
    b = rng.choice(np.array([0x00, 0x30, 0x38, 0x58, 0xB0], np.uint8), size=(8, 32))
    sfa = (123 + np.arange(16) % 9).astype(np.uint32)
    sfb = (124 + np.arange(8) % 7).astype(np.uint32)
    y = _run_mma("mx", a, b, sfa, sfb)
    want = (
        1.0
        + reference.decode(a)
        @ reference.decode(b).T
        * np.ldexp(1.0, sfa.astype(int) - 127)[:, None]
        * np.ldexp(1.0, sfb.astype(int) - 127)[None, :]
    )
    np.testing.assert_array_equal(y, want.astype(np.float32))
    assert len(np.unique(y)) > 30


def test_unit_scale_mma_is_the_plain_mma_bit_for_bit():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, size=(16, 32), dtype=np.uint8)
    b = rng.integers(0, 256, size=(8, 32), dtype=np.uint8)
    a[(a & 0x7F) == 0x7F] = 0x40
    b[(b & 0x7F) == 0x7F] = 0x40
    unit = _run_mma("unit", a, b, None, None)
    plain = _run_mma("plain", a, b, None, None)
    np.testing.assert_array_equal(unit.view(np.uint32), plain.view(np.uint32))
    assert np.count_nonzero(unit != 1.0) > 100


def _mx_operands(rng, m, n, k, lo=110, hi=140):
    a = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
    b = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    a[(a & 0x7F) == 0x7F] = 0x44
    b[(b & 0x7F) == 0x7F] = 0x44
    nkb = -(-k // 32)
    sa = rng.integers(lo, hi, size=(m, nkb), dtype=np.uint8)
    sb = rng.integers(lo, hi, size=(n, nkb), dtype=np.uint8)
    return a, b, sa, sb


def _tensorcore_mx(a, b, sa, sb, out_dtype, bias, mma_kind):
    from vtnumba.cuda import block
    from vtnumba.cuda.kernels import tc_gemm

    call = block.BlockCall(a, b, sa, sb, (1, 32), np.dtype(out_dtype), bias)
    assert call.mx
    kernel = block.TensorCoreMx(mma_kind, simulate=True)
    assert kernel.can_implement(call) == (True, "")
    launch = tc_gemm.gemm_launch(call, None, False, mma_kind=mma_kind)
    assert launch[0].pyfunc.__name__ == "gemm" and launch[3][2].dtype == np.uint8  # the MX kernel, bytes in
    return kernel.run(call)


@pytest.mark.parametrize("mma_kind", ["mx", "mx_explicit"])
# partial tiles along M and N; K = 96: the second 64-wide tile's last k32 step lies past K (skipped)
@pytest.mark.parametrize("m,n,k", [(33, 20, 96), (5, 16, 64)])
@pytest.mark.parametrize("out_dtype,with_bias", [(F32, False), (BF16, True)])
def test_tensorcore_mx_gemm_meets_block_g3(mma_kind, m, n, k, out_dtype, with_bias):
    rng = np.random.default_rng(m * n + k)
    a, b, sa, sb = _mx_operands(rng, m, n, k)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    y = _tensorcore_mx(a, b, sa, sb, out_dtype, bias, mma_kind)
    assert assert_block_g3(y, a, b, sa, sb, (1, 32), bias, out_dtype) > m * n // 2


def test_tensorcore_mx_kinds_agree_and_a_nan_scale_poisons_its_outputs():
    """The block-scaled mma (sm_12x) and the plain mma scaled per k32 (sm_89 / sm_90) give the same
    bits here (the emulation scales the k32 partial as the explicit form does); a 0xFF scale byte makes
    its row (activation) or column (weight) NaN, nothing else."""
    rng = np.random.default_rng(9)
    a, b, sa, sb = _mx_operands(rng, 18, 12, 64)
    sa[4, 1] = 0xFF
    sb[7, 0] = 0xFF
    hw = _tensorcore_mx(a, b, sa, sb, F32, None, "mx")
    explicit = _tensorcore_mx(a, b, sa, sb, F32, None, "mx_explicit")
    np.testing.assert_array_equal(hw.view(np.uint32), explicit.view(np.uint32))
    nan = np.isnan(hw)
    assert nan[4].all() and nan[:, 7].all() and nan.sum() == 12 + 18 - 1
    assert_block_g3(hw, a, b, sa, sb, (1, 32))


@pytest.mark.parametrize("m,n,k", [(3, 40, 96), (2, 33, 50)])
def test_tiled_block_kernel_reads_e8m0_bytes(m, n, k):
    """The CUDA-core fallback on E8M0 bytes (MXFP8, both sides) and on E8M0 weight blocks beside float32
    activation scales (DeepSeek's UE8M0 checkpoints, 128 x 128 here: decoded once by the call)."""
    from vtnumba.cuda import block

    rng = np.random.default_rng(m + n + k)
    a, b, sa, sb = _mx_operands(rng, m, n, k, 90, 160)
    y = block.block_scaled_mm(a, b, sa, sb, (1, 32), F32, None, "tiled_block")
    assert assert_block_g3(y, a, b, sa, sb, (1, 32)) > m * n // 2
    sa128 = rng.uniform(1e-3, 1.0, size=(m, -(-k // 128))).astype(np.float32)
    sb128 = rng.integers(110, 130, size=(-(-n // 128), -(-k // 128)), dtype=np.uint8)
    y = block.block_scaled_mm(a, b, sa128, sb128, (128, 128), F32, None, "tiled_block")
    assert assert_block_g3(y, a, b, sa128, sb128, (128, 128)) > m * n // 2


def test_block_select_takes_the_mx_kernel_and_names_why_others_cannot():
    from vtnumba.cuda import block

    rng = np.random.default_rng(5)
    a, b, sa, sb = _mx_operands(rng, 4, 16, 64)
    call = block.BlockCall(a, b, sa, sb, (1, 32), F32, None)
    reasons = {k.name: k.can_implement(call) for k in block.KERNELS}
    assert reasons["tiled_block"] == (True, "")
    assert "E8M0" in reasons["cublaslt_block"][1] and "E8M0" in reasons["tensorcore_block"][1]
    assert "simulator" in reasons["tensorcore_mx"][1]  # only through its emulation, asked for
    assert block.select(call).name == "tiled_block"


@pytest.mark.parametrize("config", ["16x32_w2_16x16", "32x64_w4_32x16"])
@pytest.mark.parametrize("mma_kind", ["mx", "mx_explicit"])
def test_the_small_m_mx_tiles_meet_block_g3(config, mma_kind):
    """The tiles MXFP8 takes at M <= 256 on a GPU (tc_gemm.MX_CONFIGS_BY_M: one warp row, 64 or 128
    threads, a 16- or 32-row tile), run here through the simulator as the default tile is."""
    from vtnumba.cuda import block
    from vtnumba.cuda.kernels import tc_gemm

    assert config in dict((name, m) for m, name in tc_gemm.MX_CONFIGS_BY_M)  # the tiles the GPU takes
    rng = np.random.default_rng(7)
    a, b, sa, sb = _mx_operands(rng, 5, 70, 96)
    call = block.BlockCall(a, b, sa, sb, (1, 32), F32, None)
    y = np.zeros((5, 70), np.float32)
    launcher, grid, threads, args = tc_gemm.gemm_launch(
        call, y, False, config=tc_gemm.GEMM_CONFIGS[config], mma_kind=mma_kind
    )
    assert threads == 32 * tc_gemm.GEMM_CONFIGS[config].wn and threads in (64, 128)
    launcher(grid, threads, *args)
    assert assert_block_g3(y, a, b, sa, sb, (1, 32)) > 5 * 70 // 2
