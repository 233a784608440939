"""Where the one-token CPU MoE layer's time goes (issue 41, item 3): each named step of
``seam.moe_fp8`` (``MoeCall.steps``) timed alone, the M = 1 grouped GEMMs in G weights/s, beside the
machine's read bandwidth (a sum over a 150 MB array) and the dense M = 1 kernel at 4096^2.

    flock /tmp/vt-bench.lock python3 benchmarks/cpu/profile_moe_cpu.py
    flock /tmp/vt-bench.lock python3 benchmarks/cpu/profile_moe_cpu.py --threads 1 --parts steps

Shapes as ``bench_moe_cpu.py`` (Qwen3-30B-A3B: 128 experts, H 2048, I 768, top-8). Weights are cold
as in a model: each timed call takes the next of ROUTINGS routings (8 experts of 128 each, 37.7 MB of
codes a routing) or the next of COLD dense weights, more bytes than the last-level cache holds.
A figure is the minimum over the trials of a sweep's mean per call, wall clock and the process's CPU
time. ``--threads`` caps Numba's threads (numba.set_num_threads; 1: every kernel's serial twin).
"""

import argparse
import time

import numba
import numpy as np
from numba import njit, prange

from vtnumba import seam
from vtnumba.cpu import gemm, paths
from vtnumba.seam.experts import MoeCall

E, H, INTER, TOP_K = 128, 2048, 768, 8
F32 = np.float32
ROUTINGS = 8  # 8 x 37.7 MB of expert codes per sweep
COLD = 12  # dense 4096^2 weights per sweep: 12 x 16.8 MB


def best(fn, n, trials):
    """(wall, cpu) seconds per call: the minimum over trials of a sweep fn(0) .. fn(n - 1)."""
    wall, cpu = [], []
    for _ in range(trials):
        fn(n - 1)
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            fn(i)
        wall.append((time.perf_counter() - t0) / n)
        cpu.append((time.process_time() - c0) / n)
    return min(wall), min(cpu)


@njit(parallel=True, nogil=True, cache=True)
def _sum_words(words):
    s = np.uint64(0)
    for i in prange(words.size):
        s += words[i]
    return s


def bandwidth(trials):
    """GB/s of reading 150 MB: numpy's sum over uint8 (what the brief asks for), over the same bytes
    as uint64 words (numpy's pairwise add, less widening), and a Numba prange sum on Numba's threads."""
    a = np.random.default_rng(0).integers(0, 255, 150_000_000, dtype=np.uint8)
    words = a.view(np.uint64)
    _sum_words(words)
    rows = []
    for name, fn in (
        ("numpy uint8 a.sum()", lambda _: a.sum()),
        ("numpy a.view(uint64).sum()", lambda _: words.sum()),
        (f"numba prange sum, {numba.get_num_threads()} threads", lambda _: _sum_words(words)),
    ):
        wall, cpu = best(fn, 1, trials)
        rows.append((name, wall, cpu, a.nbytes / wall / 1e9))
    return rows


def routing(rng):
    ids = rng.choice(E, TOP_K, replace=False)[None, :].astype(np.int64)
    logits = rng.standard_normal((1, TOP_K)).astype(F32)
    w = np.exp(logits - logits.max())
    return ids, (w / w.sum()).astype(F32)


def build(scheme, rng):
    kw = dict(per_channel=True, activation_scheme="per_token") if scheme == "per_token" else dict(block_size=(128, 128))
    out = []
    for n, k in ((2 * INTER, H), (H, INTER)):
        w = rng.standard_normal((E, n, k), dtype=F32)
        w *= F32(0.02)
        out.append(seam.Fp8Experts.from_float(w, **kw))
        del w
    return out


def steps(scheme, gu, dn, trials, rng):
    """Per step: (name, wall s, cpu s); the layer's steps run in turn on ROUTINGS calls whose state is
    filled once (call.run()), so each step reads its own inputs and its weights cold."""
    xs = [rng.standard_normal((1, H), dtype=F32) for _ in range(ROUTINGS)]
    calls = [MoeCall(xs[r], gu, dn, *routing(rng)) for r in range(ROUTINGS)]
    for c in calls:
        c.run()
    rows = []
    for j, (name, _) in enumerate(calls[0].steps):
        wall, cpu = best(lambda r, j=j: calls[r].steps[j][1](), ROUTINGS, trials)
        rows.append((name, wall, cpu))
    wall, cpu = best(lambda r: calls[r].run(), ROUTINGS, trials)
    rows.append(("whole layer (MoeCall.run)", wall, cpu))
    wall, cpu = best(
        lambda r: seam.moe_fp8(calls[r].state["x"], gu, dn, calls[r].state["topk_ids"], calls[r].state["topk_weights"]),
        ROUTINGS,
        trials,
    )
    rows.append(("seam.moe_fp8", wall, cpu))
    return rows


def dense_m1(trials, rng):
    """The dense M = 1 kernel at 4096^2 (gemm.scaled_mm's choice), weights hot and cold."""
    n = k = 4096
    ws = [rng.integers(0, 0x7F, (n, k), dtype=np.uint8) for _ in range(COLD)]  # finite positive codes
    a = rng.integers(0, 0x7F, (1, k), dtype=np.uint8)
    one = np.ones(1, F32)

    def call(i):
        return gemm.scaled_mm(a, ws[i], one, one, F32, None, None)

    rows = []
    for label, count in (("hot (one weight)", 1), (f"cold ({COLD} weights)", COLD)):
        wall, cpu = best(call, count, trials)
        rows.append((f"dense M = 1, 4096 x 4096, {label}", wall, cpu, n * k))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="cap Numba's threads (0: leave them)")
    parser.add_argument("--parts", nargs="+", default=["bandwidth", "dense", "steps"])
    parser.add_argument("--schemes", nargs="+", default=["per_token", "per_group"])
    args = parser.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)
    print(paths.header_line())
    print(f"load average {open('/proc/loadavg').read().split()[:3]}, Numba threads {numba.get_num_threads()}")
    rng = np.random.default_rng(41)
    if "bandwidth" in args.parts:
        print("\n| read 150 MB | wall ms | CPU ms | GB/s (wall) |\n|---|---|---|---|")
        for name, wall, cpu, gbs in bandwidth(args.trials):
            print(f"| {name} | {wall * 1e3:.2f} | {cpu * 1e3:.2f} | {gbs:.1f} |")
    if "dense" in args.parts:
        print("\n| kernel | wall ms | CPU ms | G weights/s (wall) |\n|---|---|---|---|")
        for name, wall, cpu, weights in dense_m1(args.trials, rng):
            print(f"| {name} | {wall * 1e3:.3f} | {cpu * 1e3:.3f} | {weights / wall / 1e9:.2f} |")
    if "steps" in args.parts:
        gu_w = TOP_K * 2 * INTER * H
        dn_w = TOP_K * H * INTER
        for scheme in args.schemes:
            gu, dn = build(scheme, rng)
            print(f"\n{scheme}: one token, {ROUTINGS} routings cycled (weights cold)")
            print("| step | wall us | CPU us | G weights/s (wall) |\n|---|---|---|---|")
            for name, wall, cpu in steps(scheme, gu, dn, args.trials, rng):
                w = {"gate_up": gu_w, "down": dn_w}.get(name)
                rate = f"{w / wall / 1e9:.2f}" if w else ""
                print(f"| {name} | {wall * 1e6:.1f} | {cpu * 1e6:.1f} | {rate} |")
            gu = dn = None
    print(f"\nload average after {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
