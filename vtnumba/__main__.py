"""``python -m vtnumba`` (or ``vtnumba``): see the FP8 W8A8 linear path work, with no download.

The default job, on the CPU:

1. a quantization self-check: the activation schemes against the independent oracle in
   ``vtnumba.testing.reference``, byte for byte;
2. the FP8 W8A8 linear path (``seam.matmul_fp8``: quantize the activation, then the FP8 GEMM) over
   the seven linear layers of one Llama-3-8B decoder block (q/k/v/o, gate/up/down: hidden 4096,
   intermediate 14336, kv 1024), with N and K divided by ``--reduce`` so the CPU finishes in
   seconds, at a decode batch and a prefill batch of tokens, for one activation scheme (``--scheme``,
   dynamic per-tensor by default) or all of them (``--all-schemes``);
3. for each layer: the GEMM's error against a float64 reference of the same lossy pipeline (G3:
   within ``4 K eps32 |sa sb| sum|terms|`` plus the final rounding), the FP8 error against the
   float64 product of the unquantized operands, the time per call, the quantization's share of it,
   GFLOP/s and GB/s, and the speedup over the GEMM a user would run instead, measured in the same
   run: numpy's float32 sgemm on the CPU; on the GPU cuBLAS's float16 GEMM (cupy's matmul, on
   tensor cores), with float16 activations and outputs for both.

``--device cuda`` runs it on the GPU (cupy arrays). There the table adds the host's cost per call
and the time per call replayed from a CUDA graph, and a header says what this GPU can run
(``vtnumba.cuda.capabilities()``). ``--plot roofline.png`` draws each layer under the measured
ceilings (copy bandwidth, BLAS peaks: on the GPU the float16 roof beside the FP8 one), ``--json``
prints one JSON object instead of tables. Expected errors (no GPU, a missing optional extra, a bad
argument, a scheme this vtnumba does not offer) print one line and exit 2; a failed check exits 1.
"""

import argparse
import inspect
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from vtnumba.cuda import gpu_unavailable_reason  # why --device cuda cannot run here
from vtnumba._format import MX_BLOCK
from vtnumba.timing import NOISY_SPREAD

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

# The activation schemes, in the order --all-schemes runs them. 'block': 1 x 128 activation groups
# and 128 x 128 weight blocks (DeepSeek-V3/R1, Qwen3-FP8), offered where the library has it.
# 'mxfp8': OCP MX, E8M0 scales per 1 x 32 on activations and weights (Blackwell, GB10).
SCHEMES = ("static", "dynamic", "per_token", "block", "mxfp8")
MODELS = ("llama3-8b", "qwen3-moe")
BLOCK_SIZE = (128, 128)


class UsageError(Exception):
    """An expected error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + message; one line is the contract here
        raise UsageError(message)


def plain_text(rest):
    """reStructuredText as a terminal shows it: ``literal`` -> literal (the docstrings feed --help)."""
    return rest.replace("``", "")


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _parser():
    p = _Parser(prog="python -m vtnumba", description=plain_text(__doc__.split("\n\n")[0]))
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--model", choices=MODELS, default="llama3-8b",
                   help="llama3-8b (default): the seven linear layers of a Llama-3-8B decoder block; qwen3-moe: "
                        "one FP8 mixture-of-experts layer of Qwen3-30B-A3B (128 experts, top-8)")
    p.add_argument("--reduce", type=_positive_int, default=None,
                   help="divide Llama-3-8B's N and K by this (default: 4 on the CPU, 1 on the GPU)")
    p.add_argument("--tokens", type=_positive_int, nargs="+", default=None, metavar="M",
                   help="token counts (GEMM M) to run (default: 16 256, a decode and a prefill batch)")
    p.add_argument("--repeats", type=_positive_int, default=None,
                   help="timed calls per measurement (median kept; default 5 on the CPU, 50 on the GPU)")
    schemes = p.add_mutually_exclusive_group()
    schemes.add_argument("--scheme", choices=SCHEMES, default=None,
                         help="activation scheme: static (calibrated per-tensor scale), dynamic (per-tensor, "
                              "the default), per_token (with per-channel weight scales), block (128-wide "
                              "activation groups, 128x128 weight blocks; where this vtnumba offers it), mxfp8 "
                              "(E8M0 scales per 1x32 on both operands)")
    schemes.add_argument("--all-schemes", action="store_true", help="run every scheme this vtnumba offers")
    p.add_argument("--plot", metavar="PATH", default=None,
                   help="write a roofline plot to PATH (.png, .pdf, .svg, ...: what matplotlib writes; "
                        "needs vtnumba[plot]); checked before the run starts")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (a bar on a terminal, one line per step otherwise)")
    p.add_argument("--skip-selfcheck", action="store_true", help="skip the quantization self-check")
    return p


# --------------------------------------------------------------------------- device and baseline

@dataclass(frozen=True)
class Baseline:
    """The GEMM a user of this device would run instead of the FP8 layer: ``label`` names it,
    ``column`` heads its column, ``dtype`` is the dtype of its operands (and of the FP8 layer's
    activations and outputs, so both read and write the same things)."""

    label: str
    column: str
    dtype: str


# On the CPU a numpy user multiplies float32. On the GPU nobody runs a model's linear layers in
# float32: the alternative to FP8 is half precision on tensor cores, and cupy's float16 matmul is
# that GEMM (cuBLAS; cupy has no bfloat16 matmul, and f16 and bf16 run at the same tensor-core rate).
BASELINES = {
    "cpu": Baseline("numpy float32 sgemm (x @ w.T, float32 weights)", "sgemm", "float32"),
    "cuda": Baseline("cuBLAS float16 GEMM (cupy x @ w.T, float16 weights, tensor cores)", "f16 GEMM", "float16"),
}


def baseline_for(device):
    """The Baseline the speedup of ``device`` ('cpu' or 'cuda') is measured against."""
    return BASELINES[device]


# Why a column has no number on the CPU: (short label for the table, the reason in full).
CPU_NOT_APPLICABLE = {
    "host_us": ("cpu", "on the CPU the host runs each call itself: its cost per call is the device column"),
    "graph_us": ("cpu", "CUDA graphs replay GPU work; the CPU has none to replay"),
    "baseline_host_us": ("cpu", "on the CPU the host runs each call itself: its cost per call is the device column"),
}
GPU_SPREAD_REASON = "CUDA events time all repeats as one interval: there is no per-call p90"


class _Device:
    """The array module and the baseline GEMM of one device."""

    def __init__(self, name):
        self.name = name
        self.baseline = baseline_for(name)
        self.dtype = np.dtype(self.baseline.dtype)
        if name == "cpu":
            self.xp = np
        else:
            import cupy
            self.xp = cupy

    def put(self, a):
        return a if self.xp is np else self.xp.asarray(a)

    def get(self, a):
        return a if isinstance(a, np.ndarray) else a.get()


# ---------------------------------------------------------------------------------------- schemes

def block_support_reason(quantize=None, from_float=None, reference=None):
    """None when this vtnumba offers the block-scaled scheme, else why not. It needs per-group
    activation quantization (``vt.quantize_fp8(x, group_size=...)``), block-scaled weights
    (``seam.Fp8Weight.from_float(w, block_size=...)``) and the block G3 reference the run holds the
    result to (``vtnumba.testing.reference.block_scaled_mm``); the arguments default to the
    library's own (tests pass others to check both answers)."""
    if quantize is None or from_float is None or reference is None:
        import vtnumba as vt
        from vtnumba import seam
        from vtnumba.testing import reference as reference_module

        quantize = quantize or vt.quantize_fp8
        from_float = from_float or seam.Fp8Weight.from_float
        reference = reference or reference_module
    missing = []
    if "group_size" not in inspect.signature(quantize).parameters:
        missing.append("vtnumba.quantize_fp8 takes no group_size (per-group activations)")
    if "block_size" not in inspect.signature(from_float).parameters:
        missing.append("seam.Fp8Weight.from_float takes no block_size (block-scaled weights)")
    if not hasattr(reference, "block_scaled_mm"):
        missing.append("vtnumba.testing.reference has no block_scaled_mm (the block G3 reference)")
    if missing:
        return "this vtnumba has no block-scaled FP8 path yet: " + "; ".join(missing)
    return None


def block_shape_reason(shapes, reduce):
    """None when every layer's K is a whole number of 128-wide blocks, else why not."""
    bk = BLOCK_SIZE[1]
    odd = [(name, k) for name, _, k in shapes if k % bk]
    if not odd:
        return None
    name, k = odd[0]
    return f"the block scheme needs K to be a multiple of {bk}; --reduce {reduce} gives K = {k} ({name})"


def mx_reason(shapes, reduce):
    """None when this vtnumba offers MXFP8 and every layer's K is whole 32-wide groups, else why not."""
    import vtnumba as vt

    if "scale_format" not in inspect.signature(vt.quantize_fp8).parameters:
        return "this vtnumba has no MXFP8 path yet: vtnumba.quantize_fp8 takes no scale_format"
    odd = [(name, k) for name, _, k in shapes if k % MX_BLOCK[1]]
    if odd:
        return f"the mxfp8 scheme needs K to be a multiple of 32; --reduce {reduce} gives K = {odd[0][1]} ({odd[0][0]})"
    return None


def choose_schemes(args, shapes, reduce):
    """(schemes to run, {scheme: why it is not run}) for these arguments."""
    reasons = {"block": lambda: block_support_reason() or block_shape_reason(shapes, reduce),
               "mxfp8": lambda: mx_reason(shapes, reduce)}
    if not args.all_schemes:
        scheme = args.scheme or "dynamic"
        if scheme in reasons:
            reason = reasons[scheme]()
            if reason:
                raise UsageError(f"--scheme {scheme} is not offered here: {reason}")
        return [scheme], {}
    skipped = {scheme: why for scheme, why in ((s, r()) for s, r in reasons.items()) if why}
    return [s for s in SCHEMES if s not in skipped], skipped


def make_weight(scheme, w, x):
    """``w`` [N, K] float32 as the Fp8Weight of ``scheme``; ``x`` calibrates the static scale."""
    from vtnumba import seam

    if scheme == "static":
        # a calibration pass over this batch: its amax / 448, as static checkpoints' input_scale is
        amax = float(np.max(np.abs(x.astype(np.float32))))
        return seam.Fp8Weight.from_float(w, input_scale=np.float32(max(amax, 1e-30) / 448.0))
    if scheme == "dynamic":
        return seam.Fp8Weight.from_float(w)
    if scheme == "per_token":
        return seam.Fp8Weight.from_float(w, per_channel=True, activation_scheme="per_token")
    if scheme == "mxfp8":
        return seam.Fp8Weight.from_float(w, block_size=MX_BLOCK, scale_format="e8m0")
    return seam.Fp8Weight.from_float(w, block_size=BLOCK_SIZE, activation_scheme="per_group")


def g3_reference(scheme, codes, scale, weight):
    """(float64 reference, G3 bound) of the GEMM of activation ``codes`` / ``scale`` (host arrays)
    with the host Fp8Weight ``weight``."""
    from vtnumba.testing import reference

    if scheme in ("block", "mxfp8"):  # E8M0 scales (uint8) are decoded by the reference itself
        return reference.block_scaled_mm(codes, weight.data, scale, weight.weight_scale,
                                         getattr(weight, "block_size", BLOCK_SIZE))
    return reference.scaled_mm(codes, weight.data, np.asarray(scale).reshape(-1),
                               np.asarray(weight.weight_scale).reshape(-1))


# --------------------------------------------------------------------------------------- progress

class Progress:
    """Progress on stderr: a one-line bar redrawn in place on a terminal; one line per step anywhere
    else (a log file or a pipe gets no carriage returns, and sees each step as it starts)."""

    def __init__(self, total, enabled=True, stream=None, width=24):
        self.stream = stream or sys.stderr
        self.total, self.done, self.width = total, 0, width
        self.enabled = enabled
        self.terminal = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()

    def begin(self, label):
        """Show ``label`` as running now, with the steps finished so far."""
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        if self.terminal:
            filled = self.width * self.done // max(self.total, 1)
            bar = "#" * filled + "-" * (self.width - filled)
            self.stream.write(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.1f}s {label:<28.28s}")
        else:
            self.stream.write(f"vtnumba: [{self.done + 1}/{self.total}] {elapsed:6.1f}s {label}\n")
        self.stream.flush()

    def end(self):
        self.done += 1

    def close(self):
        if self.enabled and self.terminal:
            self.stream.write("\r" + " " * (self.width + 50) + "\r")
            self.stream.flush()


# ------------------------------------------------------------------------------------------- jobs

def selfcheck(dev, rows=512, cols=4096, block=False, mx=False):
    """The quantization schemes on a random tensor, compared with the oracle byte for byte (the
    per-group one too when ``block``, the MXFP8 one when ``mx``)."""
    import vtnumba as vt
    from vtnumba.testing import reference

    x = (np.random.default_rng(2026).standard_normal((rows, cols), dtype=np.float32) * 3).astype(np.float32)
    xd = dev.put(x)
    cases = [("static scale 0.0092", dict(scale=0.0092), lambda: reference.quantize(x, scale=0.0092)),
             ("dynamic per-tensor", {}, lambda: reference.quantize(x)),
             ("dynamic per-token", dict(per_token=True), lambda: reference.quantize(x, per_token=True))]
    if block:
        group = BLOCK_SIZE[1]
        cases.append((f"dynamic per-group {group}", dict(group_size=group),
                      lambda: reference.quantize_per_group(x, group)))
    if mx:
        cases.append(("MXFP8 (E8M0 per 1x32, rceil)", dict(group_size=32, scale_format="e8m0"),
                      lambda: reference.quantize_mx(x, 32, "rceil")))
    results = []
    for label, kwargs, oracle in cases:
        q = vt.quantize_fp8(xd, **kwargs)
        ref = oracle()
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


def _kernel_label(dev, scheme, q, weight):
    """Which GEMM implementation the backend picks for this call (informational: 'auto' when the
    backend does not say)."""
    try:
        m, (n, k) = q.data.shape[0], weight.shape
        if dev.name == "cpu":
            from vtnumba.cpu import block, gemm, mx

            chooser = mx if scheme == "mxfp8" else block if scheme == "block" else gemm
            return chooser.choose_kernel(m, n, k)
        from vtnumba.cuda import gemm

        if scheme in ("block", "mxfp8"):
            from vtnumba.cuda import block

            return block.select(block.BlockCall(q.data, weight.data, q.scale, weight.weight_scale, weight.block_size,
                                                dev.dtype, weight.bias)).name

        call = gemm.GemmCall(q.data, weight.data, q.scale, weight.weight_scale, dev.dtype, weight.bias)
        return gemm.select(call).name
    except Exception:  # a backend without these hooks: the label is not worth failing the run for
        return "auto"


def layer_data(rng, m, n, k, dtype):
    """(x [M, K], w [N, K] float32): activations of unit variance with a few outlier channels, as
    real activations have (a realistic amax for the dynamic scales), in the device's activation
    dtype; a weight of nn.Linear's init scale (1/sqrt(K))."""
    x = rng.standard_normal((m, k), dtype=np.float32)
    x[:, rng.integers(0, k, size=max(1, k // 256))] *= 8
    w = (rng.standard_normal((n, k), dtype=np.float32) / np.float32(np.sqrt(k))).astype(np.float32)
    return x.astype(dtype), w


def _graph_us(dev, wd, xd, repeats, name):
    """(µs per call replayed from a CUDA graph, None) or (None, (label, reason))."""
    if dev.name == "cpu":
        return None, CPU_NOT_APPLICABLE["graph_us"]
    from vtnumba import profile

    try:
        rec = profile.profile_linear(wd, xd, name=name, repeats=repeats, method="graph")
    except Exception as exc:  # a path that cannot be captured: say so in the column, keep the run
        return None, ("capture failed", f"CUDA graph capture failed: {exc.__class__.__name__}: {exc}")
    return rec.time_s * 1e6, None


def run_layer(dev, scheme, name, x, w, repeats):
    """One layer in one scheme: accuracy against float64, then the FP8 layer's timings (device,
    host, graph, its quantization alone) and the baseline's. Returns (row, FP8 ProfileRecord)."""
    from vtnumba import profile, seam
    from vtnumba.testing import reference

    m, k = x.shape
    n = w.shape[0]
    weight = make_weight(scheme, w, x)
    xd = dev.put(x)
    wd = weight if dev.name == "cpu" else seam.ResidentFp8(weight, dev.name).weight
    w_base = dev.put(w.astype(dev.dtype))

    # G3 judges the GEMM alone: the reference takes the codes and scales this device's quantizer
    # made (the call matmul_fp8 makes; the self-check holds the quantizer to the oracle).
    y = dev.get(seam.matmul_fp8(xd, wd))
    qd = seam.quantize_activation(xd, wd)
    ref, bound = g3_reference(scheme, dev.get(qd.data), dev.get(qd.scale), weight)
    allowed = bound + reference.out_rounding(ref, y.dtype)
    g3 = float(np.max(np.abs(y.astype(np.float64) - ref) / allowed))
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    fp8_rel = float(np.linalg.norm(y.astype(np.float64) - exact) / np.linalg.norm(exact))

    fp8 = profile.profile_linear(wd, xd, name=name, repeats=repeats)
    graph_us, graph_why = _graph_us(dev, wd, xd, repeats, name)
    quant = profile.profile_op(lambda a: seam.quantize_activation(a, wd), xd, repeats=repeats,
                               name=f"{name} (quantize)")
    itemsize = dev.dtype.itemsize
    base = profile.profile_op(lambda a, b: a @ b.T, xd, w_base, repeats=repeats, name=f"{name} (baseline)",
                              flops=fp8.flops, bytes=float(itemsize * (m * k + n * k + m * n)), shape=fp8.shape)
    unavailable = {}
    if dev.name == "cpu":
        unavailable.update({key: dict(label=label, reason=why) for key, (label, why) in CPU_NOT_APPLICABLE.items()})
    else:
        unavailable["spread"] = dict(label="one interval", reason=GPU_SPREAD_REASON)
        if graph_why is not None:
            unavailable["graph_us"] = dict(label=graph_why[0], reason=graph_why[1])
    # The quantization is part of the layer, so its share comes from the least-disturbed call of each
    # (the minimums): two medians taken apart, on a loaded machine, gave shares above 100%.
    share = min(quant.min_s, fp8.min_s) / fp8.min_s
    row = dict(layer=name, scheme=scheme, m=m, n=n, k=k, kernel=_kernel_label(dev, scheme, qd, wd),
               device_us=fp8.time_s * 1e6,
               host_us=None if fp8.host_s is None else fp8.host_s * 1e6,
               graph_us=graph_us,
               quant_us=quant.time_s * 1e6, quant_share=share,
               device_min_us=fp8.min_s * 1e6, quant_min_us=quant.min_s * 1e6,
               spread=fp8.spread, baseline_spread=base.spread,
               noisy=bool(fp8.noisy or base.noisy or quant.noisy),
               gflops=fp8.gflops, gbytes_per_s=fp8.gbytes_per_s,
               baseline_us=base.time_s * 1e6,
               baseline_host_us=None if base.host_s is None else base.host_s * 1e6,
               speedup=base.time_s / fp8.time_s, g3_ratio=g3, g3_ok=bool(g3 <= 1.0), fp8_rel_error=fp8_rel,
               unavailable=unavailable)
    return row, fp8


# ---------------------------------------------------------------------------------------- output

def _us(v):
    return f"{v:.1f}"


# The layer table: (key, header, formatter of the row). A cell whose value is None shows
# "n/a (<label>)" from the row's ``unavailable`` entry, and the footer gives the reason in full.
def _columns(report):
    base = report["baseline"]["column"]
    return [
        ("layer", "layer", lambda r: r["layer"]),
        ("shape", "M x N x K", lambda r: f"{r['m']}x{r['n']}x{r['k']}"),
        ("path", "scheme, kernel", lambda r: f"{r['scheme']}, {r['kernel']}"),
        ("device_us", "device us", lambda r: _us(r["device_us"])),
        ("host_us", "host us", lambda r: _us(r["host_us"])),
        ("graph_us", "graph us", lambda r: _us(r["graph_us"])),
        ("spread", "p90/median", lambda r: f"{r['spread']:.1f}x" + ("!" if r["spread"] > NOISY_SPREAD else "")),
        ("quant_us", "quant us (share)", lambda r: f"{r['quant_us']:.1f} ({r['quant_share']:.0%})"),
        ("gflops", "GFLOP/s", lambda r: f"{r['gflops']:.1f}"),
        ("gbytes_per_s", "GB/s", lambda r: f"{r['gbytes_per_s']:.1f}"),
        ("baseline_us", f"{base} us", lambda r: _us(r["baseline_us"])),
        ("speedup", "speedup", lambda r: f"{r['speedup']:.2f}x" + ("!" if r.get("noisy") else "")),
        ("g3_ratio", "G3", lambda r: f"{r['g3_ratio']:.1e}"),
        ("fp8_rel_error", "fp8 err", lambda r: f"{r['fp8_rel_error']:.4f}"),
    ]


_TEXT_COLUMNS = ("layer", "path")  # left-aligned; the rest are numbers, right-aligned


def table_cells(report):
    """(headers, rows of cell strings) of the layer table; never an empty cell."""
    columns = _columns(report)
    rows = []
    for r in report["layers"]:
        cells = []
        for key, _, fmt in columns:
            if key in r and r[key] is None:
                why = r["unavailable"].get(key)
                cells.append(f"n/a ({why['label']})" if why else "n/a (no reason given)")
            else:
                cells.append(fmt(r))
        rows.append(cells)
    return [c[1] for c in columns], rows, [c[0] for c in columns]


def _print_tables(report, out, capabilities=None):
    p = lambda *a: print(*a, file=out)  # noqa: E731
    if report["selfcheck"]:
        p("vtnumba self-check: e4m3 quantization against the independent oracle (vtnumba.testing.reference)")
        for r in report["selfcheck"]:
            p(f"  {r['scheme']:22s} {r['values']:>9,d} values  {r['nonzero_codes']:>9,d} non-zero codes"
              f"  mismatches {r['mismatches']}")
        p()
    if capabilities is not None:
        p("GPU: " + str(capabilities))
        p()
    if report.get("cpu"):
        from vtnumba.cpu import paths

        p(paths.header_line(report["cpu"]))
        p()
    c = report["ceilings"]
    p(f"FP8 W8A8 linear path on {report['device']}: Llama-3-8B decoder layers, {report['reduction']}; "
      f"{report['activation_dtype']} activations and outputs")
    others = [f"{label} {value:.1f}" for label, value in (c.get("extra") or {}).items() if label != c["peak_label"]]
    p(f"measured ceilings: copy {c['copy_gbytes_per_s']:.1f} GB/s, {c['peak_label']} {c['peak_gflops']:.1f} GFLOP/s"
      + (f" (also {', '.join(others)})" if others else ""))
    p("G3 = max |y - ref64| / bound (<= 1 passes); fp8 err = ||y - x@w.T (float64, unquantized)|| / ||x@w.T||")
    heads, rows, keys = table_cells(report)
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(heads)]

    def line(cells):
        return " ".join(c.ljust(w) if key in _TEXT_COLUMNS else c.rjust(w)
                        for c, w, key in zip(cells, widths, keys)).rstrip()

    p(line(heads))
    p("-" * len(line(heads)))
    for row in rows:
        p(line(row))
    p(f"speedup = {report['baseline']['label']} time / FP8 layer time, same run, median of "
      f"{report['repeats']} calls")
    p("device us: the FP8 layer per call (activation quantization + FP8 GEMM), median; p90/median: its "
      "spread; quant: the quantization alone, median, and its share of the layer from the fastest call of each")
    several = len(report["schemes"]) > 1
    noisy = [f"{r['layer']} M={r['m']}" + (f" {r['scheme']}" if several else "") for r in report["layers"]
             if r.get("noisy")]
    if noisy:
        p(f"WARNING: noisy figures (p90 > {NOISY_SPREAD:.0f}x the median for the layer, its quantization or its "
          f"baseline; marked !): {', '.join(noisy)}. Another process was using the CPU: rerun on a quiet "
          f"machine before quoting them.")
    if report["device"] == "cuda":
        p("host us: the host's cost to enqueue one call; graph us: device time per call replayed from a "
          "CUDA graph")
    names = dict(zip(keys, heads))
    notes = {}  # each reason once, in the table's column order
    for r in report["layers"]:
        for key, why in r["unavailable"].items():
            if key in names:
                notes.setdefault((keys.index(key), key, why["label"], why["reason"]), None)
    for _, key, label, reason in sorted(notes):
        p(f"{names[key]} n/a ({label}): {reason}")
    for scheme, reason in report["skipped_schemes"].items():
        p(f"scheme {scheme} not run: {reason}")
    if report.get("plot"):
        p(f"roofline written to {report['plot']}")
    p("all checks passed" if report["ok"] else "CHECK FAILED: see mismatches / G3 above")


def check_plot_path(path):
    """--plot's file, checked before any work (a bad path found after minutes of measuring loses
    them): matplotlib is installed, the extension is a format it writes, the directory exists and
    is writable. Raises UsageError or MissingDependencyError (exit 2) with the fix."""
    from vtnumba import profile

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"--plot must name a file in an existing directory, got {path!r}: "
                         f"create {parent} first or pick another directory")
    if os.path.isdir(path):
        raise UsageError(f"--plot must name a file, got the directory {path!r}: add a file name, e.g. "
                         f"{os.path.join(path, 'roofline.png')}")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--plot must name a file in a directory you can write, got {path!r} "
                         f"({parent} is not writable): pick another directory")
    profile.require("matplotlib", "plot", "--plot")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if os.path.splitext(path)[1].lower().lstrip(".") not in formats:
        raise UsageError(f"--plot must end in a file type matplotlib writes ({', '.join('.' + f for f in formats)}), "
                         f"got {path!r}: name it e.g. roofline.png")


def run(args, out=None):
    out = out or sys.stdout  # looked up per call: pytest and notebooks swap sys.stdout
    if args.plot is not None:
        check_plot_path(args.plot)  # first: before the GPU check, the compiles and the measurements
    device = args.device
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        reason = gpu_unavailable_reason()
        if reason is not None:
            raise UsageError(f"--device cuda: {reason}")
    from vtnumba import profile
    if args.model == "qwen3-moe":
        from vtnumba import _moe_job

        reduce = args.reduce or 1
        if 2048 % reduce or 768 % reduce:
            raise UsageError(f"--reduce must divide Qwen3-30B-A3B's hidden 2048 and moe_intermediate 768, got {reduce}")
        try:
            report = _moe_job.run(args, out, device, args.tokens or ([1, 16] if device == "cpu" else [1, 16, 512]),
                                  args.repeats or (5 if device == "cpu" else 20), reduce)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.json:
            print(json.dumps(report, indent=2), file=out)
        return report
    reduce = args.reduce or (4 if device == "cpu" else 1)
    tokens = args.tokens or [16, 256]
    repeats = args.repeats or (5 if device == "cpu" else 50)
    shapes = list(layer_shapes(reduce))
    schemes, skipped = choose_schemes(args, shapes, reduce)
    dev = _Device(device)
    capabilities = None
    if device == "cuda":
        from vtnumba.cuda import capabilities as gpu_capabilities

        capabilities = gpu_capabilities()

    progress = Progress(len(shapes) * len(tokens) * len(schemes) + 2, enabled=not args.no_progress)
    progress.begin("quantization self-check")
    checks = [] if args.skip_selfcheck else selfcheck(dev, block="block" in schemes, mx="mxfp8" in schemes)
    progress.end()
    progress.begin("measuring ceilings")
    ceilings = profile.measure_ceilings(device)
    progress.end()
    rng = np.random.default_rng(8)
    rows, records = [], []
    try:
        for m in tokens:
            for name, n, k in shapes:
                x, w = layer_data(rng, m, n, k, dev.dtype)  # one input per layer, shared by the schemes
                for scheme in schemes:
                    progress.begin(f"{name} M={m} {scheme}")
                    row, fp8 = run_layer(dev, scheme, name, x, w, repeats)
                    rows.append(row)
                    label = f"{name} M={m}" + (f" {scheme}" if len(schemes) > 1 else "")
                    records.append(profile.ProfileRecord(label, fp8.device, fp8.method, fp8.time_s, fp8.min_s,
                                                         fp8.repeats, fp8.host_s, fp8.flops, fp8.bytes, fp8.shape))
                    progress.end()
    finally:
        progress.close()
    ok = all(r["mismatches"] == 0 for r in checks) and all(r["g3_ok"] for r in rows)
    reduction = (f"N and K divided by {reduce} (hidden {4096 // reduce}, intermediate {14336 // reduce}, "
                 f"kv {1024 // reduce})" if reduce > 1 else "full size")
    report = dict(device=device, reduction=reduction, reduce=reduce, tokens=tokens, repeats=repeats,
                  schemes=schemes, skipped_schemes=skipped, baseline=asdict(dev.baseline),
                  activation_dtype=str(dev.dtype), selfcheck=checks, ceilings=ceilings.as_dict(), layers=rows,
                  ok=ok, plot=None)
    if capabilities is not None:
        report["gpu_capabilities"] = capabilities.as_dict()
    if device == "cpu":
        from vtnumba.cpu import paths

        report["cpu"] = paths.describe()
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
        _print_tables(report, out, capabilities)
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
