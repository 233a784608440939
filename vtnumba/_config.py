"""Every Numba flag vtnumba uses, in one place.

Kernels are compiled lazily (nothing compiles at import) and cached on disk, so the first call in a
fresh process with a warm cache loads machine code instead of compiling it.
"""

import os
import sys
import threading
import time
from typing import Any

# VT_NUMBA_CACHE=0 turns the on-disk cache off (useful when bisecting a kernel change).
_CACHE = not os.environ.get("VT_NUMBA_CACHE", "1").startswith("0")
if _CACHE:
    # a cached kernel goes stale when any module of the package changes, not only its own
    # (_kernel_cache.py says why)
    from . import _kernel_cache

    _kernel_cache.install()

# Scalar helpers are inlined into every kernel that calls them (Numba IR inlining, so the loop
# around them stays one vectorizable body).
CPU_INLINE: dict[str, Any] = dict(inline="always")
# Element-wise kernels: exact IEEE arithmetic (no fastmath: the encoder's float32 rounding tricks
# depend on it), parallel over both cores, cached.
# error_model="numpy": float division follows IEEE (x / 0 -> inf) instead of Python's
# ZeroDivisionError, whose per-element check kept the per-token divide loop from vectorizing.
CPU_KERNEL: dict[str, Any] = dict(parallel=True, cache=_CACHE, nogil=True, error_model="numpy")
CPU_SERIAL_KERNEL: dict[str, Any] = dict(cache=_CACHE, nogil=True, error_model="numpy")
# A function called from a fast-math kernel that must keep IEEE order and roundings: a callee compiles
# with its caller's fastmath flags unless it sets its own (numba's TargetConfig "inherit_if_not_set"),
# which silently reassociated the block-scaled GEMM's sum over K-blocks.
CPU_STRICT_FUNCTION: dict[str, Any] = dict(CPU_SERIAL_KERNEL, fastmath=False)

# Elements per parallel work item of the element-wise CPU kernels: large enough that the inner loop
# vectorizes and threads do not share cache lines, small enough to balance two cores.
CPU_CHUNK = 1 << 16


if os.name == "posix" and isinstance(getattr(os.environ, "_data", None), dict):
    _ENVIRON_BYTES = os.environ._data  # type: ignore[attr-defined]  # os.environ's own store (bytes keys): ~0.05 us a lookup, not ~0.5

    def kernel_settings():
        """The environment settings that steer the GPU kernel choice, read now: (VT_DENSE_CUBLASLT_FP8,
        VT_DISABLE_KERNELS, VT_DECODE_PATH) as set (None when unset). A call bound under other settings
        is not reused."""
        get = _ENVIRON_BYTES.get
        return get(b"VT_DENSE_CUBLASLT_FP8"), get(b"VT_DISABLE_KERNELS"), get(b"VT_DECODE_PATH")
else:

    def kernel_settings():
        """As above, through os.environ."""
        get = os.environ.get
        return get("VT_DENSE_CUBLASLT_FP8"), get("VT_DISABLE_KERNELS"), get("VT_DECODE_PATH")


def dense_cublaslt_fp8_enabled() -> bool:
    """The lever (the C++ seam's DenseCublasLtFp8Enabled): env VT_DENSE_CUBLASLT_FP8, read at every
    call so a test or a notebook can flip it live. On by default; any value whose first character is
    '0' turns cuBLASLt off and routes GPU GEMMs to the Numba kernels."""
    return not os.environ.get("VT_DENSE_CUBLASLT_FP8", "1").startswith("0")


# How a linear layer's call at decode (M <= 16 rows) is bound on the GPU
# (docs/DESIGN.md, "Decode: one launch in eager"):
# - 'auto' (the default): eager calls, where the GPU waits on the host, take the one fused launch
#   (the tensor-core GEMV quantizes x as it reads it); calls captured into a CUDA graph, where only
#   device time counts, take the quantization kernel and the GEMM the kernel choice picks (cuBLASLt).
# - 'fused': the fused launch in both regimes (eager and a graph then give the same bytes).
# - 'split': the quantization and the chosen GEMM in both regimes (the choice before 2026-12-02).
DECODE_PATHS = ("auto", "fused", "split")


def disabled_kernels():
    """Kernel names in VT_DISABLE_KERNELS (comma-separated), read at every call."""
    value = os.environ.get("VT_DISABLE_KERNELS", "")
    return {name.strip() for name in value.split(",") if name.strip()} if value else ()


def decode_path() -> str:
    """VT_DECODE_PATH, read now: 'auto' (unset or empty), 'fused' or 'split'."""
    value = os.environ.get("VT_DECODE_PATH") or "auto"
    if value not in DECODE_PATHS:
        raise ValueError(f"VT_DECODE_PATH must be one of {', '.join(DECODE_PATHS)}, got {value!r}")
    return value


# -- threads ---------------------------------------------------------------------------------------

# Work below which a CPU kernel runs on the calling thread alone (multiply-adds for a GEMM, elements
# for an element-wise kernel). Waking a passive worker (below) costs 10-150 us on the 2-core VM this
# was measured on (benchmarks/cpu/bench_cpu_threads.py, serial vs parallel twin, medians, a machine shared
# with other jobs): the parallel twin ran at 0.45-0.55x the serial time whenever the second core was
# free, and up to 150 us slower when its worker woke late. The thresholds put that worst case under
# about half the serial time: 4 Mi multiply-adds (~250 us serial at M = 1) and 2 Mi elements (~180
# us serial). Above them a call takes as many threads as CPUs are free at that moment (free_cpus), one
# when none is. VT_CPU_PARALLEL_MIN_WORK overrides both (0: always parallel, on all of Numba's
# threads, loaded or not; a huge value: one thread); NUMBA_NUM_THREADS or numba.set_num_threads()
# caps the thread count.
CPU_PARALLEL_MIN_MACS = 1 << 22
CPU_PARALLEL_MIN_ELEMENTS = 1 << 21

# Numba's OpenMP workers spin after each parallel region unless told to wait passively (libgomp's
# OMP_WAIT_POLICY, read once when libgomp loads, which is when Numba starts its thread pool). Beside
# numpy's OpenBLAS workers or another busy process, two cores then held three or four spinning
# threads: the parallel twin of the M = 1 kernel took a median of 6.7 ms where the serial one took
# 1.3 ms (N = K = 4096, two cores), and a small 16x32x64 layer beside numpy took 12-16 ms instead of
# 56 us. With PASSIVE the parallel twins never fell behind the serial ones by more than the ~10 us
# start-up. So vtnumba starts Numba's pool with PASSIVE unless the user set OMP_WAIT_POLICY, and
# restores the environment after (other OpenMP runtimes loaded later do not inherit the choice).
_threads_started = False


def start_threads():
    """Start Numba's thread pool (once), with passive OpenMP workers unless OMP_WAIT_POLICY is set."""
    global _threads_started
    if _threads_started:
        return
    import numba
    from numba.np.ufunc import parallel

    set_here = "OMP_WAIT_POLICY" not in os.environ and not parallel._is_initialized
    if set_here:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    # With torch imported first, Numba's OpenMP layer binds to the libgomp torch loaded (one runtime:
    # Numba's regions then run on torch's intra-op workers), and launching the pool sets that
    # runtime's thread count to NUMBA_NUM_THREADS: torch.set_num_threads(1) became 2, or torch's 2
    # became 1 under NUMBA_NUM_THREADS=1. The user's torch setting is put back.
    torch = sys.modules.get("torch")
    torch_threads = torch.get_num_threads() if torch is not None else None
    launching = not parallel._is_initialized
    try:
        numba.get_num_threads()  # launches the pool: libgomp reads its environment now
    finally:
        if set_here:
            del os.environ["OMP_WAIT_POLICY"]
        if torch_threads is not None and torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
    if torch is not None and launching:
        _torch_team[0] = numba.threading_layer() == "omp" and _global_openmp_is_torchs(torch)
    _threads_started = True


# Whether Numba's parallel regions run on torch's OpenMP runtime (so on the same worker threads as
# torch's ops), as start_threads found when it launched Numba's pool with torch imported; False
# when it could not tell (torch imported after the pool started: two runtimes then).
_torch_team = [False]


def _global_openmp_is_torchs(torch):
    """Whether the OpenMP runtime the process's global symbol scope provides (which Numba's OpenMP
    layer, loaded after torch, binds to) is the one torch ships and loads (torch/lib/libgomp*, or
    libiomp*), or torch ships none (it then uses that global one too). Checking this changes no
    thread count: setting torch's to probe it slowed float32 torch forwards 2x after (libgomp's pool
    had grown a thread)."""
    import ctypes

    try:
        found = ctypes.cast(ctypes.CDLL(None).omp_get_max_threads, ctypes.c_void_p).value
    except (AttributeError, OSError):
        return False
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    try:
        names = sorted(n for n in os.listdir(lib_dir) if n.startswith(("libgomp", "libiomp")))
    except OSError:
        names = []
    for name in names:
        try:
            # RTLD_NOLOAD: only a library torch loaded already
            own = ctypes.CDLL(os.path.join(lib_dir, name), mode=os.RTLD_NOLOAD | os.RTLD_NOW)
            if ctypes.cast(own.omp_get_max_threads, ctypes.c_void_p).value == found:
                return True
        except (AttributeError, OSError):
            continue
    return not names


def on_torch_team():
    """Whether Numba's parallel regions run on torch's OpenMP workers (``start_threads``'s finding)."""
    return _torch_team[0]


def free_cpus():
    """CPUs free for more threads now: the CPU count less the tasks running or waiting to run, this
    one excepted (Linux's /proc/loadavg, whose fourth field counts them at the moment it is read);
    None where that cannot be read. A parallel region beside a busy process waits for a CPU that
    process holds: on two cores, the main command's layers took 3-19x their idle time with one busy
    process beside them when every parallel-sized call went parallel (benchmarks/cpu/bench_cpu_threads.py
    --main), where the serial twin keeps them near its own time."""
    now = time.monotonic_ns()
    taken, free = _free_seen[0]
    if now - taken < FREE_CPUS_FRESH_NS:
        return free
    try:
        running = int(_read_loadavg().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        free = None
    else:
        free = _CPUS - (running - 1)
    _free_seen[0] = (now, free)  # one tuple, replaced whole: threads read a reading and its time together
    return free


# How long a reading of free_cpus serves the calls after it: a converted layer asks before its quantizer
# and before its GEMM, so the tiny Llama's 3-4 ms forward read /proc/loadavg 30 times, 5-7 us a read
# there (the system call made with the kernels' data in the caches; 1.7 us in a loop of reads):
# 0.15-0.22 ms of the forward (benchmarks/RESULTS.md, 2026-12-07 15:35-15:56). A process that starts
# beside the kernels is seen within this time.
FREE_CPUS_FRESH_NS = 1_000_000
_free_seen = [(-FREE_CPUS_FRESH_NS, None)]  # (time.monotonic_ns() of the reading, its free count)


# The CPU count, read once: os.cpu_count() reads /sys/devices/system/cpu/online at every call (5.8 us).
_CPUS = os.cpu_count() or 1
# /proc/loadavg held open and re-read with pread (the kernel regenerates it at every read from offset
# 0): 1.7 us a read where open, read and close took 10-19 us (2-core VM, the second figure with a
# busy process beside it). free_cpus runs before every parallel-sized kernel call, twice in a
# one-token MoE layer. pread keeps no file position, so threads and forked children share the fd.
_loadavg_fd = [-1]


def _read_loadavg():
    fd = _loadavg_fd[0]
    if fd >= 0:
        try:
            return os.pread(fd, 128, 0)
        except OSError:
            pass  # closed under us (a daemon closing every fd): open it again
    fd = os.open("/proc/loadavg", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    _loadavg_fd[0] = fd
    return os.pread(fd, 128, 0)


def parallel_min_work(default):
    """The work threshold in force: VT_CPU_PARALLEL_MIN_WORK when set, else ``default``."""
    value = os.environ.get("VT_CPU_PARALLEL_MIN_WORK")
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"VT_CPU_PARALLEL_MIN_WORK must be an integer, got {value!r}") from None


# -- who owns the cores inside a torch model ---------------------------------------------------------
# Three thread pools can meet in one process: torch's intra-op pool (OpenMP), Numba's (OpenMP; the
# same runtime as torch's when torch was imported first) and the BLAS that Numba's np.dot calls inside
# vtnumba's kernels (scipy's OpenBLAS, a pthreads pool of its own). torch's OpenMP workers spin after
# each op (libgomp's default wait policy, read when torch loads, before vtnumba can say otherwise);
# OpenBLAS's workers, woken for every sgemm above a few hundred thousand multiply-adds, then queued
# behind them. On two cores a converted tiny Qwen3-MoE at 128 tokens took 62-72 ms (per_group) where
# float32 torch took 14 ms; a 128 x 256 x 256 block-scaled layer took 68 ms with two BLAS threads
# and 0.7 ms with one (benchmarks/cpu/bench_cpu_threads.py --torch).
# So while a vtnumba kernel runs inside a torch forward, torch owns the cores: the forward caps
# vtnumba's threads at torch.get_num_threads() (``torch_thread_cap``), which also caps the BLAS
# threads; and BLAS gets more than one thread only for sgemm calls worth waking workers for
# (CPU_BLAS_MIN_MACS each) when that many CPUs are free (``free_cpus``). The BLAS thread count is
# set around each call and put back to what it was (the user's) after.
CPU_BLAS_MIN_MACS = 1 << 24

# Numba's own kernels inside a torch forward, when Numba's regions run on torch's OpenMP runtime
# (``on_torch_team``): between torch's ops torch's workers spin (libgomp's default wait policy), so
# /proc/loadavg counts them as running and free_cpus saw no free CPU on an idle 2-core machine: every
# vtnumba kernel of a converted model ran on one thread while float32 torch used both cores. Those
# workers are the very threads a Numba region then runs on, and already awake: right after a torch
# op the parallel twins took 0.53-0.61x the serial time from 1 Mi multiply-adds (small_m GEMM, 16 x
# 256 x 256: 19.8 against 34.8 us) and from 128 Ki elements (quantize_static: 15.6 against 25.8 us),
# where the start-up of a sleeping team costs 10-150 us (the thresholds above). So there a kernel
# counts torch's other workers as its own, not as load (``kernel_threads(team=...)``), and goes
# parallel from thresholds 16x lower (256 Ki multiply-adds, 128 Ki elements). The BLAS inside the
# kernels keeps the rule above: its workers are a pool of their own, which the spinning ones delay;
# so the blas kernels share their weight panels among the team instead, one BLAS thread each
# (vtnumba.cpu.paths.run_sgemm_driver).
CPU_TORCH_TEAM_SHIFT = 4


class _Local(threading.local):
    cap = None  # a class default: reading a missing attribute of a threading.local raised inside, 0.4 us


_local = _Local()  # .cap: this Python thread's thread cap inside a torch forward, or None


def thread_cap():
    """The cap on this Python thread's kernel threads now (a torch forward's torch.get_num_threads()),
    or None outside one."""
    return getattr(_local, "cap", None)


class torch_thread_cap:
    """``with torch_thread_cap(n):`` caps this Python thread's vtnumba kernel threads (Numba's and
    BLAS's) at ``n`` inside the block; nested caps keep the smallest. A class, not a generator
    context manager: it wraps every CPU forward of a converted layer, a few microseconds each."""

    __slots__ = ("n", "before")

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.before = before = getattr(_local, "cap", None)
        _local.cap = self.n if before is None else min(before, self.n)
        return self

    def __exit__(self, *exc):
        _local.cap = self.before


def kernel_threads(work, min_work, threads, free_now=None, team=None):
    """Threads a kernel call of ``work`` gets, of ``threads`` available (a count, or a function giving
    it, called only above the threshold: Numba's pool then starts only when a parallel twin may run):
    1 below ``min_work`` (as ``parallel_min_work`` sets it), else ``threads`` capped by this thread's
    cap (``thread_cap``) and by the CPUs free now (``free_now()``, ``free_cpus`` by default; not
    looked at when the threshold is 0: every thread, loaded or not).

    ``team`` (a function, asked only inside a torch forward): whether the call's threads are torch's
    OpenMP workers (a Numba kernel, ``on_torch_team``). Then the threshold is ``min_work`` >>
    CPU_TORCH_TEAM_SHIFT and torch's other ``cap - 1`` workers count as free, not as load (see the
    note above CPU_TORCH_TEAM_SHIFT); VT_CPU_PARALLEL_MIN_WORK, when set, is the threshold still."""
    knob = os.environ.get("VT_CPU_PARALLEL_MIN_WORK")
    if knob:
        min_work = parallel_min_work(min_work)
    cap = _local.cap
    if work < min_work:
        # the one-thread path first: a call outside a torch forward pays nothing more for the team
        if knob or cap is None or cap < 2 or team is None or work < min_work >> CPU_TORCH_TEAM_SHIFT or not team():
            return 1
        own = True
    else:
        own = cap is not None and cap > 1 and team is not None and team()
    if callable(threads):
        threads = threads()
    if cap is not None:
        threads = min(threads, cap)
    free = None if min_work == 0 else (free_now or free_cpus)()
    if free is not None and own:
        free += cap - 1
    return threads if free is None else max(1, min(threads, free))


class _Blas:
    """The thread count of the BLAS Numba's np.dot calls (scipy.linalg.cython_blas's library), found
    once: (get, set) ctypes functions, or None where that BLAS has no such call (then vtnumba leaves
    its threads alone)."""

    calls: Any = False  # False: not looked for yet

    @classmethod
    def find(cls):
        if cls.calls is False:
            cls.calls = None
            try:
                import ctypes

                import scipy.linalg.cython_blas as cython_blas

                lib = ctypes.CDLL(cython_blas.__file__)  # dlsym searches its dependencies: the BLAS
                for prefix in ("scipy_openblas", "openblas", "scipy_openblas64_"):
                    get = getattr(lib, f"{prefix}_get_num_threads", None)
                    put = getattr(lib, f"{prefix}_set_num_threads", None)
                    if get is not None and put is not None:
                        get.restype, get.argtypes = ctypes.c_int, []
                        put.restype, put.argtypes = None, [ctypes.c_int]
                        cls.calls = (get, put)
                        break
            except (ImportError, OSError):
                pass
        return cls.calls


_blas_lock = threading.Lock()
_blas_users = [0, None]  # Python threads inside blas_threads, the count to restore when the last leaves


class blas_threads:
    """``with blas_threads(macs_per_call):`` the BLAS calls inside a vtnumba kernel get the threads
    ``kernel_threads`` gives ``macs_per_call`` (each sgemm's multiply-adds) against
    CPU_BLAS_MIN_MACS, of the count the BLAS had before (the user's: OPENBLAS_NUM_THREADS, or every
    CPU); that count comes back when the last Python thread inside leaves. The count is the
    process's (OpenBLAS has no per-thread one): threads that overlap share the last one set, which
    changes the speed only (sgemm splits rows and columns, never a sum)."""

    __slots__ = ("macs",)

    def __init__(self, macs_per_call):
        self.macs = macs_per_call  # None: one thread (each of Numba's threads calls sgemm itself)

    def __enter__(self):
        calls = _Blas.find()
        if calls is not None:
            get, put = calls
            with _blas_lock:
                if _blas_users[0] == 0:
                    _blas_users[1] = get()
                _blas_users[0] += 1
                users_count = _blas_users[1]
            threads = 1 if self.macs is None else kernel_threads(self.macs, CPU_BLAS_MIN_MACS, users_count)
            if get() != threads:
                put(threads)
        return self

    def __exit__(self, *exc):
        calls = _Blas.find()
        if calls is not None:
            get, put = calls
            with _blas_lock:
                _blas_users[0] -= 1
                if _blas_users[0] == 0 and get() != _blas_users[1]:
                    put(_blas_users[1])
