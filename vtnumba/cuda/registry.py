"""The GPU kernel registry: how a call finds its kernel, one rule for the dense, block-scaled and
grouped GEMMs.

Three tables hold the kernels, each in the order they are tried: ``gemm.KERNELS`` (and its decode
orders) for ``scaled_mm``, ``block.KERNELS`` for ``block_scaled_mm``, ``grouped.KERNELS`` for
``grouped_scaled_mm``. A kernel is an object with a ``name`` and ``can_implement(call, named=False)``
-> ``(ok, why not)``; ``named`` is True when the caller asked for it by name (``kernel=``), which
waives the size heuristics that make it step aside for a faster kernel but never what it cannot
compute. ``choose`` is the one place a table is walked, in the style of vLLM's scaled-mm kernel
selection (``vllm/model_executor/layers/quantization/kernels/scaled_mm/__init__.py``): the first
kernel that can, runs; none fitting is one ValueError listing every kernel's reason; the names in
``VT_DISABLE_KERNELS`` (read at every call) are left out.

Where the kernels live: the device code under ``kernels/``, one module a family (``gemv``, ``tiled``,
``tc_gemv``, ``tc_gemm``, ``grouped_gemm``, ``moe``), the per-architecture ones named for it
(``sm90_wgmma_gemm``, ``sm90_wgmma_gemv``, ``sm120_block_scaled``; their instructions in
``ptx/sm90_wgmma.py``, ``ptx/sm120_mma.py``), and the helpers they share in one tier
(``kernels/epilogue.py``: the epilogue tuple and output words; ``kernels/quant.py``: the in-kernel
quantization; ``kernels/rows.py``: the weight-row products; ``ptx/codec.py``: e4m3 decoding and
encoding). A new architecture's kernel is a
``kernels/smXX_*.py`` module and one entry in the table it serves.
"""

import os

from .._config import disabled_kernels


def describe(call):
    """The call's shapes as a sentence's object: a grouped call has experts (``e``), a GEMM rows."""
    if hasattr(call, "e"):
        return f"a [{call.p}, {call.k}] x {call.e} experts of [{call.n}, {call.k}]^T call"
    return f"a [{call.m}, {call.k}] x [{call.n}, {call.k}]^T call"


def choose(call, kernel, candidates, by_name, what):
    """The first of ``candidates`` that can run ``call``, or the one named ``kernel`` (a key of
    ``by_name``); ``what`` names the operation in the errors (module docstring)."""
    disabled = disabled_kernels()
    if kernel is not None:
        chosen = by_name.get(kernel)
        if chosen is None:
            raise ValueError(f"kernel must be one of {sorted(by_name)} or None for a {what} call, got {kernel!r}")
        if chosen.name in disabled:
            raise ValueError(
                f"kernel {kernel!r} is disabled by VT_DISABLE_KERNELS={os.environ['VT_DISABLE_KERNELS']!r}"
            )
        ok, why = chosen.can_implement(call, named=True)
        if not ok:
            raise ValueError(f"kernel {kernel!r} cannot run this call: {why}")
        return chosen
    reasons = []
    for candidate in candidates:
        if candidate.name in disabled:
            reasons.append(f"{candidate.name}: disabled by VT_DISABLE_KERNELS")
            continue
        ok, why = candidate.can_implement(call)
        if ok:
            return candidate
        reasons.append(f"{candidate.name}: {why}")
    raise ValueError(f"no GPU {what} kernel can run {describe(call)}:\n  " + "\n  ".join(reasons))


__all__ = ["choose", "describe"]
