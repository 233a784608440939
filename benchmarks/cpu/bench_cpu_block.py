"""CPU block-scaled FP8 speed: the block-scaled GEMM against the per-tensor CPU GEMM
(vt.scaled_mm) on the same codes and shapes, and per-group quantization against static per-tensor
quantization, measured in the same run.

    flock /tmp/vt-bench.lock python3 benchmarks/cpu/bench_cpu_block.py            # N = K = 4096
    flock /tmp/vt-bench.lock python3 benchmarks/cpu/bench_cpu_block.py --k 14336  # a wider K too
    NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python3 benchmarks/cpu/bench_cpu_block.py --cpu-time
    NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python3 benchmarks/cpu/bench_cpu_block.py --cpu-time --mx --rounds 9

``--cpu-time`` times each call by the process's CPU time instead of the wall clock: on a machine
shared with other jobs, wall-clock times of a two-thread kernel swing by 10x (a thread waits at a
barrier while its sibling is descheduled), while one thread's CPU time hardly moves. Run it with one
Numba and one BLAS thread, as above, so no thread spins in another's wait.

GEMM: ratio = per-tensor time / block-scaled time (above 1: the block-scaled GEMM is faster); target
>= 0.8 at M = 1, 16, 1024 (128 x 128 blocks). Beside it the weight-read floor: the weight's bytes
over the read bandwidth a Numba kernel on every core reaches on a 256 MiB buffer (larger than the L3,
so from DRAM), measured in the same run: a layer whose weight comes from memory cannot run faster.
The GEMMs themselves are timed warm, as the per-tensor benchmark times them: a 16 MiB weight stays in
a 32 MiB L3 between calls. Both GEMMs are timed in alternating rounds
(``bench_cpu_gemm.round_times``); a ratio is the median of the per-round ratios, so load from other
processes hits both sides alike.

Quantization: GB/s counts bytes read plus bytes written (float32 4 + 1 per value, bfloat16 2 + 1, the
group scales too).

``--mx``: the MXFP8 GEMM (E8M0 scales per 1 x 32 on both operands, ``vt.scaled_mm(...,
block_size=(1, 32))``) against the per-tensor GEMM instead, target >= 0.8 at M = 1, 16, 1024, and MX
quantization against static quantization. ``--rounds`` sets the alternating rounds (the ratio's
median and its low-high spread come from them: the spread is the machine's noise).
"""

import argparse
import os
import time

import bench_cpu_gemm
import numba
import numpy as np
from bench_cpu_gemm import random_codes, repeats_for
from numba import njit, prange

import vtnumba as vt
from vtnumba.cpu import block, mx, paths

MS = (1, 16, 1024)
TARGET = 0.8
BLOCK = (128, 128)


@njit(parallel=True, nogil=True)
def _read_every_byte(words):
    """Read every 8-byte word of ``words`` once, on all cores (xor-folded so the loads stay)."""
    rows = words.shape[0]
    partial = np.zeros(rows, dtype=np.uint64)
    for r in prange(rows):
        acc = np.uint64(0)
        row = words[r]
        for k in range(row.size):
            acc ^= row[k]
        partial[r] = acc
    return partial


CLOCK = time.perf_counter


def round_times(fns, repeats, rounds=5):
    """``bench_cpu_gemm.round_times`` on this benchmark's clock (wall, or CPU time with --cpu-time)."""
    times = np.full((rounds, len(fns)), np.inf)
    for r in range(rounds):
        for i, fn in enumerate(fns):
            time.sleep(bench_cpu_gemm.SETTLE_S)
            fn()
            for _ in range(repeats):
                t0 = CLOCK()
                fn()
                times[r, i] = min(times[r, i], CLOCK() - t0)
    return times


def read_bandwidth():
    """Bytes per second a parallel read of a 256 MiB buffer reaches (best of a few)."""
    words = np.ones((4096, 8192), dtype=np.uint64)
    best = min(round_times([lambda: _read_every_byte(words)], 3, rounds=3).ravel())
    return words.nbytes / best


def gemm_table(rng, shapes):
    bandwidth = read_bandwidth()
    print(f"read bandwidth (256 MiB, all cores): {bandwidth / 1e9:.1f} GB/s")
    print("ms: best over rounds; ratio: median over rounds of per-tensor / block-scaled (low-high)")
    print(
        f"{'M':>5s} {'N':>6s} {'K':>6s} {'kernel':>8s} {'floor ms':>9s} {'per-tensor ms':>14s} "
        f"{'block ms':>9s} {'ratio':>6s} {'(low-high)':>12s} {'target':>7s}"
    )
    for n, k in shapes:
        b = random_codes(rng, (n, k))
        sb = rng.uniform(1e-3, 1e-2, size=(-(-n // BLOCK[0]), -(-k // BLOCK[1]))).astype(np.float32)
        floor = b.nbytes / bandwidth
        for m in MS:
            a = random_codes(rng, (m, k))
            sa = rng.uniform(1e-2, 1.0, size=(m, -(-k // BLOCK[1]))).astype(np.float32)
            times = round_times(
                [
                    lambda: vt.scaled_mm(a, b, np.float32(0.02), np.float32(0.003)),
                    lambda: block.block_scaled_mm(a, b, sa, sb, BLOCK, np.dtype(np.float32), None),
                ],
                repeats_for(m, k),
            )
            per_tensor, blocked = times.min(axis=0)
            ratios = times[:, 0] / times[:, 1]
            ratio = float(np.median(ratios))
            flag = "" if ratio >= TARGET else "  MISSED"
            print(
                f"{m:5d} {n:6d} {k:6d} {block.choose_kernel(m, n, k):>8s} {floor * 1e3:9.2f} "
                f"{per_tensor * 1e3:14.2f} {blocked * 1e3:9.2f} {ratio:6.2f} "
                f"{f'({ratios.min():.2f}-{ratios.max():.2f})':>12s} {TARGET:7.2f}{flag}",
                flush=True,
            )


def mx_table(rng, shapes, rounds):
    """The MXFP8 GEMM against the per-tensor GEMM on the same codes, both through vt.scaled_mm."""
    print(
        f"MXFP8 (E8M0 scales per 1 x 32, both operands) vs per-tensor; ratio: median over {rounds} rounds of "
        f"per-tensor / MXFP8 (low-high)"
    )
    print(
        f"{'M':>5s} {'N':>6s} {'K':>6s} {'kernel':>8s} {'per-tensor ms':>14s} {'mx ms':>9s} {'ratio':>6s} "
        f"{'(low-high)':>12s} {'target':>7s}"
    )
    for n, k in shapes:
        b = random_codes(rng, (n, k))
        sb = rng.integers(112, 124, size=(n, -(-k // 32)), dtype=np.uint8)  # weight-like: 2^-15 .. 2^-4
        for m in MS:
            a = random_codes(rng, (m, k))
            sa = rng.integers(118, 132, size=(m, -(-k // 32)), dtype=np.uint8)
            times = round_times(
                [
                    lambda: vt.scaled_mm(a, b, np.float32(0.02), np.float32(0.003)),
                    lambda: vt.scaled_mm(a, b, sa, sb, block_size=(1, 32)),
                ],
                repeats_for(m, k),
                rounds=rounds,
            )
            per_tensor, blocked = times.min(axis=0)
            ratios = times[:, 0] / times[:, 1]
            ratio = float(np.median(ratios))
            flag = "" if ratio >= TARGET else "  MISSED"
            kernel = mx.choose_kernel(m, n, k)
            kernel = "lookup" if m == 1 and kernel == "small_m" and mx._lookup_path() else kernel
            print(
                f"{m:5d} {n:6d} {k:6d} {kernel:>8s} {per_tensor * 1e3:14.2f} {blocked * 1e3:9.2f} {ratio:6.2f} "
                f"{f'({ratios.min():.2f}-{ratios.max():.2f})':>12s} {TARGET:7.2f}{flag}",
                flush=True,
            )


def mx_quant_table(rng):
    print(f"\n{'x':>12s} {'dtype':>9s} {'static GB/s':>12s} {'mx GB/s':>11s} {'mx/static':>13s}")
    for m, k in ((1, 4096), (16, 4096), (1024, 4096)):
        x32 = rng.standard_normal((m, k), dtype=np.float32) * 10
        for dtype in (np.dtype(np.float32), np.dtype(vt._arrays.BFLOAT16)):
            x = x32.astype(dtype)
            static_bytes = x.nbytes + x.size
            mx_bytes = x.nbytes + x.size + m * -(-k // 32)
            reps = 200 if m * k <= 16 * 4096 else 5
            times = round_times(
                [lambda: vt.quantize_fp8(x, 0.37), lambda: vt.quantize_fp8(x, group_size=32, scale_format="e8m0")], reps
            )
            static, grouped = times.min(axis=0)
            print(
                f"{f'{m}x{k}':>12s} {str(dtype):>9s} {static_bytes / static / 1e9:12.1f} "
                f"{mx_bytes / grouped / 1e9:11.1f} {float(np.median(times[:, 0] / times[:, 1])):13.2f}",
                flush=True,
            )


def quant_table(rng):
    print(f"\n{'x':>12s} {'dtype':>9s} {'static GB/s':>12s} {'group GB/s':>11s} {'group/static':>13s}")
    for m, k in ((1, 4096), (16, 4096), (1024, 4096), (4096, 4096)):
        x32 = rng.standard_normal((m, k), dtype=np.float32) * 10
        for dtype in (np.dtype(np.float32), np.dtype(vt._arrays.BFLOAT16)):
            x = x32.astype(dtype)
            groups = m * -(-k // BLOCK[1])
            static_bytes = x.nbytes + x.size
            group_bytes = x.nbytes + x.size + 4 * groups
            reps = 200 if m * k <= 16 * 4096 else 5  # tiny calls: many, so the best escapes load from other processes
            times = round_times([lambda: vt.quantize_fp8(x, 0.37), lambda: block.quantize_per_group(x, BLOCK[1])], reps)
            static, grouped = times.min(axis=0)
            print(
                f"{f'{m}x{k}':>12s} {str(dtype):>9s} {static_bytes / static / 1e9:12.1f} "
                f"{group_bytes / grouped / 1e9:11.1f} {float(np.median(times[:, 0] / times[:, 1])):13.2f}",
                flush=True,
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, action="append", default=[], help="also run N = 4096 with this K (repeatable)")
    parser.add_argument("--cpu-time", action="store_true", help="time by process CPU time (see above)")
    parser.add_argument("--mx", action="store_true", help="MXFP8 against per-tensor instead (see above)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per shape")
    args = parser.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    print(
        f"numba threads={numba.get_num_threads()}, cores={os.cpu_count()}, numpy {np.__version__}, "
        f"clock={'process CPU time' if args.cpu_time else 'wall'}"
    )
    rng = np.random.default_rng(0)
    if args.mx:
        print(f"CPU path: {paths.active().name}")
        mx_table(rng, [(4096, 4096)] + [(4096, k) for k in args.k], args.rounds)
        mx_quant_table(rng)
        return
    gemm_table(rng, [(4096, 4096)] + [(4096, k) for k in args.k])
    quant_table(rng)


if __name__ == "__main__":
    main()
