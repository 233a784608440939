"""The host cost of a bound decode call, timed on a machine without a GPU (issue 39, item 4).

    python3 benchmarks/cpu/bench_host_cost.py                     # N = K = 256, best of 7 x 2000 calls
    python3 benchmarks/cpu/bench_host_cost.py --n 4096 --k 4096   # the H200 figures' dense shape
    python3 benchmarks/cpu/bench_host_cost.py --rounds 15 --json host_cost.json

Each call runs against ``vtnumba.testing.recording.RecordingRuntime``: cupy, the driver's launch and
cuBLASLt are stand-ins that do nothing a GPU would, so what is timed is the Python part of the call --
the seam's checks and key, the bound call's pointer writes and the launcher -- plus the stand-ins' own
cost, which is measured alone in the same run (one pool malloc, one launch, one matmul, one
attribute set) and subtracted by the call's counts. A change that makes the bound call cost more
host time shows here, on the CPU machine, before anyone reaches the H200.

Rows: ``seam.matmul_fp8`` at M = 1 for every activation scheme, ``seam.moe_fp8`` at one token for
every float scheme (8 experts, top-2), and each bound call's ``enqueue`` alone -- what the torch
modules run per call after their two ``torch.empty``. Columns: best-of-rounds microseconds per call,
the stand-ins' share, the Python part (the difference), and the call's counts (launches, cuBLASLt
matmuls, attribute sets, allocations, Python calls: tests/test_host_counts.py pins the same counts).

The shapes do not change the host path (only the kernels' grids), so the small default keeps the
weight build short; the numbers are this machine's, comparable run against run, not the H200's.
"""

import argparse
import json
import platform
import sys

import numpy as np

from vtnumba.testing import recording


def _unit_costs(rt, cupy, repeat, rounds):
    """Microseconds of one call of each stand-in, timed alone (outside a recording: nothing counts),
    after the calls were bound (a kernel is loaded: its fake function launches)."""
    import nvmath.bindings.cublasLt as lt
    from cupy.cuda import driver

    fn = next(iter(rt._state.functions))
    attr = lt.MatmulDescAttribute.B_SCALE_POINTER
    costs = {
        "allocation": lambda: cupy.empty(512, dtype=np.uint8),
        "launch": lambda: driver.launchKernel(fn, 1, 1, 1, 256, 1, 1, 0, 0, 0, 0),
        "matmul": lambda: lt.matmul(*(0,) * 16),
        "attribute_set": lambda: lt.matmul_desc_set_attribute(0, attr, 0, 8),
    }
    return {name: recording.time_call(fn, repeat=repeat, rounds=rounds) for name, fn in costs.items()}


def _row(rt, name, step, units, repeat, rounds):
    step()  # the first run on new pointers may set cuBLASLt's pointer attributes anew
    with rt.record() as counts:
        step()
    total = recording.time_call(step, repeat=repeat, rounds=rounds)
    stand_ins = (
        len(counts.launches) * units["launch"]
        + counts.matmuls * units["matmul"]
        + counts.attribute_sets * units["attribute_set"]
        + counts.allocations * units["allocation"]
    )
    return {
        "call": name,
        "us": total,
        "stand_ins_us": stand_ins,
        "python_us": total - stand_ins,
        "launches": len(counts.launches),
        "matmuls": counts.matmuls,
        "attribute_sets": counts.attribute_sets,
        "allocations": counts.allocations,
        "python_calls": counts.python_calls,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=256, help="dense output features N (default 256)")
    p.add_argument("--k", type=int, default=256, help="dense input features K (default 256)")
    p.add_argument("--repeat", type=int, default=2000, help="calls per round (default 2000)")
    p.add_argument("--rounds", type=int, default=7, help="rounds; the best is reported (default 7)")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)

    rows = []
    with recording.RecordingRuntime() as rt:
        import cupy

        calls = {
            f"matmul_fp8 {s}": recording.dense_decode(cupy, s, n=args.n, k=args.k) for s in recording.DENSE_SCHEMES
        }
        calls.update({f"moe_fp8 {s}": recording.moe_decode(cupy, s) for s in recording.MOE_SCHEMES})
        for decode in calls.values():
            decode.bind()
        units = _unit_costs(rt, cupy, args.repeat, args.rounds)
        for name, decode in calls.items():
            rows.append(_row(rt, name, decode.call, units, args.repeat, args.rounds))
        for name, decode in calls.items():
            rows.append(_row(rt, name.replace("matmul_fp8", "enqueue dense").replace("moe_fp8", "enqueue moe"),
                             decode.enqueue, units, args.repeat, args.rounds))  # fmt: skip

    print(f"host cost of a bound decode call, recording runtime ({platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}); best of {args.rounds} x {args.repeat} calls; dense N = {args.n}, "
          f"K = {args.k}")  # fmt: skip
    print("stand-ins alone, us per call: " + ", ".join(f"{k} {v:.2f}" for k, v in units.items()))
    print()
    print("| call | us | stand-ins us | Python us | launches | matmuls | attr sets | allocs | Python calls |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['call']} | {r['us']:.2f} | {r['stand_ins_us']:.2f} | {r['python_us']:.2f} | {r['launches']} "
            f"| {r['matmuls']} | {r['attribute_sets']} | {r['allocations']} | {r['python_calls']} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"units_us": units, "rows": rows, "args": vars(args)}, f, indent=1)
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
