"""The GPU's mixture-of-experts steps (vtnumba.cuda.experts) under the CUDA simulator, against the CPU
backend (vtnumba.cpu.experts), the reference: align exactly (and pair by pair), gather and static
quantization bitwise, SiLU-and-quantize within the stated exp tolerance, the grouped GEMM within G3
per expert for every scale kind (and near the CPU), the combine bitwise; empty experts, the -1 / E
sentinels, a padding tail; and seam.moe_fp8 / grouped_matmul_fp8 end to end on the GPU steps.

The exp tolerance: GPU ``expf`` (and the simulator's double-precision ``math.exp`` rounded to float32)
may differ from numpy's float32 ``exp`` by an ulp or two, so a SiLU activation may differ by a few
ulps (checked: relative 2^-20), a scale by as much (float32), an E8M0 byte by at most one, and a
code by one step where the activation sits on a rounding boundary: at most 2% of the codes, each
within one step (same sign). Everything else is compared byte for byte.

Shapes are tiny: the simulator runs every thread as a Python thread."""

import types

import ml_dtypes
import numpy as np
import pytest

from vtnumba.cpu import experts as cpu

pytestmark = [pytest.mark.cudasim, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)


@pytest.fixture(scope="module")
def gpu():
    from vtnumba.cuda import experts

    return experts


def _ids(rng, t, k, e, empty=(1,)):
    """topk ids [T, k] with the sentinels -1 and E and no pair for the experts ``empty``."""
    live = np.array([i for i in range(e) if i not in empty])
    ids = rng.choice(live, size=(t, k))
    if t * k >= 4:
        ids.flat[1] = -1
        ids.flat[-2] = e
    return ids


def _offsets(counts):
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


# -- align ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "t,k,e,dtype",
    [
        (6, 2, 5, np.int64),
        (40, 2, 7, np.int32),
        (3, 4, 40, np.int64),
        (1, 1, 3, np.int64),
        (0, 2, 4, np.int64),
        (70, 3, 9, np.int64),  # 210 pairs: four chunks of the multi-block align
    ],
)
def test_align_gives_the_cpu_order(gpu, t, k, e, dtype):
    from vtnumba.cuda.kernels import moe

    assert moe.align_blocks(t * k) == max(1, -(-t * k // moe.ALIGN_CHUNK))
    if t * k > 200:
        assert moe.align_blocks(t * k) > 2
    rng = np.random.default_rng(t + k + e)
    ids = _ids(rng, t, k, e).astype(dtype)
    offsets, pair_row, row_token = gpu.moe_align(ids, e)
    want = cpu.moe_align(ids, e)
    np.testing.assert_array_equal(offsets, want[0])
    # per pair: each routed pair's row lies in its expert's segment and names its token
    for (ti, j), row in np.ndenumerate(pair_row):
        eid = ids[ti, j]
        if 0 <= eid < e:
            assert offsets[eid] <= row < offsets[eid + 1] and row_token[row] == ti
        else:
            assert row == -1
    routed = pair_row[pair_row >= 0]
    assert len(set(routed.tolist())) == routed.size == offsets[-1]
    assert (row_token[offsets[-1] :] == 0).all()
    # and the order is the CPU's stable one, bit for bit
    np.testing.assert_array_equal(pair_row, want[1])
    np.testing.assert_array_equal(row_token, want[2])


def test_align_skips_every_out_of_range_id(gpu):
    ids = np.array([[-5, 3], [4, 1 << 40], [-1, 0]], dtype=np.int64)
    offsets, pair_row, row_token = gpu.moe_align(ids, 4)
    np.testing.assert_array_equal(offsets, [0, 1, 1, 1, 2])
    np.testing.assert_array_equal(pair_row, [[-1, 1], [-1, -1], [-1, 0]])
    np.testing.assert_array_equal(row_token, [2, 0, 0, 0, 0, 0])


# -- gather and static quantization ------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,dtype",
    [
        ((5, 48), np.uint8),
        ((5, 20), np.uint8),
        ((5,), np.float32),
        ((5, 3), BF16),
        ((5, 3), np.uint8),
        ((5, 2), np.float32),
    ],
)
def test_gather_gives_the_cpu_rows(gpu, shape, dtype):
    rng = np.random.default_rng(len(shape))
    src = (
        rng.integers(0, 256, size=shape[:1] + (int(np.prod(shape[1:])) * np.dtype(dtype).itemsize,), dtype=np.uint8)
        .view(dtype)
        .reshape(shape)
    )
    row_token = np.array([4, 0, 0, 2, 3, 3, 1, 0], dtype=np.int32)
    got = gpu.gather_rows(src, row_token)
    want = cpu.gather_rows(src, row_token)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", [F32, BF16, np.dtype(np.float16)], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("cols", [48, 37])
def test_static_rows_give_the_cpu_bytes(gpu, dtype, cols):
    rng = np.random.default_rng(cols)
    offsets = _offsets([2, 0, 3, 1])  # an empty expert
    p = 8  # two padding rows
    x = (rng.standard_normal((p, cols)) * rng.choice([1e-3, 1.0, 30.0], size=(p, cols))).astype(np.float32)
    x[0, 1], x[3, 2], x[4, 3] = np.nan, np.inf, -1e6
    x = x.astype(dtype)
    scales = np.array([0.0092, 0.5, 0.13, 7.25], dtype=np.float32)  # 0.0092, 0.13: a divide-for-multiply slip
    codes, s = gpu.quantize_rows_static(x, offsets, scales)
    want_codes, want_s = cpu.quantize_rows_static(x, offsets, scales)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(s.view(np.uint32), want_s.view(np.uint32))
    assert (codes[6:] == 0).all() and (s[6:] == 1).all() and np.count_nonzero(codes) > x.size // 2


# -- SiLU-and-multiply (and quantize) ------------------------------------------------------------------


def _hidden(rng, p, half):
    h = (rng.standard_normal((p, 2 * half)) * rng.choice([0.1, 1.0, 8.0], size=(p, 2 * half))).astype(np.float32)
    h[0, 0], h[1, 1], h[2, half + 2] = -200.0, np.nan, np.inf  # exp overflow, NaN, inf
    return h


@pytest.mark.parametrize("half", [40, 42], ids=["wide", "narrow"])
def test_silu_mul_matches_the_cpu(gpu, half):
    from vtnumba.cuda.kernels import moe

    assert moe.silu_width(half, moe.WIDE, True) == (moe.WIDE if half == 40 else 1)
    rng = np.random.default_rng(1)
    h = _hidden(rng, 6, half)
    offsets = _offsets([3, 0, 2])  # one padding row
    got = gpu.silu_mul(h, offsets)
    want = cpu.silu_mul(h, offsets)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2.0**-20, atol=0)
    assert (got[5] == 0).all()


def _assert_codes_close(got, want):
    """Codes equal but for the exp tolerance (module docstring)."""
    assert got.dtype == np.uint8 and got.shape == want.shape
    diff = got != want
    if diff.any():
        g, w = got[diff].astype(int), want[diff].astype(int)
        assert diff.mean() <= 0.02, f"{int(diff.sum())} of {diff.size} codes differ"
        assert ((g & 0x80) == (w & 0x80)).all() and (np.abs(g - w) == 1).all(), (g[:8], w[:8])
    assert np.count_nonzero(want) > want.size // 3


def _assert_scales_close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype == np.uint8:
        assert (np.abs(got.astype(int) - want.astype(int)) <= 1).all() and (got == want).mean() >= 0.9
    else:
        np.testing.assert_allclose(got, want, rtol=2.0**-20, atol=0)


def _down(scheme, block_size=None, input_scale=None, fmt="float32", rounding=None, ue8m0=False):
    return types.SimpleNamespace(
        activation_scheme=scheme,
        block_size=block_size,
        input_scale=input_scale,
        activation_scale_format=fmt,
        activation_scale_rounding=rounding,
        scale_ue8m0=ue8m0,
    )


DOWNS = {
    "static": _down("static", input_scale=np.array([0.02, 0.5, 0.13], np.float32)),
    "dynamic": _down("dynamic"),
    "per_token": _down("per_token"),
    "per_group": _down("per_group", (32, 32)),
    "per_group_ue8m0": _down("per_group", (16, 16), ue8m0=True),
    "mx_rceil": _down("per_group", (1, 32), fmt="e8m0", rounding="rceil"),
    "mx_floor": _down("per_group", (1, 32), fmt="e8m0", rounding="floor"),
    "per_group_64": _down("per_group", (64, 64)),
}


@pytest.mark.parametrize("half", [40, 42], ids=["wide", "narrow"])
@pytest.mark.parametrize("name", sorted(DOWNS))
def test_silu_mul_quantize_gives_the_cpu_codes(gpu, name, half):
    """I = 40: four columns a lane, a short last group of 32, a group of 64 as 16 lanes of one step;
    I = 42: a column a lane, the group of 64 walked by the warp (wider than a step)."""
    from vtnumba.cuda.kernels import moe
    from vtnumba.seam.experts import _quantize_rows

    rng = np.random.default_rng(len(name))
    dn = DOWNS[name]
    if dn.block_size is not None:
        g = int(dn.block_size[1])
        width = moe.silu_width(half, g, True)
        assert width == (moe.WIDE if half == 40 else 1)
        assert moe.silu_segment(g, width) == (0 if (g, width) == (64, 1) else g // width)
    h = _hidden(rng, 6, half)
    offsets = _offsets([3, 0, 2])  # an empty expert, one padding row
    codes, scale = gpu.silu_mul_quantize(h, offsets, dn)
    want_codes, want_scale = _quantize_rows(cpu.silu_mul(h, offsets), dn, offsets, cpu)  # the seam's unfused steps
    _assert_codes_close(codes, want_codes)
    _assert_scales_close(scale, want_scale)
    assert (codes[5] == 0).all()


# -- the grouped GEMM ---------------------------------------------------------------------------------


def _codes(rng, shape, nan=False):
    c = rng.integers(0, 256, size=shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = 0x3C
    if nan:
        c.flat[5] = 0x7F
    return c


def _operands(rng, kind, counts, n, k, pad=1):
    """(a, scale_a, b, scale_b, offsets, block_size) for one scale kind; ``pad`` padding rows."""
    e = len(counts)
    offsets = _offsets(counts)
    p = int(offsets[-1]) + pad
    a, b = _codes(rng, (p, k)), _codes(rng, (e, n, k))
    f = lambda *s: (10.0 ** rng.uniform(-3, 1, size=s)).astype(np.float32)  # noqa: E731
    u = lambda *s: rng.integers(110, 140, size=s, dtype=np.uint8)  # noqa: E731
    if kind == "dynamic":
        return a, f(1), b, f(e), offsets, None
    if kind == "static":
        return a, f(p), b, f(e), offsets, None
    if kind == "per_channel":
        return a, f(p), b, f(e, n), offsets, None
    bn, bk = {"block": (16, 32), "block128": (128, 128), "ue8m0": (128, 128), "mx": (1, 32), "odd": (8, 24)}[kind]
    nkb, nnb = -(-k // bk), -(-n // bn)
    sa = u(p, nkb) if kind == "mx" else f(p, nkb)
    sb = u(e, nnb, nkb) if kind in ("mx", "ue8m0") else f(e, nnb, nkb)
    return a, sa, b, sb, offsets, (bn, bk)


def _assert_expert_g3(y, a, sa, b, sb, offsets, block_size, out_dtype=F32):
    from vtnumba.testing.gates import assert_block_g3, assert_g3

    compared = 0
    for e in range(b.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        if block_size is None:
            sae = sa[lo:hi] if sa.size > 1 else sa[0]
            sbe = sb[e] if sb.ndim == 2 else sb[e]
            compared += assert_g3(y[lo:hi], a[lo:hi], b[e], sae, sbe, None, out_dtype)
        else:
            compared += assert_block_g3(y[lo:hi], a[lo:hi], b[e], sa[lo:hi], sb[e], block_size, None, out_dtype)
    assert (np.asarray(y[int(offsets[-1]) :]).astype(np.float64) == 0).all()  # the padding rows
    return compared


# kinds and the kernel each must take under the simulator
GEMM_CASES = [
    ("dynamic", 32, 16, "grouped"),
    ("static", 32, 16, "grouped"),
    ("per_channel", 48, 20, "grouped"),
    ("block", 64, 24, "grouped"),
    ("block128", 128, 16, "grouped"),
    ("ue8m0", 128, 16, "grouped"),
    ("mx", 64, 16, "grouped"),
    ("odd", 48, 20, "grouped_general"),
    ("static", 40, 8, "grouped_general"),
    ("static", 544, 4, "grouped"),
]  # K = 544: two warps split K, their sums meet in shared memory


@pytest.mark.parametrize("kind,k,n,kernel", GEMM_CASES, ids=[f"{c[0]}-k{c[1]}" for c in GEMM_CASES])
def test_grouped_gemm_meets_g3_per_expert_for_every_scale_kind(gpu, kind, k, n, kernel):
    rng = np.random.default_rng(k + n + len(kind))
    counts = [1, 0, 5, 2]  # an empty expert, more rows than one 4-row slice, a short slice
    a, sa, b, sb, offsets, bs = _operands(rng, kind, counts, n, k)
    assert gpu.grouped_kernel_for(a, sa, b, sb, offsets, F32, bs) == kernel
    y = gpu.grouped_scaled_mm(a, sa, b, sb, offsets, F32, bs)
    assert _assert_expert_g3(y, a, sa, b, sb, offsets, bs) > y.size // 2
    want = cpu.grouped_scaled_mm(a, sa, b, sb, offsets, F32, bs)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("kind", ["static", "mx"])
def test_grouped_and_general_kernels_agree_and_take_16_bit_outputs(gpu, kind):
    rng = np.random.default_rng(3)
    a, sa, b, sb, offsets, bs = _operands(rng, kind, [2, 3, 0], 16, 64, pad=2)
    for kernel in ("grouped", "grouped_general"):
        y = gpu.grouped_scaled_mm(a, sa, b, sb, offsets, BF16, bs, kernel=kernel)
        assert y.dtype == BF16
        assert _assert_expert_g3(y, a, sa, b, sb, offsets, bs, BF16) > 0


def test_grouped_gemm_decode_rows_and_nan_codes(gpu):
    """One row in all (the 1-row slice), and NaN codes poisoning their row and column only."""
    rng = np.random.default_rng(4)
    a, sa, b, sb, offsets, bs = _operands(rng, "per_channel", [0, 1, 0], 16, 32, pad=0)
    y = gpu.grouped_scaled_mm(a, sa, b, sb, offsets, F32, bs)
    assert _assert_expert_g3(y, a, sa, b, sb, offsets, bs) > 0
    a2 = a.copy()
    b2 = b.copy()
    b2[1, 3, 7] = 0x7F
    y = gpu.grouped_scaled_mm(a2, sa, b2, sb, offsets, F32, bs)
    assert np.isnan(y[0, 3]) and np.isfinite(np.delete(y[0], 3)).all()


def test_per_expert_path_slices_rows_and_scales(gpu):
    """The per-expert path (cuBLASLt on a GPU; here forced, each expert on the simulator's GEMM)
    writes each expert's rows and zeroes the padding."""
    rng = np.random.default_rng(5)
    for kind in ("static", "per_channel", "block"):
        a, sa, b, sb, offsets, bs = _operands(rng, kind, [2, 0, 3], 16, 32, pad=2)
        y = gpu.grouped_scaled_mm(a, sa, b, sb, offsets, F32, bs, kernel="per_expert")
        want = cpu.grouped_scaled_mm(a, sa, b, sb, offsets, F32, bs)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-6 * float(np.abs(want).max()))


def test_kernel_choice_says_why(gpu):
    rng = np.random.default_rng(6)
    a, sa, b, sb, offsets, bs = _operands(rng, "static", [1, 1], 16, 40)
    with pytest.raises(ValueError, match="kernel 'grouped' cannot run this call: .*multiple of 16"):
        gpu.grouped_kernel_for(a, sa, b, sb, offsets, F32, bs, kernel="grouped")
    with pytest.raises(ValueError, match="kernel must be one of"):
        gpu.grouped_kernel_for(a, sa, b, sb, offsets, F32, bs, kernel="nope")
    from vtnumba.cuda import grouped

    call = grouped.GroupedCall(a, sa, b, sb, offsets, F32, bs)
    reasons = {k.name: k.reason(call, False) for k in grouped.KERNELS}
    assert "simulator" in reasons["tensorcore_grouped_gemv"]
    assert "simulator" in reasons["per_expert"]
    assert reasons["grouped_general"] is None


# -- combine ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", [F32, np.dtype(np.float16), BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("w_dtype", [F32, BF16], ids=["w32", "wbf16"])
@pytest.mark.parametrize("h", [24, 26], ids=["wide", "narrow"])
def test_combine_gives_the_cpu_bytes(gpu, out_dtype, w_dtype, h):
    from vtnumba.cuda.kernels import moe

    assert moe.combine_width(h, True) == (4 if h == 24 else 1)
    rng = np.random.default_rng(7)
    t, k, e = 5, 3, 4
    ids = _ids(rng, t, k, e)
    _, pair_row, _ = cpu.moe_align(ids, e)
    y = (rng.standard_normal((t * k, h)) * 10.0 ** rng.uniform(-3, 3, size=(t * k, 1))).astype(np.float32)
    w = rng.uniform(0, 1, size=(t, k)).astype(w_dtype)
    got = gpu.moe_combine(y, pair_row, w, out_dtype)
    want = cpu.moe_combine(y, pair_row, w, out_dtype)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


# -- the seam on the GPU steps --------------------------------------------------------------------------

SEAM_SCHEMES = {
    "dynamic": dict(),
    "static": dict(input_scale=[0.05, 0.04, 0.06, 0.03]),
    "per_token": dict(activation_scheme="per_token", per_channel=True),
    "block": dict(block_size=(16, 16)),
    "mx": dict(block_size=(1, 32), scale_format="e8m0"),
}


@pytest.mark.parametrize("name", sorted(SEAM_SCHEMES))
def test_moe_fp8_on_the_gpu_steps_is_near_the_cpu(gpu, name, monkeypatch):
    from vtnumba import seam
    from vtnumba.seam import experts as seam_experts

    rng = np.random.default_rng(len(name))
    e, h, i, t, k = 4, 32, 16, 4, 2
    opts = SEAM_SCHEMES[name]
    gu = seam.Fp8Experts.from_float(rng.standard_normal((e, 2 * i, h)).astype(np.float32) * 0.2, **opts)
    dn_opts = dict(opts, input_scale=[0.02, 0.03, 0.01, 0.02]) if "input_scale" in opts else opts
    dn = seam.Fp8Experts.from_float(rng.standard_normal((e, h, i)).astype(np.float32) * 0.2, **dn_opts)
    x = rng.standard_normal((t, h)).astype(np.float32)
    ids = _ids(rng, t, k, e)
    w = rng.uniform(0.1, 1, size=(t, k)).astype(np.float32)
    want = seam.moe_fp8(x, gu, dn, ids, w)
    want_mm = seam.grouped_matmul_fp8(x, gu, np.array([0, 2, 2, 3, 4]))
    monkeypatch.setattr(seam_experts, "_backend", lambda device: gpu)
    got = seam.moe_fp8(x, gu, dn, ids, w)
    got_mm = seam.grouped_matmul_fp8(x, gu, np.array([0, 2, 2, 3, 4]))
    for g, wv in ((got, want), (got_mm, want_mm)):
        assert g.dtype == wv.dtype and g.shape == wv.shape
        np.testing.assert_allclose(g, wv, rtol=0, atol=0.03 * float(np.abs(wv).max()))
        assert np.abs(wv).max() > 0


def test_sparse_routing_runs_a_grid_row_per_routed_expert(gpu):
    """Fewer rows than experts (decode): the active-experts map lists just the experts with rows, -1
    after them and E last, and both CUDA-core kernels give each routed expert its G3 result on that
    smaller grid (every other expert's rows, none, untouched)."""
    rng = np.random.default_rng(12)
    counts = [0, 0, 2, 0, 0, 1, 0, 0, 0, 0, 1, 0]  # 3 of 12 experts, P = 4 + 1 padding row
    a, sa, b, sb, offsets, bs = _operands(rng, "per_channel", counts, 16, 32)
    from vtnumba.cuda import grouped, steps

    steps.load()
    call = grouped.GroupedCall(a, sa, b, sb, offsets, F32, bs)
    active = np.asarray(grouped.active_map(call))
    assert active.shape == (6,) and sorted(active[:3]) == [2, 5, 10] and list(active[3:]) == [-1, -1, 12]
    for kernel in ("grouped", "grouped_general"):
        y = gpu.grouped_scaled_mm(a, sa, b, sb, offsets, F32, bs, kernel=kernel)
        assert _assert_expert_g3(y, a, sa, b, sb, offsets, bs) == 4 * 16


# -- the bound call ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["per_token", "mx"])  # the simulator runs about 25 s a case
def test_bound_moe_replays_the_steps_on_new_inputs(gpu, name, monkeypatch):
    """``bind_moe`` records one call's launches (none runs), and the bound call then gives the
    unbound steps' bytes on inputs it never saw: the per-call pointers (x, the routing, y, the
    scratch) are rewritten, nothing is read from the bind-time arrays. Every launch of the steps
    is in it, in order."""
    from vtnumba import seam
    from vtnumba.cuda import bound
    from vtnumba.seam import experts as seam_experts

    monkeypatch.setattr(seam_experts, "_backend", lambda device: gpu)
    rng = np.random.default_rng(7)
    e, h, i, t, k = 4, 32, 16, 3, 2
    opts = SEAM_SCHEMES[name]
    gu = seam.Fp8Experts.from_float(rng.standard_normal((e, 2 * i, h)).astype(np.float32) * 0.2, **opts)
    dn = seam.Fp8Experts.from_float(rng.standard_normal((e, h, i)).astype(np.float32) * 0.2, **opts)

    def inputs():
        return (
            rng.standard_normal((t, h)).astype(BF16),
            _ids(rng, t, k, e, empty=()),
            rng.uniform(0.1, 1, size=(t, k)).astype(np.float32),
        )

    x, ids, w = inputs()
    replay, why = bound.bind_moe(x, ids, w, lambda: seam_experts.MoeCall(x, gu, dn, ids, w).run())
    assert why is None and replay is not None
    assert replay.kernels[0] == "_align" and replay.kernels[-1] == "combine" and len(replay.kernels) >= 6, (
        replay.kernels
    )
    assert replay.out_shape == (t, h) and replay.out_dtype == BF16
    compared = 0
    for args in ((x, ids, w), inputs(), inputs()):
        want = seam_experts.MoeCall(args[0], gu, dn, *args[1:]).run()
        got = replay(*args, 0)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
        compared += int(np.count_nonzero(want.view(np.uint16)))
    assert compared > 0
