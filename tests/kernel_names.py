"""Kernel names as a profiler lists them, made the same under both CUDA compilers.

A profiler (``torch.profiler``, nsys) names a Numba kernel by its PTX entry, the mangled name of the
Python function, demangled or not. numba-cuda's carries the module path
(``vtnumba::cuda::kernels::quant::static_kernel::<locals>::quantize_static[abi:v1](Array<...>)``);
numba-cuda-mlir's does not and keeps Numba's escapes (``static_kernel::_3clocals_3e::quantize_static(
Array<unsigned short, 1, C, ...>)``). ``qualname`` gives both as the function's Python qualified
name, and ``ours`` tells vtnumba's kernels from the others (cuBLASLt's, torch's) by the kernels
vtnumba compiled in this process (``runtime/launch.py``), not by a module path in the name::

    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    mine = profiled.ours(names)                  # ['static_kernel.<locals>.quantize_static', ...]
"""

import re

__all__ = ["qualname", "is_ours", "ours", "FUSED_KERNEL", "DENSE_WGMMA_KERNEL", "fused_kernel"]

FUSED_KERNEL = "fused_tensorcore_gemv"  # vtnumba.cuda.bound's names of the one-launch forms
DENSE_WGMMA_KERNEL = "dense_gemv_wgmma"


def fused_kernel(m, scheme):
    """The one fused launch a decode call of M rows in activation ``scheme`` binds, as docs/DESIGN.md
    promises it for a weight of at most 66 tiles of 64 rows: on an sm_90 GPU with the lever
    VT_DENSE_CUBLASLT_FP8 on, the dense wgmma launch for one row of static, dynamic or per-token
    activations (not 1 x 128 groups), else the tensor-core GEMV."""
    import os

    import cupy

    major_minor = cupy.cuda.Device().compute_capability
    lever = not os.environ.get("VT_DENSE_CUBLASLT_FP8", "1").startswith("0")
    disabled = DENSE_WGMMA_KERNEL in os.environ.get("VT_DISABLE_KERNELS", "")
    wgmma = major_minor == "90" and lever and not disabled and m == 1 and scheme != "per_group"
    return DENSE_WGMMA_KERNEL if wgmma else FUSED_KERNEL


_ESCAPE = re.compile(r"_([0-9a-f]{2})")
_ABI_TAG = re.compile(r"\[abi:[^\]]*\]")


def _unescape(m: re.Match) -> str:
    """Numba's escape of a character a mangled name cannot hold (``_3c`` is ``<``); other ``_XX``
    (cuBLAS's ``_80_``) stay as they are."""
    c = chr(int(m.group(1), 16))
    return c if 0x20 < ord(c) < 0x7F and not (c.isalnum() or c == "_") else m.group(0)


def _demangle(name: str) -> list[str]:
    """The name parts of an Itanium-style mangled Numba name (``_ZN`` <length><part>... ``E``),
    its ABI tags (``B`` <length><tag>) dropped."""
    parts, i = [], 3
    while i < len(name) and name[i] != "E":
        tag = name[i] == "B"
        i += tag
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        if j == i:
            break
        n = int(name[i:j])
        if not tag:
            parts.append(name[j : j + n])
        i = j + n
    return parts


def qualname(name: str) -> str:
    """The Python qualified name of the kernel a profiler lists as ``name`` (mangled or demangled,
    either compiler's): the parts of its entry name joined by dots, Numba's ``_XX`` escapes decoded,
    the argument list and ABI tags dropped. numba-cuda's name keeps its module path in front."""
    if name.startswith("_ZN"):
        parts = _demangle(name)
    else:
        head = _ABI_TAG.sub("", name.split("(", 1)[0]).strip()
        head = head.rsplit(" ", 1)[-1]  # a return type in front ("void f(...)")
        parts = head.split("::")
    return ".".join(_ESCAPE.sub(_unescape, p) for p in parts if p)


def _compiled_names() -> set[str]:
    from vtnumba.cuda.runtime import launch

    return {kernel.name for kernel in list(launch._KERNELS.values())}


def _match(name: str, known: set[str]) -> str | None:
    q = qualname(name)
    found = [k for k in known if q == k or q.endswith("." + k)]
    return max(found, key=len) if found else None


def is_ours(name: str, known: set[str] | None = None) -> bool:
    """Whether the profiled kernel ``name`` is one vtnumba compiled in this process (its qualified
    name, or the end of it past a module path, is a vtnumba kernel's)."""
    return _match(name, _compiled_names() if known is None else known) is not None


def ours(names: list[str]) -> list[str]:
    """vtnumba's kernels among profiled ``names``, in their order, each as its Python qualified name
    without a module path (``static_kernel.<locals>.quantize_static``): the same under both
    compilers."""
    known = _compiled_names()
    return [m for m in (_match(n, known) for n in names) if m is not None]
