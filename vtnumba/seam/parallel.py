"""Tensor parallelism for the seam's FP8 layers, as vLLM splits its linear layers
(``vllm/model_executor/layers/linear.py``: ``ColumnParallelLinear``, ``MergedColumnParallelLinear``,
``RowParallelLinear``).

    from vtnumba import seam
    col = seam.ColumnParallelLinearMethod(w_up, rank, world_size)            # output features split
    row = seam.RowParallelLinearMethod(w_down, rank, world_size, all_reduce)  # input features split
    y = row.apply(act(col.apply(x)))                                          # one all-reduce

- **column-parallel**: rank r holds rows ``[r * N / R, (r + 1) * N / R)`` of the weight; x is
  replicated, every rank quantizes all of it (the same codes and scales on every rank) and computes
  its slice of the output. Nothing is communicated (vLLM's ``gather_output=False``).
- **row-parallel**: rank r holds columns ``[r * K / R, (r + 1) * K / R)``; its input is its slice of
  x along K (the column-parallel layer's output), quantized on that rank, and the float32 partial
  products are summed across ranks by one all-reduce, then the bias is added and the sum rounded
  to the output dtype.

The split rules (``shard_weight``) mirror vLLM: sizes must divide by the world size (vLLM's
``divide`` asserts it), a block-scaled weight's shard must be a whole number of blocks along the
split dimension (``fp8_utils.validate_fp8_block_shape``), per-tensor scales are replicated,
per-channel scales split with the output rows, block scales with their blocks.

The all-reduce is a callable ``all_reduce(partial) -> summed`` taking the float32 partial (it may
reduce in place and return its argument, as ``torch.distributed.all_reduce`` and NCCL do): one
process can simulate R ranks (``vtnumba.testing.parallel``), torch callers pass
``torch_all_reduce(group)``, cupy callers ``nccl_all_reduce(comm)``. Neither of the last two has
been run on two GPUs here; the CPU tests run the arithmetic.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import _arrays
from .._arrays import Array, DType
from ..ops import QuantizedActivation
from .linear import Fp8W8A8LinearMethod
from .matmul import matmul_fp8, matmul_fp8_prequant
from .weights import Fp8Weight, ResidentFp8

__all__ = [
    "COLUMN",
    "ROW",
    "shard_range",
    "shard_weight",
    "combine_partials",
    "ColumnParallelLinearMethod",
    "RowParallelLinearMethod",
    "torch_all_reduce",
    "nccl_all_reduce",
]

COLUMN = "column"
ROW = "row"
_MODES = (COLUMN, ROW)

AllReduce = Callable[[Array], Array]


def _check_rank(rank, world_size):
    for name, value in (("world_size", world_size), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}) for world_size={world_size}, got {rank}")


def shard_range(size: int, rank: int, world_size: int, *, multiple: int = 1, name: str = "size") -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s shard of a dimension of ``size`` split ``world_size`` ways.

    Even splits only, as vLLM's ``divide(size, tp_size)`` asserts: ``size % world_size == 0``, else
    ValueError naming ``name`` and the values. With ``multiple`` (a block size along this dimension)
    and ``world_size > 1``, each shard must also be a whole number of blocks (vLLM's
    ``validate_fp8_block_shape``: ``size_per_partition % block``), so no block straddles two ranks
    and each rank's block scales are whole rows / columns of the unsharded ones. At
    ``world_size == 1`` the shard is the whole dimension, a short last block included, as vLLM
    checks nothing there."""
    _check_rank(rank, world_size)
    if size % world_size:
        raise ValueError(f"{name} must be divisible by world_size={world_size} (vLLM splits evenly), got {size}")
    per = size // world_size
    if world_size > 1 and per % multiple:
        raise ValueError(
            f"{name} / world_size = {size} / {world_size} = {per} must be a multiple of the block "
            f"size {multiple} along the split (a block would straddle two ranks), got {per}"
        )
    return rank * per, (rank + 1) * per


def _fp8_weight(weight, name="weight"):
    if isinstance(weight, ResidentFp8):
        weight = weight.weight
    if not isinstance(weight, Fp8Weight):
        raise TypeError(f"{name} must be an Fp8Weight or a ResidentFp8, got {type(weight).__name__}")
    weight.host_data(name)
    return weight


def _slices(w, mode, rank, world_size, logical_widths):
    """The (row, column) slices of rank's shard, and the block slices of its scales."""
    n, k = w.shape
    bn, bk = w.block_size if w.block_size is not None else (1, 1)
    if mode == COLUMN:
        widths = [n] if logical_widths is None else [int(v) for v in logical_widths]
        if logical_widths is not None and (min(widths, default=0) < 1 or sum(widths) != n):
            raise ValueError(f"logical_widths must be positive and sum to N = {n}, got {list(logical_widths)}")
        if world_size == 1:  # the whole weight, as shard_range gives at world_size 1 (no block rule)
            return [(0, n)], (0, k)
        rows, start = [], 0
        for i, width in enumerate(widths):
            if w.block_size is not None and start % bn:
                raise ValueError(f"logical_widths[{i}] must start on a block of bn = {bn} rows, got offset {start}")
            name = "N" if logical_widths is None else f"logical_widths[{i}]"
            lo, hi = shard_range(width, rank, world_size, multiple=bn, name=name)
            rows.append((start + lo, start + hi))
            start += width
        return rows, (0, k)
    if logical_widths is not None:
        raise ValueError(
            f"logical_widths applies to mode='column' only (row-parallel splits K), got {list(logical_widths)}"
        )
    return [(0, n)], shard_range(k, rank, world_size, multiple=bk, name="K")


def shard_weight(
    weight: Fp8Weight | ResidentFp8,
    rank: int,
    world_size: int,
    *,
    mode: str,
    logical_widths: Sequence[int] | None = None,
) -> Fp8Weight:
    """Rank ``rank``'s shard of ``weight`` for tensor parallelism over ``world_size`` ranks, as an
    ``Fp8Weight`` on the weight's device (numpy or cupy arrays sliced and copied contiguous; nothing
    is requantized, so the shard's codes and scales are exactly the unsharded ones').

    ``mode='column'`` (vLLM's ``ColumnParallelLinear``): rows ``N / world_size`` of them; a
    per-channel ``weight_scale`` is split with them, a per-tensor one replicated, 128 x 128 (any
    bn x bk) block scales split by block rows, the bias split. ``logical_widths`` (a fused q/k/v or
    gate/up weight: ``seam.fuse_fp8_shards`` records them in ``source``) splits each logical piece
    on its own and stacks the pieces, so each rank gets its share of q, of k and of v, as vLLM's
    ``MergedColumnParallelLinear`` / ``QKVParallelLinear`` weight loaders do.

    ``mode='row'`` (vLLM's ``RowParallelLinear``): columns ``K / world_size`` of them; per-tensor and
    per-channel scales replicated (N is not split), block scales split by block columns. The shard
    has **no bias**: a row-parallel layer adds it once, after the all-reduce
    (``RowParallelLinearMethod``, ``combine_partials``).

    The static ``input_scale`` is replicated in both modes (every rank quantizes with the same
    scale, so its codes are the unsharded ones'); dynamic, per-token and per-group activation
    scales are computed by each rank from its input.

    Errors (ValueError, naming the argument and value): ``rank`` outside ``[0, world_size)``,
    ``world_size < 1``, ``mode`` not 'column' or 'row', a split dimension not divisible by
    ``world_size``, a block-scaled shard that is not a whole number of blocks along the split.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be 'column' or 'row', got {mode!r}")
    w = _fp8_weight(weight)
    rows, (k0, k1) = _slices(w, mode, rank, world_size, logical_widths)
    concat = _arrays.array_module(w.data).concatenate
    data = concat([w.data[r0:r1, k0:k1] for r0, r1 in rows], axis=0).copy()
    if w.block_size is not None:
        bn, bk = w.block_size
        kb0, kb1 = k0 // bk, -(-k1 // bk)
        scale = concat([w.weight_scale[r0 // bn : -(-r1 // bn), kb0:kb1] for r0, r1 in rows], axis=0).copy()
    elif w.per_channel and mode == COLUMN:
        scale = concat([w.weight_scale[r0:r1] for r0, r1 in rows]).copy()
    else:
        scale = w.weight_scale  # per-tensor, or per-channel under a K split: replicated, as in vLLM
    bias = None
    if mode == COLUMN and w.bias is not None:
        bias = concat([w.bias[r0:r1] for r0, r1 in rows]).copy()
    source = {"sharded_from": w.source, "mode": mode, "rank": rank, "world_size": world_size}
    if mode == COLUMN and logical_widths is not None:
        source["logical_widths"] = [r1 - r0 for r0, r1 in rows]
    # The parts are slices of a validated weight: valid by construction, so no second validation
    # (and, for a device weight, no host round trip of its scales).
    return Fp8Weight._trusted(
        data,
        scale,
        w.input_scale,
        bias,
        w.activation_scheme,
        source,
        w.per_channel,
        w.block_size,
        w.scale_ue8m0,
        w.activation_scale_format,
        w.activation_scale_rounding,
    )


# -- the combine step: all-reduce of float32 partials, then the epilogue ---------------------------


def _is_torch(a):
    return type(a).__module__.startswith("torch")


def _torch_dtype(torch, out_dtype):
    if isinstance(out_dtype, torch.dtype):
        return out_dtype
    dt = _arrays.out_dtype_of(out_dtype)
    return {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16, _arrays.BFLOAT16: torch.bfloat16}[
        dt
    ]


def combine_partials(
    partial: Array, all_reduce: AllReduce | None, *, bias: Array | None = None, out_dtype: DType = np.float32
) -> Array:
    """The row-parallel combine: ``round_out(all_reduce(partial) + bias)``.

    ``partial`` is this rank's float32 ``x_r @ w_r.T`` with its scales applied and no bias (numpy,
    cupy or a torch tensor). ``all_reduce`` sums it over the ranks and returns the sum, or returns
    None having summed in place (``torch.distributed.all_reduce`` itself may be passed); None means
    a single rank. It is called exactly once.

    Where this departs from vLLM, and why: vLLM's ``RowParallelLinear.forward`` adds the bias inside
    rank 0's GEMM ("Only fuse bias add into GEMM for rank 0") and all-reduces each rank's output in
    the activation dtype (bfloat16). Here the partials are float32 and the reduction sums them in
    float32: R partials each rounded to bfloat16 and summed in bfloat16 err by up to about R * 2^-8
    of the result, far outside DESIGN.md's G3 bound, while a float32 sum keeps the sharded layer
    within it (the cost: twice the bytes on the wire). The bias is added once, after the reduction,
    on every rank (the reduced sum is the same on every rank, so the outputs stay identical): added
    to one rank's partial before the sum, a large bias cancelled by the other ranks' partials would
    leave a float32 rounding error of the bias's size in the result.
    """
    if _is_torch(partial):
        import torch

        if partial.dtype != torch.float32:
            raise TypeError(f"partial must be float32 (partials are reduced in float32), got {partial.dtype}")
        total = all_reduce(partial) if all_reduce is not None else None
        total = partial if total is None else total
        if tuple(total.shape) != tuple(partial.shape) or total.dtype != torch.float32:
            raise ValueError(
                f"all_reduce must return the float32 sum of shape {tuple(partial.shape)} (or None after "
                f"summing in place), got {total.dtype} of shape {tuple(total.shape)}"
            )
        if bias is not None:
            total = total + bias.to(device=total.device, dtype=torch.float32)
        return total.to(_torch_dtype(torch, out_dtype))
    if _arrays.dtype_of(partial) != np.float32:
        raise TypeError(f"partial must be float32 (partials are reduced in float32), got {_arrays.dtype_of(partial)}")
    total = all_reduce(partial) if all_reduce is not None else None
    total = partial if total is None else total
    if tuple(total.shape) != tuple(partial.shape) or _arrays.dtype_of(total) != np.float32:
        raise ValueError(
            f"all_reduce must return the float32 sum of shape {tuple(partial.shape)} (or None after "
            f"summing in place), got {_arrays.dtype_of(total)} of shape {tuple(total.shape)}"
        )
    if bias is not None:
        total = total + bias.astype(np.float32)  # a new array: the reduced buffer is the caller's
    return _arrays.round_float32(total, _arrays.out_dtype_of(out_dtype))


# -- linear methods (seam.linear's protocol: name, apply, apply_prequant) --------------------------


class ColumnParallelLinearMethod(Fp8W8A8LinearMethod):
    """Rank ``rank``'s part of a column-parallel FP8 layer (vLLM's ``ColumnParallelLinear`` with
    ``gather_output=False``): ``apply(x)`` takes the whole x [..., K] and returns this rank's output
    features [..., N / world_size]. ``logical_widths`` as in ``shard_weight`` (fused q/k/v,
    gate/up); by default the fused weight's own (``seam.fuse_fp8_shards`` records them)."""

    name = "fp8_w8a8_column_parallel"
    __slots__ = ("rank", "world_size")  # and the base's weight: the rank's shard

    def __init__(
        self,
        weight: Fp8Weight | ResidentFp8,
        rank: int,
        world_size: int,
        *,
        logical_widths: Sequence[int] | None = None,
    ) -> None:
        w = _fp8_weight(weight)
        if logical_widths is None and isinstance(w.source, dict):
            logical_widths = w.source.get("logical_widths")
        super().__init__(shard_weight(w, rank, world_size, mode=COLUMN, logical_widths=logical_widths))
        self.rank, self.world_size = rank, world_size

    def __repr__(self):
        return f"ColumnParallelLinearMethod(rank={self.rank}/{self.world_size}, {self.weight!r})"


class RowParallelLinearMethod:
    """Rank ``rank``'s part of a row-parallel FP8 layer (vLLM's ``RowParallelLinear`` with
    ``input_is_parallel=True``): ``apply(x_r)`` takes this rank's slice of the input features
    [..., K / world_size], quantizes it by the weight's scheme (dynamic scales from this rank's
    slice, as vLLM's ``apply_fp8_linear`` on ``input_parallel`` does), computes the float32 partial
    product, calls ``all_reduce`` once, adds the bias and rounds to ``out_dtype`` (default: x's
    dtype): ``combine_partials``. ``all_reduce=None`` is a single rank."""

    name = "fp8_w8a8_row_parallel"
    __slots__ = ("weight", "bias", "all_reduce", "rank", "world_size", "_torch_bias")

    def __init__(
        self, weight: Fp8Weight | ResidentFp8, rank: int, world_size: int, all_reduce: AllReduce | None
    ) -> None:
        w = _fp8_weight(weight)
        if all_reduce is not None and not callable(all_reduce):
            raise TypeError(f"all_reduce must be a callable (partial -> sum) or None, got {type(all_reduce).__name__}")
        if all_reduce is None and world_size > 1:
            raise ValueError(f"all_reduce must be given for world_size={world_size} > 1, got None")
        self.weight = shard_weight(w, rank, world_size, mode=ROW)
        self.bias = None if w.bias is None else w.bias.astype(np.float32)
        self.all_reduce, self.rank, self.world_size = all_reduce, rank, world_size
        self._torch_bias = {}

    def _bias_for(self, partial):
        if self.bias is None or not _is_torch(partial):
            return self.bias
        t = self._torch_bias.get(partial.device)
        if t is None:  # once per device: no copy on the per-call path (and none inside a graph capture)
            from .._interop import to_torch

            t = self._torch_bias[partial.device] = to_torch(self.bias).to(partial.device)
        return t

    def partial(self, x: Array) -> Array:
        """This rank's float32 partial product, no bias: what the all-reduce sums."""
        return matmul_fp8(x, self.weight, np.float32)

    def apply(self, x: Array, out_dtype: DType | None = None) -> Array:
        p = self.partial(x)
        return combine_partials(
            p, self.all_reduce, bias=self._bias_for(p), out_dtype=x.dtype if out_dtype is None else out_dtype
        )

    def apply_prequant(self, q: QuantizedActivation, out_dtype: DType | None = None) -> Array:
        p = matmul_fp8_prequant(q, self.weight, np.float32)
        return combine_partials(
            p, self.all_reduce, bias=self._bias_for(p), out_dtype=np.float32 if out_dtype is None else out_dtype
        )

    def __repr__(self):
        return f"RowParallelLinearMethod(rank={self.rank}/{self.world_size}, {self.weight!r}, bias={self.bias is not None})"


# -- all-reduce callables for real process groups (not run here: they need two GPUs) --------------


def torch_all_reduce(group: Any = None) -> AllReduce:
    """``all_reduce`` for torch callers: ``torch.distributed.all_reduce`` (SUM, in place) on
    ``group`` (default: the default process group), which NCCL runs on torch's current stream
    without a host sync, so a CUDA graph can capture it. Start the ranks with torchrun (RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and ``dist.init_process_group("nccl")``."""
    import torch.distributed as dist

    def all_reduce(partial):
        dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=group)
        return partial

    return all_reduce


def nccl_all_reduce(comm: Any) -> AllReduce:
    """``all_reduce`` for cupy callers: ``comm.allReduce`` (a ``cupy.cuda.nccl.NcclCommunicator``)
    summing a float32 cupy array in place on cupy's current stream, no host sync. Start the ranks
    with torchrun or mpirun (mpi4py broadcasts ``nccl.get_unique_id()`` from rank 0); keep
    NCCL_NVLS_ENABLE=0 in every process."""
    import cupy
    from cupy.cuda import nccl

    def all_reduce(partial):
        if not partial.flags.c_contiguous:
            raise ValueError("partial must be C-contiguous for an in-place NCCL all-reduce")
        comm.allReduce(
            partial.data.ptr,
            partial.data.ptr,
            partial.size,
            nccl.NCCL_FLOAT32,
            nccl.NCCL_SUM,
            cupy.cuda.get_current_stream().ptr,
        )
        return partial

    return all_reduce
