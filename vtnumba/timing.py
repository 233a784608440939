"""The timers of ``vtnumba.profile`` and of every benchmark, written once.

- CPU: ``cpu_time`` -- a quiet pause (OpenBLAS's spinning workers), warm-up calls, then the median
  and the minimum of timed calls; ``interleaved_cpu_samples`` -- several callables timed in turn,
  round after round, so that load on the machine hits each alike (comparisons), and, on request,
  how long each timed call's threads waited for a CPU (``runqueue_seconds``).
- GPU device time: ``device_us`` -- a spin kernel is queued first, so the host has enqueued every
  timed call before the GPU reaches them; CUDA events around the calls then time the GPU alone
  (DEVICE.md's method, with a spin kernel of our own instead of torch's ``_sleep``). With method
  "graph" the calls are captured into a CUDA graph and replayed between the events.
- GPU host cost: ``host_us`` -- a loop of calls timed with the host clock, synchronized once.
"""

import os
import statistics
import time

import numpy as np

from . import _arrays

__all__ = [
    "cpu_time",
    "cpu_samples",
    "interleaved_cpu_samples",
    "runqueue_seconds",
    "NOISY_SPREAD",
    "device_us",
    "best_device_us",
    "host_us",
    "paired_host_time",
]


def _device_of(args):
    for a in args:
        if hasattr(a, "shape") and hasattr(a, "dtype"):
            return "cuda" if _arrays.is_cuda(_arrays.device_of(a, "argument")) else "cpu"
    return "cpu"


# OpenBLAS's worker threads spin for ~80 ms after a BLAS call; a Numba-parallel kernel started in that
# window shares the cores with them and ran 3-4x slower on a 2-core machine (measured, see
# benchmarks/cpu/bench_cpu_gemm.py). Each CPU measurement starts after this quiet pause, so one record's
# BLAS calls (numpy's sgemm baseline, say) do not tax the next record's kernel.
_BLAS_SPIN_PAUSE_S = 0.15


# A figure whose 90th percentile is this many times its median is called noisy (the main command and
# ProfileRecord.noisy): on a quiet machine the CPU kernels' p90 / median stays under 1.5; another
# process on the same cores gave 5-400x (a worker waiting a scheduler time slice).
NOISY_SPREAD = 3.0


def cpu_samples(call, repeats=9, warmup=1):
    """Seconds of each of ``repeats`` timed calls of ``call()`` on the CPU, after a quiet pause (see
    above) and ``warmup`` untimed calls."""
    time.sleep(_BLAS_SPIN_PAUSE_S)
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


_TASKS = "/proc/self/task"


def runqueue_seconds():
    """(running, waiting) seconds of all of this process's threads so far: the time they ran on a CPU
    and the time they were ready to run but waited for one (Linux's per-thread schedstat). Waiting is
    what other processes on the same cores cost: a call's own work never waits. None where the kernel
    does not say (not Linux, or schedstat off)."""
    try:
        tasks = os.listdir(_TASKS)
    except OSError:
        return None
    running = waiting = 0
    for task in tasks:
        try:
            with open(f"{_TASKS}/{task}/schedstat") as f:
                run_ns, wait_ns, _ = f.read().split()
        except (OSError, ValueError):
            continue  # a thread that ended between the listing and the read
        running += int(run_ns)
        waiting += int(wait_ns)
    return running * 1e-9, waiting * 1e-9


def interleaved_cpu_samples(calls, trials=5, warmup=1, waits=None):
    """Seconds of each timed call of several callables taken in turn: ``warmup`` untimed rounds, then
    ``trials`` rounds, each a quiet pause (see above) and then, for each of ``calls`` in order, one
    untimed call and one timed call. Returns one list of ``trials`` seconds per callable. ``waits``, a
    list, receives one list per callable of (running, waiting) seconds (``runqueue_seconds``) of each
    trial's untimed and timed call together, or None per trial where the kernel does not say; it is
    read before the untimed call and after the timed one, so the timed call follows the untimed one
    as closely as without it.

    For a comparison (a kernel against its baseline): a neighbour process that takes the cores for a
    second slows the calls of both sides around that second, where timing all of one side's calls and
    then the other's put the whole disturbance on one side and skewed the ratio (a 30x "speedup" on a
    loaded machine that read 0.9x in the next run). The untimed call before each timed one leaves the
    machine as a loop of that callable's own calls does, as in a model called layer after layer: the
    first call after the pause paid ~300 us to wake the idle cores of a 2-core VM (on a 40 us call),
    and a first BLAS call in a while wakes OpenBLAS's sleeping workers. The pause opens each round,
    before the first callable: put the one a BLAS call's spinning workers would tax (a Numba kernel)
    first, and the BLAS call last."""
    calls = list(calls)
    for _ in range(warmup):
        for call in calls:
            call()
    times = [[] for _ in calls]
    waited = [[] for _ in calls]
    for _ in range(trials):
        time.sleep(_BLAS_SPIN_PAUSE_S)
        for call, out, seen in zip(calls, times, waited):
            before = runqueue_seconds() if waits is not None else None
            call()
            t0 = time.perf_counter()
            call()
            out.append(time.perf_counter() - t0)
            if waits is not None:
                after = runqueue_seconds()
                seen.append(None if before is None or after is None else (after[0] - before[0], after[1] - before[1]))
    if waits is not None:
        waits.extend(waited)
    return times


def p90(times):
    """The 90th percentile of a list of times (linear interpolation, numpy's default)."""
    return float(np.percentile(times, 90))


def cpu_time(call, repeats=9, warmup=1):
    """(median, minimum) seconds per call of ``call()`` on the CPU: a quiet pause (see above),
    ``warmup`` untimed calls, then ``repeats`` timed ones."""
    times = cpu_samples(call, repeats, warmup)
    return statistics.median(times), min(times)


# A kernel that holds the GPU for a given number of nanoseconds (globaltimer is in ns on every
# architecture since Pascal). Queued before the timed calls, it lets the host enqueue all of them
# before the GPU starts, so the events between them measure GPU time, not launch gaps (DEVICE.md's
# torch.cuda._sleep recipe, without needing torch).
_SPIN_SOURCE = r"""
extern "C" __global__ void vt_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""
_spin_kernel = None


def _spin(cp, ns, stream):
    global _spin_kernel
    if _spin_kernel is None:
        _spin_kernel = cp.RawKernel(_SPIN_SOURCE, "vt_spin")
    _spin_kernel((1,), (1,), (np.uint64(ns),), stream=stream)


def _time_gpu(call, repeats, warmup, method):
    import cupy as cp

    stream = cp.cuda.get_current_stream()
    for _ in range(warmup):
        call()
    stream.synchronize()
    # A first host-clock estimate sizes the spin: it must outlast the enqueueing of every call.
    t0 = time.perf_counter()
    call()
    stream.synchronize()
    rough = time.perf_counter() - t0
    start, end = cp.cuda.Event(), cp.cuda.Event()
    note = ""
    if method == "graph":
        graph_stream = cp.cuda.Stream(non_blocking=True)
        with graph_stream:
            graph_stream.begin_capture()
            try:
                for _ in range(repeats):
                    call()
            finally:
                graph = graph_stream.end_capture()
            graph.upload(graph_stream)
            graph.launch(graph_stream)  # warm the replay
            graph_stream.synchronize()
            _spin(cp, int(min(max(20 * rough, 1e-3), 0.5) * 1e9), graph_stream)
            start.record(graph_stream)
            h0 = time.perf_counter()
            graph.launch(graph_stream)
            host = (time.perf_counter() - h0) / repeats
            end.record(graph_stream)
            end.synchronize()
        device = cp.cuda.get_elapsed_time(start, end) * 1e-3 / repeats
        return device, device, host, "one graph of all repeats; host = one replay's launch / repeats"
    for _ in range(3):
        spin_s = min(max(2.0 * rough * repeats, 1e-3), 2.0)
        _spin(cp, int(spin_s * 1e9), stream)
        start.record(stream)
        h0 = time.perf_counter()
        for _ in range(repeats):
            call()
        enqueue = time.perf_counter() - h0
        end.record(stream)
        end.synchronize()
        if enqueue < spin_s:
            break
        rough = enqueue / repeats  # the host outran the spin: the interval holds launch gaps, retry
    else:
        note = "host-bound: device time includes launch gaps"
    device = cp.cuda.get_elapsed_time(start, end) * 1e-3 / repeats
    # Events give one interval for all repeats, so the median and the minimum are that mean.
    return device, device, enqueue / repeats, note


def device_us(call, repeats=50, warmup=3):
    """Device microseconds per call of ``call()`` on the GPU (method "queued": the calls are all
    enqueued behind a spin kernel, so the interval between events is GPU work only)."""
    return _time_gpu(call, repeats, warmup, "queued")[0] * 1e6


def best_device_us(call, repeats=50, rounds=3):
    """The least disturbed of ``rounds`` ``device_us`` measurements."""
    return min(device_us(call, repeats) for _ in range(rounds))


def host_us(call, repeats=2000, warmup=20):
    """Host microseconds per call of ``call()`` on the GPU: a loop of ``repeats`` calls timed with the
    host clock, the stream synchronized once after the clock stops (what a Python loop that
    launches layer after layer pays per call)."""
    import cupy as cp

    stream = cp.cuda.get_current_stream()
    for _ in range(warmup):
        call()
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        call()
    elapsed = time.perf_counter() - t0
    stream.synchronize()
    return elapsed / repeats * 1e6


def paired_host_time(base_fn, test_fn, calls, rounds, sync=lambda: None):
    """Host seconds per call of two ways of doing the same thing, for the cost one adds over the
    other: alternating short rounds of ``calls`` calls (the order flips every round, so other load on
    the machine hits both alike), ``sync()`` after each side's clock stops. Returns (best base, best
    test, median of the paired per-round differences): the minimum is the least-disturbed round, the
    paired median is robust to a round another process interrupted."""
    base_t, test_t, diffs = [], [], []
    for r in range(rounds):
        pair = {}
        order = (("base", base_fn), ("test", test_fn)) if r % 2 == 0 else (("test", test_fn), ("base", base_fn))
        for name, fn in order:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            sync()
            pair[name] = (t1 - t0) / calls
        base_t.append(pair["base"])
        test_t.append(pair["test"])
        diffs.append(pair["test"] - pair["base"])
    return min(base_t), min(test_t), statistics.median(diffs)
