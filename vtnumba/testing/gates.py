"""DESIGN.md's G3 gate as one assertion, for vtnumba's own tests and for users' property tests.

    from vtnumba.testing.gates import assert_g3
    assert assert_g3(y, a, b, scale_a, scale_b, bias, out_dtype) > 0

``y`` (numpy or cupy, any out dtype) must equal the float64 reference of the lossy pipeline
(``reference.scaled_mm``: exact products of the decoded codes, scales, bias) within the float32
accumulation bound ``4 * K * eps32 * |sa * sb| * sum|terms|`` plus the output dtype's rounding; NaN
exactly where the reference has NaN (a NaN code poisons its row or column); an overflow to inf of a
narrow output is accepted where RNE itself rounds past the dtype's largest finite value.
``tensor_core=True`` holds the result to ``reference.tensor_core_bound`` instead (cuBLASLt on
Hopper, see there).
"""

import ml_dtypes
import numpy as np

from . import reference
from .devices import to_host

__all__ = ["assert_g3", "assert_block_g3", "g3_violations"]


def g3_violations(y, ref, bound, out_dtype):
    """(bad, err, allowed): the elements of ``y`` outside ``bound`` + the out rounding of ``ref``.
    A narrow out dtype overflows to inf by RNE when the result rounds past its largest finite value
    (65520 -> inf in float16): that inf is correct."""
    allowed = bound + reference.out_rounding(ref, out_dtype)
    yf = np.asarray(y).astype(np.float64)
    err = np.abs(yf - ref)
    top = (
        float(np.finfo(np.float16).max) if np.dtype(out_dtype) == np.float16 else float(ml_dtypes.finfo(out_dtype).max)
    )
    overflow = np.isinf(yf) & (np.sign(yf) == np.sign(ref)) & (np.abs(ref) + allowed >= top)
    return ~((err <= allowed) | overflow), err, allowed


def assert_g3(y, a, b, scale_a, scale_b, bias=None, out_dtype=np.float32, *, require_nonzero=True, tensor_core=False):
    """Assert G3 for ``y = scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype)``.

    ``a``, ``b``, the scales and ``bias`` are host (numpy) values. Returns how many elements were
    compared: with ``require_nonzero`` (the vacuity guard) only the non-zero finite reference
    elements count, and at least one must exist; without it, every element whose reference is not
    NaN counts."""
    ref, bound = reference.scaled_mm(a, b, scale_a, scale_b, None if bias is None else np.asarray(bias, np.float64))
    if tensor_core:
        bound = reference.tensor_core_bound(a, b, scale_a, scale_b)
    return _assert_within(y, ref, bound, (a.shape[0], b.shape[0]), out_dtype, require_nonzero)


def assert_block_g3(
    y, a, b, scale_a, scale_b, block_size, bias=None, out_dtype=np.float32, *, require_nonzero=True, tensor_core=False
):
    """``assert_g3`` for a block-scaled GEMM (``scaled_mm(..., block_size=block_size)``): the float64
    reference and the G3-per-block bound of ``reference.block_scaled_mm``. ``tensor_core=True`` adds
    the tensor-core allowance of ``reference.TENSOR_CORE_REL`` of each block's scaled sum of |terms|
    (cuBLASLt's block scaling accumulates each block on Hopper's tensor cores)."""
    ref, bound = reference.block_scaled_mm(
        a, b, scale_a, scale_b, block_size, None if bias is None else np.asarray(bias, np.float64)
    )
    if tensor_core:
        bound = bound + reference.block_tensor_core_allowance(a, b, scale_a, scale_b, block_size)
    return _assert_within(y, ref, bound, (a.shape[0], b.shape[0]), out_dtype, require_nonzero)


def _assert_within(y, ref, bound, shape, out_dtype, require_nonzero):
    y = to_host(y)
    assert y.shape == shape, f"shape {y.shape} != {shape}"
    assert y.dtype == np.dtype(out_dtype), f"dtype {y.dtype} != {np.dtype(out_dtype)}"
    nan = np.isnan(ref)
    np.testing.assert_array_equal(
        np.isnan(y.astype(np.float64)), nan, err_msg="NaN where the reference has none, or the reverse"
    )
    bad, err, allowed = g3_violations(y, ref, bound, out_dtype)
    bad &= ~nan
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"G3 violated at {i}: y={y[i]!r} ref={ref[i]!r} err={err[i]:.3g} "
            f"allowed={allowed[i]:.3g} ({int(bad.sum())} of {bad.size} elements)"
        )
    if not require_nonzero:
        return int((~nan).sum())
    compared = int((~nan & (ref != 0)).sum())
    assert compared > 0, "every reference element is zero or NaN: compared nothing"
    return compared
