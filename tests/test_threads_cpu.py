"""Threads on the CPU: Python threads that share layers get, bit for bit, what one thread gets.

``THREADS`` threads share one set of layers and make ``CALLS`` calls each over mixed shapes, dtypes
and schemes: seam linear methods of every weight scheme (per-tensor dynamic and static, per-token x
per-channel, 16 x 32 blocks with float32 and with power-of-two activation scales, MXFP8, UE8M0
weight blocks), ``vt.scaled_mm`` with each CPU kernel forced, the quantizers, and three
``seam.Fp8Experts`` pairs through ``seam.moe_fp8`` (per-channel, block-scaled, MXFP8). Meanwhile a
background thread keeps numpy's BLAS busy, and ``VT_CPU_PARALLEL_MIN_WORK=0`` makes every kernel
call a parallel region, so the threads also launch Numba's parallel regions side by side. Every
result must equal the serial result for the same input, bitwise.

The caches on the CPU path (vtnumba.cpu.paths's comment above ``BUILD_LOCK`` lists them and how each
is safe) are emptied before the threads start and once while they run, so every fill happens under
contention (the threads make their first calls in step, all of them at each item):
``CpuKernel._variants`` (each kernel's Numba dispatchers) and ``vtnumba.cpu.experts._compiled`` (the
grouped drivers). Each must be built once per fill; two threads that miss together and both build
would each compile (or load from disk) their own copy. The serial results are taken first, which
also puts every kernel on disk: the threads' fills load them.
The two fills are also tested alone, without compiling anything (the mutations' quick killer). Two
more tests: the thread pool is started once however many threads ask at once, and under
Numba's workqueue threading layer (not thread-safe: concurrent regions abort the process) the
threads' parallel regions run one at a time, in a fresh process.
"""

import collections
import gc
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import ml_dtypes
import numpy as np

import vtnumba as vt
from vtnumba import seam
from vtnumba.cpu import experts as cpu_experts
from vtnumba.cpu import paths

THREADS, CALLS = 8, 200
BF16 = np.dtype(ml_dtypes.bfloat16)
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _workload():
    """(name, call) pairs: every layer and op of the module docstring at mixed shapes and dtypes."""
    rng = np.random.default_rng(1)

    def w(n, k):
        return (rng.standard_normal((n, k)) * 0.1).astype(np.float32)

    n, k = 96, 256
    bias = rng.standard_normal(n).astype(np.float32)
    weights = {
        "dynamic": seam.Fp8Weight.from_float(w(n, k)),
        "static": seam.Fp8Weight.from_float(w(n, k), input_scale=0.02, bias=bias),
        "per_token": seam.Fp8Weight.from_float(w(n, k), per_channel=True, activation_scheme="per_token", bias=bias),
        "block": seam.Fp8Weight.from_float(w(n, k), block_size=(16, 32)),
        "block_ue8m0": seam.Fp8Weight.from_float(w(n, k), block_size=(16, 32), scale_ue8m0=True),
        "mxfp8": seam.Fp8Weight.from_float(w(n, k), block_size=(1, 32), scale_format="e8m0"),
        "ue8m0_weight": seam.Fp8Weight.from_float(w(n, k), block_size=(128, 128), scale_format="e8m0"),
    }
    items = []
    for name, weight in weights.items():
        method = seam.make_linear_method(weight if name != "static" else seam.ResidentFp8(weight, "cpu"))
        for rows in (1, 4, 33):
            for dt in (np.float32, BF16):
                x = rng.standard_normal((rows, k)).astype(dt)
                items.append((f"{name} linear [{rows}, {k}] {np.dtype(dt)}", lambda m=method, x=x: m.apply(x)))
    a = rng.integers(0, 0x7E, (9, k), dtype=np.uint8)
    b = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
    sa, sb = rng.random((9, 1)).astype(np.float32), rng.random(n).astype(np.float32)
    sa_blocks = rng.random((9, k // 32)).astype(np.float32) + 0.5
    sb_blocks = rng.random((n // 16, k // 32)).astype(np.float32) + 0.5
    for kernel in ("reference", "small_m", "blas"):
        items.append((f"scaled_mm {kernel}", lambda kernel=kernel: vt.scaled_mm(a, b, sa, sb, kernel=kernel)))
        items.append(
            (
                f"block scaled_mm {kernel}",
                lambda kernel=kernel: vt.scaled_mm(a, b, sa_blocks, sb_blocks, block_size=(16, 32), kernel=kernel),
            )
        )
    x = rng.standard_normal((17, k)).astype(np.float32)
    for name, kwargs in {
        "static": dict(scale=0.05),
        "dynamic": {},
        "per_token": dict(per_token=True),
        "group": dict(group_size=128, column_major_scales=True),
        "mx": dict(group_size=32, scale_format="e8m0"),
    }.items():
        items.append((f"quantize {name}", lambda kwargs=kwargs: vt.quantize_fp8(x, **kwargs)))
    items.append(("fp8_linear", lambda: vt.fp8_linear(x, b, sb, per_token=True)))

    e, h, i = 8, 128, 64
    for name, kwargs in {
        "per_channel": dict(per_channel=True, activation_scheme="per_token"),
        "block": dict(block_size=(16, 32)),
        "mxfp8": dict(block_size=(1, 32), scale_format="e8m0"),
    }.items():
        gate_up = seam.Fp8Experts.from_float((rng.standard_normal((e, 2 * i, h)) * 0.1).astype(np.float32), **kwargs)
        down = seam.Fp8Experts.from_float((rng.standard_normal((e, h, i)) * 0.1).astype(np.float32), **kwargs)
        for t in (1, 5, 16):
            ids = rng.integers(0, e, (t, 2))
            weights_t = rng.random((t, 2)).astype(np.float32)
            x_t = rng.standard_normal((t, h)).astype(np.float32)
            items.append(
                (
                    f"moe {name} T={t}",
                    lambda x_t=x_t, g=gate_up, d=down, ids=ids, wt=weights_t: seam.moe_fp8(x_t, g, d, ids, wt),
                )
            )
    return items


def _bits(result):
    """A result's bytes, shape and dtype (a QuantizedActivation's codes and scales)."""
    parts = (result.data, result.scale) if isinstance(result, vt.QuantizedActivation) else (result,)
    return tuple((p.shape, str(p.dtype), np.ascontiguousarray(p).tobytes()) for p in parts)


def _cpu_kernels():
    """Every CpuKernel alive (module globals, the grouped drivers, drivers evicted before)."""
    return [o for o in gc.get_objects() if issubclass(type(o), paths.CpuKernel)]  # type(): proxies too


def _busy_blas(stop):
    """numpy's BLAS kept busy beside the threads (its worker threads contend for the same cores)."""
    a = np.random.default_rng(0).standard_normal((384, 384)).astype(np.float32)
    while not stop.is_set():
        np.dot(a, a)


def test_threads_share_layers_and_get_the_serial_bits(monkeypatch):
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", "0")  # every call a parallel region
    items = _workload()
    # one thread first: the serial results, and every kernel compiled and on disk, so the threads'
    # fills load machine code rather than compile it under contention (minutes on two cores)
    serial = [_bits(call()) for _, call in items]

    # count the builds of each cache entry per fill (the epoch changes, under BUILD_LOCK, at each eviction).
    # The first fill is held to one build per entry; in a later one a thread still holding a grouped
    # driver from before the eviction rebuilds that old driver's dispatcher, which is no second build.
    epoch = [0]
    builds = collections.Counter()
    real_njit = paths.njit

    def counting_njit(**flags):
        decorate = real_njit(**flags)

        def build(fn):
            builds[(epoch[0], "dispatcher", f"{fn.__module__}.{fn.__qualname__}")] += 1
            time.sleep(0.002)  # a build that takes its time (real ones may): the window a second miss needs
            return decorate(fn)

        return build

    class CountingKernel(paths.CpuKernel):
        def __init__(self, fn, *args):
            builds[(epoch[0], "grouped driver", f"{fn.__module__}.{fn.__qualname__}")] += 1
            time.sleep(0.005)
            super().__init__(fn, *args)

    monkeypatch.setattr(paths, "njit", counting_njit)
    monkeypatch.setattr(cpu_experts, "CpuKernel", CountingKernel)

    # found now, before any thread runs: gc.get_objects() would also hand out objects another thread is
    # still building (a tuple mid-construction then fails with SystemError in that thread)
    kernels = _cpu_kernels()

    def evict():
        with paths.BUILD_LOCK:
            for kernel in kernels + list(cpu_experts._compiled.values()):
                kernel._variants.clear()
            cpu_experts._compiled.clear()
            epoch[0] += 1

    evict()  # the first fill is the threads'
    done = [0]
    done_lock = threading.Lock()
    got = [[] for _ in range(THREADS)]
    errors = []
    start_line = threading.Barrier(THREADS + 1)
    in_step = threading.Barrier(THREADS, timeout=600)

    def worker(t):
        # first every item in one order, all threads at once (each fill contended by all of them), then
        # items in an order of the thread's own
        order = list(range(len(items))) + list(np.random.default_rng(100 + t).integers(0, len(items), CALLS))
        start_line.wait()
        try:
            for step, i in enumerate(order[:CALLS]):
                if step < len(items):
                    in_step.wait()
                got[t].append((i, _bits(items[i][1]())))
                with done_lock:
                    done[0] += 1
        except BaseException:  # noqa: BLE001 -- reported below, with the thread and the traceback
            in_step.abort()
            errors.append((t, traceback.format_exc()))

    stop = threading.Event()
    blas = threading.Thread(target=_busy_blas, args=(stop,), daemon=True)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    interval = sys.getswitchinterval()
    start = time.perf_counter()
    blas.start()
    for t in threads:
        t.start()
    sys.setswitchinterval(1e-4)  # hand the GIL over 50x as often as by default: fills and misses interleave
    try:
        start_line.wait()
        while done[0] < THREADS * CALLS // 2 and any(t.is_alive() for t in threads):
            time.sleep(0.002)
        evict()  # the second fill, while the threads run
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        blas.join()
    elapsed = time.perf_counter() - start
    for t, tb in errors[:3]:
        print(f"thread {t}:\n{tb}")
    assert not errors, errors[:3]
    assert done[0] == THREADS * CALLS

    mismatches = [(t, items[i][0]) for t in range(THREADS) for i, bits in got[t] if bits != serial[i]]
    assert mismatches == [], f"{len(mismatches)} results differ from the serial ones: {mismatches[:5]}"
    twice = {key: count for key, count in builds.items() if key[0] == 1 and count > 1}
    assert not twice, f"built more than once in one fill: {twice}"
    assert {key[0] for key in builds} == {1, 2}, "each fill builds its entries"
    print(
        f"{THREADS} threads x {CALLS} calls over {len(items)} calls' shapes, 2 fills, {sum(builds.values())} "
        f"builds: {len(mismatches)} mismatches, {elapsed:.1f} s"
    )


def _twice(x):
    """A kernel source for a CpuKernel of the test's own (never called: its dispatcher compiles lazily)."""
    return x * 2


def test_each_cache_entry_is_built_once_when_every_thread_misses_at_once(monkeypatch):
    """The two fills alone, with nothing to compile: THREADS threads ask at once for an entry that is
    not there (a fresh kernel's dispatcher; a grouped driver, in an empty table), and a build that takes
    its time lets all of them miss. Each entry is built once and every thread gets that one."""
    builds = collections.Counter()
    real_njit = paths.njit

    def slow_njit(**flags):
        decorate = real_njit(**flags)

        def build(fn):
            builds[f"dispatcher {fn.__module__}.{fn.__qualname__}"] += 1
            time.sleep(0.005)
            return decorate(fn)

        return build

    class SlowKernel(paths.CpuKernel):
        def __init__(self, fn, *args):
            builds[f"driver {fn.__qualname__}"] += 1
            time.sleep(0.005)
            super().__init__(fn, *args)

    monkeypatch.setattr(paths, "njit", slow_njit)
    monkeypatch.setattr(cpu_experts, "CpuKernel", SlowKernel)
    monkeypatch.setattr(cpu_experts, "_compiled", {})
    kernel = paths.CpuKernel(_twice, {}, 0, lambda *args: 0)
    barrier = threading.Barrier(THREADS)
    got = [None] * THREADS

    def ask(t):
        barrier.wait()
        got[t] = (kernel.variant(paths.active().name, True), cpu_experts._driver("tensor"))

    threads = [threading.Thread(target=ask, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(dispatcher) for dispatcher, _ in got}) == 1, "threads got different dispatchers"
    assert len({id(driver) for _, driver in got}) == 1, "threads got different grouped drivers"
    twice = {key: count for key, count in builds.items() if count > 1}
    assert not twice, f"built more than once: {twice}"
    assert builds[f"dispatcher {__name__}._twice_{paths.active().name}_parallel"] == 1


def test_the_thread_pool_starts_once_however_many_threads_ask(monkeypatch):
    """Starting Numba's pool sets and deletes OMP_WAIT_POLICY around the launch (_config.start_threads):
    two threads inside it at once could delete it twice. paths._start_pool runs it once, alone."""
    inside, calls, most = [0], [0], [0]
    lock = threading.Lock()

    def slow_start():
        with lock:
            inside[0] += 1
            calls[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)  # the launch's window, widened
        with lock:
            inside[0] -= 1

    monkeypatch.setattr(paths, "start_threads", slow_start)
    monkeypatch.setitem(paths._pool, "started", False)
    monkeypatch.setitem(paths._pool, "one_region", paths._pool["one_region"])
    barrier = threading.Barrier(THREADS)

    def ask():
        barrier.wait()
        paths._start_pool()

    threads = [threading.Thread(target=ask) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (calls[0], most[0]) == (1, 1)
    assert paths._pool["started"]


_WORKQUEUE_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading
    import numba, numpy as np
    import vtnumba as vt

    x = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
    b = np.random.default_rng(1).integers(0, 0x7E, (256, 512), dtype=np.uint8)
    want = vt.scaled_mm(vt.quantize_fp8(x, per_token=True), b, scale_b=0.5)
    assert numba.threading_layer() == "workqueue", numba.threading_layer()
    barrier, bad = threading.Barrier(8), []

    def work():
        barrier.wait()
        for _ in range(25):
            y = vt.scaled_mm(vt.quantize_fp8(x, per_token=True), b, scale_b=0.5)
            bad.extend([] if np.array_equal(y, want) else [1])

    threads = [threading.Thread(target=work) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print("mismatches", len(bad))
    sys.exit(1 if bad else 0)
    """
)


def test_workqueue_layer_runs_the_threads_regions_one_at_a_time():
    """Numba's workqueue layer (where neither TBB nor OpenMP loads) aborts the process when two threads
    launch parallel regions at once; vtnumba takes them in turn there (paths._REGION_LOCK)."""
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue", VT_CPU_PARALLEL_MIN_WORK="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    res = subprocess.run(
        [sys.executable, "-c", _WORKQUEUE_SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    assert "mismatches 0" in res.stdout
