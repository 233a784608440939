"""G1 on the CPU: vt.quantize_fp8 / vt.encode_e4m3 bitwise against the independent oracle
(vtnumba.testing.reference), zero tolerance, on DESIGN.md's population, plus properties and bad input."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vtnumba as vt
from vtnumba.testing import reference
from vtnumba.testing import strategies as fst

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

SCALES = fst.DESIGN_SCALES
BF16 = ml_dtypes.bfloat16
F32 = np.float32


def _nudge_until(target, guess, op):
    """A float32 x near ``guess`` with op(x) == target exactly (op: float32 -> float32), or None."""
    x = F32(guess)
    for _ in range(4):
        for cand in (x, np.nextafter(x, F32(np.inf)), np.nextafter(x, F32(-np.inf))):
            if op(cand) == target:
                return cand
        x = np.nextafter(x, F32(np.inf) if op(x) < target else F32(-np.inf))
    return None


def _ties():
    """Exact midpoints between neighbouring e4m3 values for exponents -4..8 (plus the subnormal
    ladder's midpoints), both signs, as float32: the values RNE must break to the even code."""
    grid = reference.GRID
    mids = (grid[:-1] + grid[1:]) / 2.0
    exps = np.floor(np.log2(np.where(mids > 0, mids, 1.0)))
    keep = ((exps >= -4) & (exps <= 8)) | (mids < 2.0**-6)
    mids = mids[keep].astype(F32)
    assert np.all(mids.astype(np.float64) == ((grid[:-1] + grid[1:]) / 2.0)[keep]), "a tie is not a float32"
    return np.concatenate([mids, -mids])


def population(scale, rng):
    """DESIGN.md G1 population, in input units for ``scale``: inputs whose scaled value (by the
    reciprocal multiply, and separately by a divide) lands exactly on ties, the subnormal ladder and
    its midpoints, +-448 and neighbours, +-0, huge values, NaN, and random values."""
    s = F32(scale)
    inv = F32(1) / s
    targets = [_ties()]
    ladder = np.arange(0, 9, dtype=np.float64) * 2.0**-9
    targets.append(np.concatenate([ladder, ladder[:-1] + 2.0**-10]).astype(F32))
    edge = np.array([448.0, 464.0, 480.0, 2.0**-6, 2.0**-10], dtype=F32)
    targets.append(np.concatenate([edge, np.nextafter(edge, F32(0)), np.nextafter(edge, F32(np.inf))]))
    targets = np.concatenate([np.concatenate([t, -t]) for t in targets])
    exact_mul, exact_div = [], []
    for t in targets:
        xm = _nudge_until(t, t * s, lambda x: F32(x * inv))
        xd = _nudge_until(t, t * s, lambda x: F32(x / s))
        if xm is not None:
            exact_mul.append(xm)
        if xd is not None:
            exact_div.append(xd)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e30, -1e30, 3.4e38, -3.4e38], dtype=F32)
    rand = np.concatenate([rng.standard_normal(20000) * m for m in (1e-3, 1, 30, 448, 1e4)]).astype(F32) * s
    return np.concatenate([np.array(exact_mul, F32), np.array(exact_div, F32), special, rand]), len(exact_mul)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["f32", "f16", "bf16"])
def test_g1_static_bitwise(scale, dtype):
    x, n_exact_ties = population(scale, np.random.default_rng(1))
    x = x.astype(dtype)
    q = vt.quantize_fp8(x, scale)
    ref = reference.quantize(x, scale)
    assert q.data.dtype == np.uint8 and q.data.shape == x.shape
    assert np.array_equal(q.scale, np.array([scale], F32))
    mismatches = np.flatnonzero(q.data != ref.data)
    assert mismatches.size == 0, (
        f"{mismatches.size} mismatches, first x={x[mismatches[:5]]} got {q.data[mismatches[:5]]} want {ref.data[mismatches[:5]]}"
    )
    # vacuity: the population held constructed ties, and most codes are not zero
    assert n_exact_ties > 200 and x.size > 100_000
    assert np.count_nonzero(q.data & 0x7F) > 0.5 * x.size


def test_g1_ties_break_to_even_at_scale_one():
    ties = _ties()
    codes = vt.encode_e4m3(ties)
    ref = reference.encode(ties)
    assert np.array_equal(codes, ref) and ties.size > 200
    # each tie lands on the even code of its two neighbours
    assert np.all(codes % 2 == 0)


@pytest.mark.parametrize("scale", [0.0092, 0.13, 0.77])
def test_reciprocal_multiply_not_divide(scale):
    """At these scales, encode(x * (1/s)) and encode(x / s) differ on some inputs (DESIGN.md); the
    kernel must give the multiply's codes there."""
    x, _ = population(scale, np.random.default_rng(2))
    s = F32(scale)
    by_mul = reference.encode((x * (F32(1) / s)).astype(F32))
    by_div = reference.encode((x / s).astype(F32))
    differ = np.flatnonzero(by_mul != by_div)
    assert differ.size > 0, "population does not separate multiply from divide at this scale"
    assert np.array_equal(vt.quantize_fp8(x[differ], scale).data, by_mul[differ])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["f32", "f16", "bf16"])
def test_g1_dynamic_per_tensor(dtype):
    rng = np.random.default_rng(3)
    for magnitude in (1e-3, 1.0, 300.0, 5e4):
        x = (rng.standard_normal((64, 257)) * magnitude).astype(F32)
        x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]  # excluded from amax, encoded by the policy
        x = x.astype(dtype)
        q = vt.quantize_fp8(x)
        ref = reference.quantize(x)
        assert q.scheme == "dynamic" and q.scale.shape == (1,) and q.scale.dtype == F32
        assert np.array_equal(q.scale, ref.scale), (q.scale, ref.scale)
        assert np.array_equal(q.data, ref.data)
        assert np.count_nonzero(q.data & 0x7F) > x.size // 2
        assert q.data[0, 0] == 0x7F and q.data[0, 1] == 0x7E and q.data[0, 2] == 0xFE


def test_dynamic_all_zero_gets_the_floor_not_nan():
    q = vt.quantize_fp8(np.zeros((3, 5), F32))
    assert q.scale[0] == F32(1) / (F32(448) * F32(512)) and q.scale[0] > 0
    assert np.all(q.data == 0)


def _per_token_rows(scale_row_amax, rng, k=512):
    """Rows with a known amax whose other elements sit exactly on e4m3 ties under x / s_row."""
    rows = []
    ties = _ties()
    for amax in scale_row_amax:
        s = max(F32(amax) / F32(448), reference.FLOOR)
        row = [F32(amax)]
        for t in rng.choice(ties[np.abs(ties) < 440], size=k - 1):
            x = _nudge_until(t, t * s, lambda v, s=s: F32(v / s))
            row.append(x if x is not None and abs(x) <= amax else F32(t * s * 0.5))
        rows.append(row)
    return np.array(rows, dtype=F32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("scale_ub", [None, 2.5])
def test_g1_per_token(dtype, scale_ub):
    rng = np.random.default_rng(4)
    x = _per_token_rows([0.0092 * 448, 0.13 * 448, 0.77 * 448, 1.7, 1e-5, 300.0, 7.25 * 448], rng)
    x = np.concatenate([x, rng.standard_normal((9, x.shape[1])).astype(F32) * 40]).astype(dtype)
    q = vt.quantize_fp8(x, per_token=True, scale_ub=scale_ub)
    ref = reference.quantize(x, per_token=True, scale_ub=scale_ub)
    assert q.scheme == "per_token" and q.scale.shape == (x.shape[0], 1)
    assert np.array_equal(q.scale, ref.scale)
    bad = np.argwhere(q.data != ref.data)
    assert bad.size == 0, f"{len(bad)} mismatches at {bad[:5].tolist()}"
    assert np.count_nonzero(q.data & 0x7F) > x.size // 2


def test_per_token_divides():
    """Per-token uses x / s (upstream's per-token kernel); these rows are built so that the multiply
    by the reciprocal gives other codes."""
    rng = np.random.default_rng(5)
    x = _per_token_rows([0.0092 * 448, 0.13 * 448, 0.77 * 448], rng)
    q = vt.quantize_fp8(x, per_token=True)
    s = q.scale
    by_mul = reference.encode((x * (F32(1) / s)).astype(F32))
    by_div = reference.encode((x / s).astype(F32))
    differ = by_mul != by_div
    assert differ.sum() > 0
    assert np.array_equal(q.data[differ], by_div[differ])


def test_nan_policy_and_specials():
    x = np.array(
        [
            np.nan,
            -np.nan,
            np.inf,
            -np.inf,
            0.0,
            -0.0,
            448.0,
            -448.0,
            464.0,
            1e38,
            2.0**-9,
            2.0**-10,
            3 * 2.0**-10,
            5 * 2.0**-10,
        ],
        dtype=F32,
    )
    codes = vt.encode_e4m3(x)
    assert codes.tolist() == [0x7F, 0x7F, 0x7E, 0xFE, 0x00, 0x80, 0x7E, 0xFE, 0x7E, 0x7E, 0x01, 0x00, 0x02, 0x02]
    values = vt.decode_e4m3(np.arange(256, dtype=np.uint8))
    assert np.isnan(values[[0x7F, 0xFF]]).all() and np.isnan(values).sum() == 2
    assert values[0x7E] == 448.0 and values[0x08] == 2.0**-6 and values[0x01] == 2.0**-9
    assert np.signbit(values[0x80]) and values[0x80] == 0.0
    # decode equals the oracle's grid for all finite codes and matches ml_dtypes
    finite = ~np.isnan(values)
    assert np.array_equal(values[finite], reference.decode(np.arange(256, dtype=np.uint8))[finite])
    assert np.array_equal(
        values[finite], np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)[finite]
    )


def test_float8_dtype_accepted_and_dequantize():
    x = np.linspace(-500, 500, 97, dtype=F32)
    q = vt.quantize_fp8(x, 2.0)
    as_f8 = q.data.view(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(vt.decode_e4m3(as_f8), vt.decode_e4m3(q.data))
    for dt in (np.float32, np.float16, BF16):
        y = vt.dequantize_fp8(q.data, q.scale, dt)
        assert y.dtype == np.dtype(dt)
        ref = (reference.decode(q.data) * 2.0).astype(np.float32).astype(dt)
        assert np.array_equal(y.astype(np.float64), ref.astype(np.float64))
    assert np.count_nonzero(y) > 50


# ---------------------------------------------------------------- properties (hypothesis)


@settings(max_examples=150, deadline=None)
@given(fst.quantizable_arrays(), fst.quant_scales())
def test_property_static_matches_oracle(x, scale):
    assert np.array_equal(vt.quantize_fp8(x, scale).data, reference.quantize(x, scale).data)


@settings(max_examples=100, deadline=None)
@given(fst.matrices(), st.one_of(st.none(), fst.quant_scales()))
def test_property_per_token_rows_independent(x, scale_ub):
    whole = vt.quantize_fp8(x, per_token=True, scale_ub=scale_ub)
    ref = reference.quantize(x, per_token=True, scale_ub=scale_ub)
    assert np.array_equal(whole.data, ref.data) and np.array_equal(whole.scale, ref.scale)
    for r in range(x.shape[0]):
        one = vt.quantize_fp8(x[r : r + 1], per_token=True, scale_ub=scale_ub)
        assert np.array_equal(one.data[0], whole.data[r]) and one.scale[0, 0] == whole.scale[r, 0]


@settings(max_examples=200, deadline=None)
@given(st.lists(fst.float32_values(allow_nan=False), min_size=2, max_size=64))
def test_property_monotonic_symmetric_saturating(values):
    x = np.sort(np.array(values, dtype=F32))
    codes = vt.encode_e4m3(x)
    decoded = vt.decode_e4m3(codes)
    assert np.all(np.diff(decoded.astype(np.float64)) >= 0), "encode is not monotonic"
    neg = vt.encode_e4m3(-x)
    assert np.array_equal(neg, codes ^ 0x80), "encode(-x) must flip only the sign bit"
    sat = np.abs(x) >= 448
    assert np.all((codes[sat] & 0x7F) == 0x7E)


@settings(max_examples=100, deadline=None)
@given(fst.e4m3_grid_values())
def test_property_roundtrip_representable(v):
    code = vt.encode_e4m3(np.array([v], F32))
    assert vt.decode_e4m3(code)[0] == F32(v)


@settings(max_examples=60, deadline=None)
@given(fst.matrices(min_rows=2, min_cols=2), fst.quant_scales(), st.integers(1, 2), st.integers(1, 2))
def test_property_strided_equals_contiguous(x, scale, rstep, cstep):
    view = x[::rstep, ::cstep]
    for kwargs in (dict(scale=scale), {}, dict(per_token=True)):
        a = vt.quantize_fp8(view, **kwargs)
        b = vt.quantize_fp8(np.ascontiguousarray(view), **kwargs)
        assert np.array_equal(a.data, b.data) and np.array_equal(a.scale, b.scale)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), 1e-50])
def test_bad_scale(scale):
    with pytest.raises(ValueError, match="scale must be a positive finite"):
        vt.quantize_fp8(np.ones(4, F32), scale)


def test_bad_inputs_name_argument_and_value():
    x = np.ones((2, 3), F32)
    with pytest.raises(TypeError, match=r"x must be a float32, float16 or bfloat16 array, got dtype int32"):
        vt.quantize_fp8(np.ones(3, np.int32), 1.0)
    with pytest.raises(TypeError, match="x must be a numpy array"):
        vt.quantize_fp8([1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match=r"scale must be a scalar or a size-1 array, got shape \(3,\)"):
        vt.quantize_fp8(x, np.ones(3, F32))
    with pytest.raises(ValueError, match=r"x must be 2-D .* got shape \(3,\)"):
        vt.quantize_fp8(np.ones(3, F32), per_token=True)
    with pytest.raises(ValueError, match="scale_ub must be a positive finite"):
        vt.quantize_fp8(x, per_token=True, scale_ub=0.0)
    with pytest.raises(ValueError, match="scale_ub must be None unless per_token"):
        vt.quantize_fp8(x, scale_ub=1.0)
    with pytest.raises(ValueError, match="scale must be None with per_token"):
        vt.quantize_fp8(x, 1.0, per_token=True)
    with pytest.raises(TypeError, match="codes must be e4m3 codes"):
        vt.decode_e4m3(np.ones(3, np.int8))
    with pytest.raises(ValueError, match="dtype must be one of"):
        vt.dequantize_fp8(np.ones(3, np.uint8), 1.0, "int8")
