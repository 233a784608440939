"""Time an op or a linear layer the way its device needs, and show the result in Jupyter.

    from vtnumba import profile, seam
    rec = profile.profile_linear(seam.Fp8Weight.from_float(w), x)    # one ProfileRecord
    res = profile.ProfileResults([rec, profile.profile_linear(w, x)])  # a table in Jupyter
    res.to_pandas(); res.roofline(profile.measure_ceilings("cpu"))

How each device is timed, and why:

- CPU: ``warmup`` calls first (the first call of a Numba kernel compiles it; the next ones warm the
  caches), then ``repeats`` calls each timed with ``time.perf_counter``; the record keeps the median
  (robust to a neighbour process stealing a core), the minimum and the 90th percentile, and calls
  itself ``noisy`` (its note says so) when the p90 is more than 3x the median.
- GPU (cupy arrays): two numbers, measured separately, because for an FP8 linear layer at decode the
  host's launch cost is larger than the GPU work (DEVICE.md):
  * device time, method "queued": a spin kernel is queued first, so the host has enqueued all
    ``repeats`` calls before the GPU reaches them; CUDA events around the calls then time the GPU
    alone. Method "graph": the calls are captured into a CUDA graph on a cupy stream and the graph is
    replayed between events (what a serving loop that uses graphs sees).
  * host cost: the wall time the host spends enqueueing one call (measured while the GPU is held by
    the spin kernel, so the host never waits on the GPU).

Records carry FLOPs and bytes when known, so GFLOP/s, GB/s and arithmetic intensity follow, and a
roofline plot puts each record under the machine's measured ceilings (copy bandwidth and a BLAS
peak, see ``measure_ceilings``). pandas and matplotlib are optional: ``to_pandas`` and the plots name
the extra to install when they are missing.
"""

import html
import math
import sys
from dataclasses import asdict, dataclass, field

import numpy as np

from .cuda import gpu_unavailable_reason
from .timing import NOISY_SPREAD, _device_of, _time_gpu, best_device_us, cpu_samples, cpu_time, device_us, host_us, p90

__all__ = [
    "MissingDependencyError",
    "gpu_unavailable_reason",
    "ProfileRecord",
    "ProfileResults",
    "Ceilings",
    "profile_op",
    "cpu_time",
    "device_us",
    "best_device_us",
    "host_us",
    "profile_linear",
    "ExpertsRecord",
    "profile_moe",
    "measure_ceilings",
    "roofline_plot",
]


def _byte_text(n):
    """A byte count in the unit that shows it (the small MoE example touches kilobytes, where a
    fixed MB printed "0.0 MB"): B, kB, MB or GB, three significant figures."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


class MissingDependencyError(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def require(module, extra, feature):
    """Import an optional dependency, or raise MissingDependencyError naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(
            f"{feature} needs {module.split('.')[0]}, which is not installed: pip install 'vtnumba[{extra}]'"
        ) from None


# ----------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ProfileRecord:
    """One timed op. ``time_s`` is the median time per call (GPU: device time); ``host_s`` is the
    host's cost per call on the GPU (None on the CPU, where the two are the same thing)."""

    name: str
    device: str
    method: str
    time_s: float
    min_s: float
    repeats: int
    host_s: float | None = None
    flops: float | None = None
    bytes: float | None = None
    shape: str = ""
    note: str = ""
    p90_s: float | None = None  # the CPU's 90th percentile per call (None on the GPU: one timed interval)

    @property
    def spread(self):
        """p90 / median of the timed calls (None where the calls were timed as one interval)."""
        return None if self.p90_s is None else self.p90_s / self.time_s

    @property
    def noisy(self):
        """Whether the calls' p90 was more than NOISY_SPREAD times their median (another process on
        the cores, most likely): the median is then a figure to rerun, not to quote."""
        return self.spread is not None and self.spread > NOISY_SPREAD

    @property
    def gflops(self):
        return None if self.flops is None else self.flops / self.time_s / 1e9

    @property
    def gbytes_per_s(self):
        return None if self.bytes is None else self.bytes / self.time_s / 1e9

    @property
    def intensity(self):
        """FLOPs per byte moved (the roofline's x axis)."""
        if self.flops is None or not self.bytes:
            return None
        return self.flops / self.bytes

    def as_dict(self):
        d = asdict(self)
        d.update(
            gflops=self.gflops,
            gbytes_per_s=self.gbytes_per_s,
            intensity=self.intensity,
            spread=self.spread,
            noisy=self.noisy,
        )
        return d

    def _repr_html_(self):
        return ProfileResults([self])._repr_html_()

    def __str__(self):
        return ProfileResults([self]).table()


_COLUMNS = [  # (header, how to read it from a record, format)
    ("name", lambda r: r.name, "{}"),
    ("shape", lambda r: r.shape, "{}"),
    ("device", lambda r: r.device, "{}"),
    ("method", lambda r: r.method, "{}"),
    ("time (us)", lambda r: r.time_s * 1e6, "{:.1f}"),
    ("min (us)", lambda r: r.min_s * 1e6, "{:.1f}"),
    ("p90 (us)", lambda r: None if r.p90_s is None else r.p90_s * 1e6, "{:.1f}"),
    ("host (us)", lambda r: None if r.host_s is None else r.host_s * 1e6, "{:.1f}"),
    ("GFLOP/s", lambda r: r.gflops, "{:.1f}"),
    ("GB/s", lambda r: r.gbytes_per_s, "{:.1f}"),
    ("FLOP/B", lambda r: r.intensity, "{:.2f}"),
    ("repeats", lambda r: r.repeats, "{}"),
    ("note", lambda r: r.note, "{}"),
]


def _cell(value, fmt):
    return "" if value is None or value == "" else fmt.format(value)


class ProfileResults(list):
    """A list of ProfileRecord that shows as a table (text, HTML in Jupyter, a pandas DataFrame)."""

    def _rows(self):
        cols = [c for c in _COLUMNS if any(c[1](r) not in (None, "") for r in self)]
        return cols, [[_cell(c[1](r), c[2]) for c in cols] for r in self]

    def table(self):
        cols, rows = self._rows()
        heads = [c[0] for c in cols]
        widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(heads)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
        return "\n".join(lines)

    __str__ = table

    def _repr_html_(self):
        cols, rows = self._rows()
        head = "".join(f"<th>{html.escape(c[0])}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def to_pandas(self):
        """The records as a pandas DataFrame, one row each, derived rates included."""
        pd = require("pandas", "pandas", "ProfileResults.to_pandas()")
        return pd.DataFrame([r.as_dict() for r in self])

    def roofline(self, ceilings, path=None, ax=None, title=None):
        """Plot the records under ``ceilings`` (see ``roofline_plot``)."""
        return roofline_plot(self, ceilings, path=path, ax=ax, title=title)


def profile_op(
    fn,
    *args,
    name=None,
    flops=None,
    bytes=None,
    shape="",
    device=None,
    repeats=None,
    warmup=3,
    method="queued",
    **kwargs,
):
    """Time ``fn(*args, **kwargs)`` on the device its array arguments live on.

    ``flops`` / ``bytes`` (per call) give the record its rates; ``method`` picks the GPU timing
    ("queued" or "graph", see the module docstring; ignored on the CPU). Returns a ProfileRecord.
    """
    if method not in ("queued", "graph"):
        raise ValueError(f"method must be 'queued' or 'graph', got {method!r}")
    if not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup must be an int >= 1 (the first call may compile), got {warmup!r}")
    device = device or _device_of(list(args) + list(kwargs.values()))
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if repeats is None:
        repeats = 20 if device == "cpu" else 100
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")

    def call():
        return fn(*args, **kwargs)

    name = name or getattr(fn, "__name__", repr(fn))
    if device == "cpu":
        times = cpu_samples(call, repeats, warmup)
        median = float(np.median(times))
        spread = p90(times) / median
        note = f"noisy: p90 {spread:.1f}x the median" if spread > NOISY_SPREAD else ""
        return ProfileRecord(
            name,
            "cpu",
            "median of repeats",
            median,
            min(times),
            repeats,
            flops=flops,
            bytes=bytes,
            shape=shape,
            note=note,
            p90_s=p90(times),
        )
    median, best, host, note = _time_gpu(call, repeats, warmup, method)
    return ProfileRecord(
        name, "cuda", method, median, best, repeats, host_s=host, flops=flops, bytes=bytes, shape=shape, note=note
    )


def linear_cost(m, n, k, x_itemsize, w_itemsize, y_itemsize):
    """(FLOPs, bytes) of one y[M, N] = x[M, K] @ w[N, K].T: each operand read once, y written once
    (the lower bound a kernel can reach; the roofline's model of the layer)."""
    return 2.0 * m * n * k, float(m * k * x_itemsize + n * k * w_itemsize + m * n * y_itemsize)


def _weight_geometry(method):
    """((N, K), bytes per weight element the method reads) of a linear method's weight."""
    from . import seam

    w = getattr(method, "weight", None)
    if isinstance(w, seam.ResidentFp8):
        w = w.weight
    if isinstance(w, seam.Fp8Weight):
        return w.shape, 1
    if isinstance(method, seam.UnquantizedLinearMethod):
        return method.shape, 4  # it multiplies a float32 copy of the weight
    if hasattr(w, "shape") and hasattr(w, "dtype") and len(w.shape) == 2:
        return tuple(int(d) for d in w.shape), np.dtype(w.dtype).itemsize
    raise TypeError(
        f"layer must be an Fp8Weight, a float weight [N, K] or a linear method with a "
        f"'weight' of shape [N, K], got {type(method).__name__}"
    )


def profile_linear(layer, x, *, out_dtype=None, name=None, **options):
    """Time a linear layer on ``x`` [M, K]: ``layer`` is a seam.Fp8Weight, a float weight [N, K]
    (the unquantized float32 path) or a linear method (anything with ``apply``). The FP8 path
    includes the activation's quantization, as a model's call does. ``options`` go to profile_op."""
    from . import seam

    method = layer if hasattr(layer, "apply") else seam.make_linear_method(layer)
    (n, k), w_itemsize = _weight_geometry(method)
    if len(x.shape) != 2 or x.shape[1] != k:
        raise ValueError(f"x must have shape (M, {k}) to match the weight's K, got shape {tuple(x.shape)}")
    m = x.shape[0]
    y = method.apply(x, out_dtype=out_dtype)  # one call outside timing gives the out dtype
    flops, moved = linear_cost(m, n, k, np.dtype(x.dtype).itemsize, w_itemsize, np.dtype(y.dtype).itemsize)
    label = name or getattr(method, "name", type(method).__name__)
    return profile_op(
        method.apply, x, name=label, flops=flops, bytes=moved, shape=f"{m}x{n}x{k}", out_dtype=out_dtype, **options
    )


@dataclass(frozen=True)
class ExpertsRecord:
    """One ``seam.moe_fp8`` call, profiled: the routing (rows per expert, how many experts were hit
    and the FP8 weight bytes they hold, which a decode step must read), the whole layer's time and
    each step's (align, quantize, gate_up GEMM, act_quantize, down GEMM, combine), timed apart."""

    name: str
    device: str
    rows_per_expert: tuple
    experts_hit: int
    expert_bytes: int
    total: ProfileRecord
    steps: ProfileResults

    def as_dict(self):
        return dict(
            name=self.name,
            device=self.device,
            rows_per_expert=list(self.rows_per_expert),
            experts_hit=self.experts_hit,
            expert_bytes=self.expert_bytes,
            total=self.total.as_dict(),
            steps=[r.as_dict() for r in self.steps],
        )

    def table(self):
        rows = np.asarray(self.rows_per_expert)
        hit = rows[rows > 0]
        head = (
            f"{self.name} on {self.device}: {self.experts_hit} of {len(rows)} experts hit, rows per hit expert "
            f"{int(hit.min()) if hit.size else 0}..{int(hit.max()) if hit.size else 0}, "
            f"{_byte_text(self.expert_bytes)} of FP8 expert weights touched"
        )
        return head + "\n" + ProfileResults([self.total] + list(self.steps)).table()

    __str__ = table

    def _repr_html_(self):
        return (
            f"<p>{html.escape(self.table().splitlines()[0])}</p>"
            + ProfileResults([self.total] + list(self.steps))._repr_html_()
        )


def profile_moe(x, gate_up, down, topk_ids, topk_weights, *, name="moe_fp8", **options):
    """Profile one ``seam.moe_fp8(x, gate_up, down, topk_ids, topk_weights)``: an ExpertsRecord with
    the rows each expert received, the expert bytes touched, the layer's time and each step's
    (``options`` go to profile_op). Reading the row counts back synchronizes once, outside timing."""
    from .seam.experts import MoeCall

    call = MoeCall(x, gate_up, down, topk_ids, topk_weights)
    call.run()  # fills every step's inputs, so each step can be timed alone
    offsets = call.state.get("offsets")
    experts = call.gate_up.shape[0]
    if offsets is None:  # the routed decode has no align step: the pairs per expert, from the ids
        ids = np.asarray(topk_ids.get() if hasattr(topk_ids, "get") else topk_ids, dtype=np.int64).reshape(-1)
        rows = tuple(int(r) for r in np.bincount(ids[(ids >= 0) & (ids < experts)], minlength=experts))
    else:
        offsets = np.asarray(offsets if isinstance(offsets, np.ndarray) else offsets.get(), dtype=np.int64)
        rows = tuple(int(r) for r in np.diff(offsets))
    hit = sum(1 for r in rows if r)
    per_expert = (
        int(call.gate_up.data[0].nbytes)
        + int(call.down.data[0].nbytes)
        + (int(call.gate_up.weight_scale.nbytes) + int(call.down.weight_scale.nbytes)) // len(rows)
    )
    device = "cpu" if call.device == "cpu" else "cuda"
    total = profile_op(
        lambda: MoeCall(x, gate_up, down, topk_ids, topk_weights).run(),
        name=name,
        bytes=float(hit * per_expert),
        device=device,
        **options,
    )
    steps = ProfileResults(profile_op(step, name=f"  {label}", device=device, **options) for label, step in call.steps)
    return ExpertsRecord(name, device, rows, hit, hit * per_expert, total, steps)


# ----------------------------------------------------------------------------- ceilings, roofline


@dataclass(frozen=True)
class Ceilings:
    """A machine's measured limits: copy bandwidth (GB/s, bytes read + written) and a compute peak
    (GFLOP/s) with what reached it."""

    device: str
    copy_gbytes_per_s: float
    peak_gflops: float
    peak_label: str
    extra: dict = field(default_factory=dict)  # other measured peaks, label -> GFLOP/s

    def as_dict(self):
        return asdict(self)


def measure_ceilings(device="cpu", size_mb=64, gemm_n=None, repeats=5):
    """Measure the copy bandwidth and the BLAS peak of ``device`` now, in this process.

    CPU: numpy copyto of a ``size_mb`` MB float32 array; float32 sgemm (numpy's BLAS) on
    gemm_n^3 (1024 by default). GPU: a cupy device copy; cuBLAS sgemm and hgemm through cupy and
    vtnumba's FP8 scaled_mm (cuBLASLt at this size), gemm_n^3 (8192 by default); the peak is the
    highest of them, all of them are in ``extra``."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and gpu_unavailable_reason() is not None:
        raise RuntimeError(f"measure_ceilings('cuda') needs a usable GPU: {gpu_unavailable_reason()}")
    count = size_mb * (1 << 20) // 4
    if device == "cpu":
        src = np.random.default_rng(0).standard_normal(count, dtype=np.float32)
        dst = np.empty_like(src)
        copy_t, _ = cpu_time(lambda: np.copyto(dst, src), repeats, 1)
        n = gemm_n or 1024
        a = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
        b = np.random.default_rng(2).standard_normal((n, n), dtype=np.float32)
        gemm_t, _ = cpu_time(lambda: a @ b, repeats, 1)
        return Ceilings("cpu", 2 * src.nbytes / copy_t / 1e9, 2.0 * n**3 / gemm_t / 1e9, f"numpy sgemm {n}^3")
    import cupy as cp

    src = cp.random.standard_normal(count, dtype=cp.float32)
    dst = cp.empty_like(src)
    copy_rec = profile_op(cp.copyto, dst, src, repeats=20, device="cuda")
    n = gemm_n or 8192
    peaks = {}
    for label, dt in (("cuBLAS sgemm", cp.float32), ("cuBLAS hgemm (f16)", cp.float16)):
        a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(dt)
        b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(dt)
        rec = profile_op(cp.matmul, a, b, repeats=10, device="cuda")
        peaks[f"{label} {n}^3"] = 2.0 * n**3 / rec.time_s / 1e9
    try:  # the FP8 GEMM's own peak (cuBLASLt for this shape): FP8 layers can run above hgemm's
        from . import ops

        codes = cp.random.randint(0, 0x7E, size=(n, n), dtype=cp.uint8)  # finite e4m3 codes
        rec = profile_op(
            ops.scaled_mm, codes, codes, np.float32(1), np.float32(1), out_dtype="bfloat16", repeats=10, device="cuda"
        )
        peaks[f"vtnumba scaled_mm FP8 {n}^3"] = 2.0 * n**3 / rec.time_s / 1e9
    except Exception as exc:  # a GPU without FP8 (before sm_89) still has the other ceilings
        peaks[f"vtnumba scaled_mm FP8 unavailable ({exc.__class__.__name__})"] = 0.0
    best = max(peaks, key=peaks.get)
    return Ceilings("cuda", 2 * src.nbytes / copy_rec.time_s / 1e9, peaks[best], best, peaks)


def _show_figures_in_ipython(figure_type):
    """In an IPython kernel, show a returned matplotlib Figure as a PNG. The figures here are made
    without pyplot (so scripts and servers need no GUI backend and keep no global figure list), and
    IPython renders a Figure only once pyplot's inline backend has registered this formatter."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None:
        return
    from IPython.core.pylabtools import print_figure

    png = shell.display_formatter.formatters["image/png"]
    if figure_type not in png.type_printers:  # pyplot's inline backend may have registered one already
        png.for_type(figure_type, lambda fig: print_figure(fig, "png", bbox_inches="tight"))


def roofline_plot(records, ceilings, path=None, ax=None, title=None):
    """A log-log roofline: each record with FLOPs and bytes at (FLOP/B, GFLOP/s) under
    min(peak, intensity * copy bandwidth), and each other measured peak of ``ceilings.extra`` (on
    the GPU: cuBLAS f16 and sgemm beside the FP8 one) as a dashed roof of its own. Saves to
    ``path`` when given; returns the Figure."""
    require("matplotlib", "plot", "the roofline plot")
    from matplotlib.figure import Figure  # no pyplot: works headless and inside Jupyter alike
    from matplotlib.transforms import Bbox

    points = [r for r in records if r.intensity is not None]
    if not points:
        raise ValueError("records must include at least one record with flops and bytes, got none")
    if ax is None:
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    bw, peak = ceilings.copy_gbytes_per_s, ceilings.peak_gflops
    others = {
        label: value for label, value in (ceilings.extra or {}).items() if label != ceilings.peak_label and value > 0
    }  # 0: a peak that could not be measured
    ridges = [value / bw for value in [peak, *others.values()]]
    xs = [p.intensity for p in points]
    lo, hi = min(xs + ridges) / 4, max(xs + ridges) * 4
    grid = np.logspace(math.log10(lo), math.log10(hi), 200)
    ax.loglog(grid, np.minimum(peak, grid * bw), color="black", lw=1.5)
    ax.annotate(f"copy {bw:.0f} GB/s", (grid[0], grid[0] * bw), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax.annotate(
        f"{ceilings.peak_label}: {peak:.0f} GFLOP/s",
        (hi, peak),
        textcoords="offset points",
        xytext=(-4, 4),
        ha="right",
        fontsize=8,
    )
    for label, value in others.items():
        ax.loglog(grid, np.minimum(value, grid * bw), color="gray", lw=1.0, ls="--")
        ax.annotate(
            f"{label}: {value:.0f} GFLOP/s",
            (hi, value),
            textcoords="offset points",
            xytext=(-4, 4),
            ha="right",
            fontsize=8,
            color="dimgray",
        )
    labels = []
    for p in points:
        dot = ax.scatter([p.intensity], [p.gflops], s=24, zorder=3)
        # in its point's colour: a label moved off a crowded point (below) still says whose it is
        labels.append(
            ax.annotate(
                p.name,
                (p.intensity, p.gflops),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize=7,
                color=dot.get_facecolor()[0],
            )
        )
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title or f"roofline, {ceilings.device} (measured ceilings)")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    # Layers of one shape land on one point (k_proj and v_proj, q_proj and o_proj; at M = 256 all seven
    # crowd near the peak): each label takes the first slot, right of its point then left, stepping
    # below and above it, that covers no other label, no point and no roof's label.
    fig.draw_without_rendering()  # lays the figure out, so each box is where it will be drawn
    taken = [t.get_window_extent() for t in ax.texts if t not in labels]
    for dot in ax.collections:
        x, y = ax.transData.transform(dot.get_offsets()[0])
        taken.append(Bbox.from_extents(x - 3, y - 3, x + 3, y + 3))
    steps = [(i + 1) // 2 * (1 if i % 2 else -1) for i in range(2 * len(labels) + 1)]  # 0, +1, -1, +2, ...
    for label in labels:
        for step, side in ((step, side) for step in steps for side in ("left", "right")):
            label.set_horizontalalignment(side)  # text left-aligned sits right of the point
            label.xyann = (4 if side == "left" else -4, -10 - 9 * step)
            box = label.get_window_extent()
            if not any(box.overlaps(other) for other in taken):
                break
        taken.append(box)
    if path is not None:
        fig.savefig(path, dpi=120)
    _show_figures_in_ipython(Figure)
    return fig
