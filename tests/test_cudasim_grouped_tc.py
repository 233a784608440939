"""The grouped tensor-core GEMV (mixture of experts, tc_gemv.grouped_gemv) under the CUDA simulator.

Each expert's rows are checked three ways: G3 against the float64 reference (vtnumba.testing.gates),
within twice that of the CPU backend's ``grouped_scaled_mm``, and bit for bit against the ungrouped
tc_gemv run on the same rows with the same configuration (the grouped kernel runs the ungrouped
pass on views of the expert, so every sum is added in the same order). Rows past offsets[E] must
keep the NaN they were poisoned with. Tiny shapes; the hardware is tests/test_grouped_tc_gpu.py's.

Runs only in the simulator process (marker ``cudasim``; tests/test_cudasim.py starts it):
    NUMBA_ENABLE_CUDASIM=1 python -m pytest -q -m cudasim tests/test_cudasim_grouped_tc.py
"""

import numpy as np
import pytest
from tensorcore_cases import BF16, F16, F32, uniform_codes

from vtnumba.testing import gates, reference

pytestmark = pytest.mark.cudasim

BLOCK_SIZE = (128, 128)


# -- helpers, shared with tests/test_grouped_tc_gpu.py (host numpy in, ``xp`` arrays on the device) --


def offsets_of(counts):
    """int32 [E + 1]: the cumulative ends of ``counts`` rows per expert, from 0."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def grouped_case(rng, counts, pad, n, k, scales):
    """(a [P, K], scale_a, b [E, N, K], scale_b, offsets) for ``counts`` rows per expert and ``pad``
    padding rows, codes uniform over e4m3 with NaN codes in a's first and last element. ``scales``:
    "row_channel" (float32 [P] x [E, N]), "tensor_expert" ([1] x [E]), "row_expert" ([P] x [E]) or
    "block" (128 x 128: [P, KB] x [E, NB, KB], signed weight scales)."""
    offsets = offsets_of(counts)
    e, p = len(counts), int(offsets[-1]) + pad
    a, b = uniform_codes(rng, (p, k), nan_codes=True), uniform_codes(rng, (e, n, k))
    kb, nb = -(-k // 128), -(-n // 128)
    if scales == "block":
        sa = rng.uniform(0.001, 0.02, (p, kb)).astype(np.float32)
        sb = rng.uniform(-0.05, 0.05, (e, nb, kb)).astype(np.float32)
    else:
        sa = (rng.uniform(-0.02, 0.02, p) if scales.startswith("row") else np.array([0.015])).astype(np.float32)
        sb = rng.uniform(0.001, 0.01, (e, n) if scales.endswith("channel") else e).astype(np.float32)
    return a, sa, b, sb, offsets


def expert_scales(sa, sb, e, lo, hi, block_scaled):
    """Expert e's scales over its rows lo..hi as the ungrouped GEMM takes them."""
    if block_scaled:
        return sa[lo:hi], sb[e]
    return (sa[lo:hi] if sa.shape[0] > 1 else sa), (sb[e] if sb.ndim == 2 else sb[e : e + 1])


def host_out(y_bits, out_dtype):
    """The output as ``out_dtype`` on the host from the bits the kernels write."""
    y = y_bits.get() if hasattr(y_bits, "get") else np.asarray(y_bits)
    return y.view(out_dtype) if np.dtype(out_dtype) != F32 else y


def poisoned_bits(xp, p, n, out_dtype):
    """y [P, N] of ``out_dtype`` full of NaN, as the bits the kernels write (float32 or uint16)."""
    y = np.full((p, n), np.nan, dtype=out_dtype)
    y = y if np.dtype(out_dtype) == F32 else y.view(np.uint16)
    return xp.asarray(y)


def run_grouped(xp, a, sa, b, sb, offsets, out_dtype, block_size, **kw):
    """The grouped GEMV into NaN-poisoned bits; returns them (``xp`` arrays)."""
    from vtnumba.cuda.kernels import tc_gemv
    from vtnumba.cuda.runtime import device

    dev = device.current()
    d = [xp.asarray(v) for v in (a, sa, b, sb, offsets)]
    assert tc_gemv.grouped_gemv_reason(d[0], d[1], d[2], d[3], block_size, dev, simulate=True) is None
    y = poisoned_bits(xp, a.shape[0], b.shape[1], out_dtype)
    tc_gemv.grouped_gemv(d[0], d[1], d[2], d[3], d[4], y, out_dtype, block_size, dev, **kw)
    return y


def run_ungrouped(xp, a, sa, b, sb, offsets, out_dtype, block_size, config=None):
    """The ungrouped tc_gemv expert by expert (16 rows a launch) into NaN-poisoned bits, the padding
    rows (past offsets[E]) then 0, as the grouped kernel writes them."""
    from vtnumba.cuda.kernels import tc_gemv
    from vtnumba.cuda.runtime import device

    dev = device.current()
    block_scaled = block_size is not None
    y = poisoned_bits(xp, a.shape[0], b.shape[1], out_dtype)
    da, db = xp.asarray(a), xp.asarray(b)
    for e in range(b.shape[0]):
        for lo in range(int(offsets[e]), int(offsets[e + 1]), tc_gemv.GEMV_MAX_M):
            hi = min(int(offsets[e + 1]), lo + tc_gemv.GEMV_MAX_M)
            sa_e, sb_e = (xp.asarray(s) for s in expert_scales(sa, sb, e, lo, hi, block_scaled))
            steps = (0, 0) if block_scaled else (int(sa_e.shape[0] > 1), int(sb_e.shape[0] > 1))
            kernel, grid, block, args, _ = tc_gemv.gemv_launch(
                hi - lo,
                da[lo:hi],
                dev.placeholder("u16_2d"),
                0,
                dev.placeholder("f32"),
                db[e],
                sa_e,
                steps[0],
                sb_e,
                steps[1],
                out_dtype,
                None,
                tc_gemv.MODE_CODES,
                block_scaled,
                y[lo:hi],
                dev,
                config,
            )
            kernel(grid, block, *args)
    y[int(offsets[-1]) :] = 0
    return y


def _assert_within(y, ref, bound, out_dtype, what):
    """y within ``bound`` + the out rounding of ref (gates.g3_violations), NaN exactly where ref is."""
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(y.astype(np.float64)), nan, err_msg=f"{what}: NaN misplaced")
    bad, err, allowed = gates.g3_violations(y, ref, bound, out_dtype)
    bad &= ~nan
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} elements outside, first at {i}: y={y[i]!r} ref={ref[i]!r} "
            f"err={err[i]:.3g} allowed={allowed[i]:.3g}"
        )
    return int((~nan).sum())


def check_grouped(y, a, sa, b, sb, offsets, out_dtype, block_size):
    """Every routed row within G3 of the float64 reference (the gate's bound, gates.g3_violations)
    and within twice that of the CPU's grouped_scaled_mm; every padding row 0 (the map's last grid row writes them). Returns the
    elements compared."""
    from vtnumba.cpu.experts import grouped_scaled_mm

    cpu = grouped_scaled_mm(a, sa, b, sb, offsets, out_dtype, block_size)
    block_scaled = block_size is not None
    compared = 0
    for e in range(b.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        sa_e, sb_e = expert_scales(sa, sb, e, lo, hi, block_scaled)
        if block_scaled:
            ref, bound = reference.block_scaled_mm(a[lo:hi], b[e], sa_e, sb_e, block_size)
        else:
            ref, bound = reference.scaled_mm(a[lo:hi], b[e], sa_e, sb_e)
        compared += _assert_within(y[lo:hi], ref, bound, out_dtype, f"expert {e} against float64 (G3)")
        # two results within G3 of the exact value: within twice G3 and both roundings of each other
        _assert_within(
            y[lo:hi],
            cpu[lo:hi].astype(np.float64),
            2 * bound + reference.out_rounding(ref, out_dtype),
            out_dtype,
            f"expert {e} against the CPU's grouped_scaled_mm",
        )
    routed = int(offsets[-1])
    assert (y[routed:].astype(np.float64) == 0).all(), "a padding row was not written as 0"
    return compared


# -- the tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "counts, pad, scales, out_dtype, rows_hint",
    [
        ([0, 3, 0, 18, 0], 3, "row_channel", F32, None),  # empty first, middle, last; 16 + 2 rows; padding
        ([0, 3, 0, 18, 0], 3, "tensor_expert", BF16, None),
        ([5, 0, 11, 8], 2, "row_expert", F16, 8),  # the 8-row kernel: 11 rows in two passes, a hint too low
    ],
    ids=["row_channel-f32", "tensor_expert-bf16", "rows8-f16"],
)
def test_grouped_matches_references_and_ungrouped(counts, pad, scales, out_dtype, rows_hint):
    rng = np.random.default_rng(sum(counts) + len(counts))
    n, k = 20, 144  # a partial row tile; two chunks, the second 16 wide
    a, sa, b, sb, offsets = grouped_case(rng, counts, pad, n, k, scales)
    y_bits = run_grouped(np, a, sa, b, sb, offsets, out_dtype, None, rows_hint=rows_hint)
    y = host_out(y_bits, out_dtype)
    assert check_grouped(y, a, sa, b, sb, offsets, out_dtype, None) > sum(counts) * n // 2
    np.testing.assert_array_equal(y_bits, run_ungrouped(np, a, sa, b, sb, offsets, out_dtype, None))


def test_grouped_block_scaled():
    rng = np.random.default_rng(21)
    counts = [0, 2, 17]  # two 128-row weight blocks (the second partial), two K blocks (the second short)
    n, k = 130, 208
    a, sa, b, sb, offsets = grouped_case(rng, counts, 2, n, k, "block")
    y_bits = run_grouped(np, a, sa, b, sb, offsets, BF16, BLOCK_SIZE)
    y = host_out(y_bits, BF16)
    assert check_grouped(y, a, sa, b, sb, offsets, BF16, BLOCK_SIZE) > sum(counts) * n // 2
    np.testing.assert_array_equal(y_bits, run_ungrouped(np, a, sa, b, sb, offsets, BF16, BLOCK_SIZE))


def test_no_rows_launches_nothing():
    """Every expert empty (offsets all 0): every row is padding, written as 0; P = 0 launches nothing."""
    rng = np.random.default_rng(22)
    a, sa, b, sb, offsets = grouped_case(rng, [0, 0, 0], 4, 20, 32, "row_channel")
    y = run_grouped(np, a, sa, b, sb, offsets, F32, None)
    assert (y == 0).all()
    run_grouped(np, a[:0], sa[:0], b, sb, offsets, F32, None)


def test_reasons():
    from vtnumba.cuda.kernels import tc_gemv
    from vtnumba.cuda.runtime import device

    dev = device.current()
    a, b = np.zeros((6, 32), np.uint8), np.zeros((3, 20, 32), np.uint8)
    sa, sb = np.ones(6, np.float32), np.ones((3, 20), np.float32)

    def reason(a_=a, sa_=sa, b_=b, sb_=sb, block_size=None, simulate=True):
        return tc_gemv.grouped_gemv_reason(a_, sa_, b_, sb_, block_size, dev, simulate=simulate)

    assert reason() is None
    assert reason(sa_=sa[:1], sb_=sb[:, 0].copy()) is None
    assert "simulate=True" in reason(simulate=False)
    assert "multiple of 16, got K = 24" in reason(a_=a[:, :24], b_=b[:, :, :24])
    assert "K (32) and b's K (48)" in reason(b_=np.zeros((3, 20, 48), np.uint8))
    assert "b [E, N, K]" in reason(b_=b[0])
    assert "uint8" in reason(a_=a.view(np.int8))
    assert "shape" in reason(sa_=np.ones(5, np.float32))
    assert "shape" in reason(sb_=np.ones((2, 20), np.float32))
    assert "float32" in reason(sb_=sb.astype(np.float16))
    ka, kb = np.ones((6, 1), np.float32), np.ones((3, 1, 1), np.float32)
    assert reason(sa_=ka, sb_=kb, block_size=(128, 128)) is None
    assert "128 x 128" in reason(sa_=ka, sb_=kb, block_size=(64, 64))
    assert "E8M0" in reason(sa_=ka, sb_=kb.astype(np.uint8), block_size=(128, 128))
    assert "E8M0" in reason(sa_=np.ones((6, 1), np.uint8), sb_=kb, block_size=(128, 128))
    with pytest.raises(ValueError, match="MODE_CODES"):
        tc_gemv.gemv_kernel(1, tc_gemv.gemv_config(1, 32), tc_gemv.MODE_STATIC, False, False, False, grouped=True)
    assert tc_gemv.grouped_rows_hint == tc_gemv.GEMV_MAX_M


# -- the grouped tiled GEMM (tc_gemm.py's grouped kernel over kernels/moe.py's tile map) ------------


def dense_tiled(a, sa, b, sb, offsets, out_dtype, block_size):
    """The dense tiled tensor-core GEMM expert by expert (its emulation), the padding rows 0: what the
    grouped kernel must give bit for bit, its tiles being the dense kernel's on views of the expert."""
    from vtnumba.cuda import block, gemm

    y = np.zeros((a.shape[0], b.shape[1]), dtype=out_dtype)
    for e in range(b.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        sa_e, sb_e = expert_scales(sa, sb, e, lo, hi, block_size is not None)
        if block_size is None:
            call = gemm.GemmCall(a[lo:hi], b[e], sa_e, sb_e, np.dtype(out_dtype), None)
            kernel = gemm.TensorCoreGemm("per_mma", simulate=True)
        else:
            call = block.BlockCall(a[lo:hi], b[e], sa_e, sb_e, block_size, np.dtype(out_dtype), None)
            kernel = block.TensorCoreBlock("per_mma", simulate=True)
        assert kernel.can_implement(call) == (True, "")
        y[lo:hi] = kernel.run(call)
    return y


@pytest.mark.parametrize(
    "counts, pad, scales, out_dtype, block_size",
    [
        # an expert over two 32-row tiles, one under one; empty first and last; padding rows
        ([0, 3, 35, 0], 2, "row_channel", BF16, None),
        ([2, 33], 0, "block", F32, BLOCK_SIZE),  # two 128-wide K blocks, the second short; no padding
    ],
    ids=["row_channel-bf16", "block-f32"],
)
def test_grouped_tiled_gemm_matches_references_and_dense(counts, pad, scales, out_dtype, block_size):
    from vtnumba.cuda import experts

    rng = np.random.default_rng(len(counts) * 31 + pad)
    n, k = 16, (80 if block_size is None else 144)  # a short last K tile (16 of 64 codes)
    a, sa, b, sb, offsets = grouped_case(rng, counts, pad, n, k, scales)
    name = "tensorcore_grouped_gemm"
    assert experts.grouped_kernel_for(a, sa, b, sb, offsets, out_dtype, block_size, kernel=name) == name
    y = np.asarray(experts.grouped_scaled_mm(a, sa, b, sb, offsets, out_dtype, block_size, kernel=name))
    assert check_grouped(y, a, sa, b, sb, offsets, out_dtype, block_size) > sum(counts) * n // 2
    dense = dense_tiled(a, sa, b, sb, offsets, out_dtype, block_size)
    np.testing.assert_array_equal(y.view(np.uint8), dense.view(np.uint8))


def test_row_tile_map():
    """The map: each expert's rows in 32-row tiles in expert order, the padding rows as expert E, -1 after."""
    from vtnumba.cuda.kernels import moe

    offsets = offsets_of([0, 3, 70, 0, 32])
    rows, tile_rows = int(offsets[-1]) + 5, 32
    tiles = np.full((moe.row_tile_count(rows, 5, tile_rows), 3), 7, dtype=np.int32)
    kernel, grid, block, args = moe.row_tiles_launch(offsets, 5, rows, tile_rows, tiles)
    kernel(grid, block, *args)
    expected = [(1, 0, 3), (2, 3, 73), (2, 35, 73), (2, 67, 73), (4, 73, 105), (5, 105, 110)]
    assert [tuple(t) for t in tiles[: len(expected)]] == expected
    assert (tiles[len(expected) :, 0] == -1).all() and len(tiles) > len(expected)


def test_the_wgmma_tiles_are_64_rows_below_256_rows_an_expert():
    """The grouped wgmma GEMM's tile configuration by the rows an expert gets on average, and the tile
    map made in the same unit the kernel's tiles cover (no kernel runs: the simulator has no wgmma)."""
    from collections import namedtuple

    from vtnumba.cuda import grouped
    from vtnumba.cuda.kernels import sm90_wgmma_gemm as wg

    call = namedtuple("Call", "p e")
    for p, e, want in ((64 * 128, 128, 64), (255 * 128, 128, 64), (256 * 128, 128, 128), (512 * 16, 16, 128)):
        cfg = wg.grouped_config(call(p, e))
        assert (wg.block_rows(cfg), wg.threads(cfg)) == (want, 128 if want == 64 else 256), (p, e)
        assert grouped.WgmmaGrouped().tile_rows(call(p, e)) == want, (p, e)
