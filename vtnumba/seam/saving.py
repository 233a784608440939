"""Writing FP8 layers to safetensors checkpoints that every vtnumba loader reads back bitwise, with
their format intact: ``save_fp8_checkpoint`` (seam users), and the writer ``vtnumba.torch.save_checkpoint``
shares.

What is written (``Fp8Format`` decides the names, dtypes and shapes: ``dense_names``,
``experts_names``):

- a dense layer (``Fp8Weight``) under its prefix: ``{prefix}.weight`` F8_E4M3 [N, K]; per-tensor and
  block-scaled formats in transformers' fine-grained FP8 layout (``FP8Linear``: ``weight_scale_inv``,
  a scalar or the block grid, F32 or F8_E8M0; ``activation_scale`` for static activations),
  per-channel weights and per-token activations in compressed-tensors' (``weight_scale`` [N, 1],
  ``input_scale`` [1]); ``{prefix}.bias`` in its own dtype.
- fused experts (``Fp8Experts``) under '{prefix}.gate_up_proj' and '{prefix}.down_proj': transformers'
  ``FP8Experts`` parameters, the codes F8_E4M3 [E, N, K], ``{name}_scale_inv`` and (static)
  ``{name}_activation_scale`` [E].
- the metadata: ``format`` 'pt' (what transformers' loader asks of a safetensors file), each layer's
  ``Fp8Format`` record (``RECORD_KEY``: the loaders read it, so nothing is guessed on the way back)
  and, when one config describes every layer, the public ``quantization_config``.

Files: ``path`` ending in '.safetensors' is one file; any other path is a folder holding
``model.safetensors``, or, past ``max_shard_bytes``, shards ``model-00001-of-0000N.safetensors`` and
``model.safetensors.index.json`` (transformers' names), and ``quantization_config.json`` beside them.
Each file is written whole to a temporary name and then renamed, so an interrupted save never leaves a
file that looks complete.
"""

import json
import os
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from .._format import MX_BLOCK
from ..ops import ActivationScheme
from .checkpoint import _INDEX
from .experts import Fp8Experts
from .fp8_format import QUANTIZATION_CONFIG_KEY, RECORD_KEY, Fp8Format
from .weights import Fp8Weight, ResidentFp8, _host_values

__all__ = ["save_fp8_checkpoint", "quantization_config_of", "DEFAULT_MAX_SHARD_BYTES"]

# transformers' save_pretrained default shard size ("5GB", decimal)
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
_SINGLE = "model.safetensors"
# numpy dtypes and their safetensors names; E4M3 codes and E8M0 scales are written from uint8 bytes
_DTYPE_NAMES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.float64): "F64",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}


def _host(arr) -> np.ndarray:
    """A host (numpy) copy of an array on any device."""
    return arr if isinstance(arr, np.ndarray) else np.asarray(_host_values(arr))


def tensor_entry(arr: Any, dtype: str | None = None, shape: tuple[int, ...] | None = None) -> tuple[str, np.ndarray]:
    """(safetensors dtype, C-contiguous host array) of ``arr``, reshaped to ``shape``; ``dtype``
    names bytes held as uint8 ('F8_E4M3', 'F8_E8M0')."""
    host = np.ascontiguousarray(_host(arr))
    if shape is not None:
        host = host.reshape(shape)
    if dtype is None:
        if host.dtype not in _DTYPE_NAMES:
            raise TypeError(
                f"tensor dtype must be one safetensors writes ({', '.join(map(str, _DTYPE_NAMES))}), got {host.dtype}"
            )
        dtype = _DTYPE_NAMES[host.dtype]
    return dtype, host


def dense_tensors(prefix: str, weight: Fp8Weight) -> dict[str, tuple[str, np.ndarray]]:
    """The tensors of a dense FP8 layer saved under ``prefix`` (module docstring)."""
    fmt = weight.format
    names = fmt.dense_names(prefix)
    n, k = weight.shape
    out = {names["weight"]: tensor_entry(weight.host_data(prefix), "F8_E4M3")}
    scale_dtype = fmt.scale_dtype if fmt.block_size is not None else None
    out[names["weight_scale"]] = tensor_entry(weight.weight_scale, scale_dtype, fmt.dense_scale_shape(n, k))
    if "input_scale" in names:
        shape = (1,) if fmt.layout == "compressed-tensors" else ()
        out[names["input_scale"]] = tensor_entry(np.float32(weight.input_scale), None, shape)
    if weight.bias is not None:
        out[names["bias"]] = tensor_entry(weight.bias)
    return out


def experts_tensors(name: str, experts: Fp8Experts) -> dict[str, tuple[str, np.ndarray]]:
    """The tensors of fused experts saved under ``name`` ('{prefix}.gate_up_proj' / '.down_proj')."""
    fmt = experts.format
    names = fmt.experts_names(name)
    e, n, k = experts.shape
    halves = name.endswith("gate_up_proj")
    shape = fmt.experts_scale_shape(e, n, k, halves)
    scale = _host(experts.weight_scale)
    if fmt.block_size is None and not fmt.per_channel:
        # transformers allocates [E, 2, 1] for gate_up (one scale per half): both are the expert's one
        scale = np.repeat(scale.reshape(e, 1, 1), shape[1], axis=1)
    scale_dtype = fmt.scale_dtype if fmt.block_size is not None else None
    out = {
        names["weight"]: tensor_entry(experts.host_data(name), "F8_E4M3"),
        names["weight_scale"]: tensor_entry(scale, scale_dtype, shape),
    }
    if "input_scale" in names:
        out[names["input_scale"]] = tensor_entry(np.asarray(experts.input_scale, np.float32), None, (e,))
    return out


def quantization_config_of(formats: Mapping[str, Fp8Format], ignore: tuple[str, ...] | list[str] = ()) -> Any:
    """The ``seam.Fp8Config`` that describes layers of these formats (``ignore``: the layers left in
    float), or None when no one config does (layers saved in different formats: each layer's record
    still says its own).

    One format: ``Fp8Config.from_format``. The one mix that has a config is what ``convert`` makes of
    an MXFP8 config: MXFP8 experts beside linear layers with float32 scales per 1 x 32 block (the
    torch ``Fp8Linear`` takes no E8M0 scales), which is that config."""
    from .config import Fp8Config

    kinds = set(formats.values())
    if len(kinds) == 1:
        return Fp8Config.from_format(kinds.pop(), tuple(ignore))
    mx = [f for f in kinds if f.mxfp8]
    if len(mx) == 1 and len(kinds) == 2:
        (other,) = kinds - set(mx)
        if other == Fp8Format(ActivationScheme.PER_GROUP, MX_BLOCK):
            return Fp8Config.from_format(mx[0], tuple(ignore))
    return None


def save_fp8_checkpoint(
    path: str | os.PathLike,
    layers: Mapping[str, Any],
    *,
    tensors: Mapping[str, Any] | None = None,
    ignore: tuple[str, ...] | list[str] = (),
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[str]:
    """Save FP8 layers to a safetensors checkpoint every vtnumba loader reads back bitwise, format
    intact (module docstring: names, dtypes, metadata, files). Returns the files written.

    - ``layers``: {prefix: layer}. An ``Fp8Weight`` (or ``ResidentFp8``) is a dense layer, read back
      by ``seam.load_fp8_linear(path, prefix)``; a pair ``(gate_up, down)`` of ``Fp8Experts`` is a MoE
      layer's experts under '{prefix}.gate_up_proj' / '{prefix}.down_proj', read back by
      ``seam.load_fp8_experts(path, prefix)``; one ``Fp8Experts`` may also be given under its own
      name ('model.layers.0.mlp.experts.gate_up_proj').
    - ``tensors``: other tensors to write as they are (numpy arrays: embeddings, norms, routers), by name.
    - ``ignore``: the layers the model leaves in float, written to the quantization_config.
    - ``max_shard_bytes``: a folder's shard size (bytes of tensor data); a '.safetensors' path must
      fit in one.
    """
    if not isinstance(layers, Mapping):
        raise TypeError(f"layers must be a dict of prefix -> Fp8Weight or Fp8Experts, got {type(layers).__name__}")
    entries: dict[str, tuple[str, np.ndarray]] = {}
    formats: dict[str, Fp8Format] = {}
    for prefix, layer in layers.items():
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"layers' keys must be non-empty layer names, got {prefix!r}")
        if isinstance(layer, ResidentFp8):
            layer = layer.weight
        if isinstance(layer, Fp8Weight):
            _add(entries, dense_tensors(prefix, layer), prefix)
            formats[prefix] = layer.format
        elif isinstance(layer, Fp8Experts):
            if not prefix.endswith((".gate_up_proj", ".down_proj")):
                raise ValueError(
                    f"layers[{prefix!r}] is one Fp8Experts: its name must end in '.gate_up_proj' or '.down_proj' "
                    f"(transformers' fused experts), got {prefix!r}; or give the pair (gate_up, down) under "
                    f"the experts' prefix"
                )
            _add(entries, experts_tensors(prefix, layer), prefix)
            formats[prefix] = layer.format
        elif isinstance(layer, tuple) and len(layer) == 2 and all(isinstance(x, Fp8Experts) for x in layer):
            for proj, experts in zip(("gate_up_proj", "down_proj"), layer):
                _add(entries, experts_tensors(f"{prefix}.{proj}", experts), prefix)
                formats[f"{prefix}.{proj}"] = experts.format
        else:
            raise TypeError(
                f"layers[{prefix!r}] must be an Fp8Weight, a ResidentFp8, an Fp8Experts or a pair "
                f"(gate_up, down) of Fp8Experts, got {type(layer).__name__}"
            )
    for name, arr in (tensors or {}).items():
        _add(entries, {name: tensor_entry(arr)}, name)
    config = quantization_config_of(formats, ignore)
    return write_checkpoint(path, entries, formats, None if config is None else config.to_hf(), max_shard_bytes)


def _add(entries, new, layer):
    for name, entry in new.items():
        if name in entries:
            raise ValueError(f"tensor {name!r} (of layer {layer!r}) must be written once, got it from two layers")
        entries[name] = entry


def write_checkpoint(
    path: str | os.PathLike,
    entries: Mapping[str, tuple[str, np.ndarray]],
    formats: Mapping[str, Fp8Format],
    quantization_config: dict | None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[str]:
    """Write ``entries`` ({name: (safetensors dtype, host array)}) as one file or a sharded folder
    (``save_fp8_checkpoint``'s docstring), with the metadata that records ``formats``."""
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be a positive int, got {max_shard_bytes!r}")
    path = os.fspath(path)
    metadata = {"format": "pt", RECORD_KEY: json.dumps({k: f.to_record() for k, f in sorted(formats.items())})}
    if quantization_config is not None:
        metadata[QUANTIZATION_CONFIG_KEY] = json.dumps(quantization_config)
    total = sum(arr.nbytes for _, arr in entries.values())
    if path.endswith(".safetensors"):
        if total > max_shard_bytes:
            raise ValueError(
                f"path must be a folder to hold {total} bytes of tensors in shards of max_shard_bytes = "
                f"{max_shard_bytes}, got the single file {path!r}; pass a folder, or a larger max_shard_bytes"
            )
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        _write_file(path, entries, metadata)
        return [path]
    os.makedirs(path, exist_ok=True)
    shards = _shards(entries, max_shard_bytes)
    written = []
    if len(shards) == 1:
        names = [_SINGLE]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        file = os.path.join(path, name)
        _write_file(file, {t: entries[t] for t in shard}, metadata)
        written.append(file)
    stale = os.path.join(path, _INDEX if len(shards) == 1 else _SINGLE)
    if os.path.exists(stale):  # a previous save's other layout would be read instead of this one
        os.remove(stale)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": total},
            "weight_map": {t: name for name, shard in zip(names, shards) for t in shard},
        }
        written.append(_write_json(os.path.join(path, _INDEX), index))
    if quantization_config is not None:
        written.append(_write_json(os.path.join(path, "quantization_config.json"), quantization_config))
    return written


def _shards(entries: Mapping[str, tuple[str, np.ndarray]], max_shard_bytes: int) -> list[list[str]]:
    """Tensor names in shards of at most ``max_shard_bytes`` (a tensor larger alone gets its own), in
    the order given, as transformers' ``split_torch_state_dict_into_shards`` fills them."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, (_, arr) in entries.items():
        if shards[-1] and size + arr.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += arr.nbytes
    return shards


def _write_file(path: str, entries: Mapping[str, tuple[str, np.ndarray]], metadata: dict[str, str]) -> None:
    """One safetensors file, as the format defines it: an 8-byte little-endian header length, the
    JSON header (dtype, shape, data_offsets of each tensor; ``__metadata__`` strings) padded with
    spaces to a multiple of 8, then the tensors' bytes back to back."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, (dtype, arr) in entries.items():
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(len(text) + 8) % 8)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for _, arr in entries.values():
                f.write(arr.reshape(-1).view(np.uint8).tobytes())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_json(path, value):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path
