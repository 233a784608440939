"""One-line property assertions for users' own FP8 kernels, against ``vtnumba.testing.reference``.

from hypothesis import given
from vtnumba.testing import strategies as fst
from vtnumba.testing.properties import assert_within_g3

@given(fst.gemm_cases())
def test_my_gemm(case):
    assert_within_g3(my_scaled_mm(*case.args, **case.kwargs), case)
"""

from .gates import assert_block_g3, assert_g3


def assert_within_g3(y, case, *, tensor_cores=False):
    """Assert ``y`` (numpy or cupy) is ``case``'s GEMM (a strategies.GemmCase) within DESIGN.md's
    G3 bound of the float64 reference, ``4 * K * eps32 * |sa * sb| * sum|terms|`` plus the out
    dtype's rounding, with NaN where a NaN code reaches the sum. ``tensor_cores=True`` allows
    reference.tensor_core_bound instead (cuBLASLt on Hopper does not accumulate every product in
    float32). Returns the number of elements compared (``vtnumba.testing.gates.assert_g3``)."""
    return assert_g3(
        y,
        case.a,
        case.b,
        case.scale_a,
        case.scale_b,
        case.bias,
        case.out_dtype,
        require_nonzero=False,
        tensor_core=tensor_cores,
    )


def assert_mx_within_g3(y, case):
    """Assert ``y`` is ``case``'s MXFP8 GEMM (a strategies.MxGemmCase) within the G3-per-block bound of
    ``reference.block_scaled_mm`` on the decoded E8M0 scales (DESIGN.md, "MXFP8"), NaN exactly where a
    NaN code or a 0xFF scale reaches the sum. Returns the number of elements compared."""
    return assert_block_g3(
        y, case.a, case.b, case.scale_a, case.scale_b, case.block_size, case.bias, case.out_dtype, require_nonzero=False
    )
