"""``python -m vtnumba`` (or ``vtnumba``): see the FP8 W8A8 linear path work, with no download.

The default job, on the CPU:

1. a quantization self-check: the activation schemes against the independent oracle in
   ``vtnumba.testing.reference``, byte for byte;
2. the FP8 W8A8 linear path (``seam.matmul_fp8``: quantize the activation, then the FP8 GEMM) over
   the seven linear layers of one Llama-3-8B decoder block (q/k/v/o, gate/up/down: hidden 4096,
   intermediate 14336, kv 1024) at three token counts: decode (M = 1 and 16) at the real shapes, and
   a prefill batch (M = 256) with N and K divided by 4 on the CPU so it finishes in seconds
   (``--reduce`` divides every M's shapes instead), for one activation scheme (``--scheme``, dynamic
   per-tensor by default) or all of them (``--all-schemes``);
3. for each layer: the GEMM's error against a float64 reference of the same lossy pipeline (G3:
   within ``4 K eps32 |sa sb| sum|terms|`` plus the final rounding), the FP8 error against the
   float64 product of the unquantized operands, the time per call, the quantization's share of it,
   GFLOP/s and GB/s, and the speedup over the GEMM a user would run instead, measured in the same
   run: numpy's float32 sgemm on the CPU; on the GPU cuBLAS's float16 GEMM (cupy's matmul, on
   tensor cores), with float16 activations and outputs for both. On the CPU the FP8 layer, its
   quantization and the baseline are timed in turn, trial after trial, and the fastest trial of each
   is kept; a row whose trials spread wide, whose FP8 layer or baseline ran far slower than the
   ceilings of the run allow (measured at its start, raised to the best rate any of its calls
   reached), or whose kept trial waited for a CPU while other processes held the cores, is marked
   noisy (!). The footer says in which regime FP8 wins and why.

``--device cuda`` runs it on the GPU (cupy arrays). There the table adds the host's cost per call
and the time per call replayed from a CUDA graph, and a header says what this GPU can run
(``vtnumba.cuda.capabilities()``). ``--plot roofline.png`` draws each layer under the measured
ceilings (copy bandwidth, BLAS peaks: on the GPU the float16 roof beside the FP8 one), ``--json``
prints one JSON object instead of tables. Expected errors (no GPU, a missing optional extra, a bad
argument, a scheme this vtnumba does not offer) print one line and exit 2; a failed check exits 1.
"""

import argparse
import dataclasses
import inspect
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from vtnumba._format import MX_BLOCK
from vtnumba._moe_job import verdict_text  # one wording for both jobs' footers
from vtnumba.cuda import gpu_unavailable_reason  # why --device cuda cannot run here
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

# The token counts (GEMM M) of the default job: decode, one token and a small batch of them, and a
# prefill batch. Up to DECODE_MAX_M tokens a layer is decode: its weight is the traffic, so it runs at
# Llama-3-8B's real shapes, whose float32 weights (16-235 MB) do not fit in cache as they do not in a
# model; divided by 4 they would (1-15 MB), and sgemm would read them from cache, hiding the byte
# saving FP8 is for. Prefill is flops: on the CPU it runs at N and K / CPU_PREFILL_REDUCE (the same
# GEMM rates, a sixteenth of the work), so the default job stays near a minute on two cores.
DEFAULT_TOKENS = (1, 16, 256)
# The MoE job's (--model qwen3-moe) token counts: decode on the CPU (its prefill runs minutes there);
# decode and a prefill batch on the GPU
MOE_CPU_TOKENS = (1, 16)
MOE_GPU_TOKENS = (1, 16, 512)
DECODE_MAX_M = 16
CPU_PREFILL_REDUCE = 4

# A row is also noisy when one side's fastest trial took far longer than the ceilings of this run
# allow its work: SLOW_FACTOR times its roof time, max(flops / BLAS peak, bytes / copy bandwidth),
# plus CALL_FLOOR_S, what any call costs however small (numpy's dispatch; the FP8 path's checks and
# its two kernel calls, 40-60 us; waking threads). This catches what the spread cannot: a side slow on
# every trial (sgemm at 1.4 GFLOP/s against a 190 GFLOP/s peak on a loaded 2-core machine, 24 ms
# where 0.5 ms is usual, 130x its roof time: its p90 / median was 1.1). On a quiet 2-core EPYC the
# fastest trial stayed within 3.2x of its roof time at every shape of the default job (sgemm at M =
# 16 and the real shapes, the worst: small-M sgemm is far from the BLAS peak), the FP8 layer's within
# 2.7x; the floor covers --reduce 32's tiny shapes, where a call is mostly its fixed cost.
#
# The ceilings are those measured at the start of the run, each raised to the best rate any call of
# the run reached (``run_ceilings``), and every row is judged once all have run. Measured once, under
# load, the ceilings alone were no yardstick: beside a busy process one run measured copy 5.9 GB/s
# and sgemm 23.8 GFLOP/s while its own sgemm calls reached 35 GB/s and 165 GFLOP/s, so an sgemm of
# 14.5 ms at 1 x 1024 x 4096 (30x what the run's best rates allow) passed as a 32x speedup that read
# 0.76x in the next run. A call that ran proves the machine can run that fast.
SLOW_FACTOR = 8.0
CALL_FLOOR_S = 200e-6

# A row is also noisy when the kept (fastest) trial of its FP8 layer or its baseline waited for a CPU:
# its threads, ready to run, spent more than WAIT_SHARE of that time waiting (and more than
# WAIT_FLOOR_S in all) while other processes held the cores (timing.runqueue_seconds; Linux). The
# two rules above see a side's time only, and sustained load slows every trial alike and every rate
# the run reaches: at a load average of 7 on two cores, two runs a minute apart read q_proj M = 1 as
# 10.11x and 0.79x, both inside the spread and ceiling rules (sgemm at 19 ms where the same run's best
# rates allowed 6.6), where the waiting names them. A call alone on its cores waits hardly at all; a
# single-threaded call that waited a quarter of its time took a third longer, and OpenBLAS's threads,
# which meet at barriers, lose more. The floor keeps a thread pool's wake-up on a tiny call out of it.
WAIT_SHARE = 0.25
WAIT_FLOOR_S = 200e-6


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
    p.add_argument(
        "--model",
        choices=MODELS,
        default="llama3-8b",
        help="llama3-8b (default): the seven linear layers of a Llama-3-8B decoder block; qwen3-moe: "
        "one FP8 mixture-of-experts layer of Qwen3-30B-A3B (128 experts, top-8)",
    )
    p.add_argument(
        "--reduce",
        type=_positive_int,
        default=None,
        help="divide the shapes by this at every token count: Llama-3-8B's N and K (default: on "
        f"the CPU the real shapes up to M = {DECODE_MAX_M}, decode, and N and K / {CPU_PREFILL_REDUCE} "
        "above, prefill; on the GPU the real shapes); with --model qwen3-moe, its hidden 2048 and "
        "moe_intermediate 768 (default 1: the real shapes; the 128 experts and top-8 stay)",
    )
    p.add_argument(
        "--tokens",
        type=_positive_int,
        nargs="+",
        default=None,
        metavar="M",
        help="token counts (GEMM M) to run (default: "
        + " ".join(map(str, DEFAULT_TOKENS))
        + ", decode and a prefill batch); with --model qwen3-moe, tokens through the MoE layer "
        "(default: "
        + " ".join(map(str, MOE_CPU_TOKENS))
        + " on the CPU, "
        + " ".join(map(str, MOE_GPU_TOKENS))
        + " on the GPU)",
    )
    p.add_argument(
        "--repeats",
        type=_positive_int,
        default=None,
        help="timed trials per measurement (CPU: of the FP8 layer and its baseline in turn, the "
        "fastest kept, default 5; GPU: calls, the median kept, default 50)",
    )
    schemes = p.add_mutually_exclusive_group()
    schemes.add_argument(
        "--scheme",
        choices=SCHEMES,
        default=None,
        help="activation scheme: static (calibrated per-tensor scale), dynamic (per-tensor, "
        "the default), per_token (with per-channel weight scales), block (128-wide "
        "activation groups, 128x128 weight blocks; where this vtnumba offers it), mxfp8 "
        "(E8M0 scales per 1x32 on both operands)",
    )
    schemes.add_argument(
        "--all-schemes",
        action="store_true",
        help="run every scheme this vtnumba offers (with --model qwen3-moe: per_token, dynamic, block, mxfp8)",
    )
    p.add_argument(
        "--plot",
        metavar="PATH",
        default=None,
        help="write a roofline plot to PATH (.png, .pdf, .svg, ...: what matplotlib writes; "
        "needs vtnumba[plot]); checked before the run starts",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (a bar on a terminal, one line per step otherwise)",
    )
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
    reasons = {
        "block": lambda: block_support_reason() or block_shape_reason(shapes, reduce),
        "mxfp8": lambda: mx_reason(shapes, reduce),
    }
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


# The block-scaled GEMMs that accumulate each K-block on Hopper's tensor cores: held to G3 per block
# plus the tensor-core allowance, as tests/test_block_gpu.py holds them (strict G3 failed cuBLASLt's
# k_proj at 1.1 on the H200).
TENSOR_CORE_BLOCK_KERNELS = ("cublaslt_block", "wgmma_block")


def g3_reference(scheme, codes, scale, weight, kernel=None):
    """(float64 reference, G3 bound) of the GEMM of activation ``codes`` / ``scale`` (host arrays)
    with the host Fp8Weight ``weight``; ``kernel``: the GPU kernel that ran it (a block-scaled one
    that accumulates on tensor cores gets their allowance)."""
    from vtnumba.testing import reference

    if scheme in ("block", "mxfp8"):  # E8M0 scales (uint8) are decoded by the reference itself
        block = getattr(weight, "block_size", BLOCK_SIZE)
        ref, bound = reference.block_scaled_mm(codes, weight.data, scale, weight.weight_scale, block)
        if kernel in TENSOR_CORE_BLOCK_KERNELS:
            bound = bound + reference.block_tensor_core_allowance(codes, weight.data, scale, weight.weight_scale, block)
        return ref, bound
    return scaled_mm_reference(
        codes, weight.data, np.asarray(scale).reshape(-1), np.asarray(weight.weight_scale).reshape(-1)
    )


_DECODE64 = []  # the oracle's float64 value of each of the 256 codes, built at first use


def decode64(codes):
    """``reference.decode(codes)`` by a table of the oracle's own 256 values: the same float64s (NaN
    for 0x7F / 0xFF included) in one pass. The oracle's element-wise decode took 4 s for one
    full-size gate_proj weight, most of a decode job's time."""
    from vtnumba.testing import reference

    if not _DECODE64:
        _DECODE64.append(reference.decode(np.arange(256, dtype=np.uint8)))
    return np.take(_DECODE64[0], np.asarray(codes).view(np.uint8))


def scaled_mm_reference(a, b, scale_a, scale_b):
    """``reference.scaled_mm(a, b, scale_a, scale_b)`` (float64 reference, G3 bound), its formula
    term for term, with the codes decoded by ``decode64`` (tests hold the two equal bitwise)."""
    from vtnumba.testing.reference import EPS32

    da, db = decode64(a), decode64(b)
    k = da.shape[1]
    sa = np.asarray(scale_a, dtype=np.float64).reshape(-1, 1) if np.ndim(scale_a) else float(scale_a)
    sb = np.asarray(scale_b, dtype=np.float64).reshape(1, -1) if np.ndim(scale_b) else float(scale_b)
    acc = da @ db.T
    np.abs(db, out=db)  # in place: a full-size weight's float64 copy is 470 MB
    absacc = np.abs(da) @ db.T
    return acc * sa * sb, 4.0 * k * EPS32 * np.abs(sa * sb) * absacc


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
    cases = [
        ("static scale 0.0092", dict(scale=0.0092), lambda: reference.quantize(x, scale=0.0092)),
        ("dynamic per-tensor", {}, lambda: reference.quantize(x)),
        ("dynamic per-token", dict(per_token=True), lambda: reference.quantize(x, per_token=True)),
    ]
    if block:
        group = BLOCK_SIZE[1]
        cases.append(
            (f"dynamic per-group {group}", dict(group_size=group), lambda: reference.quantize_per_group(x, group))
        )
    if mx:
        cases.append(
            (
                "MXFP8 (E8M0 per 1x32, rceil)",
                dict(group_size=32, scale_format="e8m0"),
                lambda: reference.quantize_mx(x, 32, "rceil"),
            )
        )
    results = []
    for label, kwargs, oracle in cases:
        q = vt.quantize_fp8(xd, **kwargs)
        ref = oracle()
        data, scale = dev.get(q.data), dev.get(q.scale).reshape(ref.scale.shape)
        mismatches = int(np.count_nonzero(data != ref.data)) + int(np.count_nonzero(scale != ref.scale))
        results.append(
            dict(scheme=label, values=int(x.size), nonzero_codes=int(np.count_nonzero(ref.data)), mismatches=mismatches)
        )
    return results


def layer_shapes(reduce):
    for name, n, k in LLAMA3_8B_LAYERS:
        if n % reduce or k % reduce:
            raise UsageError(f"--reduce must divide every Llama-3-8B dimension (4096, 1024, 14336), got {reduce}")
        yield name, n // reduce, k // reduce


def job_plan(device, tokens=None, reduce=None):
    """[(M, reduce)]: each token count of the job with the divisor of its shapes. ``reduce`` (the
    --reduce option) applies to every M; without it the GPU runs the real shapes, and the CPU the
    real shapes at decode (M <= DECODE_MAX_M) and N and K / CPU_PREFILL_REDUCE above."""
    tokens = list(tokens or DEFAULT_TOKENS)
    if reduce is not None:
        return [(m, reduce) for m in tokens]
    if device != "cpu":
        return [(m, 1) for m in tokens]
    return [(m, 1 if m <= DECODE_MAX_M else CPU_PREFILL_REDUCE) for m in tokens]


def _size_words(reduce):
    if reduce == 1:
        return "full size"
    return f"N and K divided by {reduce} (hidden {4096 // reduce}, intermediate {14336 // reduce}, kv {1024 // reduce})"


def describe_plan(plan):
    """The shapes of a plan in words: 'N and K divided by 4 (...)' when one divisor serves every M,
    else each divisor with its token counts."""
    reduces = list(dict.fromkeys(r for _, r in plan))
    if len(reduces) == 1:
        return _size_words(reduces[0])
    return "; ".join(
        "M = " + ", ".join(str(m) for m, r in plan if r == reduce) + " at " + _size_words(reduce) for reduce in reduces
    )


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

            return block.select(
                block.BlockCall(
                    q.data, weight.data, q.scale, weight.weight_scale, weight.block_size, dev.dtype, weight.bias
                )
            ).name

        call = gemm.GemmCall(q.data, weight.data, q.scale, weight.weight_scale, dev.dtype, weight.bias)
        return gemm.select(call).name
    except Exception:  # a backend without these hooks: the label is not worth failing the run for
        return "auto"


def layer_activation(rng, m, k, dtype):
    """x [M, K]: activations of unit variance with a few outlier channels, as real activations have
    (a realistic amax for the dynamic scales), in the device's activation dtype."""
    x = rng.standard_normal((m, k), dtype=np.float32)
    x[:, rng.integers(0, k, size=max(1, k // 256))] *= 8
    return x.astype(dtype)


def layer_weight(rng, n, k):
    """w [N, K] float32 of nn.Linear's init scale (1/sqrt(K))."""
    w = rng.standard_normal((n, k), dtype=np.float32)
    w *= np.float32(1.0 / np.sqrt(k))
    return w


def layer_data(rng, m, n, k, dtype):
    """(x [M, K], w [N, K] float32): ``layer_activation`` and ``layer_weight``."""
    return layer_activation(rng, m, k, dtype), layer_weight(rng, n, k)


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


def roof_time(flops, nbytes, ceilings):
    """Seconds the measured ceilings allow one call's ``flops`` and ``bytes``: the roofline's bound,
    max(flops / peak, bytes / copy bandwidth)."""
    return max(flops / (ceilings.peak_gflops * 1e9), nbytes / (ceilings.copy_gbytes_per_s * 1e9))


def below_ceiling(time_s, flops, nbytes, ceilings, factor=None):
    """Whether a call of ``time_s`` seconds ran far below what ``ceilings`` allow its work: slower
    than ``factor`` (default SLOW_FACTOR) times its roof time plus CALL_FLOOR_S (see SLOW_FACTOR)."""
    factor = SLOW_FACTOR if factor is None else factor
    return time_s > factor * roof_time(flops, nbytes, ceilings) + CALL_FLOOR_S


def run_ceilings(ceilings, rows):
    """The ceilings a run's rows are judged by: ``ceilings`` (measured at its start) with the copy
    bandwidth and the peak each raised to the highest bytes / s and flops / s that either side of any
    of ``rows`` reached (see SLOW_FACTOR)."""
    rates = [(r["baseline_bytes"] / r["baseline_us"], r["flops"] / r["baseline_us"]) for r in rows]
    rates += [(r["bytes"] / r["device_min_us"], r["flops"] / r["device_min_us"]) for r in rows]
    copy = max([ceilings.copy_gbytes_per_s] + [b / 1e3 for b, _ in rates])  # bytes / us -> GB/s
    peak = max([ceilings.peak_gflops] + [f / 1e3 for _, f in rates])
    return dataclasses.replace(ceilings, copy_gbytes_per_s=copy, peak_gflops=peak)


def judge_row(row, ceilings):
    """Mark ``row`` noisy (``row["noisy"]``) when a side's trials spread wide, when a side's kept trial
    waited for a CPU (``row["waited"]``, see WAIT_SHARE) or when a side ran far below ``ceilings``
    (``row["slow"]`` names it; see SLOW_FACTOR); ``ceilings`` None judges the first two alone."""
    flops, fp8_s, base_s = row["flops"], row["device_min_us"] * 1e-6, row["baseline_us"] * 1e-6
    slow = []
    if ceilings is not None:
        if below_ceiling(base_s, flops, row["baseline_bytes"], ceilings):
            slow.append("baseline")
        if below_ceiling(fp8_s, flops, row["bytes"], ceilings):
            slow.append("fp8")
    row["roof_us"] = roof_time(flops, row["bytes"], ceilings) * 1e6 if ceilings is not None else None
    row["baseline_roof_us"] = roof_time(flops, row["baseline_bytes"], ceilings) * 1e6 if ceilings is not None else None
    row["slow"] = slow
    row["noisy"] = bool(row["spread_noisy"] or slow or row.get("waited"))
    return row


def judge_times(fp8_times, fp8_waits, base_times, base_waits):
    """The noise rules that need no ceilings, on two sides' trials (the MoE job's rows): (the FP8
    side's p90 / median, the baseline's, the sides whose fastest trial waited for a CPU: 'FP8 layer',
    'baseline')."""
    waited = [
        side
        for side, times, waits in (("FP8 layer", fp8_times, fp8_waits), ("baseline", base_times, base_waits))
        if waited_for_cpu(waits[int(np.argmin(times))])
    ]
    return _spread(fp8_times), _spread(base_times), waited


def _spread(times):
    from vtnumba.timing import p90

    return p90(times) / float(np.median(times))


def waited_for_cpu(runqueue):
    """Whether a trial's (running, waiting) seconds (timing.runqueue_seconds) say it waited for a CPU
    (see WAIT_SHARE); None, where the kernel does not say, reads as not."""
    if runqueue is None:
        return False
    running, waiting = runqueue
    return waiting > WAIT_SHARE * (running + waiting) and waiting > WAIT_FLOOR_S


def _time_cpu(name, fp8_call, quant_call, base_call, repeats, flops, fp8_bytes, shape):
    """The CPU's three timings of one row, interleaved (timing.interleaved_cpu_samples): the FP8
    layer first (the quiet pause before it lets the previous baseline's BLAS workers stop spinning),
    its quantization, the baseline. Returns {side: (fastest, median, spread, whether the fastest
    trial waited for a CPU)} and the FP8 layer's ProfileRecord (its fastest call: the roofline's
    point)."""
    from vtnumba import profile, timing

    waits = []
    times = timing.interleaved_cpu_samples([fp8_call, quant_call, base_call], repeats, waits=waits)
    sides = {
        side: (min(t), float(np.median(t)), _spread(t), waited_for_cpu(w[int(np.argmin(t))]))
        for side, t, w in zip(("fp8", "quant", "base"), times, waits)
    }
    best = sides["fp8"][0]
    record = profile.ProfileRecord(
        name,
        "cpu",
        f"fastest of {repeats} interleaved trials",
        best,
        best,
        repeats,
        flops=flops,
        bytes=fp8_bytes,
        shape=shape,
        p90_s=timing.p90(times[0]),
    )
    return sides, record


def run_layer(dev, scheme, name, x, w, repeats, ceilings=None, weight=None):
    """One layer in one scheme: accuracy against float64, then the FP8 layer's timings (device,
    host, graph, its quantization alone) and the baseline's. On the CPU the FP8 layer, its
    quantization and the baseline are timed in turn, trial after trial, the fastest of each kept;
    on the GPU each is a median of its own. ``ceilings`` (profile.Ceilings of this run) mark a side
    that ran far below them noisy; ``weight`` is ``make_weight(scheme, w, x)`` when the caller holds
    it already. Returns (row, FP8 ProfileRecord)."""
    from vtnumba import profile, seam
    from vtnumba.testing import reference

    m, k = x.shape
    n = w.shape[0]
    weight = weight if weight is not None else make_weight(scheme, w, x)
    xd = dev.put(x)
    wd = weight if dev.name == "cpu" else seam.ResidentFp8(weight, dev.name).weight
    w_base = dev.put(w.astype(dev.dtype, copy=False))

    # G3 judges the GEMM alone: the reference takes the codes and scales this device's quantizer
    # made (the call matmul_fp8 makes; the self-check holds the quantizer to the oracle).
    y = dev.get(seam.matmul_fp8(xd, wd))
    qd = seam.quantize_activation(xd, wd)
    kernel = _kernel_label(dev, scheme, qd, wd)
    ref, bound = g3_reference(
        scheme, dev.get(qd.data), dev.get(qd.scale), weight, kernel if dev.name == "cuda" else None
    )
    allowed = bound + reference.out_rounding(ref, y.dtype)
    g3 = float(np.max(np.abs(y.astype(np.float64) - ref) / allowed))
    del ref, bound, allowed
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    fp8_rel = float(np.linalg.norm(y.astype(np.float64) - exact) / np.linalg.norm(exact))
    del exact

    itemsize = dev.dtype.itemsize
    flops, fp8_bytes = profile.linear_cost(m, n, k, itemsize, 1, np.dtype(y.dtype).itemsize)
    base_bytes = float(itemsize * (m * k + n * k + m * n))
    shape = f"{m}x{n}x{k}"
    unavailable = {}
    if dev.name == "cpu":
        sides, fp8 = _time_cpu(
            name,
            lambda: seam.matmul_fp8(xd, wd),
            lambda: seam.quantize_activation(xd, wd),
            lambda: xd @ w_base.T,
            repeats,
            flops,
            fp8_bytes,
            shape,
        )
        (fp8_s, fp8_median, fp8_spread, fp8_waited), (quant_s, _, quant_spread, _), sides_base = (
            sides["fp8"],
            sides["quant"],
            sides["base"],
        )
        base_s, base_median, base_spread, base_waited = sides_base
        waited = [side for side, w in (("fp8", fp8_waited), ("baseline", base_waited)) if w]
        fp8_host = base_host = graph_us = None
        unavailable.update({key: dict(label=label, reason=why) for key, (label, why) in CPU_NOT_APPLICABLE.items()})
    else:
        fp8 = profile.profile_linear(wd, xd, name=name, repeats=repeats)
        graph_us, graph_why = _graph_us(dev, wd, xd, repeats, name)
        quant = profile.profile_op(
            lambda a: seam.quantize_activation(a, wd), xd, repeats=repeats, name=f"{name} (quantize)"
        )
        base = profile.profile_op(
            lambda a, b: a @ b.T,
            xd,
            w_base,
            repeats=repeats,
            name=f"{name} (baseline)",
            flops=flops,
            bytes=base_bytes,
            shape=shape,
        )
        # events time all repeats as one interval: its mean is the figure, there is no fastest call
        fp8_s = fp8_median = fp8.time_s
        quant_s = quant.time_s
        base_s = base_median = base.time_s
        fp8_spread, quant_spread, base_spread = fp8.spread, quant.spread, base.spread
        fp8_host, base_host = fp8.host_s, base.host_s
        waited = []  # device time: no other process's threads in it
        unavailable["spread"] = dict(label="one interval", reason=GPU_SPREAD_REASON)
        if graph_why is not None:
            unavailable["graph_us"] = dict(label=graph_why[0], reason=graph_why[1])
    spreads = [s for s in (fp8_spread, quant_spread, base_spread) if s is not None]
    # The quantization is part of the layer, so its share comes from the least-disturbed call of each
    # (the minimums): two medians taken apart, on a loaded machine, gave shares above 100%.
    share = min(quant_s, fp8_s) / fp8_s
    row = dict(
        layer=name,
        scheme=scheme,
        m=m,
        n=n,
        k=k,
        kernel=kernel,
        device_us=fp8_s * 1e6,
        host_us=None if fp8_host is None else fp8_host * 1e6,
        graph_us=graph_us,
        quant_us=quant_s * 1e6,
        quant_share=share,
        device_min_us=fp8_s * 1e6,
        quant_min_us=quant_s * 1e6,
        device_median_us=fp8_median * 1e6,
        baseline_median_us=base_median * 1e6,
        spread=fp8_spread,
        baseline_spread=base_spread,
        quant_spread=quant_spread,
        flops=flops,
        bytes=fp8_bytes,
        baseline_bytes=base_bytes,
        spread_noisy=any(s > NOISY_SPREAD for s in spreads),
        waited=waited,
        gflops=flops / fp8_s / 1e9,
        gbytes_per_s=fp8_bytes / fp8_s / 1e9,
        baseline_us=base_s * 1e6,
        baseline_host_us=None if base_host is None else base_host * 1e6,
        speedup=base_s / fp8_s,
        g3_ratio=g3,
        g3_ok=bool(g3 <= 1.0),
        fp8_rel_error=fp8_rel,
        unavailable=unavailable,
    )
    return judge_row(row, ceilings), fp8


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
            p(
                f"  {r['scheme']:22s} {r['values']:>9,d} values  {r['nonzero_codes']:>9,d} non-zero codes"
                f"  mismatches {r['mismatches']}"
            )
        p()
    if capabilities is not None:
        p("GPU: " + str(capabilities))
        p()
    if report.get("cpu"):
        from vtnumba.cpu import paths

        p(paths.header_line(report["cpu"]))
        p()
    c = report["ceilings"]
    p(
        f"FP8 W8A8 linear path on {report['device']}: Llama-3-8B decoder layers, {report['reduction']}; "
        f"{report['activation_dtype']} activations and outputs"
    )
    others = [f"{label} {value:.1f}" for label, value in (c.get("extra") or {}).items() if label != c["peak_label"]]
    j = report.get("judged_ceilings") or c
    raised = (j["copy_gbytes_per_s"], j["peak_gflops"]) != (c["copy_gbytes_per_s"], c["peak_gflops"])
    p(
        f"measured ceilings: copy {c['copy_gbytes_per_s']:.1f} GB/s, {c['peak_label']} {c['peak_gflops']:.1f} GFLOP/s"
        + (f" (also {', '.join(others)})" if others else "")
        + (
            f"; rows judged by copy {j['copy_gbytes_per_s']:.1f} GB/s, {j['peak_gflops']:.1f} GFLOP/s, the best "
            "rates this run's calls reached"
            if raised
            else ""
        )
    )
    p("G3 = max |y - ref64| / bound (<= 1 passes); fp8 err = ||y - x@w.T (float64, unquantized)|| / ||x@w.T||")
    heads, rows, keys = table_cells(report)
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(heads)]

    def line(cells):
        return " ".join(
            c.ljust(w) if key in _TEXT_COLUMNS else c.rjust(w) for c, w, key in zip(cells, widths, keys)
        ).rstrip()

    p(line(heads))
    p("-" * len(line(heads)))
    for row in rows:
        p(line(row))
    if report["device"] == "cpu":
        p(
            f"speedup = {report['baseline']['label']} time / FP8 layer time, same run: the FP8 layer, its "
            f"quantization and the baseline timed in turn, {report['repeats']} trials each, the fastest of each kept"
        )
        p(
            "device us: the FP8 layer per call (activation quantization + FP8 GEMM), fastest trial; p90/median: "
            "the spread of its trials; quant: the quantization alone, fastest trial, and its share of the layer"
        )
    else:
        p(
            f"speedup = {report['baseline']['label']} time / FP8 layer time, same run, median of "
            f"{report['repeats']} calls"
        )
        p(
            "device us: the FP8 layer per call (activation quantization + FP8 GEMM), median; quant: the "
            "quantization alone, median, and its share of the layer"
        )
    several = len(report["schemes"]) > 1
    noisy = [
        f"{r['layer']} M={r['m']}"
        + (f" {r['scheme']}" if several else "")
        + (
            " ("
            + ", ".join(
                [f"{'FP8 layer' if s == 'fp8' else 'baseline'} slow" for s in r.get("slow") or []]
                + [f"{'FP8 layer' if s == 'fp8' else 'baseline'} waited" for s in r.get("waited") or []]
            )
            + ")"
            if r.get("slow") or r.get("waited")
            else ""
        )
        for r in report["layers"]
        if r.get("noisy")
    ]
    if noisy:
        p(
            f"WARNING: noisy figures (p90 > {NOISY_SPREAD:.0f}x the median for the layer, its quantization or its "
            f"baseline, or the FP8 layer or its baseline slower than {SLOW_FACTOR:.0f}x the time this run's "
            f"ceilings allow its flops and bytes, plus {CALL_FLOOR_S * 1e6:.0f} us a call, or its fastest trial's "
            f"threads waiting for a CPU over {WAIT_SHARE:.0%} of the time; marked !): {', '.join(noisy)}. Another process was using "
            f"the machine: rerun on a quiet one before quoting them."
        )
    for line in regime_lines(report.get("regimes") or []):
        p(line)
    if report["device"] == "cuda":
        p("host us: the host's cost to enqueue one call; graph us: device time per call replayed from a CUDA graph")
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


# Why FP8 wins or not in each regime, per device: the footer's account of the speedup column.
REGIME_REASONS = {
    ("cpu", "decode"): "at a few tokens the weight is the traffic, and the FP8 layer reads a quarter of "
    "float32's weight bytes (1 byte a weight against 4)",
    ("cpu", "prefill"): "at many tokens the work is flops, and a CPU has no FP8 arithmetic: the FP8 layer "
    "decodes its codes to float32 for the same FMAs sgemm runs, so at large M it is "
    "bound by the BLAS rate sgemm already reaches, plus the quantization",
    ("cuda", "decode"): "at a few tokens the weight is the traffic, and the FP8 layer reads half of "
    "float16's weight bytes",
    ("cuda", "prefill"): "at many tokens the work is flops, and FP8 tensor cores run at twice float16's rate",
}


def regime_summary(rows, device):
    """Per regime (decode: M <= DECODE_MAX_M; prefill above): its token counts and divisors, the
    range and median of its rows' speedups (noisy rows left out), whether FP8 wins there, and why."""
    out = []
    for regime, pick in (("decode", lambda r: r["m"] <= DECODE_MAX_M), ("prefill", lambda r: r["m"] > DECODE_MAX_M)):
        picked = [r for r in rows if pick(r)]
        if not picked:
            continue
        clean = sorted(r["speedup"] for r in picked if not r.get("noisy"))
        median = float(np.median(clean)) if clean else None
        verdict = None if median is None else "wins" if median > 1.05 else "trails" if median < 0.95 else "ties"
        out.append(
            dict(
                regime=regime,
                tokens=sorted({r["m"] for r in picked}),
                reduce=sorted({r.get("reduce", 1) for r in picked}),
                rows=len(picked),
                noisy_rows=len(picked) - len(clean),
                speedup_min=clean[0] if clean else None,
                speedup_max=clean[-1] if clean else None,
                speedup_median=median,
                fp8=verdict,
                reason=REGIME_REASONS[(device, regime)],
            )
        )
    return out


def regime_lines(regimes):
    """The footer's lines on where FP8 wins (from regime_summary)."""
    lines = []
    for g in regimes:
        tokens = ", ".join(map(str, g["tokens"]))
        sizes = " and ".join("full size" if r == 1 else f"N and K / {r}" for r in g["reduce"])
        head = f"{g['regime']} (M = {tokens}, {sizes}): "
        if g["fp8"] is None:
            lines.append(head + f"no speedup to quote, all {g['rows']} rows noisy; " + g["reason"])
            continue
        lines.append(head + verdict_text(g))
        if g["regime"] == "decode" and max(g["reduce"]) > 1:
            lines.append(
                "  (with N and K divided, a layer's float32 weight can sit in cache, where sgemm reads "
                "it faster than memory and the byte saving hardly shows: the default job runs decode "
                "at the real shapes)"
            )
    if lines:
        lines.insert(0, "where FP8 wins:")
    return lines


def check_plot_path(path):
    """--plot's file, checked before any work (a bad path found after minutes of measuring loses
    them): matplotlib is installed, the extension is a format it writes, the directory exists and
    is writable. Raises UsageError or MissingDependencyError (exit 2) with the fix."""
    from vtnumba import profile

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(
            f"--plot must name a file in an existing directory, got {path!r}: "
            f"create {parent} first or pick another directory"
        )
    if os.path.isdir(path):
        raise UsageError(
            f"--plot must name a file, got the directory {path!r}: add a file name, e.g. "
            f"{os.path.join(path, 'roofline.png')}"
        )
    if not os.access(parent, os.W_OK):
        raise UsageError(
            f"--plot must name a file in a directory you can write, got {path!r} "
            f"({parent} is not writable): pick another directory"
        )
    profile.require("matplotlib", "plot", "--plot")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if os.path.splitext(path)[1].lower().lstrip(".") not in formats:
        raise UsageError(
            f"--plot must end in a file type matplotlib writes ({', '.join('.' + f for f in formats)}), "
            f"got {path!r}: name it e.g. roofline.png"
        )


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
            report = _moe_job.run(
                args,
                out,
                device,
                args.tokens or list(MOE_CPU_TOKENS if device == "cpu" else MOE_GPU_TOKENS),
                args.repeats or (5 if device == "cpu" else 20),
                reduce,
                judge_times,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.json:
            print(json.dumps(report, indent=2), file=out)
        return report
    plan = job_plan(device, args.tokens, args.reduce)
    tokens = [m for m, _ in plan]
    repeats = args.repeats or (5 if device == "cpu" else 50)
    groups = {}  # divisor -> its token counts, in the plan's order: each layer's weight made once per divisor
    for m, r in plan:
        groups.setdefault(r, []).append(m)
    shapes_of = {r: list(layer_shapes(r)) for r in groups}
    reduce = max(groups)
    schemes, skipped = choose_schemes(args, [s for r in groups for s in shapes_of[r]], reduce)
    dev = _Device(device)
    capabilities = None
    if device == "cuda":
        from vtnumba.cuda import capabilities as gpu_capabilities

        capabilities = gpu_capabilities()

    progress = Progress(len(plan) * len(LLAMA3_8B_LAYERS) * len(schemes) + 2, enabled=not args.no_progress)
    progress.begin("quantization self-check")
    checks = [] if args.skip_selfcheck else selfcheck(dev, block="block" in schemes, mx="mxfp8" in schemes)
    progress.end()
    progress.begin("measuring ceilings")
    ceilings = profile.measure_ceilings(device)
    progress.end()
    rng = np.random.default_rng(8)
    done = []  # (plan index, layer index, scheme index, row, record): the table's order is the plan's
    try:
        for r, ms in groups.items():
            for li, (name, n, k) in enumerate(shapes_of[r]):
                w = layer_weight(rng, n, k)
                weights = {}  # scheme -> Fp8Weight, shared by the token counts (static calibrates per batch)
                for m in ms:
                    x = layer_activation(rng, m, k, dev.dtype)  # shared by the schemes
                    for si, scheme in enumerate(schemes):
                        progress.begin(f"{name} M={m} {scheme}" + (f" /{r}" if r > 1 else ""))
                        weight = make_weight(scheme, w, x) if scheme == "static" else weights.get(scheme)
                        if weight is None:
                            weight = weights[scheme] = make_weight(scheme, w, x)
                        row, fp8 = run_layer(dev, scheme, name, x, w, repeats, ceilings=ceilings, weight=weight)
                        row["reduce"] = r
                        label = f"{name} M={m}" + (f" {scheme}" if len(schemes) > 1 else "")
                        record = profile.ProfileRecord(
                            label,
                            fp8.device,
                            fp8.method,
                            fp8.time_s,
                            fp8.min_s,
                            fp8.repeats,
                            fp8.host_s,
                            fp8.flops,
                            fp8.bytes,
                            fp8.shape,
                        )
                        done.append((plan.index((m, r)), li, si, row, record))
                        progress.end()
                del w, weights
    finally:
        progress.close()
    done.sort(key=lambda d: d[:3])
    rows, records = [d[3] for d in done], [d[4] for d in done]
    judged = run_ceilings(ceilings, rows)  # every row judged by the best the whole run reached
    for row in rows:
        judge_row(row, judged)
    ok = all(r["mismatches"] == 0 for r in checks) and all(r["g3_ok"] for r in rows)
    reduction = describe_plan(plan)
    # reduce: the one divisor of every M, or None when the plan mixes them (see plan)
    report = dict(
        device=device,
        reduction=reduction,
        reduce=reduce if len(groups) == 1 else None,
        plan=[dict(m=m, reduce=r) for m, r in plan],
        tokens=tokens,
        repeats=repeats,
        schemes=schemes,
        skipped_schemes=skipped,
        baseline=asdict(dev.baseline),
        activation_dtype=str(dev.dtype),
        selfcheck=checks,
        ceilings=ceilings.as_dict(),
        judged_ceilings=judged.as_dict(),
        layers=rows,
        regimes=regime_summary(rows, device),
        ok=ok,
        plot=None,
    )
    if capabilities is not None:
        report["gpu_capabilities"] = capabilities.as_dict()
    if device == "cpu":
        from vtnumba.cpu import paths

        report["cpu"] = paths.describe()
    if args.plot is not None:
        try:
            profile.roofline_plot(
                records,
                ceilings,
                path=args.plot,
                title="vtnumba FP8 W8A8 linear, Llama-3-8B layers, "
                + (
                    f"/{reduce}"
                    if len(groups) == 1
                    else ", ".join(
                        f"M={'/'.join(map(str, ms))} " + ("full" if r == 1 else f"/{r}") for r, ms in groups.items()
                    )
                )
                + f", {device}",
            )
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
