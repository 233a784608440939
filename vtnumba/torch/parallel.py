"""Tensor parallelism for ``Fp8Linear`` (``seam.parallel``'s shard arithmetic over a
``torch.distributed`` group): ``shard_linear``, ``shard_model``, ``RowParallelFp8Linear``."""

import torch
from torch import nn

from ..seam import parallel as _parallel
from .linear import Fp8Linear

__all__ = ["RowParallelFp8Linear", "shard_linear", "shard_model"]


class RowParallelFp8Linear(nn.Module):
    """Rank ``rank``'s part of a row-parallel ``Fp8Linear`` (vLLM's ``RowParallelLinear``,
    ``input_is_parallel=True``): ``forward(x_r)`` takes this rank's slice of the input features,
    computes the float32 partial product (an ``Fp8Linear`` of the shard, ``out_dtype=float32``, no
    bias), sums it over ``group`` with ``torch.distributed.all_reduce`` (NCCL runs it on torch's
    current stream, no host sync), then adds the bias and rounds to the layer's out dtype (default:
    x's): ``seam.combine_partials``, where the choices (float32 reduce, bias after it) are argued."""

    def __init__(self, layer: "Fp8Linear", rank: int, world_size: int, group: object = None) -> None:
        super().__init__()
        if not isinstance(layer, Fp8Linear):
            raise TypeError(f"layer must be an Fp8Linear, got {type(layer).__name__}")
        shard = _parallel.shard_weight(layer.fp8_weight, rank, world_size, mode=_parallel.ROW)
        self.partial = Fp8Linear(shard, out_dtype=torch.float32)
        # (torch's stubs type nn.Module attributes through __getattr__ as Tensor | Module)
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().clone())  # type: ignore[operator]
        self.out_dtype, self.rank, self.world_size, self.group = layer.out_dtype, rank, world_size, group
        # made once, not per forward (a decode step calls it per layer); one rank has nothing to reduce
        self._all_reduce = _parallel.torch_all_reduce(group) if world_size > 1 else None
        self.in_features, self.out_features = shard.shape[1], shard.shape[0]

    def forward(self, x):
        return _parallel.combine_partials(
            self.partial(x),
            self._all_reduce,
            bias=self.bias,
            out_dtype=x.dtype if self.out_dtype is None else self.out_dtype,
        )

    def extra_repr(self):
        return (
            f"in_features={self.in_features} (of {self.in_features * self.world_size}), "
            f"out_features={self.out_features}, rank={self.rank}/{self.world_size}, bias={self.bias is not None}"
        )


def shard_linear(
    layer: "Fp8Linear",
    rank: int,
    world_size: int,
    *,
    mode: str,
    group: object = None,
    logical_widths: list | None = None,
) -> nn.Module:
    """Rank ``rank``'s part of ``layer`` (an ``Fp8Linear``) for tensor parallelism over ``group``
    (a ``torch.distributed`` process group; None: the default one) of ``world_size`` ranks:

    - ``mode='column'``: an ``Fp8Linear`` of the rank's output features (``seam.shard_weight``:
      scales and bias split with them; ``logical_widths`` for fused q/k/v, gate/up);
    - ``mode='row'``: a ``RowParallelFp8Linear`` taking the rank's input features, with one
      all-reduce per forward.

    Start the ranks with torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and
    ``torch.distributed.init_process_group("nccl")`` on GPUs (keep NCCL_NVLS_ENABLE=0 in each
    process); the CPU tests use the gloo backend."""
    if not isinstance(layer, Fp8Linear):
        raise TypeError(f"layer must be an Fp8Linear, got {type(layer).__name__}")
    if mode == _parallel.COLUMN:
        weight = layer.fp8_weight
        if logical_widths is None and isinstance(weight.source, dict):  # a fused q/k/v or gate/up layer
            logical_widths = weight.source.get("logical_widths")  # as seam.ColumnParallelLinearMethod
        return Fp8Linear(
            _parallel.shard_weight(weight, rank, world_size, mode=mode, logical_widths=logical_widths),
            out_dtype=layer.out_dtype,
        )
    if mode == _parallel.ROW:
        if logical_widths is not None:
            raise ValueError(f"logical_widths applies to mode='column' only, got {logical_widths!r}")
        return RowParallelFp8Linear(layer, rank, world_size, group)
    raise ValueError(f"mode must be 'column' or 'row', got {mode!r}")


def shard_model(model: nn.Module, plan: dict, rank: int, world_size: int, *, group: object = None) -> nn.Module:
    """Replace, in place, each ``Fp8Linear`` named in ``plan`` ({name in ``model.named_modules()``:
    'column' or 'row'}) with its rank's part (``shard_linear``); return ``model``. As torch's own
    ``parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})``
    takes a plan, and vLLM's models name the split of each layer (q/k/v, gate/up: column; o, down:
    row). A name that is not an ``Fp8Linear`` of ``model`` is an error."""
    modules = dict(model.named_modules())
    for name, mode in plan.items():
        layer = modules.get(name)
        if not isinstance(layer, Fp8Linear):
            raise ValueError(
                f"plan names {name!r}, which must be an Fp8Linear of model, got "
                f"{type(layer).__name__ if layer is not None else 'no such module'}"
            )
        parent_name, _, child = name.rpartition(".")
        setattr(
            modules[parent_name] if parent_name else model,
            child,
            shard_linear(layer, rank, world_size, mode=mode, group=group),
        )
    return model
