"""seam.Fp8Weight, ResidentFp8 and load accounting, fused shards (CPU half; the GPU half is in
test_seam_gpu.py)."""

import gc
import threading
import weakref

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba import seam
from vtnumba.testing import reference

RNG = np.random.default_rng(6)


def _codes(n, k, rng=RNG):
    """Random finite e4m3 codes (no 0x7F / 0xFF)."""
    c = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] ^= 0x01
    return c


def _stats(device="cpu"):
    return seam.load_stats().get(device, seam.DeviceLoadStats())


# -- Fp8Weight ------------------------------------------------------------------------------


def test_fp8_weight_normalizes_scales_and_derives_the_scheme():
    codes = _codes(6, 8)
    w = seam.Fp8Weight(codes, 0.5)
    assert w.weight_scale.dtype == np.float32 and w.weight_scale.shape == (1,) and not w.per_channel
    assert w.activation_scheme == "dynamic" and w.input_scale is None and w.shape == (6, 8)
    w = seam.Fp8Weight(
        codes.view(ml_dtypes.float8_e4m3fn), np.full((6, 1), 0.25, ml_dtypes.bfloat16), input_scale=0.125
    )
    assert w.data.dtype == np.uint8 and w.weight_scale.shape == (6,) and w.per_channel
    assert w.activation_scheme == "static" and w.input_scale == np.float32(0.125)
    w = seam.Fp8Weight(codes, np.float32(2.0), activation_scheme="per_token", bias=np.ones((1, 6), np.float16))
    assert w.activation_scheme == "per_token" and w.bias.shape == (6,)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(data=np.zeros((4, 8), np.float32), weight_scale=1.0), TypeError, "data must be e4m3 codes"),
        (dict(data=np.zeros(8, np.uint8), weight_scale=1.0), ValueError, "data must be 2-D"),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=np.ones(3, np.float32)),
            ValueError,
            "weight_scale must be a scalar, shape (1,)",
        ),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=np.float32(np.nan)),
            ValueError,
            "weight_scale must be positive and finite",
        ),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=np.array([1, 1, 0, 1], np.float32)),
            ValueError,
            "weight_scale must be positive and finite",
        ),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=1.0, input_scale=-1.0),
            ValueError,
            "input_scale must be a positive finite",
        ),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=1.0, input_scale=np.inf),
            ValueError,
            "input_scale must be a positive finite",
        ),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=1.0, activation_scheme="static"),
            ValueError,
            "input_scale must be given",
        ),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=1.0, input_scale=1.0, activation_scheme="per_token"),
            ValueError,
            "input_scale must be None",
        ),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=1.0, activation_scheme="token"),
            ValueError,
            "activation_scheme must be one of",
        ),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=1.0, bias=np.zeros(5, np.float32)),
            ValueError,
            "bias must have shape (4,)",
        ),
        (
            dict(data=np.zeros((4, 8), np.uint8), weight_scale=1.0, bias=np.zeros(4, np.int32)),
            TypeError,
            "bias must be a float32",
        ),
    ],
)
def test_fp8_weight_refuses_bad_parts(kwargs, exc, words):
    with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
        seam.Fp8Weight(**kwargs)


def test_fp8_weight_is_frozen_and_compared_by_identity():
    w = seam.Fp8Weight(_codes(2, 4), 1.0)
    with pytest.raises(AttributeError):
        w.weight_scale = np.ones(1, np.float32)
    twin = seam.Fp8Weight(w.data, 1.0)
    assert w == w and w != twin and len({w: 1, twin: 2}) == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_from_float_per_tensor_matches_the_reference_quantizer(dtype):
    w = (RNG.standard_normal((24, 40)) * 0.05).astype(dtype)
    fw = seam.Fp8Weight.from_float(w)
    ref = reference.quantize(w)
    assert fw.weight_scale[0] == ref.scale[0] and not fw.per_channel
    np.testing.assert_array_equal(fw.data, ref.data)
    assert np.count_nonzero(fw.data) > 0.9 * fw.data.size


def test_from_float_per_channel_scale_is_row_amax_over_448_and_rows_use_their_own_scale():
    w = (RNG.standard_normal((16, 32)) * np.logspace(-3, 1, 16)[:, None]).astype(np.float32)
    w[5] = 0.0  # an all-zero row gets the floor, not scale 0 and NaN codes
    fw = seam.Fp8Weight.from_float(w, per_channel=True, activation_scheme="per_token")
    amax = np.abs(w.astype(np.float64)).max(axis=1)
    floor = 1.0 / (448.0 * 512.0)
    expected_scale = np.maximum(amax / 448.0, floor).astype(np.float32)
    np.testing.assert_allclose(fw.weight_scale, expected_scale, rtol=2**-23)
    assert fw.weight_scale[5] == np.float32(floor) and not fw.data[5].any()
    # each row quantized with its own scale: x / scale_row, encoded by the independent oracle
    expected_codes = reference.encode((w / fw.weight_scale[:, None]).astype(np.float32))
    np.testing.assert_array_equal(fw.data, expected_codes)
    # every non-zero row reaches the top of the e4m3 range with its own scale
    tops = reference.decode(fw.data).__abs__().max(axis=1)
    assert np.all(tops[np.arange(16) != 5] == 448.0)


def test_from_float_refuses_non_2d_and_non_float():
    with pytest.raises(ValueError, match="w must be 2-D"):
        seam.Fp8Weight.from_float(np.ones(8, np.float32))
    with pytest.raises(TypeError, match="w must be a float32, float16 or bfloat16"):
        seam.Fp8Weight.from_float(np.ones((2, 2), np.int64))


# -- ResidentFp8 and load accounting --------------------------------------------------------


def _weight(n=8, k=16, bias=True, per_channel=True):
    scale = RNG.uniform(0.01, 0.1, size=n).astype(np.float32) if per_channel else np.float32(0.03)
    b = RNG.standard_normal(n).astype(ml_dtypes.bfloat16) if bias else None
    return seam.Fp8Weight(_codes(n, k), scale, bias=b)


def test_resident_is_uploaded_once_and_accounted_to_the_byte():
    w = _weight(n=8, k=16)
    expected = w.data.nbytes + w.weight_scale.astype(np.float32).nbytes + w.bias.astype(np.float32).nbytes
    before = _stats()
    r1 = seam.ResidentFp8(w, "cpu")
    r2 = seam.ResidentFp8(w, "cpu")
    after = _stats()
    assert r1 is r2 and r1.nbytes == expected
    assert after.uploads - before.uploads == 1
    assert after.upload_bytes - before.upload_bytes == expected == 8 * 16 + 4 * 8 + 4 * 8
    assert after.released_host == before.released_host
    # a second weight with the same contents is a different weight: uploaded on its own
    w_same = seam.Fp8Weight(w.data.copy(), w.weight_scale.copy(), bias=w.bias)
    assert seam.ResidentFp8(w_same, "cpu") is not r1
    assert _stats().uploads - before.uploads == 2


def test_resident_is_a_read_only_snapshot():
    w = _weight(bias=False, per_channel=False)
    r = seam.ResidentFp8(w, "cpu")
    original = r.weight.data.copy()
    w.data[0, 0] ^= 0x01  # the caller mutates its host array after upload
    np.testing.assert_array_equal(r.weight.data, original)
    with pytest.raises(ValueError):
        r.weight.data[0, 0] = 0
    assert r.weight.shape == w.shape and r.weight.activation_scheme == w.activation_scheme


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_resident_cache_is_thread_safe(device):
    """Eight threads asking at once for one weight's resident copy get one object, uploaded once."""
    if device == "cuda":
        import cupy

        device = f"cuda:{cupy.cuda.runtime.getDevice()}"
    w = _weight()
    before = _stats(device)
    barrier = threading.Barrier(8)
    got = []

    def worker():
        barrier.wait()
        got.append(seam.ResidentFp8(w, device))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(r is got[0] for r in got)
    assert _stats(device).uploads - before.uploads == 1


def test_release_host_drops_the_codes_records_it_and_the_resident_still_computes():
    w = _weight(n=8, k=16)
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    y_before = seam.matmul_fp8(x, w)
    host_bytes = w.data.nbytes
    before = _stats()
    r = seam.ResidentFp8(w, "cpu", release_host=True)
    after = _stats()
    assert w.data is None and w.released_to == "cpu"
    assert after.released_host - before.released_host == 1
    assert after.released_host_bytes - before.released_host_bytes == host_bytes == 8 * 16
    np.testing.assert_array_equal(seam.matmul_fp8(x, r), y_before)
    with pytest.raises(ValueError, match="released after upload to cpu"):
        seam.matmul_fp8(x, w)
    # asking again reuses the resident copy and releases nothing twice
    assert seam.ResidentFp8(w, "cpu", release_host=True) is r
    assert _stats().released_host == after.released_host


def test_resident_cache_does_not_keep_the_host_weight_alive():
    w = _weight()
    seam.ResidentFp8(w, "cpu")
    ref = weakref.ref(w)
    del w
    gc.collect()
    assert ref() is None


def test_resident_refuses_bad_devices_and_types():
    w = _weight()
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"):
        seam.ResidentFp8(w, "tpu")
    with pytest.raises(TypeError, match="weight must be an Fp8Weight or a seam.Fp8Experts, got ndarray"):
        seam.ResidentFp8(np.zeros((2, 2), np.uint8), "cpu")


def test_cuda_device_without_a_gpu_says_why():
    try:
        import cupy  # noqa: F401

        pytest.skip("cupy is importable here; the GPU half is tested in test_seam_gpu.py")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match="device 'cuda:1' needs cupy and a CUDA GPU"):
        seam.ResidentFp8(_weight(), "cuda:1")


# -- fused shards ---------------------------------------------------------------------------


def _nearest_codes_float64(v):
    """Nearest e4m3 code of each float64 value (|v| <= 448), and whether it is a near-tie (two grid
    points within float32 rounding distance), by scanning the oracle's grid."""
    mag = np.abs(v).reshape(-1)
    dist = np.abs(mag[:, None] - reference.GRID[None, :])
    order = np.argsort(dist, axis=1)
    best, second = order[:, 0], order[:, 1]
    d1 = dist[np.arange(mag.size), best]
    d2 = dist[np.arange(mag.size), second]
    near_tie = (d2 - d1) <= 4 * 2.0**-23 * np.maximum(mag, 2.0**-9)
    code = best.astype(np.uint8) | np.where(np.signbit(v.reshape(-1)), 0x80, 0).astype(np.uint8)
    return code.reshape(v.shape), near_tie.reshape(v.shape)


def test_requantize_with_max_scale_against_float64():
    widths = [16, 8, 8]  # q, k, v
    scales = np.array([0.0213, 0.0092, 0.037], np.float32)
    codes = _codes(sum(widths), 32)
    codes_before = codes.copy()
    max_scale, out = seam.requantize_with_max_scale(codes, scales, widths)
    np.testing.assert_array_equal(codes, codes_before)  # the input is not written (upstream writes in place)
    assert max_scale == np.float32(0.037) and out.dtype == np.uint8 and out.shape == codes.shape
    row_scale = np.repeat(scales.astype(np.float64), widths)[:, None]
    exact = reference.decode(codes) * row_scale / float(max_scale)  # the value each code must carry now
    expected, near_tie = _nearest_codes_float64(exact)
    compared = ~near_tie
    assert compared.sum() > 0.95 * codes.size  # the gate compared nearly every element
    np.testing.assert_array_equal(out[compared], expected[compared])
    # near-ties may round either way, but only to one of the two nearest codes
    assert np.all(np.abs(reference.decode(out[near_tie]) - exact[near_tie]) <= 0.07 * np.abs(exact[near_tie]) + 2.0**-9)
    # the shard that already had the max scale is unchanged; the others really were requantized
    np.testing.assert_array_equal(out[24:], codes[24:])
    assert np.count_nonzero(out[:24] != codes[:24]) > 100


def test_requantize_with_max_scale_refuses_bad_widths_and_scales():
    codes = _codes(8, 4)
    with pytest.raises(ValueError, match="logical_widths must sum to the 8 rows"):
        seam.requantize_with_max_scale(codes, [1.0, 1.0], [4, 3])
    with pytest.raises(ValueError, match="weight_scales must have one scale per shard"):
        seam.requantize_with_max_scale(codes, [1.0], [4, 4])
    with pytest.raises(ValueError, match="weight_scales must be positive and finite"):
        seam.requantize_with_max_scale(codes, [1.0, np.nan], [4, 4])


def test_fuse_per_tensor_static_shards_uses_max_scales_and_keeps_values():
    k = 24
    shards = [
        seam.Fp8Weight(_codes(n, k), s, input_scale=i, bias=RNG.standard_normal(n).astype(np.float32))
        for n, s, i in ((8, 0.02, 0.05), (4, 0.031, 0.04), (4, 0.011, 0.07))
    ]
    fused = seam.fuse_fp8_shards(shards)
    assert fused.shape == (16, k) and not fused.per_channel
    assert fused.weight_scale[0] == np.float32(0.031) and fused.input_scale == np.float32(0.07)
    np.testing.assert_array_equal(fused.bias, np.concatenate([s.bias for s in shards]))
    original = np.concatenate([reference.decode(s.data) * float(s.weight_scale[0]) for s in shards])
    fused_values = reference.decode(fused.data) * float(fused.weight_scale[0])
    # requantization error: at most half an e4m3 step at the max scale (relative 2^-4, or the
    # subnormal step 2^-9 / 2)
    bound = np.maximum(np.abs(original) * 2.0**-4, 2.0**-10 * float(fused.weight_scale[0])) * (1 + 1e-6)
    assert np.all(np.abs(fused_values - original) <= bound)
    assert fused.source["logical_widths"] == [8, 4, 4]


def test_fuse_with_a_per_channel_shard_concatenates_exactly():
    a = seam.Fp8Weight(_codes(4, 8), 0.5, activation_scheme="per_token")
    b = seam.Fp8Weight(_codes(2, 8), np.array([0.25, 0.125], np.float32), activation_scheme="per_token")
    fused = seam.fuse_fp8_shards([a, b])
    assert fused.per_channel and fused.activation_scheme == "per_token"
    np.testing.assert_array_equal(fused.data, np.concatenate([a.data, b.data]))
    np.testing.assert_array_equal(fused.weight_scale, np.array([0.5] * 4 + [0.25, 0.125], np.float32))


def test_fuse_refuses_mismatched_shards():
    a = seam.Fp8Weight(_codes(4, 8), 0.5)
    with pytest.raises(ValueError, match=r"shards\[1\] must have K = 8"):
        seam.fuse_fp8_shards([a, seam.Fp8Weight(_codes(4, 6), 0.5)])
    with pytest.raises(ValueError, match="shards must share one activation_scheme"):
        seam.fuse_fp8_shards([a, seam.Fp8Weight(_codes(4, 8), 0.5, input_scale=1.0)])
    with pytest.raises(ValueError, match="shards must all have a bias or none"):
        seam.fuse_fp8_shards([a, seam.Fp8Weight(_codes(4, 8), 0.5, bias=np.zeros(4, np.float32))])


def test_dequantize_is_codes_times_row_scale():
    w = _weight(bias=False)
    np.testing.assert_array_equal(w.dequantize(), vt.decode_e4m3(w.data) * w.weight_scale[:, None])
