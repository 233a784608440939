"""Hypothesis strategies for FP8 property tests, for vtnumba's tests and for users' own.

    from hypothesis import given
    from vtnumba.testing import reference, strategies as fst
    from vtnumba.testing.properties import assert_within_g3

    @given(fst.quant_cases())
    def test_my_quantizer(cases):
        for x, kwargs in cases:
            assert (my_quantize(x, **kwargs).data == reference.quantize(x, **kwargs).data).all()

    @given(fst.gemm_cases())
    def test_my_gemm(case):
        assert_within_g3(my_scaled_mm(*case.args, **case.kwargs), case)

Joint cases (the ones to use): each draws a scale, or an amax that sets the scale, first, then
float32 values whose scaled image lands on an e4m3 tie under it, for the multiply path
(x * float32(1 / scale)) and the divide path (x / scale), landed exactly and one float32 ulp either
side, preferring the inputs where the two paths part (the DESIGN.md "divide instead of reciprocal
multiply" bug shows only there); 1 in 8 values is special (+-0, NaN, +-inf, huge, the smallest
subnormal, any float32), and targets past 448 make values that saturate. Each gives (x, kwargs) for
``quantize(x, **kwargs)``:

- ``static_quant_cases()``: kwargs ``{"scale": s}``; s from ``case_scales()``.
- ``dynamic_quant_cases()``: kwargs ``{}``; x's finite amax is drawn first.
- ``per_token_cases()``: 2-D x, kwargs ``{"per_token": True}`` and at times ``"scale_ub"``; every
  row its own amax, so row scales amax / 448 are not powers of two.
- ``group_quant_cases(group_size)``: [M, K] x, K a multiple of group_size, kwargs
  ``{"group_size": g}``; every 1 x g group its own amax, scale max(amax, 1e-10) / 448 (DESIGN.md
  "per-group activations").
- ``mx_quant_cases(group_size=32)``: [M, K] x for MXFP8 quantization, kwargs ``{"group_size": g,
  "scale_format": "e8m0", "scale_rounding": rule}``: every group its own amax (drawn to straddle the
  rules' boundaries: significands either side of 1.75, 448 * 2^k and its float32 neighbours,
  subnormal and zero amax), values landed on ties under the group's power-of-two scale.
- ``quant_cases()``: a (static, dynamic, per-token) tuple of the above, all three per example.
- ``gemm_cases()``: a ``GemmCase`` (codes, scales of either sign, per-tensor / per-row /
  per-channel, bias, out dtype, at times a NaN code); check a result with
  ``vtnumba.testing.properties.assert_within_g3``.
- ``mx_gemm_cases()``: an ``MxGemmCase`` (codes, E8M0 scale bytes per 1 x 32 on both operands over a
  wide exponent range, at times 0xFF or a NaN code, bias, out dtype); check with
  ``vtnumba.testing.properties.assert_mx_within_g3``.

Building blocks, drawn independently of any scale (they do not reach ties under a scale, so they
miss the divide bug): ``float32_values``, ``e4m3_ties``, ``near_boundaries``, ``e4m3_grid_values``,
``quantizable_arrays``, ``matrices``, ``quant_scales``, ``e4m3_codes``, ``code_arrays``. The value
strategies lean on the places e4m3 gets wrong first: exact ties between neighbouring e4m3 values,
the subnormal ladder and its midpoints, +-448 and its float32 neighbours, +-0, NaN and inf.
Everything is float32 (``width=32``), the type the encoder rounds from.
"""

from dataclasses import dataclass

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from . import reference

# Scales that expose the multiply-by-reciprocal vs divide difference (0.0092, 0.13, 0.77) and ones
# that do not (DESIGN.md, "static per-tensor quant").
DESIGN_SCALES = (1.0, 0.5, 0.035, 0.0092, 7.25, 0.13, 0.77)


def _f32(values):
    return [float(np.float32(v)) for v in values]


def e4m3_grid_values():
    """Every finite e4m3 value, both signs (exactly representable in float32)."""
    grid = reference.GRID
    return st.sampled_from(_f32(list(grid) + list(-grid)))


def e4m3_ties():
    """Exact midpoints between neighbouring e4m3 values (each a float32), both signs."""
    grid = reference.GRID
    mids = (grid[:-1] + grid[1:]) / 2.0
    return st.sampled_from(_f32(list(mids) + list(-mids)))


def near_boundaries():
    """float32 values one ulp either side of the ties, of 448 and of the subnormal/normal edge."""
    grid = reference.GRID
    anchors = np.concatenate([(grid[:-1] + grid[1:]) / 2.0, [448.0, 464.0, 2.0**-6, 2.0**-10]]).astype(np.float32)
    up = np.nextafter(anchors, np.float32(np.inf))
    down = np.nextafter(anchors, np.float32(0))
    vals = np.concatenate([up, down])
    return st.sampled_from(_f32(list(vals) + list(-vals)))


def float32_values(allow_nan=True, allow_infinity=True):
    """float32 scalars weighted toward e4m3's hard cases, plus any float32 at all."""
    special = [0.0, -0.0, 448.0, -448.0, 1e30, -1e30]
    if allow_infinity:
        special += [float("inf"), float("-inf")]
    if allow_nan:
        special += [float("nan")]
    return st.one_of(
        e4m3_ties(),
        near_boundaries(),
        e4m3_grid_values(),
        st.sampled_from(special),
        st.floats(width=32, allow_nan=allow_nan, allow_infinity=allow_infinity),
        st.floats(min_value=-500.0, max_value=500.0, width=32),  # the range that maps onto e4m3
    )


def quant_scales():
    """Valid quantization scales: positive, finite and normal as float32."""
    return st.one_of(
        st.sampled_from(DESIGN_SCALES),
        st.floats(min_value=float(np.float32(1e-6)), max_value=float(np.float32(1e6)), width=32),
    )


def e4m3_codes(include_nan=True):
    """e4m3fn codes as Python ints 0..255 (0x7F / 0xFF are NaN)."""
    codes = st.integers(min_value=0, max_value=255)
    if include_nan:
        return codes
    return codes.filter(lambda c: (c & 0x7F) != 0x7F)


def code_arrays(shape):
    """uint8 arrays of e4m3 codes of ``shape`` (a tuple or a strategy of tuples), NaN codes excluded."""
    return hnp.arrays(np.uint8, shape, elements=e4m3_codes(include_nan=False))


def quantizable_arrays(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=24), dtype=np.float32, allow_nan=True, allow_infinity=True
):
    """float32 arrays for the quantizers, elements from ``float32_values``."""
    return hnp.arrays(np.dtype(dtype), shape, elements=float32_values(allow_nan, allow_infinity))


def matrices(min_rows=1, max_rows=16, min_cols=1, max_cols=48, **kwargs):
    """2-D float32 arrays [rows, cols] (per-token quantization's input)."""
    shape = st.tuples(st.integers(min_rows, max_rows), st.integers(min_cols, max_cols))
    return quantizable_arrays(shape=shape, **kwargs)


# -- joint cases: a scale and the values that land on e4m3 ties under it ---------------------------
#
# Drawn independently, x and scale almost never put x * (1 / scale) within an ulp of an e4m3 tie,
# and that is the only place a divide (x / scale) and a reciprocal multiply differ: a property over
# quantizable_arrays() and quant_scales() found no divide-for-multiply quantizer in 300 examples
# (tools/MUTATIONS.md). So these draw the scale first, then values whose scaled image is a chosen
# tie (or +-448's saturation edge), landed for the multiply path (static, dynamic per-tensor) and
# the divide path (per-token, per-group), and one float32 ulp either side of each landing.

_TIES = (reference.GRID[:-1] + reference.GRID[1:]) / 2.0
# The ties, then the top of the range: 448 itself, 464 (the tie above 448, which saturates) and
# values past it.
_TARGETS = np.concatenate([_TIES, [448.0, 464.0, 480.0, 512.0, 1024.0, 1e4]])
_SPECIALS = _f32([0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 2.0**-149])
_FREE = 4  # values drawn from float32_values() per case, beside the fixed specials
_N_SPECIAL = len(_SPECIALS) + _FREE
_DRAWN_PER_ELEMENT = 64  # larger arrays take their element choices from a drawn seed (cheap draws)


def _landed(scale):
    """The landings under ``scale``, as two float32 arrays (both signs).

    ``landings``: for each target t and each path (multiply by float32(1 / scale); divide by scale),
    the float32 x whose image under that path is t (the nearest when none is exact), twice, and its
    float32 neighbours. ``parting``: the exact landings whose image under the other path is not t,
    the inputs where a divide and a reciprocal multiply can round differently (DESIGN.md, "static
    per-tensor quant"); empty at scales where the two paths agree on every tie (1, 0.5, 7.25).
    """
    s = np.float32(scale)
    inv = np.float32(1.0) / s
    x0 = (_TARGETS * float(s)).astype(np.float32)
    # positive float32 neighbours by bit steps: the landing is among x0 +- 4 ulps
    cand = (x0.view(np.int32)[:, None] + np.arange(-4, 5, dtype=np.int32)[None, :]).view(np.float32)
    images = (cand * inv, cand / s)
    landings, parting = [], []
    for path in (0, 1):
        err = np.abs(images[path].astype(np.float64) - _TARGETS[:, None])
        parts = (err == 0) & (images[1 - path].astype(np.float64) != _TARGETS[:, None])
        parting.append(cand[parts])
        best = cand[np.arange(len(_TARGETS)), np.argmin(err - parts, axis=1)]  # a parting one if any
        bits = best.view(np.int32)
        for step in (0, 0, -1, 1):
            landings.append((bits + np.int32(step)).view(np.float32))
    landings, parting = np.concatenate(landings), np.concatenate(parting)
    return np.concatenate([landings, -landings]), np.concatenate([parting, -parting])


def _choose(draw, n):
    """``n`` (kind, index) pairs: kind 0 (1 in 8) a special, 1-4 a landing, 5-7 a parting landing;
    the index is taken modulo the length of the kind's pool."""
    if n <= _DRAWN_PER_ELEMENT:
        picks = draw(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 2**16 - 1)), min_size=n, max_size=n))
        return np.array(picks, dtype=np.int64).reshape(n, 2).T
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return rng.integers(0, 8, size=n), rng.integers(0, 2**16, size=n)


def _f32_floats(lo, hi):
    """float32 floats in [lo, hi] (the bounds rounded to float32, as hypothesis requires)."""
    return st.floats(min_value=float(np.float32(lo)), max_value=float(np.float32(hi)), width=32)


def _values(draw, scale, n):
    """``n`` float32 values under ``scale``: 1 in 8 special (+-0, NaN, +-inf, huge, the smallest
    subnormal, or any float32), half landings on ties, 3 in 8 parting landings (landings where
    there are none)."""
    free = draw(st.lists(float32_values(), min_size=_FREE, max_size=_FREE))
    specials = np.array(_SPECIALS + free, dtype=np.float32)
    landings, parting = _landed(scale)
    if parting.size == 0:
        parting = landings
    kind, index = _choose(draw, n)
    out = np.where(kind == 0, specials[index % specials.size], landings[index % landings.size])
    return np.where(kind >= 5, parting[index % parting.size], out).astype(np.float32)


def _within_amax(draw, values, amax):
    """Clip the finite values to +-amax and put +-amax itself at one drawn place, so that the row's
    (or tensor's, or group's) amax is exactly ``amax``: the scale the values were landed under."""
    a = np.float32(amax)
    v = np.where(np.isfinite(values) & (np.abs(values) > a), np.copysign(a, values), values).astype(np.float32)
    v[draw(st.integers(0, v.size - 1))] = -a if draw(st.booleans()) else a
    return v


def _any_significand(min_exp, max_exp):
    """Positive float32 values 2^e * (1 + m / 2^23), e in [min_exp, max_exp), with m drawn as an
    integer: hypothesis's floats favour simple values (1.5, 3.0, 100.0), whose few significands
    decide whether a divide and a reciprocal multiply part at ties; these have all of them."""
    parts = st.tuples(st.integers(min_exp, max_exp - 1), st.integers(0, 2**23 - 1))
    return parts.map(lambda t: float(np.float32(np.ldexp(1.0 + t[1] / 2.0**23, t[0]))))


def case_scales():
    """Static scales for the joint cases: DESIGN.md's list, any float32 in [1e-6, 1e6] and scales
    with an arbitrary significand in [2^-20, 2^20]."""
    return st.one_of(quant_scales(), _any_significand(-20, 20))


def _amaxes():
    """Row / tensor amax: mostly ordinary magnitudes (whose scale amax / 448 is not a power of two,
    448 being 7 * 64), sometimes small enough for the scale floor 1 / (448 * 512), sometimes 0."""
    return st.one_of(
        _any_significand(-10, 17),
        _f32_floats(1e-3, 1e5),
        _f32_floats(1e-7, 1e-3),
        st.sampled_from([0.0, 1.0, 448.0]),
    )


def _dynamic_scale(amax):
    """DESIGN.md's dynamic scale, in reference.quantize's float32 order."""
    return np.maximum(np.float32(amax) / np.float32(448.0), reference.FLOOR)


def static_quant_cases(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=16), scales=None):
    """(x, {"scale": scale}): static per-tensor cases, values landed on ties under ``scale``
    (drawn from ``case_scales()`` unless given) for the multiply and the divide path."""

    @st.composite
    def cases(draw):
        scale = draw(scales if scales is not None else case_scales())
        dims = draw(shape) if isinstance(shape, st.SearchStrategy) else tuple(shape)
        x = _values(draw, scale, int(np.prod(dims))).reshape(dims)
        return x, {"scale": float(np.float32(scale))}

    return cases()


def dynamic_quant_cases(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=16)):
    """(x, {}): dynamic per-tensor cases; x's finite amax is drawn first and the values land on ties
    under its scale max(amax / 448, 1 / (448 * 512)); NaN and +-inf may appear (not in the amax)."""

    @st.composite
    def cases(draw):
        amax = np.float32(draw(_amaxes()))
        dims = draw(shape) if isinstance(shape, st.SearchStrategy) else tuple(shape)
        x = _within_amax(draw, _values(draw, _dynamic_scale(amax), int(np.prod(dims))), amax)
        return x.reshape(dims), {}

    return cases()


def per_token_cases(max_rows=8, max_cols=32):
    """(x, {"per_token": True[, "scale_ub": ub]}): 2-D x whose every row has its own drawn amax,
    values landed on ties under that row's scale (divide and multiply path), with or without an
    upper bound ``scale_ub`` on the amax (it caps some rows' scales, which then saturate their top)."""

    @st.composite
    def cases(draw):
        m = draw(st.integers(1, max_rows))
        k = draw(st.integers(1, max_cols))
        amaxes = np.array([draw(_amaxes()) for _ in range(m)], dtype=np.float32)
        ub = draw(st.none() | _f32_floats(1e-2, 1e4))
        capped = amaxes if ub is None else np.minimum(amaxes, np.float32(ub))
        rows = [_within_amax(draw, _values(draw, _dynamic_scale(c), k), a) for a, c in zip(amaxes, capped)]
        kwargs = {"per_token": True} if ub is None else {"per_token": True, "scale_ub": float(np.float32(ub))}
        return np.stack(rows), kwargs

    return cases()


def _grouped_rows(draw, group_size, max_rows, max_groups, amaxes, scale_of):
    """x [M, groups * group_size]: each 1 x g group drawn with its own amax (from ``amaxes``) and values
    landed on e4m3 ties under its scale ``scale_of(amax)``."""
    m = draw(st.integers(1, max_rows))
    groups = draw(st.integers(1, max_groups))
    x = np.empty((m, groups * group_size), dtype=np.float32)
    for r in range(m):
        for g in range(groups):
            amax = np.float32(draw(amaxes))
            x[r, g * group_size : (g + 1) * group_size] = _within_amax(
                draw, _values(draw, scale_of(amax), group_size), amax
            )
    return x


def group_quant_cases(group_size=128, max_rows=4, max_groups=4):
    """(x, {"group_size": group_size}): 2-D x [M, K], K a multiple of ``group_size``, every 1 x g
    group with its own drawn amax and values landed on ties under that group's scale
    max(amax, 1e-10) / 448 (DESIGN.md "per-group activations", a divide)."""

    @st.composite
    def cases(draw):
        x = _grouped_rows(
            draw,
            group_size,
            max_rows,
            max_groups,
            _amaxes(),
            lambda amax: np.maximum(amax, np.float32(1e-10)) / np.float32(448.0),
        )
        return x, {"group_size": group_size}

    return cases()


def _mx_amaxes():
    """MX group amax: any significand (the floor and rceil rules part where it exceeds 1.75), 448 * 2^k
    and its float32 neighbours (where rceil's rounding direction matters), tiny (subnormal) and 0."""

    def at_448(t):
        e, step = t
        base = np.float32(np.ldexp(448.0, e))
        return float((base.view(np.int32) + np.int32(step)).view(np.float32))

    return st.one_of(
        _any_significand(-20, 20),
        st.tuples(st.integers(-30, 30), st.integers(-1, 1)).map(at_448),
        st.sampled_from([0.0, float(np.float32(2.0**-140)), float(np.float32(448 * 2.0**-127)), 1.0, 448.0]),
    )


def mx_quant_cases(group_size=32, max_rows=4, max_groups=4, rounding=None):
    """(x, kwargs) for MXFP8 quantization: 2-D x [M, K], K a multiple of ``group_size``, kwargs
    ``{"group_size": g, "scale_format": "e8m0", "scale_rounding": rule}`` (``rounding`` None: drawn).
    Every group gets its own amax (``_mx_amaxes``) and values landed on e4m3 ties under the group's
    power-of-two scale, from the oracle's rule (``reference.e8m0_bytes``); a power of two makes the
    divide and the reciprocal multiply agree, so the landings are exact."""

    @st.composite
    def cases(draw):
        rule = draw(st.sampled_from(("rceil", "floor"))) if rounding is None else rounding
        x = _grouped_rows(
            draw,
            group_size,
            max_rows,
            max_groups,
            _mx_amaxes(),
            lambda amax: np.float32(reference.decode_e8m0(reference.e8m0_bytes(amax, rule))),
        )
        return x, {"group_size": group_size, "scale_format": "e8m0", "scale_rounding": rule}

    return cases()


def quant_cases():
    """A tuple of three (x, kwargs) cases, one static, one dynamic and one per-token, each for
    ``quantize(x, **kwargs)`` (vt.quantize_fp8's and reference.quantize's keywords). All three in
    every example: drawn as one_of, hypothesis can go dozens of examples without one mode."""
    return st.tuples(static_quant_cases(), dynamic_quant_cases(), per_token_cases())


# -- GEMM cases ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmCase:
    """One scaled_mm problem: a [M, K] and b [N, K] e4m3 codes, scale_a (scalar or [M, 1]), scale_b
    (scalar, [N] or [N, 1]), bias ([N] or None), out_dtype. ``args`` / ``kwargs`` call any
    function with vt.scaled_mm's signature: ``scaled_mm(*case.args, **case.kwargs)``."""

    a: np.ndarray
    b: np.ndarray
    scale_a: object
    scale_b: object
    bias: object
    out_dtype: np.dtype

    @property
    def args(self):
        return self.a, self.b, self.scale_a, self.scale_b

    @property
    def kwargs(self):
        return {"out_dtype": self.out_dtype, "bias": self.bias}


OUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def mm_scales():
    """scaled_mm's dequantization scales: any finite float32, negative included; magnitudes kept in
    [1e-3, 1e3] so a result that ignores a scale is far from one that applies it."""
    magnitude = _f32_floats(1e-3, 1e3)
    return st.tuples(magnitude, st.booleans()).map(lambda t: float(np.float32(-t[0] if t[1] else t[0])))


def gemm_cases(max_m=16, max_n=16, max_k=64, nan=True, out_dtypes=OUT_DTYPES):
    """GemmCase draws: shapes, codes over the whole e4m3 range (a NaN code in some cases when
    ``nan``: it must reach the output), per-tensor or per-row x per-channel scales, bias or none,
    and the out dtype."""

    @st.composite
    def cases(draw):
        m, n, k = draw(st.integers(1, max_m)), draw(st.integers(1, max_n)), draw(st.integers(1, max_k))
        if (m + n) * k <= 256:  # small problems: hypothesis picks (and shrinks) every code
            a, b = draw(code_arrays((m, k))), draw(code_arrays((n, k)))
        else:  # larger ones: codes from a drawn seed, so generation stays cheap
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            a, b = (rng.integers(0, 256, size=s, dtype=np.uint8) for s in ((m, k), (n, k)))
            a[(a & 0x7F) == 0x7F] ^= 1  # NaN codes only where drawn below
            b[(b & 0x7F) == 0x7F] ^= 1
        if nan and draw(st.integers(0, 3)) == 0:  # a NaN code in 1 of 4 cases
            a, b = a.copy(), b.copy()
            which = a if draw(st.booleans()) else b
            row, col = draw(st.integers(0, which.shape[0] - 1)), draw(st.integers(0, k - 1))
            which[row, col] = draw(st.sampled_from([0x7F, 0xFF]))
        scale = mm_scales()
        sa = draw(scale)
        if draw(st.booleans()):  # per-row
            sa = np.array([draw(scale) for _ in range(m)], dtype=np.float32).reshape(m, 1)
        sb = draw(scale)
        if draw(st.booleans()):  # per-channel, [N] or [N, 1]
            sb = np.array([draw(scale) for _ in range(n)], dtype=np.float32)
            sb = sb.reshape(draw(st.sampled_from([(n,), (n, 1)])))
        bias = draw(st.none() | hnp.arrays(np.float32, (n,), elements=st.floats(-100, 100, width=32)))
        return GemmCase(a, b, sa, sb, bias, draw(st.sampled_from(out_dtypes)))

    return cases()


@dataclass(frozen=True)
class MxGemmCase:
    """One MXFP8 scaled_mm problem: a [M, K] and b [N, K] e4m3 codes, scale_a [M, ceil(K / 32)] and
    scale_b [N, ceil(K / 32)] E8M0 bytes (uint8), bias ([N] or None), out_dtype.
    ``scaled_mm(*case.args, **case.kwargs)`` (``block_size=(1, 32)`` among the kwargs)."""

    a: np.ndarray
    b: np.ndarray
    scale_a: np.ndarray
    scale_b: np.ndarray
    bias: object
    out_dtype: np.dtype
    block_size: tuple = (1, 32)

    @property
    def args(self):
        return self.a, self.b, self.scale_a, self.scale_b

    @property
    def kwargs(self):
        return {"out_dtype": self.out_dtype, "bias": self.bias, "block_size": self.block_size}


def mx_gemm_cases(max_m=8, max_n=12, max_k=160, nan=True, out_dtypes=OUT_DTYPES):
    """MxGemmCase draws: shapes (K any, so a short last block appears), codes over the whole e4m3
    range, E8M0 bytes near 127 or spread wider (some small enough that the CPU's exact-shortcut window
    is left: its fallback), in some cases a 0xFF scale byte or a NaN code, bias or none, the out dtype."""

    @st.composite
    def cases(draw):
        m, n, k = draw(st.integers(1, max_m)), draw(st.integers(1, max_n)), draw(st.integers(1, max_k))
        nkb = -(-k // 32)
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        a, b = (rng.integers(0, 256, size=s, dtype=np.uint8) for s in ((m, k), (n, k)))
        a[(a & 0x7F) == 0x7F] ^= 1
        b[(b & 0x7F) == 0x7F] ^= 1
        # near 2^0; wider; and small enough that some pairs leave the CPU shortcut's window (its fallback)
        lo, hi = draw(st.sampled_from([(117, 137), (100, 150), (40, 90)]))
        sa = rng.integers(lo, hi, size=(m, nkb), dtype=np.uint8)
        sb = rng.integers(lo, hi, size=(n, nkb), dtype=np.uint8)
        sa[sa == 0xFF] = 0xFE
        sb[sb == 0xFF] = 0xFE
        if nan and draw(st.integers(0, 3)) == 0:  # a NaN scale byte or a NaN code in 1 of 4 cases
            which = draw(st.sampled_from(["sa", "sb", "a", "b"]))
            arr = {"sa": sa, "sb": sb, "a": a, "b": b}[which]
            row, col = draw(st.integers(0, arr.shape[0] - 1)), draw(st.integers(0, arr.shape[1] - 1))
            arr[row, col] = 0xFF
        bias = draw(st.none() | hnp.arrays(np.float32, (n,), elements=st.floats(-100, 100, width=32)))
        return MxGemmCase(a, b, sa, sb, bias, draw(st.sampled_from(out_dtypes)))

    return cases()
