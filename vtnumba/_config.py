"""Every Numba flag vtnumba uses, in one place.

Kernels are compiled lazily (nothing compiles at import) and cached on disk, so the first call in a
fresh process with a warm cache loads machine code instead of compiling it.
"""

import os

# VT_NUMBA_CACHE=0 turns the on-disk cache off (useful when bisecting a kernel change).
_CACHE = not os.environ.get("VT_NUMBA_CACHE", "1").startswith("0")

# Scalar helpers are inlined into every kernel that calls them (Numba IR inlining, so the loop
# around them stays one vectorizable body).
CPU_INLINE = dict(inline="always")
# Element-wise kernels: exact IEEE arithmetic (no fastmath: the encoder's float32 rounding tricks
# depend on it), parallel over both cores, cached.
# error_model="numpy": float division follows IEEE (x / 0 -> inf) instead of Python's
# ZeroDivisionError, whose per-element check kept the per-token divide loop from vectorizing.
CPU_KERNEL = dict(parallel=True, cache=_CACHE, nogil=True, error_model="numpy")
CPU_SERIAL_KERNEL = dict(cache=_CACHE, nogil=True, error_model="numpy")
# A function called from a fast-math kernel that must keep IEEE order and roundings: a callee compiles
# with its caller's fastmath flags unless it sets its own (numba's TargetConfig "inherit_if_not_set"),
# which silently reassociated the block-scaled GEMM's sum over K-blocks.
CPU_STRICT_FUNCTION = dict(CPU_SERIAL_KERNEL, fastmath=False)

# Elements per parallel work item of the element-wise CPU kernels: large enough that the inner loop
# vectorizes and threads do not share cache lines, small enough to balance two cores.
CPU_CHUNK = 1 << 16


if os.name == "posix" and isinstance(getattr(os.environ, "_data", None), dict):
    _ENVIRON_BYTES = os.environ._data  # os.environ's own store (bytes keys): ~0.05 us a lookup, not ~0.5

    def kernel_settings():
        """The environment settings that steer the GPU kernel choice, read now: (VT_DENSE_CUBLASLT_FP8,
        VT_DISABLE_KERNELS) as set (None when unset). A call bound under other settings is not reused."""
        return _ENVIRON_BYTES.get(b"VT_DENSE_CUBLASLT_FP8"), _ENVIRON_BYTES.get(b"VT_DISABLE_KERNELS")
else:
    def kernel_settings():
        """As above, through os.environ."""
        return os.environ.get("VT_DENSE_CUBLASLT_FP8"), os.environ.get("VT_DISABLE_KERNELS")


def dense_cublaslt_fp8_enabled():
    """The lever (the C++ seam's DenseCublasLtFp8Enabled): env VT_DENSE_CUBLASLT_FP8, read at every
    call so a test or a notebook can flip it live. On by default; any value whose first character is
    '0' turns cuBLASLt off and routes GPU GEMMs to the Numba kernels."""
    return not os.environ.get("VT_DENSE_CUBLASLT_FP8", "1").startswith("0")
