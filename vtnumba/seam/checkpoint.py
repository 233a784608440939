"""Reading FP8 linear layers from safetensors checkpoints, refusing anything that would load wrong.

A layer ``prefix`` is the tensors ``{prefix}.weight`` (F8_E4M3 codes [N, K]), its scale, and the
optional ``{prefix}.input_scale`` and ``{prefix}.bias``. The scale conventions found in real
checkpoints, and what this loader does with each:

- ``weight_scale`` (ModelOpt, compressed-tensors, AutoFP8 / vLLM "fp8"): the dequantization
  multiplier, ``w = decode(codes) * weight_scale``. Shapes [] or [1] (per-tensor), [N] or [N, 1]
  (per-channel; compressed-tensors writes [N, 1], often in bfloat16).
- ``weight_scale_inv`` (DeepSeek-V3 / Qwen3-FP8 style block checkpoints): despite the name, ALSO the
  dequantization multiplier -- DeepSeek-V3's reference ``weight_dequant`` computes ``y = x * s`` with
  it, and vLLM loads it into the same parameter as ``weight_scale``. It is read as the multiplier, never
  inverted, and the weight's ``source`` says so. Its usual shape is per block [ceil(N/b), ceil(K/b)],
  which is refused as "not supported yet", naming the tensor.
- ``scale`` (DeepSeek's later releases: the block scales of ``{prefix}.weight`` under this name, which
  transformers renames to ``weight_scale_inv``): read as ``weight_scale_inv`` is.
- E8M0 scales (MXFP8 per 1 x 32, DeepSeek's UE8M0 128 x 128 blocks): a block scale tensor of dtype
  F8_E8M0 or U8 holds E8M0 bytes, 2^(byte - 127), kept as bytes (``Fp8Weight`` takes them); 0xFF
  (NaN) is refused, naming the block.
- more than one present: refused (ambiguous); none: refused, naming the names looked for.

Scales must be finite and > 0; codes may not hold NaN (0x7F / 0xFF). Files: one ``.safetensors``
file, a directory holding ``model.safetensors`` or a sharded ``model.safetensors.index.json``
(``weight_map``), or the index file itself. Tensors are read with the ``safetensors`` package
(numpy); F8_E4M3, which its numpy loader cannot return (numpy has no float8 type), is read from the
file's documented layout (8-byte little-endian header length, JSON header, raw bytes).

A file's header is checked as the format defines it when the checkpoint is opened: every entry a
dtype, a shape of ints >= 0 and data_offsets spanning exactly its bytes, the tensors back to back
from the data's first byte (no overlap, no gap), ``__metadata__`` strings; a sharded index must map
each tensor to the shard that holds it, and no tensor may be in two shards. The file's size is
checked against its header before its first tensor is read: a truncated file (an interrupted
download or copy) is named with the layer being read and the fix, where safetensors itself would
say only "incomplete metadata, file not fully covered". Every error names the tensor (so the layer)
and, where a file is at fault, the file.
"""

import json
import math
import os
import struct
from collections.abc import Sequence
from typing import TypeAlias

import ml_dtypes
import numpy as np

from .. import _faults
from .fp8_format import QUANTIZATION_CONFIG_KEY, RECORD_KEY, Fp8Format
from .fusion import fuse_fp8_shards
from .weights import Fp8Weight

__all__ = ["load_fp8_linear", "load_fp8_fused_linear", "load_float_linear", "Checkpoint"]

_INDEX = "model.safetensors.index.json"
# one-byte dtypes read from the file's bytes: numpy (safetensors' numpy loader) has neither
_BYTE_DTYPES = ("F8_E4M3", "F8_E8M0")
_E8M0_DTYPES = ("F8_E8M0", "U8")  # a block scale tensor of these holds E8M0 bytes
_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64}
# bits per element of every safetensors dtype (the format's list, as safetensors 0.8 reads it: a
# file with another dtype name is refused by safetensors too, so it is refused here, naming it)
_DTYPE_BITS = {
    "F4": 4,
    **dict.fromkeys(("F6_E2M3", "F6_E3M2"), 6),
    **dict.fromkeys(("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"), 8),
    **dict.fromkeys(("I16", "U16", "F16", "BF16"), 16),
    **dict.fromkeys(("I32", "U32", "F32"), 32),
    **dict.fromkeys(("I64", "U64", "F64", "C64"), 64),
}
# the step where a tensor's bytes are copied from its file into a host array (tests arm it)
_HOST_COPY = _faults.register("checkpoint.host_copy", "Checkpoint.read copying a tensor's bytes from its file")


class Checkpoint:
    """The tensors of a safetensors checkpoint (one file, a directory, or a sharded index): names,
    dtypes, shapes from the headers; arrays read on request."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        path = os.fspath(path)
        self.path = path
        index: str | None  # the sharded index read, whose weight_map is checked against its shards
        if os.path.isdir(path):
            index = os.path.join(path, _INDEX)
            single = os.path.join(path, "model.safetensors")
            if os.path.isfile(index):
                files = self._from_index(index)
            elif os.path.isfile(single):
                index, files = None, [single]
            else:
                index = None
                files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
                if not files:
                    raise ValueError(
                        f"path must hold model.safetensors, {_INDEX} or *.safetensors files, "
                        f"got a directory without them: {path!r}"
                    )
        elif path.endswith(".json"):
            index = path
            files = self._from_index(index)
        elif os.path.isfile(path):
            index, files = None, [path]
        else:
            raise ValueError(
                f"path must be a .safetensors file, an index .json or a model directory, got {path!r} (not found)"
            )
        self._where = {}  # tensor name -> (file, header entry, data start)
        self._data_end = {}  # file -> the byte where its last tensor ends, by its header
        self._metadata = {}  # file -> its header's __metadata__ (strings), where it has one
        for file in files:
            header, data_start = _read_header(file)
            self._data_end[file] = data_start + _check_entries(file, header, data_start)
            if header.get("__metadata__"):
                self._metadata[file] = header["__metadata__"]
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                if name in self._where:
                    raise ValueError(
                        f"tensor {name!r} must be in one file of the checkpoint, got it in both "
                        f"{self._where[name][0]!r} and {file!r}: which one to read is ambiguous"
                    )
                self._where[name] = (file, entry, data_start)
        if index is not None:
            self._check_index(index)
        # what a vtnumba saver recorded, read with the headers (a load never changes a Checkpoint)
        self._formats = _recorded_formats(path, self.metadata())

    def _check_index(self, index):
        """Each tensor is in the shard the index maps it to: an index that disagrees with its shards
        (a tensor elsewhere, or in none) would read a tensor the index does not describe, or miss one."""
        base = os.path.dirname(index)
        for name, shard in self._weight_map.items():
            held = self._where.get(name)
            if held is None or held[0] != os.path.join(base, shard):
                got = f"held by {os.path.basename(held[0])!r}" if held else "held by none of its shards"
                raise ValueError(
                    f"{index!r} must map tensor {name!r} to the shard that holds it, got {shard!r} with the "
                    f"tensor {got}: the index and its shards disagree; download or copy the checkpoint again"
                )

    def _from_index(self, index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{index!r} must be a safetensors index with a weight_map, got {exc!r}") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) and f for f in weight_map.values()):
            bad = (
                weight_map
                if not isinstance(weight_map, dict)
                else next({k: f} for k, f in weight_map.items() if not (isinstance(f, str) and f))
            )
            raise ValueError(f"{index!r} must hold a weight_map of tensor names to shard file names, got {_short(bad)}")
        self._weight_map = weight_map
        base = os.path.dirname(index)
        files = sorted({os.path.join(base, f) for f in weight_map.values()})
        for file in files:
            if not os.path.isfile(file):
                held = sorted(t for t, f in weight_map.items() if os.path.join(base, f) == file)
                raise ValueError(
                    f"shard {os.path.basename(file)!r} named in {os.path.basename(index)} must exist, got missing "
                    f"(the index puts {len(held)} tensor(s) there: {', '.join(map(repr, held[:3]))}"
                    f"{', ...' if len(held) > 3 else ''})"
                )
        return files

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def metadata(self) -> dict[str, str]:
        """The files' safetensors ``__metadata__`` merged (strings; a key's first file wins), where the
        entries vtnumba's savers write (the format records, the quantization_config) must agree: two
        files that give one of them different values are refused, naming both."""
        merged: dict[str, str] = {}
        origin: dict[str, str] = {}
        for file, meta in self._metadata.items():
            for key, value in meta.items():
                if key not in merged:
                    merged[key], origin[key] = value, file
                elif merged[key] != value and key in (RECORD_KEY, QUANTIZATION_CONFIG_KEY):
                    raise ValueError(
                        f"__metadata__ entry {key!r} must be the same in every file of the checkpoint, got "
                        f"different values in {origin[key]!r} and {file!r}: the shards are of different saves; "
                        f"save the checkpoint again"
                    )
        return merged

    def formats(self) -> "dict[str, Fp8Format]":
        """{layer: Fp8Format} of the FP8 layers whose format a vtnumba saver recorded in the files'
        metadata (a dense layer under its prefix, fused experts under '{prefix}.gate_up_proj' and
        '{prefix}.down_proj'); {} for a checkpoint written by anything else."""
        return self._formats

    def format_of(self, layer: str) -> "Fp8Format | None":
        """The recorded ``Fp8Format`` of ``layer`` (``formats``), or None."""
        return self.formats().get(layer)

    def quantization_config(self) -> dict | None:
        """The ``quantization_config`` a vtnumba saver wrote in the files' metadata, or None."""
        text = self.metadata().get(QUANTIZATION_CONFIG_KEY)
        if text is None:
            return None
        try:
            section = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"__metadata__ entry {QUANTIZATION_CONFIG_KEY!r} in {self.path!r} must be JSON, got {exc}"
            ) from None
        if not isinstance(section, dict):
            raise ValueError(
                f"__metadata__ entry {QUANTIZATION_CONFIG_KEY!r} in {self.path!r} must be a JSON object, "
                f"got {type(section).__name__}"
            )
        return section

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self._where if n.startswith(prefix))

    def dtype(self, name: str) -> str:
        """The tensor's safetensors dtype name: 'F8_E4M3', 'F32', 'BF16', 'U8' ..."""
        return self._where[name][1]["dtype"]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name][1]["shape"])

    def file(self, name: str) -> str:
        return self._where[name][0]

    def read(self, name: str) -> np.ndarray:
        """The tensor as a numpy array: float dtypes as numpy / ml_dtypes.bfloat16, F8_E4M3 codes and F8_E8M0
        scale bytes as uint8."""
        file, entry, data_start = self._where[name]
        self._check_size(file, name)
        return self._host_copy(name, file, entry, data_start)

    def _host_copy(self, name, file, entry, data_start):
        """A new host array holding the tensor's bytes, copied from its file (the one place tensor data
        is read; the file is closed however the copy ends)."""
        dtype, shape = entry["dtype"], tuple(entry["shape"])
        if dtype not in _BYTE_DTYPES:
            from safetensors import SafetensorError, safe_open

            try:
                with safe_open(file, framework="np") as f:
                    if _faults.armed:
                        _faults.fire(_HOST_COPY, f"tensor {name!r} in {file!r}")
                    return f.get_tensor(name)
            except SafetensorError as exc:  # safetensors' own message names neither the file nor the tensor
                raise ValueError(
                    f"layer {_layer(name)!r}: tensor {name!r} in {file!r} must be readable by "
                    f"safetensors, got {exc}; the file is damaged: download or copy it "
                    f"again"
                ) from None
        start, _ = entry["data_offsets"]  # the span was checked against the shape with the header
        codes = np.empty(math.prod(shape), dtype=np.uint8)
        with open(file, "rb") as f:
            f.seek(data_start + start)
            if _faults.armed:
                _faults.fire(_HOST_COPY, f"tensor {name!r} in {file!r}")
            got = f.readinto(codes)
        if got != codes.size:  # the file shrank since its size was checked
            raise ValueError(
                f"layer {_layer(name)!r}: tensor {name!r} in {file!r} must be {codes.size} bytes, got "
                f"{got} before the end of the file: the file changed while it was read; copy it again"
            )
        return codes.reshape(shape)

    def _check_size(self, file, name):
        """The file holds exactly the bytes its header describes, checked before every read (a stat, no
        state kept: a file cut after an earlier read is caught too): a short file is the common case,
        a download or copy cut off."""
        want, size = self._data_end[file], os.path.getsize(file)
        if size < want:
            cut = sorted(n for n, (f, e, d) in self._where.items() if f == file and _tensor_end(e, d) > size)
            raise ValueError(
                f"layer {_layer(name)!r}: file {file!r} must hold the {want} bytes its header describes, got "
                f"{size}: the file is truncated (an interrupted download or copy), cutting off {len(cut)} "
                f"tensor(s) ({', '.join(cut[:3])}{', ...' if len(cut) > 3 else ''}); download or copy it again"
            )
        if size > want:
            raise ValueError(
                f"layer {_layer(name)!r}: file {file!r} must end where its last tensor ends (byte {want}), got "
                f"{size - want} bytes more: the file is damaged or not one safetensors file; download or "
                f"copy it again"
            )


def _recorded_formats(path, metadata):
    """{layer: Fp8Format} from the metadata entry ``RECORD_KEY`` (fp8_format), {} without one."""
    text = metadata.get(RECORD_KEY)
    if text is None:
        return {}
    try:
        records = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"__metadata__ entry {RECORD_KEY!r} in {path!r} must be JSON, got {exc}") from None
    if not isinstance(records, dict):
        raise ValueError(
            f"__metadata__ entry {RECORD_KEY!r} in {path!r} must map layer names to format records, "
            f"got {type(records).__name__}"
        )
    return {
        layer: Fp8Format.from_record(record, f" of layer {layer!r} in {path!r}") for layer, record in records.items()
    }


# A checkpoint given as a path (a .safetensors file, an index .json or a model directory) or opened.
CheckpointLike: TypeAlias = str | os.PathLike | Checkpoint


def _tensor_end(entry, data_start):
    """The byte where a (checked) header entry's tensor ends in its file."""
    return data_start + entry["data_offsets"][1]


def _short(value, limit=80):
    """``repr(value)``, cut to ``limit`` characters: a damaged header can hold anything."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entries(file, header, data_start):
    """The header's entries checked as the safetensors format defines them (its own reader refuses
    the same files), so that no damaged entry is read: returns the data's length by the header."""
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise ValueError(
            f"{file!r} must be a safetensors file: its __metadata__ must map names to strings, got {_short(meta)}"
        )
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        what = f"{file!r} must be a safetensors file: tensor {name!r} must have"
        if not isinstance(entry, dict):
            raise ValueError(f"{what} an entry of dtype, shape and data_offsets, got {_short(entry)}")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise ValueError(f"{what} a dtype name, got dtype {_short(dtype)}")
        if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
            raise ValueError(f"{what} a shape of ints >= 0, got shape {_short(shape)}")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(map(_is_count, offsets))
            and offsets[0] <= offsets[1]
        ):
            raise ValueError(f"{what} data_offsets [begin, end] with 0 <= begin <= end, got {_short(offsets)}")
        if dtype not in _DTYPE_BITS:
            raise ValueError(f"{what} a safetensors dtype ({', '.join(_DTYPE_BITS)}), got dtype {_short(dtype)}")
        bits = math.prod(shape) * _DTYPE_BITS[dtype]
        if bits % 8 or offsets[1] - offsets[0] != bits // 8:
            raise ValueError(
                f"{what} data_offsets spanning {bits / 8:g} bytes for shape {shape} ({dtype}), got {offsets} "
                f"({offsets[1] - offsets[0]} bytes): the file's header is wrong; write the checkpoint again"
            )
        spans.append((offsets[0], offsets[1], name))
    # An overlap names the two tensors that claim the same bytes, so it is reported before a gap
    # (which a tensor moved elsewhere leaves behind it); a tensor moved past the data is named too.
    end, before, overlap, gap = 0, None, None, None
    for begin, stop, name in sorted(spans):
        if begin < end and overlap is None:
            overlap = (name, begin, stop, before, end)
        elif begin > end and gap is None:
            gap = (name, begin, stop, before, end)
        if stop >= end:
            end, before = stop, name
    if overlap or gap:
        name, begin, stop, before, at = overlap or gap
        after = f"where tensor {before!r} ends" if before is not None else "at the data's first byte"
        size = os.path.getsize(file) - data_start
        past = sorted(n for _, e, n in spans if e > size)
        raise ValueError(
            f"{file!r} must be a safetensors file: tensor {name!r} must begin {after} (byte {at} of the "
            f"data), got data_offsets {[begin, stop]}: "
            + ("the two overlap" if overlap else f"{begin - at} bytes between them")
            + (f", and {', '.join(map(repr, past[:3]))} end(s) past the data's {size} bytes" if past else "")
            + "; the file's header is wrong: write the checkpoint again"
        )
    return end


def _layer(tensor):
    """The layer a tensor belongs to: its name without the last part ('...down_proj.weight' ->
    '...down_proj')."""
    return tensor.rsplit(".", 1)[0]


def _read_header(file):
    """(header dict, offset where the data starts) of a safetensors file."""
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(
                f"{file!r} must be a safetensors file, got {len(raw)} bytes: the file is empty or "
                f"truncated; download or copy it again"
            )
        (length,) = struct.unpack("<Q", raw)
        if length > 100 * 2**20:  # the format caps headers at 100 MB
            raise ValueError(f"{file!r} must be a safetensors file, got a header length of {length}")
        text = f.read(length)
        if len(text) < length:
            raise ValueError(
                f"{file!r} must hold its {length}-byte header, got {len(text)} bytes of it: the file "
                f"is truncated (an interrupted download or copy); download or copy it again"
            )
        try:
            header = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{file!r} must be a safetensors file, got an unreadable header ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file!r} must be a safetensors file (a JSON object header), got {type(header).__name__}")
    return header, 8 + length


def _checkpoint(path_or_checkpoint, prefix=None):
    """The ``Checkpoint`` at a path (or the one given); errors name the layer being read."""
    if isinstance(path_or_checkpoint, Checkpoint):
        return path_or_checkpoint
    try:
        return Checkpoint(path_or_checkpoint)
    except ValueError as exc:
        if prefix is None:
            raise
        raise ValueError(f"layer {prefix!r}: {exc}") from None


def _read_float(ckpt, name):
    dtype = ckpt.dtype(name)
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"tensor {name!r} must be a float tensor (F32, F16, BF16), got {dtype} in {ckpt.file(name)!r}")
    return ckpt.read(name)


def _scalar(ckpt, name):
    """A per-tensor scale tensor ([] / [1] / [1, 1]) as a positive finite float32."""
    shape = ckpt.shape(name)
    if math.prod(shape) != 1 or len(shape) > 2:
        raise ValueError(
            f"tensor {name!r} must be a scalar (shape [] or [1]), got shape {list(shape)} in {ckpt.file(name)!r}"
        )
    value = np.float32(_read_float(ckpt, name).astype(np.float32).reshape(()))
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"tensor {name!r} must be a positive finite scale, got {float(value)!r} in {ckpt.file(name)!r}"
        )
    return value


def load_fp8_linear(
    path: CheckpointLike,
    prefix: str,
    *,
    activation_scheme: str | None = None,
    block_size: tuple[int, int] | None = None,
    scale_ue8m0: bool | None = None,
    activation_scale_format: str | None = None,
    activation_scale_rounding: str | None = None,
) -> Fp8Weight:
    """The ``Fp8Weight`` of layer ``prefix`` (e.g. 'model.layers.0.mlp.down_proj') from a safetensors
    checkpoint (file, directory or sharded index; or a ``Checkpoint``).

    ``block_size=(bn, bk)`` (a block-scaled checkpoint's ``weight_block_size``): the scale tensor
    is [ceil(N / bn), ceil(K / bk)] (``weight_scale_inv`` in DeepSeek-V3/R1 and Qwen3-FP8,
    ``weight_scale`` in compressed-tensors' block preset; float32, or bfloat16 / float16 widened
    exactly, or E8M0 bytes: F8_E8M0 or U8, kept as bytes), the activations per group of bk
    (``scale_ue8m0``: power-of-two group scales). MXFP8 layers (ModelOpt, compressed-tensors, "mxfp8"
    checkpoints) are ``block_size=(1, 32)`` with E8M0 ``weight_scale`` / ``weight_scale_inv``: their
    activations are quantized MXFP8 (``activation_scale_format`` 'e8m0', the default for E8M0 scales in
    1 x bk blocks; ``Fp8Weight``).

    ``activation_scheme`` (usually from ``Fp8Config``): 'static' requires ``{prefix}.input_scale``
    (or transformers' ``{prefix}.activation_scale``); 'dynamic' / 'per_token' ignore a stored input
    scale (as vLLM does for dynamic schemes). By default: 'static' when the checkpoint has an input
    scale, else 'dynamic'. ``weight.source`` records the files, the tensors and the scale convention
    read.

    A checkpoint written by vtnumba (``seam.save_fp8_checkpoint``, ``vtnumba.torch.save_checkpoint``)
    records each layer's ``Fp8Format`` in its metadata: every keyword left None is then the saved
    one, so the layer comes back as it was saved (scheme, block size, scale formats, rounding); a
    keyword that contradicts the record is refused, naming both.
    """
    ckpt = _checkpoint(path, prefix)
    recorded = _recorded_kwargs(
        ckpt,
        prefix,
        activation_scheme=activation_scheme,
        block_size=block_size,
        scale_ue8m0=scale_ue8m0,
        activation_scale_format=activation_scale_format,
        activation_scale_rounding=activation_scale_rounding,
    )
    fmt = recorded.pop("format")
    weight = _load_fp8_linear(ckpt, prefix, **recorded)
    if fmt is not None and weight.format != fmt:
        raise ValueError(
            f"layer {prefix!r}: its tensors in {ckpt.path!r} must hold the format recorded in the file's "
            f"metadata ({fmt}), got {weight.format}: the file was edited after it was saved; save it again"
        )
    return weight


def _recorded_kwargs(ckpt, layer, **given):
    """The loader keywords for ``layer``: the ``Fp8Format`` a vtnumba saver recorded (``format``,
    returned too), with every given keyword checked against it; without a record, the keywords as
    given (``scale_ue8m0`` None read as False)."""
    fmt = ckpt.format_of(layer) if isinstance(ckpt, Checkpoint) else None
    if fmt is None:
        return {**given, "scale_ue8m0": False if given["scale_ue8m0"] is None else given["scale_ue8m0"], "format": None}
    saved = fmt.loader_kwargs()
    for key, value in given.items():
        if value is None:
            continue
        want = saved[key]
        got = tuple(value) if key == "block_size" else bool(value) if key == "scale_ue8m0" else str(value)
        if got != want:
            raise ValueError(
                f"{key} must be {want!r}, the value layer {layer!r} was saved with (its format, recorded in "
                f"the metadata of {ckpt.path!r}: {fmt}), got {value!r}; leave {key} out to read the layer as "
                f"saved, or quantize it anew from its float weight"
            )
    return {**saved, "format": fmt}


def _load_fp8_linear(
    ckpt, prefix, *, activation_scheme, block_size, scale_ue8m0, activation_scale_format, activation_scale_rounding
):
    """``load_fp8_linear`` once its keywords are settled."""
    wname = f"{prefix}.weight"
    if wname not in ckpt:
        near = ckpt.names(prefix + ".")
        raise ValueError(
            f"tensor {wname!r} must be in the checkpoint {ckpt.path!r}, got none"
            + (f" (tensors under {prefix!r}: {near})" if near else f" (no tensor starts with {prefix!r})")
        )
    dtype, shape = ckpt.dtype(wname), ckpt.shape(wname)
    if dtype != "F8_E4M3":
        raise ValueError(
            f"layer {prefix!r}: tensor {wname!r} must hold F8_E4M3 codes, got {dtype}"
            + _not_fp8_hint(ckpt, wname, dtype)
        )
    if len(shape) != 2 or 0 in shape:
        raise ValueError(
            f"tensor {wname!r} must be 2-D [N, K] with N, K >= 1, got shape {list(shape)} in {ckpt.file(wname)!r}"
        )
    n, k = shape

    present = [s for s in (f"{prefix}.weight_scale", f"{prefix}.weight_scale_inv", f"{prefix}.scale") if s in ckpt]
    if not present:
        raise ValueError(
            f"tensor {prefix}.weight_scale (or {prefix}.weight_scale_inv, or {prefix}.scale) must be in "
            f"the checkpoint for the FP8 weight {wname!r} (in {ckpt.file(wname)!r}), got none: without it the "
            f"codes cannot be dequantized"
        )
    if len(present) > 1:
        raise ValueError(
            f"tensors {' and '.join(map(repr, present))} must not all be present (which one "
            f"scales the weight is ambiguous), got {len(present)} in {sorted({ckpt.file(s) for s in present})}"
        )
    sname = present[0]
    sshape = ckpt.shape(sname)
    if block_size is not None:
        return _load_block_fp8(
            ckpt,
            prefix,
            wname,
            sname,
            (n, k),
            block_size,
            scale_ue8m0,
            activation_scheme,
            activation_scale_format,
            activation_scale_rounding,
        )
    if activation_scale_rounding is not None:
        raise ValueError(
            f"activation_scale_rounding applies to block-scaled layers (MXFP8) only, got "
            f"{activation_scale_rounding!r} for layer {prefix!r} without block_size"
        )
    if ckpt.dtype(sname) in _E8M0_DTYPES and sshape == (n, -(-k // 32)):
        raise ValueError(
            f"tensor {sname!r} in {ckpt.file(sname)!r} holds E8M0 bytes ({ckpt.dtype(sname)}) of shape "
            f"{list(sshape)} for a weight of shape {[n, k]}: an MXFP8 layer; pass block_size=(1, 32), or "
            f"read it through Fp8Config.from_hf(config).load_linear"
        )
    if sshape in ((), (1,), (1, 1)):
        scale_kind = "per-tensor"
    elif sshape in ((n,), (n, 1)):
        scale_kind = "per-channel"
    elif len(sshape) == 2 and sshape[0] < n and sshape[1] < k:
        raise ValueError(
            f"tensor {sname!r} has shape {list(sshape)} for a weight of shape {[n, k]}: a "
            f"block-scaled layer; pass block_size (the checkpoint's weight_block_size), or read it "
            f"through Fp8Config.from_hf(config).load_linear (the tensor is in {ckpt.file(sname)!r})"
        )
    else:
        raise ValueError(
            f"tensor {sname!r} must have shape [] or [1] (per-tensor), [{n}] or [{n}, 1] "
            f"(per-channel) for a weight of shape {[n, k]}, got shape {list(sshape)} in {ckpt.file(sname)!r}"
        )
    scale = _read_float(ckpt, sname).astype(np.float32).reshape(-1)
    bad = ~(np.isfinite(scale) & (scale > 0))
    if bad.any():
        raise ValueError(
            f"tensor {sname!r} must hold positive finite scales, got {scale[bad][:4].tolist()} "
            f"at {np.flatnonzero(bad)[:4].tolist()} in {ckpt.file(sname)!r}"
        )
    if not sname.endswith(".weight_scale"):
        name = sname.rsplit(".", 1)[1]
        convention = (
            f"{name} read as the dequantization multiplier (w = codes * {name}), "
            "the DeepSeek-V3 / vLLM meaning despite the name"
        )
    else:
        convention = "weight_scale read as the dequantization multiplier (w = codes * weight_scale)"

    codes = _finite_codes(ckpt, wname)

    # the static activation scale: ``input_scale`` (vLLM, ModelOpt, compressed-tensors) or
    # ``activation_scale`` (transformers' FP8Linear)
    inames = [i for i in (f"{prefix}.input_scale", f"{prefix}.activation_scale") if i in ckpt]
    if len(inames) > 1:
        raise ValueError(
            f"tensors {' and '.join(map(repr, inames))} must not both be present (which one is the static "
            f"activation scale is ambiguous), got both in {sorted({ckpt.file(i) for i in inames})}"
        )
    iname = inames[0] if inames else f"{prefix}.input_scale"
    input_scale = _scalar(ckpt, iname) if inames else None
    if activation_scheme is None:
        activation_scheme = "static" if input_scale is not None else "dynamic"
    elif activation_scheme == "static" and input_scale is None:
        raise ValueError(
            f"tensor {iname!r} must be in the checkpoint for activation_scheme='static', got none in {ckpt.path!r}"
        )
    read_input_scale = activation_scheme == "static"

    bname = f"{prefix}.bias"
    bias = _bias(ckpt, bname, n)

    tensors = [wname, sname] + ([iname] if read_input_scale else []) + ([bname] if bias is not None else [])
    source = {
        "files": sorted({os.path.basename(ckpt.file(t)) for t in tensors}),
        "tensors": tensors,
        "weight_scale": f"{sname} ({scale_kind}, shape {list(sshape)}, {ckpt.dtype(sname)})",
        "scale_convention": convention,
        "input_scale": iname
        if read_input_scale
        else (f"{iname} ignored (activation_scheme={activation_scheme!r})" if input_scale is not None else None),
    }
    return Fp8Weight(
        codes,
        scale,
        input_scale=input_scale if read_input_scale else None,
        bias=bias,
        activation_scheme=activation_scheme,
        source=source,
    )


def _not_fp8_hint(ckpt, wname, dtype):
    """What to do about a weight tensor that is not F8_E4M3."""
    if dtype in _FLOAT_DTYPES:
        return (
            f": the layer is not FP8-quantized (its weight in {ckpt.file(wname)!r} is float: read it with "
            f"load_float_linear)"
        )
    if dtype == "U8":
        # some exporters write e4m3 codes as plain bytes: the bits are right, the dtype tag is not
        return (
            f" in {ckpt.file(wname)!r}: uint8 bytes, which may be e4m3fn codes stored without their dtype. "
            f"If they are, view them as float8_e4m3fn and save again (numpy: codes.view(ml_dtypes.float8_e4m3fn); "
            f"torch: t.view(torch.float8_e4m3fn); safetensors then writes F8_E4M3), or build the weight from "
            f"them: seam.Fp8Weight(seam.Checkpoint(path).read({wname!r}), weight_scale)"
        )
    return f" in {ckpt.file(wname)!r}: vtnumba reads e4m3fn (F8_E4M3) FP8 weights only"


def _bias(ckpt, bname, n):
    """The layer's bias [N] (float, finite), or None when the checkpoint has none."""
    if bname not in ckpt:
        return None
    bias = _read_float(ckpt, bname)
    if tuple(bias.shape) != (n,):
        raise ValueError(
            f"tensor {bname!r} must have shape [{n}], got shape {list(bias.shape)} in {ckpt.file(bname)!r}"
        )
    bad = ~np.isfinite(bias.astype(np.float32))
    if bad.any():
        raise ValueError(
            f"tensor {bname!r} must be finite, got {bias.astype(np.float32)[bad][:4].tolist()} at "
            f"{np.flatnonzero(bad)[:4].tolist()} in {ckpt.file(bname)!r}"
        )
    return bias


def _finite_codes(ckpt, wname):
    codes = ckpt.read(wname)
    nan = (codes & 0x7F) == 0x7F
    if nan.any():
        raise ValueError(
            f"tensor {wname!r} must hold finite e4m3 codes, got {int(nan.sum())} NaN codes "
            f"(0x7F / 0xFF), first at {np.argwhere(nan)[0].tolist()}, in {ckpt.file(wname)!r}"
        )
    return codes


def _load_block_fp8(
    ckpt,
    prefix,
    wname,
    sname,
    shape,
    block_size,
    scale_ue8m0,
    activation_scheme,
    activation_scale_format=None,
    activation_scale_rounding=None,
):
    """A block-scaled layer: codes, [ceil(N / bn), ceil(K / bk)] scales (each block's checked, named):
    float scales widened to float32, E8M0 ones (F8_E8M0, U8) kept as bytes."""
    n, k = shape
    bn, bk = (int(v) for v in block_size)
    want = [-(-n // bn), -(-k // bk)]
    if list(ckpt.shape(sname)) != want:
        raise ValueError(
            f"tensor {sname!r} must have shape {want} for a weight of shape {[n, k]} in {bn} x {bk} "
            f"blocks, got shape {list(ckpt.shape(sname))} in {ckpt.file(sname)!r}"
        )
    sdtype = ckpt.dtype(sname)
    if sdtype in _E8M0_DTYPES:
        scale = ckpt.read(sname).view(np.uint8)
        bad = scale == 0xFF
        kind = "finite E8M0 block scales (0xFF is NaN)"
    else:
        scale = _read_float(ckpt, sname).astype(np.float32)  # bf16 / f16 widen exactly
        bad = ~(np.isfinite(scale) & (scale > 0))
        kind = "positive finite block scales"
    if bad.any():
        first = np.argwhere(bad)[0].tolist()
        raise ValueError(
            f"layer {prefix!r}: tensor {sname!r} must hold {kind}, got "
            f"{scale[tuple(first)]!r} at block {first} ({int(bad.sum())} bad blocks) in {ckpt.file(sname)!r}"
        )
    if activation_scheme not in (None, "per_group"):
        raise ValueError(
            f"activation_scheme must be 'per_group' for the block-scaled layer {prefix!r}, got {activation_scheme!r}"
        )
    bname = f"{prefix}.bias"
    bias = _bias(ckpt, bname, n)
    tensors = [wname, sname] + ([bname] if bias is not None else [])
    e8m0 = sdtype in _E8M0_DTYPES
    source = {
        "files": sorted({os.path.basename(ckpt.file(t)) for t in tensors}),
        "tensors": tensors,
        "weight_scale": f"{sname} (block {bn} x {bk}, shape {want}, {sdtype}{', E8M0 bytes' if e8m0 else ''})",
        "scale_convention": (
            f"{sname} read as the dequantization multiplier of each block (w = codes * "
            + ("2^(byte - 127))" if e8m0 else "scale)")
        ),
    }
    return Fp8Weight(
        _finite_codes(ckpt, wname),
        scale,
        bias=bias,
        block_size=(bn, bk),
        scale_ue8m0=scale_ue8m0,
        activation_scheme="per_group",
        source=source,
        activation_scale_format=activation_scale_format,
        activation_scale_rounding=activation_scale_rounding,
    )


def load_fp8_fused_linear(
    path: CheckpointLike,
    prefixes: Sequence[str],
    *,
    activation_scheme: str | None = None,
    block_size: tuple[int, int] | None = None,
    scale_ue8m0: bool | None = None,
    activation_scale_format: str | None = None,
) -> Fp8Weight:
    """One ``Fp8Weight`` from shards stored separately (q/k/v_proj, gate/up_proj), stacked in the
    order given, with ``fuse_fp8_shards`` (max-scale requantization for per-tensor scales; block
    scales concatenated)."""
    ckpt = _checkpoint(path, prefixes[0] if len(prefixes) else None)
    return fuse_fp8_shards(
        [
            load_fp8_linear(
                ckpt,
                p,
                activation_scheme=activation_scheme,
                block_size=block_size,
                scale_ue8m0=scale_ue8m0,
                activation_scale_format=activation_scale_format,
            )
            for p in prefixes
        ]
    )


def load_float_linear(path: CheckpointLike, prefix: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``(weight, bias or None)`` of an unquantized layer (F32 / F16 / BF16 tensors)."""
    ckpt = _checkpoint(path, prefix)
    wname, bname = f"{prefix}.weight", f"{prefix}.bias"
    if wname not in ckpt:
        raise ValueError(f"tensor {wname!r} must be in the checkpoint {ckpt.path!r}, got none")
    weight = _read_float(ckpt, wname)
    if weight.ndim != 2:
        raise ValueError(f"tensor {wname!r} must be 2-D [N, K], got shape {list(weight.shape)} in {ckpt.file(wname)!r}")
    bias = _read_float(ckpt, bname) if bname in ckpt else None
    return weight, bias
