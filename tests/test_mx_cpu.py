"""MXFP8 on the CPU (DESIGN.md "MXFP8"): the E8M0 scale rules against the independent oracle
and against their definitions, the MX quantizer bitwise (constructed ties under power-of-two scales,
NaN / inf / zero groups, short last groups, every input dtype, both rules), the MX GEMM's kernels
within the G3-per-block bound on every runnable CPU path (the exact shortcut and its fallback, NaN
scale bytes and NaN codes), and hypothesis properties over the shipped strategies."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

import vtnumba as vt
from vtnumba import _format
from vtnumba.cpu import block, mx, paths
from vtnumba.testing import reference
from vtnumba.testing import strategies as fst
from vtnumba.testing.gates import assert_block_g3
from vtnumba.testing.properties import assert_mx_within_g3

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)
OUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BF16)
RULES = ("rceil", "floor")


# -- the scale rules ---------------------------------------------------------------------------------


def _amax_population():
    """Finite non-negative float32 amax over the whole range, and every float32 within 3 ulps of
    448 * 2^k and of 1.75 * 2^k (where the two rules and rceil's rounding part), and subnormals."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 0x7F800000, size=200_000, dtype=np.int64).astype(np.uint32)
    edges = np.concatenate([np.ldexp(448.0, np.arange(-140, 120)), np.ldexp(1.75, np.arange(-130, 127))]).astype(F32)
    near = (edges.view(np.int32)[:, None] + np.arange(-3, 4, dtype=np.int32)[None, :]).reshape(-1).view(F32)
    sub = np.arange(0, 1 << 23, 4099, dtype=np.uint32)
    pop = np.concatenate([bits.view(F32), near, sub.view(F32), F32([0.0, np.finfo(F32).max])])
    return pop[np.isfinite(pop) & (pop >= 0)]


@pytest.mark.parametrize("rule", RULES)
def test_e8m0_rule_matches_the_oracle(rule):
    amax = _amax_population()
    rceil = rule == "rceil"
    got = np.array([_format.e8m0_scale_byte(a, rceil) for a in amax], np.uint8)
    want = reference.e8m0_bytes(amax, rule)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ, first amax {amax[bad[0]]!r}: {got[bad[0]]} vs {want[bad[0]]}"
    assert got.max() <= 247 and (got == 0).any() and len(np.unique(got)) > 200


def test_rceil_never_saturates_and_floor_does_above_significand_1_75():
    """rceil: amax / 2^E <= 448 for every amax whose quotient is a normal float32 (a subnormal
    quotient may stop 2^-150 over, which RNE rounds to 448 anyway); floor: amax / 2^E in [256, 512),
    above 448 exactly when amax's significand exceeds 1.75 (those saturate)."""
    amax = _amax_population()
    amax = amax[amax > 0]
    for rule in RULES:
        e = reference.decode_e8m0(reference.e8m0_bytes(amax, rule))
        q = amax.astype(np.float64) / e
        if rule == "rceil":
            normal = amax >= 448 * 2.0**-126
            assert (q[normal] <= 448).all() and (q[normal] > 224).all()
        else:
            big = amax >= 2.0**-119  # floor's exponent not clamped at 2^-127
            assert ((q[big] >= 256) & (q[big] < 512)).all()
            sig = np.frexp(amax[big].astype(np.float64))[0] * 2
            np.testing.assert_array_equal(q[big] > 448, sig > 1.75)


def test_decode_e8m0_every_byte():
    b = np.arange(256, dtype=np.uint8)
    got = vt.decode_e8m0(b)
    assert got.dtype == np.float32
    want = reference.decode_e8m0(b)
    np.testing.assert_array_equal(got[:255], want[:255].astype(F32))
    assert np.isnan(got[255]) and got[0] == F32(2.0**-127) and got[127] == 1 and got[254] == F32(2.0**127)
    np.testing.assert_array_equal(vt.decode_e8m0(b.view(ml_dtypes.float8_e8m0fnu)), got)  # the ml_dtypes view
    np.testing.assert_array_equal(mx.decode_e8m0_array(b).view(np.uint32), got.view(np.uint32))


# -- quantization --------------------------------------------------------------------------------------


def _assert_same_mx(x, g, rule, column_major=False):
    q = vt.quantize_fp8(x, group_size=g, scale_format="e8m0", scale_rounding=rule, column_major_scales=column_major)
    want = reference.quantize_mx(x, g, rule)
    assert q.scale.dtype == np.uint8 and q.scale_format == "e8m0" and q.group_size == g
    bad = np.flatnonzero(q.data.reshape(-1) != want.data.reshape(-1))
    assert bad.size == 0, (
        f"{bad.size} codes differ, first at {bad[0]}: x={np.asarray(x).reshape(-1)[bad[0]]!r} "
        f"got {q.data.reshape(-1)[bad[0]]:#04x} want {want.data.reshape(-1)[bad[0]]:#04x}"
    )
    np.testing.assert_array_equal(q.scale, want.scale)
    assert np.count_nonzero(q.data & 0x7F) > 0
    return q


def _tie_rows(g, rule, rng):
    """Rows whose groups each hold an amax first, then values whose quotient by the group's
    power-of-two scale is exactly an e4m3 tie, a subnormal step or midpoint, +-448 or +-0."""
    grid = reference.GRID
    targets = np.concatenate(
        [(grid[:-1] + grid[1:]) / 2.0, np.arange(9) * 2.0**-9, np.arange(8) * 2.0**-9 + 2.0**-10, [448.0, 2.0**-6, 0.0]]
    )
    targets = np.concatenate([targets, -targets])
    rows = []
    for amax in (448.0, 1.0, 3.3, 1.9 * 2.0**20, 1.8e-5, 7.0e3):
        s = reference.decode_e8m0(reference.e8m0_bytes(F32(amax), rule))
        vals = (targets * s).astype(F32)  # exact: a power-of-two scale
        vals = vals[np.abs(vals) <= F32(amax)]
        rng.shuffle(vals)
        per = g - 1
        groups = -(-vals.size // per)
        row = np.zeros(groups * g, F32)
        for j in range(groups):
            chunk = vals[j * per : (j + 1) * per]
            row[j * g] = F32(amax)
            row[j * g + 1 : j * g + 1 + chunk.size] = chunk
        rows.append(row)
    width = max(r.size for r in rows)
    return np.stack([np.pad(r, (0, width - r.size)) for r in rows])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=str)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("g", [32, 16, 7])
def test_mx_quant_bitwise_on_constructed_ties(dtype, rule, g):
    x = _tie_rows(g, rule, np.random.default_rng(g)).astype(dtype)
    assert np.count_nonzero(x.astype(F32)) > 1000  # the ties constructed, not padding
    _assert_same_mx(x, g, rule)
    _assert_same_mx(x, g, rule, column_major=True)


def test_mx_quant_nan_inf_zero_and_the_rules_part():
    """NaN -> 0x7F and +-inf -> +-448 without entering amax (so no scale byte is 0xFF); an all-zero or
    nothing-finite group gets byte 0; a group whose amax significand is 1.9 saturates its top under
    floor (code 0x7E at 1.9 * 2^8 > 448) and not under rceil (1.9 * 2^7 = 243.2 -> 240, code 0x77)."""
    x = np.zeros((1, 128), F32)
    x[0, :4] = [np.nan, 1.0, np.inf, -np.inf]
    x[0, 64:66] = [np.nan, np.inf]
    x[0, 96] = 1.9
    for rule in RULES:
        q = _assert_same_mx(x, 32, rule)
        assert q.data[0, 0] == 0x7F and q.data[0, 2] == 0x7E and q.data[0, 3] == 0xFE
        assert q.scale[0, 1] == 0 and q.scale[0, 2] == 0 and (q.scale != 0xFF).all()
    floor = vt.quantize_fp8(x, group_size=32, scale_format="e8m0", scale_rounding="floor")
    rceil = vt.quantize_fp8(x, group_size=32, scale_format="e8m0")  # rceil by default
    assert floor.scale[0, 3] == 127 - 8 and floor.data[0, 96] == 0x7E
    assert rceil.scale[0, 3] == 127 - 7 and rceil.data[0, 96] == 0x77


@pytest.mark.parametrize("k", [1, 31, 33, 100, 4096 + 16])
def test_mx_quant_short_last_group_shapes_and_strides(k):
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((3, 5, k)) * 10.0 ** rng.uniform(-3, 3, size=(3, 5, 1))).astype(F32)
    x[..., -1] = 3e4
    codes, scales = mx.quantize_mx(x, 32, "rceil")
    want = reference.quantize_mx(x, 32, "rceil")
    np.testing.assert_array_equal(codes, want.data)
    np.testing.assert_array_equal(scales, want.scale)
    assert scales.shape == (3, 5, -(-k // 32))
    view = x.reshape(15, k)[::2]
    _assert_same_mx(view, 32, "floor")


@settings(max_examples=60, deadline=None)
@given(fst.mx_quant_cases())
def test_mx_quant_property(case):
    x, kwargs = case
    q = vt.quantize_fp8(x, **kwargs)
    want = reference.quantize_mx(x, kwargs["group_size"], kwargs["scale_rounding"])
    np.testing.assert_array_equal(q.data, want.data)
    np.testing.assert_array_equal(q.scale, want.scale)


def test_mx_dequantize_applies_each_groups_power_of_two():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 70)) * 10.0 ** rng.uniform(-4, 4, size=(4, 70))).astype(F32)
    q = vt.quantize_fp8(x, group_size=32, scale_format="e8m0")
    want = reference.decode(q.data) * np.repeat(reference.decode_e8m0(q.scale), 32, axis=1)[:, :70]
    np.testing.assert_array_equal(q.dequantize(), want.astype(F32))
    assert np.abs(q.dequantize() - x).max() <= np.abs(x).max() * 2.0**-3


# -- the GEMM ------------------------------------------------------------------------------------------


def _operands(rng, m, n, k, lo=110, hi=140, bn=1):
    a = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
    b = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    a[(a & 0x7F) == 0x7F] = 0x44
    b[(b & 0x7F) == 0x7F] = 0x44
    nkb = -(-k // 32)
    return (
        a,
        b,
        rng.integers(lo, hi, size=(m, nkb), dtype=np.uint8),
        rng.integers(lo, hi, size=(-(-n // bn), nkb), dtype=np.uint8),
    )


KERNELS = mx.KERNELS + (None,)


@pytest.mark.parametrize("path", paths.runnable(), ids=lambda p: p.name)
@pytest.mark.parametrize(
    "m,n,k", [(1, 70, 256), (1, 9, 200), (1, 8, 64 + 32), (5, 33, 64), (16, 40, 300), (70, 24, 96), (3, 5, 17)]
)
@pytest.mark.parametrize("kernel", KERNELS)
def test_mx_gemm_meets_block_g3_on_every_path(path, m, n, k, kernel):
    rng = np.random.default_rng(m * 1000 + n + k)
    a, b, sa, sb = _operands(rng, m, n, k)
    bias = rng.standard_normal(n).astype(F32)
    with paths.use(path.name):
        for out_dtype in OUT_DTYPES:
            y = vt.scaled_mm(a, b, sa, sb, block_size=(1, 32), out_dtype=out_dtype, bias=bias, kernel=kernel)
            assert assert_block_g3(y, a, b, sa, sb, (1, 32), bias, out_dtype) > m * n // 2


def test_mx_gemm_m1_lookup_kernel_runs_where_the_path_has_it():
    """The byte-lookup M = 1 kernel (vbmi.dot4_e4m3_mx) is the one that runs on avx512_vbmi: its result
    differs from the small_m kernel's in the summation order only (both within the bound)."""
    if "avx512_vbmi" not in [p.name for p in paths.runnable()]:
        pytest.skip("this CPU has no avx512_vbmi path (the byte-lookup MX kernel needs VBMI)")
    rng = np.random.default_rng(11)
    a, b, sa, sb = _operands(rng, 1, 64, 1024 + 96)
    with paths.use("avx512_vbmi"):
        assert mx._lookup_path()
        y = mx.mx_scaled_mm(a, b, sa, sb, (1, 32), np.dtype(F32), None)
    with paths.use("avx512"):
        assert not mx._lookup_path()
        z = mx.mx_scaled_mm(a, b, sa, sb, (1, 32), np.dtype(F32), None)
    assert assert_block_g3(y, a, b, sa, sb, (1, 32)) == 64 and assert_block_g3(z, a, b, sa, sb, (1, 32)) == 64
    assert (y != z).any()  # two different summation orders ran


@pytest.mark.parametrize("kernel", ("small_m", "blas"))
@pytest.mark.parametrize("lo,hi", [(1, 30), (230, 254), (0, 3)])
def test_mx_gemm_outside_the_exact_window_runs_the_contract_kernels(kernel, lo, hi):
    """Scales whose products would leave float32's exact range (tiny or huge exponents, byte 0) take
    the block-scaled kernels on decoded scales: bitwise their result (which for huge scales overflows
    partway, as the contract's order does)."""
    rng = np.random.default_rng(lo)
    a, b, sa, sb = _operands(rng, 5, 12, 96, lo, hi)
    assert mx._window(sa) is None or (sb < mx._window(sa)[0]).any() or (sb > mx._window(sa)[1]).any()
    y = mx.mx_scaled_mm(a, b, sa, sb, (1, 32), np.dtype(F32), None, kernel)
    want = block.block_scaled_mm(
        a, b, mx.decode_e8m0_array(sa), mx.decode_e8m0_array(sb), (1, 32), np.dtype(F32), None, kernel
    )
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    if hi < 200:  # huge scales overflow float32 partway (inf - inf = NaN), in the contract's order too
        assert_block_g3(y, a, b, sa, sb, (1, 32), require_nonzero=False)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m", [1, 6, 80])
def test_mx_gemm_nan_scale_byte_and_nan_code_poison_their_outputs(kernel, m):
    rng = np.random.default_rng(m)
    a, b, sa, sb = _operands(rng, m, 12, 128)
    sa[m - 1, 2] = 0xFF
    sb[3, 0] = 0xFF
    b[5, 77] = 0x7F
    y = vt.scaled_mm(a, b, sa, sb, block_size=(1, 32), kernel=kernel)
    nan = np.isnan(y)
    assert nan[m - 1].all() and nan[:, 3].all() and nan[:, 5].all() and nan.sum() == 12 + 2 * m - 2
    assert assert_block_g3(y, a, b, sa, sb, (1, 32), require_nonzero=False) == y.size - nan.sum()


@settings(max_examples=80, deadline=None)
@given(fst.mx_gemm_cases())
def test_mx_gemm_property(case):
    y = vt.scaled_mm(*case.args, **case.kwargs)
    assert assert_mx_within_g3(y, case) == np.count_nonzero(~np.isnan(y.astype(F32)))  # every non-NaN compared


def test_e8m0_weight_blocks_beside_float_activation_scales():
    """DeepSeek's UE8M0 checkpoints: 128 x 128 weight blocks as E8M0 bytes, activations per 1 x 128
    group with float32 (power-of-two) scales: the same result as the float32 blocks, bit for bit."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 384)).astype(F32)
    q = vt.quantize_fp8(x, group_size=128, scale_ue8m0=True)
    a, b = q.data, rng.integers(0, 0x7E, size=(256, 384), dtype=np.uint8)
    sb = rng.integers(115, 125, size=(2, 3), dtype=np.uint8)
    for kernel in KERNELS:
        y = vt.scaled_mm(q, b, scale_b=sb, block_size=(128, 128), kernel=kernel)
        want = vt.scaled_mm(q, b, scale_b=vt.decode_e8m0(sb), block_size=(128, 128), kernel=kernel)
        np.testing.assert_array_equal(y, want)
        assert assert_block_g3(y, a, b, q.scale, sb, (128, 128)) > 1000


# -- the boundary ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(scale_format="e8m0"), ValueError, "scale_format='e8m0' must come with group_size"),
        (dict(group_size=32, scale_rounding="floor"), ValueError, "scale_rounding applies to scale_format='e8m0' only"),
        (dict(group_size=32, scale_format="e8m0", scale_ue8m0=True), ValueError, "scale_ue8m0 must be False"),
        (
            dict(group_size=32, scale_format="e8m0", scale_rounding="ceil"),
            ValueError,
            "scale_rounding must be one of 'rceil', 'floor'",
        ),
        (dict(group_size=32, scale_format="ue8m0"), ValueError, "scale_format must be one of 'float32', 'e8m0'"),
    ],
)
def test_mx_quantize_arguments_are_checked(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        vt.quantize_fp8(np.ones((2, 64), F32), **kwargs)


def test_mx_scales_go_with_block_size_only():
    a = np.zeros((2, 64), np.uint8)
    with pytest.raises(TypeError, match="scale_b must be a float array, got dtype uint8"):
        vt.scaled_mm(a, a, np.float32(1), np.full(2, 127, np.uint8))
    with pytest.raises(ValueError, match=r"scale_a must have shape \(2, 2\)"):
        vt.scaled_mm(a, a, np.full((2, 4), 127, np.uint8), np.full((2, 2), 127, np.uint8), block_size=(1, 32))
    q = vt.quantize_fp8(np.ones((2, 64), F32), group_size=32, scale_format="e8m0")
    y = vt.scaled_mm(q, a, scale_b=np.full((2, 2), 127, np.uint8).view(ml_dtypes.float8_e8m0fnu), block_size=(1, 32))
    assert y.shape == (2, 2) and not y.any()
