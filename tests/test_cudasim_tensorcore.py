"""The tensor-core kernels' tile logic under the CUDA simulator (CI): indexing, cp.async staging,
promotion, block scales, the fused quantization and the epilogue, through the portable emulation
of mma.sync / ldmatrix / cp.async (vtnumba/cuda/ptx/mma.py). Tiny shapes, G3 against the independent
float64 reference. The hardware path is proven by tests/test_tensorcore_gpu.py.

Runs only in the simulator process (marker ``cudasim``; tests/test_cudasim.py starts it).
"""

import numpy as np
import pytest
from tensorcore_cases import (
    BF16,
    F16,
    F32,
    assert_same_f16,
    block_reference,
    check_g3,
    cvt_f16_check,
    group_quantize,
    launch_tc_f32,
    mma_f16_layout_check,
    mma_layout_check,
    scales_and_bias,
    uniform_codes,
)

from vtnumba.testing import reference

pytestmark = pytest.mark.cudasim


@pytest.fixture(scope="module")
def tc():
    from vtnumba.cuda.kernels import tc_gemm

    return tc_gemm


@pytest.fixture(scope="module")
def tcv():
    from vtnumba.cuda.kernels import tc_gemv

    return tc_gemv


def blockwise(a, b, sa, sb, out_dtype, bias, promotion="per_mma"):
    """The block-scaled GEMM on the tensor-core kernels through their emulation (block.select's
    kernels, forced: M <= 16 the GEMV, else the tiled GEMM)."""
    from vtnumba.cuda import block

    call = block.BlockCall(a, b, sa, sb, (128, 128), np.dtype(out_dtype), bias)
    kernel = (
        block.TensorCoreBlockGemv(simulate=True) if call.m <= 16 else block.TensorCoreBlock(promotion, simulate=True)
    )
    assert kernel.can_implement(call) == (True, "")
    return kernel.run(call)


def fused(x, b, sb, out_dtype, input_scale=None, per_token=False, scale_ub=None, block_scales=None):
    """The fused tensor-core layer (vt.fp8_linear's GPU half at decode) through its emulation."""
    from vtnumba.cuda import quantize
    from vtnumba.cuda.kernels import tc_gemv

    ub = None if scale_ub is None else np.float32(scale_ub)
    sb = np.float32(sb) if np.isscalar(sb) else sb
    return tc_gemv.fused_linear(
        x,
        b,
        sb,
        input_scale,
        per_token,
        ub,
        np.dtype(out_dtype),
        None,
        lambda x_: quantize.quantize_activation(x_, input_scale, per_token, ub),
        block_scales,
    )


@pytest.fixture(scope="module")
def gemm():
    from vtnumba.cuda import gemm

    return gemm


def test_mma_emulation_matches_the_documented_fragment_layout(tc):
    d, ref, bound = mma_layout_check(np.random.default_rng(1))
    assert check_g3(d, ref, bound, F32)[0] == 128


def test_f16_mma_and_cvt_emulations_match_the_documented_layouts(tc):
    d, ref, bound = mma_f16_layout_check(np.random.default_rng(2))
    assert check_g3(d, ref, bound, F32)[0] == 128
    assert assert_same_f16(*cvt_f16_check()) == 254  # every code but the two NaNs, bit for bit


CASES = [  # (out dtype, per-row x per-channel scales, bias dtype)
    (F32, False, None),
    (F16, True, F16),
    (BF16, True, F32),
]


@pytest.mark.parametrize("config", ["sim_32x16", "sim_32x16_f16ab"])  # e4m3 mma; f16-staged tiles
@pytest.mark.parametrize("promotion", ["per_mma", "per_128"])
@pytest.mark.parametrize("out_dtype, vector_scales, bias_dtype", CASES, ids=str)
def test_gemm_g3_partial_tiles_nan(tc, gemm, promotion, config, out_dtype, vector_scales, bias_dtype):
    rng = np.random.default_rng(7)
    m, n, k = 37, 20, 208  # partial M and N tiles; K: three 64-wide tiles and a 16-wide one
    a, b = uniform_codes(rng, (m, k), nan_codes=True), uniform_codes(rng, (n, k))
    sa, sb, bias = scales_and_bias(rng, m, n, vector_scales, bias_dtype)
    call = gemm.GemmCall(a, b, sa, sb, out_dtype, bias)
    kernel = gemm.TensorCoreGemm(promotion, config=tc.GEMM_CONFIGS[config], simulate=True)
    assert kernel.can_implement(call) == (True, "")
    y = kernel.run(call)
    ref, bound = reference.scaled_mm(a, b, sa, sb, None if bias is None else bias.astype(np.float64))
    compared, _ = check_g3(y, ref, bound, out_dtype)
    assert compared > m * n // 2
    # the NaN codes (first and last element of a) poison their rows only
    assert np.isnan(y[[0, -1]]).all() and not np.isnan(y[1:-1]).any()


def test_gemm_chain_equals_explicit_promotion_and_word_loads(tc):
    """Passing the accumulator as C (how sm_90 runs promotion per mma) gives the explicit form's
    values; the 32-bit shared-load fragment path gives them too."""
    rng = np.random.default_rng(8)
    m, n, k = 33, 17, 160
    a, b = uniform_codes(rng, (m, k)), uniform_codes(rng, (n, k))
    one = np.ones(1, np.float32)
    outs = {}
    for name, cfg, chain in (
        ("explicit", "sim_32x16", False),
        ("chain", "sim_32x16", True),
        ("words", "sim_32x16_lds", False),
    ):
        cfg = tc.GEMM_CONFIGS[cfg]
        bm, bn = tc.tile_shape(cfg)
        y = np.full((m, n), np.nan, dtype=np.float32)
        tc.gemm_launcher(cfg, tc.PER_MMA, False, chain, True)(
            (-(-n // bn), -(-m // bm)), 32 * cfg.wm * cfg.wn, a, b, one, 0, one, 0, np.zeros(1, np.uint16), 0, y, 0
        )
        outs[name] = y
    ref, bound = reference.scaled_mm(a, b, 1.0, 1.0)
    assert check_g3(outs["explicit"], ref, bound, F32)[0] > 0
    np.testing.assert_array_equal(outs["chain"], outs["explicit"])
    np.testing.assert_array_equal(outs["words"], outs["explicit"])


@pytest.mark.parametrize("m, n, k", [(20, 9, 16), (40, 17, 336)])  # K: one partial tile; five and a 16-wide one
def test_f16_staging_of_either_operand_or_both(tc, m, n, k):
    """Staging A, B or both in f16 shared memory (the other converted from e4m3 fragments in
    registers) feeds the HMMAs the same operands in the same k order: the same values, within G3,
    NaN rows exactly; the tensor core's own accumulation (chain) within G3 too."""
    rng = np.random.default_rng(k)
    a, b = uniform_codes(rng, (m, k), nan_codes=True), uniform_codes(rng, (n, k))
    ref, bound = reference.scaled_mm(a, b, 1.0, 1.0)
    both = launch_tc_f32(tc, np, "sim_32x16_f16ab", "per_mma", False, a, b)
    assert check_g3(both, ref, bound, F32)[0] > m * n // 2
    for config in ("sim_32x16_f16a", "sim_32x16_f16b"):
        np.testing.assert_array_equal(launch_tc_f32(tc, np, config, "per_mma", False, a, b), both)
    assert check_g3(launch_tc_f32(tc, np, "sim_32x16_f16ab", "per_mma", True, a, b), ref, bound, F32)[0] > m * n // 2


def test_f16_staged_config_rules(tc):
    with pytest.raises(ValueError, match="f16 must be one of"):
        tc.gemm_kernel(tc.TileConfig(mt=1, nt=2, wm=2, wn=1, stages=2, ldmatrix=True, f16="c"), "per_mma", False, False)
    with pytest.raises(ValueError, match="ldmatrix must be True"):
        tc.gemm_kernel(
            tc.TileConfig(mt=1, nt=2, wm=2, wn=1, stages=2, ldmatrix=False, f16="ab"), "per_mma", False, False
        )
    with pytest.raises(ValueError, match="bytes of shared memory"):
        tc.gemm_kernel(
            tc.TileConfig(mt=4, nt=8, wm=4, wn=4, stages=8, ldmatrix=True, f16="ab"), "per_mma", False, False
        )
    # the e4m3 ring and two f16 tiles of the staged rows, in dynamic shared memory
    assert tc.shared_bytes(tc.GEMM_CONFIGS["sim_32x16_f16b"]) == (0, 2 * 48 * 64 + 2 * 16 * 128)
    assert tc.shared_bytes(tc.GEMM_CONFIGS["sim_32x16"]) == (2 * 48 * 64, 0)


@pytest.mark.parametrize(
    "promotion, config",
    [("per_mma", "sim_32x16"), ("per_128", "sim_32x16"), ("per_mma", "sim_32x16_f16ab"), ("per_128", "sim_32x16_f16b")],
)
def test_blockwise_gemm(tc, promotion, config):
    rng = np.random.default_rng(9)
    m, n, k = 40, 150, 320  # three K blocks, the last 64 wide; two weight row blocks, the second partial
    a, b = uniform_codes(rng, (m, k)), uniform_codes(rng, (n, k), nan_codes=True)
    sa = rng.uniform(0.001, 0.02, (m, 3)).astype(np.float32)
    sb = rng.uniform(-0.05, 0.05, (2, 3)).astype(np.float32)
    bias = rng.standard_normal(n).astype(BF16)
    if config == "sim_32x16":  # block.select's kernel
        y = blockwise(a, b, sa, sb, BF16, bias, promotion=promotion)
    else:
        from vtnumba.cuda import block

        call = block.BlockCall(a, b, sa, sb, (128, 128), BF16, bias)
        y = np.empty((m, n), dtype=BF16)
        kernel, grid, threads, args = tc.gemm_launch(call, y.view(np.uint16), True, promotion, tc.GEMM_CONFIGS[config])
        kernel(grid, threads, *args)
    ref, bound = block_reference(a, b, sa, sb, bias.astype(np.float64))
    assert check_g3(y, ref, bound, BF16)[0] > m * n // 2


@pytest.mark.parametrize("m, bias_dtype, out_dtype", [(1, None, BF16), (5, F16, F32), (12, F32, F16)])
def test_gemv_codes(tc, gemm, m, bias_dtype, out_dtype):
    rng = np.random.default_rng(10 + m)
    n, k = 20, 272  # a partial row tile; three 128-wide chunks, the last 16 wide
    a, b = uniform_codes(rng, (m, k), nan_codes=m > 1), uniform_codes(rng, (n, k))
    sa = rng.uniform(-0.05, 0.05, m).astype(np.float32) if m > 1 else np.float32(0.03)
    sb = rng.uniform(0.001, 0.01, n).astype(np.float32)
    bias = None if bias_dtype is None else rng.standard_normal(n).astype(bias_dtype)
    call = gemm.GemmCall(a, b, sa, sb, out_dtype, bias)
    kernel = gemm.TensorCoreGemv(simulate=True)
    assert kernel.can_implement(call) == (True, "")
    y = kernel.run(call)
    ref, bound = reference.scaled_mm(a, b, sa, sb, None if bias is None else bias.astype(np.float64))
    assert check_g3(y, ref, bound, out_dtype)[0] > 0


def test_gemv_blockwise_codes():
    rng = np.random.default_rng(14)
    m, n, k = 3, 140, 256
    a, b = uniform_codes(rng, (m, k)), uniform_codes(rng, (n, k))
    sa = rng.uniform(0.001, 0.02, (m, 2)).astype(np.float32)
    sb = rng.uniform(0.01, 0.05, (2, 2)).astype(np.float32)
    y = blockwise(a, b, sa, sb, F32, None)
    ref, bound = block_reference(a, b, sa, sb)
    assert check_g3(y, ref, bound, F32)[0] == m * n


def _layer_input(rng, m, k, dtype):
    """Gaussian rows, with a NaN in the last row when there are several (it must poison that row)."""
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    if m > 1:
        x[-1, 5] = np.nan
    return x.astype(dtype)


@pytest.mark.parametrize(
    "scheme, m, x_dtype",
    [("static", 2, F32), ("dynamic", 1, BF16), ("per_token", 3, F16), ("dynamic", 6, F32)],
    ids=str,
)
def test_fused_linear(scheme, m, x_dtype):
    rng = np.random.default_rng(15)
    n, k = 18, 144
    x = _layer_input(rng, m, k, x_dtype)
    b = uniform_codes(rng, (n, k))
    sb = rng.uniform(0.001, 0.01, n).astype(np.float32)
    kw = {"static": dict(input_scale=np.float32(0.013)), "dynamic": {}, "per_token": dict(per_token=True, scale_ub=5.0)}
    y = fused(x, b, sb, F32, **kw[scheme])
    q = {
        "static": lambda: reference.quantize(x, np.float32(0.013)),
        "dynamic": lambda: reference.quantize(x),
        "per_token": lambda: reference.quantize(x, per_token=True, scale_ub=5.0),
    }[scheme]()
    ref, bound = reference.scaled_mm(q.data, b, q.scale.reshape(-1) if scheme == "per_token" else q.scale[0], sb)
    compared, _ = check_g3(y, ref, bound, F32)
    assert compared > 0 and np.isnan(y[-1]).all() == (m > 1)


def test_fused_linear_group_activations_block_weights():
    rng = np.random.default_rng(16)
    m, n, k = 2, 20, 272
    x = _layer_input(rng, m, k, BF16)
    b = uniform_codes(rng, (n, k))
    sbb = rng.uniform(0.001, 0.05, (1, 3)).astype(np.float32)
    y = fused(x, b, None, BF16, block_scales=sbb)
    codes, scales = group_quantize(x)
    ref, bound = block_reference(codes, b, scales, sbb)
    compared, _ = check_g3(y, ref, bound, BF16)
    assert compared > 0 and np.isnan(y[1]).all() and not np.isnan(y[0]).any()


@pytest.mark.parametrize("limit, scheme", [(600, "per_token"), (600, "group"), (0, "static")])
def test_fused_linear_row_slices_and_fallback(tcv, monkeypatch, limit, scheme):
    """x that does not fit in shared memory at once: the fused GEMV runs on row slices (a limit of
    600 bytes holds one row of K = 256), or, when not even one row fits, quantize then codes."""
    monkeypatch.setattr(tcv, "FUSED_SHARED_LIMIT", limit)
    rng = np.random.default_rng(17)
    m, n, k = 3, 20, 256
    x = _layer_input(rng, m, k, F32)
    b = uniform_codes(rng, (n, k))
    if scheme == "group":
        sbb = rng.uniform(0.001, 0.05, (1, 2)).astype(np.float32)
        y = fused(x, b, None, F32, block_scales=sbb)
        codes, scales = group_quantize(x)
        ref, bound = block_reference(codes, b, scales, sbb)
    else:
        sb = np.float32(0.004)
        kw = dict(per_token=True) if scheme == "per_token" else dict(input_scale=np.float32(0.02))
        y = fused(x, b, sb, F32, **kw)
        q = reference.quantize(x, **({"per_token": True} if scheme == "per_token" else {"scale": np.float32(0.02)}))
        ref, bound = reference.scaled_mm(q.data, b, q.scale.reshape(-1) if scheme == "per_token" else q.scale[0], sb)
    compared, _ = check_g3(y, ref, bound, F32)
    assert compared >= (m - 1) * n // 2 and np.isnan(y[-1]).all()


def test_reasons(tc, gemm):
    a, b = np.zeros((3, 24), np.uint8), np.zeros((5, 24), np.uint8)
    call = gemm.GemmCall(a, b, np.float32(1), np.float32(1), F32, None)
    ok, why = gemm.TensorCoreGemm().can_implement(call)
    assert not ok and "simulate=True" in why
    ok, why = gemm.TensorCoreGemm(simulate=True).can_implement(call)
    assert not ok and "multiple of 16, got K = 24" in why
    big = gemm.GemmCall(
        np.zeros((17, 32), np.uint8), np.zeros((5, 32), np.uint8), np.float32(1), np.float32(1), F32, None
    )
    ok, why = gemm.TensorCoreGemv(simulate=True).can_implement(big)
    assert not ok and "M <= 16, got M = 17" in why
    # the selection never takes them under the simulator unless forced: the CUDA-core kernels run
    assert (
        gemm.select(
            gemm.GemmCall(
                np.zeros((3, 32), np.uint8), np.zeros((5, 32), np.uint8), np.float32(1), np.float32(1), F32, None
            )
        ).name
        == "decode_gemv"
    )
