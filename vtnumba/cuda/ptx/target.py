"""The one module that imports Numba's CUDA target (numba-cuda).

Everything GPU-side imports ``cuda`` (and ``types``, ``libdevice``, ``intrinsic``) from here, so
moving to numba-cuda's successor (numba-cuda-mlir) is a change to this file once it passes the
exhaustive gate (ANCHORS.md: on 2026-11-29 it did not).

``require_gpu()`` is the one check a GPU call makes before any work: it raises a single
``RuntimeError`` that says why the GPU path cannot run (numba-cuda missing or clashing with numpy,
no cupy, no driver, no device).

One kernel source, two compilers. The kernels use only ``cuda``, ``types``, ``libdevice`` and the
primitives of this package; an ``@intrinsic`` (the inline PTX of codec.py, mma.py, ...) is typed
once and names its code generator through ``lowering(llvmlite_codegen, mlir_codegen)``, which picks
the one of the compiler behind ``cuda``: numba-cuda calls ``codegen(context, builder, signature,
args)`` with llvmlite's IRBuilder, numba-cuda-mlir calls ``codegen(lower, target, args, kwargs)``
with its ``MLIRLower``, the call's result variable and its argument variables. The ``mlir_*``
helpers below are what the MLIR code generators are written with (inline asm, casts, array
element pointers); they import numba-cuda-mlir's internals only when called, so this module
imports without it.
"""

import functools
import os
from typing import Any

# Numba otherwise synchronizes a foreign array's stream on every launch, which both costs host
# time and breaks CUDA graph capture (DEVICE.md). vtnumba orders work on the current cupy stream.
os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

# VTNUMBA_CUDA_TARGET=numba-cuda-mlir puts numba-cuda-mlir behind this import instead of numba-cuda,
# opt-in, to measure it against the gates (benchmarks/probes/probe_numba_cuda_mlir.py; docs/DEVICE.md,
# "Porting the intrinsics to numba-cuda-mlir"); unset (or empty) keeps numba-cuda, the only target
# the gates pass on. A typo is refused rather than falling back, so a measurement never silently
# runs the default.
TARGETS = ("numba-cuda", "numba-cuda-mlir")
TARGET = os.environ.get("VTNUMBA_CUDA_TARGET") or TARGETS[0]
if TARGET not in TARGETS:
    raise ValueError(f"VTNUMBA_CUDA_TARGET must be one of {', '.join(TARGETS)} (or unset), got {TARGET!r}")

# Whichever compiler imports (or None where none does): typed Any, since their types differ by target
intrinsic: Any
IMPORT_ERROR: Exception | None

if TARGET == "numba-cuda-mlir":
    try:
        if SIMULATOR:
            raise ImportError("numba-cuda-mlir has no CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")
        import importlib

        from numba_cuda_mlir import cuda
        from numba_cuda_mlir.cuda import libdevice

        # the public types package, not the attribute ``cuda.types`` (which importing the
        # submodule replaces); its types are numba-cuda-mlir's own, not numba-cuda's
        types = importlib.import_module("numba_cuda_mlir.cuda.types")
        # Its @intrinsic takes the same (typingctx, *args) -> (sig, codegen) form, but codegen is
        # called with an MLIR builder: vtnumba's llvmlite InlineAsm codegen imports and decorates fine
        # and fails when a kernel using it compiles -- the failure the measurement records, per kernel.
        from numba_cuda_mlir.extending import intrinsic as _mlir_intrinsic
    except Exception as exc:  # ImportError without numba-cuda-mlir (or a release without its extending API)
        cuda = libdevice = types = None  # type: ignore[assignment]
        IMPORT_ERROR = exc
    else:
        IMPORT_ERROR = None
else:
    try:
        # the same names as numba-cuda-mlir's above: where both are installed mypy sees two imports
        from numba import cuda  # type: ignore[no-redef]
        from numba.cuda import libdevice, types  # type: ignore[no-redef]
    except Exception as exc:  # AttributeError 'row_stack' under numpy 2.5, ImportError without numba-cuda
        cuda = libdevice = types = None  # type: ignore[assignment]
        IMPORT_ERROR = exc
    else:
        IMPORT_ERROR = None

# Options of every vtnumba device helper: inlined by NVVM (forceinline), not by Numba's IR inliner
# (inline=True), which re-types each call site -- with the encoder inlined 16 times per kernel that
# made one kernel take 10-20 s to compile. The simulator has no forceinline (nor needs one).
DEVICE_INLINE: dict[str, Any] = dict(device=True) if SIMULATOR else dict(device=True, forceinline=True)
if TARGET == "numba-cuda-mlir":
    # numba-cuda-mlir 0.6.0 inlines only small device functions (64 IR statements) at the Numba IR
    # level and leaves the rest as calls for MLIR's inliner; a ``cuda.shared.array`` in such a
    # callee (tc_gemm's tile function) declares its global in the callee's module, and the kernel
    # then fails MLIR verification ("'memref.get_global' op 'static_shared_memory_N' does not
    # reference a valid global memref", docs/DEVICE.md). Inlined at the IR level, every shared
    # array is the kernel's own.
    DEVICE_INLINE = dict(device=True, inline="always")
# Options of the device helpers made from plain-Python scalar code (``codec.compile_device``: the
# portable encoder, the decoders): they hold no shared array, so the reason above for
# inline="always" does not apply to them, and inlining them at the Numba IR level re-types their
# body at every call site -- the static quantization kernel with the portable encoder took 109 s to
# compile that way under numba-cuda-mlir 0.6.0 and 14 s with the encoder left to its own inliner
# (which inlines it all the same: the PTX has no call; per-group 16 portable kernels took 80 s, and
# a portable G1 test ran past its 90 s box on the H200). numba-cuda keeps forceinline.
DEVICE_SCALAR: dict[str, Any] = dict(device=True) if TARGET == "numba-cuda-mlir" else DEVICE_INLINE


def _mlir_intrinsic_typed_late(fn):
    """numba-cuda-mlir's ``@intrinsic``, also for intrinsics made after the first compile (the cached
    ones of mma.cp_async_wait_group, sm90_wgmma.mma_e4m3, ...): its typing context reads the
    registry the intrinsic registers in when it is first made and, in 0.6.0, not again, so such an
    intrinsic is untyped in every kernel ("Cannot determine Numba type of <class '..._Intrinsic'>",
    shown as "NameError: name 'wait_tile' is not defined"; docs/DEVICE.md). Once the context exists,
    each new intrinsic refreshes it (private state of numba-cuda-mlir: ``mlir_target``'s flag)."""
    made = _mlir_intrinsic(fn)
    from numba_cuda_mlir.descriptor import mlir_target

    if mlir_target._typingctx_initialized:
        mlir_target.typing_context.refresh()
    return made


intrinsic = None
if IMPORT_ERROR is None and TARGET == "numba-cuda-mlir":
    intrinsic = _mlir_intrinsic_typed_late
elif IMPORT_ERROR is None and not SIMULATOR:
    try:
        from numba.cuda.extending import intrinsic
    except ImportError:  # numba-cuda before the core was vendored
        from numba.core.extending import intrinsic


MLIR = TARGET == "numba-cuda-mlir"


def lowering(llvmlite_codegen, mlir_codegen):
    """The code generator an ``@intrinsic`` returns with its signature, for the compiler behind
    ``cuda`` (see the module docstring): numba-cuda's is left exactly as it was, so its PTX does not
    change."""
    return mlir_codegen if MLIR else llvmlite_codegen


# --- numba-cuda-mlir: what its intrinsics' code generators are written with -----------------------
# Its lowering callbacks build MLIR (the llvm, arith and memref dialects) at the MLIRLower's
# insertion point; arrays arrive as strided memrefs, integers as signless MLIR integers of their
# width, tuples as Python tuples of values.

# inline-asm constraint letter -> its MLIR type's name (PTX register classes, as llvmlite's)
_ASM_TYPES = {"h": "i16", "r": "i32", "l": "i64", "f": "f32", "d": "f64"}


def mlir_codegen(body):
    """An MLIR code generator from ``body(lower, values, argtypes, restype) -> result``: the
    arguments' MLIR values and Numba types in, the call's value out (a value, a tuple of values, or
    None for a void intrinsic)."""

    def codegen(lower, target, args, kwargs):
        values = [lower.load_var(a) for a in args]
        argtypes = [lower.get_numba_type(a) for a in args]
        restype = lower.get_numba_type(target) if target is not None else types.void
        result = body(lower, values, argtypes, restype)
        if target is not None:
            lower.store_var(target, result)

    return codegen


def mlir_type(name):
    """An MLIR type by its assembly name (``i32``, ``f32``, ``vector<4xi32>``) or constraint letter."""
    from numba_cuda_mlir._mlir import ir

    return ir.Type.parse(_ASM_TYPES.get(name, name))


def mlir_cast(lower, value, fromty, toty):
    """``value`` of Numba type ``fromty`` as ``toty`` (Numba's conversion rules)."""
    return value if fromty == toty else lower.lower_cast(fromty, toty, value)


def mlir_asm(text, constraints, operands, results=(), side_effect=False):
    """One inline-asm statement (llvmlite's text and constraint syntax: ``$0``, ``=r,f,~{memory}``)
    reading ``operands`` (MLIR values of the constraints' types) and writing ``results`` (constraint
    letters or MLIR type names): the list of its results."""
    from numba_cuda_mlir._mlir.dialects import llvm

    restypes = [mlir_type(r) for r in results]
    if not restypes:
        llvm.inline_asm(None, list(operands), text, constraints, has_side_effects=side_effect)
        return []
    if len(restypes) == 1:
        return [llvm.inline_asm(restypes[0], list(operands), text, constraints, has_side_effects=side_effect)]
    struct = llvm.StructType.get_literal(restypes)
    res = llvm.inline_asm(struct, list(operands), text, constraints, has_side_effects=side_effect)
    return [llvm.extractvalue(t, res, [i]) for i, t in enumerate(restypes)]


def mlir_index(lower, value, ty):
    """An index value of any Numba integer type as i64."""
    return mlir_cast(lower, value, ty, types.int64)


def mlir_element_pointer(lower, array, arrtype, indices, indextypes, space=None):
    """The LLVM pointer to ``array[indices]`` (a 1-D index or one per dimension; the memref's
    strides, in elements): in the memref's address space, or in ``space`` (0 generic, 1 global, 3
    shared) cast from the generic pointer, as numba-cuda's intrinsics do -- an array a device
    function receives is a memref without a memory space even where it is shared memory."""
    from numba_cuda_mlir._mlir.dialects import llvm
    from numba_cuda_mlir.lowering_utilities import (
        GEP_DYNAMIC_INDEX,
        _memref_index_offset,
        memref_data_pointer,
        memref_to_llvm_ptr,
    )

    idx = [mlir_index(lower, v, t) for v, t in zip(indices, indextypes)]
    element = lower.get_storage_type(arrtype.dtype)
    if space is None:
        return memref_to_llvm_ptr(array, idx, element)
    generic = llvm.PointerType.get()
    offset = _memref_index_offset(array, idx)
    pointer = llvm.getelementptr(generic, memref_data_pointer(array), [offset], [GEP_DYNAMIC_INDEX], element, None)
    return llvm.addrspacecast(llvm.PointerType.get(space), pointer) if space else pointer


def mlir_stride_bytes(lower, array, arrtype, dim):
    """Dimension ``dim``'s stride of a memref in bytes, as i64 (memrefs keep strides in elements)."""
    from numba_cuda_mlir._mlir.dialects import memref
    from numba_cuda_mlir.lowering_utilities import convert

    metadata = memref.extract_strided_metadata(array)  # base, offset, sizes..., strides...
    stride = convert(metadata[2 + arrtype.ndim + dim], mlir_type("i64"))
    return stride * convert(arrtype.dtype.bitwidth // 8, mlir_type("i64"))


def mlir_byte_pointer(array, offset, space=0):
    """The LLVM pointer ``offset`` (i64) bytes past a memref's first element, cast from the generic
    pointer to address space ``space``."""
    from numba_cuda_mlir._mlir.dialects import llvm
    from numba_cuda_mlir.lowering_utilities import llvm_ptr_add_bytes, memref_data_pointer

    pointer = llvm_ptr_add_bytes(memref_data_pointer(array), offset)
    return llvm.addrspacecast(llvm.PointerType.get(space), pointer) if space else pointer


def mlir_buffer_pointer(array):
    """The LLVM pointer to a memref's first element (aligned pointer plus offset), in the memref's
    address space (global for a kernel argument, shared for ``cuda.shared.array``)."""
    from numba_cuda_mlir._mlir import ir
    from numba_cuda_mlir._mlir.dialects import llvm
    from numba_cuda_mlir.lowering_utilities import memref_data_pointer, memref_llvm_address_space

    space = memref_llvm_address_space(ir.MemRefType(array.type))
    pointer = memref_data_pointer(array)
    return llvm.addrspacecast(llvm.PointerType.get(space), pointer) if space else pointer


def mlir_vector_pointer(pointer, index, vector="vector<4xi32>"):
    """``pointer`` (to the start of a buffer) advanced by ``index`` elements of type ``vector``."""
    from numba_cuda_mlir._mlir.dialects import llvm
    from numba_cuda_mlir.lowering_utilities import GEP_DYNAMIC_INDEX

    return llvm.getelementptr(pointer.type, pointer, [index], [GEP_DYNAMIC_INDEX], mlir_type(vector), None)


def mlir_address(pointer, bits=64, generic=False):
    """A pointer as an integer of ``bits`` bits: its own address space's address, or (``generic``) the
    generic address of the same byte (what PTX's cvta.to.* instructions take)."""
    from numba_cuda_mlir._mlir.dialects import llvm

    if generic:
        pointer = llvm.addrspacecast(llvm.PointerType.get(), pointer)
    return llvm.ptrtoint(mlir_type(f"i{bits}"), pointer)


def _mlir_int_enum_compares():
    """numba-cuda-mlir 0.6.0 types ``x == E.A`` / ``x != E.A`` for an integer ``x`` and an IntEnum
    member (the kernels' BiasKind / OutKind switches) but has no lowering for them -- its
    lowering/enum.py has <, <=, >, >=, + and - for that mix, not == and != ("NotImplemented
    lowering binop", docs/DEVICE.md): registered here through its public extension registry, as
    the integer compare of the member's value it does for the others."""
    import operator

    from numba_cuda_mlir._mlir.dialects import arith
    from numba_cuda_mlir.extending import lower_builtin
    from numba_cuda_mlir.lowering_utilities import convert

    def compare(predicate):
        def lower_compare(lower, target, args, kwargs):
            (lhs, rhs), (lhs_type, _) = (lower.load_var(a) for a in args), (lower.get_numba_type(a) for a in args)
            if isinstance(lhs_type, types.IntEnumMember):
                lhs = convert(lhs, rhs.type)
            else:
                rhs = convert(rhs, lhs.type)
            lower.store_var(target, arith.cmpi(predicate, lhs, rhs))

        return lower_compare

    for op, predicate in ((operator.eq, arith.CmpIPredicate.eq), (operator.ne, arith.CmpIPredicate.ne)):
        lower_builtin(op, types.Integer, types.IntEnumMember)(compare(predicate))
        lower_builtin(op, types.IntEnumMember, types.Integer)(compare(predicate))
    # No refresh_registries() here: the target context reads the registry when it is first made (at
    # the first compile), and refreshing now would make it before the intrinsics of codec.py and
    # mma.py exist, which typing then cannot resolve ("Cannot determine Numba type of _Intrinsic").


def _mlir_numpy_scalar_constants():
    """numba-cuda-mlir 0.6.0 lowers a module attribute read as a constant (``_format.F32_MIN_SCALE``
    in a kernel) by converting the Python value to MLIR, and its converter (a functools
    singledispatch, ``lowering_utilities.unverified_convert``) knows Python's int, float, bool and
    complex but not numpy's scalars: "NotImplementedError: Not implemented for type <class
    'numpy.float32'>" (docs/DEVICE.md). Registered here: a numpy scalar converts as the Python
    number of the same value (exact: float32 and float64 values are Python floats; integers are
    ints), so the constant keeps its type from the target type it is converted to."""
    import numpy as np
    from numba_cuda_mlir.lowering_utilities import unverified_convert

    def as_python(value, target_type, **kw):
        return unverified_convert(value.item(), target_type, **kw)

    for kind in (np.floating, np.integer, np.bool_):
        unverified_convert.register(kind)(as_python)


def _mlir_array_strides():
    """``arr.strides`` in a kernel (tc_gemm's row steps): numba-cuda-mlir 0.6.0's lowering
    (``lower_strides``, lowering/cuda.py) fails on every call -- it replaces its argument variable
    by the loaded memref, then asks that for the variable's ``.name`` ("AttributeError:
    'MemRefValue' object has no attribute 'name'", docs/DEVICE.md) -- and, past that, would give the
    strides of a C-contiguous array of the same shape whatever the memref holds. Registered here
    through the public extension registry (an implementation for the same key registered later is
    the one found): the memref's own strides (``memref.extract_strided_metadata``, in elements) times
    the element size, in bytes as numba-cuda gives them."""
    from numba_cuda_mlir._mlir.dialects import arith, memref
    from numba_cuda_mlir.extending import lowering_registry
    from numba_cuda_mlir.lowering_utilities import index_of

    @lowering_registry.lower_getattr(types.Array, "strides")
    def array_strides(context, lower, target, var):
        array, arrtype = lower.load_var(var), lower.get_numba_type(var)
        metadata = memref.extract_strided_metadata(array)  # base, offset, sizes..., strides...
        itemsize = index_of(arrtype.dtype.bitwidth // 8)
        strides = [arith.muli(metadata[2 + arrtype.ndim + d], itemsize) for d in range(arrtype.ndim)]
        lower.store_var(target, tuple(strides))


def _mlir_arch_specific_cc():
    """``compile(..., cc=(9, 0, "a"))`` (launch.Kernel's arch-specific target, for wgmma and the
    block-scaled mma): numba-cuda-mlir 0.6.0 maps ``cc`` to its ``chip`` option through
    ``tools.format_arch``, which keeps only (major, minor), so the kernel compiles for sm_90 and
    nvJitLink refuses its wgmma ("nvJitLinkError: ERROR_PTX_COMPILE", docs/DEVICE.md). Its ``chip``
    takes "sm_90a" (its resolve_gpu_target reads the suffix); the formatter its decorator module
    uses keeps the suffix here."""
    from numba_cuda_mlir import decorators

    plain = decorators.format_arch

    def format_arch(cc):
        return plain(cc) + (str(cc[2]) if len(cc) > 2 and cc[2] else "")

    decorators.format_arch = format_arch


if MLIR and IMPORT_ERROR is None:
    _mlir_int_enum_compares()
    _mlir_numpy_scalar_constants()
    _mlir_array_strides()
    _mlir_arch_specific_cc()


@functools.cache
def gpu_unavailable_reason():
    """None when the GPU path can run here, else one sentence saying why not."""
    if IMPORT_ERROR is not None and TARGET == "numba-cuda-mlir":
        return (
            f"numba-cuda-mlir (VTNUMBA_CUDA_TARGET) could not be imported "
            f"({IMPORT_ERROR.__class__.__name__}: {IMPORT_ERROR})"
        )
    if IMPORT_ERROR is not None:
        import numpy as np

        return (
            f"numba-cuda could not be imported ({IMPORT_ERROR.__class__.__name__}: {IMPORT_ERROR}); "
            f"with numpy {np.__version__} this is usually the numba-cuda/numpy version clash "
            f"(numba-cuda 0.30 needs numpy < 2.5) or numba-cuda not being installed"
        )
    if SIMULATOR:
        return None  # the simulator needs neither cupy nor a driver
    try:
        import cupy
    except Exception as exc:  # ImportError, or a cupy built for another CUDA
        return f"cupy is not importable ({exc.__class__.__name__}: {exc}); install cupy-cuda12x or cupy-cuda13x"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # cudaErrorNoDevice / InsufficientDriver / no libcuda
        return f"no usable CUDA driver ({exc.__class__.__name__}: {exc})"
    if count < 1:
        return "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"
    return None


def require_gpu():
    """Raise one clear RuntimeError when the GPU path cannot run here."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"vtnumba's GPU path needs a usable CUDA GPU: {reason}")


__all__ = [
    "cuda",
    "libdevice",
    "types",
    "intrinsic",
    "DEVICE_INLINE",
    "DEVICE_SCALAR",
    "IMPORT_ERROR",
    "SIMULATOR",
    "TARGET",
    "TARGETS",
    "MLIR",
    "lowering",
    "mlir_codegen",
    "mlir_type",
    "mlir_cast",
    "mlir_asm",
    "mlir_index",
    "mlir_element_pointer",
    "mlir_buffer_pointer",
    "mlir_byte_pointer",
    "mlir_stride_bytes",
    "mlir_vector_pointer",
    "mlir_address",
    "gpu_unavailable_reason",
    "require_gpu",
]
