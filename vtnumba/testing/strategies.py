"""Hypothesis strategies for FP8 property tests, for vtnumba's tests and for users' own.

    from hypothesis import given
    from vtnumba.testing import strategies as fst

    @given(fst.quantizable_arrays(), fst.quant_scales())
    def test_mine(x, scale): ...

The value strategies lean on the places e4m3 gets wrong first: exact ties between neighbouring
e4m3 values, the subnormal ladder and its midpoints, +-448 and its float32 neighbours, +-0, NaN and
inf. Everything is float32 (``width=32``), the type the encoder rounds from.
"""

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
    anchors = np.concatenate([(grid[:-1] + grid[1:]) / 2.0, [448.0, 464.0, 2.0 ** -6, 2.0 ** -10]]).astype(np.float32)
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


def quantizable_arrays(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=24), dtype=np.float32,
                       allow_nan=True, allow_infinity=True):
    """float32 arrays for the quantizers, elements from ``float32_values``."""
    return hnp.arrays(np.dtype(dtype), shape, elements=float32_values(allow_nan, allow_infinity))


def matrices(min_rows=1, max_rows=16, min_cols=1, max_cols=48, **kwargs):
    """2-D float32 arrays [rows, cols] (per-token quantization's input)."""
    shape = st.tuples(st.integers(min_rows, max_rows), st.integers(min_cols, max_cols))
    return quantizable_arrays(shape=shape, **kwargs)
