"""Block-scaled FP8 at the op boundary and through the seam (CPU, CI): ``vt.quantize_fp8(x,
group_size=g)`` and ``vt.scaled_mm(..., block_size=(bn, bk))`` against the oracle, hypothesis over
block sizes, N and K not multiples of the block, extreme scale ranges; every bad input refused with
its name; the seam's per-group scheme (matmul_fp8 == prequant bitwise). The kernels themselves are
tests/test_block_cpu.py's."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vtnumba as vt
from vtnumba import seam
from vtnumba.testing import reference
from vtnumba.testing.gates import assert_block_g3

BF16 = np.dtype(ml_dtypes.bfloat16)


@st.composite
def block_problems(draw):
    m = draw(st.integers(1, 20))
    n = draw(st.integers(1, 70))
    k = draw(st.integers(1, 160))
    bn = draw(st.integers(1, 64))
    bk = draw(st.integers(1, 64))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-3, 3, size=(m, 1))).astype(np.float32)
    w = rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8) | (rng.integers(0, 2, size=(n, k), dtype=np.uint8) << 7)
    sb = (10.0 ** rng.uniform(-8, 4, size=(-(-n // bn), -(-k // bk)))).astype(np.float32)
    out = draw(st.sampled_from([np.float32, np.float16, BF16]))
    bias = rng.standard_normal(n).astype(np.float32) if draw(st.booleans()) else None
    return x, w, sb, (bn, bk), out, bias


@settings(max_examples=60, deadline=None)
@given(block_problems())
def test_group_quant_then_block_gemm_within_block_g3(problem):
    x, w, sb, (bn, bk), out, bias = problem
    q = vt.quantize_fp8(x, group_size=bk)
    want = reference.quantize_per_group(x, bk)
    np.testing.assert_array_equal(q.data, want.data)
    np.testing.assert_array_equal(q.scale, want.scale)
    y = vt.scaled_mm(q.data, w, q.scale, sb, out_dtype=out, bias=bias, block_size=(bn, bk))
    assert assert_block_g3(y, q.data, w, q.scale, sb, (bn, bk), bias, out, require_nonzero=False) == y.size


def test_column_major_scales_give_the_same_product():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 256)).astype(BF16)
    w = rng.integers(0, 0x7E, size=(130, 256), dtype=np.uint8)
    sb = rng.uniform(1e-3, 1e-2, size=(2, 2)).astype(np.float32)
    q_row = vt.quantize_fp8(x, group_size=128)
    q_col = vt.quantize_fp8(x, group_size=128, column_major_scales=True)
    assert q_col.scale.strides == (4, 24) and q_row.scale.strides == (8, 4)
    np.testing.assert_array_equal(q_row.scale, q_col.scale)
    y_row = vt.scaled_mm(q_row.data, w, q_row.scale, sb, block_size=(128, 128))
    y_col = vt.scaled_mm(q_col.data, w, q_col.scale, sb, block_size=(128, 128))
    np.testing.assert_array_equal(y_row, y_col)
    assert np.count_nonzero(y_row) > 0


def test_bad_block_inputs_are_refused_by_name():
    a = np.ones((4, 256), np.uint8)
    b = np.ones((130, 256), np.uint8)
    sa, sb = np.ones((4, 2), np.float32), np.ones((2, 2), np.float32)
    for block in [(0, 128), (128, -1), (128,), "128x128", (1.5, 128)]:
        with pytest.raises(ValueError, match="block_size must be"):
            vt.scaled_mm(a, b, sa, sb, block_size=block)
    with pytest.raises(ValueError, match=r"scale_a must have shape \(4, 2\)"):
        vt.scaled_mm(a, b, np.ones((4, 3), np.float32), sb, block_size=(128, 128))
    with pytest.raises(ValueError, match=r"scale_b must have shape \(2, 2\)"):
        vt.scaled_mm(a, b, sa, np.ones((1, 2), np.float32), block_size=(128, 128))
    with pytest.raises(ValueError, match="scale_a must be a 2-D array"):
        vt.scaled_mm(a, b, np.float32(1), sb, block_size=(128, 128))
    with pytest.raises(ValueError, match="scale_b must be finite"):
        vt.scaled_mm(a, b, sa, np.full((2, 2), np.nan, np.float32), block_size=(128, 128))
    x = np.ones((4, 256), np.float32)
    for g in (0, -128, 1.5, True):
        with pytest.raises(ValueError, match="group_size must be a positive int"):
            vt.quantize_fp8(x, group_size=g)
    with pytest.raises(ValueError, match="group_size=128 takes no scale"):
        vt.quantize_fp8(x, 0.5, group_size=128)
    with pytest.raises(ValueError, match="apply to group_size quantization only"):
        vt.quantize_fp8(x, scale_ue8m0=True)


def test_seam_per_group_scheme_matches_prequant_and_refuses_mismatches():
    rng = np.random.default_rng(2)
    w = seam.Fp8Weight.from_float(
        rng.standard_normal((260, 384)).astype(np.float32) * 0.05, block_size=(128, 128), scale_ue8m0=True
    )
    x = rng.standard_normal((2, 5, 384)).astype(np.float32)  # [..., K]
    y = seam.matmul_fp8(x, w)
    q = seam.quantize_activation(x.reshape(-1, 384), w)
    assert q.scheme == "per_group" and q.group_size == 128
    assert np.all(np.log2(q.scale) == np.round(np.log2(q.scale)))  # UE8M0: powers of two
    np.testing.assert_array_equal(y.reshape(-1, 260), seam.matmul_fp8_prequant(q, w))
    exact = x @ w.dequantize().T
    assert np.linalg.norm(y - exact) <= 0.1 * np.linalg.norm(exact)
    with pytest.raises(ValueError, match="q.scheme must be the weight's activation_scheme 'per_group'"):
        seam.matmul_fp8_prequant(vt.quantize_fp8(x.reshape(-1, 384)), w)
    with pytest.raises(ValueError, match="q.group_size must be the weight's bk = 128"):
        seam.matmul_fp8_prequant(vt.quantize_fp8(x.reshape(-1, 384), group_size=64), w)
    per_tensor = seam.Fp8Weight.from_float(rng.standard_normal((8, 384)).astype(np.float32))
    with pytest.raises(ValueError, match="q.scheme must be the weight's activation_scheme 'dynamic'"):
        seam.matmul_fp8_prequant(q, per_tensor)
    resident = seam.ResidentFp8(w, "cpu")
    assert resident.nbytes == 260 * 384 + 4 * 3 * 3
    np.testing.assert_array_equal(seam.matmul_fp8(x, resident), y)
