"""Block-scaled FP8 on the CPU: the per-group quantizer bitwise against the oracle and
against a re-implementation of upstream's torch-native formula; the block-scaled GEMM within the
G3-per-block bound of ``vtnumba.testing.reference.block_scaled_mm`` for every kernel, out dtype, bias,
random block sizes, short last blocks and extreme scale ranges; its reference kernel bitwise equal to a
float32 emulation of upstream's order."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vtnumba as vt
from vtnumba.cpu import block
from vtnumba.testing import reference

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32
OUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BF16)
KERNELS = block.KERNELS + (None,)  # None: the shape picks
INPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BF16)


# -- an independent second formula: upstream's torch-native reference, in numpy ---------------------


def native_per_token_group_quant_fp8(x, group_size, scale_ue8m0=False):
    """vLLM's test reference ``native_per_token_group_quant_fp8`` (tests/kernels/quantization), line by
    line in numpy, plus the CUDA kernel's UE8M0 rounding:

        amax = x_.abs().max(dim=-1, keepdim=True)[0].clamp(min=eps).to(torch.float32)
        x_s = amax / fp8_max
        x_q = (x_ / x_s).clamp(min=fp8_min, max=fp8_max).to(torch.float8_e4m3fn)

    The amax and its clamp run in x's dtype, as torch's do; the cast is ml_dtypes' (RNE). UE8M0 is
    ``exp2(ceil(log2(max(x_s, 1e-10))))`` (``ComputeGroupScale`` in per_token_group_quant.cu), the log
    taken in float64 so that it is exact (see test_ue8m0_rounds_up_even_just_above_a_power_of_two).
    Finite inputs and K % group_size == 0 only, as upstream asserts."""
    x_ = x.reshape(-1, group_size)
    amax = np.abs(x_).max(axis=-1, keepdims=True)
    amax = np.maximum(amax, np.asarray(1e-10, dtype=x.dtype)).astype(F32)  # clamp(min=eps) in x's dtype
    x_s = (amax / F32(448.0)).astype(F32)
    if scale_ue8m0:
        x_s = np.exp2(np.ceil(np.log2(np.maximum(x_s, F32(1e-10)).astype(np.float64)))).astype(F32)
    x_q = np.clip(x_.astype(F32) / x_s, F32(-448.0), F32(448.0)).astype(ml_dtypes.float8_e4m3fn)
    return x_q.view(np.uint8).reshape(x.shape), x_s.reshape(x.shape[:-1] + (x.shape[-1] // group_size,))


# -- group quantization ------------------------------------------------------------------------------


def _nudge(target, guess, s):
    """A float32 x near ``guess`` with float32(x / s) == target exactly, or None."""
    x = F32(guess)
    for _ in range(6):
        for cand in (x, np.nextafter(x, F32(np.inf)), np.nextafter(x, F32(-np.inf))):
            if F32(cand / s) == target:
                return cand
        x = np.nextafter(x, F32(np.inf) if F32(x / s) < target else F32(-np.inf))
    return None


def tie_rows(group_size, rng, amaxes=(448.0, 1.0, 0.0092 * 448, 7.25 * 448, 3.0e-3, 1.0e4)):
    """Rows whose every group has its amax first (so its scale is amax / 448) and then inputs whose
    quotient by that scale lands exactly on an e4m3 tie, a subnormal step or midpoint, +-448 and its
    neighbours, or +-0 (constructed per group through the divide), both signs. Returns float32 [rows, K]
    and how many constructed elements it holds."""
    grid = reference.GRID
    targets = np.concatenate(
        [(grid[:-1] + grid[1:]) / 2.0, np.arange(9) * 2.0**-9, np.arange(8) * 2.0**-9 + 2.0**-10, [448.0, 2.0**-6, 0.0]]
    ).astype(F32)
    targets = np.concatenate([targets, -targets])
    rows, constructed = [], 0
    for amax in amaxes:
        s = F32(F32(amax) / F32(448.0))
        values = [x for x in (_nudge(t, t * s, s) for t in targets) if x is not None and abs(x) <= F32(amax)]
        constructed += len(values)
        values = np.array(values, dtype=F32)
        rng.shuffle(values)
        per_group = group_size - 1
        groups = -(-values.size // per_group)
        row = np.zeros(groups * group_size, dtype=F32)
        for j in range(groups):
            chunk = values[j * per_group : (j + 1) * per_group]
            row[j * group_size] = F32(amax) * (1 if j % 2 else -1)
            row[j * group_size + 1 : j * group_size + 1 + chunk.size] = chunk
        rows.append(row)
    width = max(r.size for r in rows)
    return np.stack([np.pad(r, (0, width - r.size)) for r in rows]), constructed


def assert_same_group_quant(x, group_size, ue8m0=False, column_major=False):
    codes, scales = block.quantize_per_group(x, group_size, ue8m0, column_major)
    want = reference.quantize_per_group(x, group_size, ue8m0)
    assert codes.shape == x.shape and codes.dtype == np.uint8
    assert scales.shape == want.scale.shape and scales.dtype == np.float32
    bad = np.flatnonzero(codes.reshape(-1) != want.data.reshape(-1))
    assert bad.size == 0, (
        f"{bad.size} codes differ, first at {bad[0]}: x={x.reshape(-1)[bad[0]]!r} "
        f"got {codes.reshape(-1)[bad[0]]:#04x} want {want.data.reshape(-1)[bad[0]]:#04x}"
    )
    np.testing.assert_array_equal(scales.view(np.uint32), want.scale.view(np.uint32))
    assert np.count_nonzero(codes & 0x7F) > 0, "every code is +-0: compared nothing"
    return codes, scales


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("group_size", [128, 64, 7])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_group_quant_bitwise_on_constructed_ties(dtype, group_size, ue8m0):
    """G1 for per-group quantization: exact ties of the divide by each group's scale (formed in
    float32 from its amax), the subnormal ladder, +-448 and +-0; f32 inputs, and f16 / bf16 inputs
    (the same values rounded to them, ties no longer exact but every element still compared)."""
    x, constructed = tie_rows(group_size, np.random.default_rng(group_size))
    assert constructed > 500
    x = x.astype(dtype)
    assert_same_group_quant(x, group_size, ue8m0)
    assert_same_group_quant(x, group_size, ue8m0, column_major=True)


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_group_quant_matches_upstream_native_formula(dtype, ue8m0):
    """Bitwise against the numpy re-implementation of upstream's torch-native reference, on finite
    values across many magnitudes (a group's amax from 1e-6 to 1e6; 1e-3 to 1e3 in float16) and on
    the constructed ties."""
    rng = np.random.default_rng(7)
    m, k, g = 37, 512, 128
    decades = 3 if dtype == np.float16 else 6  # float16 tops out at 65504
    x = rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-decades, decades, size=(m, k // g)).repeat(g, axis=1)
    x = x.astype(F32).astype(dtype)
    ties, _ = tie_rows(g, rng)
    ties = ties[:, : ties.shape[1] // g * g].astype(dtype)
    compared = 0
    for xs in (x, ties):
        codes, scales = block.quantize_per_group(xs, g, ue8m0)
        with np.errstate(invalid="ignore"):
            want_codes, want_scales = native_per_token_group_quant_fp8(xs, g, ue8m0)
        # torch's reference clamps amax with eps in x's dtype: float16(1e-10) is 0 (an all-zero group
        # gets scale 0 and NaN codes there), bfloat16(1e-10) is not float32(1e-10). We clamp a
        # float32, as upstream's CUDA and Triton kernels do; the two agree wherever amax >= 1e-10.
        tiny = np.abs(xs.astype(F32)).reshape(xs.shape[0], -1, g).max(axis=-1) < 1e-10
        if dtype == np.float32:
            tiny[:] = False  # float32's eps is the same on both sides
        else:
            assert tiny.any() == (xs is ties), "the eps case must appear in the ties rows (their zero padding)"
            np.testing.assert_array_equal(scales[tiny], F32(2.0**-33) if ue8m0 else F32(F32(1e-10) / F32(448.0)))
        keep = ~np.repeat(tiny, g, axis=-1)
        np.testing.assert_array_equal(scales[~tiny], want_scales[~tiny])
        np.testing.assert_array_equal(codes[keep], want_codes[keep])
        compared += int(keep.sum())
    assert compared > m * k


def test_group_quant_nan_inf_zero_groups():
    """NaN encodes to 0x7F and +-inf saturates (0x7E / 0xFE) whatever the scale; neither enters amax
    (vtnumba's finite-amax rule, DESIGN.md); an all-zero or all-non-finite group gets the eps scale
    float32(1e-10) / 448, and -0.0 encodes to 0x80."""
    g = 8
    x = np.array(
        [
            [
                np.nan,
                1.0,
                -2.0,
                np.inf,
                0.5,
                -np.inf,
                0.0,
                -0.0,  # group 0: amax 2
                0.0,
                -0.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,  # group 1: all zero
                np.nan,
                np.inf,
                -np.inf,
                np.nan,
                0.0,
                -0.0,
                0.0,
                0.0,  # group 2: nothing finite but 0
                448.0,
                1e30,
                -3.4e38,
                1.0,
                2.0,
                3.0,
                4.0,
                5.0,
            ]
        ],  # group 3: amax 3.4e38
        dtype=F32,
    )
    codes, scales = assert_same_group_quant(x, g)
    eps_scale = F32(F32(1e-10) / F32(448.0))
    assert scales[0, 0] == F32(2.0) / F32(448.0) and scales[0, 1] == eps_scale and scales[0, 2] == eps_scale
    assert scales[0, 3] == F32(F32(3.4e38) / F32(448.0))
    assert codes[0, 0] == 0x7F and codes[0, 16] == 0x7F and codes[0, 19] == 0x7F
    assert codes[0, 3] == 0x7E and codes[0, 5] == 0xFE and codes[0, 17] == 0x7E and codes[0, 18] == 0xFE
    assert codes[0, 2] == 0xFE  # -2.0 is the group's amax: -448
    assert codes[0, 7] == 0x80 and codes[0, 9] == 0x80 and codes[0, 8] == 0x00
    assert codes[0, 26] == 0xFE  # -3.4e38 / (3.4e38 / 448) = -448


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("k, g", [(300, 128), (129, 128), (5, 128), (1, 1), (100, 3), (4096, 128)])
def test_group_quant_short_last_group_and_shapes(dtype, k, g):
    """K not a multiple of g: the last group is shorter and takes its own amax (scales [M, ceil(K/g)]);
    also g = 1, K < g, and 3-D inputs (leading axes flattened)."""
    rng = np.random.default_rng(k * 31 + g)
    x = (rng.standard_normal((3, 5, k)) * rng.choice([1e-3, 1.0, 300.0], size=(3, 5, 1))).astype(F32)
    x[..., -1] = 1e4  # the last group's amax stands out: a shared amax would be caught
    x = x.astype(dtype)
    codes, scales = assert_same_group_quant(x, g)
    assert scales.shape == (3, 5, -(-k // g))
    last = x[..., (k - 1) // g * g :].astype(F32)
    np.testing.assert_array_equal(scales[..., -1], (np.abs(last).max(axis=-1) / F32(448.0)).astype(F32))


def test_group_quant_strided_input_gives_the_bytes_of_its_copy():
    rng = np.random.default_rng(5)
    base = rng.standard_normal((8, 600)).astype(F32)
    view = base[::2, 3:520]
    assert not view.flags.c_contiguous
    codes, scales = block.quantize_per_group(view, 128)
    c2, s2 = block.quantize_per_group(np.ascontiguousarray(view), 128)
    np.testing.assert_array_equal(codes, c2)
    np.testing.assert_array_equal(scales, s2)
    assert_same_group_quant(view, 128)


def test_column_major_scales_have_the_row_major_values_and_m_contiguous_memory():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((33, 1000)).astype(F32)
    c_row, s_row = block.quantize_per_group(x, 128)
    c_col, s_col = block.quantize_per_group(x, 128, column_major_scales=True)
    np.testing.assert_array_equal(c_row, c_col)
    np.testing.assert_array_equal(s_row, s_col)
    assert s_row.flags.c_contiguous and s_col.flags.f_contiguous and s_col.strides == (4, 4 * 33)
    assert s_col.shape == (33, 8)


def test_ue8m0_scales_are_the_smallest_power_of_two_at_or_above():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 1024)) * 10.0 ** rng.uniform(-12, 12, size=(64, 1))).astype(F32)
    _, plain = block.quantize_per_group(x, 128)
    codes, pow2 = assert_same_group_quant(x, 128, ue8m0=True)
    mantissa, _ = np.frexp(pow2.astype(np.float64))
    assert np.all(mantissa == 0.5), "a UE8M0 scale is not a power of two"
    floor = np.maximum(plain, F32(1e-10)).astype(np.float64)
    assert np.all(pow2 >= floor) and np.all(pow2 / 2 < floor)
    assert np.any(pow2 != plain)


def test_ue8m0_rounds_up_even_just_above_a_power_of_two():
    """amax = 448 * 2^-10 * (1 + 2^-23) gives the scale 2^-10 * (1 + 2^-23): rounded up it is 2^-9.
    (A float32 log2 returns exactly -10 for it, so ``exp2(ceil(log2f(s)))`` keeps 2^-10 there; upstream's
    register kernel and DeepGEMM's ceil_to_ue8m0 bump the exponent, as we do.)"""
    s = F32(2.0**-10) * (F32(1) + F32(2.0**-23))
    assert np.log2(s) == F32(-10.0)  # the float32 log rounds the excess away
    amax = F32(s * F32(448.0))
    assert F32(amax / F32(448.0)) == s
    x = np.zeros((1, 128), dtype=F32)
    x[0, 0] = amax
    _, scales = assert_same_group_quant(x, 128, ue8m0=True)
    assert scales[0, 0] == F32(2.0**-9)
    # and at 1e-10 / 448 (an all-zero group) the UE8M0 scale is the one above 1e-10: 2^-33
    _, zero_scale = block.quantize_per_group(np.zeros((1, 128), F32), 128, scale_ue8m0=True)
    assert zero_scale[0, 0] == F32(2.0**-33)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 70),
    st.integers(1, 40),
    st.booleans(),
    st.sampled_from(INPUT_DTYPES),
    st.integers(0, 2**32 - 1),
)
def test_group_quant_property(m, k, g, ue8m0, dtype, seed):
    """Random shapes and group sizes; values spread over 40 decades, with NaN, inf and zeros."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-20, 20, size=(m, k))).astype(F32)
    special = rng.random((m, k))
    x[special < 0.05] = np.nan
    x[(special >= 0.05) & (special < 0.08)] = np.inf
    x[(special >= 0.08) & (special < 0.12)] = 0.0
    x = x.astype(dtype)
    codes, scales = block.quantize_per_group(x, g, ue8m0)
    want = reference.quantize_per_group(x, g, ue8m0)
    np.testing.assert_array_equal(codes, want.data)
    np.testing.assert_array_equal(scales, want.scale)


# -- the block-scaled GEMM ---------------------------------------------------------------------------


def random_codes(rng, shape, nan=False):
    """e4m3 codes over the whole grid (subnormals and +-448 included); NaN codes only if asked."""
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    if not nan:
        codes[(codes & 0x7F) == 0x7F] ^= 0x01
    return codes


def block_scales(rng, m, n, k, bn, bk, decades=(-1.0, 1.0), signed=True):
    """scale_a [M, ceil(K/bk)] and scale_b [ceil(N/bn), ceil(K/bk)], log-uniform over ``decades``."""
    nkb = -(-k // bk)
    sa = 10.0 ** rng.uniform(*decades, size=(m, nkb))
    sb = 10.0 ** rng.uniform(*decades, size=(-(-n // bn), nkb))
    if signed:
        sa *= rng.choice([-1.0, 1.0], size=sa.shape)
        sb *= rng.choice([-1.0, 1.0], size=sb.shape)
    return sa.astype(F32), sb.astype(F32)


def assert_block_g3(y, a, b, sa, sb, block_size, bias=None, out_dtype=np.float32):
    """|y - ref| <= the G3-per-block bound + the out dtype's rounding, elementwise; NaN exactly where
    the reference is NaN; an overflow to inf by the final rounding counts as correct (RNE past the out
    dtype's largest value gives inf). Returns how many finite elements were compared."""
    ref, bound = reference.block_scaled_mm(a, b, sa, sb, block_size, bias)
    assert y.shape == ref.shape and y.dtype == np.dtype(out_dtype)
    yf = np.asarray(y).astype(np.float64)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(yf), nan, err_msg="NaN where the reference has none, or the reverse")
    allowed = bound + reference.out_rounding(ref, out_dtype)
    err = np.abs(yf - ref)
    top = (
        float(np.finfo(np.float16).max) if np.dtype(out_dtype) == np.float16 else float(ml_dtypes.finfo(out_dtype).max)
    )
    overflow = np.isinf(yf) & (np.sign(yf) == np.sign(ref)) & (np.abs(ref) + allowed >= top)
    bad = ~nan & ~((err <= allowed) | overflow)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"G3 per block violated at {i}: y={y[i]!r} ref={ref[i]!r} err={err[i]:.3g} "
            f"allowed={allowed[i]:.3g} ({int(bad.sum())} of {bad.size} elements)"
        )
    compared = int((~nan).sum())
    assert compared > 0 and np.count_nonzero(ref[~nan]) > 0, "compared nothing non-zero"
    return compared


SHAPES = [
    (1, 256, 256, (128, 128)),
    (1, 37, 300, (16, 128)),
    (3, 130, 129, (128, 128)),
    (5, 17, 77, (4, 16)),
    (17, 45, 260, (32, 64)),
    (70, 33, 129, (128, 128)),
    (64, 130, 300, (64, 128)),
    (2, 5, 1, (3, 1)),
    (9, 10, 50, (3, 7)),
    (6, 9, 2000, (5, 1500)),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}-{s[3][0]}x{s[3][1]}")
def test_block_gemm_g3_shapes(kernel, shape):
    """N and K not multiples of the block (short last blocks), M = 1 and above the small_m crossover,
    blocks of one row or column, a block wider than the _K_CHUNK pass."""
    m, n, k, blk = shape
    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    sa, sb = block_scales(rng, m, n, k, *blk)
    y = block.block_scaled_mm(a, b, sa, sb, blk, np.dtype(np.float32), None, kernel)
    assert_block_g3(y, a, b, sa, sb, blk)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("bias_dtype", [None, np.dtype(np.float32), np.dtype(np.float16), BF16], ids=str)
def test_block_gemm_out_dtypes_and_bias(kernel, out_dtype, bias_dtype):
    rng = np.random.default_rng(11)
    m, n, k, blk = 9, 70, 300, (32, 128)
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    sa, sb = block_scales(rng, m, n, k, *blk, decades=(-3, -1))
    bias = None if bias_dtype is None else (rng.standard_normal(n) * 50).astype(bias_dtype)
    y = block.block_scaled_mm(a, b, sa, sb, blk, out_dtype, bias, kernel)
    assert_block_g3(y, a, b, sa, sb, blk, None if bias is None else bias.astype(F32), out_dtype)


@pytest.mark.parametrize("kernel", KERNELS)
def test_block_gemm_extreme_scale_ranges(kernel):
    """Scale products from 1e-30 to 1e30 mixed in one sum (blocks differing by 60 decades), and
    scales of 1e+-30 on their own whose products stay moderate; results down in float32's subnormals
    included (the bound's absolute term)."""
    rng = np.random.default_rng(13)
    m, n, k, blk = 6, 40, 640, (8, 64)
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    sa, sb = block_scales(rng, m, n, k, *blk, decades=(-15, 15))
    compared = assert_block_g3(
        block.block_scaled_mm(a, b, sa, sb, blk, np.dtype(np.float32), None, kernel), a, b, sa, sb, blk
    )
    nkb = k // blk[1]
    e = rng.uniform(-30, 30, size=nkb)  # per K-block: sa ~ 10^e, sb ~ 10^-e
    sa = (10.0 ** (e[None, :] + rng.uniform(-3, 3, size=(m, nkb)))).astype(F32)
    sb = (10.0 ** (-e[None, :] + rng.uniform(-3, 3, size=(n // blk[0], nkb)))).astype(F32)
    compared += assert_block_g3(
        block.block_scaled_mm(a, b, sa, sb, blk, np.dtype(np.float32), None, kernel), a, b, sa, sb, blk
    )
    tiny_sa, tiny_sb = (sa * F32(1e-20)).astype(F32), (sb * F32(1e-22)).astype(F32)
    y = block.block_scaled_mm(a, b, tiny_sa, tiny_sb, blk, np.dtype(np.float32), None, kernel)
    assert np.any((y != 0) & (np.abs(y) < np.finfo(F32).tiny)), "no subnormal result: the tiny case is vacuous"
    compared += assert_block_g3(y, a, b, tiny_sa, tiny_sb, blk)
    assert compared == 3 * m * n


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 20),
    st.integers(1, 40),
    st.integers(1, 90),
    st.integers(1, 40),
    st.integers(1, 40),
    st.sampled_from(KERNELS),
    st.sampled_from(OUT_DTYPES),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_block_gemm_property(m, n, k, bn, bk, kernel, out_dtype, with_bias, seed):
    """Random block sizes (N and K rarely multiples of them), shapes, kernels, out dtypes, bias, and
    scales over 20 decades."""
    rng = np.random.default_rng(seed)
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    sa, sb = block_scales(rng, m, n, k, bn, bk, decades=(-12, 8) if out_dtype == np.float32 else (-6, 0))
    bias = (rng.standard_normal(n) * 3).astype(F32) if with_bias else None
    if not (np.any(a & 0x7F) and np.any(b & 0x7F)):
        a[0, 0], b[0, 0] = 0x38, 0x38  # 1.0: keep something non-zero to compare
    y = block.block_scaled_mm(a, b, sa, sb, (bn, bk), out_dtype, bias, kernel)
    assert_block_g3(y, a, b, sa, sb, (bn, bk), bias, out_dtype)


@pytest.mark.parametrize("kernel", KERNELS)
def test_block_gemm_nan_codes_propagate(kernel):
    rng = np.random.default_rng(17)
    m, n, k, blk = 5, 21, 200, (8, 64)
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    a[1, 150] = 0x7F
    b[6, 3] = 0xFF
    sa, sb = block_scales(rng, m, n, k, *blk)
    y = block.block_scaled_mm(a, b, sa, sb, blk, np.dtype(np.float32), None, kernel)
    assert np.isnan(y[1]).all() and np.isnan(y[:, 6]).all()
    assert np.isnan(y).sum() == n + m - 1
    assert_block_g3(y, a, b, sa, sb, blk)


@pytest.mark.parametrize("kernel", block.KERNELS)
@pytest.mark.parametrize("m", [1, 7])
def test_one_block_agrees_with_the_per_tensor_gemm(kernel, m):
    """bn = N and bk = K make one block: y = (P * sa[m]) * sb, the per-row x per-tensor scaled_mm
    (which folds sa * sb into one alpha), within G3 of each other."""
    rng = np.random.default_rng(19 + m)
    n, k = 48, 333
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    sa = rng.uniform(0.01, 2.0, size=(m, 1)).astype(F32)
    sb = np.array([[0.037]], dtype=F32)
    y_block = block.block_scaled_mm(a, b, sa, sb, (n, k), np.dtype(np.float32), None, kernel)
    y_tensor = vt.scaled_mm(a, b, sa, sb[0, 0], kernel=kernel)
    ref, bound = reference.scaled_mm(a, b, sa, sb[0, 0])
    allowed = 2 * (bound + reference.out_rounding(ref, np.float32))
    assert np.all(np.abs(y_block.astype(np.float64) - y_tensor) <= allowed)
    assert np.count_nonzero(ref) > 0


def _emulate_upstream_order(a, b, sa, sb, block_size, bias, fold=False):
    """float32, scalar by scalar: P summed in k order inside each block, then total + (P * sa) * sb in
    kb order (``fold``: total + P * (sa * sb) instead, the mutation the test must tell apart), then
    the bias."""
    bn, bk = block_size
    da, db = vt.decode_e4m3(a), vt.decode_e4m3(b)
    m, k = a.shape
    out = np.empty((m, b.shape[0]), dtype=F32)
    for i in range(m):
        for j in range(b.shape[0]):
            total = F32(0)
            for kb in range(-(-k // bk)):
                p = F32(0)
                for kk in range(kb * bk, min(k, (kb + 1) * bk)):
                    p = F32(p + F32(da[i, kk] * db[j, kk]))
                s_a, s_b = sa[i, kb], sb[j // bn, kb]
                total = F32(total + (F32(p * F32(s_a * s_b)) if fold else F32(F32(p * s_a) * s_b)))
            out[i, j] = total if bias is None else F32(total + bias[j])
    return out


def test_reference_kernel_is_upstreams_order_bitwise():
    rng = np.random.default_rng(23)
    m, n, k, blk = 4, 11, 70, (3, 16)
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    sa, sb = block_scales(rng, m, n, k, *blk)
    bias = rng.standard_normal(n).astype(F32)
    want = _emulate_upstream_order(a, b, sa, sb, blk, bias)
    folded = _emulate_upstream_order(a, b, sa, sb, blk, bias, fold=True)
    assert np.any(want != folded), "the data cannot tell the order apart: the test would be vacuous"
    got = block.block_scaled_mm(a, b, sa, sb, blk, np.dtype(np.float32), bias, "reference")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_bound_catches_a_kernel_that_ignores_the_weight_blocks():
    """Vacuity guard for the G3-per-block gate: the reference kernel fed every row's scales from the
    first row-block (a kernel reading sb[0, kb] for all n) is outside the bound."""
    rng = np.random.default_rng(29)
    m, n, k, blk = 3, 64, 256, (16, 128)
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    sa, sb = block_scales(rng, m, n, k, *blk, signed=False)
    wrong = np.repeat(sb[:1], sb.shape[0], axis=0)
    y = block.block_scaled_mm(a, b, sa, wrong, blk, np.dtype(np.float32), None, "reference")
    with pytest.raises(AssertionError, match="G3 per block violated"):
        assert_block_g3(y, a, b, sa, sb, blk)


def test_group_quant_feeds_the_block_gemm():
    """End to end: quantize x per group of bk, GEMM with a block-scaled weight; close to the float
    product (the usual FP8 error), and within G3 per block of the oracle."""
    rng = np.random.default_rng(31)
    m, n, k, blk = 8, 256, 512, (128, 128)
    x = rng.standard_normal((m, k)).astype(F32)
    w = rng.standard_normal((n, k)).astype(F32)
    codes, sx = block.quantize_per_group(x, blk[1])
    wq = w.reshape(n // 128, 128, k // 128, 128)
    sw = (np.abs(wq).max(axis=(1, 3)) / F32(448.0)).astype(F32)
    w_codes = reference.encode((wq / sw[:, None, :, None]).astype(F32).reshape(n, k))
    for kernel in KERNELS:
        y = block.block_scaled_mm(codes, w_codes, sx, sw, blk, np.dtype(np.float32), None, kernel)
        assert_block_g3(y, codes, w_codes, sx, sw, blk)
        rel = np.linalg.norm(y - x @ w.T) / np.linalg.norm(x @ w.T)
        assert rel < 0.06, rel


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m", [1, 6, 70])
@pytest.mark.parametrize("blk", [(5, 32), (4, 64)])
def test_every_kernel_applies_the_block_step_in_upstreams_order(kernel, m, blk):
    """With codes whose products sum exactly in float32 in any order (values k / 8 for small k), every
    P is exact whatever a kernel's summation order, so each kernel must give the bits of
    ``total + (P * sa) * sb`` summed in kb order, then the bias: this pins the block step the G3 bound
    alone would let drift (folding sa * sb into one factor, or fusing the step's multiply and add
    into an FMA, stays inside the bound). 64-code K-blocks (three whole ones and a short one at K =
    200) run the byte-lookup paths' M = 1 loop, which applies the steps itself, and then the
    kernel's own loop for the last block."""
    rng = np.random.default_rng(37 + m + blk[1])
    n, k = 23, 200
    small = reference.encode(np.arange(-16, 17, dtype=F32) / F32(8))  # exact e4m3 values j / 8
    a, b = rng.choice(small, size=(m, k)), rng.choice(small, size=(n, k))
    sa, sb = block_scales(rng, m, n, k, *blk)
    bias = rng.standard_normal(n).astype(F32)
    da, db = reference.decode(a), reference.decode(b)
    want = np.zeros((m, n), dtype=F32)
    folded = np.zeros((m, n), dtype=F32)
    fused = np.zeros((m, n), dtype=F32)
    sb_rows = np.repeat(sb, blk[0], axis=0)[:n]
    for kb in range(-(-k // blk[1])):
        lo, hi = kb * blk[1], min(k, (kb + 1) * blk[1])
        p = (da[:, lo:hi] @ db[:, lo:hi].T).astype(F32)  # exact: multiples of 1/64 below 2^14
        want = want + (p * sa[:, kb : kb + 1]) * sb_rows[None, :, kb]
        folded = folded + p * (sa[:, kb : kb + 1] * sb_rows[None, :, kb])
        # an FMA: the last multiply and the add rounded once (float64 holds the product exactly)
        fused = (fused + (p * sa[:, kb : kb + 1]).astype(np.float64) * sb_rows[None, :, kb]).astype(F32)
    want, folded, fused = want + bias, folded + bias, fused + bias
    assert np.any(want != folded), "the data cannot tell the order apart: the test would be vacuous"
    assert np.any(want != fused), "the data cannot tell a fused step apart: the test would be vacuous"
    got = block.block_scaled_mm(a, b, sa, sb, blk, np.dtype(np.float32), bias, kernel)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m, n, k", [(0, 5, 10), (3, 0, 10), (3, 5, 0), (1, 5, 0)])
def test_empty_shapes(kernel, m, n, k):
    """No rows, no outputs, or K = 0 (no blocks: y = 0 + bias); and group quantization of empty x."""
    a, b = np.zeros((m, k), np.uint8), np.zeros((n, k), np.uint8)
    sa, sb = np.ones((m, -(-k // 4)), F32), np.ones((-(-n // 2), -(-k // 4)), F32)
    bias = np.full(n, 2.5, F32)
    y = block.block_scaled_mm(a, b, sa, sb, (2, 4), np.dtype(np.float32), bias, kernel)
    assert y.shape == (m, n) and np.all(y == 2.5)
    codes, scales = block.quantize_per_group(np.zeros((m, k), F32), 4)
    assert codes.shape == (m, k) and scales.shape == (m, -(-k // 4))
