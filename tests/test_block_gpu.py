"""Block-scaled FP8 on a real GPU (marker ``gpu``; the H200 run proves them): the per-group
quantization kernel gives the CPU's bytes; every block kernel meets its bound (cuBLASLt's block
scaling the tensor-core one, the tensor-core and tiled kernels strict G3 per block) on layer-like and
on uniformly drawn codes; forcing cuBLASLt's block modes off (as on sm_89 and GB10) routes to the
tensor-core kernels, then to the tiled one; the seam's per-group scheme equals its prequant path
bitwise; decode (M = 1) never reaches cuBLASLt's block mode, which refuses it."""

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba import seam
from vtnumba.testing.devices import to_device, to_host
from vtnumba.testing.gates import assert_block_g3

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)


def _layer_codes(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return (x * np.float32(448.0) / np.abs(x).max()).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _uniform_codes(rng, shape):
    c = rng.integers(0, 256, size=shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = 0x3C
    return c


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16])
@pytest.mark.parametrize("ue8m0, column_major", [(False, False), (True, True)])
def test_group_quant_gives_the_cpu_bytes(cp, dtype, ue8m0, column_major):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((33, 4160)) * rng.uniform(0.01, 100, size=(33, 1))).astype(dtype)
    x[0, 7], x[1, 9] = np.nan, np.inf
    q = vt.quantize_fp8(to_device(x, "cuda"), group_size=128, scale_ue8m0=ue8m0, column_major_scales=column_major)
    want = vt.quantize_fp8(x, group_size=128, scale_ue8m0=ue8m0)
    np.testing.assert_array_equal(to_host(q.data), want.data)
    np.testing.assert_array_equal(to_host(q.scale).view(np.uint32), want.scale.view(np.uint32))
    assert np.count_nonzero(want.data) > x.size // 2


KERNELS = ["cublaslt_block", "tensorcore_block", "tensorcore_block_gemv", "tiled_block"]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m", [4, 16, 256])
@pytest.mark.parametrize("codes", ["layer", "uniform"])
def test_every_block_kernel_within_its_bound(cp, kernel, m, codes):
    if kernel == "tensorcore_block_gemv" and m > 16:
        pytest.skip("the GEMV takes M <= 16 (covered by its refusal)")
    rng = np.random.default_rng(m)
    n, k = 384, 1024
    make = _layer_codes if codes == "layer" else _uniform_codes
    a, b = make(rng, (m, k)), make(rng, (n, k))
    sa = rng.uniform(1e-3, 1e-1, size=(m, k // 128)).astype(np.float32)
    sb = rng.uniform(1e-4, 1e-2, size=(n // 128, k // 128)).astype(np.float32)
    y = vt.scaled_mm(
        cp.asarray(a),
        cp.asarray(b),
        cp.asarray(sa),
        cp.asarray(sb),
        out_dtype=BF16,
        block_size=(128, 128),
        kernel=kernel,
    )
    compared = assert_block_g3(y, a, b, sa, sb, (128, 128), None, BF16, tensor_core=kernel == "cublaslt_block")
    assert compared > m * n // 2


def test_block_kernel_choice_follows_capability(cp, monkeypatch):
    from vtnumba.cuda import block

    rng = np.random.default_rng(3)
    a, b = cp.asarray(_layer_codes(rng, (16, 512))), cp.asarray(_layer_codes(rng, (256, 512)))
    sa, sb = cp.ones((16, 4), cp.float32), cp.ones((2, 4), cp.float32)

    def chosen(m=8, regime=None):
        return block.select(block.BlockCall(a[:m], b, sa[:m], sb, (128, 128), BF16, None), regime=regime).name

    # the default decode path: the tensor-core GEMV first in eager code at M <= 16, cuBLASLt in a graph
    assert chosen() == "tensorcore_block_gemv"
    assert chosen(16) == "tensorcore_block_gemv"
    assert chosen(regime="graph") == "cublaslt_block"
    monkeypatch.setenv("VT_DECODE_PATH", "split")  # the device-time order in both regimes
    assert chosen() == "cublaslt_block"
    assert chosen(1) == "tensorcore_block_gemv"  # cuBLASLt refuses M = 1
    monkeypatch.setenv("VT_DISABLE_KERNELS", "cublaslt_block")  # as on sm_89 / GB10
    assert chosen() == "tensorcore_block_gemv"
    monkeypatch.setenv("VT_DISABLE_KERNELS", "cublaslt_block,tensorcore_block_gemv,tensorcore_block")
    assert chosen() == "tiled_block"
    monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", "0")
    monkeypatch.delenv("VT_DISABLE_KERNELS")
    assert chosen() == "tensorcore_block_gemv"


@pytest.mark.parametrize("m", [1, 4, 64])
@pytest.mark.parametrize("lever", ["1", "0"])
def test_seam_per_group_on_the_gpu(cp, monkeypatch, m, lever):
    monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", lever)
    rng = np.random.default_rng(4)
    w_host = seam.Fp8Weight.from_float(
        (rng.standard_normal((512, 768)) * 0.05).astype(np.float32), block_size=(128, 128)
    )
    layer = seam.make_linear_method(seam.ResidentFp8(w_host, "cuda"))
    x = to_device(rng.standard_normal((m, 768)).astype(BF16), "cuda")
    y = layer.apply(x)
    q = seam.quantize_activation(x, layer.weight)
    np.testing.assert_array_equal(to_host(y).view(np.uint16), to_host(layer.apply_prequant(q, BF16)).view(np.uint16))
    qh = vt.quantize_fp8(to_host(x), group_size=128)
    np.testing.assert_array_equal(to_host(q.data), qh.data)
    compared = assert_block_g3(
        y, qh.data, w_host.data, qh.scale, w_host.weight_scale, (128, 128), None, BF16, tensor_core=lever == "1"
    )
    assert compared > m * 512 // 2
