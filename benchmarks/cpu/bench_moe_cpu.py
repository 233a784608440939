"""CPU mixture-of-experts speed: the whole ``seam.moe_fp8`` layer against the numpy loop a CPU user
would write on dequantized float32 weights, and the grouped GEMM alone against the per-expert
``vt.scaled_mm`` loop, at Qwen3-30B-A3B's MoE shapes.

    flock /tmp/vt-bench.lock python3 benchmarks/cpu/bench_moe_cpu.py                 # 1 and 16 tokens
    flock /tmp/vt-bench.lock python3 benchmarks/cpu/bench_moe_cpu.py --tokens 1 16 64 --trials 9

Shapes (Qwen3-30B-A3B's config.json): 128 experts, hidden H = 2048, moe_intermediate I = 768, top-8;
gate_up [128, 1536, 2048] and down [128, 2048, 768] per layer (0.6 GB of FP8 codes; the peer's
float32 weights, 2.4 GB). Routing: topk ids drawn without repetition per token from a fixed seed,
weights softmax-like and normalized, as Qwen3-MoE's router gives them.

The peer: for each expert with routed tokens, ``x_rows @ w_gate_up[e].T``, SiLU-and-multiply,
``@ w_down[e].T``, then the weighted sum per token (numpy float32, OpenBLAS's sgemm/sgemv on the
dequantized weights, which it reads at 4 bytes a value where the FP8 layer reads 1). Schemes: FP8
per-token activations with per-channel weights (vLLM's PTPC / compressed-tensors' channel-wise
checkpoints) and 128 x 128 block-scaled weights with per-group activations (Qwen3-30B-A3B-FP8).

Each call takes the next of four routings (and inputs) drawn for its token count, so the routed
experts' weights come from memory as in a model, where each layer has experts of its own (four
routings of 8 experts are 150 MB of FP8 codes, past the 32 MiB L3; the peer's float32, 600 MB).
A trial runs each side after a pause and one untimed call (OpenBLAS's workers busy-wait ~80 ms
after each call, and on two cores a side timed right after the other shares a core with them; see
``bench_cpu_gemm.SETTLE_S``), alternating which side goes first; a time is the minimum over the
trials (the machine is shared: the minimum is the run the least disturbed). Each side is timed
twice a trial: right after the pause ("after idle"), then once it has run its own calls for
WARM_S ("steady", the figure the targets judge: a model's decode runs its layers back to back).
Targets: the layer >= 2.0x the numpy loop at 1 token, >= 1.5x at 16.

Why both: on the 2-core VM this was written on, a two-thread call right after the CPUs idled runs
at about one thread's speed for ~50 ms (the one-token layer's gate_up, 2.0-2.2 ms a call for its
first ~25 calls, then 1.1 ms). Numba's OpenMP workers sleep between calls, and each call waits for
the second CPU to wake; with the workers spinning (OMP_WAIT_POLICY=active, two threads forced) the
calls took 0.9-1.2 ms from the second one on. OpenBLAS's workers spin after every call, so the
numpy side never meets it. The "after idle" column is what a lone call after a pause gets.

Threads: vtnumba's parallel twins take as many threads as CPUs are free when a call starts
(``vtnumba._config.free_cpus``), OpenBLAS always takes its own; on a machine shared with other jobs
the FP8 side then often runs on one thread. ``VT_CPU_PARALLEL_MIN_WORK=0`` makes every parallel-sized
call take every Numba thread, which is the comparison with both cores free.

``--cpu-time`` times each call by the process's CPU time instead of the wall clock. On a machine
shared with other jobs a two-thread call's wall time swings with the load (one thread waits at the
region's barrier while its sibling is descheduled); run it with one thread on both sides
(``NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1``), which compares the work each side does.
"""

import argparse
import time

import numpy as np

import vtnumba as vt
from vtnumba import seam
from vtnumba.cpu import experts as cx
from vtnumba.cpu import paths

E, H, INTER, TOP_K = 128, 2048, 768, 8
TARGETS = {1: 2.0, 16: 1.5}
F32 = np.float32


def routing(tokens, rng):
    """(topk_ids int64 [T, 8], topk_weights float32 [T, 8]): distinct experts per token, weights
    normalized over the k chosen (Qwen3-MoE's norm_topk_prob)."""
    ids = np.stack([rng.choice(E, TOP_K, replace=False) for _ in range(tokens)]).astype(np.int64)
    logits = rng.standard_normal((tokens, TOP_K)).astype(F32)
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    return ids, (w / w.sum(axis=1, keepdims=True)).astype(F32)


def numpy_moe(x, w_gate_up, w_down, ids, weights):
    """The peer: a float32 loop over the experts with routed tokens, on dequantized weights."""
    out = np.zeros((x.shape[0], w_down.shape[1]), dtype=F32)
    for e in np.unique(ids):
        tok, slot = np.nonzero(ids == e)
        h = x[tok] @ w_gate_up[e].T
        g, u = h[:, :INTER], h[:, INTER:]
        act = g / (F32(1.0) + np.exp(-g)) * u
        out[tok] += weights[tok, slot][:, None] * (act @ w_down[e].T)
    return out


def grouped_operands(x, gu, ids):
    """The gate_up GEMM's operands as moe_fp8 builds them (align, per-token or per-group quantize,
    gather): (codes, scale, offsets)."""
    offsets, _, row_token = cx.moe_align(ids, E)
    if gu.block_size is None:
        q = vt.quantize_fp8(x, per_token=True)
        scale = cx.gather_rows(q.scale.reshape(-1), row_token)
    else:
        q = vt.quantize_fp8(x, group_size=gu.block_size[1], column_major_scales=False)
        scale = cx.gather_rows(q.scale, row_token)
    return cx.gather_rows(q.data, row_token), scale, offsets


def per_expert_scaled_mm(a, scale, gu, offsets):
    """What a user of the dense op would write: one ``vt.scaled_mm`` per expert with rows."""
    y = np.zeros((a.shape[0], gu.shape[1]), dtype=F32)
    for e in range(E):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi > lo:
            ws = gu.weight_scale[e]
            y[lo:hi] = vt.scaled_mm(a[lo:hi], gu.data[e], scale[lo:hi], ws, out_dtype=F32, block_size=gu.block_size)
    return y


CLOCK = time.perf_counter
SETTLE_S = 0.25
WARM_S = 0.1
ROUTINGS = 4


def sweep(fn):
    """Mean time of one call over a sweep of the ROUTINGS routings (``fn(r)``)."""
    t0 = CLOCK()
    for r in range(ROUTINGS):
        fn(r)
    return (CLOCK() - t0) / ROUTINGS


def best_of(trials, first, second):
    """((first's steady, second's steady), (first's after idle, second's after idle), each side's
    result for the first routing), each time a minimum over the trials. A trial takes each side in
    turn, alternating which goes first: a pause and an untimed call, a timed sweep ("after idle"),
    untimed sweeps until WARM_S has passed since the pause ended, a timed sweep ("steady")."""
    steady, idle = [[], []], [[], []]
    fns = (first, second)
    for i in range(trials):
        for j in (0, 1) if i % 2 == 0 else (1, 0):
            time.sleep(SETTLE_S)
            start = time.perf_counter()
            fns[j](ROUTINGS - 1)
            idle[j].append(sweep(fns[j]))
            while time.perf_counter() - start < WARM_S:
                sweep(fns[j])
            steady[j].append(sweep(fns[j]))
    return (min(steady[0]), min(steady[1])), (min(idle[0]), min(idle[1])), (first(0), second(0))


def build(scheme, rng):
    """(gate_up, down) Fp8Experts and their dequantized float32 weights, built one matrix at a time
    (the float weights of both at once would be 4.8 GB with their FP8 copies' dequantization)."""
    kw = dict(per_channel=True, activation_scheme="per_token") if scheme == "per_token" else dict(block_size=(128, 128))
    out = []
    for n, k in ((2 * INTER, H), (H, INTER)):
        w = rng.standard_normal((E, n, k), dtype=F32)
        w *= F32(0.02)
        ex = seam.Fp8Experts.from_float(w, **kw)
        del w
        out += [ex, ex.dequantize(F32)]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--schemes", nargs="+", default=["per_token", "per_group"])
    parser.add_argument("--cpu-time", action="store_true", help="time by the process's CPU time")
    args = parser.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    print(paths.header_line())
    rng = np.random.default_rng(30)
    layer_rows, gemm_rows = [], []
    for scheme in args.schemes:
        gu, w_gu, dn, w_dn = build(scheme, rng)
        for tokens in args.tokens:
            xs = [rng.standard_normal((tokens, H), dtype=F32) for _ in range(ROUTINGS)]
            routes = [routing(tokens, rng) for _ in range(ROUTINGS)]
            seam.moe_fp8(xs[0], gu, dn, *routes[0])  # compile / warm
            (t_vt, t_np), (idle_vt, idle_np), (y, ref) = best_of(
                args.trials,
                lambda r: seam.moe_fp8(xs[r], gu, dn, *routes[r]),
                lambda r: numpy_moe(xs[r], w_gu, w_dn, *routes[r]),
            )
            rel = float(np.abs(y - ref).max() / np.abs(ref).max())
            routed = len(np.unique(routes[0][0]))
            layer_rows.append((scheme, tokens, routed, t_np, t_vt, idle_np, idle_vt, rel))
            ops = [grouped_operands(xs[r], gu, routes[r][0]) for r in range(ROUTINGS)]

            def grouped(r, ops=ops, gu=gu):
                return cx.grouped_scaled_mm(
                    ops[r][0], ops[r][1], gu.data, gu.weight_scale, ops[r][2], np.dtype(F32), gu.block_size
                )

            def loop(r, ops=ops, gu=gu):
                return per_expert_scaled_mm(*ops[r][:2], gu, ops[r][2])

            (t_g, t_l), _, (yg, yl) = best_of(args.trials, grouped, loop)
            gemm_rows.append(
                (scheme, tokens, routed, t_l, t_g, bool(np.array_equal(yg.view(np.uint32), yl.view(np.uint32))))
            )
        gu = w_gu = dn = w_dn = None  # free this scheme's weights before the next is built
    clock = "CPU time" if args.cpu_time else "wall clock"
    print(
        f"\nseam.moe_fp8, Qwen3-30B-A3B MoE layer (E = {E}, H = {H}, I = {INTER}, top-{TOP_K}), "
        f"min of {args.trials} trials, {clock}, ms (steady: after {WARM_S * 1e3:.0f} ms of the side's own calls)"
    )
    print(
        "| scheme | tokens | experts routed | numpy float32 loop | moe_fp8 | ratio | target "
        "| after idle: numpy / moe_fp8 / ratio | max rel diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for scheme, tokens, routed, t_np, t_vt, idle_np, idle_vt, rel in layer_rows:
        target = TARGETS.get(tokens)
        mark = "" if target is None else f">= {target}x {'ok' if t_np / t_vt >= target else 'MISSED'}"
        print(
            f"| {scheme} | {tokens} | {routed} | {t_np * 1e3:.2f} | {t_vt * 1e3:.2f} | {t_np / t_vt:.2f}x | {mark} "
            f"| {idle_np * 1e3:.2f} / {idle_vt * 1e3:.2f} / {idle_np / idle_vt:.2f}x | {rel:.3f} |"
        )
    print("\ngate_up grouped GEMM alone ([R, 2048] x 128 experts [1536, 2048]) vs the per-expert vt.scaled_mm loop, ms")
    print("| scheme | tokens | experts routed | per-expert loop | grouped | ratio | bitwise |")
    print("|---|---|---|---|---|---|---|")
    for scheme, tokens, routed, t_l, t_g, same in gemm_rows:
        print(
            f"| {scheme} | {tokens} | {routed} | {t_l * 1e3:.2f} | {t_g * 1e3:.2f} | {t_l / t_g:.2f}x | "
            f"{'yes' if same else 'NO'} |"
        )


if __name__ == "__main__":
    main()
