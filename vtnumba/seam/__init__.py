"""The seam: the one place every model gets its FP8 linear layers from.

    from vtnumba import seam
    w = seam.Fp8Weight.from_float(w_float)            # or seam.load_fp8_linear(ckpt, "model.layers.0.mlp.up_proj")
    rw = seam.ResidentFp8(w, "cuda")                  # uploaded once, accounted in seam.load_stats()
    y = seam.matmul_fp8(x, rw)                         # quantize x by w's scheme, then vt.scaled_mm
    m = seam.make_linear_method(w); y = m.apply(x)     # or Fp8Config.from_hf(config).linear_method(prefix, w)
    seam.save_fp8_checkpoint("out.safetensors", {"model.layers.0.mlp.down_proj": w})   # read back as saved
    col = seam.ColumnParallelLinearMethod(w, rank, world_size)             # tensor parallelism (seam.parallel)

Names follow the C++ seam it comes from (ResidentFp8, DenseCublasLtFp8Enabled, MatmulFp8CutlassD,
MatmulFp8CutlassPreQuantD, Fp8W8A8LinearMethod, MakeLinearMethod) in Python spelling.
"""

from .bound import explain
from .checkpoint import Checkpoint, load_float_linear, load_fp8_fused_linear, load_fp8_linear
from .config import Fp8Config
from .experts import Fp8Experts, grouped_matmul_fp8, moe_debug_checks, moe_fp8
from .experts_checkpoint import load_fp8_experts
from .fp8_format import Fp8Format
from .fusion import fuse_fp8_shards, requantize_with_max_scale
from .linear import Fp8W8A8LinearMethod, LinearMethod, UnquantizedLinearMethod, make_linear_method
from .matmul import dense_cublaslt_fp8_enabled, matmul_fp8, matmul_fp8_prequant, quantize_activation
from .parallel import (
    ColumnParallelLinearMethod,
    RowParallelLinearMethod,
    combine_partials,
    nccl_all_reduce,
    shard_range,
    shard_weight,
    torch_all_reduce,
)
from .saving import save_fp8_checkpoint
from .weights import DeviceLoadStats, Fp8Weight, ResidentFp8, load_stats, reset_load_stats

__all__ = [
    # weights and their format
    "Fp8Weight",
    "Fp8Format",
    "ResidentFp8",
    "load_stats",
    "reset_load_stats",
    "DeviceLoadStats",
    "fuse_fp8_shards",
    "requantize_with_max_scale",
    # matmul and the lever
    "quantize_activation",
    "matmul_fp8",
    "explain",
    "matmul_fp8_prequant",
    "dense_cublaslt_fp8_enabled",
    # mixture of experts
    "Fp8Experts",
    "grouped_matmul_fp8",
    "moe_fp8",
    "moe_debug_checks",
    # linear methods
    "LinearMethod",
    "Fp8W8A8LinearMethod",
    "UnquantizedLinearMethod",
    "make_linear_method",
    # tensor parallelism
    "shard_range",
    "shard_weight",
    "combine_partials",
    "ColumnParallelLinearMethod",
    "RowParallelLinearMethod",
    "torch_all_reduce",
    "nccl_all_reduce",
    # checkpoints
    "Fp8Config",
    "load_fp8_linear",
    "load_fp8_fused_linear",
    "load_fp8_experts",
    "load_float_linear",
    "save_fp8_checkpoint",
    "Checkpoint",
]
