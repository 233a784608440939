"""Host time the seam adds over the ops it wraps.

For each activation scheme, times ``seam.matmul_fp8(x, w)`` against the exact op calls it makes
(``vt.quantize_fp8`` by the scheme, then ``vt.scaled_mm`` with the weight's codes, scales and bias)
at a small shape, where the ops themselves are cheap and the seam's Python is most visible. Also
``Fp8W8A8LinearMethod.apply`` (one more call) and a 3-D input (flatten and restore). Target: at most
2 us added per call.

Method: the two sides are timed in alternating rounds of ``--calls`` calls each, ``--rounds`` times
(the order flips every round); the table reports each side's best round and two estimates of the
added time -- the difference of the best rounds, and the median of the per-round paired differences
-- and judges the larger of the two against the target. On the GPU
(``--device cuda``) the time is host time only: calls are issued back to back and the device is
synchronized after each round, outside the timed region.

    flock /tmp/vt-bench.lock python3 benchmarks/gpu/bench_seam_overhead.py
    flock /tmp/vt-bench.lock python3 benchmarks/gpu/bench_seam_overhead.py --device cuda   # on the H200
"""

import argparse

import numpy as np

import vtnumba as vt
from vtnumba import seam
from vtnumba.timing import paired_host_time


def _ops_call(x, w):
    """What matmul_fp8 does, written out with the public ops."""
    q = seam.quantize_activation(x, w)
    return vt.scaled_mm(q.data, w.data, q.scale, w.weight_scale, out_dtype=x.dtype, bias=w.bias)


def same_bytes(a, b):
    """Whether two results (numpy or cupy) hold the same bytes."""
    return (a.get() if hasattr(a, "get") else a).tobytes() == (b.get() if hasattr(b, "get") else b).tobytes()


def time_pair(name, base_fn, test_fn, args, sync, same=same_bytes):
    """(best base round, best test round, added us by the best rounds, added us paired) of two
    functions timed as the module docstring says, after checking that they give the same result
    (the comparison is only fair if both sides do the same work) and warming both up
    (bench_interop.py times its pairs this way too)."""
    if not same(base_fn(), test_fn()):
        raise SystemExit(f"{name}: the two sides disagree; refusing to time different work")
    for _ in range(50):  # warm-up: compile and fill caches outside the timed region
        base_fn(), test_fn()
    sync()
    t_base, t_test, paired = paired_host_time(base_fn, test_fn, args.calls, args.rounds, sync)
    return t_base, t_test, (t_test - t_base) * 1e6, paired * 1e6


def parse_arguments(doc, *extra):
    """The options of the paired host-time benchmarks (this one and bench_interop.py); ``extra``:
    (args, kwargs) of more options."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--k", type=int, default=64)
    for names, options in extra:
        ap.add_argument(*names, **options)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="Numba CPU threads (default 1: the measured cost is pure Python, and a parallel "
        "region's wake-up jitter on a shared machine would drown it)",
    )
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=101)
    return ap.parse_args()


def main():
    args = parse_arguments(__doc__)

    rng = np.random.default_rng(0)
    w_float = (rng.standard_normal((args.n, args.k)) * 0.05).astype(np.float32)
    bias = rng.standard_normal(args.n).astype(np.float32)
    x_host = rng.standard_normal((args.m, args.k)).astype(np.float32)
    if args.device == "cuda":
        import cupy

        xp, sync = cupy, cupy.cuda.get_current_stream().synchronize
    else:
        import numba

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        xp, sync = np, (lambda: None)
    x = xp.asarray(x_host)
    x3 = x.reshape(1, args.m, args.k)

    print(
        f"seam.matmul_fp8 host overhead, device={args.device}"
        + (f" ({args.threads} Numba thread(s))" if args.device == "cpu" else "")
        + f", M={args.m} N={args.n} K={args.k}, "
        f"{args.rounds} alternating rounds x {args.calls} calls per side"
    )
    print(
        f"{'case':<28}{'ops us':>10}{'seam us':>10}{'added(min)':>12}{'added(paired)':>15}{'seam/ops':>10}  target <= 2 us"
    )
    worst = 0.0
    for scheme in ("static", "dynamic", "per_token"):
        host_w = seam.Fp8Weight.from_float(
            w_float,
            input_scale=0.01 if scheme == "static" else None,
            per_channel=scheme == "per_token",
            activation_scheme=scheme,
            bias=bias,
        )
        w = seam.ResidentFp8(host_w, "cpu" if args.device == "cpu" else "cuda").weight
        method = seam.make_linear_method(w)
        cases = [
            (f"matmul_fp8 {scheme}", lambda: _ops_call(x, w), lambda: seam.matmul_fp8(x, w)),
            (f"linear.apply {scheme}", lambda: _ops_call(x, w), lambda: method.apply(x)),
            (
                f"matmul_fp8 3-D {scheme}",
                lambda: _ops_call(x3.reshape(-1, args.k), w).reshape(1, args.m, args.n),
                lambda: seam.matmul_fp8(x3, w),
            ),
        ]
        for name, ops_fn, seam_fn in cases:
            t_ops, t_seam, added_min, added_paired = time_pair(name, ops_fn, seam_fn, args, sync)
            added = max(added_min, added_paired)
            worst = max(worst, added)
            print(
                f"{name:<28}{t_ops * 1e6:>10.2f}{t_seam * 1e6:>10.2f}{added_min:>12.2f}{added_paired:>15.2f}"
                f"{t_seam / t_ops:>10.3f}  {'ok' if added <= 2.0 else 'MISSED'}"
            )
    print(f"worst added host time: {worst:.2f} us per call ({'meets' if worst <= 2.0 else 'misses'} the 2 us target)")


if __name__ == "__main__":
    main()
