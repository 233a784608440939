"""CPU FP8 GEMM speed: vt.scaled_mm against numpy/OpenBLAS sgemm on weights kept
dequantized in float32 (4x the weight memory), measured in the same run.

    flock /tmp/vt-bench.lock python3 benchmarks/cpu/bench_cpu_gemm.py            # the issue's table
    flock /tmp/vt-bench.lock python3 benchmarks/cpu/bench_cpu_gemm.py --crossover  # small_m vs blas by M

The peer's dequantization is not timed (its weights are already float32, as a user would keep them);
vtnumba's time includes decoding both operands. The two are timed in alternating streaks and each
side's best time is kept (see ``interleaved_best``). The ratio
is peer time / vtnumba time: above 1 means vtnumba is faster. torch's CPU ``_scaled_mm`` runs beside
them when torch is installed (it is not a dependency).

Targets: ratio >= 1.5 at M = 1, >= 1.3 at M = 16, >= 0.85 at M = 128 and 1024. Extra
memory at N = K = 4096 under 64 MiB beyond inputs and output (measured in a fresh process from the
peak RSS). The header names the CPU and the kernel path vtnumba chose for it (vtnumba.cpu.paths);
``VT_CPU_PATH=portable`` (or another path this CPU runs) measures another path.
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

import vtnumba as vt
from vtnumba.cpu import gemm

SHAPES = ((4096, 4096), (4096, 14336))  # (N, K)
MS = (1, 16, 128, 1024)
TARGETS = {1: 1.5, 16: 1.3, 128: 0.85, 1024: 0.85}


def random_codes(rng, shape):
    """e4m3 codes of N(0, 1)-ish values (no NaN codes), like a quantized weight or activation."""
    return vt.encode_e4m3(rng.standard_normal(shape, dtype=np.float32))


# Pause before each streak: OpenBLAS's worker threads busy-wait about 2^28 cycles (~80 ms) after
# every call (its THREAD_TIMEOUT), and Numba's OpenMP workers spin too. On two cores the next
# streak's threads then share a core with a spinning one: measured, vtnumba's M = 16 kernel took
# 8.0 ms right after a numpy matmul, 2.1 ms after a 0.5 s pause (or with OPENBLAS_THREAD_TIMEOUT=4).
SETTLE_S = 0.25


def round_times(fns, repeats, rounds=5):
    """Best time of each function in each of ``rounds`` rounds: array [rounds, len(fns)]. In a
    round every function runs ``repeats`` times back to back, after a pause (SETTLE_S) and one
    untimed warm-up call, so no side is timed while the other side's threads still spin.

    Rounds alternate, so load from another process hits both sides alike, and the ratio is taken
    per round (both sides seeing the same load)."""
    times = np.full((rounds, len(fns)), np.inf)
    for r in range(rounds):
        for i, fn in enumerate(fns):
            time.sleep(SETTLE_S)
            fn()
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                times[r, i] = min(times[r, i], time.perf_counter() - t0)
    return times


def interleaved_best(fns, repeats, rounds=3):
    """Best time of each function over ``rounds`` rounds of ``round_times``."""
    return list(round_times(fns, repeats, rounds).min(axis=0))


def repeats_for(m, k):
    work = m * k
    return 6 if work <= 4096 * 16 else 3 if work <= 4096 * 128 else 1


def torch_scaled_mm(a, b, sa, sb):
    """torch's CPU _scaled_mm on the same codes, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    ta = torch.from_numpy(a).view(torch.float8_e4m3fn)
    tb = torch.from_numpy(b).view(torch.float8_e4m3fn)
    tsa, tsb = torch.tensor(float(sa)), torch.tensor(float(sb))
    return lambda: torch._scaled_mm(ta, tb.t(), scale_a=tsa, scale_b=tsb, out_dtype=torch.float32)


def issue_table(rng):
    sa, sb = np.float32(0.02), np.float32(0.003)
    print("ms: best over all rounds; ratio: median over rounds of peer / vtnumba (low-high in brackets)")
    print(
        f"{'M':>5s} {'N':>6s} {'K':>6s} {'kernel':>8s} {'peer ms':>9s} {'vt ms':>9s} {'vt GFLOP/s':>11s} "
        f"{'ratio':>6s} {'(low-high)':>12s} {'target':>7s} {'torch ms':>9s}"
    )
    for n, k in SHAPES:
        b = random_codes(rng, (n, k))
        w = vt.decode_e4m3(b) * sb  # the peer's resident float32 weight, dequantized once, untimed
        for m in MS:
            a = random_codes(rng, (m, k))
            x = vt.decode_e4m3(a) * sa
            times = round_times([lambda: x @ w.T, lambda: vt.scaled_mm(a, b, sa, sb)], repeats_for(m, k))
            peer, ours = times.min(axis=0)
            ratios = times[:, 0] / times[:, 1]
            # torch's CPU _scaled_mm is ~100x slower (ANCHORS.md: 108 ms at M = 1): timed apart, twice
            torch_fn = torch_scaled_mm(a, b, sa, sb) if m <= 128 else None
            torch_ms = f"{interleaved_best([torch_fn], 1, rounds=1)[0] * 1e3:9.2f}" if torch_fn else f"{'-':>9s}"
            kernel = gemm.choose_kernel(m, n, k)
            ratio = float(np.median(ratios))
            flag = "" if ratio >= TARGETS[m] else "  MISSED"
            spread = f"({ratios.min():.2f}-{ratios.max():.2f})"
            print(
                f"{m:5d} {n:6d} {k:6d} {kernel:>8s} {peer * 1e3:9.2f} {ours * 1e3:9.2f} "
                f"{2 * m * n * k / ours / 1e9:11.1f} {ratio:6.2f} {spread:>12s} {TARGETS[m]:7.2f} {torch_ms}{flag}",
                flush=True,
            )


def crossover_table(rng):
    """Both fast kernels forced, by M and K: where blas overtakes small_m (SMALL_M_ELEMENTS in
    gemm.py)."""
    n = 4096
    one = np.float32(1.0)
    print(f"{'K':>6s} {'M':>5s} {'peer ms':>9s} {'small_m ms':>11s} {'blas ms':>9s}  faster  default")
    for k in (4096, 14336):
        b = random_codes(rng, (n, k))
        w = vt.decode_e4m3(b)
        for m in (16, 128, 256, 512, 1024):
            a = random_codes(rng, (m, k))
            x = vt.decode_e4m3(a)
            times = interleaved_best(
                [
                    lambda: x @ w.T,
                    lambda: vt.scaled_mm(a, b, one, one, kernel="small_m"),
                    lambda: vt.scaled_mm(a, b, one, one, kernel="blas"),
                ],
                repeats_for(m, k),
                rounds=2,
            )
            print(
                f"{k:6d} {m:5d} {times[0] * 1e3:9.2f} {times[1] * 1e3:11.2f} {times[2] * 1e3:9.2f}  "
                f"{'small_m' if times[1] < times[2] else 'blas':>7s}  {gemm.choose_kernel(m, n, k)}",
                flush=True,
            )


def m1_paths_table(rng):
    """M = 1 on every kernel path this CPU runs (vtnumba.cpu.paths), interleaved with the sgemv peer."""
    from vtnumba.cpu import paths

    sa, sb = np.float32(0.02), np.float32(0.003)
    names = [p.name for p in paths.runnable()]
    print(f"M = 1, ms (best over rounds); ratio = peer / path, median over rounds; paths: {', '.join(names)}")
    for n, k in SHAPES:
        b = random_codes(rng, (n, k))
        w = vt.decode_e4m3(b) * sb
        a = random_codes(rng, (1, k))
        x = vt.decode_e4m3(a) * sa

        def on(name):
            def call():
                with paths.use(name):
                    vt.scaled_mm(a, b, sa, sb)

            return call

        times = round_times([lambda: x @ w.T] + [on(name) for name in names], 6)
        cells = [
            f"{name} {times[:, i + 1].min() * 1e3:.3f} ms ({np.median(times[:, 0] / times[:, i + 1]):.2f}x)"
            for i, name in enumerate(names)
        ]
        print(f"  N={n} K={k}: sgemv {times[:, 0].min() * 1e3:.3f} ms; " + "; ".join(cells), flush=True)


def _status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_rss_child(m):
    """Run in a fresh process (Linux): bytes the GEMM adds to the peak RSS beyond inputs and output.
    The peak is reset after compiling (writing 5 to /proc/self/clear_refs resets VmHWM), so the
    compiler's own memory is not counted."""
    rng = np.random.default_rng(1)
    n = k = 4096
    a, b = random_codes(rng, (m, k)), random_codes(rng, (n, k))
    kernel = gemm.choose_kernel(m, n, k)
    # compile on a tiny problem that takes the same kernel, so compiler memory is not counted
    vt.scaled_mm(a[:, :64], b[:64, :64], 1.0, 1.0, kernel=kernel)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_bytes("VmRSS")
    y = vt.scaled_mm(a, b, 1.0, 1.0)
    print(max(0, _status_bytes("VmHWM") - before - y.nbytes))


def memory_table():
    print(f"{'M':>5s} {'extra MiB at N = K = 4096':>26s} {'target':>7s}")
    for m in (1, 16, 128, 1024):
        out = subprocess.run(
            [sys.executable, __file__, "--rss-child", str(m)], check=True, capture_output=True, text=True
        )
        extra = int(out.stdout.strip()) / 2**20
        print(f"{m:5d} {extra:26.1f} {'< 64':>7s}{'' if extra < 64 else '  MISSED'}")


def blas_name():
    """numpy's BLAS and its core type (threadpoolctl's view when installed, numpy's config otherwise)."""
    try:
        from threadpoolctl import threadpool_info

        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            return (
                f"{info[0].get('internal_api')} {info[0].get('version')} ({info[0].get('architecture')}), "
                f"{info[0].get('num_threads')} threads"
            )
    except ImportError:
        pass
    config = np.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    return f"{config.get('name', '?')} {config.get('version', '')}".strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--crossover", action="store_true", help="only the small_m / blas crossover table")
    parser.add_argument("--m1-paths", action="store_true", help="only M = 1 on every kernel path this CPU runs")
    parser.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child is not None:
        _peak_rss_child(args.rss_child)
        return
    import numba

    from vtnumba.cpu import paths

    print(paths.header_line())
    print(
        f"numba threads={numba.get_num_threads()}, cores={os.cpu_count()}, numpy {np.__version__}, BLAS: {blas_name()}"
    )
    rng = np.random.default_rng(0)
    if args.crossover:
        crossover_table(rng)
        return
    if args.m1_paths:
        m1_paths_table(rng)
        return
    issue_table(rng)
    memory_table()


if __name__ == "__main__":
    main()
