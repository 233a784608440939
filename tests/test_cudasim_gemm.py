"""The GPU GEMM's Numba kernels under the CUDA simulator (CI): tiny shapes against the independent
float64 reference (G3), through the same selection code the GPU runs.

Runs only in the simulator process (marker ``cudasim``; tests/test_cudasim.py starts it). There
the arrays are numpy arrays and cuBLASLt is unavailable, so the Numba kernels carry every call.
"""

import ml_dtypes
import numpy as np
import pytest

from vtnumba.testing import reference
from vtnumba.testing.gates import assert_g3

pytestmark = pytest.mark.cudasim

BF16 = np.dtype(ml_dtypes.bfloat16)
OUT_DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]


@pytest.fixture(scope="module")
def gemm():
    from vtnumba.cuda import gemm

    return gemm


def backend_fp8_linear(x, b, scale_b, input_scale=None, *, per_token=False, scale_ub=None, out_dtype=np.float32):
    """The GPU backend's half of vt.fp8_linear (what a GPU array reaches), on simulator arrays."""
    import vtnumba.cuda as backend

    return backend.fp8_linear(x, b, scale_b, input_scale, per_token, scale_ub, np.dtype(out_dtype), None)


def random_codes(rng, shape, nan_codes=False):
    """e4m3 codes over the whole finite range, no NaN unless asked (then a few 0x7F / 0xFF)."""
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # 1.5
    if nan_codes:
        codes.flat[0] = 0x7F
        codes.flat[-1] = 0xFF
    return codes


def test_half_and_bfloat16_helpers_match_numpy(gemm):
    from vtnumba.cuda.ptx import codec

    halves = np.arange(0, 1 << 16, 97, dtype=np.uint32).astype(np.uint16)
    want = halves.view(np.float16).astype(np.float32)
    got = np.array([codec.half_bits_to_float32(h) for h in halves], dtype=np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
    rng = np.random.default_rng(3)
    xs = np.concatenate(
        [
            rng.standard_normal(300).astype(np.float32)
            * np.float32(10.0) ** rng.integers(-9, 6, 300).astype(np.float32),
            np.array(
                [65504, 65519.99, 65520, -65520, 2**-24, 2**-25, 3 * 2**-26, 2**-14, np.inf, -0.0], dtype=np.float32
            ),
            # exact float16 ties: the midpoint between 1 + k*2^-10 and its neighbour
            (np.float32(1.0) + (np.arange(8, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-10)),
        ]
    )
    got_h = np.array([codec.float32_to_half_bits(x) for x in xs], dtype=np.uint16)
    with np.errstate(over="ignore"):  # the overflow to inf is what is being checked
        want_h = xs.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got_h, want_h)
    got_b = np.array([codec.float32_to_bfloat16_bits(x) for x in xs], dtype=np.uint16)
    np.testing.assert_array_equal(got_b, xs.astype(BF16).view(np.uint16))
    assert codec.float32_to_half_bits(np.float32(np.nan)) & 0x7FFF > 0x7C00


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_tiled_unaligned_shape_per_row_per_channel(gemm, out_dtype):
    rng = np.random.default_rng(11)
    m, n, k = 5, 70, 19  # nothing a multiple of 16; N spans two column tiles
    a = random_codes(rng, (m, k), nan_codes=True)
    b = random_codes(rng, (n, k))
    sa = rng.uniform(-0.02, 0.02, m).astype(np.float32)  # negative scales are legal
    sb = rng.uniform(0.001, 0.01, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(out_dtype if out_dtype != np.float32 else np.float32)
    y = gemm.scaled_mm(a, b, sa, sb, out_dtype, bias, "tiled")
    assert assert_g3(y, a, b, sa, sb, bias, out_dtype) > m * n // 2


def test_tiled_several_k_tiles_host_scalars(gemm):
    # (strided views are a GPU test: the simulator copies arguments and refuses strided ones)
    rng = np.random.default_rng(12)
    a, b = random_codes(rng, (3, 70)), random_codes(rng, (9, 70))  # K spans three 32-wide tiles
    y = gemm.scaled_mm(a, b, np.float32(0.01), np.float32(-0.5), np.dtype(np.float32), None, "tiled")
    assert assert_g3(y, a, b, np.float32(0.01), np.float32(-0.5), None, np.float32) > 0


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("bias_dtype", [None, np.float32, np.float16, BF16], ids=str)
def test_decode_gemv_codes(gemm, m, bias_dtype):
    rng = np.random.default_rng(20 + m)
    n, k = 18, 48  # 18 rows: the last block is partly empty
    a = random_codes(rng, (m, k))
    b = random_codes(rng, (n, k), nan_codes=True)
    sa = np.float32(0.03) if m == 1 else rng.uniform(-0.05, 0.05, m).astype(np.float32)
    sb = rng.uniform(0.001, 0.01, n).astype(np.float32)
    bias = None if bias_dtype is None else rng.standard_normal(n).astype(bias_dtype)
    y = gemm.scaled_mm(a, b, sa, sb, BF16, bias, None)  # auto: the GEMV is first at small M
    assert assert_g3(y, a, b, sa, sb, bias, BF16) > 0
    y2 = gemm.scaled_mm(a, b, sa, sb, np.dtype(np.float32), bias, "decode_gemv")
    assert assert_g3(y2, a, b, sa, sb, bias, np.float32) > 0


def test_decode_gemv_long_k_and_nan_activation_codes(gemm):
    # K spans several steps of the block's threads; NaN activation codes poison exactly their rows
    rng = np.random.default_rng(25)
    m, n, k = 4, 6, 3088  # 6 rows: blocks of 2 at M = 4, the last one full
    a, b = random_codes(rng, (m, k), nan_codes=True), random_codes(rng, (n, k))
    y = gemm.scaled_mm(a, b, np.float32(0.01), np.float32(0.02), np.dtype(np.float32), None, "decode_gemv")
    assert assert_g3(y, a, b, np.float32(0.01), np.float32(0.02), None, np.float32) > 0
    assert np.isnan(y[0]).all() and np.isnan(y[-1]).all() and not np.isnan(y[1:-1]).any()


def test_bit_placed_weight_decode_is_exact_for_every_code(gemm):
    from vtnumba.cuda.ptx import codec

    codes = np.arange(256, dtype=np.uint32)
    words = codes | (np.roll(codes, 1) << 8) | (np.roll(codes, 2) << 16) | (np.roll(codes, 3) << 24)
    want = reference.decode(codes.astype(np.uint8))
    compared = 0
    for i, w in enumerate(words):
        got = np.array(codec.e4m3x4_scaled(np.uint32(w)), dtype=np.float64) * 2.0**120
        flagged = int(codec.nan_code_bits(np.uint32(w)))
        for byte in range(4):
            code = int(codes[(i - byte) % 256])
            is_nan = (code & 0x7F) == 0x7F
            assert bool(flagged & (0x80 << (8 * byte))) == is_nan
            if not is_nan:
                assert got[byte] == want[code] and np.signbit(got[byte]) == np.signbit(want[code])
                compared += 1
    assert compared == 4 * 254


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token"])
def test_fused_quant_gemv(gemm, scheme):
    rng = np.random.default_rng(30)
    m, n, k = 2, 16, 32
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    x[0, 5] = np.nan  # NaN encodes to 0x7F and stays out of amax
    x[1, 7] = 1e6  # saturates at 448 * scale
    b = random_codes(rng, (n, k))
    sb = np.float32(0.004)
    if scheme == "static":
        q = reference.quantize(x, np.float32(0.05))
        y = backend_fp8_linear(x, b, sb, np.float32(0.05), out_dtype=np.float32)
    elif scheme == "dynamic":
        q = reference.quantize(x)
        y = backend_fp8_linear(x, b, sb, out_dtype=np.float32)
    else:
        q = reference.quantize(x, per_token=True, scale_ub=np.float32(1000.0))
        y = backend_fp8_linear(x, b, sb, per_token=True, scale_ub=np.float32(1000.0), out_dtype=np.float32)
    assert assert_g3(y, q.data, b, q.scale.reshape(-1), sb, None, np.float32) > 0
    assert np.isnan(y[0]).all() and not np.isnan(y[1]).any()


def test_fused_quant_bfloat16_input(gemm):
    rng = np.random.default_rng(31)
    x = rng.standard_normal((1, 32)).astype(BF16)
    b = random_codes(rng, (8, 32))
    q = reference.quantize(x, per_token=True)
    y = backend_fp8_linear(x, b, np.float32(0.01), per_token=True, out_dtype=np.float16)
    assert assert_g3(y, q.data, b, q.scale.reshape(-1), np.float32(0.01), None, np.float16) > 0


def test_f32_epilogue_kernel(gemm):
    from vtnumba.cuda.kernels import epilogue

    rng = np.random.default_rng(40)
    m, n, k = 3, 20, 16
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    acc = (reference.decode(a) @ reference.decode(b).T).astype(np.float32)  # exact in float64, rounded
    sa = rng.uniform(-0.1, 0.1, m).astype(np.float32)
    sb = np.array([0.25], dtype=np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    y = np.full((m, n), 0x7FFF, dtype=np.uint16)  # poison: every element must be written
    epilogue.epilogue_kernel(False)(4, 32, acc, y, sa, 1, sb, 0, bias.view(np.uint16), 1, 2)
    assert assert_g3(y.view(BF16), a, b, sa, sb, bias, BF16) > 0


@pytest.mark.parametrize("out_dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("bias_dtype", [None, np.float32, BF16])
def test_f32_epilogue_eight_wide_equals_element_wise(gemm, out_dtype, bias_dtype):
    """The 8-wide epilogue (N % 8 == 0) writes every element with the element-per-thread kernel's
    bits, per-row and per-channel scales, every bias kind; rows of several groups and a grid that
    strides."""
    from vtnumba.cuda.kernels import epilogue

    rng = np.random.default_rng(41)
    m, n = 5, 24
    acc = (rng.standard_normal((m, n)) * 1e3).astype(np.float32)
    acc[0, :3] = [np.inf, -np.inf, np.nan]
    sa = rng.uniform(-0.1, 0.1, m).astype(np.float32)
    sb = rng.uniform(0.001, 0.1, n).astype(np.float32)
    bias = None if bias_dtype is None else rng.standard_normal(n).astype(bias_dtype)
    bias_bits, bias_kind = (
        (np.zeros(1, np.uint16), 0)
        if bias is None
        else (bias.view(np.uint16), epilogue.BIAS_KIND[np.dtype(bias_dtype)])
    )
    out_kind = epilogue.OUT_KIND[np.dtype(out_dtype)]
    wide = np.dtype(np.float32) if out_dtype == np.float32 else np.dtype(np.uint16)
    poison = 0x7F if wide == np.uint16 else np.nan
    y_wide = np.full((m, n), poison, dtype=wide)
    kernel, grid, block, args = epilogue.epilogue_launch(acc, y_wide, sa, 1, sb, 1, bias_bits, bias_kind, out_kind)
    assert kernel is epilogue.epilogue_vector_kernel(out_dtype == np.float32)
    kernel(2, 4, *args)  # fewer threads than 8-element groups: the grid-stride loop runs
    y_one = np.full((m, n), poison, dtype=wide)
    epilogue.epilogue_kernel(out_dtype == np.float32)(4, 32, acc, y_one, sa, 1, sb, 1, bias_bits, bias_kind, out_kind)
    odd = epilogue.epilogue_launch(
        np.ascontiguousarray(acc[:, : n - 1]),
        np.ascontiguousarray(y_one[:, : n - 1]),
        sa,
        1,
        sb,
        1,
        bias_bits,
        bias_kind,
        out_kind,
    )[0]
    assert odd is epilogue.epilogue_kernel(out_dtype == np.float32)  # N % 8 != 0: element per thread
    ys = [y_wide, y_one]
    np.testing.assert_array_equal(ys[0].view(np.uint8), ys[1].view(np.uint8))
    assert np.count_nonzero(ys[1].view(np.uint8)) > m * n


def test_empty_and_zero_k(gemm):
    rng = np.random.default_rng(60)
    y = gemm.scaled_mm(
        np.zeros((0, 32), np.uint8),
        random_codes(rng, (8, 32)),
        np.float32(1),
        np.float32(1),
        np.dtype(np.float32),
        None,
        None,
    )
    assert y.shape == (0, 8)
    bias = np.linspace(-2, 2, 8).astype(np.float32)
    for m in (1, 9):  # the GEMV and the tiled kernel: an empty sum is 0, so y = bias
        y = gemm.scaled_mm(
            np.zeros((m, 0), np.uint8),
            np.zeros((8, 0), np.uint8),
            np.float32(1),
            np.float32(1),
            np.dtype(np.float32),
            bias,
            None,
        )
        np.testing.assert_array_equal(y, np.broadcast_to(bias, (m, 8)))


def test_selection_reasons_and_forcing(gemm, monkeypatch):
    rng = np.random.default_rng(50)
    a, b = random_codes(rng, (2, 32)), random_codes(rng, (16, 32))
    monkeypatch.setenv("VT_DISABLE_KERNELS", "decode_gemv, tiled")
    with pytest.raises(ValueError) as info:
        gemm.scaled_mm(a, b, np.float32(1), np.float32(1), np.dtype(np.float32), None, None)
    message = str(info.value)
    for name in (k.name for k in gemm.KERNELS):  # one error lists every kernel tried and why it did not run
        assert name in message
    assert "simulator" in message and "disabled by VT_DISABLE_KERNELS" in message
    with pytest.raises(ValueError, match="disabled"):
        gemm.scaled_mm(a, b, np.float32(1), np.float32(1), np.dtype(np.float32), None, "tiled")
    monkeypatch.delenv("VT_DISABLE_KERNELS")
    with pytest.raises(ValueError, match="kernel must be one of"):
        gemm.scaled_mm(a, b, np.float32(1), np.float32(1), np.dtype(np.float32), None, "nope")
    with pytest.raises(ValueError, match="M <= 4"):
        gemm.scaled_mm(
            random_codes(rng, (5, 32)), b, np.float32(1), np.float32(1), np.dtype(np.float32), None, "decode_gemv"
        )
    for m in (1, 4, 4096):  # every kernel in every order (wgmma is chosen by name only), the any-shape kernel last
        order = [k.name for k in gemm.kernel_order(m)]
        by_name = {"wgmma", "wgmma_k32", "dense_gemv_wgmma"}
        assert sorted(order) == sorted(set(gemm.KERNELS_BY_NAME) - by_name) and order[-1] == "tiled"
    # the dense wgmma launch's codes form: first in eager code's decode order (sm_90 only; never here)
    assert [k.name for k in gemm._DECODE_ORDER[:2]] == ["dense_gemv_wgmma", "tensorcore_gemv"]
    assert [k.name for k in gemm.kernel_order(gemm.DECODE_GEMV_PREFERRED_MAX_M + 1)][0] == "cublaslt"
