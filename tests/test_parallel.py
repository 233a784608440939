"""Tensor parallelism's shard arithmetic on the CPU (seam.parallel), simulated in one process: split
the weight, apply each rank's shard, combine; the result is held to G3.

- column-parallel: every rank quantizes the whole x (the same codes and scales), so the concatenated
  outputs are the unsharded GEMM: G3 against the unsharded codes and scales, every scheme;
- row-parallel, static and per-group activations: each rank's codes and scales are exactly its
  slice of the unsharded ones (a replicated static scale; per-group groups never straddle ranks),
  so the reduced result is again within G3 of the unsharded GEMM;
- row-parallel, dynamic and per-token activations: each rank quantizes its slice with its own scale
  (vLLM's RowParallelLinear does the same), a different lossy pipeline: the unsharded GEMM with one
  activation scale per (row, shard). That is a block-scaled GEMM whose K-blocks are the shards, and
  it is held to DESIGN.md's G3-per-block bound (``assert_block_g3``) over the unsharded weight.
"""

import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtnumba import _arrays, seam
from vtnumba.testing.gates import assert_block_g3, assert_g3
from vtnumba.testing.parallel import SimulatedGroup

OUT_DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
# (activation_scheme, per_channel weight scale, block-scaled, scale_ue8m0 or "e8m0" (E8M0 byte scales))
SCHEMES = {
    "static": ("static", False, False, False),
    "static_per_channel": ("static", True, False, False),
    "dynamic": ("dynamic", False, False, False),
    "dynamic_per_channel": ("dynamic", True, False, False),
    "per_token": ("per_token", True, False, False),
    "per_token_per_tensor": ("per_token", False, False, False),
    "block": ("per_group", False, True, False),
    "block_ue8m0": ("per_group", False, True, True),
    "block_e8m0": ("per_group", False, True, "e8m0"),
    "mxfp8": ("per_group", False, True, "e8m0"),  # block_size (1, 32): MXFP8 activations too
}
# TP_EXAMPLES=400 for a longer search when changing seam.parallel (400 examples took ~2 s)
FAST = settings(
    max_examples=int(os.environ.get("TP_EXAMPLES", 12)), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _weight(rng, n, k, scheme, bias, block_size=None):
    act, per_channel, block, ue8m0 = SCHEMES[scheme]
    w = (rng.standard_normal((n, k)) * rng.uniform(0.02, 0.3, (n, 1))).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    if block:
        scales = dict(scale_format="e8m0") if ue8m0 == "e8m0" else dict(scale_ue8m0=ue8m0)
        return seam.Fp8Weight.from_float(w, bias=b, block_size=block_size, **scales)
    return seam.Fp8Weight.from_float(
        w,
        input_scale=np.float32(0.0213) if act == "static" else None,
        per_channel=per_channel,
        activation_scheme=act,
        bias=b,
    )


def _unsharded_g3(y, q, w, out_dtype):
    """G3 of y against the unsharded GEMM of activation q and weight w."""
    if w.block_size is not None:
        return assert_block_g3(y, q.data, w.data, q.scale, w.weight_scale, w.block_size, w.bias, out_dtype)
    return assert_g3(y, q.data, w.data, q.scale, w.weight_scale, w.bias, out_dtype)


def _row_g3(y, x_shards, shards, w, out_dtype):
    """G3 of a row-parallel result: against the unsharded GEMM where each rank's codes and scales are
    its slice of the unsharded ones (asserted here), else per K-block, the blocks being the shards."""
    qs = [seam.quantize_activation(xr, s) for xr, s in zip(x_shards, shards)]
    q_full = seam.quantize_activation(np.concatenate(x_shards, axis=1), w)
    a = np.concatenate([q.data for q in qs], axis=1)
    if w.activation_scheme in ("static", "per_group"):
        np.testing.assert_array_equal(a, q_full.data)
        np.testing.assert_array_equal(
            np.concatenate([q.scale for q in qs], axis=-1) if w.block_size else qs[0].scale, q_full.scale
        )
        return _unsharded_g3(y, q_full, w, out_dtype)
    m, r = a.shape[0], len(shards)
    sa = np.concatenate([np.broadcast_to(q.scale.reshape(-1, 1), (m, 1)) for q in qs], axis=1)
    sb = np.repeat(np.broadcast_to(w.weight_scale.reshape(-1, 1), (w.shape[0], 1)), r, axis=1)
    return assert_block_g3(y, a, w.data, sa, sb, (1, w.shape[1] // r), w.bias, out_dtype)


@st.composite
def problems(draw, mode):
    """(scheme, world_size, weight, x, out_dtype): sizes that split evenly (odd shards included), for
    block-scaled weights whole blocks per rank along the split and any size (a short last block)
    across it, and at world_size 1 any size at all."""
    scheme = draw(st.sampled_from(sorted(SCHEMES)))
    world = draw(st.sampled_from([1, 2, 3, 4]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    m = draw(st.integers(1, 4))
    block = None
    if SCHEMES[scheme][2]:
        block = (
            (1, 32)
            if scheme == "mxfp8"
            else (draw(st.sampled_from([1, 2, 3, 4, 8])), draw(st.sampled_from([2, 3, 4, 8, 16])))
        )
        split, other = (block[0], "k") if mode == "column" else (block[1], "n")
        along = world * split * draw(st.integers(1, 2)) if world > 1 else draw(st.integers(1, 20))
        across = draw(st.integers(1, 20))
        n, k = (along, across) if mode == "column" else (across, along)
    else:
        n = draw(st.integers(1, 5)) * (world if mode == "column" else 1)
        k = draw(st.integers(1, 9)) * (world if mode == "row" else 1)
        if mode == "column":
            n = max(n, world)
    w = _weight(rng, n, k, scheme, draw(st.booleans()), block)
    x = (rng.standard_normal((m, k)) * draw(st.sampled_from([0.01, 1.0, 30.0]))).astype(np.float32)
    return scheme, world, w, x, draw(st.sampled_from(OUT_DTYPES))


@FAST
@given(problems("column"))
def test_column_parallel_concatenated_is_the_unsharded_gemm_within_g3(problem):
    scheme, world, w, x, out_dtype = problem
    ys = [seam.ColumnParallelLinearMethod(w, r, world).apply(x, out_dtype) for r in range(world)]
    assert all(y.shape == (x.shape[0], w.shape[0] // world) for y in ys)
    assert _unsharded_g3(np.concatenate(ys, axis=1), seam.quantize_activation(x, w), w, out_dtype) > 0


@FAST
@given(problems("row"))
def test_row_parallel_reduced_is_within_g3(problem):
    scheme, world, w, x, out_dtype = problem
    kr = w.shape[1] // world
    x_shards = [x[:, r * kr : (r + 1) * kr] for r in range(world)]
    group = SimulatedGroup(world)
    ys = group.run(
        lambda r, all_reduce: seam.RowParallelLinearMethod(w, r, world, all_reduce).apply(x_shards[r], out_dtype)
    )
    assert group.calls == 1
    for y in ys[1:]:  # every rank holds the same result
        np.testing.assert_array_equal(y.view(np.uint8), ys[0].view(np.uint8))
    shards = [seam.shard_weight(w, r, world, mode="row") for r in range(world)]
    assert _row_g3(ys[0], x_shards, shards, w, out_dtype) > 0


@pytest.mark.parametrize("mode", ["column", "row"])
def test_deepseek_128x128_blocks_split_at_block_boundaries(mode):
    """DeepSeek-V3's 128 x 128 blocks, two ranks, the split dimension 256, the other one not a
    multiple of 128 (a short last block across the split)."""
    rng = np.random.default_rng(26)
    n, k = (256, 200) if mode == "column" else (200, 256)
    w = _weight(rng, n, k, "block", True, (128, 128))
    x = rng.standard_normal((3, k)).astype(np.float32)
    if mode == "column":
        ys = [seam.ColumnParallelLinearMethod(w, r, 2).apply(x) for r in range(2)]
        assert [s.weight_scale.shape for s in (seam.shard_weight(w, r, 2, mode=mode) for r in range(2))] == [(1, 2)] * 2
        assert _unsharded_g3(np.concatenate(ys, axis=1), seam.quantize_activation(x, w), w, np.float32) > 0
    else:
        group = SimulatedGroup(2)
        ys = group.run(lambda r, ar: seam.RowParallelLinearMethod(w, r, 2, ar).apply(x[:, r * 128 : (r + 1) * 128]))
        shards = [seam.shard_weight(w, r, 2, mode=mode) for r in range(2)]
        assert [s.weight_scale.shape for s in shards] == [(2, 1)] * 2
        assert group.calls == 1 and _row_g3(ys[0], [x[:, :128], x[:, 128:]], shards, w, np.float32) > 0


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_column_shards_fuse_back_to_the_weight(scheme):
    """shard_weight(mode='column') is the inverse of seam.fuse_fp8_shards: the shards of every scheme,
    fused again, are the weight's codes, scales and bias bit for bit (nothing is requantized)."""
    rng = np.random.default_rng(27)
    block = (1, 32) if scheme == "mxfp8" else (2, 4) if SCHEMES[scheme][2] else None
    w = _weight(rng, 12, 16, scheme, True, block)
    fused = seam.fuse_fp8_shards([seam.shard_weight(w, r, 3, mode="column") for r in range(3)])
    np.testing.assert_array_equal(fused.data, w.data)
    np.testing.assert_array_equal(np.broadcast_to(fused.weight_scale, w.weight_scale.shape), w.weight_scale)
    np.testing.assert_array_equal(fused.bias, w.bias)
    assert fused.input_scale == w.input_scale and fused.activation_scheme == w.activation_scheme
    assert np.count_nonzero(w.data) > 0


@pytest.mark.parametrize("scheme", ["static", "per_token", "block"])
def test_row_shards_hold_their_columns_and_no_bias(scheme):
    rng = np.random.default_rng(28)
    w = _weight(rng, 6, 16, scheme, True, (2, 4) if scheme == "block" else None)
    shards = [seam.shard_weight(w, r, 2, mode="row") for r in range(2)]
    np.testing.assert_array_equal(np.concatenate([s.data for s in shards], axis=1), w.data)
    assert all(s.bias is None for s in shards)
    if scheme == "block":
        np.testing.assert_array_equal(np.concatenate([s.weight_scale for s in shards], axis=1), w.weight_scale)
    else:
        assert all(s.weight_scale is w.weight_scale for s in shards)  # replicated, as in vLLM


def _silu_mul(gate_up, width):
    g, u = gate_up[:, :width].astype(np.float32), gate_up[:, width:].astype(np.float32)
    return (g / (1 + np.exp(-g)) * u).astype(gate_up.dtype)


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token", "block"])
@pytest.mark.parametrize("world", [2, 3])
def test_column_then_row_mlp_makes_exactly_one_all_reduce(scheme, world):
    """A Llama MLP: fused gate/up column-parallel (each rank gets its share of gate and of up), SiLU
    and the product on the rank's own features, down row-parallel: one all-reduce per rank, each
    layer within G3, and every rank holding the same output."""
    rng = np.random.default_rng(29 + world)
    hidden, inter = 24, 16 * world
    block = (4, 8) if scheme == "block" else None
    gate, up = (_weight(rng, inter, hidden, scheme, False, block) for _ in range(2))
    gate_up = seam.fuse_fp8_shards([gate, up])
    down = _weight(rng, hidden, inter, scheme, True, block)
    x = rng.standard_normal((3, hidden)).astype(np.float32)
    h_shards = {}

    def rank_mlp(rank, all_reduce):
        col = seam.ColumnParallelLinearMethod(gate_up, rank, world)  # logical widths from the fusion
        h = _silu_mul(col.apply(x), inter // world)
        h_shards[rank] = h
        return seam.RowParallelLinearMethod(down, rank, world, all_reduce).apply(h)

    group = SimulatedGroup(world)
    ys = group.run(rank_mlp)
    assert group.calls == 1
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])
    # column: rank r's h is SiLU(gate_r) * up_r of the unsharded gate/up product
    gu = seam.matmul_fp8(x, gate_up)
    assert _unsharded_g3(gu, seam.quantize_activation(x, gate_up), gate_up, np.float32) > 0
    iw = inter // world
    for r in range(world):
        cols = np.r_[r * iw : (r + 1) * iw, inter + r * iw : inter + (r + 1) * iw]
        np.testing.assert_allclose(h_shards[r], _silu_mul(gu[:, cols], iw), rtol=1e-5, atol=1e-6)
    shards = [seam.shard_weight(down, r, world, mode="row") for r in range(world)]
    assert _row_g3(ys[0], [h_shards[r] for r in range(world)], shards, down, np.float32) > 0


def test_llama_block_seven_layers_two_all_reduces():
    """The seven linear layers of a Llama block over 2 ranks, bfloat16 activations: q/k/v fused
    and column-parallel, o row-parallel (attention reduced here to taking v, per rank on its own
    heads), then the MLP: two all-reduces per rank, as vLLM's LlamaDecoderLayer makes."""
    rng = np.random.default_rng(30)
    world, hidden, heads_dim, inter = 2, 32, 32, 48
    q, k, v = (_weight(rng, heads_dim, hidden, "per_token", False) for _ in range(3))
    qkv = seam.fuse_fp8_shards([q, k, v])
    o = _weight(rng, hidden, heads_dim, "per_token", False)
    gate_up = seam.fuse_fp8_shards([_weight(rng, inter, hidden, "per_token", False) for _ in range(2)])
    down = _weight(rng, hidden, inter, "per_token", False)
    x = rng.standard_normal((4, hidden)).astype(ml_dtypes.bfloat16)
    seen = {}

    def block(rank, all_reduce):
        local = seam.ColumnParallelLinearMethod(qkv, rank, world).apply(x)
        assert local.shape == (4, 3 * heads_dim // world)
        attn = local[:, 2 * heads_dim // world :]  # this rank's v heads
        o_out = seam.RowParallelLinearMethod(o, rank, world, all_reduce).apply(attn)
        h = x + o_out
        act = _silu_mul(seam.ColumnParallelLinearMethod(gate_up, rank, world).apply(h), inter // world)
        down_out = seam.RowParallelLinearMethod(down, rank, world, all_reduce).apply(act)
        seen[rank] = attn, o_out, act, down_out
        return h + down_out

    group = SimulatedGroup(world)
    ys = group.run(block)
    assert group.calls == 2
    np.testing.assert_array_equal(ys[0].view(np.uint16), ys[1].view(np.uint16))
    assert ys[0].dtype == x.dtype and np.isfinite(ys[0].astype(np.float32)).all()
    # each row-parallel layer within G3 of its pipeline (the column ones: the tests above)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    for w, (x_at, y_at) in ((o, (0, 1)), (down, (2, 3))):
        shards = [seam.shard_weight(w, r, world, mode="row") for r in range(world)]
        assert _row_g3(seen[0][y_at], [seen[r][x_at] for r in range(world)], shards, w, bf16) > 0
    # the unsharded block: FP8's own error apart (the row layers quantize per shard), the same
    vv = seam.matmul_fp8(x, qkv)[:, 2 * heads_dim :]
    h = x + seam.matmul_fp8(vv, o)
    want = (h + seam.matmul_fp8(_silu_mul(seam.matmul_fp8(h, gate_up), inter), down)).astype(np.float32)
    assert np.linalg.norm(ys[0].astype(np.float32) - want) < 0.05 * np.linalg.norm(want)


def test_simulated_group_counts_and_sums_in_float32():
    group = SimulatedGroup(3)
    out = group.run(lambda r, ar: ar(np.full(2, 2.0**24 if r == 0 else 1.0, np.float32)))
    assert group.calls == 1 and all((o == np.float32(2.0**24)).all() for o in out)  # (2^24 + 1) + 1 in f32
    with pytest.raises(AssertionError, match="different numbers"):
        group.run(lambda r, ar: ar(np.ones(1, np.float32)) if r else None)


# -- the combine step -------------------------------------------------------------------------------


def test_combine_adds_bias_after_the_sum_and_rounds_once():
    partial = np.array([[1e8, 1.0]], np.float32)
    bias = np.array([-1e8, 0.5], np.float32)
    y = seam.combine_partials(partial, lambda p: p * np.float32(2), bias=bias, out_dtype="bfloat16")
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y, np.array([[1e8, 2.5]], np.float32).astype(ml_dtypes.bfloat16))
    calls = []
    seam.combine_partials(partial, lambda p: calls.append(1), out_dtype=np.float32)  # None: summed in place
    assert calls == [1]


def test_bfloat16_bits_round_to_nearest_even_as_ml_dtypes():
    """The cupy combine's bfloat16 rounding (``_arrays.bfloat16_bits``), run here on numpy."""
    rng = np.random.default_rng(31)
    x = np.concatenate(
        [
            (rng.standard_normal(4096) * 10.0 ** rng.integers(-40, 38, 4096)).astype(np.float32),
            np.array([np.inf, -np.inf, 3.4e38, -0.0, 1 + 2**-8, 1 + 3 * 2**-8], np.float32),
        ]
    )
    np.testing.assert_array_equal(_arrays.bfloat16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    nan = _arrays.bfloat16_bits(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(nan.view(ml_dtypes.bfloat16).astype(np.float32)).all()


# -- bad input ---------------------------------------------------------------------------------------


def _w(n=8, k=16, **kw):
    return seam.Fp8Weight.from_float(np.ones((n, k), np.float32), **kw)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: seam.shard_weight(_w(), 2, 2, mode="column"), r"rank must be in \[0, 2\).*got 2"),
        (lambda: seam.shard_weight(_w(), -1, 2, mode="column"), r"rank must be in .*got -1"),
        (lambda: seam.shard_weight(_w(), 0, 0, mode="column"), r"world_size must be >= 1, got 0"),
        (lambda: seam.shard_weight(_w(), 0, 2, mode="diagonal"), r"mode must be 'column' or 'row', got 'diagonal'"),
        (lambda: seam.shard_weight(_w(n=9), 0, 2, mode="column"), r"N must be divisible by world_size=2.*got 9"),
        (
            lambda: seam.shard_weight(_w(k=15), 0, 3, mode="row") and seam.shard_weight(_w(k=16), 0, 3, mode="row"),
            r"K must be divisible by world_size=3.*got 16",
        ),
        (
            lambda: seam.shard_weight(_w(n=16, k=16, block_size=(8, 8)), 0, 4, mode="column"),
            r"N / world_size = 16 / 4 = 4 must be a multiple of the block size 8",
        ),
        (
            lambda: seam.shard_weight(_w(n=16, k=48, block_size=(8, 16)), 0, 2, mode="row"),
            r"K / world_size = 48 / 2 = 24 must be a multiple of the block size 16",
        ),
        (
            lambda: seam.shard_weight(_w(), 0, 2, mode="row", logical_widths=[4, 4]),
            r"logical_widths applies to mode='column'",
        ),
        (
            lambda: seam.shard_weight(_w(), 0, 2, mode="column", logical_widths=[4, 5]),
            r"logical_widths must .*sum to N = 8",
        ),
        (
            lambda: seam.shard_weight(_w(n=12), 0, 2, mode="column", logical_widths=[3, 9]),
            r"logical_widths\[0\] must be divisible by world_size=2.*got 3",
        ),
        (lambda: seam.RowParallelLinearMethod(_w(), 0, 2, None), r"all_reduce must be given for world_size=2"),
        (
            lambda: seam.combine_partials(np.ones((1, 2), np.float32), lambda p: np.ones((2, 2), np.float32)),
            r"all_reduce must return the float32 sum of shape \(1, 2\)",
        ),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: seam.shard_weight(np.ones((4, 4), np.float32), 0, 1, mode="row"), r"weight must be an Fp8Weight"),
        (lambda: seam.shard_weight(_w(), 0.0, 1, mode="row"), r"rank must be an int, got float"),
        (lambda: seam.RowParallelLinearMethod(_w(), 0, 1, all_reduce=3), r"all_reduce must be a callable"),
        (lambda: seam.combine_partials(np.ones((1, 2), np.float16), None), r"partial must be float32"),
    ],
)
def test_bad_types_are_type_errors(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_a_failing_rank_reports_its_own_error_not_a_hang():
    def fn(rank, all_reduce):
        if rank == 1:
            raise KeyError("the real cause")
        return all_reduce(np.ones(2, np.float32))

    with pytest.raises(RuntimeError, match=r"rank 1 failed: KeyError\('the real cause'\)"):
        SimulatedGroup(np.int64(2)).run(fn)


def test_world_size_one_takes_any_logical_widths():
    rng = np.random.default_rng(33)
    w = _weight(rng, 256, 16, "block", False, (128, 128))
    shard = seam.shard_weight(w, 0, 1, mode="column", logical_widths=[100, 156])
    np.testing.assert_array_equal(shard.data, w.data)
