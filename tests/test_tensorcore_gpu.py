"""The tensor-core kernels on a real GPU (marker ``gpu``; the H200 run proves them, CI skips them).

Strict G3 (DESIGN.md) on codes drawn uniformly over the whole e4m3 range -- where cuBLASLt misses
it by up to 16x -- for the GEMM (both promotions), the decode GEMV, block scales, every scale mode,
output dtype and bias; the documented fragment layout on the hardware; the claim behind
``chains_in_float32`` (passing the accumulator as C is promotion per mma, bit for bit).
"""

import numpy as np
import pytest
from tensorcore_cases import (
    BF16,
    EPILOGUE_CASES,
    F32,
    assert_same_f16,
    block_case,
    block_reference,
    check_g3,
    cvt_f16_check,
    group_quantize,
    kernels_here,
    launch_tc_f32,
    mma_f16_layout_check,
    mma_layout_check,
    scales_and_bias,
    to_device,
    uniform_codes,
)

from vtnumba.testing import reference

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tc(cp):
    return kernels_here("tc_gemm")


@pytest.fixture(scope="module")
def gemm(cp):
    from vtnumba.cuda import gemm

    return gemm


def host(y):
    dt = np.dtype(y.dtype)
    return y.view(np.uint16).get().view(dt) if dt == BF16 else y.get()


def run_gemm(tc, gemm, cp, a, b, sa, sb, out_dtype, bias=None, promotion="per_mma"):
    call = gemm.GemmCall(
        cp.asarray(a), cp.asarray(b), to_device(cp, sa), to_device(cp, sb), out_dtype, to_device(cp, bias)
    )
    kernel = gemm.TensorCoreGemm(promotion) if call.m > 16 else gemm.TensorCoreGemv()
    ok, why = kernel.can_implement(call)
    assert ok, why
    return host(kernel.run(call))


def test_fragment_layout_on_the_hardware(cp):
    d, ref, bound = mma_layout_check(np.random.default_rng(1), cp.asarray, lambda v: v.get())
    compared, worst = check_g3(d, ref, bound, F32)
    assert compared == 128
    print(f"one m16n8k32 tile: worst err / G3 bound {worst:.2e}")


def test_f16_mma_and_cvt_on_the_hardware(cp):
    d, ref, bound = mma_f16_layout_check(np.random.default_rng(2), cp.asarray, lambda v: v.get())
    assert check_g3(d, ref, bound, F32)[0] == 128
    assert assert_same_f16(*cvt_f16_check(cp.asarray, lambda v: v.get())) == 254  # all but the NaNs, bit for bit


def test_chained_c_is_promotion_per_mma(tc, cp):
    """sm_90 runs promotion per mma by passing the accumulator as C (chains_in_float32): the values
    must equal the explicit form's (C = 0, then a float32 add) exactly."""
    from vtnumba.cuda.runtime import device

    cc = device.current().cc
    if not tc.chains_in_float32(cc):
        pytest.skip(f"the chained form is not used on {cc}")
    rng = np.random.default_rng(2)
    m, n, k = 256, 384, 2048
    a, b = cp.asarray(uniform_codes(rng, (m, k))), cp.asarray(uniform_codes(rng, (n, k)))
    one = cp.ones(1, cp.float32)
    outs = []
    for chain in (True, False):
        cfg = tc.GEMM_DEFAULT
        bm, bn = tc.tile_shape(cfg)
        y = cp.full((m, n), cp.nan, dtype=cp.float32)
        tc.gemm_launcher(cfg, tc.PER_MMA, False, chain, True)(
            (-(-n // bn), -(-m // bm)), 32 * cfg.wm * cfg.wn, a, b, one, 0, one, 0, cp.zeros(1, cp.uint16), 0, y, 0
        )
        outs.append(y.get())
    assert not np.isnan(outs[0]).any()
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("k", [256, 4096])
@pytest.mark.parametrize("promotion", ["per_mma", "per_128"])
def test_gemm_strict_g3_uniform_codes(tc, gemm, cp, promotion, k):
    rng = np.random.default_rng(3)
    m, n = 384, 320  # three row tiles, two and a half column tiles
    a, b = uniform_codes(rng, (m, k)), uniform_codes(rng, (n, k))
    y = run_gemm(tc, gemm, cp, a, b, np.float32(1), np.float32(1), F32, promotion=promotion)
    ref, bound = reference.scaled_mm(a, b, 1.0, 1.0)
    compared, worst = check_g3(y, ref, bound, F32)
    assert compared > m * n * 9 // 10
    print(f"{promotion} K={k}: worst err / G3 bound {worst:.3f}")


@pytest.mark.parametrize("m", [1, 5, 16, 300])
@pytest.mark.parametrize("out_dtype, vector_scales, bias_dtype", EPILOGUE_CASES, ids=str)
def test_scales_out_dtypes_bias_partial_tiles_nan(tc, gemm, cp, m, out_dtype, vector_scales, bias_dtype):
    rng = np.random.default_rng(4 + m)
    n, k = 200, 1040  # partial tiles everywhere; K: sixteen 64-wide tiles and a 16-wide one
    a, b = uniform_codes(rng, (m, k), nan_codes=m > 1), uniform_codes(rng, (n, k))
    sa, sb, bias = scales_and_bias(rng, m, n, vector_scales, bias_dtype)
    y = run_gemm(tc, gemm, cp, a, b, sa, sb, out_dtype, bias)
    ref, bound = reference.scaled_mm(a, b, sa, sb, None if bias is None else bias.astype(np.float64))
    compared, _ = check_g3(y, ref, bound, out_dtype)
    assert compared > 0
    if m > 1:  # the NaN codes (first and last element of a) poison exactly their rows
        assert np.isnan(y[[0, -1]]).all() and not np.isnan(y[1:-1]).any()


@pytest.mark.parametrize("m", [1, 4, 16])
def test_gemv_real_shape_strict_g3(tc, gemm, cp, m):
    rng = np.random.default_rng(5)
    n, k = 4096, 4096
    a, b = uniform_codes(rng, (m, k)), uniform_codes(rng, (n, k))
    y = run_gemm(tc, gemm, cp, a, b, np.float32(0.5), np.float32(0.25), BF16)
    ref, bound = reference.scaled_mm(a, b, 0.5, 0.25)
    compared, worst = check_g3(y, ref, bound, BF16)
    assert compared > m * n * 9 // 10
    print(f"GEMV M={m}: worst err / G3 bound {worst:.3f}")


@pytest.mark.parametrize("m", [3, 200])
@pytest.mark.parametrize("promotion", ["per_mma", "per_128"])
def test_blockwise(tc, cp, m, promotion):
    rng = np.random.default_rng(6)
    a, b, sa, sb, bias = block_case(rng, m)
    # scale_a as torch and cuBLASLt keep it: [M, KB] with strides (1, M)
    sa_dev = cp.asfortranarray(cp.asarray(sa))
    from vtnumba.cuda import block

    call = block.BlockCall(cp.asarray(a), cp.asarray(b), sa_dev, cp.asarray(sb), (128, 128), BF16, cp.asarray(bias))
    kernel = block.TensorCoreBlockGemv() if m <= 16 else block.TensorCoreBlock(promotion)
    assert kernel.can_implement(call) == (True, "")
    y = host(kernel.run(call))
    ref, bound = block_reference(a, b, sa, sb, bias.astype(np.float64))
    compared, worst = check_g3(y, ref, bound, BF16)
    assert compared > (m - 2) * b.shape[0] // 2  # rows 0 and M - 1 hold NaN codes
    assert np.isnan(y[[0, -1]]).all() and not np.isnan(y[1:-1]).any()
    print(f"block {promotion} M={m}: worst err / G3 bound {worst:.3f}")


@pytest.mark.parametrize("x_dtype", [F32, BF16], ids=str)  # float16 x: the simulator tests
@pytest.mark.parametrize(
    "scheme, m",
    [("static", 1), ("static", 16), ("dynamic", 1), ("dynamic", 8), ("per_token", 4), ("group", 1), ("group", 12)],
)
def test_fused_linear(tc, cp, scheme, m, x_dtype):
    rng = np.random.default_rng(7)
    n, k = 1024, 4096
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    if m > 1:
        x[-1, 5] = np.nan
    x = x.astype(x_dtype)
    b = uniform_codes(rng, (n, k))
    xd, bd = cp.asarray(x), cp.asarray(b)
    if scheme == "group":
        from vtnumba.cuda.kernels import tc_gemv

        sbb = rng.uniform(0.001, 0.05, (8, 32)).astype(np.float32)
        assert tc_gemv.fused_linear_reason(xd, bd, block_scaled=True) is None
        y = host(tc_gemv.fused_linear(xd, bd, None, None, False, None, BF16, None, None, cp.asarray(sbb)))
        codes, scales = group_quantize(x)
        ref, bound = block_reference(codes, b, scales, sbb)
    else:
        sb = rng.uniform(0.001, 0.01, n).astype(np.float32)
        kw = {"static": dict(input_scale=np.float32(0.013)), "dynamic": {}, "per_token": dict(per_token=True)}[scheme]
        import vtnumba as vt
        from vtnumba.cuda.kernels import tc_gemv

        assert tc_gemv.fused_linear_reason(xd, bd) is None  # vt.fp8_linear takes the fused tensor-core GEMV
        y = host(vt.fp8_linear(xd, bd, cp.asarray(sb), out_dtype=BF16, **kw))
        q = reference.quantize(
            x,
            **(
                {"scale": np.float32(0.013)}
                if scheme == "static"
                else {"per_token": True}
                if scheme == "per_token"
                else {}
            ),
        )
        ref, bound = reference.scaled_mm(q.data, b, q.scale.reshape(-1) if scheme == "per_token" else q.scale[0], sb)
    compared, _ = check_g3(y, ref, bound, BF16)
    assert compared > (m - 1) * n // 2
    assert np.isnan(y[-1]).all() == (m > 1)


def test_rows_not_16_byte_aligned_are_refused(tc, gemm, cp):
    a = cp.zeros((64, 80), cp.uint8)[:, 8:72]  # rows start 8 bytes in: cp.async cannot copy them
    b = cp.zeros((64, 64), cp.uint8)
    call = gemm.GemmCall(a, b, np.float32(1), np.float32(1), F32, None)
    ok, why = gemm.TensorCoreGemm().can_implement(call)
    assert not ok and "16-byte aligned rows" in why


@pytest.mark.parametrize("mode, m", [(1, 16), (2, 4), (3, 16), (4, 12)])
def test_static_shared_estimate_covers_the_compiled_kernel(tc, cp, mode, m):
    """The fused GEMV sizes its dynamic shared memory beside its static arrays (48 KB in all):
    the estimate must cover what the compiled kernel declares."""
    from vtnumba.cuda.kernels import tc_gemv
    from vtnumba.cuda.ptx.codec import hardware_available
    from vtnumba.cuda.runtime import device

    cc = device.current().cc
    k = 4096
    cfg = tc_gemv.gemv_config(m, k)
    launcher = tc_gemv.gemv_launcher(m, cfg, mode, mode == 4, hardware_available(cc), tc.chains_in_float32(cc), False)
    # the static shared memory the compiled kernel declares, from the driver (cuda-bindings, which
    # numba-cuda brings)
    from cuda.bindings import driver as cu

    err, declared = cu.cuFuncGetAttribute(
        cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, cu.CUfunction(launcher.function().ptr)
    )
    assert err == cu.CUresult.CUDA_SUCCESS, err
    assert 0 < declared <= tc_gemv.gemv_static_shared_bytes(1 if m <= 8 else 2, cfg, mode)


# -- f16-staged tiles (tc_gemm.py: A, B or both converted once per block into f16 shared memory) ------
F16_CONFIGS = [
    "f16ab_128x128_w8_32x64",
    "f16b_128x128_w8_32x64",
    "f16ab_128x128_w4_64x64",
    "f16b_128x128_w4_64x64",
    "f16ab_128x256_w8_64x64",
    "f16a_128x256_w8_64x64",
    "f16ab_256x128_w8_64x64",
    "f16b_256x128_w8_64x64",
]
# block scales (and per_128) keep a K-block partial beside the accumulator: the 32 x 64 warp tiles,
# whose BN (128) divides the weight blocks
F16_SPLIT_CONFIGS = ["f16ab_128x128_w8_32x64", "f16b_128x128_w8_32x64"]


@pytest.fixture(scope="module")
def uniform_k4096(cp):
    rng = np.random.default_rng(11)
    m, n, k = 384, 320, 4096  # partial tiles for every configuration but 128 x 128
    a, b = uniform_codes(rng, (m, k)), uniform_codes(rng, (n, k))
    ref, bound = reference.scaled_mm(a, b, 1.0, 1.0)
    return cp.asarray(a), cp.asarray(b), ref, bound


@pytest.mark.parametrize("config", F16_CONFIGS)
def test_f16_staged_strict_g3_one_result_for_every_tile(tc, cp, uniform_k4096, config):
    """Every f16-staged configuration holds strict G3 (promotion per k32) and computes the same bits:
    the HMMAs get the same operands in the same k order whichever operands are staged."""
    a, b, ref, bound = uniform_k4096
    y = launch_tc_f32(tc, cp, config, tc.PER_MMA, False, a, b).get()
    compared, worst = check_g3(y, ref, bound, F32)
    assert compared > y.size * 9 // 10
    np.testing.assert_array_equal(y, launch_tc_f32(tc, cp, F16_CONFIGS[0], tc.PER_MMA, False, a, b).get())
    print(f"{config}: worst err / G3 bound {worst:.4f}")


def test_f16_staged_equals_the_e4m3_kernel_on_sm_90(tc, cp, uniform_k4096):
    """On sm_90 the e4m3 mma is lowered to two HMMA.16816.F32 from zero and a float32 add of C:
    the f16-staged kernel's per_mma issues exactly that, so the two kernels agree bit for bit."""
    from vtnumba.cuda.runtime import device

    if not tc.chains_in_float32(device.current().cc):
        pytest.skip(f"the e4m3 mma is native on {device.current().cc}")
    a, b, _, _ = uniform_k4096
    e4m3 = launch_tc_f32(tc, cp, "128x128_w8_32x64", tc.PER_MMA, True, a, b).get()
    assert not np.isnan(e4m3).any()
    np.testing.assert_array_equal(launch_tc_f32(tc, cp, F16_CONFIGS[0], tc.PER_MMA, False, a, b).get(), e4m3)


@pytest.mark.parametrize(
    "config, promotion, chain",
    [(c, "per_128", False) for c in F16_SPLIT_CONFIGS]
    + [(c, "per_mma", True) for c in ("f16ab_128x128_w8_32x64", "f16b_128x128_w8_32x64", "f16a_128x256_w8_64x64")],
)
def test_f16_staged_tensor_core_accumulation_g3(tc, cp, uniform_k4096, config, promotion, chain):
    """per_128 lets the HMMAs accumulate each 128-wide K block, chain the whole K: G3 measured."""
    a, b, ref, bound = uniform_k4096
    y = launch_tc_f32(tc, cp, config, promotion, chain, a, b).get()
    compared, worst = check_g3(y, ref, bound, F32)
    assert compared > y.size * 9 // 10
    print(f"{config} {promotion}{' chain' if chain else ''}: worst err / G3 bound {worst:.4f}")


@pytest.mark.parametrize("config", F16_CONFIGS)
@pytest.mark.parametrize("out_dtype, vector_scales, bias_dtype", EPILOGUE_CASES, ids=str)
def test_f16_staged_scales_out_dtypes_bias_nan(tc, gemm, cp, config, out_dtype, vector_scales, bias_dtype):
    rng = np.random.default_rng(12)
    m, n, k = 300, 200, 1040  # partial tiles everywhere; K: sixteen 64-wide tiles and a 16-wide one
    a, b = uniform_codes(rng, (m, k), nan_codes=True), uniform_codes(rng, (n, k))
    sa, sb, bias = scales_and_bias(rng, m, n, vector_scales, bias_dtype)
    call = gemm.GemmCall(
        cp.asarray(a), cp.asarray(b), to_device(cp, sa), to_device(cp, sb), out_dtype, to_device(cp, bias)
    )
    kernel = gemm.TensorCoreGemm(config=tc.GEMM_CONFIGS[config])
    assert kernel.can_implement(call) == (True, "")
    y = host(kernel.run(call))
    ref, bound = reference.scaled_mm(a, b, sa, sb, None if bias is None else bias.astype(np.float64))
    assert check_g3(y, ref, bound, out_dtype)[0] > m * n // 2
    assert np.isnan(y[[0, -1]]).all() and not np.isnan(y[1:-1]).any()


def test_f16_staged_prepared_launch(tc, gemm, cp):
    """A prepared launch of its steps (what a bound call and graph capture replay) passes the
    dynamic shared memory too."""
    rng = np.random.default_rng(13)
    a, b = uniform_codes(rng, (200, 512)), uniform_codes(rng, (136, 512))
    call = gemm.GemmCall(cp.asarray(a), cp.asarray(b), np.float32(1), np.float32(1), F32, None)
    kernel = gemm.TensorCoreGemm(config=tc.GEMM_CONFIGS[F16_CONFIGS[0]])
    y = cp.full((200, 136), cp.nan, dtype=cp.float32)
    (step,) = kernel.steps(call, y, gemm.fresh_scratch)
    step.kernel.prepare(step.grid, step.block, *step.args).launch(cp.cuda.get_current_stream().ptr)
    ref, bound = reference.scaled_mm(a, b, 1.0, 1.0)
    assert check_g3(y.get(), ref, bound, F32)[0] > 0
    np.testing.assert_array_equal(y.get(), host(kernel.run(call)))


@pytest.mark.parametrize("config", F16_SPLIT_CONFIGS)
@pytest.mark.parametrize("promotion", ["per_mma", "per_128"])
def test_f16_staged_blockwise(tc, cp, config, promotion):
    from vtnumba.cuda import block

    rng = np.random.default_rng(14)
    m, n, k = 200, 300, 1088  # three weight row blocks (the last partial); nine K blocks, the last 64 wide
    a, b = uniform_codes(rng, (m, k), nan_codes=True), uniform_codes(rng, (n, k))
    sa = rng.uniform(0.001, 0.02, (m, 9)).astype(np.float32)
    sb = rng.uniform(-0.05, 0.05, (3, 9)).astype(np.float32)
    bias = rng.standard_normal(n).astype(BF16)
    call = block.BlockCall(
        cp.asarray(a),
        cp.asarray(b),
        cp.asfortranarray(cp.asarray(sa)),
        cp.asarray(sb),
        (128, 128),
        BF16,
        cp.asarray(bias),
    )
    y = cp.empty((m, n), dtype=cp.uint16)
    kernel, grid, threads, args = tc.gemm_launch(call, y, True, promotion, tc.GEMM_CONFIGS[config])
    kernel(grid, threads, *args)
    y = y.get().view(BF16)
    ref, bound = block_reference(a, b, sa, sb, bias.astype(np.float64))
    compared, worst = check_g3(y, ref, bound, BF16)
    assert compared > (m - 2) * n // 2
    assert np.isnan(y[[0, -1]]).all() and not np.isnan(y[1:-1]).any()
    print(f"block {config} {promotion}: worst err / G3 bound {worst:.3f}")
