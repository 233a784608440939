"""seam.matmul_fp8 / matmul_fp8_prequant and the lever, on the CPU: bitwise agreement of the two
entry points, G3 against the float64 oracle, shapes, dtypes, bad input, a two-layer MLP."""

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba import _config, seam
from vtnumba.testing import reference

RNG = np.random.default_rng(60)
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


def _weight(n, k, scheme, per_channel, bias, rng=RNG):
    w = (rng.standard_normal((n, k)) * np.linspace(0.02, 0.2, n)[:, None]).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    input_scale = np.float32(0.0213) if scheme == "static" else None
    return seam.Fp8Weight.from_float(
        w, input_scale=input_scale, per_channel=per_channel, activation_scheme=scheme, bias=b
    )


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token"])
def test_quantize_activation_is_the_scheme_s_quantize_call(scheme):
    """The one scheme -> call mapping, pinned against the explicit calls DESIGN.md names."""
    rng = np.random.default_rng(61)  # its own: the module's RNG feeds the tests below
    w = _weight(24, 48, scheme, per_channel=False, bias=False, rng=rng)
    x = rng.standard_normal((5, 48)).astype(np.float32)
    want = {
        "static": lambda: vt.quantize_fp8(x, w.input_scale),
        "dynamic": lambda: vt.quantize_fp8(x),
        "per_token": lambda: vt.quantize_fp8(x, per_token=True),
    }[scheme]()
    got = seam.quantize_activation(x, w)
    assert got.scheme == scheme == want.scheme
    np.testing.assert_array_equal(got.data, want.data)
    np.testing.assert_array_equal(got.scale, want.scale)
    assert np.count_nonzero(got.data) > 0


def _bits(y):
    return np.ascontiguousarray(y).view(np.uint8)


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_equals_prequant_bitwise_and_the_float64_oracle(scheme, per_channel, dtype):
    m, n, k = 5, 24, 40
    w = _weight(n, k, scheme, per_channel, bias=True)
    x = (RNG.standard_normal((m, k)) * 2).astype(dtype)
    y = seam.matmul_fp8(x, w)
    assert y.dtype == np.dtype(dtype) and y.shape == (m, n)
    q = seam.quantize_activation(x, w)
    y_pre = seam.matmul_fp8_prequant(q, w, out_dtype=dtype)
    np.testing.assert_array_equal(_bits(y), _bits(y_pre))
    # G3: the float64 oracle over the same lossy pipeline, quantized by the independent reference
    qr = reference.quantize(x, w.input_scale if scheme == "static" else None, per_token=scheme == "per_token")
    np.testing.assert_array_equal(q.data, qr.data)
    ref, bound = reference.scaled_mm(qr.data, w.data, qr.scale, w.weight_scale, w.bias)
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= bound + reference.out_rounding(ref, dtype))
    assert np.count_nonzero(ref) == m * n  # the gate compared real outputs


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token"])
def test_leading_dimensions_are_flattened_and_restored(scheme):
    w = _weight(16, 32, scheme, per_channel=True, bias=False)
    x = RNG.standard_normal((2, 3, 32)).astype(np.float32)
    y = seam.matmul_fp8(x, w)
    assert y.shape == (2, 3, 16)
    np.testing.assert_array_equal(y.reshape(6, 16), seam.matmul_fp8(x.reshape(6, 32), w))
    y1 = seam.matmul_fp8(x[0, 0], w)  # a single token [K] -> [N]
    assert y1.shape == (16,)
    np.testing.assert_array_equal(y1, seam.matmul_fp8(x[0, :1], w)[0])
    # prequantized N-D codes (per-tensor schemes quantize any shape)
    if scheme != "per_token":
        q = seam.quantize_activation(x, w)
        np.testing.assert_array_equal(seam.matmul_fp8_prequant(q, w), y)


def test_out_dtype_default_and_names():
    w = _weight(16, 32, "dynamic", per_channel=False, bias=True)
    x = RNG.standard_normal((4, 32)).astype(ml_dtypes.bfloat16)
    assert seam.matmul_fp8(x, w).dtype == np.dtype(ml_dtypes.bfloat16)
    y32 = seam.matmul_fp8(x, w, out_dtype="float32")
    assert y32.dtype == np.float32
    np.testing.assert_array_equal(_bits(seam.matmul_fp8(x, w, out_dtype="f16")), _bits(y32.astype(np.float16)))
    assert seam.matmul_fp8_prequant(vt.quantize_fp8(x), w).dtype == np.float32


def test_resident_and_host_weight_give_the_same_bits():
    w = seam.Fp8Weight.from_float(
        RNG.standard_normal((16, 32)).astype(np.float32), bias=RNG.standard_normal(16).astype(ml_dtypes.bfloat16)
    )
    x = RNG.standard_normal((3, 32)).astype(np.float32)
    np.testing.assert_array_equal(seam.matmul_fp8(x, seam.ResidentFp8(w, "cpu")), seam.matmul_fp8(x, w))


def test_the_lever_is_the_one_declared_in_config(monkeypatch):
    assert seam.dense_cublaslt_fp8_enabled is _config.dense_cublaslt_fp8_enabled
    monkeypatch.delenv("VT_DENSE_CUBLASLT_FP8", raising=False)
    assert seam.dense_cublaslt_fp8_enabled() is True  # on by default
    for value, expected in (
        ("1", True),
        ("0", False),
        ("0ff", False),
        ("00", False),
        ("", True),
        ("off", True),
        ("false", True),
        ("yes", True),
    ):
        monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", value)  # read at every call: flips live
        assert seam.dense_cublaslt_fp8_enabled() is expected, value


# -- bad input ------------------------------------------------------------------------------


def test_mismatched_k_is_refused_naming_both_shapes():
    w = _weight(16, 32, "dynamic", per_channel=False, bias=False)
    with pytest.raises(
        ValueError,
        match=r"x must be \[\.\.\., K\] with K = 32 \(the weight is \[N, K\] = \(16, 32\)\), got shape \(4, 31\)",
    ):
        seam.matmul_fp8(np.ones((4, 31), np.float32), w)
    with pytest.raises(ValueError, match="q.data must be"):
        seam.matmul_fp8_prequant(vt.quantize_fp8(np.ones((4, 31), np.float32)), w)
    with pytest.raises(ValueError, match="x must be"):
        seam.matmul_fp8(np.zeros((), np.float32), w)


@pytest.mark.parametrize(
    "weight_scheme, q_kwargs, got",
    [
        ("static", {}, "dynamic"),
        ("dynamic", {"per_token": True}, "per_token"),
        ("per_token", {"scale": 0.5}, "static"),
    ],
)
def test_prequant_of_the_wrong_scheme_is_refused(weight_scheme, q_kwargs, got):
    w = _weight(16, 32, weight_scheme, per_channel=False, bias=False)
    q = vt.quantize_fp8(np.ones((4, 32), np.float32), **q_kwargs)
    with pytest.raises(
        ValueError, match=f"q.scheme must be the weight's activation_scheme '{weight_scheme}', got '{got}'"
    ):
        seam.matmul_fp8_prequant(q, w)


def test_other_bad_inputs():
    w = _weight(16, 32, "dynamic", per_channel=False, bias=False)
    with pytest.raises(TypeError, match="weight must be an Fp8Weight or a ResidentFp8, got ndarray"):
        seam.matmul_fp8(np.ones((2, 32), np.float32), np.ones((16, 32), np.float32))
    with pytest.raises(TypeError, match="x must be a float32, float16 or bfloat16"):
        seam.matmul_fp8(np.ones((2, 32), np.int32), w)
    with pytest.raises(TypeError, match="q must be a vt.QuantizedActivation"):
        seam.matmul_fp8_prequant(np.ones((2, 32), np.uint8), w)
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        seam.matmul_fp8(np.ones((2, 32), np.float32), w, out_dtype="float64")


# -- a two-layer MLP through the seam -------------------------------------------------------


def _gelu64(v):
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v**3)))


def test_two_layer_mlp_through_the_seam():
    d, h, m = 64, 128, 8
    w_up = (RNG.standard_normal((h, d)) / np.sqrt(d)).astype(np.float32)
    b_up = (RNG.standard_normal(h) * 0.1).astype(np.float32)
    w_down = (RNG.standard_normal((d, h)) / np.sqrt(h)).astype(np.float32)
    calib = RNG.standard_normal((32, d)).astype(np.float32)
    x = RNG.standard_normal((m, d)).astype(np.float32)
    # static input scale calibrated on other inputs (amax / 448), as a ModelOpt checkpoint carries
    up = seam.make_linear_method(seam.Fp8Weight.from_float(w_up, input_scale=np.abs(calib).max() / 448.0, bias=b_up))
    down = seam.make_linear_method(seam.Fp8Weight.from_float(w_down, per_channel=True, activation_scheme="per_token"))
    assert (up.name, down.name) == ("fp8_w8a8", "fp8_w8a8")

    y1 = up.apply(x)
    hidden = _gelu64(y1.astype(np.float64)).astype(np.float32)
    y2 = down.apply(hidden)
    assert y2.shape == (m, d) and y2.dtype == np.float32

    # each layer within G3 of the float64 oracle on the very input it saw
    for layer, inp, out in ((up, x, y1), (down, hidden, y2)):
        wt = layer.weight
        q = reference.quantize(inp, wt.input_scale, per_token=wt.activation_scheme == "per_token")
        ref, bound = reference.scaled_mm(q.data, wt.data, q.scale, wt.weight_scale, wt.bias)
        assert np.all(np.abs(out - ref) <= bound + reference.out_rounding(ref, np.float32))
    # and the whole MLP close to the float64 model with the original float weights (FP8's accuracy)
    exact = _gelu64(x.astype(np.float64) @ w_up.T.astype(np.float64) + b_up) @ w_down.T.astype(np.float64)
    rel = np.linalg.norm(y2 - exact) / np.linalg.norm(exact)
    assert 0 < rel < 0.06, rel
