"""The grouped tensor-core GEMV (tc_gemv.grouped_gemv) on a real GPU at the MoE shapes it is for
(marker ``gpu``; the H200 run proves it, CI skips it).

Qwen3-30B-A3B's experts (128 x 1536 x 2048 gate_up, 128 x 2048 x 768 down) and DeepSeek-V3's
(16 x 4096 x 7168 gate_up, 128 x 128 block scales), routed unevenly: empty experts first, in the
middle and last, experts past 16 rows, a padding tail. Every routed row within G3 of the float64
reference and within twice that of the CPU's ``grouped_scaled_mm``, bit for bit the ungrouped
tc_gemv on the same rows; the output is poisoned with NaN first, so an unwritten routed row fails
and a padding row not written as 0 fails. Also: every configuration, and a CUDA graph of the launch.

    python -m pytest -q -m gpu tests/test_grouped_tc_gpu.py
"""

import numpy as np
import pytest
from tensorcore_cases import BF16, F16, F32, kernels_here
from test_cudasim_grouped_tc import (
    BLOCK_SIZE,
    check_grouped,
    grouped_case,
    host_out,
    poisoned_bits,
    run_grouped,
    run_ungrouped,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tcv(cp):
    return kernels_here("tc_gemv")


def routed_counts(rng, e, typical, big):
    """Rows per expert: mostly ``typical`` +- a few, the first, a middle and the last expert empty,
    one expert with ``big`` rows."""
    counts = np.clip(rng.integers(typical - 3, typical + 4, e), 0, None)
    counts[[0, e // 2, e - 1]] = 0
    counts[e // 3] = big
    return [int(c) for c in counts]


@pytest.mark.parametrize(
    "e, n, k, scales, out_dtype",
    [
        (128, 1536, 2048, "row_channel", BF16),  # Qwen3-30B-A3B gate_up
        (128, 1536, 2048, "tensor_expert", F32),
        (128, 2048, 768, "row_expert", F16),  # Qwen3-30B-A3B down
        (16, 4096, 7168, "block", BF16),  # DeepSeek-V3 gate_up, 128 x 128 block scales
    ],
    ids=[
        "qwen3_gate_up-row_channel-bf16",
        "qwen3_gate_up-tensor_expert-f32",
        "qwen3_down-row_expert-f16",
        "deepseek_gate_up-block-bf16",
    ],
)
def test_grouped_real_shapes(tcv, cp, e, n, k, scales, out_dtype):
    rng = np.random.default_rng(e + n + k)
    counts = routed_counts(rng, e, 8, 40)
    block_size = BLOCK_SIZE if scales == "block" else None
    a, sa, b, sb, offsets = grouped_case(rng, counts, 5, n, k, scales)
    y_bits = run_grouped(cp, a, sa, b, sb, offsets, out_dtype, block_size)
    y = host_out(y_bits, out_dtype)
    assert check_grouped(y, a, sa, b, sb, offsets, out_dtype, block_size) > sum(counts) * n * 9 // 10
    np.testing.assert_array_equal(y_bits.get(), run_ungrouped(cp, a, sa, b, sb, offsets, out_dtype, block_size).get())


@pytest.mark.parametrize("block", [False, True])
def test_grouped_eight_row_kernel(tcv, cp, block):
    """rows_hint <= 8 runs the 8-row kernel; an expert past the hint still comes out right (passes)."""
    rng = np.random.default_rng(31 + block)
    counts = routed_counts(rng, 32, 5, 12)
    block_size = BLOCK_SIZE if block else None
    a, sa, b, sb, offsets = grouped_case(rng, counts, 3, 1536, 2048, "block" if block else "row_channel")
    y_bits = run_grouped(cp, a, sa, b, sb, offsets, BF16, block_size, rows_hint=8)
    assert check_grouped(host_out(y_bits, BF16), a, sa, b, sb, offsets, BF16, block_size) > 0
    np.testing.assert_array_equal(y_bits.get(), run_ungrouped(cp, a, sa, b, sb, offsets, BF16, block_size).get())


@pytest.mark.parametrize("name", ["r16_w4_d2", "r16_w8_d2", "r16_w4_d4", "r32_w4_d2"])
def test_every_configuration_is_the_ungrouped_result(tcv, cp, name):
    cfg = tcv.GEMV_CONFIGS[name]
    rng = np.random.default_rng(41)
    counts = [0, 1, 8, 16, 0, 23, 3, 0]
    for scales, block_size in (("row_channel", None), ("block", BLOCK_SIZE)):
        a, sa, b, sb, offsets = grouped_case(rng, counts, 4, 1000, 2048, scales)  # N: a partial row tile
        for hint in (None, 8):
            y = run_grouped(cp, a, sa, b, sb, offsets, BF16, block_size, rows_hint=hint, config=cfg).get()
            np.testing.assert_array_equal(y, run_ungrouped(cp, a, sa, b, sb, offsets, BF16, block_size, cfg).get())
            values = y.view(BF16).astype(np.float32)
            routed = int(offsets[-1])
            # a NaN code in a[0, 0] poisons row 0; every other routed row written, the padding as 0
            assert np.isnan(values[0]).all() and not np.isnan(values[1:routed]).any()
            assert (values[routed:] == 0).all()


def test_cuda_graph_replays_the_launch(tcv, cp):
    """The launch reads the row counts on the device: captured once, a replay follows new offsets."""
    from vtnumba.cuda.runtime import device

    rng = np.random.default_rng(51)
    counts = [3, 0, 9, 1]
    a, sa, b, sb, offsets = grouped_case(rng, counts, 4, 512, 1024, "row_channel")
    dev = device.current()
    d = [cp.asarray(v) for v in (a, sa, b, sb, offsets)]
    y = poisoned_bits(cp, a.shape[0], 512, F32)
    tcv.grouped_gemv(d[0], d[1], d[2], d[3], d[4], y, F32, None, dev)  # compile and load before capturing
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        y[...] = cp.nan
        stream.begin_capture()
        tcv.grouped_gemv(d[0], d[1], d[2], d[3], d[4], y, F32, None, dev)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        check_grouped(y.get(), a, sa, b, sb, offsets, F32, None)
        moved = np.array([0, 7, 9, 13, 13], np.int32)  # other counts (7, 2, 4, 0), the same rows in all
        d[4][...] = cp.asarray(moved)
        y[...] = cp.nan
        graph.launch(stream)
        stream.synchronize()
        check_grouped(y.get(), a, sa, b, sb, moved, F32, None)


# -- the grouped tiled GEMMs (prefill): tc_gemm.py's mma.sync tiles and sm90_wgmma_gemm.py's wgmma ones --


def _dense(kernel_name, block_size):
    """The dense tiled kernel whose tiles the grouped kernel ``kernel_name`` runs on each expert."""
    from vtnumba.cuda import block, gemm

    if kernel_name == "tensorcore_grouped_gemm":
        return block.TensorCoreBlock() if block_size else gemm.TensorCoreGemm()
    return block.WgmmaBlock() if block_size else gemm.WgmmaGemm()


def run_tiled(cp, kernel_name, a, sa, b, sb, offsets, out_dtype, block_size):
    """grouped_scaled_mm with the tiled kernel named; host bits (float32, or 16-bit words)."""
    from vtnumba.cuda import grouped

    d = [cp.asarray(v) for v in (a, sa, b, sb, offsets)]
    assert grouped.grouped_kernel_for(d[0], d[1], d[2], d[3], d[4], out_dtype, block_size, kernel_name) == kernel_name
    y = grouped.grouped_scaled_mm(d[0], d[1], d[2], d[3], d[4], out_dtype, block_size, kernel=kernel_name)
    return (y if np.dtype(out_dtype) == F32 else y.view(np.uint16)).get()


def dense_by_expert(cp, kernel_name, a, sa, b, sb, offsets, out_dtype, block_size):
    """The dense kernel expert by expert, the padding rows 0, as host bits."""
    from test_cudasim_grouped_tc import expert_scales

    from vtnumba.cuda import block, gemm

    kernel = _dense(kernel_name, block_size)
    bits = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32 if np.dtype(out_dtype) == F32 else np.uint16)
    for e in range(b.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        sa_e, sb_e = (cp.asarray(s) for s in expert_scales(sa, sb, e, lo, hi, block_size is not None))
        args = (cp.asarray(a[lo:hi]), cp.asarray(b[e]), sa_e, sb_e)
        if block_size is None:
            call = gemm.GemmCall(*args, np.dtype(out_dtype), None)
        else:
            call = block.BlockCall(*args, block_size, np.dtype(out_dtype), None)
        ok = kernel.can_implement(call)
        assert ok[0], ok[1]
        y = kernel.run(call)
        bits[lo:hi] = (y if np.dtype(out_dtype) == F32 else y.view(np.uint16)).get()
    return bits


def check_experts(y, a, sa, b, sb, offsets, out_dtype, block_size, tensor_core, experts=None):
    """The rows of ``experts`` (default: every routed one) within G3 of the float64 reference, or
    within the tensor-core bound (gates, cuBLASLt's) where ``tensor_core``; padding rows 0. Returns
    the elements compared."""
    from test_cudasim_grouped_tc import expert_scales

    from vtnumba.testing.gates import assert_block_g3, assert_g3

    compared = 0
    for e in range(b.shape[0]) if experts is None else experts:
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        sa_e, sb_e = expert_scales(sa, sb, e, lo, hi, block_size is not None)
        if block_size is None:
            compared += assert_g3(y[lo:hi], a[lo:hi], b[e], sa_e, sb_e, None, out_dtype, tensor_core=tensor_core)
        else:
            compared += assert_block_g3(
                y[lo:hi], a[lo:hi], b[e], sa_e, sb_e, block_size, None, out_dtype, tensor_core=tensor_core
            )
    assert (y[int(offsets[-1]) :].astype(np.float64) == 0).all(), "a padding row was not written as 0"
    return compared


@pytest.mark.parametrize(
    "kernel_name, tiles",
    [("tensorcore_grouped_gemm", None), ("wgmma_grouped_gemm", "rows_64"), ("wgmma_grouped_gemm", "rows_128")],
    ids=["tensorcore", "wgmma-rows_64", "wgmma-rows_128"],
)
@pytest.mark.parametrize(
    "e, n, k, scales, out_dtype, typical",
    [
        (128, 1536, 2048, "row_channel", BF16, 64),  # Qwen3-30B-A3B gate_up at prefill
        (128, 2048, 768, "tensor_expert", F32, 40),  # Qwen3-30B-A3B down
        (16, 4096, 7168, "block", BF16, 150),  # DeepSeek-V3 gate_up, 128 x 128 block scales
    ],
    ids=["qwen3_gate_up-row_channel-bf16", "qwen3_down-tensor_expert-f32", "deepseek_gate_up-block-bf16"],
)
def test_grouped_tiled_gemm_real_shapes(cp, monkeypatch, kernel_name, tiles, e, n, k, scales, out_dtype, typical):
    """Uneven routing (empty experts first, in the middle and last; one expert over 300 rows), a
    padding tail: G3 for the mma.sync kernel, the tensor-core bound for wgmma's, and bit for bit the
    dense kernel of the same family run expert by expert (its tiles on views of the expert). The wgmma
    kernel runs in each of its grouped tile configurations (64 or 128 rows), which give the dense
    kernel's bits alike: each warpgroup's 64 rows are the same wgmma chain."""
    from vtnumba.cuda.kernels import sm90_wgmma_gemm
    from vtnumba.cuda.runtime import device

    if kernel_name == "wgmma_grouped_gemm" and tuple(device.current().cc) != (9, 0):
        pytest.skip("wgmma is sm_90's")
    if tiles is not None:  # every call below the threshold (64-row tiles), or none
        monkeypatch.setattr(sm90_wgmma_gemm, "GROUPED_64_BELOW", 1 << 30 if tiles == "rows_64" else 0)
    rng = np.random.default_rng(e + n + k + typical)
    counts = routed_counts(rng, e, typical, 300)
    block_size = BLOCK_SIZE if scales == "block" else None
    a, sa, b, sb, offsets = grouped_case(rng, counts, 5, n, k, scales)
    bits = run_tiled(cp, kernel_name, a, sa, b, sb, offsets, out_dtype, block_size)
    y = bits.view(out_dtype) if np.dtype(out_dtype) != F32 else bits
    np.testing.assert_array_equal(bits, dense_by_expert(cp, kernel_name, a, sa, b, sb, offsets, out_dtype, block_size))
    # the float64 reference on the host is slow at these shapes: the big expert, the first and the last
    # routed ones (the dense kernels' own tests hold every shape to the bound)
    routed = [i for i, c in enumerate(counts) if c]
    sample = sorted({routed[0], e // 3, routed[-1]})
    tensor_core = kernel_name == "wgmma_grouped_gemm"
    compared = check_experts(y, a, sa, b, sb, offsets, out_dtype, block_size, tensor_core, sample)
    assert compared > sum(counts[i] for i in sample) * n * 9 // 10


def test_which_grouped_kernel_runs_by_rows_and_lever(cp, monkeypatch):
    """Decode rows take the GEMV (the swapped wgmma one on sm_90, the mma.sync one elsewhere, with the
    lever off or the wgmma one disabled); prefill rows the wgmma tiles on sm_90 (the mma.sync ones
    elsewhere), the mma.sync ones with the lever off (strict G3), per_expert from PER_EXPERT_MIN_FLOPS
    an expert."""
    from vtnumba.cuda import grouped
    from vtnumba.cuda.runtime import device

    e, n, k = 16, 512, 256
    rng = np.random.default_rng(61)
    sm90 = tuple(device.current().cc) == (9, 0)
    # per_expert's threshold lowered to these experts' FLOPs at 1024 rows each (its default is 1e11)
    monkeypatch.setattr(grouped, "PER_EXPERT_MIN_FLOPS", 2 * 1024 * n * k)
    for rows, want in (
        (8, "wgmma_grouped_gemv" if sm90 else "tensorcore_grouped_gemv"),
        (64, "wgmma_grouped_gemm" if sm90 else "tensorcore_grouped_gemm"),
        (1024, "per_expert"),
    ):
        a, sa, b, sb, offsets = (cp.asarray(v) for v in grouped_case(rng, [rows] * e, 0, n, k, "row_channel"))
        assert grouped.grouped_kernel_for(a, sa, b, sb, offsets, BF16) == want, rows
        if rows == 8:
            for env, value in (("VT_DENSE_CUBLASLT_FP8", "0"), ("VT_DISABLE_KERNELS", "wgmma_grouped_gemv")):
                monkeypatch.setenv(env, value)
                assert grouped.grouped_kernel_for(a, sa, b, sb, offsets, BF16) == "tensorcore_grouped_gemv", env
                monkeypatch.delenv(env)
        if rows == 64:
            monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", "0")
            assert grouped.grouped_kernel_for(a, sa, b, sb, offsets, BF16) == "tensorcore_grouped_gemm"
            monkeypatch.setenv("VT_DISABLE_KERNELS", "tensorcore_grouped_gemm")
            assert grouped.grouped_kernel_for(a, sa, b, sb, offsets, BF16) == "tensorcore_grouped_gemv"
            monkeypatch.delenv("VT_DENSE_CUBLASLT_FP8")
            monkeypatch.delenv("VT_DISABLE_KERNELS")


def test_a_prefill_grouped_gemm_is_captured_and_follows_new_offsets(cp):
    """The tile map is made on the device from the offsets: a captured prefill-sized call replays
    right on other counts (no read-back, unlike per_expert)."""
    from vtnumba.cuda import grouped

    rng = np.random.default_rng(71)
    counts = [40, 0, 90, 30]
    a, sa, b, sb, offsets = grouped_case(rng, counts, 4, 512, 1024, "row_channel")
    d = [cp.asarray(v) for v in (a, sa, b, sb, offsets)]
    try:  # the wgmma tiles where they run (sm_90), else the mma.sync ones
        name = grouped.grouped_kernel_for(d[0], d[1], d[2], d[3], d[4], F32, kernel="wgmma_grouped_gemm")
    except ValueError:
        name = "tensorcore_grouped_gemm"

    def check(y, a, sa, b, sb, offsets, out_dtype, block_size):
        return check_experts(y, a, sa, b, sb, offsets, out_dtype, block_size, name == "wgmma_grouped_gemm")

    grouped.grouped_scaled_mm(d[0], d[1], d[2], d[3], d[4], F32, kernel=name)  # compile and load first
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        y = grouped.grouped_scaled_mm(d[0], d[1], d[2], d[3], d[4], F32, kernel=name)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        assert check(y.get(), a, sa, b, sb, offsets, F32, None) > 0
        moved = np.array([0, 70, 75, 100, 160], np.int32)  # other counts, the same rows in all
        d[4][...] = cp.asarray(moved)
        graph.launch(stream)
        stream.synchronize()
        assert check(y.get(), a, sa, b, sb, moved, F32, None) > 0


# -- the grouped GEMV on the swapped wgmma pass (sm_90): the decode rows' kernel there --------------


def run_grouped_wgmma(cp, a, sa, b, sb, offsets, out_dtype, block_size, active=None):
    """tc_gemv's grouped wgmma launch into NaN-poisoned bits (``xp`` arrays); ``active``: a host
    active-experts map (None: every expert)."""
    from vtnumba.cuda.kernels import tc_gemv
    from vtnumba.cuda.runtime import device

    dev = device.current()
    d = [cp.asarray(v) for v in (a, sa, b, sb, offsets)]
    assert tc_gemv.grouped_wgmma_reason(d[0], d[1], d[2], d[3], block_size, dev) is None
    y = poisoned_bits(cp, a.shape[0], b.shape[1], out_dtype)
    kernel, grid, block, args, _ = tc_gemv.grouped_wgmma_launch(
        *d, y, out_dtype, block_size, dev, active=None if active is None else cp.asarray(active)
    )
    kernel(grid, block, *args)
    return y.get()


def dense_wgmma_by_slices(cp, a, sa, b, sb, offsets, out_dtype, block_size):
    """The dense wgmma GEMV's codes form (K unsplit, the grouped launch's ring) on every 8 rows of
    each expert, the padding rows 0, as host bits: what the grouped launch must give bit for bit, its
    blocks running the same pass on views of the expert."""
    from test_cudasim_grouped_tc import expert_scales

    from vtnumba.cuda.kernels import tc_gemv
    from vtnumba.cuda.runtime import device

    dev = device.current()
    block_scaled = block_size is not None
    n, k = b.shape[1], b.shape[2]
    bits = np.zeros((a.shape[0], n), dtype=np.float32 if np.dtype(out_dtype) == F32 else np.uint16)
    for e in range(b.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        for r0 in range(lo, hi, 8):
            r1 = min(hi, r0 + 8)
            sa_e, sb_e = expert_scales(sa, sb, e, r0, r1, block_scaled)
            sa_step = 0 if block_scaled or sa_e.shape[0] == 1 else 1
            sb_step = 0 if block_scaled or sb_e.shape[0] == 1 else 1
            y = poisoned_bits(cp, r1 - r0, n, out_dtype)
            kernel, grid, block, args, _ = tc_gemv.dense_wgmma_launch(
                r1 - r0, dev.placeholder("u16_2d"), 0, dev.placeholder("f32"), cp.asarray(b[e]), cp.asarray(sa_e),
                cp.asarray(sb_e), sb_step, out_dtype, None, tc_gemv.MODE_CODES, block_scaled, y, dev,
                plan=(1, tc_gemv.grouped_wgmma_stages(k)), a=cp.asarray(a[r0:r1]), sa_step=sa_step,
            )  # fmt: skip
            kernel(grid, block, *args)
            bits[r0:r1] = y.get()
    return bits


def _sm90_only():
    from vtnumba.cuda.runtime import device

    if tuple(device.current().cc) != (9, 0):
        pytest.skip("wgmma is sm_90's")


@pytest.mark.parametrize(
    "e, n, k, scales, out_dtype",
    [
        (128, 1536, 2048, "row_channel", BF16),  # Qwen3-30B-A3B gate_up
        (128, 2048, 768, "tensor_expert", F32),  # Qwen3-30B-A3B down
        (16, 1000, 1040, "row_expert", F16),  # a partial 64-row tile, a short last K block (16 codes)
        (16, 520, 1040, "block", BF16),  # 128 x 128 blocks: a partial weight block, a short K block
    ],
    ids=["qwen3_gate_up-row_channel-bf16", "qwen3_down-tensor_expert-f32", "partial-row_expert-f16", "block-bf16"],
)
def test_grouped_wgmma_gemv_is_the_dense_pass_by_slices(cp, e, n, k, scales, out_dtype):
    """The decode rows of 2-19 an expert (passes of 8: one, two and three; 9, 16 and 19 rows among
    them), empty experts first, in
    the middle and last, a padding tail, NaN codes in a's first and last row: bit for bit the dense
    wgmma pass on each expert's 8-row slices, the sampled experts within the tensor-core bound of the
    float64 reference, the padding rows 0 (the output is poisoned with NaN first)."""
    _sm90_only()
    rng = np.random.default_rng(e + n + k)
    counts = routed_counts(rng, e, 5, 19)
    counts[e // 4], counts[2 * e // 3] = 16, 9  # two passes: the second one full, and of one row
    block_size = BLOCK_SIZE if scales == "block" else None
    a, sa, b, sb, offsets = grouped_case(rng, counts, 5, n, k, scales)
    bits = run_grouped_wgmma(cp, a, sa, b, sb, offsets, out_dtype, block_size)
    np.testing.assert_array_equal(bits, dense_wgmma_by_slices(cp, a, sa, b, sb, offsets, out_dtype, block_size))
    y = bits.view(out_dtype) if np.dtype(out_dtype) != F32 else bits
    routed = [i for i, c in enumerate(counts) if c]
    sample = sorted({routed[0], e // 3, routed[-1]})  # the first, the 19-row one and the last
    compared = check_experts(y, a, sa, b, sb, offsets, out_dtype, block_size, True, sample)
    assert compared > sum(counts[i] for i in sample) * n * 9 // 10
    assert np.isnan(y[0].astype(np.float32)).all(), "the NaN code of a[0, 0] did not reach row 0"


def test_grouped_wgmma_gemv_runs_the_active_experts_only(cp):
    """Decode at one token (8 of 128 experts routed a row each) through grouped_scaled_mm: the
    active-experts map gives the grid min(E, P) + 1 = 11 rows of blocks (-1 entries return at once);
    the result is the dense pass's bits, the padding rows 0."""
    _sm90_only()
    from vtnumba.cuda import grouped
    from vtnumba.cuda.kernels import tc_gemv

    rng = np.random.default_rng(91)
    counts = [0] * 128
    for i in rng.choice(128, 8, replace=False):
        counts[int(i)] = 1
    a, sa, b, sb, offsets = grouped_case(rng, counts, 2, 256, 512, "row_channel")
    d = [cp.asarray(v) for v in (a, sa, b, sb, offsets)]
    assert grouped.grouped_kernel_for(*d, F32) == "wgmma_grouped_gemv"
    seen = []
    real = tc_gemv.grouped_wgmma_launch

    def spy(*args, **kw):
        launch = real(*args, **kw)
        seen.append(launch[1])
        return launch

    tc_gemv.grouped_wgmma_launch = spy
    try:
        y = grouped.grouped_scaled_mm(*d, F32).get()
    finally:
        tc_gemv.grouped_wgmma_launch = real
    assert seen == [(4, a.shape[0] + 1)], seen  # min(E, P) map rows and the padding row
    np.testing.assert_array_equal(y, dense_wgmma_by_slices(cp, a, sa, b, sb, offsets, F32, None))
    assert (y[8:] == 0).all()
