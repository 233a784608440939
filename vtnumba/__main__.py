"""``python -m vtnumba`` (or ``vtnumba``): see the FP8 W8A8 linear path work, with no download.

The default job, on the CPU:

1. a quantization self-check: the three activation schemes against the independent oracle in
   ``vtnumba.testing.reference``, byte for byte;
2. the FP8 W8A8 linear path (``seam.matmul_fp8``: quantize the activation, then the FP8 GEMM) over
   the seven linear layers of one Llama-3-8B decoder block (q/k/v/o, gate/up/down: hidden 4096,
   intermediate 14336, kv 1024), with N and K divided by ``--reduce`` so the CPU finishes in
   seconds, at a decode batch and a prefill batch of tokens;
3. for each layer: the GEMM's error against a float64 reference of the same lossy pipeline (G3:
   within ``4 K eps32 |sa sb| sum|terms|`` plus the final rounding), the FP8 error against the
   float64 product of the unquantized operands, the time, GFLOP/s and GB/s, and the speedup over
   numpy's float32 sgemm on float32 weights measured in the same run.

``--device cuda`` runs it on the GPU (cupy arrays), ``--plot roofline.png`` draws each layer under
the measured ceilings (copy bandwidth, BLAS peak), ``--json`` prints one JSON object instead of
tables. Expected errors (no GPU, a missing optional extra, a bad argument) print one line and exit
non-zero.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from vtnumba.cuda import gpu_unavailable_reason  # why --device cuda cannot run here

# One decoder block of Llama-3-8B (config.json: hidden_size 4096, intermediate_size 14336,
# num_key_value_heads 8 x head_dim 128 = 1024). (name, N out_features, K in_features).
LLAMA3_8B_LAYERS = (
    ("q_proj", 4096, 4096),
    ("k_proj", 1024, 4096),
    ("v_proj", 1024, 4096),
    ("o_proj", 4096, 4096),
    ("gate_proj", 14336, 4096),
    ("up_proj", 14336, 4096),
    ("down_proj", 4096, 14336),
)


class UsageError(Exception):
    """An expected error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + message; one line is the contract here
        raise UsageError(message)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _parser():
    p = _Parser(prog="python -m vtnumba", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--reduce", type=_positive_int, default=None,
                   help="divide Llama-3-8B's N and K by this (default: 4 on the CPU, 1 on the GPU)")
    p.add_argument("--tokens", type=_positive_int, nargs="+", default=None, metavar="M",
                   help="token counts (GEMM M) to run (default: 16 256, a decode and a prefill batch)")
    p.add_argument("--repeats", type=_positive_int, default=None,
                   help="timed calls per measurement (median kept; default 5 on the CPU, 50 on the GPU)")
    p.add_argument("--plot", metavar="PNG", default=None, help="write a roofline plot (needs vtnumba[plot])")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--skip-selfcheck", action="store_true", help="skip the quantization self-check")
    return p


# ----------------------------------------------------------------------------------------- device



class _Device:
    """The array module and the baseline GEMM of one device."""

    def __init__(self, name):
        self.name = name
        if name == "cpu":
            self.xp = np
        else:
            import cupy
            self.xp = cupy

    def put(self, a):
        return a if self.xp is np else self.xp.asarray(a)

    def get(self, a):
        return a if isinstance(a, np.ndarray) else a.get()

    def baseline_label(self):
        return "numpy sgemm f32" if self.name == "cpu" else "cuBLAS sgemm f32"


# --------------------------------------------------------------------------------------- progress

class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal (a log file gets
    no carriage returns)."""

    def __init__(self, total, enabled=True, stream=None, width=24):
        self.stream = stream or sys.stderr
        self.total, self.done, self.width = total, 0, width
        self.enabled = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()

    def begin(self, label):
        """Show ``label`` as running now, with the steps finished so far."""
        if not self.enabled:
            return
        filled = self.width * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.perf_counter() - self.t0
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.1f}s {label:<28.28s}")
        self.stream.flush()

    def end(self):
        self.done += 1

    def close(self):
        if self.enabled:
            self.stream.write("\r" + " " * (self.width + 50) + "\r")
            self.stream.flush()


# ------------------------------------------------------------------------------------------- jobs

def selfcheck(dev, rows=512, cols=4096):
    """The three quantization schemes on a random tensor, compared with the oracle byte for byte."""
    import vtnumba as vt
    from vtnumba.testing import reference

    x = (np.random.default_rng(2026).standard_normal((rows, cols), dtype=np.float32) * 3).astype(np.float32)
    xd = dev.put(x)
    results = []
    for label, kwargs in (("static scale 0.0092", dict(scale=0.0092)), ("dynamic per-tensor", {}),
                          ("dynamic per-token", dict(per_token=True))):
        q = vt.quantize_fp8(xd, **kwargs)
        ref = reference.quantize(x, **kwargs)
        data, scale = dev.get(q.data), dev.get(q.scale).reshape(ref.scale.shape)
        mismatches = int(np.count_nonzero(data != ref.data)) + int(np.count_nonzero(scale != ref.scale))
        results.append(dict(scheme=label, values=int(x.size), nonzero_codes=int(np.count_nonzero(ref.data)),
                            mismatches=mismatches))
    return results


def layer_shapes(reduce):
    for name, n, k in LLAMA3_8B_LAYERS:
        if n % reduce or k % reduce:
            raise UsageError(f"--reduce must divide every Llama-3-8B dimension (4096, 1024, 14336), got {reduce}")
        yield name, n // reduce, k // reduce


def _kernel_label(dev, q, weight):
    """Which GEMM implementation the backend picks for this call (informational: 'auto' when the
    backend does not say)."""
    try:
        if dev.name == "cpu":
            from vtnumba.cpu import gemm

            return gemm.choose_kernel(q.data.shape[0], weight.shape[0], weight.shape[1])
        from vtnumba.cuda import gemm

        call = gemm.GemmCall(q.data, weight.data, q.scale, weight.weight_scale, np.float32, weight.bias)
        return gemm.select(call).name
    except Exception:  # a backend without these hooks: the label is not worth failing the run for
        return "auto"


def run_layer(dev, name, m, n, k, repeats, rng):
    """One layer: accuracy against float64, then FP8 path and baseline timings."""
    import vtnumba as vt
    from vtnumba import profile, seam
    from vtnumba.testing import reference

    # Activations of unit variance and a weight of nn.Linear's init scale (1/sqrt(K)), with a few
    # outlier channels as real activations have: realistic amax for the dynamic scale.
    x = rng.standard_normal((m, k), dtype=np.float32)
    x[:, rng.integers(0, k, size=max(1, k // 256))] *= 8
    w = (rng.standard_normal((n, k), dtype=np.float32) / np.float32(np.sqrt(k))).astype(np.float32)
    weight = seam.Fp8Weight.from_float(w)  # per-tensor weight scale, dynamic per-tensor activations
    xd = dev.put(x)
    wd = weight if dev.name == "cpu" else seam.ResidentFp8(weight, dev.name).weight
    w32 = dev.put(w)

    # G3 judges the GEMM alone: the reference takes the codes and scale this device's quantizer
    # made (the same call matmul_fp8 makes; the self-check holds the quantizer to the oracle).
    y = dev.get(seam.matmul_fp8(xd, wd))
    qd = vt.quantize_fp8(xd)
    ref, bound = reference.scaled_mm(dev.get(qd.data), weight.data, dev.get(qd.scale)[0], weight.weight_scale[0])
    allowed = bound + reference.out_rounding(ref, np.float32)
    g3 = float(np.max(np.abs(y.astype(np.float64) - ref) / allowed))
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    fp8_rel = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))

    fp8 = profile.profile_linear(wd, xd, name=name, repeats=repeats)
    quant = profile.profile_op(vt.quantize_fp8, xd, repeats=repeats, name=f"{name} (quantize)")
    base = profile.profile_op(lambda a, b: a @ b.T, xd, w32, repeats=repeats, name=f"{name} (sgemm)",
                              flops=fp8.flops, bytes=float(4 * (m * k + n * k + m * n)), shape=fp8.shape)
    label = _kernel_label(dev, qd, wd)
    return dict(layer=name, m=m, n=n, k=k, path=f"matmul_fp8 dynamic, {label}",
                time_s=fp8.time_s, quant_time_s=quant.time_s, gflops=fp8.gflops, gbytes_per_s=fp8.gbytes_per_s,
                baseline=dev.baseline_label(), baseline_time_s=base.time_s,
                speedup=base.time_s / fp8.time_s, g3_ratio=g3, g3_ok=bool(g3 <= 1.0),
                fp8_rel_error=fp8_rel, host_s=fp8.host_s), fp8, base


# ---------------------------------------------------------------------------------------- output

def _print_tables(report, out):
    p = lambda *a: print(*a, file=out)  # noqa: E731
    if report["selfcheck"]:
        p("vtnumba self-check: e4m3 quantization against the independent oracle (vtnumba.testing.reference)")
        for r in report["selfcheck"]:
            p(f"  {r['scheme']:22s} {r['values']:>9,d} values  {r['nonzero_codes']:>9,d} non-zero codes"
              f"  mismatches {r['mismatches']}")
        p()
    c = report["ceilings"]
    p(f"FP8 W8A8 linear path on {report['device']}: Llama-3-8B decoder layers, {report['reduction']}")
    p(f"measured ceilings: copy {c['copy_gbytes_per_s']:.1f} GB/s, {c['peak_label']} "
      f"{c['peak_gflops']:.1f} GFLOP/s")
    p("G3 = max |y - ref64| / bound (<= 1 passes); fp8 err = ||y - x@w.T (float64, unquantized)|| / ||x@w.T||")
    head = (f"{'layer':10s} {'M x N x K':>17s}  {'path':28s} {'ms':>8s} {'quant ms':>8s} {'GFLOP/s':>8s} {'GB/s':>7s}"
            f" {'sgemm ms':>9s} {'speedup':>8s} {'G3':>8s} {'fp8 err':>8s}")
    p(head)
    p("-" * len(head))
    for r in report["layers"]:
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        p(f"{r['layer']:10s} {shape:>17s}  {r['path']:28.28s} {r['time_s'] * 1e3:8.3f} {r['quant_time_s'] * 1e3:8.3f}"
          f" {r['gflops']:8.1f}"
          f" {r['gbytes_per_s']:7.1f} {r['baseline_time_s'] * 1e3:9.3f} {r['speedup']:7.2f}x"
          f" {r['g3_ratio']:8.1e} {r['fp8_rel_error']:8.4f}")
    p(f"speedup = {report['layers'][0]['baseline']} time / FP8 time, same run, median of "
      f"{report['repeats']} calls; FP8 'ms' includes the activation's quantization ('quant ms' alone)")
    if report.get("plot"):
        p(f"roofline written to {report['plot']}")
    p("all checks passed" if report["ok"] else "CHECK FAILED: see mismatches / G3 above")


def run(args, out=None):
    out = out or sys.stdout  # looked up per call: pytest and notebooks swap sys.stdout
    device = args.device
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        reason = gpu_unavailable_reason()
        if reason is not None:
            raise UsageError(f"--device cuda: {reason}")
    from vtnumba import profile

    if args.plot is not None:
        profile.require("matplotlib", "plot", "--plot")  # fail before the run, not after it
        parent = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(parent):
            raise UsageError(f"--plot must name a file in an existing directory, got {args.plot!r}")
    reduce = args.reduce or (4 if device == "cpu" else 1)
    tokens = args.tokens or [16, 256]
    repeats = args.repeats or (5 if device == "cpu" else 50)
    shapes = list(layer_shapes(reduce))
    dev = _Device(device)

    progress = Progress(len(shapes) * len(tokens) + 2, enabled=not args.no_progress)
    progress.begin("quantization self-check")
    checks = [] if args.skip_selfcheck else selfcheck(dev)
    progress.end()
    progress.begin("measuring ceilings")
    ceilings = profile.measure_ceilings(device)
    progress.end()
    rng = np.random.default_rng(8)
    rows, records = [], []
    try:
        for m in tokens:
            for name, n, k in shapes:
                progress.begin(f"{name} M={m}")
                row, fp8, _ = run_layer(dev, name, m, n, k, repeats, rng)
                rows.append(row)
                records.append(profile.ProfileRecord(f"{name} M={m}", fp8.device, fp8.method, fp8.time_s,
                                                     fp8.min_s, fp8.repeats, fp8.host_s, fp8.flops,
                                                     fp8.bytes, fp8.shape))
                progress.end()
    finally:
        progress.close()
    ok = all(r["mismatches"] == 0 for r in checks) and all(r["g3_ok"] for r in rows)
    reduction = (f"N and K divided by {reduce} (hidden {4096 // reduce}, intermediate {14336 // reduce}, "
                 f"kv {1024 // reduce})" if reduce > 1 else "full size")
    report = dict(device=device, reduction=reduction, reduce=reduce, tokens=tokens, repeats=repeats,
                  selfcheck=checks, ceilings=ceilings.as_dict(), layers=rows, ok=ok, plot=None)
    if args.plot is not None:
        try:
            profile.roofline_plot(records, ceilings, path=args.plot,
                                  title=f"vtnumba FP8 W8A8 linear, Llama-3-8B layers /{reduce}, {device}")
        except OSError as exc:
            raise UsageError(f"--plot could not write {args.plot!r}: {exc.strerror or exc}") from None
        report["plot"] = args.plot
    if args.json:
        print(json.dumps(report, indent=2), file=out)
    else:
        _print_tables(report, out)
    return report


def main(argv=None):
    from vtnumba.profile import MissingDependencyError

    try:
        args = _parser().parse_args(argv)
        report = run(args)
    except (UsageError, MissingDependencyError) as exc:
        print(f"vtnumba: error: {exc}", file=sys.stderr)
        return 2
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
