"""Bound calls: the one home of a layer's call prepared once per input signature and replayed.

A model calls each layer with the same input signature token after token, so the first full call
of a signature (validating, resolving the device, decoding the scheme, walking the kernel choice)
is followed by a *binding* (``vtnumba.cuda.bound``: the launches and cuBLASLt matmuls of that call,
their parameters packed once), and every later call of the signature writes its pointers and
enqueues. This module owns what every caller of a bound call shares:

- **the table** (``BoundTable``, on the weight or the experts pair it serves: ``bound_calls``), its
  eviction (a caller sweeping over shapes starts it over after ``MAX_SIGNATURES``) and the reasons
  a signature was not bound (``explain``);
- **the signature key** (``linear_key``, ``moe_key``): the input's shape, dtypes, the output dtype,
  the device and the settings that steer the kernel choice (``_config.kernel_settings``); what a
  weight is (its format) is the table's owner, so it is not in the key;
- **the regime**: a linear binding may hold two calls, one for eager code and one for a CUDA graph
  capture (``vtnumba.cuda.bound.LinearBinding``); ``linear_for_stream`` picks by asking whether the
  stream is capturing, only when the two differ;
- **the fallback**: a call no binding can take (strided, misaligned, another device) finds no entry
  under its key (its caller builds no key for it), and the caller runs the full path, which is
  always correct; a signature a binding refused is kept as None, with its reason.

The callers -- ``seam.matmul_fp8`` and ``seam.moe_fp8`` for cupy arrays, ``vtnumba.torch``'s
``Fp8Linear`` and ``Fp8Experts`` for torch tensors -- differ only in where y and the scratch block
come from (cupy's pool or torch's caching allocator) and in how they read a pointer.
"""

from typing import Any

from .._config import kernel_settings

__all__ = [
    "BoundTable",
    "MAX_SIGNATURES",
    "table_of",
    "linear_key",
    "moe_key",
    "bind_linear",
    "linear_for_stream",
    "explain",
]

# Signatures bound per owner: prompts of many lengths would otherwise grow a table without end; a
# decode step's signature is bound again at once after a reset
MAX_SIGNATURES = 16


class BoundTable(dict):
    """One owner's bound calls by signature key (a dict: key -> binding, or None for a signature met
    and refused), with the reasons signatures were refused or bound without the fused launch."""

    __slots__ = ("reasons",)

    def __init__(self):
        super().__init__()
        self.reasons = {}

    def put(self, key, binding, reason=None):
        """Keep ``binding`` (None: refused, with ``reason``) under ``key``, starting over when full."""
        if len(self) >= MAX_SIGNATURES:
            self.clear()
            self.reasons.clear()
        self[key] = binding
        if reason is not None:
            self.reasons[key] = reason
        else:
            self.reasons.pop(key, None)

    def explain(self):
        """One line per signature: what an eager call and a captured call run, or why it is not bound."""
        lines = []
        for key, binding in self.items():
            shape, dtype = key[0], key[1]
            what = f"x {tuple(shape)} {dtype}"
            if binding is None:
                lines.append(f"{what}: full path every call ({self.reasons.get(key, 'refused')})")
            else:
                lines.append(f"{what}: {binding.explain()}")
        return "\n".join(lines) if lines else "no call bound yet"


def table_of(owner):
    """The ``BoundTable`` on ``owner`` (an Fp8Weight or Fp8Experts: their ``bound_calls`` field),
    made on first use."""
    table = owner.bound_calls
    if table is None:
        table = BoundTable()
        object.__setattr__(owner, "bound_calls", table)  # the owners are frozen dataclasses
    return table


def linear_key(shape, dtype, out_dtype, device_id):
    """The signature of a linear call: x's shape [..., K] and dtype (numpy), the output dtype (numpy,
    or None for x's), the device ordinal and the kernel-choice settings."""
    return (shape, dtype, out_dtype, device_id, kernel_settings())


def moe_key(x_shape, x_dtype, ids_shape, ids_dtype, weights_shape, weights_dtype, down, device_id):
    """The signature of a ``moe_fp8`` call (numpy dtypes; torch callers map theirs)."""
    return (
        tuple(x_shape),
        x_dtype,
        tuple(ids_shape),
        ids_dtype,
        tuple(weights_shape),
        weights_dtype,
        down,
        device_id,
        kernel_settings(),
    )


def bind_linear(owner, key, x2d, weight, out_dtype):
    """Bind a linear call for signature ``key`` and keep it in ``owner``'s table: ``weight`` is the
    Fp8Weight whose arrays are on x's GPU (owner's own, or its resident copy), ``x2d`` the input as
    [M, K] (C-contiguous, 16-byte aligned), ``out_dtype`` a dtype or its name. Returns the binding
    (``vtnumba.cuda.bound.LinearBinding``). The seam binds after a signature's first full call (which
    validated it), ``vtnumba.torch`` at the first call after its own checks."""
    from ..cuda import bound as cuda_bound

    binding = cuda_bound.bind_linear(x2d, weight, out_dtype)
    table_of(owner).put(key, binding)
    return binding


_is_capturing = None  # cupy.cuda.runtime.streamIsCapturing, bound at the first call that asks


def linear_for_stream(binding, stream_ptr):
    """The call of ``binding`` for work enqueued on ``stream_ptr``: the graph's while the stream is
    being captured, else the eager one. One driver query, made only when the two differ."""
    if not binding.by_regime:
        return binding.eager
    global _is_capturing
    if _is_capturing is None:
        import cupy

        _is_capturing = cupy.cuda.runtime.streamIsCapturing
    return binding.graph if _is_capturing(stream_ptr) else binding.eager


def explain(owner: Any) -> str:
    """What ``owner``'s calls (an Fp8Weight, ResidentFp8 or Fp8Experts) run on the GPU, signature by
    signature: the kernels of an eager call and of a captured one, and why a call is not bound or
    not the one fused launch."""
    from .weights import ResidentFp8

    if isinstance(owner, ResidentFp8):  # its device copy holds the table
        owner = owner.weight
    table = owner.bound_calls
    return "no call bound yet" if table is None else table.explain()
