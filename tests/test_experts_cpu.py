"""Mixture-of-experts on the CPU (``vtnumba.cpu.experts``, through ``vtnumba.seam.experts``).

- the grouped GEMM: within G3 (G3 per block) of the float64 reference, and bitwise the per-expert
  ``vtnumba.cpu.scaled_mm`` / ``block_scaled_mm`` loop (the reference backend's own definition),
  for every scale kind and offsets with empty experts (first, middle, last), one-row experts, an
  expert past the small-M kernels and a padding tail, serial and parallel;
- align, static row quantization, SiLU-and-multiply and combine against independent loops;
- the seam: ``grouped_matmul_fp8`` against the per-expert ``matmul_fp8`` loop and ``moe_fp8``
  against a composite of the seam's dense ops, bitwise, for every activation scheme;
- bad input through the seam: an error naming the argument and the value.

Every gate counts what it compared and asserts it was something (non-zero outputs, rows).
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vtnumba as vt
from vtnumba import seam
from vtnumba.cpu import block_scaled_mm, scaled_mm
from vtnumba.cpu import experts as cx
from vtnumba.ops import ActivationScheme, QuantizedActivation
from vtnumba.testing.gates import assert_block_g3, assert_g3

F32 = np.float32
BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(20240611)


def _bits(y):
    return np.asarray(y).view(np.uint8)


def assert_bitwise(y, ref, what):
    """y and ref equal byte for byte (NaN payloads too); returns the non-zero elements compared."""
    assert y.shape == ref.shape and y.dtype == ref.dtype, f"{what}: {y.shape} {y.dtype} vs {ref.shape} {ref.dtype}"
    if not np.array_equal(_bits(y), _bits(ref)):
        bad = np.argwhere(np.asarray(y, np.float64) != np.asarray(ref, np.float64))
        at = tuple(bad[0]) if bad.size else None
        raise AssertionError(
            f"{what}: not bitwise ({len(bad)} elements differ)"
            + (f", first at {at}: {y[at]!r} vs {ref[at]!r}" if at else "")
        )
    nonzero = int(np.count_nonzero(np.asarray(ref, np.float64)))
    assert nonzero > 0, f"{what}: every element is zero: compared nothing"
    return nonzero


# -- the per-expert loop and the float64 reference ---------------------------------------------------


def per_expert_loop(a, scale_a, b, scale_b, offsets, out_dtype=F32, block_size=None):
    """The definition: each expert's rows by the dense CPU GEMM (the numpy reference of the backend,
    as it was written before the grouped kernels), padding rows 0."""
    p = a.shape[0]
    e_count, n, _ = b.shape
    y = np.zeros((p, n), dtype=out_dtype)
    per_row = scale_a.ndim >= 1 and scale_a.shape[0] == p and not (p == 1 and scale_a.ndim == 1)
    for e in range(e_count):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        sa = scale_a[lo:hi] if per_row else scale_a
        if block_size is None:
            sb = scale_b[e] if scale_b.ndim == 2 else scale_b[e : e + 1]
            y[lo:hi] = scaled_mm(a[lo:hi], b[e], sa, sb, out_dtype, None, None)
        else:
            y[lo:hi] = block_scaled_mm(a[lo:hi], b[e], sa, scale_b[e], block_size, out_dtype, None, None)
    return y


def assert_grouped_g3(y, a, scale_a, b, scale_b, offsets, block_size, out_dtype=F32):
    """G3 (G3 per block) of each expert's rows against the float64 reference; returns the elements
    compared."""
    compared = 0
    per_row = scale_a.shape[0] == a.shape[0] and not (a.shape[0] == 1 and scale_a.ndim == 1)
    for e in range(b.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        sa = scale_a[lo:hi] if per_row else scale_a
        if block_size is None:
            sb = scale_b[e] if scale_b.ndim == 2 else scale_b[e : e + 1]
            compared += assert_g3(y[lo:hi], a[lo:hi], b[e], sa.reshape(-1), sb, None, out_dtype)
        else:
            compared += assert_block_g3(y[lo:hi], a[lo:hi], b[e], sa, scale_b[e], block_size, None, out_dtype)
    assert compared > 0
    return compared


# -- operands of every scale kind --------------------------------------------------------------------

E, N, K = 5, 150, 288  # N: two 64-row tiles and a short one (N % 4 = 2); K: 4.5 lookup steps, 2.25 K-blocks of 128


@pytest.fixture(autouse=True, scope="module")
def _small_tiles():
    """The grouped GEMM's work items at 64 weight rows in this file (the default, 256, is for speed:
    experts.py's _TILE_ROWS), so N = 150 spans several tiles and a short one, as the gates above
    need; the tile size moves no result, only which thread computes which rows. Module-scoped: the
    hypothesis tests refuse function-scoped fixtures."""
    before = cx._TILE_ROWS
    cx._TILE_ROWS = 64
    yield
    cx._TILE_ROWS = before


KINDS = ("per_tensor", "per_row_tensor", "per_row_channel", "block_f32", "block_e8m0_weight", "mx")
BLOCK = {"block_f32": (48, 128), "block_e8m0_weight": (128, 128), "mx": (1, 32)}


def codes(shape, rng=RNG):
    """e4m3 codes over the whole finite range, both signs (no NaN: 0x7F / 0xFF excluded)."""
    c = rng.integers(0, 0x7F, shape, dtype=np.uint8)
    return c | (rng.integers(0, 2, shape, dtype=np.uint8) << 7)


def operands(kind, p, e_count=E, n=N, k=K, rng=RNG):
    """(a, scale_a, b, scale_b, block_size) for ``kind``; padding rows get codes and scales too (they
    must not be read)."""
    a = codes((p, k), rng)
    b = codes((e_count, n, k), rng)
    if kind == "per_tensor":
        return a, rng.uniform(0.01, 2, 1).astype(F32), b, rng.uniform(0.01, 2, e_count).astype(F32), None
    if kind == "per_row_tensor":
        return a, rng.uniform(0.01, 2, p).astype(F32), b, rng.uniform(0.01, 2, e_count).astype(F32), None
    if kind == "per_row_channel":
        return a, rng.uniform(0.01, 2, p).astype(F32), b, rng.uniform(0.01, 2, (e_count, n)).astype(F32), None
    bn, bk = BLOCK[kind]
    nb, kb = -(-n // bn), -(-k // bk)
    if kind == "block_f32":
        return (
            a,
            rng.uniform(0.01, 2, (p, kb)).astype(F32),
            b,
            rng.uniform(0.01, 2, (e_count, nb, kb)).astype(F32),
            (bn, bk),
        )
    if kind == "block_e8m0_weight":
        return (
            a,
            rng.uniform(0.01, 2, (p, kb)).astype(F32),
            b,
            rng.integers(118, 136, (e_count, nb, kb)).astype(np.uint8),
            (bn, bk),
        )
    return (
        a,
        rng.integers(112, 140, (p, kb)).astype(np.uint8),
        b,
        rng.integers(112, 140, (e_count, nb, kb)).astype(np.uint8),
        (bn, bk),
    )


def offsets_of(counts):
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


# rows per expert, and padding rows past offsets[E]
PATTERNS = {
    "first_and_middle_empty": ([0, 3, 0, 1, 5], 0),
    "last_empty_padding": ([2, 1, 4, 1, 0], 3),
    "one_row_each": ([1, 1, 1, 1, 1], 0),
    "register_blocks_and_tails": ([17, 0, 6, 2, 9], 2),
    "one_routed_expert": ([0, 0, 0, 0, 1], 5),
}


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("kind", KINDS)
def test_grouped_gemm_is_the_per_expert_loop_and_within_g3(kind, pattern):
    counts, pad = PATTERNS[pattern]
    offs = offsets_of(counts)
    p = int(offs[-1]) + pad
    a, sa, b, sb, bs = operands(kind, p)
    y = cx.grouped_scaled_mm(a, sa, b, sb, offs, np.dtype(F32), bs)
    ref = per_expert_loop(a, sa, b, sb, offs, F32, bs)
    assert_bitwise(y, ref, f"{kind} {pattern}")
    assert assert_grouped_g3(y, a, sa, b, sb, offs, bs) >= sum(counts) * N // 2
    assert not y[offs[-1] :].any() and np.count_nonzero(y[: offs[-1]]) > 0.9 * y[: offs[-1]].size


@pytest.mark.parametrize("kind", ["per_row_channel", "block_f32", "mx"])
def test_grouped_gemm_bf16_out_is_the_per_expert_loop(kind):
    offs = offsets_of([3, 0, 1, 2, 0])
    a, sa, b, sb, bs = operands(kind, 8)
    y = cx.grouped_scaled_mm(a, sa, b, sb, offs, np.dtype(BF16), bs)
    assert y.dtype == BF16
    assert_bitwise(y, per_expert_loop(a, sa, b, sb, offs, BF16, bs), kind)
    assert_grouped_g3(y, a, sa, b, sb, offs, bs, BF16)
    assert not y[6:].astype(F32).any()


@pytest.mark.parametrize("kind", ["per_row_channel", "block_f32", "block_e8m0_weight", "mx"])
def test_grouped_gemm_expert_past_the_small_m_kernels(kind, monkeypatch):
    """An expert whose dense call takes the blas kernel (M * K over 3 Mi; with block scales M >= 64,
    or M >= 160 where the register tiles run and the weight is past their bound, block.takes_small_m)
    beside small ones: that expert's rows come from the dense entry point."""
    from vtnumba.cpu import block, gemm, mx

    # this test's small weight would keep the register tiles at any M: their weight bound lifted
    monkeypatch.setattr(block, "TILED_MAX_WEIGHT", 0)
    big = 11000 if kind == "per_row_channel" else 460
    counts = [1, big, 0, 3, 0]
    offs = offsets_of(counts)
    n, k = 40, 288
    chooser = {"per_row_channel": gemm.choose_kernel, "mx": mx.choose_kernel}.get(kind, block.choose_kernel)
    assert chooser(big, n, k) == "blas"  # the case this test is about, on this CPU's path
    a, sa, b, sb, bs = operands(kind, int(offs[-1]) + 1, n=n, k=k)
    y = cx.grouped_scaled_mm(a, sa, b, sb, offs, np.dtype(F32), bs)
    assert_bitwise(y, per_expert_loop(a, sa, b, sb, offs, F32, bs), kind)
    if kind != "per_row_channel":  # the float64 reference of 11000 rows costs more than it tells
        assert_grouped_g3(y, a, sa, b, sb, offs, bs)
    else:
        lo, hi = offs[1], offs[1] + 64
        assert assert_g3(y[lo:hi], a[lo:hi], b[1], sa[lo:hi], sb[1]) > 0
    assert not y[offs[-1] :].any()


def test_mx_expert_outside_the_exact_window_takes_the_dense_fallback():
    """MXFP8 scale bytes no checkpoint holds (a weight byte past the window, an activation byte of
    0): those experts' dense calls run the block-scaled kernels; the others stay on the shortcut."""
    offs = offsets_of([2, 1, 3, 0, 1])
    a, sa, b, sb, bs = operands("mx", 7)
    sb[0, 5, 2] = 250  # weight byte outside [1, 246]: found while expert 0's rows are decoded
    sa[3, 1] = 0  # activation byte 0 (2^-127): expert 2 never takes the shortcut
    y = cx.grouped_scaled_mm(a, sa, b, sb, offs, np.dtype(F32), bs)
    assert_bitwise(y, per_expert_loop(a, sa, b, sb, offs, F32, bs), "mx fallback")
    assert_grouped_g3(y, a, sa, b, sb, offs, bs)


@pytest.mark.parametrize("kind", ["per_row_channel", "block_f32", "mx"])
def test_grouped_gemm_parallel_twin_is_the_serial_loop(kind, monkeypatch):
    """The grouped drivers' parallel twin (every thread) against the loop run first on one thread;
    for the per-tensor kernels the loop's own parallel twins too (each parallel twin compiles for
    seconds, so the block and MX ones are left to their own tests)."""
    offs = offsets_of([5, 0, 1, 16, 2])
    a, sa, b, sb, bs = operands(kind, 26)
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", str(1 << 40))
    serial = per_expert_loop(a, sa, b, sb, offs, F32, bs)
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", "0")
    y = cx.grouped_scaled_mm(a, sa, b, sb, offs, np.dtype(F32), bs)
    assert_bitwise(y, serial, f"{kind} parallel")
    if bs is None:
        assert_bitwise(per_expert_loop(a, sa, b, sb, offs, F32, bs), serial, f"{kind} dense parallel")


def _run_work(items, offs, lo, hi):
    return sum(int(offs[e + 1] - offs[e]) * int(n1 - n0) for e, n0, n1 in items[lo:hi, :3])


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=9),
    n=st.integers(1, 700),
    tile=st.sampled_from([4, 64, 128, 256]),
    parts=st.integers(1, 5),
)
def test_balanced_runs_cut_the_items_into_equal_work(counts, n, tile, parts):
    """The drivers' runs: contiguous, covering every item once, each run's work (rows x weight rows)
    within one item's of the equal share."""
    offs = offsets_of(counts)
    routed = np.flatnonzero(np.diff(offs) > 0)
    items = cx._items(routed, n, tile) if routed.size else np.zeros((0, 4), dtype=np.int64)
    runs = cx._balanced_runs(items, offs, parts)
    assert runs.shape == (parts + 1,) and runs[0] == 0 and runs[-1] == len(items)
    assert np.all(np.diff(runs) >= 0)
    total = _run_work(items, offs, 0, len(items))
    largest = max([_run_work(items, offs, i, i + 1) for i in range(len(items))], default=0)
    for part in range(parts):
        work = _run_work(items, offs, runs[part], runs[part + 1])
        assert abs(work - total / parts) <= largest, (part, work, total, largest)


def test_balanced_runs_split_unequal_tiles_evenly():
    """The tiny Qwen3-MoE's gate_up (N = 320 in 256- and 64-row items, tile-major): an equal count of
    items a thread gave one thread the eight 256-row items, 80% of the work; the runs give each half."""
    offs = offsets_of([32] * 8)
    items = cx._items(np.arange(8), 320, 256)
    runs = cx._balanced_runs(items, offs, 2)
    halves = [_run_work(items, offs, runs[i], runs[i + 1]) for i in range(2)]
    assert halves[0] == halves[1] == 32 * 320 * 8 // 2, halves


def test_grouped_driver_takes_one_run_a_thread(monkeypatch):
    """The driver is handed as many runs as the threads it runs on (what ``threads_for`` gave)."""
    seen = []
    real = cx.CpuKernel.call_with

    def record(self, threads, *args):
        if self is cx._driver("tensor"):
            seen.append((threads, args[1]))
        return real(self, threads, *args)

    monkeypatch.setattr(cx.CpuKernel, "call_with", record)
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", "0")
    offs = offsets_of([5, 0, 1, 16, 2])
    a, sa, b, sb, bs = operands("per_row_channel", 26)
    y = cx.grouped_scaled_mm(a, sa, b, sb, offs, np.dtype(F32), bs)
    assert_bitwise(y, per_expert_loop(a, sa, b, sb, offs, F32, bs), "recorded driver")
    assert seen and all(threads == parts for threads, parts in seen), seen


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=6), pad=st.integers(0, 3), seed=st.integers(0, 2**32 - 1)
)
def test_grouped_gemm_any_offsets(counts, pad, seed):
    rng = np.random.default_rng(seed)
    offs = offsets_of(counts)
    p = int(offs[-1]) + pad
    if p == 0:
        return
    a, sa, b, sb, bs = operands("per_row_channel", p, e_count=len(counts), n=70, k=96, rng=rng)
    y = cx.grouped_scaled_mm(a, sa, b, sb, offs, np.dtype(F32), bs)
    ref = per_expert_loop(a, sa, b, sb, offs, F32, bs)
    assert np.array_equal(_bits(y), _bits(ref))
    assert not y[offs[-1] :].any()
    assert np.count_nonzero(y) >= 0.9 * int(offs[-1]) * 70


# -- align, static quantization, SiLU-and-multiply, combine -------------------------------------------


def align_by_hand(ids, e_count):
    """The routed pairs by expert, ties in pair order, by plain Python."""
    t, k = ids.shape
    rows = [[] for _ in range(e_count)]
    for i, e in enumerate(ids.reshape(-1)):
        if 0 <= e < e_count:
            rows[e].append(i)
    order = [i for r in rows for i in r]
    offsets = np.array([0] + list(np.cumsum([len(r) for r in rows])), dtype=np.int32)
    pair_row = np.full(t * k, -1, dtype=np.int32)
    row_token = np.zeros(t * k, dtype=np.int32)
    for r, i in enumerate(order):
        pair_row[i] = r
        row_token[r] = i // k
    return offsets, pair_row.reshape(t, k), row_token


ROUTINGS = {
    "sentinels": np.array([[0, -1, 3], [4, 2, 0], [-1, 4, 4], [1, 1, 0]]),  # -1 and E = 4, duplicates
    "decode_one_token": np.array([[3, 1, 2]]),
    "all_skipped": np.array([[-1, 4], [4, -1]]),
    "no_tokens": np.zeros((0, 3), dtype=np.int64),
}


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_moe_align_is_a_stable_sort_by_expert(routing, dtype):
    ids = ROUTINGS[routing].astype(dtype)
    got = cx.moe_align(ids, 4)
    want = align_by_hand(ids, 4)
    for g, w, name in zip(got, want, ("offsets", "pair_row", "row_token")):
        assert g.dtype == np.int32 and g.shape == w.shape, name
        np.testing.assert_array_equal(g, w, err_msg=name)
    if routing == "sentinels":
        assert (got[1] == -1).sum() == 5 and got[0][-1] == 7 and list(np.diff(got[0])) == [3, 2, 1, 1]


@pytest.mark.parametrize("dtype", [F32, np.float16, BF16])
def test_quantize_rows_static_is_each_experts_static_quantization(dtype):
    offs = offsets_of([2, 0, 3, 1])
    x = (RNG.standard_normal((8, 40)) * 3).astype(dtype)
    scales = np.array([0.02, 0.5, 0.007, 0.1], dtype=F32)
    c, s = cx.quantize_rows_static(x, offs, scales)
    assert c.dtype == np.uint8 and s.dtype == F32 and c.shape == x.shape and s.shape == (8,)
    for e in range(4):
        lo, hi = offs[e], offs[e + 1]
        np.testing.assert_array_equal(c[lo:hi], vt.quantize_fp8(x[lo:hi], float(scales[e])).data)
        np.testing.assert_array_equal(s[lo:hi], scales[e])
    assert not c[6:].any() and (s[6:] == 1).all() and np.count_nonzero(c[:6]) > 200


def test_silu_mul_is_vllms_formula_gate_first():
    offs = offsets_of([2, 0, 3])
    h = (RNG.standard_normal((7, 32)) * 4).astype(F32)
    h[0, 0] = -200.0  # exp(200) overflows float32: silu(-200) = -0, no warning
    act = cx.silu_mul(h, offs)
    g, u = h[:5, :16], h[:5, 16:]
    with np.errstate(over="ignore"):
        want = g / (F32(1.0) + np.exp(-g)) * u
    assert act.dtype == F32 and act.shape == (7, 16) and act.flags.c_contiguous
    assert_bitwise(act[:5], want, "silu_mul")
    assert not act[5:].any()


@pytest.mark.parametrize("out_dtype", [F32, np.float16, BF16])
def test_moe_combine_weights_each_slot_once_in_slot_order(out_dtype):
    pair_row = np.array([[0, -1, 3], [2, 4, -1], [-1, -1, -1], [1, 1, 5]], dtype=np.int32)
    y = RNG.standard_normal((8, 24)).astype(F32)
    w = RNG.uniform(0.05, 1, (4, 3)).astype(F32)
    got = cx.moe_combine(y, pair_row, w, out_dtype)
    want = np.zeros((4, 24), dtype=F32)
    for t in range(4):
        for j in range(3):
            if pair_row[t, j] >= 0:
                want[t] = want[t] + w[t, j] * y[pair_row[t, j]]
    assert_bitwise(got, want.astype(out_dtype), "combine")
    assert not got[2].astype(F32).any()


# -- the seam: grouped_matmul_fp8 and moe_fp8 ------------------------------------------------------

SCHEMES = {
    "dynamic": dict(),
    "static": dict(input_scale="per_expert"),
    "per_token": dict(per_channel=True, activation_scheme="per_token"),
    "per_group": dict(block_size=(128, 128)),
    "ue8m0_blocks": dict(block_size=(128, 128), scale_format="e8m0"),
    "mxfp8": dict(block_size=(1, 32), scale_format="e8m0"),
}


def experts_of(scheme, w, x_for_static=None):
    kw = dict(SCHEMES[scheme])
    if kw.get("input_scale") == "per_expert":
        e_count = w.shape[0]
        amax = float(np.abs(np.asarray(x_for_static, dtype=F32)).max())
        kw["input_scale"] = (amax / 448.0) * np.linspace(0.8, 1.6, e_count)  # each expert its own scale
    return seam.Fp8Experts.from_float(w, **kw)


def float_weights(e_count, n, k, rng=RNG):
    return (rng.standard_normal((e_count, n, k)) * 0.05).astype(F32)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_grouped_matmul_fp8_is_the_per_expert_matmul_fp8_loop(scheme):
    e_count, n, k = 4, 256, 384
    offs = offsets_of([3, 0, 5, 1])
    x = (RNG.standard_normal((9, k)) * 2).astype(F32)
    ex = experts_of(scheme, float_weights(e_count, n, k), x)
    for out_dtype in (None, BF16):
        y = seam.grouped_matmul_fp8(x, ex, offs, out_dtype=out_dtype)
        assert y.shape == (9, n) and y.dtype == (x.dtype if out_dtype is None else out_dtype)
        compared = 0
        q = vt.quantize_fp8(x)  # dynamic: one scale over all of x, as the grouped call takes it
        for e in range(e_count):
            lo, hi = offs[e], offs[e + 1]
            if hi == lo:
                continue
            if scheme == "dynamic":
                qs = QuantizedActivation(q.data[lo:hi], q.scale, ActivationScheme.DYNAMIC)
                want = seam.matmul_fp8_prequant(qs, ex.expert(e), out_dtype=x.dtype if out_dtype is None else out_dtype)
            else:
                want = seam.matmul_fp8(x[lo:hi], ex.expert(e), out_dtype=out_dtype)
            compared += assert_bitwise(y[lo:hi], want, f"{scheme} expert {e}")
        assert compared > 0.9 * 9 * n


def composite_by_expert(x, gu, dn, ids, weights):
    """moe_fp8 from the seam's dense ops, each expert's rows (its pairs in pair order) at once:
    matmul_fp8 (gate_up expert, float32) -> the float32 SiLU-and-multiply -> matmul_fp8 (down
    expert, float32) -> the weighted float32 sum in slot order -> x's dtype. Dynamic: the global
    scales moe_fp8 takes (x's, then the activation's over every routed pair)."""
    t, k = ids.shape
    e_count, two_i, h = gu.shape
    half = two_i // 2
    pairs = [(tt, j) for tt in range(t) for j in range(k) if 0 <= ids[tt, j] < e_count]
    by_expert = {e: [p for p in pairs if ids[p] == e] for e in range(e_count)}
    dynamic = gu.activation_scheme == ActivationScheme.DYNAMIC

    def gemm(rows_in, q_all, weight, index):
        if dynamic:
            qs = QuantizedActivation(q_all.data[index], q_all.scale, ActivationScheme.DYNAMIC)
            return seam.matmul_fp8_prequant(qs, weight, out_dtype=F32)
        return seam.matmul_fp8(rows_in[index], weight, out_dtype=F32)

    qx = vt.quantize_fp8(x) if dynamic else None
    act = {}
    for e, ps in by_expert.items():
        if ps:
            hid = gemm(x, qx, gu.expert(e), [p[0] for p in ps])
            g, u = hid[:, :half], hid[:, half:]
            with np.errstate(over="ignore"):
                a = g / (F32(1.0) + np.exp(-g)) * u
            act.update({p: a[i] for i, p in enumerate(ps)})
    keys = list(act)
    act_rows = np.stack([act[p] for p in keys]) if keys else np.zeros((0, half), F32)
    qa = vt.quantize_fp8(act_rows) if dynamic and keys else None
    y = {}
    for e, ps in by_expert.items():
        if ps:
            out = gemm(act_rows, qa, dn.expert(e), [keys.index(p) for p in ps])
            y.update({p: out[i] for i, p in enumerate(ps)})
    total = np.zeros((t, h), dtype=F32)
    w = np.asarray(weights, dtype=F32)
    for j in range(k):
        for tt in range(t):
            if (tt, j) in y:
                total[tt] = total[tt] + w[tt, j] * y[(tt, j)]
    return total.astype(x.dtype), len(pairs)


def moe_layer(scheme, e_count=6, h=256, inter=128, x=None, rng=RNG):
    x_probe = x if x is not None else rng.standard_normal((4, h)).astype(F32)
    gu = experts_of(scheme, float_weights(e_count, 2 * inter, h, rng), x_probe)
    act_probe = np.full((1, inter), 2.0, F32)  # static down scales sized for the activation's range
    dn = experts_of(scheme, float_weights(e_count, h, inter, rng), act_probe)
    return gu, dn


MOE_ROUTING = np.array([[0, 5, -1], [2, 2, 0], [6, 1, 3], [5, 0, 2], [3, -1, 6]])  # E = 6: -1 and 6 skip


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_moe_fp8_is_the_composite_of_dense_ops(scheme):
    x = (RNG.standard_normal((5, 256)) * 1.5).astype(F32)
    gu, dn = moe_layer(scheme, x=x)
    w = RNG.uniform(0.1, 1, MOE_ROUTING.shape).astype(F32)
    y = seam.moe_fp8(x, gu, dn, MOE_ROUTING, w)
    want, routed = composite_by_expert(x, gu, dn, MOE_ROUTING, w)
    assert routed == 11
    assert y.dtype == F32 and y.shape == x.shape
    assert assert_bitwise(y, want, scheme) > 0.9 * x.size


@pytest.mark.parametrize("dtype", [BF16, np.float16])
@pytest.mark.parametrize("scheme", ["per_token", "static", "mxfp8"])
def test_moe_fp8_half_precision_input(scheme, dtype):
    x = (RNG.standard_normal((5, 256)) * 1.5).astype(dtype)
    gu, dn = moe_layer(scheme, x=x.astype(F32))
    w = RNG.uniform(0.1, 1, MOE_ROUTING.shape).astype(dtype)
    y = seam.moe_fp8(x, gu, dn, MOE_ROUTING, w)
    assert y.dtype == dtype
    want, _ = composite_by_expert(x, gu, dn, MOE_ROUTING, w)
    assert_bitwise(y, want, f"{scheme} {np.dtype(dtype)}")


@pytest.mark.parametrize("scheme", ["dynamic", "per_token", "per_group"])
def test_moe_fp8_per_pair_composite(scheme):
    """The composite pair by pair (matmul_fp8 of each token's row alone): bitwise where every expert
    gets one row, since then both take the M = 1 kernels; where experts get several rows the grouped
    GEMM sums each row in the 4 x 4 block or 1 x 4 tail order of its expert's row count, which G3
    allows, and an activation code may then round the other way: within 2^-5 of the output's scale."""
    x = (RNG.standard_normal((4, 256)) * 1.5).astype(F32)
    gu, dn = moe_layer(scheme, e_count=8, x=x)
    e_count, two_i, h = gu.shape
    half = two_i // 2
    dynamic = scheme == "dynamic"
    for ids, exact in (
        (np.array([[0, 3, -1], [5, 8, 1], [2, 7, 4], [8, -1, 6]]), True),
        (np.array([[0, 3, 3], [3, 0, 1], [1, 0, 3], [3, 3, 0]]), False),
    ):
        w = RNG.uniform(0.1, 1, ids.shape).astype(F32)
        y = seam.moe_fp8(x, gu, dn, ids, w)
        pairs = [(t, j) for t in range(4) for j in range(3) if 0 <= ids[t, j] < e_count]
        qx = vt.quantize_fp8(x)
        hid = {}
        for t, j in pairs:
            e = ids[t, j]
            if dynamic:
                hid[t, j] = seam.matmul_fp8_prequant(
                    QuantizedActivation(qx.data[t : t + 1], qx.scale, ActivationScheme.DYNAMIC),
                    gu.expert(e),
                    out_dtype=F32,
                )[0]
            else:
                hid[t, j] = seam.matmul_fp8(x[t : t + 1], gu.expert(e), out_dtype=F32)[0]
        act = {p: v[:half] / (F32(1.0) + np.exp(-v[:half])) * v[half:] for p, v in hid.items()}
        qa = vt.quantize_fp8(np.stack(list(act.values()))) if dynamic else None
        total = np.zeros((4, h), F32)
        for j in range(3):
            for t in range(4):
                if (t, j) not in act:
                    continue
                e = ids[t, j]
                if dynamic:
                    i = list(act).index((t, j))
                    q1 = QuantizedActivation(qa.data[i : i + 1], qa.scale, ActivationScheme.DYNAMIC)
                    yp = seam.matmul_fp8_prequant(q1, dn.expert(e), out_dtype=F32)[0]
                else:
                    yp = seam.matmul_fp8(act[t, j][None], dn.expert(e), out_dtype=F32)[0]
                total[t] = total[t] + w[t, j] * yp
        if exact:
            assert_bitwise(y, total, f"{scheme} one row per expert")
        else:
            err = np.abs(y.astype(np.float64) - total)
            assert err.max() <= 2.0**-5 * np.abs(total).max(), (scheme, err.max(), np.abs(total).max())
            assert np.count_nonzero(total) > 0.9 * total.size


def test_moe_fp8_empty_and_fully_skipped():
    gu, dn = moe_layer("per_token")
    x = RNG.standard_normal((3, 256)).astype(BF16)
    y0 = seam.moe_fp8(x[:0], gu, dn, np.zeros((0, 2), np.int64), np.zeros((0, 2), F32))
    assert y0.shape == (0, 256) and y0.dtype == BF16
    ids = np.array([[-1, 6], [6, 6], [-1, -1]])
    y = seam.moe_fp8(x, gu, dn, ids, np.ones(ids.shape, F32))
    assert y.shape == x.shape and y.dtype == BF16 and not y.astype(F32).any()
    # one routed pair among the skipped ones: only its token is non-zero
    ids[1, 0] = 2
    y = seam.moe_fp8(x, gu, dn, ids, np.ones(ids.shape, F32))
    want, routed = composite_by_expert(x, gu, dn, ids, np.ones(ids.shape, F32))
    assert routed == 1 and not y[[0, 2]].astype(F32).any()
    assert_bitwise(y, want, "one pair")


# -- bad input through the seam --------------------------------------------------------------------


@pytest.fixture(scope="module")
def layer():
    gu, dn = moe_layer("per_token", e_count=4, h=64, inter=32)
    return gu, dn, RNG.standard_normal((3, 64)).astype(F32)


def test_bad_topk_ids(layer):
    gu, dn, x = layer
    w = np.ones((3, 2), F32)
    for bad in (-2, 5):
        ids = np.array([[0, 1], [2, bad], [3, 4]])
        with pytest.raises(ValueError, match=rf"topk_ids must be in \[-1, 4\].*got {bad} at \(1, 1\)"):
            seam.moe_fp8(x, gu, dn, ids, w)
    with pytest.raises(TypeError, match="topk_ids must be an integer array, got dtype float32"):
        seam.moe_fp8(x, gu, dn, w, w)
    with pytest.raises(ValueError, match=r"topk_ids must be \[T, k\] with T = 3.*got shape \(2, 2\)"):
        seam.moe_fp8(x, gu, dn, np.zeros((2, 2), np.int64), w[:2])


def test_bad_topk_weights_shape(layer):
    gu, dn, x = layer
    with pytest.raises(ValueError, match=r"topk_weights must have topk_ids' shape \(3, 2\), got \(3, 3\)"):
        seam.moe_fp8(x, gu, dn, np.zeros((3, 2), np.int64), np.ones((3, 3), F32))


def test_bad_offsets(layer):
    gu, _, x = layer
    for offs, what in (
        ([0, 2, 1, 3, 3], r"offsets\[2\] = 1 < offsets\[1\] = 2"),
        ([0, 1, 1, 2, 2], r"offsets\[0\] = 0, offsets\[4\] = 2"),
        ([1, 1, 2, 3, 3], r"offsets\[0\] = 1, offsets\[4\] = 3"),
    ):
        with pytest.raises(ValueError, match=rf"offsets must start at 0, never decrease and end at M = 3.*{what}"):
            seam.grouped_matmul_fp8(x, gu, np.array(offs))
    with pytest.raises(ValueError, match=r"offsets must be \[E \+ 1\] = \(5,\) row offsets, got shape \(4,\)"):
        seam.grouped_matmul_fp8(x, gu, np.array([0, 1, 2, 3]))
    with pytest.raises(TypeError, match="offsets must be an integer array, got dtype float32"):
        seam.grouped_matmul_fp8(x, gu, np.array([0, 1, 2, 3, 3], dtype=F32))


def test_bad_shapes_between_x_gate_up_and_down(layer):
    gu, dn, x = layer
    ids, w = np.zeros((3, 2), np.int64), np.ones((3, 2), F32)
    with pytest.raises(ValueError, match=r"x must be \[T, H\] with H = 64 .*got shape \(3, 65\)"):
        seam.moe_fp8(np.zeros((3, 65), F32), gu, dn, ids, w)
    with pytest.raises(ValueError, match=r"x must be \[M, K\] with K = 64 .*got shape \(3, 65\)"):
        seam.grouped_matmul_fp8(np.zeros((3, 65), F32), gu, np.array([0, 3, 3, 3, 3]))
    wrong_h = seam.Fp8Experts.from_float(float_weights(4, 48, 32), per_channel=True, activation_scheme="per_token")
    with pytest.raises(
        ValueError, match=r"down must be \[E, H, I\] = \(4, 64, 32\) for gate_up \(4, 64, 64\), got \(4, 48, 32\)"
    ):
        seam.moe_fp8(x, gu, wrong_h, ids, w)
    wrong_i = seam.Fp8Experts.from_float(float_weights(4, 64, 48), per_channel=True, activation_scheme="per_token")
    with pytest.raises(ValueError, match=r"down must be \[E, H, I\] = \(4, 64, 32\) .*got \(4, 64, 48\)"):
        seam.moe_fp8(x, gu, wrong_i, ids, w)
    wrong_e = seam.Fp8Experts.from_float(float_weights(3, 64, 32), per_channel=True, activation_scheme="per_token")
    with pytest.raises(ValueError, match=r"down must hold E = 4 experts like gate_up, got 3"):
        seam.moe_fp8(x, gu, wrong_e, ids, w)
    odd = seam.Fp8Experts.from_float(float_weights(4, 63, 64), per_channel=True, activation_scheme="per_token")
    with pytest.raises(ValueError, match=r"gate_up must have an even N = 2I .*got N = 63"):
        seam.moe_fp8(x, odd, dn, ids, w)


def test_mixed_schemes_between_gate_up_and_down(layer):
    gu, dn, x = layer
    ids, w = np.zeros((3, 2), np.int64), np.ones((3, 2), F32)
    dynamic = seam.Fp8Experts.from_float(float_weights(4, 64, 32))
    with pytest.raises(ValueError, match=r"down.activation_scheme must be gate_up's 'per_token'.*got 'dynamic'"):
        seam.moe_fp8(x, gu, dynamic, ids, w)
    blocks = seam.Fp8Experts.from_float(float_weights(4, 64, 64), block_size=(32, 32))
    blocks_down = seam.Fp8Experts.from_float(float_weights(4, 64, 32), block_size=(32, 16))
    with pytest.raises(ValueError, match=r"down.block_size must be gate_up's \(32, 32\).*got \(32, 16\)"):
        seam.moe_fp8(x, blocks, blocks_down, ids, w)
    e8m0_down = seam.Fp8Experts.from_float(float_weights(4, 64, 32), block_size=(32, 32), scale_format="e8m0")
    with pytest.raises(ValueError, match=r"down.scale_format must be gate_up's 'float32'.*got 'e8m0'"):
        seam.moe_fp8(x, blocks, e8m0_down, ids, w)
    with pytest.raises(ValueError, match=r"activation must be 'silu'.*got 'gelu'"):
        seam.moe_fp8(x, gu, dn, ids, w, activation="gelu")
