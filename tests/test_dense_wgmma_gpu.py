"""The dense decode layer on the swapped wgmma pass (sm_90; kernels/tc_gemv.py, "the dense decode
layer on the swapped wgmma pass"), on the H200 (marker ``gpu``; skipped on other GPUs, where the
launch does not exist):

- which kernel runs: a decode call of one row of static, dynamic or per-token activations binds the
  one ``dense_gemv_wgmma`` launch in eager code and in a graph capture alike; two rows, 1 x 128
  groups, a weight of more tiles than half the multiprocessors, the lever off or the kernel disabled
  bind what they bound before;
- the answers: within the tensor-core bound of the float64 reference for shapes whose N is not a
  multiple of the 64-row tile and whose K is not one of the 128-code stage, every split of K over a
  cluster (1, 2, 4, 8 blocks) the same bytes run after run;
- what stays bitwise: the bound call, the full path, quantize-then-GEMV (``matmul_fp8_prequant``,
  the codes form of the launch) and a graph replay give the same bytes.
"""

import ml_dtypes
import numpy as np
import pytest
from kernel_names import DENSE_WGMMA_KERNEL, FUSED_KERNEL

from vtnumba import seam
from vtnumba.testing import gates
from vtnumba.testing.devices import to_device, to_host

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(90)
SCHEMES = ["static", "dynamic", "per_token"]


@pytest.fixture
def sm90(cp):
    if cp.cuda.Device().compute_capability != "90":
        pytest.skip(f"the dense wgmma launch runs on sm_90 only, this GPU is sm_{cp.cuda.Device().compute_capability}")
    return cp


def _weight(n, k, scheme):
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    if scheme == "per_group":
        return seam.Fp8Weight.from_float(w, block_size=(128, 128))
    return seam.Fp8Weight.from_float(
        w,
        input_scale=np.float32(4.0 / 448) if scheme == "static" else None,
        per_channel=scheme == "per_token",
        activation_scheme=scheme,
        bias=RNG.standard_normal(n).astype(np.float32),
    )


def _check_bound(y, x, w):
    """y within the tensor-core bound of the float64 reference of x's quantization (the CPU's)."""
    q = seam.quantize_activation(to_host(x), w)
    if w.block_size is not None:
        return gates.assert_block_g3(
            y, q.data, w.data, q.scale, w.weight_scale, w.block_size, None, BF16, tensor_core=True
        )
    return gates.assert_g3(y, q.data, w.data, q.scale, w.weight_scale, w.bias, BF16, tensor_core=True)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,k", [(200, 768), (512, 2048), (96, 2176), (4096, 4096)])
def test_a_decode_call_is_the_dense_wgmma_launch_in_both_regimes(sm90, scheme, n, k):
    import vtnumba.cuda as vcuda

    m = 1
    w = _weight(n, k, scheme)
    layer = seam.make_linear_method(seam.ResidentFp8(w, "cuda"))
    x = to_device((RNG.standard_normal((m, k)) * 2).astype(BF16), "cuda")
    y = layer.apply(x, BF16)
    (binding,) = layer.weight.weight.bound_calls.values()
    assert binding.eager.kernels == (DENSE_WGMMA_KERNEL,) and not binding.by_regime, binding.explain()
    assert binding.eager.scratch_bytes == 0
    compared = _check_bound(y, x, w)
    assert compared >= m * n // 2
    # the bound call, the full path and quantize-then-GEMV (the codes form): the same bytes
    bits = to_host(y).view(np.uint16)
    np.testing.assert_array_equal(to_host(layer.apply(x, BF16)).view(np.uint16), bits)
    q = seam.quantize_activation(x, layer.weight)
    np.testing.assert_array_equal(to_host(layer.apply_prequant(q, BF16)).view(np.uint16), bits)
    # and a graph replay
    step = vcuda.capture(lambda a: layer.apply(a, BF16), x)
    np.testing.assert_array_equal(to_host(step(x)).view(np.uint16), bits)


@pytest.mark.parametrize("split", [1, 2, 4, 8])
def test_every_split_of_k_holds_the_bound_and_repeats_its_bytes(sm90, split):
    from vtnumba.cuda.kernels import tc_gemv
    from vtnumba.cuda.kernels.epilogue import empty_out
    from vtnumba.cuda.runtime import device

    dev = device.current()
    n, k, m = 320, 2048, 2
    w = _weight(n, k, "per_token")
    resident = seam.ResidentFp8(w, "cuda")
    x = to_device((RNG.standard_normal((m, k)) * 2).astype(BF16), "cuda")
    sb = resident.weight.weight_scale
    outs = []
    for _ in range(2):
        y, y_bits = empty_out(m, n, BF16)
        kernel, grid, block, args, shared = tc_gemv.dense_wgmma_launch(
            m, x.view(np.uint16), tc_gemv.X_KIND[BF16], dev.scalar(0.0), resident.weight.data,
            dev.placeholder("f32"), sb, 1, BF16, resident.weight.bias, tc_gemv.MODE_PER_TOKEN, False, y_bits, dev,
            plan=(split, 3),
        )  # fmt: skip
        assert grid == (-(-n // 64), split)
        kernel(grid, block, *args, shared_mem=shared)
        outs.append(to_host(y).view(np.uint16))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert _check_bound(outs[0].view(BF16), x, w) >= m * n // 2


def test_what_does_not_take_the_dense_wgmma_launch(sm90, monkeypatch):
    def bound_kernels(scheme, m):
        layer = seam.make_linear_method(seam.ResidentFp8(_weight(256, 512, scheme), "cuda"))
        layer.apply(to_device(RNG.standard_normal((m, 512)).astype(BF16), "cuda"), BF16)
        (binding,) = layer.weight.weight.bound_calls.values()
        return binding.eager.kernels

    assert bound_kernels("static", 1) == (DENSE_WGMMA_KERNEL,)
    assert bound_kernels("static", 2) == (FUSED_KERNEL,)  # chosen for one row (the 8-row quantizer is slow)
    assert bound_kernels("per_group", 1) == (FUSED_KERNEL,)  # the block GEMV is as fast with groups
    big = seam.make_linear_method(seam.ResidentFp8(_weight(8448, 256, "per_token"), "cuda"))
    big.apply(to_device(RNG.standard_normal((1, 256)).astype(BF16), "cuda"), BF16)
    (binding,) = big.weight.weight.bound_calls.values()
    assert DENSE_WGMMA_KERNEL not in binding.eager.kernels  # 132 tiles: no split, cuBLASLt reads it faster
    monkeypatch.setenv("VT_DISABLE_KERNELS", DENSE_WGMMA_KERNEL)
    assert bound_kernels("per_token", 1) == (FUSED_KERNEL,)
    monkeypatch.delenv("VT_DISABLE_KERNELS")
    monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", "0")  # strict G3: the tensor-core bound is not enough
    assert bound_kernels("per_token", 1) == (FUSED_KERNEL,)
    monkeypatch.delenv("VT_DENSE_CUBLASLT_FP8")
    monkeypatch.setenv("VT_DECODE_PATH", "split")
    assert bound_kernels("per_token", 1) != (DENSE_WGMMA_KERNEL,)
