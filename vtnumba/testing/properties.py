"""One-line property assertions for users' own FP8 kernels, against ``vtnumba.testing.reference``.

    from hypothesis import given
    from vtnumba.testing import strategies as fst
    from vtnumba.testing.properties import assert_within_g3

    @given(fst.gemm_cases())
    def test_my_gemm(case):
        assert_within_g3(my_scaled_mm(*case.args, **case.kwargs), case)
"""

import ml_dtypes
import numpy as np

from . import reference


def _host(y):
    return np.asarray(y.get() if hasattr(y, "get") else y)  # cupy arrays come back to the host


def g3_violations(y, ref, bound, out_dtype):
    """Where y is outside ``bound`` plus the out dtype's rounding of ``ref``. NaN in ref (a NaN code
    reached the product) must be NaN in y. A narrow out dtype overflows to inf by RNE when the
    result rounds past its largest finite value (65520 -> inf in float16): that inf is correct."""
    allowed = bound + reference.out_rounding(ref, out_dtype)
    yf = y.astype(np.float64)
    err = np.abs(yf - ref)
    top = float(ml_dtypes.finfo(out_dtype).max)  # ml_dtypes.finfo covers float32 and float16 too
    overflow = np.isinf(yf) & (np.sign(yf) == np.sign(ref)) & (np.abs(ref) + allowed >= top)
    nan = np.isnan(ref)
    ok = np.where(nan, np.isnan(yf), (err <= allowed) | overflow)
    return ~ok, err, allowed


def assert_within_g3(y, case, *, tensor_cores=False):
    """Assert ``y`` (numpy or cupy) is ``case``'s GEMM (a strategies.GemmCase) within DESIGN.md's
    G3 bound of the float64 reference, ``4 * K * eps32 * |sa * sb| * sum|terms|`` plus the out
    dtype's rounding, with NaN where a NaN code reaches the sum. ``tensor_cores=True`` allows
    reference.tensor_core_bound instead (cuBLASLt on Hopper does not accumulate every product in
    float32). Returns the number of elements compared."""
    y = _host(y)
    out_dtype = np.dtype(case.out_dtype)
    ref, bound = reference.scaled_mm(case.a, case.b, case.scale_a, case.scale_b, case.bias)
    if tensor_cores:
        bound = reference.tensor_core_bound(case.a, case.b, case.scale_a, case.scale_b)
    assert y.shape == ref.shape, f"y has shape {y.shape}, the GEMM's is {ref.shape}"
    assert y.dtype == out_dtype, f"y has dtype {y.dtype}, the case asks for {out_dtype}"
    bad, err, allowed = g3_violations(y, ref, bound, out_dtype)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise AssertionError(f"G3 violated at {i}: y={y[i]!r} ref={ref[i]!r} err={err[i]:.3g} "
                             f"allowed={allowed[i]:.3g} ({int(bad.sum())} of {bad.size} elements)")
    assert ref.size > 0, "the case has no output elements: compared nothing"  # vacuity guard
    return ref.size
