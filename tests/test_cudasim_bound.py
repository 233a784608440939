"""The bound call (vtnumba.cuda.bound, the seam's GPU fast path) under the CUDA simulator (CI):
prepared launches replay exactly the launches of the full path, call after call with new inputs,
for every activation scheme and both GEMM kernels the simulator has (the decode GEMV and the tiled
GEMM). The real-GPU half (cuBLASLt bound, the seam's per-call checks) is tests/test_seam_gpu.py."""

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.cudasim

BF16 = np.dtype(ml_dtypes.bfloat16)


def _full_path(backend, x, w, ws, input_scale, per_token, out_dtype, bias):
    """What matmul_fp8 runs without a binding: the backend's quantization, then its scaled_mm."""
    if per_token:
        codes, scale = backend.quantize_per_token(x, None)
        scale = scale.reshape(-1)
    elif input_scale is None:
        codes, scale = backend.quantize_dynamic(x)
    else:
        codes, scale = backend.quantize_static(x, input_scale), backend.scale_array(input_scale)
    return backend.scaled_mm(codes, w, scale, ws, out_dtype, bias, None)


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token"])
@pytest.mark.parametrize("m, x_dtype, out_dtype", [(2, BF16, BF16), (9, np.float32, np.float32)])  # GEMV; tiled
def test_bound_call_replays_the_full_path_bitwise(scheme, m, x_dtype, out_dtype):
    import vtnumba.cuda as backend
    from vtnumba.cuda.bound import BoundLinear

    rng = np.random.default_rng(m)
    n, k = 24, 64
    w = rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8)
    ws = rng.uniform(0.001, 0.01, size=n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    input_scale = np.float32(0.02) if scheme == "static" else None
    per_token = scheme == "per_token"
    out_dtype = np.dtype(out_dtype)
    xs = [(rng.standard_normal((m, k)) * 3).astype(x_dtype) for _ in range(3)]
    bound = BoundLinear(xs[0], w, ws, input_scale, per_token, out_dtype, bias)
    compared = 0
    for x in xs:  # new inputs through the same binding: only the input pointer changes
        want = _full_path(backend, x, w, ws, input_scale, per_token, out_dtype, bias)
        got = bound(x, 0)
        assert got.dtype == out_dtype and got.shape == (m, n)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        compared += int(np.count_nonzero(want.astype(np.float32)))
    assert compared > 2 * m * n
