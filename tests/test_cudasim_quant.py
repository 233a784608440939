"""G2 in CI: the GPU quantization kernels under the CUDA simulator give the CPU's bytes.

Runs only in the simulator process (marker ``cudasim``; tests/test_cudasim.py starts it). There the
GPU backend (``vtnumba.cuda``) takes numpy arrays and runs its kernels -- the same statements the
GPU compiles, 16-byte groups emulated element by element -- with the portable encoder. Inputs are
tiny (the simulator runs each thread as a Python thread), but they cover both the 16-element groups
and the scalar tail, every mode, every input dtype, host and device scales, and strided inputs.
"""

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba.testing import reference

pytestmark = [pytest.mark.cudasim, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]

F32 = np.float32
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["f32", "f16", "bf16"]
SCALES = (1.0, 0.0092, 0.13, 7.25)  # 0.0092 and 0.13 expose a divide-for-multiply slip (DESIGN.md)


@pytest.fixture(scope="module")
def gpu():
    import vtnumba.cuda as backend

    return backend


def _hard_values(scale, huge=True):
    """Scaled-domain hard cases (ties, the subnormal ladder, 448 and its neighbours, +-0, inf, NaN),
    mapped back to input units so that x * (1 / scale) lands on or next to them."""
    grid = reference.GRID
    mids = ((grid[:-1] + grid[1:]) / 2.0).astype(F32)
    # (1e30 is left out for the dynamic modes: as amax it would zero every other code)
    edges = np.array([448.0, 464.0, 480.0, 2.0**-6, 2.0**-10] + ([1e30] if huge else []), dtype=F32)
    near = np.concatenate([edges, np.nextafter(edges, F32(0)), np.nextafter(edges, F32(np.inf))])
    vals = np.concatenate([mids[::3], mids[1::17] * F32(1.0000001), near]) * F32(scale)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], dtype=F32)
    return np.concatenate([vals, -vals, special]).astype(F32)


def _matrix(dtype, scale, rows, cols, seed, huge=True):
    """rows x cols input holding the hard values first, random values after (shuffled)."""
    rng = np.random.default_rng(seed)
    hard = _hard_values(scale, huge)
    n = rows * cols
    rand = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 30.0, 448.0], n)).astype(F32) * F32(scale)
    flat = np.concatenate([hard, rand])[:n]
    rng.shuffle(flat)
    return flat.reshape(rows, cols).astype(dtype)


def _assert_same_codes(got, want):
    assert got.dtype == np.uint8 and got.shape == want.shape
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{bad.size} of {want.size} codes differ: got {got.reshape(-1)[bad[:6]]}, want {want.reshape(-1)[bad[:6]]}"
    )
    assert np.count_nonzero(want) > want.size // 4  # vacuity: real codes were compared


# 48 columns: three 16-element groups per row; 37: groups impossible per row, the scalar tail does it all
SHAPES = [(3, 48), (2, 37)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_static_matches_cpu(gpu, dtype, shape):
    compared = 0
    for i, scale in enumerate(SCALES):
        x = _matrix(dtype, scale, *shape, seed=i)
        want = vt.quantize_fp8(x, scale).data  # the CPU kernels
        _assert_same_codes(gpu.quantize_static(x, F32(scale)), want)
        # a device-resident scale (a numpy array under the simulator) gives the same bytes
        _assert_same_codes(gpu.quantize_static(x, np.array([scale], F32)), want)
        compared += 2 * x.size
    assert compared == 2 * len(SCALES) * shape[0] * shape[1]


@pytest.mark.parametrize("one_launch", [True, False], ids=["one-launch", "two-launch"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dynamic_matches_cpu(gpu, dtype, shape, one_launch, monkeypatch):
    """Both forms of dynamic quantization give the CPU's bytes: one block for small inputs, the amax
    partials and the quantize kernel beyond (forced here by lowering the threshold)."""
    from vtnumba.cuda.kernels import quant

    if not one_launch:
        monkeypatch.setattr(quant, "SMALL_DYNAMIC_MAX", 0)
    from vtnumba.cuda import quantize

    quantize._backend()
    xin, kind, _, n, aligned, _ = quantize._input(np.zeros(shape, dtype))
    scale_buf = np.zeros(1, np.float32)
    kernels = [
        launch[0]
        for launch in quantize._dynamic_launches(
            xin,
            kind,
            n,
            aligned,
            np.zeros(shape, np.uint8),
            scale_buf,
            scale_buf,
            1,
            "portable",
            quantize._device.current(),
        )
    ]
    assert kernels == (
        [quant.dynamic_small_kernel(kind, "portable")]
        if one_launch
        else [quant.amax_kernel(kind), quant.dynamic_kernel(kind, "portable")]
    )
    x = _matrix(dtype, 0.13, *shape, seed=7, huge=False)
    want = vt.quantize_fp8(x)
    codes, scale = gpu.quantize_dynamic(x)
    assert scale.shape == (1,) and scale.dtype == np.float32
    assert scale[0] == want.scale[0]  # amax over finite elements (inf and NaN are in x)
    _assert_same_codes(codes, want.data)


def test_grid_stride_loops_cover_more_groups_than_threads(gpu):
    """Inputs with more 16-element groups than the (capped) grid has threads: every thread loops."""
    from vtnumba.cuda.kernels import quant

    n = 16 * quant.THREADS * quant.DYNAMIC_BLOCKS_PER_SM * 2 + 5  # two loop trips, plus a tail
    x = _matrix(ml_dtypes.bfloat16, 0.13, 1, n, seed=13, huge=False).reshape(-1)
    want = vt.quantize_fp8(x)
    codes, scale = gpu.quantize_dynamic(x)
    assert scale[0] == want.scale[0]
    _assert_same_codes(codes, want.data)


@pytest.mark.parametrize("ub", [None, 0.5, "device"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_per_token_matches_cpu(gpu, dtype, ub):
    x = _matrix(dtype, 0.77, 4, 48, seed=3, huge=False)
    x[2] = 0  # an all-zero row takes the floor scale
    x[3, :5] = dtype(1e4)  # a row the scale_ub caps
    ub_value = None if ub is None else 0.5
    want = vt.quantize_fp8(x, per_token=True, scale_ub=ub_value)
    ub_arg = np.array([0.5], F32) if ub == "device" else (None if ub is None else F32(0.5))
    codes, scales = gpu.quantize_per_token(x, ub_arg)
    assert scales.shape == (4, 1)
    assert np.array_equal(scales, want.scale)
    assert scales[2, 0] == reference.FLOOR
    _assert_same_codes(codes, want.data)


def test_per_token_tail_columns(gpu):
    x = _matrix(np.float32, 1.0, 3, 21, seed=5, huge=False)  # 21 columns: no 16-element groups line up with rows
    want = vt.quantize_fp8(x, per_token=True)
    codes, scales = gpu.quantize_per_token(x, None)
    assert np.array_equal(scales, want.scale)
    _assert_same_codes(codes, want.data)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_input_gives_contiguous_bytes(gpu, dtype):
    base = _matrix(dtype, 0.13, 4, 64, seed=11)
    for view in (base[:, ::2], base.T, base[1:3, 5:40]):
        want = vt.quantize_fp8(np.ascontiguousarray(view), 0.13).data
        _assert_same_codes(gpu.quantize_static(view, F32(0.13)), want)


def test_static_scale_array_is_the_scale(gpu):
    x = _matrix(np.float32, 0.5, 2, 16, seed=2)
    gpu.quantize_static(x, F32(0.5))
    assert np.array_equal(gpu.scale_array(F32(0.5)), np.array([0.5], F32))
    assert np.array_equal(gpu.scale_array(F32(0.25)), np.array([0.25], F32))
    assert gpu.scale_array(F32(0.25)) is gpu.scale_array(F32(0.25))  # uploaded once, shared


def test_decode_and_dequantize_match_cpu(gpu):
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    assert np.array_equal(gpu.decode(codes), vt.decode_e4m3(codes), equal_nan=True)
    for dtype in DTYPES:
        got = gpu.dequantize(codes, F32(0.37), np.dtype(dtype))
        want = vt.dequantize_fp8(codes, 0.37, dtype)
        assert got.dtype == want.dtype
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_hardware_encoder_is_refused_in_the_simulator(gpu):
    with pytest.raises(ValueError, match="encoder must be 'portable' under the CUDA simulator"):
        gpu.quantize_static(np.ones((2, 16), F32), F32(1.0), encoder="hardware")
