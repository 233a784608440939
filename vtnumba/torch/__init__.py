"""FP8 layers for torch models: ``Fp8Linear``, ``Fp8Experts``, ``convert`` and ``calibrate`` (the extra ``torch``).

    import torch, vtnumba.torch as vtt
    model = vtt.convert(model, "per_token")      # every nn.Linear -> Fp8Linear, every fused MoE experts
                                                 # module -> Fp8Experts, in place (on its device)
    print(vtt.conversion_report(model))          # what was converted, what is left in float
    vtt.save_checkpoint(model, "out")            # safetensors + quantization_config; read back with
                                                 # vtt.convert(model, checkpoint="out"), format intact
    with torch.inference_mode():
        y = model(x)
    compiled = torch.compile(model, fullgraph=True)            # the layers are torch custom ops
    graphed = torch.compile(model, mode="reduce-overhead")     # ... that CUDA graphs capture

An ``Fp8Linear`` holds its FP8 weight as torch buffers -- ``weight`` (torch.float8_e4m3fn [N, K]),
``weight_scale`` (float32: [1] per-tensor, [N] per-channel, [ceil(N/bn), ceil(K/bk)] per block),
``input_scale`` (float32 [1], static activations only) and ``bias`` -- so ``model.to(...)``,
``state_dict()`` and ``load_state_dict`` treat them as torch treats any buffer. Its forward is exactly
``seam.matmul_fp8`` (quantize the activation by the layer's scheme, then the FP8 GEMM), bitwise.

How a GPU forward runs (the path a decode step takes, token after token): the first call with an
input signature (shape, dtype, output dtype, device, lever) binds the layer's work once
(``vtnumba.cuda.bound``: prepared quantization launches, the chosen GEMM with its cuBLASLt
descriptor); every later call allocates the output and one scratch block from torch's caching
allocator on torch's current stream, writes three pointers and enqueues. So results are ordinary
torch tensors (counted by ``torch.cuda.memory_allocated``), nothing synchronizes, and
``torch.cuda.graph`` captures a converted model in its default mode. Under ``torch.compile`` the
forward is the custom op ``torch.ops.vtnumba.fp8_linear`` (``torch.library``, with a fake
implementation for shapes and dtypes), so a converted model traces with no graph break.

A layer whose buffers are on the CPU and meets a GPU input makes its weight resident on that GPU
once (``seam.ResidentFp8``, accounted in ``seam.load_stats()``) and runs there, as earlier versions
did; ``model.to("cuda")`` moves the buffers instead.

Inference only: vtnumba's ops are not differentiable, so a forward under grad mode whose input
requires grad raises (the gradient would be lost); run under ``torch.no_grad()`` or
``torch.inference_mode()``.

This module's ``import torch`` is the real torch: Python 3 imports are absolute, so the name is not
this module's own (tests/test_interop.py checks it).

Mixture-of-experts models (transformers' fused experts modules: Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral,
DeepSeek-V3) convert to ``Fp8Experts``, whose forward is ``seam.moe_fp8`` (the custom op
``torch.ops.vtnumba.moe_fp8`` under ``torch.compile``); ``convert`` warns about every weight it
leaves in floating point (``vtnumba.torch.conversion``).

The package's modules: ``linear`` (``Fp8Linear``), ``experts`` (``Fp8Experts``, which experts
modules are recognised), ``custom_ops`` (the torch custom ops and the forward paths they share with
eager calls), ``conversion`` (``convert``, ``calibrate``, ``conversion_report``), ``parallel``
(tensor parallelism), ``checkpoint`` (``save_checkpoint``). Every public name is here, at ``vtnumba.torch``.
"""

try:
    import torch
except ImportError:
    raise ImportError("vtnumba.torch needs torch, which is not installed: pip install 'vtnumba[torch]'") from None
from torch import nn  # noqa: F401 (vtt.nn is torch.nn: the real torch, not this package)

if not hasattr(torch.library, "custom_op"):  # the layers are torch custom ops (torch.library, 2.4+)
    raise ImportError(
        f"vtnumba.torch needs torch >= 2.4 (torch.library.custom_op), found torch {torch.__version__}: "
        f"pip install 'torch>=2.4'"
    )

from .checkpoint import save_checkpoint
from .conversion import ConversionReport, calibrate, conversion_report, convert
from .experts import Fp8Experts
from .linear import Fp8Linear
from .parallel import RowParallelFp8Linear, shard_linear, shard_model

__all__ = [
    "Fp8Linear",
    "Fp8Experts",
    "RowParallelFp8Linear",
    "convert",
    "save_checkpoint",
    "calibrate",
    "conversion_report",
    "ConversionReport",
    "shard_linear",
    "shard_model",
]
