"""MXFP8 on a real GPU (the H200 run proves these, CI skips them): the MX quantization
kernels give the CPU's bytes, the GEMM picks the tensor-core MX kernel and meets the G3-per-block bound,
a NaN scale byte poisons only its row or column, and the seam's MXFP8 layer on the GPU meets the bound
from the CPU's own quantization of the same input (the codes and scales are bytes, equal on both)."""

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba import seam
from vtnumba.testing.gates import assert_block_g3

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)


def _device(cp, x):
    """x on the GPU; bfloat16 travels as its bits (cupy has no bfloat16)."""
    return cp.asarray(x.view(np.uint16)).view(BF16) if x.dtype == BF16 else cp.asarray(x)


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("m,k", [(3, 64), (17, 96), (5, 70), (64, 4096)])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_mx_quantization_on_the_gpu_gives_the_cpu_bytes(cp, dtype, m, k, rounding):
    rng = np.random.default_rng(m * k)
    x = (rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-6, 6, size=(m, k))).astype(np.float32)
    x[0, 3] = np.nan
    x[-1, :32] = 0  # an all-zero group: byte 0
    x = x.astype(dtype)
    want = vt.quantize_fp8(x, group_size=32, scale_format="e8m0", scale_rounding=rounding)
    got = vt.quantize_fp8(_device(cp, x), group_size=32, scale_format="e8m0", scale_rounding=rounding)
    assert got.scale.dtype == np.uint8 and got.scale.shape == (m, -(-k // 32))
    np.testing.assert_array_equal(cp.asnumpy(got.data), want.data)
    np.testing.assert_array_equal(cp.asnumpy(got.scale), want.scale)
    assert len(np.unique(want.scale)) > 3 and np.count_nonzero(want.data) > x.size // 2


def _mx_operands(rng, m, n, k, lo=110, hi=140):
    a = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
    b = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    a[(a & 0x7F) == 0x7F] = 0x44  # no NaN codes: the bound is about finite sums
    b[(b & 0x7F) == 0x7F] = 0x44
    nkb = -(-k // 32)
    return (
        a,
        b,
        rng.integers(lo, hi, size=(m, nkb), dtype=np.uint8),
        rng.integers(lo, hi, size=(n, nkb), dtype=np.uint8),
    )


# decode and prefill rows, partial tiles, K with a last k32 step past K, a Llama-sized one
@pytest.mark.parametrize("m,n,k", [(1, 64, 96), (16, 136, 256), (33, 20, 96), (300, 264, 320), (128, 4096, 4096)])
@pytest.mark.parametrize("out_dtype,with_bias", [(F32, False), (BF16, True)])
def test_mx_gemm_on_the_gpu_runs_the_tensorcore_mx_kernel_within_block_g3(cp, m, n, k, out_dtype, with_bias):
    from vtnumba.cuda import block

    rng = np.random.default_rng(m + n + k)
    a, b, sa, sb = _mx_operands(rng, m, n, k)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    da, db, dsa, dsb = (cp.asarray(v) for v in (a, b, sa, sb))
    call = block.BlockCall(da, db, dsa, dsb, (1, 32), out_dtype, None if bias is None else cp.asarray(bias))
    assert block.select(call).name == "tensorcore_mx"  # the kernel that runs, not only the answer
    from vtnumba.cuda.kernels import tc_gemm

    _, grid, _, _ = tc_gemm.gemm_launch(call, None, False)  # and its tile: small ones at small M
    bm, bn = tc_gemm.tile_shape(tc_gemm.mx_config(m))
    assert grid == (-(-n // bn), -(-m // bm)) and (bm, bn) == (
        (16, 32) if m <= 64 else (32, 64) if m <= 256 else (128, 128)
    )
    y = vt.scaled_mm(
        da, db, dsa, dsb, out_dtype=out_dtype, block_size=(1, 32), bias=None if bias is None else cp.asarray(bias)
    )
    assert assert_block_g3(cp.asnumpy(y), a, b, sa, sb, (1, 32), bias, out_dtype) > m * n // 2
    tiled = vt.scaled_mm(
        da,
        db,
        dsa,
        dsb,
        out_dtype=out_dtype,
        block_size=(1, 32),
        kernel="tiled_block",
        bias=None if bias is None else cp.asarray(bias),
    )
    assert assert_block_g3(cp.asnumpy(tiled), a, b, sa, sb, (1, 32), bias, out_dtype) > m * n // 2


def test_a_nan_scale_byte_poisons_its_row_and_column_on_the_gpu(cp):
    rng = np.random.default_rng(9)
    a, b, sa, sb = _mx_operands(rng, 18, 12, 64)
    sa[4, 1] = 0xFF
    sb[7, 0] = 0xFF
    y = cp.asnumpy(vt.scaled_mm(*(cp.asarray(v) for v in (a, b, sa, sb)), block_size=(1, 32)))
    nan = np.isnan(y)
    assert nan[4].all() and nan[:, 7].all() and nan.sum() == 12 + 18 - 1


@pytest.mark.parametrize("m", [1, 16, 77])
def test_the_seam_mx_layer_on_the_gpu_meets_the_bound_of_the_cpu_quantization(cp, m):
    rng = np.random.default_rng(m)
    n, k = 96, 160
    w = seam.Fp8Weight.from_float(
        (rng.standard_normal((n, k)) * 0.05).astype(np.float32),
        block_size=(1, 32),
        scale_format="e8m0",
        bias=rng.standard_normal(n).astype(np.float32),
    )
    x = rng.standard_normal((m, k)).astype(BF16)
    layer = seam.make_linear_method(seam.ResidentFp8(w, "cuda"))
    y = cp.asnumpy(layer.apply(_device(cp, x)))
    assert y.dtype == BF16 and y.shape == (m, n)
    q = vt.quantize_fp8(x, group_size=32, scale_format="e8m0")
    assert assert_block_g3(y, q.data, w.data, q.scale, w.weight_scale, (1, 32), w.bias, BF16) > m * n // 2
