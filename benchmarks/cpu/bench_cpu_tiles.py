"""The small-M CPU GEMMs' register tiles (vtnumba/cpu/tile.py) against the 4 x 4 kernels they replace
on the AVX-512 paths, dense and 128 x 128 block-scaled, each kernel's serial and parallel twin called
directly (no work threshold), calls interleaved, median us.

    python benchmarks/cpu/bench_cpu_tiles.py [--shapes 16x256x256,128x256x512] [--calls 200]
"""

import argparse
import time

import numpy as np

from vtnumba.cpu import block, gemm, paths

SHAPES = "16x256x256,16x256x512,16x512x256,128x256x256,128x256x512,128x512x256,64x2048x2048,16x4096x4096"


def interleaved(calls, count):
    """Median seconds of each call, the calls taken in turn ``count`` times after one warm-up each."""
    for call in calls:
        call()
    times = [[] for _ in calls]
    for _ in range(count):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated MxKxN")
    parser.add_argument("--calls", type=int, default=200, help="calls of each kernel per shape (10 at K >= 2048)")
    args = parser.parse_args()
    path = paths.active()
    if not path.register_tiles:
        raise SystemExit(f"the CPU path here is {path.name}, which has no register tiles (they need AVX-512)")
    print(f"path {path.name}, load average {open('/proc/loadavg').read().split()[:3]}")
    print("| M x K x N | twin | dense 4x4 / tiled us | ratio | block 4x4 / tiled us | ratio |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.split("x"))
        codes_a = rng.integers(0, 0x7E, (m, k), dtype=np.uint8)
        b = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
        x = np.empty((m, k), np.float32)
        gemm.decode_rows(codes_a, x)
        sa, sb, bias = np.ones(m, np.float32), np.ones(n, np.float32), np.zeros(0, np.float32)
        nkb = -(-k // 128)
        sat = rng.random((nkb, m)).astype(np.float32)
        sb_blocks = rng.random((-(-n // 128), nkb)).astype(np.float32)
        out = np.empty((m, n), np.float32)
        count = 10 if k >= 2048 else args.calls
        for parallel in (False, True):
            old, new = (kern.variant(path.name, parallel) for kern in (gemm.small_m_kernel, gemm.tiled_kernel))
            old_b, new_b = (kern.variant(path.name, parallel) for kern in (block.small_m_kernel, block.tiled_kernel))
            t = interleaved(
                [
                    lambda: old(x, b, sa, sb, bias, out),
                    lambda: new(x, b, sa, sb, bias, out),
                    lambda: old_b(x, b, sat, sb_blocks, 128, 128, bias, out),
                    lambda: new_b(x, b, sat, sb_blocks, 128, 128, bias, out),
                ],
                count,
            )
            us = [v * 1e6 for v in t]
            print(
                f"| {shape} | {'parallel' if parallel else 'serial'} | {us[0]:.0f} / {us[1]:.0f} | {us[0] / us[1]:.2f}x "
                f"| {us[2]:.0f} / {us[3]:.0f} | {us[2] / us[3]:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
