"""The register tiles of the small-M GEMMs on the AVX-512 paths (vtnumba/cpu/tile.py).

Each tile sums in K order with one rounding a term, so the tiled kernels are pinned bitwise to the
reference kernels (not only to G3), at the shapes where the tiles have edges: M around 16 and 32
(the padded activation rows, the 16 x 16 and 32 x 8 tiles and the 16 x 8 edge) and past two of a
thread's activation panels, N past a tile's weight rows, K past the 512-wide pass and the 64-code
lookup step, NaN codes, every scale layout.
"""

import numpy as np
import pytest
from numba import njit

from vtnumba.cpu import block, gemm, mx, paths, tile
from vtnumba.cpu.paths import team_runs

F32 = np.float32
TILE_PATHS = [p.name for p in paths.runnable() if p.register_tiles]
pytestmark = pytest.mark.skipif(not TILE_PATHS, reason="no path with register tiles runs on this CPU")


@pytest.fixture(
    params=[(p, t) for p in TILE_PATHS for t in (False, True)],
    ids=lambda v: f"{v[0]}-{'parallel' if v[1] else 'serial'}",
)
def twin(request):
    """One tiled path and one twin (serial or parallel), called directly."""
    name, parallel = request.param
    with paths.use(name):
        yield name, parallel


def _codes(rng, shape, nan_at=None):
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] ^= 0x01
    if nan_at is not None:
        codes[nan_at] = 0x7F
    return codes


def _bits_equal(got, want):
    return np.array_equal(got.view(np.uint32), want.view(np.uint32))


SHAPES = [(2, 3, 5), (15, 17, 64), (16, 16, 65), (17, 9, 511), (32, 8, 513), (33, 40, 130), (48, 23, 1100), (50, 7, 16)]
# M past two of the tiles' activation panels at K = 4096 (tile.panel_rows), the last one partial and
# not a multiple of 16
PANELS_M = 2 * tile.panel_rows(4096) + 22
SHAPES.append((PANELS_M, 9, 4096))


def test_dense_tiles_are_the_reference_bitwise(twin):
    name, parallel = twin
    rng = np.random.default_rng(3)
    compared = 0
    for m, n, k in SHAPES:
        a, b = _codes(rng, (m, k)), _codes(rng, (n, k), nan_at=(n - 1, k // 2))
        x = np.empty((m, k), F32)
        gemm.decode_rows(a, x)
        for sa, sb, bias in (
            (np.ones(1, F32), np.full(1, 0.5, F32), np.zeros(0, F32)),
            (
                rng.uniform(0.01, 1, m).astype(F32),
                rng.uniform(-0.1, 0.1, n).astype(F32),
                rng.standard_normal(n).astype(F32),
            ),
        ):
            want = np.empty((m, n), F32)
            gemm.reference_kernel(a, b, sa, sb, bias, want)
            for activation in (x, a):  # its float32 values (the MoE drivers), its codes (scaled_mm)
                got = np.full((m, n), 7.0, F32)
                gemm.tiled_kernel.variant(name, parallel)(activation, b, sa, sb, bias, got)
                assert _bits_equal(got, want), (m, n, k, activation.dtype)
                assert np.isnan(got[:, n - 1]).all()  # the NaN code reached its column
                compared += got.size
    assert compared > 6000


@pytest.mark.parametrize("bn, bk", [(128, 128), (1, 32), (16, 48), (8, 640)])
def test_block_tiles_are_the_reference_bitwise(twin, bn, bk):
    name, parallel = twin
    rng = np.random.default_rng(bk)
    compared = 0
    for m, n, k in SHAPES:
        a, b = _codes(rng, (m, k)), _codes(rng, (n, k))
        x = np.empty((m, k), F32)
        gemm.decode_rows(a, x)
        nkb = -(-k // bk)
        sa = rng.uniform(0.01, 1, (m, nkb)).astype(F32)
        sb = rng.uniform(-0.1, 0.1, (-(-n // bn), nkb)).astype(F32)
        bias = rng.standard_normal(n).astype(F32)
        want = np.empty((m, n), F32)
        block.reference_kernel(a, b, sa, sb, bn, bk, bias, want)
        for activation in (x, a):  # its float32 values (the MoE drivers), its codes (block_scaled_mm)
            got = np.full((m, n), 7.0, F32)
            block.tiled_kernel.variant(name, parallel)(activation, b, np.ascontiguousarray(sa.T), sb, bn, bk, bias, got)
            assert _bits_equal(got, want), (m, n, k, activation.dtype)
            compared += got.size
    assert compared > 6000


class _Recorder:
    """Counts the calls that reach a kernel and the dtypes of their activations, and makes them."""

    def __init__(self, kernel):
        self.kernel, self.calls, self.activations = kernel, 0, set()

    def __call__(self, *args):
        self.calls += 1
        self.activations.add(args[0].dtype)
        return self.kernel(*args)


def test_the_entry_points_take_the_tiles_from_16_rows_on_these_paths(monkeypatch):
    rng = np.random.default_rng(0)
    b = _codes(rng, (20, 96))
    dense, blocked = _Recorder(gemm.tiled_kernel), _Recorder(block.tiled_kernel)
    monkeypatch.setattr(gemm, "tiled_kernel", dense)
    monkeypatch.setattr(block, "tiled_kernel", blocked)
    for name in TILE_PATHS:
        with paths.use(name):
            for m in (tile.MIN_ROWS - 1, tile.MIN_ROWS, 40):  # the first takes the 4 x 4 kernel
                a = _codes(rng, (m, 96))
                gemm.scaled_mm(a, b, np.ones(1, F32), np.ones(1, F32), F32, None, "small_m")
                block.block_scaled_mm(
                    a, b, np.ones((m, 1), F32), np.ones((1, 1), F32), (128, 128), F32, None, "small_m"
                )
    assert dense.calls == blocked.calls == 2 * len(TILE_PATHS)
    # the codes reach the tiles undecoded: each thread decodes its own (tile.activation_columns)
    assert dense.activations == blocked.activations == {np.dtype(np.uint8)}
    for other in paths.runnable():
        if not other.register_tiles:
            with paths.use(other.name):
                assert gemm.rows_kernel(64) is gemm.small_m_kernel and block.rows_kernel(64) is block.small_m_kernel


def test_block_scaled_and_mx_take_the_tiles_to_160_rows_on_these_paths():
    """The block-scaled and MX GEMMs' choice (``block.takes_small_m``): small_m below 160 rows where the
    register tiles run (measured inside torch: benchmarks/RESULTS.md, 2026-12-07 09:00), below 64 on
    the 4 x 4 kernels' paths, and M * K over 3 Mi takes blas on both; where the tiles run, a weight of
    N x K <= 1 Mi keeps them at any M (measured in the tiny Llama, 2026-12-07 15:04-15:29); the 4 x 4
    kernels' paths never do."""
    for path in paths.runnable():
        with paths.use(path.name):
            rows = block.TILED_SMALL_M_ROWS if path.register_tiles else block.SMALL_M_ROWS
            assert block.small_m_rows() == rows
            for choose in (block.choose_kernel, mx.choose_kernel):
                assert [choose(m, 4096, 4096) for m in (rows - 1, rows)] == ["small_m", "blas"], path.name
                assert choose(rows - 1, 4096, gemm.SMALL_M_ELEMENTS // (rows - 1) + 1) == "blas"
                small_weights = [
                    choose(m, n, k) for m, n, k in ((2048, 512, 256), (8192, 2048, 512), (rows, 1024, 1024))
                ]
                assert small_weights == ["small_m" if path.register_tiles else "blas"] * 3, path.name
                past = [choose(m, n, k) for m, n, k in ((rows, 2049, 512), (rows, 1025, 1024), (192, 4096, 4096))]
                assert past == ["blas"] * 3, path.name
    assert (block.SMALL_M_ROWS, block.TILED_SMALL_M_ROWS, block.TILED_MAX_WEIGHT) == (64, 160, 1 << 20)


_transposed = njit(lambda x: tile.transposed(x))


@pytest.mark.parametrize("m, k", [(1, 1), (16, 16), (17, 33), (32, 64), (5, 300), (48, 16), (31, 15)])
def test_transposed_pads_with_zeros(m, k):
    x = np.random.default_rng(m * k).standard_normal((m, k)).astype(F32)
    xt = _transposed(x)
    want = np.zeros((k, -(-m // 16) * 16), F32)
    want[:, :m] = x.T
    assert xt.shape == want.shape and _bits_equal(xt, want)


_columns_by_bits = njit(lambda a: tile.activation_columns(a, False))
_columns_by_lookup = njit(lambda a: tile.activation_columns(a, True))


@pytest.mark.parametrize("m, k", [(1, 1), (16, 16), (17, 33), (32, 64), (5, 300), (48, 16), (31, 15), (20, 130)])
def test_activation_columns_decode_codes_and_pad_with_zeros(m, k):
    a = _codes(np.random.default_rng(m + k), (m, k), nan_at=(m - 1, k - 1))
    x = np.empty((m, k), F32)
    gemm.decode_rows(a, x)
    want = np.zeros((k, -(-m // 16) * 16), F32)
    want[:, :m] = x.T
    decoders = [_columns_by_bits] + ([_columns_by_lookup] if "avx512_vbmi" in TILE_PATHS else [])
    for columns in decoders:
        xt = columns(a)
        assert xt.shape == want.shape and _bits_equal(xt, want)
    assert np.isnan(want[k - 1, m - 1])  # the NaN code was among the values compared


@paths.cpu_kernel(0, lambda items: items)
def _team_runs_of(items):
    return team_runs(items)  # the parallel twin's global is paths._parallel_runs (CpuKernel.variant)


@pytest.mark.filterwarnings("ignore::numba.NumbaPerformanceWarning")  # a twin with no prange
def test_a_parallel_twin_cuts_its_blocks_into_one_run_a_thread():
    """The tiled kernels' runs (``paths.team_runs``): one run in the serial twin, and in the parallel
    twin as many as the region's threads (Numba's thread-local count), never more than the items."""
    import numba

    threads = numba.get_num_threads()
    name = paths.active().name
    assert _team_runs_of.variant(name, False)(8) == 1
    assert _team_runs_of.variant(name, True)(64) == threads
    assert _team_runs_of.variant(name, True)(1) == 1
    numba.set_num_threads(1)
    try:
        assert _team_runs_of.variant(name, True)(64) == 1
    finally:
        numba.set_num_threads(threads)


_transpose16 = njit(lambda src, r0, c0, dst, r1, c1, rows, cols: tile.transpose16(src, r0, c0, dst, r1, c1, rows, cols))


@pytest.mark.parametrize(
    "r0, c0, r1, c1, rows, cols",
    [(0, 0, 0, 0, 16, 16), (0, 16, 16, 8, 16, 8), (3, 32, 32, 3, 5, 5), (0, 32, 37, 0, 3, 1)],
)
def test_transpose16_stores_only_its_rows_and_columns(r0, c0, r1, c1, rows, cols):
    """dst[r1 + i, c1 + j] = src[r0 + j, c0 + i] for i < rows, j < cols, and nothing else of dst
    written (the masked stores: the tiles' blocks end beside another thread's columns)."""
    src = np.random.default_rng(rows * cols).standard_normal((19, 48)).astype(F32)
    dst = np.full((40, 24), -1.0, F32)
    _transpose16(src, r0, c0, dst, r1, c1, rows, cols)
    want = np.full((40, 24), -1.0, F32)
    want[r1 : r1 + rows, c1 : c1 + cols] = src[r0 : r0 + cols, c0 : c0 + rows].T
    assert (want != -1.0).sum() == rows * cols  # the comparison covers the written block
    assert _bits_equal(dst, want)


def test_tile_intrinsics_refuse_strided_arrays():
    x = np.zeros((32, 32), F32)
    with pytest.raises(Exception, match="transpose16"):
        _transpose16(x[:, ::2], 0, 0, x, 0, 0, 16, 16)


def test_mx_tiles_sum_each_chunk_in_k_order(twin):
    """MXFP8's tiled kernel: the products dec(a) * sa * dec(b) * sb are exact, each chunk of 256 is
    summed in K order, the chunk sums added in order: an oracle in numpy float32 doing exactly that."""
    name, parallel = twin
    rng = np.random.default_rng(11)
    compared = 0
    # bk = 1000: a chunk wider than the tiles' 512-wide pass, its scale blocks not aligned to a pass
    shapes = [(3, 5, 32, 32), (16, 17, 96, 32), (33, 9, 300, 32), (20, 24, 544, 32), (17, 6, 1100, 1000)]
    for m, n, k, bk in shapes + [(PANELS_M, 6, 4096, 32)]:
        a, b = _codes(rng, (m, k)), _codes(rng, (n, k))
        nkb = -(-k // bk)
        sa = rng.integers(120, 134, (m, nkb)).astype(np.uint8)
        sb = rng.integers(120, 134, (n, nkb)).astype(np.uint8)
        x, w = np.empty((m, k), F32), np.empty((n, k), F32)
        mx.decode_scaled_rows(a, sa, bk, x)
        mx.decode_scaled_rows(b, sb, bk, w)
        edges = mx._chunk_bounds(k, bk)
        bias = rng.standard_normal(n).astype(F32)
        got, bad = np.full((m, n), 7.0, F32), np.zeros(1, np.uint8)
        mx.tiled_kernel.variant(name, parallel)(x, b, sb, 1, bk, edges, 1, 246, bias, got, bad)
        want = np.zeros((m, n), F32)
        for c in range(edges.size - 1):
            p = np.zeros((m, n), F32)
            for kk in range(edges[c], edges[c + 1]):
                p = p + x[:, kk, None] * w[None, :, kk]  # exact products, one float32 rounding an add
            want = want + p
        want = want + bias
        assert not bad[0] and _bits_equal(got, want), (m, n, k)
        compared += got.size
    assert compared > 500
