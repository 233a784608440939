"""The timing every GPU benchmark here uses (DEVICE.md's method), written once.

- Device time: a sleep kernel is queued first, then events around N calls, so the host has
  enqueued every call before the GPU starts and the interval is GPU work only.
- Host time: a loop of N calls timed with the host clock, synchronized once at the end.
Needs torch (its sleep kernel and events) and a GPU.
"""

import time

import torch


def gpu_us(fn, n=50, sleep_cycles=int(1e8)):
    """Device microseconds per call of ``fn``, behind a queued sleep of ``sleep_cycles`` (1e8 is
    ~50 ms: it must outlast the enqueueing of all n calls)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(sleep_cycles)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3


def best_of(fn, n=50, repeats=3):
    """The least disturbed of ``repeats`` device timings."""
    return min(gpu_us(fn, n) for _ in range(repeats))


def host_us(fn, n=2000, warmup=20):
    """Host microseconds per call: n calls in a loop, one synchronization after the clock stops."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / n * 1e6
