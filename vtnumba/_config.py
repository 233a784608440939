"""Every Numba flag vtnumba uses, in one place.

Kernels are compiled lazily (nothing compiles at import) and cached on disk, so the first call in a
fresh process with a warm cache loads machine code instead of compiling it.
"""

import os
from typing import Any

# VT_NUMBA_CACHE=0 turns the on-disk cache off (useful when bisecting a kernel change).
_CACHE = not os.environ.get("VT_NUMBA_CACHE", "1").startswith("0")

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


# How a linear layer's call at decode (M <= 16 rows) is bound on the GPU (docs/DESIGN.md, "Decode:
# one launch in eager, the fastest kernels in a graph"):
# - 'auto' (the default): eager calls, where the GPU waits on the host, take the one fused launch
#   (the tensor-core GEMV quantizes x as it reads it); calls captured into a CUDA graph, where only
#   device time counts, take the quantization kernel and the GEMM the kernel choice picks (cuBLASLt).
# - 'fused': the fused launch in both regimes (eager and a graph then give the same bytes).
# - 'split': the quantization and the chosen GEMM in both regimes (the choice before 2026-12-02).
DECODE_PATHS = ("auto", "fused", "split")


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
    try:
        numba.get_num_threads()  # launches the pool: libgomp reads its environment now
    finally:
        if set_here:
            del os.environ["OMP_WAIT_POLICY"]
    _threads_started = True


def free_cpus():
    """CPUs free for more threads now: the CPU count less the tasks running or waiting to run, this
    one excepted (Linux's /proc/loadavg, whose fourth field counts them at the moment it is read);
    None where that cannot be read. A parallel region beside a busy process waits for a CPU that
    process holds: on two cores, the main command's layers took 3-19x their idle time with one busy
    process beside them when every parallel-sized call went parallel (benchmarks/cpu/bench_cpu_threads.py
    --main), where the serial twin keeps them near its own time."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None
    return (os.cpu_count() or 1) - (running - 1)


def parallel_min_work(default):
    """The work threshold in force: VT_CPU_PARALLEL_MIN_WORK when set, else ``default``."""
    value = os.environ.get("VT_CPU_PARALLEL_MIN_WORK")
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"VT_CPU_PARALLEL_MIN_WORK must be an integer, got {value!r}") from None
