"""Block-scaled FP8 on the GPU's Numba kernels under the CUDA simulator (CI): the per-group
quantization kernel gives the CPU's bytes and scales (row- and column-major, UE8M0, short last
groups, NaN / inf), and the tiled block kernel meets the G3-per-block bound for any block size,
short blocks along N and K, bias and every out dtype. cuBLASLt's block scaling is proven on the H200
(tests/test_block_gpu.py)."""

import ml_dtypes
import numpy as np
import pytest

from vtnumba.testing import reference
from vtnumba.testing.gates import assert_block_g3

pytestmark = [pytest.mark.cudasim, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
# (64, 16), (96, 32), (512, 128): a chunk a lane (1, 2 and 8 lanes a group); (160, 64), (48, 48):
# the 16-wide loop (a short last group, a group of three 16-element chunks); (70, 16), (40, 128):
# rows that are no multiple of 16, the element-per-lane kernel
@pytest.mark.parametrize("k,g", [(64, 16), (96, 32), (160, 64), (48, 48), (512, 128), (70, 16), (40, 128)])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("column_major", [False, True])
def test_group_quant_gives_the_cpu_bytes(dtype, k, g, ue8m0, column_major):
    import vtnumba.cuda as gpu
    from vtnumba import cpu

    rng = np.random.default_rng(k + g)
    x = (rng.standard_normal((3, k)) * rng.uniform(0.01, 100, size=(3, 1))).astype(dtype)
    x[0, 3] = np.nan
    x[1, 5] = np.inf
    x[2, :g] = 0  # an all-zero group: the eps clamp
    codes, scales = gpu.quantize_per_group(x, g, ue8m0, column_major)
    want_codes, want_scales = cpu.quantize_per_group(x, g, ue8m0, False)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(np.asarray(scales).view(np.uint32), want_scales.view(np.uint32))
    groups = -(-k // g)
    assert scales.shape == (3, groups)
    assert np.asarray(scales).strides == ((4, 4 * 3) if column_major else (4 * groups, 4))
    oracle = reference.quantize_per_group(x, g, ue8m0)
    np.testing.assert_array_equal(codes, oracle.data)
    assert np.count_nonzero(codes) > x.size // 2


@pytest.mark.parametrize("m,n,k,bn,bk", [(3, 40, 96, 16, 32), (5, 24, 72, 128, 128), (2, 33, 50, 8, 24)])
@pytest.mark.parametrize("out_dtype", [np.float32, BF16])
def test_tiled_block_kernel_meets_block_g3(m, n, k, bn, bk, out_dtype):
    from vtnumba.cuda import block

    rng = np.random.default_rng(m * n)
    a = rng.integers(0, 256, size=(m, k), dtype=np.uint8)
    a[(a & 0x7F) == 0x7F] = 0x3C
    b = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    b[(b & 0x7F) == 0x7F] = 0x3C
    nkb = -(-k // bk)
    sa = (10.0 ** rng.uniform(-6, 4, size=(m, nkb))).astype(np.float32)  # extreme ranges
    sb = (10.0 ** rng.uniform(-4, 2, size=(-(-n // bn), nkb))).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    y = block.block_scaled_mm(a, b, sa, sb, (bn, bk), np.dtype(out_dtype), bias, "tiled_block")
    assert assert_block_g3(y, a, b, sa, sb, (bn, bk), bias, out_dtype) > m * n // 2


def test_tiled_block_kernel_propagates_nan_codes():
    from vtnumba.cuda import block

    rng = np.random.default_rng(5)
    a = rng.integers(0, 0x7E, size=(2, 64), dtype=np.uint8)
    b = rng.integers(0, 0x7E, size=(16, 64), dtype=np.uint8)
    a[1, 40] = 0x7F
    sa, sb = np.ones((2, 2), np.float32), np.full((2, 2), 0.5, np.float32)
    y = block.block_scaled_mm(a, b, sa, sb, (8, 32), np.dtype(np.float32), None, None)
    assert np.isnan(y[1]).all() and not np.isnan(y[0]).any()
    assert assert_block_g3(y, a, b, sa, sb, (8, 32)) > 0


@pytest.mark.parametrize(
    "k,g,width,form",
    [
        (64, 16, 1, "lane"),
        (96, 32, 2, "lane"),
        (512, 128, 8, "lane"),
        (160, 64, 4, "16-wide"),
        (48, 48, 2, "16-wide"),
        (70, 16, None, "element"),
        (40, 128, None, "element"),
    ],
)
def test_group_quant_takes_the_16_wide_kernel_where_it_can(k, g, width, form):
    """Which kernel quantizes: a chunk a lane, read once, where every group is ``width`` whole
    chunks; the 16-wide loop with ``width`` lanes a group wherever rows and groups are multiples of
    16 on an aligned input; the element-per-lane one elsewhere."""
    from vtnumba.cuda import quantize as gpu
    from vtnumba.cuda.kernels import quant

    gpu._backend()
    x = np.zeros((3, k), np.float32)
    xin, kind, shape, n, aligned, _ = gpu._input(x)
    codes, scales = np.zeros((3, k), np.uint8), np.zeros((3, -(-k // g)), np.float32)
    ((kernel, _, threads, _),) = gpu._per_group_launches(
        xin, kind, shape, aligned, codes, scales, g, False, False, "portable"
    )
    if form == "element":
        assert kernel is quant.per_group_kernel(kind, "portable", False)[0]
    else:
        assert quant.group_width(g) == width
        assert kernel is quant.per_group_vector_kernel(kind, "portable", False, width, form == "lane")[0]
