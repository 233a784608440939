"""The CPU kernels' instruction-set paths, and how a kernel is compiled for one.

Every parallel CPU kernel (``@cpu_kernel``) is one Python source compiled per (path, threads):

- a **path** is what the kernels are compiled for beyond LLVM's defaults on this CPU. One is chosen
  per CPU at import (the first in ``PATHS`` this CPU can run; ``VT_CPU_PATH`` forces another), the
  main command's header names it, and the tests run every path this CPU can run.
- **threads**: a parallel twin (its prange loops spread over Numba's threads) and a serial twin
  (prange runs as range, no parallel region), picked per call by the call's work and the CPUs free
  at that moment (see ``vtnumba._config.CPU_PARALLEL_MIN_MACS`` and ``free_cpus``).

The paths:

- ``avx512`` (x86-64 with AVX-512 F/BW/DQ/VL): the kernels ask LLVM for 512-bit vectors. LLVM's
  tuning for Intel server cores (Skylake-X to Sapphire Rapids and later, its "prefer-256-bit") makes
  the loop vectorizer stop at 256 bits even where AVX-512 is there: read from the generated assembly,
  the M = 1 kernel compiled for ``sapphirerapids`` or ``icelake-server`` used no zmm register at all
  (168 ymm), and for ``znver4``/``znver5`` (AMD's tuning has no such preference) 140 zmm. The decode
  is the same branch-free bit arithmetic; only the vector width differs, so the Intel core does
  twice the work per instruction.
- ``avx512_vbmi`` (AVX-512 with VBMI: Intel Ice Lake and later, AMD Zen 4 and later): the avx512
  path, and at M = 1 (decode, where the decode is the bottleneck) the weight codes are decoded by
  byte-table lookups written as LLVM vector IR (``vbmi.py``): ~22 instructions per 64 weights in
  the compiled loop instead of ~56, 2.2-2.4x the weights per second on one Zen 5 core.
- ``avx512_bf16`` (AVX-512 with VBMI and BF16: AMD Zen 4 and later, Intel Sapphire Rapids and
  later): the avx512_vbmi path, but at M = 1 the looked-up bytes are interleaved into the codes'
  bfloat16 words (an e4m3 value is a bfloat16 exactly) and multiplied by ``vdpbf16ps``, 32 products
  an instruction, in place of the byte expansion and the FMAs (``vbmi.py``, its last section); the
  block-scaled M = 1 kernel takes the same loop per K-block (``block_lookup``).
- ``neon_tbl`` (aarch64; NEON is part of every ARMv8-A core): LLVM's own choices (NEON, or SVE where
  the core has it), and at M = 1 the same byte-lookup decode through ``tbl``/``tbx`` (``neon.py``).
- ``portable``: LLVM's own choices for the host CPU (AVX2 on older x86-64, NEON or SVE on aarch64).
  Runs everywhere.

Each path's kernels see the names in its ``kernel_globals`` in place of the source's:
``vector_width_hint``, an intrinsic the kernels call inside their parallel loop bodies (the function
Numba outlines for the threads is where the vectorizer runs), and ``dot4_e4m3`` / ``dot4_e4m3_mx``,
the byte-lookup inner loops (per-tensor, and MXFP8 with a scale per 32 codes) of a path that has them,
and ``block_lookup`` / ``dot4_e4m3_blocks``, whether the block-scaled M = 1 kernel has one and which,
and ``tile_decode`` / ``tile_lookup``, how the register tiles decode their weight rows and activation
codes (byte lookups on the VBMI paths).
A path's ``register_tiles`` says whether its small-M GEMMs at M >= 16 run ``tile.py``'s register tiles
(the AVX-512 paths) or the 4 x 4 kernels.
"""

import contextlib
import os
import platform
import threading
import types
from dataclasses import dataclass, field

from llvmlite import ir
from numba import njit
from numba.core import cgutils
from numba.core import types as nbtypes
from numba.extending import intrinsic

from .._config import (
    CPU_INLINE,
    CPU_KERNEL,
    CPU_SERIAL_KERNEL,
    blas_threads,
    free_cpus,
    kernel_threads,
    on_torch_team,
    parallel_min_work,
    start_threads,
    thread_cap,
)
from . import neon, tile, vbmi


def _width_hint(bits):
    """An intrinsic that sets LLVM's "prefer-vector-width" on the function it is called in (the loop
    vectorizer's width for that function), or does nothing when ``bits`` is None."""

    @intrinsic
    def hint(typingctx):
        def codegen(context, builder, signature, args):
            if bits is not None:
                # llvmlite's attribute set checks names against its list of keyword attributes;
                # a string attribute ("key"="value") is written into the IR as it is given
                set.add(builder.function.attributes, f'"prefer-vector-width"="{bits}"')
            return context.get_dummy_value()

        return nbtypes.none(), codegen

    return hint


@dataclass(frozen=True)
class CpuPath:
    """One way to compile the CPU kernels: its name, what it does, the LLVM CPU features it needs,
    and the globals its kernels see in place of the source's."""

    name: str
    summary: str
    requires: tuple = ()
    kernel_globals: dict = field(default_factory=dict, hash=False, compare=False)
    byte_lookup_decode: bool = False  # the M = 1 GEMM decodes by table lookups (vbmi.py, neon.py)
    register_tiles: bool = False  # the small-M GEMMs run tile.py's register tiles (M >= tile.MIN_ROWS)
    machines: tuple = ()  # platform.machine() values it is for (empty: any)

    def missing(self, features, machine=None):
        """What this CPU lacks for the path: required features (``features``: the set LLVM reports),
        or the architecture (``machine``: platform.machine(), this host's by default)."""
        machine = platform.machine() if machine is None else machine
        if self.machines and machine not in self.machines:
            return [f"an {'/'.join(self.machines)} CPU (this is {machine})"]
        return [f for f in self.requires if f not in features]


_AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl")
PATHS = (
    CpuPath(
        "avx512_bf16",
        "the avx512_vbmi path's lookups, and at M = 1 their bfloat16 words into vdpbf16ps dot products",
        _AVX512 + ("avx512vbmi", "avx512bf16"),
        {
            "vector_width_hint": _width_hint(512),
            "dot4_e4m3": vbmi.dot4_e4m3_bf16,
            "dot4_e4m3_mx": vbmi.dot4_e4m3_mx,
            "block_lookup": True,
            "dot4_e4m3_blocks": vbmi.dot4_e4m3_blocks_bf16,
            "tile_decode": tile.decode_block_lookup,
            "tile_lookup": True,
        },
        byte_lookup_decode=True,
        register_tiles=True,
    ),
    CpuPath(
        "avx512_vbmi",
        "the avx512 path, and at M = 1 a byte-lookup decode (vpermi2b) into FMAs",
        _AVX512 + ("avx512vbmi",),
        {
            "vector_width_hint": _width_hint(512),
            "dot4_e4m3": vbmi.dot4_e4m3,
            "dot4_e4m3_mx": vbmi.dot4_e4m3_mx,
            "tile_decode": tile.decode_block_lookup,
            "tile_lookup": True,
        },
        byte_lookup_decode=True,
        register_tiles=True,
    ),
    CpuPath(
        "avx512",
        "512-bit vectors asked of LLVM (its Intel tuning stops at 256); bit-arithmetic decode",
        _AVX512,
        {"vector_width_hint": _width_hint(512)},
        register_tiles=True,
    ),
    CpuPath(
        "neon_tbl",
        "LLVM's own vector choices, and at M = 1 a byte-lookup decode (NEON tbl/tbx) into fmla",
        (),
        {"vector_width_hint": _width_hint(None), "dot4_e4m3": neon.dot4_e4m3},
        byte_lookup_decode=True,
        machines=("aarch64", "arm64"),
    ),
    CpuPath(
        "portable",
        "LLVM's own vector choices for this CPU; bit-arithmetic decode",
        (),
        {"vector_width_hint": _width_hint(None)},
    ),
)
_BY_NAME = {p.name: p for p in PATHS}
# What the kernels' source calls; a path's kernel_globals replace it (the plain name keeps the source
# valid Python and valid Numba code on its own: the portable behaviour).
vector_width_hint = _width_hint(None)


@njit(**CPU_INLINE)
def team_runs(items):
    """How many runs a kernel cuts its ``items`` into, one a thread: 1 here, in the serial twins (and
    plain Python); the parallel twins see ``_parallel_runs`` under this name (``CpuKernel.variant``)."""
    return 1 if items > 0 else 0


@intrinsic
def _region_threads(typingctx):
    """Numba's thread-local thread count (what ``numba.get_num_threads()`` returns), read by calling
    the threading layer's ``get_num_threads`` symbol, as Numba's own ``_iget_num_threads``
    (numba/np/ufunc/parallel.py) does: ``numba.get_num_threads`` inside compiled code calls it
    through a ctypes pointer, a dynamic global that keeps the kernel out of Numba's disk cache."""

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(cgutils.intp_t, []), "get_num_threads")
        return builder.call(fn, [])

    return nbtypes.intp(), codegen


@njit(**CPU_INLINE)
def _parallel_runs(items):
    """``team_runs`` of a parallel twin: the thread count this call's region runs on (Numba's
    thread-local count, which ``CpuKernel._parallel`` sets), at most ``items``."""
    return min(_region_threads(), items)


def host_features():
    """The CPU features LLVM sees on this host (Numba's NUMBA_CPU_FEATURES, when set, wins, as it does
    for the code Numba generates)."""
    from numba.core import config

    if config.CPU_FEATURES:
        return {f[1:] for f in config.CPU_FEATURES.split(",") if f.startswith("+")}
    import llvmlite.binding as ll

    try:
        return {name for name, on in ll.get_host_cpu_features().items() if on}
    except RuntimeError:  # LLVM cannot tell on this host (numba then compiles with no extra features)
        return set()


def runnable(features=None, machine=None):
    """The paths this CPU can run, in preference order."""
    features = host_features() if features is None else features
    return [p for p in PATHS if not p.missing(features, machine)]


def choose(features=None, forced=None, machine=None):
    """The path for this CPU: ``forced`` (VT_CPU_PATH) when given, else the first runnable one."""
    if forced:
        if forced not in _BY_NAME:
            raise ValueError(f"VT_CPU_PATH must be one of {', '.join(_BY_NAME)}, got {forced!r}")
        path = _BY_NAME[forced]
        missing = path.missing(host_features() if features is None else features, machine)
        if missing:
            raise ValueError(
                f"VT_CPU_PATH must name a path this CPU can run, got {forced!r} "
                f"(this CPU lacks {', '.join(missing)}); unset it to let vtnumba choose"
            )
        return path
    return runnable(features, machine)[0]


_active = choose(forced=os.environ.get("VT_CPU_PATH") or None)


def active():
    """The path the CPU kernels run now."""
    return _active


def takes_register_tiles(m):
    """Whether M = m activation rows run tile.py's register tiles on the active path: on a path that has
    them (``CpuPath.register_tiles``) from ``tile.MIN_ROWS`` rows; below, the 4 x 4 kernels stay."""
    return _active.register_tiles and m >= tile.MIN_ROWS


@contextlib.contextmanager
def use(name):
    """Run the CPU kernels on path ``name`` inside the block (the tests run every runnable path). The
    path is the process's: calls from other threads inside the block run on it too."""
    global _active
    previous, _active = _active, choose(forced=name)
    try:
        yield _active
    finally:
        _active = previous


# Threads. Every call may come from any Python thread (a model's layers served by a thread pool), so
# what the CPU path keeps between calls is filled under a lock and read without one:
# - BUILD_LOCK: the dispatchers of CpuKernel._variants (and vtnumba.cpu.experts' grouped drivers) are
#   made under it and published by one dict assignment; a reader that finds its key takes the published
#   dispatcher without the lock. Without it two threads that miss together each make a dispatcher, and
#   each compiles (or loads from the disk cache) its own copy of the kernel.
# - Numba compiles a dispatcher's signature under its own global compiler lock (Dispatcher.compile
#   takes numba.core.compiler_lock.global_compiler_lock and looks the signature up again inside it),
#   so concurrent first calls of one dispatcher compile once.
# - _POOL_LOCK: starting Numba's thread pool (vtnumba._config.start_threads) sets and then deletes
#   OMP_WAIT_POLICY around the launch; two threads starting it at once would both delete it (KeyError).
# - Numba's "workqueue" threading layer (the fallback where neither TBB nor OpenMP loads, e.g. macOS
#   wheels without libomp) runs one parallel region per process: a second thread launching one
#   aborts the process ("Concurrent access has been detected"). There, parallel twins take
#   _REGION_LOCK in turn; with OpenMP or TBB (thread-safe layers) they run side by side.
BUILD_LOCK = threading.RLock()
_POOL_LOCK = threading.Lock()
_REGION_LOCK = threading.Lock()
# written once, under _POOL_LOCK: "get" and "set" are this thread's count of Numba threads, read and
# written by the threading layer's own calls once the pool has started (numba.get_num_threads and
# set_num_threads take Numba's launch locks, one of them a multiprocessing lock, at every call: inside
# a converted tiny Llama's forward, the thread decisions of its 15 layers cost 0.3-0.6 ms of a 3-4 ms
# forward, benchmarks/RESULTS.md, 2026-12-07 15:35-15:56)
_pool = {"started": False, "one_region": False, "get": None, "set": None}


def _start_pool():
    """Start Numba's thread pool once, and note whether its threading layer runs one region at a time."""
    if _pool["started"]:
        return
    with _POOL_LOCK:
        if _pool["started"]:
            return
        start_threads()
        import numba

        try:
            _pool["one_region"] = numba.threading_layer() == "workqueue"
        except ValueError:  # no layer launched (cannot happen after start_threads): assume the unsafe one
            _pool["one_region"] = True
        from numba.np.ufunc import parallel

        get, put = getattr(parallel, "_get_num_threads", None), getattr(parallel, "_set_num_threads", None)
        if get is None or put is None:  # another Numba's internals: its public calls
            get, put = numba.get_num_threads, numba.set_num_threads
        _pool["get"], _pool["set"] = get, put
        _pool["started"] = True


def _on_torch_team():
    """Whether this process's Numba regions run on torch's OpenMP workers (asked inside a torch
    forward only; the pool is started first, which is when vtnumba finds out)."""
    _start_pool()
    return on_torch_team()


def _pool_threads():
    """Numba's thread count, its pool started first: asked only when a parallel twin may run, so a
    serial-only process never starts the pool."""
    _start_pool()
    return _pool["get"]()


class CpuKernel:
    """One CPU kernel source, compiled lazily per (path, parallel or serial). A call picks the active
    path, and the serial twin when the call's work (``work(*args)``) is below the threshold or Numba
    has one thread. Each variant has a qualified name of its own, since Numba's disk cache keys a
    function by module, name and bytecode, not by its compile flags or globals."""

    def __init__(self, fn, flags, min_work, work):
        self.py_func, self.flags, self.min_work, self.work = fn, flags, min_work, work
        self._variants = {}
        self.__name__, self.__qualname__, self.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__

    def variant(self, path_name, parallel):
        """The Numba dispatcher of this kernel for a path, parallel or serial (made once, under
        BUILD_LOCK, whichever threads ask first)."""
        key = (path_name, parallel)
        found = self._variants.get(key)
        if found is not None:
            return found
        with BUILD_LOCK:
            found = self._variants.get(key)
            if found is None:
                fn, path = self.py_func, _BY_NAME[path_name]
                namespace = dict(fn.__globals__)
                namespace.update(path.kernel_globals)
                if parallel:
                    namespace["team_runs"] = _parallel_runs
                suffix = f"_{path_name}_{'parallel' if parallel else 'serial'}"
                twin = types.FunctionType(fn.__code__, namespace, fn.__name__ + suffix, fn.__defaults__, fn.__closure__)
                twin.__qualname__ = fn.__qualname__ + suffix
                twin.__module__ = fn.__module__
                found = njit(**dict(CPU_KERNEL if parallel else CPU_SERIAL_KERNEL, **self.flags))(twin)
                self._variants[key] = found
        return found

    @property
    def parallel(self):
        return self.variant(_active.name, True)

    @property
    def serial(self):
        return self.variant(_active.name, False)

    def threads_for(self, *args):
        """Numba threads a call with these arguments gets: 1 (the serial twin) below the work threshold,
        with one Numba thread, or when no other CPU is free now (``_config.free_cpus``); else Numba's
        thread count, capped by the CPUs free now and, inside a torch forward, by torch's thread
        count (``_config.kernel_threads``). VT_CPU_PARALLEL_MIN_WORK=0 takes every thread."""
        return kernel_threads(self.work(*args), self.min_work, _pool_threads, free_cpus, _on_torch_team)

    def runs_parallel(self, *args):
        """Whether a call with these arguments takes the parallel twin."""
        return self.threads_for(*args) > 1

    def __call__(self, *args):
        return self.call_with(self.threads_for(*args), *args)

    def call_with(self, threads, *args):
        """The call on ``threads`` Numba threads (its serial twin below 2), as ``threads_for`` or the
        caller decided."""
        if threads < 2:
            return self.variant(_active.name, False)(*args)
        if _pool["one_region"]:
            with _REGION_LOCK:
                return self._parallel(threads, args)
        return self._parallel(threads, args)

    def _parallel(self, threads, args):
        _start_pool()
        before = _pool["get"]()
        if threads >= before:
            return self.variant(_active.name, True)(*args)
        _pool["set"](threads)  # this thread's count for its parallel regions (thread-local), below before
        try:
            return self.variant(_active.name, True)(*args)
        finally:
            _pool["set"](before)


def team_blas_threads(kernel, *args):
    """Numba threads for a kernel whose parallel twin shares its sgemm calls among Numba's threads, one
    BLAS thread each (the blas kernels): ``kernel.threads_for`` inside a torch forward whose OpenMP
    team Numba's regions run on, else 1 (the serial twin, whose sgemm brings the BLAS's own threads).
    Inside the forward torch's workers spin between ops: OpenBLAS's pool of its own, woken there,
    waits behind them (vtnumba._config, "who owns the cores"), so the sgemm stayed on one thread while
    float32 torch used every core; the team's workers are awake and are the cores torch gives."""
    if thread_cap() is None or not _on_torch_team():
        return 1
    return kernel.threads_for(*args)


def team_panel_rows(n, panel_rows, threads):
    """Weight rows per panel for ``threads`` threads sharing N rows: at most ``panel_rows``, and few
    enough that every thread has a panel (a multiple of 16, sgemm's friend)."""
    share = -(-n // threads)  # ceil(N / threads)
    return min(panel_rows, -(-share // 16) * 16)


def run_sgemm_driver(kernel, work_args, n, panel_rows, sgemm_macs, call):
    """Run a blas kernel (a driver around sgemm calls over weight panels, dealt to ``slots``):
    ``call(threads, panel_rows)`` runs it. Inside a torch forward on torch's team
    (``team_blas_threads`` of ``work_args``) Numba's threads share the panels, made small enough to
    go round, with one BLAS thread each; elsewhere the serial driver, its sgemm calls (of
    ``sgemm_macs`` multiply-adds each) taking the BLAS threads ``blas_threads`` gives them."""
    threads = team_blas_threads(kernel, *work_args)
    if threads > 1:
        with blas_threads(None):
            return call(threads, team_panel_rows(n, panel_rows, threads))
    with blas_threads(sgemm_macs):
        return call(1, panel_rows)


def cpu_kernel(min_work, work, **flags):
    """Decorator: a CpuKernel with its work threshold, its work as a function of the call's arguments,
    and extra Numba ``flags`` (fastmath, ...)."""
    return lambda fn: CpuKernel(fn, flags, min_work, work)


def _cpu_model():
    """The CPU's marketing name (Linux /proc/cpuinfo), else the platform's word for it."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model name", "cpu model", "Hardware"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def vector_isa(features=None):
    """The widest vector instruction set LLVM can use here, in words."""
    features = host_features() if features is None else features
    for feature, name in (
        ("avx512f", "AVX-512"),
        ("avx2", "AVX2"),
        ("sve2", "SVE2"),
        ("sve", "SVE"),
        ("neon", "NEON"),
        ("sse4.2", "SSE4.2"),
    ):
        if feature in features:
            return name
    import platform

    return "NEON" if platform.machine() in ("aarch64", "arm64") else "baseline"


def describe():
    """What the CPU kernels run on here, for the main command's header and reports: the CPU, the
    path chosen and the others this CPU can run, the threads and the one-thread thresholds."""
    import platform

    import llvmlite.binding as ll
    from numba.core import config

    from .. import _config

    features = host_features()
    return dict(
        model=_cpu_model(),
        machine=platform.machine(),
        llvm_cpu=config.CPU_NAME or ll.get_host_cpu_name(),
        cores=os.cpu_count(),
        vector_isa=vector_isa(features),
        path=_active.name,
        path_summary=_active.summary,
        runnable_paths=[p.name for p in runnable(features)],
        numba_threads=int(config.NUMBA_NUM_THREADS),
        serial_below_macs=parallel_min_work(_config.CPU_PARALLEL_MIN_MACS),
        serial_below_elements=parallel_min_work(_config.CPU_PARALLEL_MIN_ELEMENTS),
    )


def header_line(info=None):
    """The main command's CPU header, one line."""
    d = describe() if info is None else info
    return (
        f"CPU: {d['model']} ({d['llvm_cpu']}, {d['cores']} cores, {d['vector_isa']}); kernels: path "
        f"{d['path']} ({d['path_summary']}; runnable here: {', '.join(d['runnable_paths'])}); Numba threads "
        f"{d['numba_threads']}, one thread below {d['serial_below_macs']:,} multiply-adds / "
        f"{d['serial_below_elements']:,} elements"
    )
