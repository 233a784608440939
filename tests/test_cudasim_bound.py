"""The bound call (vtnumba.cuda.bound, the seam's GPU fast path) under the CUDA simulator (CI):
prepared launches replay exactly the launches of the full path, call after call with new inputs,
for every activation scheme and both GEMM kernels the simulator has (the decode GEMV and the tiled
GEMM). The real-GPU half (cuBLASLt bound, the seam's per-call checks) is tests/test_seam_gpu.py."""

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.cudasim

BF16 = np.dtype(ml_dtypes.bfloat16)


def _full_path(backend, x, w, out_dtype):
    """What matmul_fp8 runs without a binding: the backend's quantization, then its scaled_mm."""
    if w.activation_scheme == "per_token":
        codes, scale = backend.quantize_per_token(x, None)
        scale = scale.reshape(-1)
    elif w.activation_scheme == "dynamic":
        codes, scale = backend.quantize_dynamic(x)
    elif w.activation_scheme == "static":
        codes, scale = backend.quantize_static(x, w.input_scale), backend.scale_array(w.input_scale)
    else:
        codes, scale = backend.quantize_per_group(x, w.block_size[1], False, True)
        return backend.block_scaled_mm(codes, w.data, scale, w.weight_scale, w.block_size, out_dtype, w.bias, None)
    return backend.scaled_mm(codes, w.data, scale, w.weight_scale, out_dtype, w.bias, None)


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token", "per_group"])
@pytest.mark.parametrize("m, x_dtype, out_dtype", [(2, BF16, BF16), (9, np.float32, np.float32)])  # GEMV; tiled
def test_bound_call_replays_the_full_path_bitwise(scheme, m, x_dtype, out_dtype):
    import vtnumba.cuda as backend
    from vtnumba import seam
    from vtnumba.cuda.bound import BoundLinear

    rng = np.random.default_rng(m)
    n, k = 24, 64
    codes = rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8)
    bias = rng.standard_normal(n).astype(np.float32)
    if scheme == "per_group":  # 8 x 16 blocks: the tiled block kernel, scales per block
        w = seam.Fp8Weight(
            codes, rng.uniform(0.001, 0.01, size=(3, 4)).astype(np.float32), bias=bias, block_size=(8, 16)
        )
    else:
        w = seam.Fp8Weight(
            codes,
            rng.uniform(0.001, 0.01, size=n).astype(np.float32),
            bias=bias,
            input_scale=np.float32(0.02) if scheme == "static" else None,
            activation_scheme=scheme,
        )
    out_dtype = np.dtype(out_dtype)
    xs = [(rng.standard_normal((m, k)) * 3).astype(x_dtype) for _ in range(3)]
    bound = BoundLinear(xs[0], w, out_dtype)
    compared = 0
    for x in xs:  # new inputs through the same binding: only the input pointer changes
        want = _full_path(backend, x, w, out_dtype)
        got = bound(x, 0)
        assert got.dtype == out_dtype and got.shape == (m, n)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        compared += int(np.count_nonzero(want.astype(np.float32)))
    assert compared > 2 * m * n


@pytest.mark.parametrize("scheme", ["static", "per_group"])
def test_the_fused_decode_binding_replays_the_unbound_fused_layer_bitwise(scheme):
    """The one-launch decode binding (``BoundLinear(..., fused=True)``, what an eager call at M <= 16
    replays): new inputs through the same prepared launch give the bytes of the fused tensor-core
    layer run unbound, with no scratch block and one launch."""
    from vtnumba import seam
    from vtnumba.cuda.bound import FUSED_KERNEL, BoundLinear, _fused_arguments
    from vtnumba.cuda.kernels import tc_gemv

    rng = np.random.default_rng(5)
    m, n, k = 2, 16, 128
    codes = rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8)
    bias = rng.standard_normal(n).astype(np.float32)
    if scheme == "per_group":
        w = seam.Fp8Weight(codes, np.array([[0.004]], dtype=np.float32), bias=bias, block_size=(128, 128))
    else:
        w = seam.Fp8Weight(
            codes, rng.uniform(0.001, 0.01, size=n).astype(np.float32), bias=bias, input_scale=np.float32(0.02)
        )
    xs = [(rng.standard_normal((m, k)) * 3).astype(BF16) for _ in range(2)]
    bound = BoundLinear(xs[0], w, BF16, fused=True)
    assert bound.kernels == (FUSED_KERNEL,) and bound.scratch_bytes == 0 and not bound.quant_steps
    scale_b, input_scale, per_token, scale_ub, block_scales = _fused_arguments(w)
    compared = 0
    for x in xs:
        want = tc_gemv.fused_linear(
            x, w.data, scale_b, input_scale, per_token, scale_ub, BF16, w.bias, None, block_scales
        )
        got = bound(x, 0)
        assert got.dtype == BF16 and got.shape == (m, n)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        compared += int(np.count_nonzero(want.astype(np.float32)))
    assert compared > m * n
