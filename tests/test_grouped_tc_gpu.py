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
