"""``save_checkpoint``: a converted torch model written as a safetensors checkpoint that every vtnumba
loader reads back bitwise, with each layer's format intact.

The FP8 layers are written in the public layouts their format has (``seam.save_fp8_checkpoint``:
transformers' fine-grained FP8 for per-tensor and block-scaled layers and its fused ``FP8Experts``
parameters, compressed-tensors' names for per-channel / per-token ones), every other tensor of the
``state_dict`` (embeddings, norms, routers, layers left in float) as it is, and the metadata records
each FP8 layer's ``seam.Fp8Format`` and the model's ``quantization_config``. Read it back with
``convert(model, checkpoint=path)`` (the config then comes from the checkpoint),
``Fp8Linear.from_checkpoint`` / ``Fp8Experts.from_checkpoint``, or the seam loaders.
"""

import json
import os

import numpy as np
import torch
from torch import nn

from ..seam.saving import (
    DEFAULT_MAX_SHARD_BYTES,
    dense_tensors,
    experts_tensors,
    quantization_config_of,
    write_checkpoint,
)
from .custom_ops import _experts_pair, _seam_weight
from .experts import _WEIGHTS, Fp8Experts
from .linear import Fp8Linear

__all__ = ["save_checkpoint"]

# torch dtypes and their safetensors names; those without a numpy dtype are written from their bits
_DTYPES = {
    torch.float32: ("F32", None),
    torch.float16: ("F16", None),
    torch.float64: ("F64", None),
    torch.bfloat16: ("BF16", torch.int16),
    torch.float8_e4m3fn: ("F8_E4M3", torch.uint8),
    torch.int64: ("I64", None),
    torch.int32: ("I32", None),
    torch.int16: ("I16", None),
    torch.int8: ("I8", None),
    torch.uint8: ("U8", None),
    torch.bool: ("BOOL", None),
}
if hasattr(torch, "float8_e8m0fnu"):
    _DTYPES[torch.float8_e8m0fnu] = ("F8_E8M0", torch.uint8)


def _entry(name, t):
    """(safetensors dtype, host numpy array) of a tensor of the state_dict."""
    if t.dtype not in _DTYPES:
        raise TypeError(
            f"tensor {name!r} must have a dtype safetensors writes ({', '.join(str(d) for d in _DTYPES)}), got {t.dtype}"
        )
    dtype, bits = _DTYPES[t.dtype]
    host = t.detach().to("cpu").contiguous()
    if bits is not None:
        host = host.view(bits)
    return dtype, np.ascontiguousarray(host.numpy())


def _on_host(parts):
    """A layer's parts with every tensor copied to the host (the seam views them there)."""
    return tuple(p.detach().to("cpu") if isinstance(p, torch.Tensor) else p for p in parts)


def _left_in_float(model):
    """The layers ``convert`` would have made FP8 that are still float (nn.Linear, fused experts):
    the quantization_config's ignore list, so a public loader (and ``convert(model, checkpoint=...)``)
    leaves them as they are."""
    names = []
    for name, module in model.named_modules():
        if isinstance(module, (Fp8Linear, Fp8Experts)):
            continue
        params = dict(module.named_parameters(recurse=False))
        fused = all(w in params and params[w].dim() == 3 and params[w].is_floating_point() for w in _WEIGHTS)
        if isinstance(module, nn.Linear) or fused:
            names.append(name)
    return names


def save_checkpoint(
    model: nn.Module, path: str | os.PathLike, *, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
) -> list[str]:
    """Write ``model`` (converted by ``vtnumba.torch.convert``) to ``path``; returns the files written.

    - ``path`` ending in '.safetensors': one file, whose metadata carries each FP8 layer's format and
      the ``quantization_config``.
    - any other path: a folder, as transformers' ``save_pretrained`` lays one out: ``model.safetensors``,
      or past ``max_shard_bytes`` (bytes of tensor data per shard, default 5 GB as transformers')
      shards ``model-0000i-of-0000N.safetensors`` and ``model.safetensors.index.json``; beside them
      ``quantization_config.json`` and, for a transformers model, ``config.json`` with that
      ``quantization_config`` in it.

    Every tensor of ``model.state_dict()`` is written: the FP8 layers' in their public layout (module
    docstring), every other one under its own name and dtype.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, (Fp8Linear, Fp8Experts)):
        raise ValueError(
            f"model must hold its FP8 layers as named submodules, got a lone {type(model).__name__}; save "
            f"one layer with seam.save_fp8_checkpoint(path, {{name: layer.fp8_weight}}) (an Fp8Linear) or "
            f"{{name: layer.fp8_experts}} (an Fp8Experts)"
        )
    entries, formats, fp8_prefixes = {}, {}, []
    for name, module in model.named_modules():
        if isinstance(module, Fp8Linear):
            weight = _seam_weight(_on_host(module._parts()))
            entries.update(dense_tensors(name, weight))
            formats[name] = weight.format
        elif isinstance(module, Fp8Experts):
            pair = _experts_pair(_on_host(module._parts()), module.source)
            for proj, experts in zip(_WEIGHTS, pair):
                entries.update(experts_tensors(f"{name}.{proj}", experts))
                formats[f"{name}.{proj}"] = experts.format
        else:
            continue
        fp8_prefixes.append(name + ".")
    if not formats:
        raise ValueError(
            "model must hold FP8 layers (Fp8Linear, Fp8Experts) to be saved as an FP8 checkpoint, got none: "
            "convert it first (vtnumba.torch.convert), or save a float model with safetensors.torch.save_file"
        )
    for key, t in model.state_dict().items():
        if key.startswith(tuple(fp8_prefixes)) or t is None:
            continue  # the FP8 layers' buffers were written above, in the public layout
        entries[key] = _entry(key, t)
    config = quantization_config_of(formats, tuple(_left_in_float(model)))
    section = None if config is None else config.to_hf()
    written = write_checkpoint(path, entries, formats, section, max_shard_bytes)
    folder = os.fspath(path)
    hf_config = getattr(model, "config", None)
    if (
        section is not None
        and not folder.endswith(".safetensors")
        and hf_config is not None
        and hasattr(hf_config, "to_json_string")
    ):
        full = json.loads(hf_config.to_json_string(use_diff=False))
        full["quantization_config"] = section
        file = os.path.join(folder, "config.json")
        with open(file, "w", encoding="utf-8") as f:
            json.dump(full, f, indent=2)
            f.write("\n")
        written.append(file)
    return written
