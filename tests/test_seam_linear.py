"""seam.make_linear_method (singledispatch on the weight's type) and the linear methods."""

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba import seam

RNG = np.random.default_rng(61)


def test_factory_dispatches_on_the_weight_type():
    w = seam.Fp8Weight.from_float(RNG.standard_normal((8, 16)).astype(np.float32))
    m = seam.make_linear_method(w)
    assert type(m) is seam.Fp8W8A8LinearMethod and m.weight is w and m.name == "fp8_w8a8"
    r = seam.ResidentFp8(w, "cpu")
    assert type(seam.make_linear_method(r)) is seam.Fp8W8A8LinearMethod
    u = seam.make_linear_method(RNG.standard_normal((8, 16)).astype(np.float16))
    assert type(u) is seam.UnquantizedLinearMethod and u.name == "unquantized"
    for method in (m, u):
        assert isinstance(method, seam.LinearMethod)


def test_factory_refuses_what_it_cannot_serve():
    with pytest.raises(TypeError, match="weight must be an Fp8Weight, a ResidentFp8 or a float array .* got list"):
        seam.make_linear_method([[1.0]])
    with pytest.raises(TypeError, match="got e4m3 codes without scales"):
        seam.make_linear_method(np.zeros((4, 4), np.uint8))
    with pytest.raises(TypeError, match="weight must be a float32, float16 or bfloat16 array"):
        seam.make_linear_method(np.zeros((4, 4), np.int16))
    w = seam.Fp8Weight(np.zeros((4, 4), np.uint8), 1.0)
    with pytest.raises(ValueError, match="bias must be None for an FP8 weight"):
        seam.make_linear_method(w, np.zeros(4, np.float32))


class LowRankWeight:
    """A weight type from 'another package': W = u @ v, never materialized."""

    def __init__(self, u, v):
        self.u, self.v = u, v


class LowRankMethod:
    name = "low_rank"

    def __init__(self, weight):
        self.weight = weight

    def apply(self, x, out_dtype=None):
        y = (x.astype(np.float32) @ self.weight.v.T) @ self.weight.u.T
        return y.astype(x.dtype if out_dtype is None else out_dtype)

    def apply_prequant(self, q, out_dtype=None):
        return self.apply(q.dequantize(np.float32), out_dtype)


def test_a_registered_custom_type_gets_its_own_method():
    u = RNG.standard_normal((12, 3)).astype(np.float32)
    v = RNG.standard_normal((3, 20)).astype(np.float32)
    with pytest.raises(TypeError, match="register other types"):
        seam.make_linear_method(LowRankWeight(u, v))
    # (singledispatch has no unregister; LowRankWeight exists only in this module)
    seam.make_linear_method.register(LowRankWeight, lambda weight, bias=None: LowRankMethod(weight))
    m = seam.make_linear_method(LowRankWeight(u, v))
    assert type(m) is LowRankMethod and isinstance(m, seam.LinearMethod)
    x = RNG.standard_normal((4, 20)).astype(np.float32)
    np.testing.assert_allclose(m.apply(x), x @ (u @ v).T, rtol=1e-5, atol=1e-5)
    # the built-in registrations are untouched
    assert type(seam.make_linear_method(np.ones((2, 2), np.float32))) is seam.UnquantizedLinearMethod


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_unquantized_is_x_at_w_transposed_with_float32_accumulation(dtype):
    w = RNG.standard_normal((24, 48)).astype(dtype)
    b = RNG.standard_normal(24).astype(dtype)
    x = RNG.standard_normal((2, 5, 48)).astype(dtype)
    m = seam.make_linear_method(w, b)
    y = m.apply(x)
    assert y.dtype == np.dtype(dtype) and y.shape == (2, 5, 24)
    exact = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
    y32 = m.apply(x, out_dtype=np.float32)
    # float32 accumulation: within 4*K*eps32 of the float64 sum of |terms| (G3's form)
    terms = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T + np.abs(b.astype(np.float64))
    assert np.all(np.abs(y32 - exact) <= 4 * 48 * 2.0**-23 * terms)
    np.testing.assert_array_equal(y.view(np.uint8), y32.astype(dtype).view(np.uint8))


def test_unquantized_refuses_bad_shapes():
    m = seam.UnquantizedLinearMethod(np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., K\] with K = 8"):
        m.apply(np.ones((2, 7), np.float32))
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        seam.UnquantizedLinearMethod(np.ones((4, 8), np.float32), np.ones(3, np.float32))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        seam.UnquantizedLinearMethod(np.ones(8, np.float32))


def test_unquantized_apply_prequant_dequantizes_exactly():
    w = RNG.standard_normal((6, 16)).astype(np.float32)
    m = seam.UnquantizedLinearMethod(w)
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    for q in (vt.quantize_fp8(x), vt.quantize_fp8(x, per_token=True)):
        expected = m.apply(vt.dequantize_fp8(q.data, q.scale.reshape(-1, 1) if q.per_token else q.scale))
        np.testing.assert_array_equal(m.apply_prequant(q), expected)


def test_fp8_method_apply_is_matmul_fp8():
    w = seam.Fp8Weight.from_float(
        RNG.standard_normal((16, 32)).astype(np.float32), per_channel=True, activation_scheme="per_token"
    )
    m = seam.make_linear_method(w)
    x = RNG.standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_array_equal(m.apply(x), seam.matmul_fp8(x, w))
    q = vt.quantize_fp8(x, per_token=True)
    np.testing.assert_array_equal(m.apply_prequant(q), seam.matmul_fp8_prequant(q, w))
