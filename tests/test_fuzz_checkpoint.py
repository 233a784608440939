"""Corrupt checkpoints, fuzzed: Hypothesis mutates small valid FP8 checkpoints of every format the
seam reads, and each mutated checkpoint must either be refused with a ValueError that names the file
and the tensor (or the config field), or load to exactly what an independent reference reader (the
header parsed with json, the bytes taken with np.frombuffer) finds in the same files. No load may
raise anything else, hang, or read a byte past the end of a file.

Formats (the valid checkpoints are the layouts tests/test_experts_checkpoint.py writes): dense FP8
per-tensor ("fp8" config, static input scale, bias), per-channel (compressed-tensors, BF16 [N, 1]),
128 x 128 blocks (F32 ``weight_scale_inv``, bias), UE8M0 blocks (F8_E8M0), MXFP8 (E8M0 per 1 x 32),
ModelOpt FP8 (hf_quant_config.json), per-expert MoE experts (ModelOpt, gate and up fused at the
larger scale), transformers' fused experts (block scales), and a sharded checkpoint with its index.

Mutations: the 8-byte header length, bytes of the JSON header, its fields (dtype, shape,
data_offsets changed, swapped, negative, past the end of the file, overlapping; entries deleted,
renamed, not objects; ``__metadata__``), wrong dtypes and shapes in a consistent header, tensors
resized, scales NaN / inf / <= 0 (and legal values), E8M0 bytes 0xFF (and legal ones), NaN codes,
truncated and extended files, a missing shard, index fields and bytes, and config.json fields
(quant_method, weight_block_size, activation_scheme, scale_fmt, ignore, ...) and bytes.

CI runs a fixed seed (``derandomize``): about 2,550 mutations in all, an equal share for each kind of
mutation of each format (fewer where a kind has fewer distinct mutations: two shards to remove),
in about 35 s on two cores. A longer run, its total shared out the same way:

    VTNUMBA_FUZZ_EXAMPLES=20000 python -m pytest -s tests/test_fuzz_checkpoint.py

and ``VTNUMBA_FUZZ_SEED=<int>`` draws other mutations than CI's seed does. ``-s`` prints the counts:
per format, mutations tried / refused / loaded equal to the reference, and per kind of mutation.

The second half tests ``vtnumba._faults`` and the fault hook in the checkpoint reader's host copy: a
load failed there leaves no result, no open file or mapping, no changed reader state or load
accounting, and the next load equals a load in a fresh process.
"""

import contextlib
import faulthandler
import functools
import gc
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
import test_experts_checkpoint as layouts  # the writers of the valid layouts, reused
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from safetensors.numpy import save

from vtnumba import _faults, seam
from vtnumba.seam import checkpoint as checkpoint_module

EXAMPLES = int(os.environ.get("VTNUMBA_FUZZ_EXAMPLES", "2800"))
SEED = int(os.environ["VTNUMBA_FUZZ_SEED"]) if os.environ.get("VTNUMBA_FUZZ_SEED") else None  # None: CI's seed
EXAMPLE_SECONDS = 10  # one load takes milliseconds; this long is a hang
P = layouts.P  # the experts' prefix, 'model.layers.0.mlp.experts'
DENSE = f"{P}.0.gate_proj"  # expert 0's gate_proj of the experts writer, stored alone: a dense layer
INDEX = "model.safetensors.index.json"
SCALE_SUFFIXES = ("weight_scale", "weight_scale_inv", "scale")
STEP = "checkpoint.host_copy"


# -- the valid checkpoints -------------------------------------------------------------------------


def _fp8_config(**fields):
    return {"quantization_config": {"quant_method": "fp8", **fields}}


COMPRESSED_CHANNEL = {
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "channel", "dynamic": False},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }
}
BLOCK_CONFIG = _fp8_config(activation_scheme="dynamic", weight_block_size=[128, 128])


@dataclass(frozen=True)
class Format:
    """A valid checkpoint (file name -> bytes) and how the seam loads it: its config, then the dense
    layer DENSE or the MoE experts under P with that config."""

    name: str
    files: dict
    experts: str | None = None  # None: a dense layer; 'per_expert' / 'fused': MoE experts
    config_file: str = "config.json"

    def load(self, directory, checkpoint=None):
        """(config, weight or (gate_up, down)): the config read from ``directory``, the tensors from
        ``checkpoint`` (a ``seam.Checkpoint``) or the directory."""
        cfg = seam.Fp8Config.from_hf(directory)
        where = directory if checkpoint is None else checkpoint
        if self.experts:
            return cfg, cfg.load_experts(where, P)
        return cfg, cfg.load_linear(where, DENSE).weight


def _bytes(tensors):
    return save({k: np.asarray(v) for k, v in tensors.items()})


def _dense_tensors(kind, bias=False):
    tensors, _ = layouts._per_expert_tensors(kind)
    dense = {k: v for k, v in tensors.items() if k.startswith(DENSE + ".")}
    if bias:
        n = dense[f"{DENSE}.weight"].shape[0]
        dense[f"{DENSE}.bias"] = (np.arange(n, dtype=np.float32) / n - 0.5).astype(ml_dtypes.bfloat16)
    return dense


def _json(obj):
    return json.dumps(obj, indent=1).encode()


@functools.cache
def formats():
    """Every format's valid checkpoint, built once (the writers quantize float weights)."""
    out = {}

    def dense(name, kind, config, bias=False, config_file="config.json"):
        files = {"model.safetensors": _bytes(_dense_tensors(kind, bias)), config_file: _json(config)}
        out[name] = Format(name, files, config_file=config_file)

    dense("fp8_tensor", "tensor", _fp8_config(activation_scheme="static"), bias=True)
    dense("compressed_channel", "channel", COMPRESSED_CHANNEL)
    dense("fp8_block", "block", BLOCK_CONFIG, bias=True)
    dense(
        "fp8_ue8m0", "ue8m0", _fp8_config(activation_scheme="dynamic", weight_block_size=[128, 128], scale_fmt="ue8m0")
    )
    dense("mxfp8", "mxfp8", {"quantization_config": {"quant_method": "mxfp8", "activation_scheme": "dynamic"}})
    modelopt = {"producer": {"name": "modelopt", "version": "0.29"}, "quantization": {"quant_algo": "FP8"}}
    dense("modelopt", "tensor", modelopt, config_file="hf_quant_config.json")

    tensors, _ = layouts._per_expert_tensors("tensor")
    config = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}
    out["per_expert"] = Format(
        "per_expert", {"model.safetensors": _bytes(tensors), "config.json": _json(config)}, "per_expert"
    )
    out["fused_experts"] = Format(
        "fused_experts",
        {"model.safetensors": _bytes(layouts._fused_block_tensors()), "config.json": _json(BLOCK_CONFIG)},
        "fused",
    )

    dense_ = _dense_tensors("channel", bias=True)
    first = {f"{DENSE}.weight": dense_[f"{DENSE}.weight"]}
    second = {k: v for k, v in dense_.items() if k not in first}
    second["lm_head.weight"] = np.linspace(-1, 1, 4 * 8, dtype=np.float32).reshape(4, 8).astype(ml_dtypes.bfloat16)
    shards = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second}
    index = {"metadata": {"total_size": 0}, "weight_map": {t: f for f, held in shards.items() for t in held}}
    files = {f: _bytes(held) for f, held in shards.items()}
    files[INDEX] = _json(index)
    files["config.json"] = _json(COMPRESSED_CHANNEL)
    out["sharded"] = Format("sharded", files)
    return out


FORMAT_NAMES = (
    "fp8_tensor",
    "compressed_channel",
    "fp8_block",
    "fp8_ue8m0",
    "mxfp8",
    "modelopt",
    "per_expert",
    "fused_experts",
    "sharded",
)


# -- the reference reader --------------------------------------------------------------------------

# the bits of each safetensors dtype (the format's list); the reference refuses other names, as
# safetensors does
REF_BITS = {
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
    "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}  # fmt: skip
REF_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype("<f8"),
    "F8_E4M3": np.dtype(np.uint8),
    "F8_E8M0": np.dtype(np.uint8),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "F8_E5M2": np.dtype(np.uint8),
    "BOOL": np.dtype(np.uint8),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
}


class Invalid(Exception):
    """The reference reader's verdict: the files are not a valid checkpoint."""


def _count(v):
    return type(v) is int and v >= 0


def ref_file(path):
    """{name: (dtype, array or None)} of one safetensors file, read from the format's definition
    alone; Invalid if the file breaks it. Arrays of dtypes it does not know are None."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise Invalid("shorter than the header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > 100 * 2**20 or 8 + n > len(raw):
        raise Invalid("header length past the end")
    try:
        header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Invalid(f"header not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise Invalid("header not an object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise Invalid("__metadata__ not strings")
    buffer = raw[8 + n :]
    spans, out = [], {}
    for name, info in header.items():
        if not isinstance(info, dict):
            raise Invalid(f"{name}: entry not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str):
            raise Invalid(f"{name}: dtype")
        if not (isinstance(shape, list) and all(_count(d) for d in shape)):
            raise Invalid(f"{name}: shape")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)):
            raise Invalid(f"{name}: offsets")
        begin, end = offsets
        if begin > end:
            raise Invalid(f"{name}: offsets reversed")
        if dtype not in REF_BITS:
            raise Invalid(f"{name}: no dtype {dtype!r}")
        if math.prod(shape) * REF_BITS[dtype] != 8 * (end - begin):
            raise Invalid(f"{name}: span != shape * dtype size")
        np_dtype = REF_DTYPES.get(dtype)
        spans.append((begin, end))
        out[name] = (dtype, shape, (begin, end), np_dtype)
    at = 0
    for begin, end in sorted(spans):
        if begin != at:
            raise Invalid("tensors overlap or leave a gap")
        at = end
    if at != len(buffer):
        raise Invalid("data section longer or shorter than the tensors")
    return {
        name: (dtype, None if np_dtype is None else np.frombuffer(buffer[b:e], np_dtype).reshape(shape))
        for name, (dtype, shape, (b, e), np_dtype) in out.items()
    }


def ref_checkpoint(directory):
    """{name: (dtype, array)} of a checkpoint directory: its index's shards, or model.safetensors."""
    index = os.path.join(directory, INDEX)
    if not os.path.exists(index):
        return ref_file(os.path.join(directory, "model.safetensors"))
    try:
        with open(index, "rb") as f:
            weight_map = json.loads(f.read().decode("utf-8"))["weight_map"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise Invalid(f"index: {exc!r}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v for v in weight_map.values()):
        raise Invalid("weight_map not names -> files")
    tensors, where = {}, {}
    for shard in sorted(set(weight_map.values())):
        path = os.path.join(directory, shard)
        if not os.path.isfile(path):
            raise Invalid(f"missing shard {shard}")
        for name, value in ref_file(path).items():
            if name in tensors:
                raise Invalid(f"{name} in two shards")
            tensors[name], where[name] = value, shard
    for name, shard in weight_map.items():
        if where.get(name) != shard:
            raise Invalid(f"index maps {name} to {shard}, held by {where.get(name)}")
    return tensors


# -- what a load must give, from the reference tensors ---------------------------------------------


class Refuses(Exception):
    """The reference semantics refuse the content (the loader loaded it anyway: a wrong answer)."""


def _array(ref, name, *dtypes):
    if name not in ref:
        raise Refuses(f"{name} missing")
    dtype, array = ref[name]
    if dtypes and dtype not in dtypes:
        raise Refuses(f"{name} is {dtype}")
    if array is None:
        raise Refuses(f"{name}: unknown dtype {dtype}")
    return dtype, array


FLOATS = ("F32", "F16", "BF16", "F64")


def expect_dense(ref, cfg, prefix):
    """The ``Fp8Weight`` the reference tensors of layer ``prefix`` make under ``cfg``."""
    _, codes = _array(ref, f"{prefix}.weight", "F8_E4M3")
    if codes.ndim != 2 or ((codes & 0x7F) == 0x7F).any():
        raise Refuses("codes not 2-D or NaN")
    present = [f"{prefix}.{s}" for s in SCALE_SUFFIXES if f"{prefix}.{s}" in ref]
    if len(present) != 1:
        raise Refuses(f"scales {present}")
    block = cfg.weight_block_size
    sdtype, scale = _array(ref, present[0], *(FLOATS + ("F8_E8M0", "U8") if block else FLOATS))
    scale = scale.copy() if sdtype in ("F8_E8M0", "U8") else scale.astype(np.float32)
    if block is None and scale.size == 1 and scale.ndim <= 2:
        scale = scale.reshape(())
    input_scale = None
    if cfg.activation_scheme == "static":
        iname = f"{prefix}.input_scale"
        _, value = _array(ref, iname, *FLOATS)
        if value.size != 1 or value.ndim > 2:
            raise Refuses("input scale not a scalar")
        input_scale = np.float32(value.astype(np.float32).reshape(()))
    bias = None
    if f"{prefix}.bias" in ref:
        _, bias = _array(ref, f"{prefix}.bias", *FLOATS)
        if not np.isfinite(bias.astype(np.float32)).all():
            raise Refuses("bias not finite")
    try:
        return seam.Fp8Weight(
            codes,
            scale,
            input_scale=input_scale,
            bias=bias,
            activation_scheme=cfg.activation_scheme,
            block_size=block,
            scale_ue8m0=cfg.activation_scale_ue8m0,
            activation_scale_format=cfg.activation_scale_format if block else None,
        )
    except (ValueError, TypeError) as exc:
        raise Refuses(str(exc)) from None


def _expert_count(ref):
    heads = {n[len(P) + 1 :].split(".", 1)[0] for n in ref if n.startswith(P + ".")}
    return 1 + max(int(h) for h in heads if h.isascii() and h.isdigit())


def expect_experts(ref, cfg, layout):
    """[(gate_up expert e, down expert e)] the reference tensors make: per expert, gate and up fused by
    fuse_fp8_shards; fused, expert e's slices of the 3-D tensors."""
    out = []
    if layout == "per_expert":
        for e in range(_expert_count(ref)):
            gate, up, down = (expect_dense(ref, cfg, f"{P}.{e}.{p}") for p in ("gate_proj", "up_proj", "down_proj"))
            out.append((seam.fuse_fp8_shards([gate, up]), down))
        return out
    views = {}
    for proj in ("gate_up_proj", "down_proj"):
        _, w = _array(ref, f"{P}.{proj}", "F8_E4M3")
        _, s = _array(ref, f"{P}.{proj}_scale_inv", *(FLOATS + ("F8_E8M0", "U8")))
        if w.ndim != 3 or s.ndim < 1 or len(s) != len(w):
            raise Refuses("not [E, ...]")
        views[proj] = (w, s)
    if len(views["gate_up_proj"][0]) != len(views["down_proj"][0]):
        raise Refuses("expert counts differ")
    for e in range(len(views["gate_up_proj"][0])):
        pair = []
        for proj in ("gate_up_proj", "down_proj"):
            w, s = views[proj]
            layer = {
                f"x.{proj}.weight": ("F8_E4M3", w[e]),
                f"x.{proj}.weight_scale_inv": (ref[f"{P}.{proj}_scale_inv"][0], s[e]),
            }
            pair.append(expect_dense(layer, cfg, f"x.{proj}"))
        out.append(tuple(pair))
    return out


def canon(w):
    """A weight's content, bitwise: codes, scales, input scale, bias and its scheme."""
    scale = np.asarray(w.weight_scale)
    bias = None if w.bias is None else np.asarray(w.bias)
    return (
        np.asarray(w.data).shape,
        np.asarray(w.data).tobytes(),
        scale.dtype.str,
        scale.shape,
        scale.tobytes(),
        None if w.input_scale is None else np.float32(w.input_scale).tobytes(),
        None if bias is None else (bias.dtype.str, bias.tobytes()),
        str(w.activation_scheme),
        w.block_size,
        w.per_channel,
        w.scale_ue8m0,
        w.activation_scale_format,
    )


def loaded_canon(fmt, result):
    if fmt.experts:
        gate_up, down = result
        return [(canon(gate_up.expert(e)), canon(down.expert(e))) for e in range(gate_up.shape[0])]
    return canon(result)


def expected_canon(fmt, ref, cfg):
    if fmt.experts:
        return [(canon(g), canon(d)) for g, d in expect_experts(ref, cfg, fmt.experts)]
    return canon(expect_dense(ref, cfg, DENSE))


# -- mutations -------------------------------------------------------------------------------------


@dataclass
class Mutation:
    """What was changed, and what the outcome must be: a refusal must name ``file`` and one of
    ``names`` (tensors or config fields; empty: any tensor of the layer) and show one of ``words``
    (the bad value) if given; ``must_load``: the result is a legal checkpoint, which must load."""

    kind: str
    file: str
    names: frozenset = frozenset()
    must_load: bool = False
    words: tuple = ()
    detail: str = ""


def _split(raw):
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _join(header, data):
    """A safetensors file of ``header`` (any JSON) and the data bytes, padded as safetensors pads."""
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _tensor_names(raw):
    return [n for n in _split(raw)[0] if n != "__metadata__"]


def _role(name, dtype):
    if dtype == "F8_E4M3":
        return "codes"
    if name.endswith(".bias"):
        return "bias"
    if "scale" in name.rsplit(".", 1)[-1] or name.endswith("_scale_inv"):
        return "e8m0" if dtype in ("F8_E8M0", "U8") else "scale"
    return "float"


def _safetensors(files):
    return sorted(f for f in files if f.endswith(".safetensors"))


def _pick_tensor(files, draw, roles=None):
    """(file, name, header entry) of a tensor drawn from the checkpoint's files (of ``roles``)."""
    choices = []
    for f in _safetensors(files):
        header, _ = _split(files[f])
        for name, entry in header.items():
            if name != "__metadata__" and (roles is None or _role(name, entry["dtype"]) in roles):
                choices.append((f, name, entry))
    return draw(st.sampled_from(choices)) if choices else None


def _neighbours(header, *names):
    """The tensors just before and after each of ``names`` in the data: a tensor deleted or moved
    leaves a gap that only they can be named by."""
    order = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"])
    out = set()
    for name in names:
        i = order.index(name)
        out |= set(order[max(i - 1, 0) : i + 2])
    return out


def _rewrite(files, f, change):
    header, data = _split(files[f])
    change(header)
    files[f] = _join(header, data)


def _byte(draw, old):
    new = draw(st.one_of(st.integers(0, 255), st.sampled_from(list(b'",:{}[]-0123456789 .eE\\\x00\xff'))))
    return new if new != old else old ^ 0x01


def m_length(fmt, files, draw):
    f = draw(st.sampled_from(_safetensors(files)))
    raw = bytearray(files[f])
    at = draw(st.integers(0, 7))
    raw[at] = _byte(draw, raw[at])
    files[f] = bytes(raw)
    return Mutation("length", f, detail=f"byte {at}")


def m_header_byte(fmt, files, draw):
    f = draw(st.sampled_from(_safetensors(files)))
    raw = bytearray(files[f])
    (n,) = struct.unpack("<Q", raw[:8])
    at = draw(st.integers(8, 8 + n - 1))
    raw[at] = _byte(draw, raw[at])
    files[f] = bytes(raw)
    return Mutation("header_byte", f, detail=f"byte {at}: {bytes(raw[max(8, at - 12) : at + 12])!r}")


DTYPE_POOL = (
    "F32", "F16", "BF16", "F64", "U8", "I8", "I16", "I32", "I64", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2",
    "F8_E8M0", "BOOL", "F4", "", "f32", "F8_E4M3FN", 7, None, ["F32"], {"F32": 1}, True,
)  # fmt: skip
SAME_SIZE = (
    {"U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "BOOL"},
    {"F16", "BF16", "I16", "U16"},
    {"F32", "I32", "U32"},
)


def _shape_pool(shape, draw):
    d = draw(st.integers(1, 3))
    pool = [
        shape[::-1],
        [x + d for x in shape],
        [max(x - d, 0) for x in shape],
        shape + [1],
        [1] + shape,
        shape[:-1],
        [],
        [-d] + shape[1:],
        [float(x) for x in shape],
        [str(x) for x in shape],
        None,
        "16",
        [shape],
        [True] + shape[1:],
        [2**63] + shape[1:],
        5,
    ]
    return draw(st.sampled_from(pool))


def _offsets_pool(offsets, size, draw):
    b, e = offsets
    d = draw(st.integers(1, 64))
    pool = [
        [b + d, e],
        [b, e + d],
        [b - d, e - d] if b >= d else [b + d, e + d],
        [e, b],
        [-d, e],
        [b, -d],
        [b],
        [b, e, e],
        [str(b), e],
        [float(b), float(e)],
        None,
        [b, 2**64 + e],
        {"0": b, "1": e},
        [],
        [size + d, size + d + (e - b)],
        [True, e],
    ]
    return draw(st.sampled_from(pool))


def _aliases(name, fmt):
    head, _, last = name.rpartition(".")
    if last in SCALE_SUFFIXES and fmt.experts is None:
        return [f"{head}.{s}" for s in SCALE_SUFFIXES if s != last]
    return []


def m_json_field(fmt, files, draw):
    f, name, entry = _pick_tensor(files, draw)
    header, data = _split(files[f])
    op = draw(
        st.sampled_from(
            ["dtype", "shape", "offsets", "delete_field", "extra_field", "not_object", "rename", "delete", "metadata"]
        )
    )
    names, must_load, detail = _neighbours(header, name), False, op
    if op == "dtype":
        value = draw(st.sampled_from([v for v in DTYPE_POOL if v != entry["dtype"]]))
        header[name]["dtype"], detail = value, f"dtype {value!r}"
    elif op == "shape":
        value = _shape_pool(list(entry["shape"]), draw)
        header[name]["shape"], detail = value, f"shape {value!r}"
    elif op == "offsets":
        value = _offsets_pool(entry["data_offsets"], len(data), draw)
        header[name]["data_offsets"], detail = value, f"data_offsets {value!r}"
    elif op == "delete_field":
        key = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        del header[name][key]
        detail = f"without {key}"
    elif op == "extra_field":
        header[name]["extra"] = draw(st.sampled_from(["x", 1, None, [1], {"a": "b"}]))
        must_load = True  # the format reads dtype, shape and data_offsets, and ignores other keys
    elif op == "not_object":
        header[name] = draw(st.sampled_from([5, "x", [], None, [1, 2], True, 1.5]))
        detail = f"entry {header[name]!r}"
    elif op == "rename":
        alias = _aliases(name, fmt)
        new = draw(st.sampled_from(alias + [name + "x", name[:-1], name.upper(), "", f"{P}.other", DENSE + ".bias"]))
        header[new] = header.pop(name)
        names.add(new)
        must_load = new in alias and INDEX not in files  # another of the scale's names (the index keeps the old)
        detail = f"renamed {new!r}"
    elif op == "delete":
        del header[name]
    elif op == "metadata":
        value = draw(
            st.sampled_from(
                [{"format": "pt"}, {"format": 5}, {"a": None}, [], "pt", 5, None, {"x": "y"}, {}, {"f": ["pt"]}]
            )
        )
        header["__metadata__"] = value
        names, detail = {"__metadata__"}, f"__metadata__ {value!r}"
        must_load = value is None or (isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))
    files[f] = _join(header, data)
    return Mutation("json_field", f, frozenset(names), must_load, detail=f"{name}: {detail}")


def _two(files, draw):
    f = draw(st.sampled_from([f for f in _safetensors(files) if len(_tensor_names(files[f])) >= 2]))
    header, _ = _split(files[f])
    a, b = draw(st.lists(st.sampled_from(_tensor_names(files[f])), min_size=2, max_size=2, unique=True))
    return f, header, a, b


def m_swap_offsets(fmt, files, draw):
    f, header, a, b = _two(files, draw)

    def swap(h):
        h[a]["data_offsets"], h[b]["data_offsets"] = h[b]["data_offsets"], h[a]["data_offsets"]

    names = frozenset(_neighbours(header, a, b))
    _rewrite(files, f, swap)
    return Mutation("swap_offsets", f, names, detail=f"{a} <-> {b}")


def m_overlap(fmt, files, draw):
    f, header, a, b = _two(files, draw)
    b0, b1 = header[b]["data_offsets"]
    a0, a1 = header[a]["data_offsets"]
    start = b0 + draw(st.integers(0, max(b1 - b0 - 1, 0)))

    def overlap(h):
        h[a]["data_offsets"] = [start, start + a1 - a0]

    names = frozenset(_neighbours(header, a, b))
    _rewrite(files, f, overlap)
    return Mutation("overlap", f, names, detail=f"{a} at {start} over {b} [{b0}, {b1}]")


def m_past_end(fmt, files, draw):
    f, name, entry = _pick_tensor(files, draw)
    header, data = _split(files[f])
    b, e = entry["data_offsets"]
    start = len(data) + draw(st.integers(0, 4096))
    names = frozenset(_neighbours(header, name))
    header[name]["data_offsets"] = [start, start + e - b]
    files[f] = _join(header, data)
    return Mutation("past_end", f, names, detail=f"{name} at {start} of {len(data)}")


def m_wrong_dtype(fmt, files, draw):
    f, name, entry = _pick_tensor(files, draw)
    group = next((g for g in SAME_SIZE if entry["dtype"] in g), {entry["dtype"]})
    choices = sorted(group - {entry["dtype"]})
    if not choices:
        return m_json_field(fmt, files, draw)
    new = draw(st.sampled_from(choices))
    _rewrite(files, f, lambda h: h[name].__setitem__("dtype", new))
    legal = {entry["dtype"], new} == {"F8_E8M0", "U8"}  # both are E8M0 bytes to the loader
    return Mutation("wrong_dtype", f, frozenset({name}), legal, detail=f"{name}: {entry['dtype']} -> {new}")


SCALAR_SHAPES = ((), (1,), (1, 1))


def _same_count_shapes(shape):
    count = math.prod(shape)
    out = {tuple(shape[::-1]), (count,), (count, 1), (1, count), (1, *shape), tuple(d for d in shape if d != 1)}
    for a in range(1, min(count, 64) + 1):
        if count % a == 0:
            out.add((a, count // a))
    if count == 1:
        out |= set(SCALAR_SHAPES) | {(1, 1, 1)}
    out.discard(tuple(shape))
    return sorted(out)


def m_wrong_shape(fmt, files, draw):
    f, name, entry = _pick_tensor(files, draw)
    old = tuple(entry["shape"])
    new = draw(st.sampled_from(_same_count_shapes(list(old))))
    _rewrite(files, f, lambda h: h[name].__setitem__("shape", list(new)))
    n = math.prod(old)
    scale = _role(name, entry["dtype"]) == "scale"
    legal = scale and (
        {old, new} <= set(SCALAR_SHAPES) or (len(old) <= 2 and {old, new} <= {(n,), (n, 1)} and not fmt.experts)
    )
    return Mutation("wrong_shape", f, frozenset({name}), legal, detail=f"{name}: {list(old)} -> {list(new)}")


def _rebuilt(raw, name, shape, chunk):
    """The file with tensor ``name`` given a new shape and bytes: the tensors kept in their order,
    the offsets recomputed (a valid file)."""
    header, data = _split(raw)
    meta = header.pop("__metadata__", None)
    out, chunks, at = ({} if meta is None else {"__metadata__": meta}), [], 0
    for n in sorted(header, key=lambda n: header[n]["data_offsets"]):
        entry = header[n]
        b0, b1 = entry["data_offsets"]
        here = chunk if n == name else data[b0:b1]
        out[n] = {"dtype": entry["dtype"], "shape": shape if n == name else entry["shape"]}
        out[n]["data_offsets"] = [at, at + len(here)]
        chunks.append(here)
        at += len(here)
    return _join(out, b"".join(chunks))


def m_resize(fmt, files, draw):
    f, name, entry = _pick_tensor(files, draw)
    _, data = _split(files[f])
    itemsize = REF_DTYPES[entry["dtype"]].itemsize
    b0, b1 = entry["data_offsets"]
    old = entry["shape"]
    ndim = draw(st.sampled_from(sorted({len(old), max(len(old) - 1, 0), len(old) + 1})))
    shape = [draw(st.integers(0, 2 * (old[i] if i < len(old) else 2) + 1)) for i in range(ndim)]
    old_bytes = np.frombuffer(data[b0:b1], np.uint8)
    count = math.prod(shape) * itemsize  # the old bytes repeated or cut to the new size
    files[f] = _rebuilt(files[f], name, shape, np.resize(old_bytes, count).tobytes())
    return Mutation("resize", f, frozenset({name}), detail=f"{name}: {old} -> {shape}")


VALUE_POOL = (np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, -1e-3, 1e-45, 1e-30, 1e-8, 0.5, 1.0, 3.0, 65504.0, 1e30, 3e38)


def _words(value):
    if np.isnan(value):
        return ("nan",)
    if np.isinf(value):
        return ("inf",)
    return (repr(float(value)), str(float(value)), f"{float(value):g}")


def _set_elements(files, f, name, entry, draw, values):
    """Tensor ``name``'s element(s) set: one drawn index, or every element. Returns the values written."""
    header, data = _split(files[f])
    b0, b1 = entry["data_offsets"]
    array = np.frombuffer(data[b0:b1], REF_DTYPES[entry["dtype"]]).copy().reshape(-1)
    if array.size == 0:
        return None
    value = np.asarray(draw(st.sampled_from(values))).astype(array.dtype)
    if draw(st.booleans()):
        array[:] = value
    else:
        array[draw(st.integers(0, array.size - 1))] = value
    files[f] = _join(header, data[:b0] + array.tobytes() + data[b1:])
    return value


def m_scale_value(fmt, files, draw):
    picked = _pick_tensor(files, draw, roles=("scale", "bias"))
    if picked is None:  # E8M0 scales only
        return m_e8m0_byte(fmt, files, draw)
    f, name, entry = picked
    value = _set_elements(files, f, name, entry, draw, VALUE_POOL)
    as32 = np.float32(value)
    fine = bool(np.isfinite(as32) and (as32 > 0 or _role(name, entry["dtype"]) == "bias"))
    return Mutation("scale_value", f, frozenset({name}), fine, () if fine else _words(as32), f"{name} = {value!r}")


def m_e8m0_byte(fmt, files, draw):
    picked = _pick_tensor(files, draw, roles=("e8m0",))
    if picked is None:  # float scales only
        return m_codes_byte(fmt, files, draw)
    f, name, entry = picked
    value = _set_elements(files, f, name, entry, draw, (0xFF, 0xFF, 0x00, 0x01, 0x7F, 0x80, 0xFE, 0x42))
    fine = int(value) != 0xFF
    return Mutation("e8m0_byte", f, frozenset({name}), fine, () if fine else ("0xFF", "255"), f"{name} = {value!r}")


def m_codes_byte(fmt, files, draw):
    f, name, entry = _pick_tensor(files, draw, roles=("codes",))
    header, data = _split(files[f])
    b0, b1 = entry["data_offsets"]
    at = draw(st.integers(b0, b1 - 1))
    value = draw(st.one_of(st.integers(0, 255), st.sampled_from([0x7F, 0xFF])))
    files[f] = _join(header, data[:at] + bytes([value]) + data[at + 1 :])
    fine = (value & 0x7F) != 0x7F
    return Mutation(
        "codes_byte", f, frozenset({name}), fine, () if fine else ("NaN",), f"{name} byte {at - b0} = {value:#x}"
    )


def m_truncate(fmt, files, draw):
    f = draw(st.sampled_from(_safetensors(files)))
    cut = draw(st.integers(0, len(files[f]) - 1))
    files[f] = files[f][:cut]
    return Mutation("truncate", f, detail=f"{cut} of {len(fmt.files[f])} bytes")


def m_extend(fmt, files, draw):
    f = draw(st.sampled_from(_safetensors(files)))
    files[f] += draw(st.binary(min_size=1, max_size=64))
    return Mutation("extend", f, detail=f"{len(files[f]) - len(fmt.files[f])} bytes more")


def m_remove_shard(fmt, files, draw):
    f = draw(st.sampled_from(_safetensors(files)))
    del files[f]
    held = frozenset(t for t, s in json.loads(files[INDEX])["weight_map"].items() if s == f)
    return Mutation("remove_shard", f, held, detail=f)


def m_index_bytes(fmt, files, draw):
    raw = bytearray(files[INDEX])
    at = draw(st.integers(0, len(raw) - 1))
    raw[at] = _byte(draw, raw[at])
    files[INDEX] = bytes(raw)
    return Mutation("index_bytes", INDEX, detail=f"byte {at}: {bytes(raw[max(0, at - 12) : at + 12])!r}")


def m_index_field(fmt, files, draw):
    index = json.loads(files[INDEX])
    weight_map = index["weight_map"]
    name = draw(st.sampled_from(sorted(weight_map)))
    shards = _safetensors(files)
    op = draw(st.sampled_from(["weight_map", "value", "delete", "add", "no_weight_map", "not_object"]))
    names, detail = {name}, op
    if op == "weight_map":
        index["weight_map"] = draw(st.sampled_from([None, [], "x", 5, {}, [[name, shards[0]]]]))
        names, detail = {"weight_map"}, f"weight_map {index['weight_map']!r}"
    elif op == "value":
        other = [s for s in shards if s != weight_map[name]]
        weight_map[name] = draw(st.sampled_from(["missing.safetensors", "", 5, None, ["x"], *other, "../" + shards[0]]))
        detail = f"{name} -> {weight_map[name]!r}"
    elif op == "delete":
        del weight_map[name]
    elif op == "add":
        new = draw(st.sampled_from([f"{DENSE}.input_scale", f"{P}.extra", "lm_head.bias"]))
        weight_map[new] = draw(st.sampled_from(shards))
        names, detail = {new}, f"{new} -> {weight_map[new]}"
    elif op == "no_weight_map":
        del index["weight_map"]
        names = {"weight_map"}
    else:
        index = draw(st.sampled_from([[], "x", 5, None]))
        names = {"weight_map"}
    files[INDEX] = json.dumps(index).encode()
    return Mutation("index_field", INDEX, frozenset(names), detail=detail)


CONFIG_POOL = (
    None, 0, -1, 1.5, True, "", "garbage", [], {}, [128], [128, 128, 128], [0, 128], [-128, 128], ["128", "128"],
    [128.0, 128.0], [True, 128], [1, 32], [128, 64], [64, 128], "dynamic", "static", "per_token", "per_group",
    "ue8m0", "float", "fp8", "modelopt", "mxfp8", "compressed-tensors", "e5m2", "FP8", "NVFP4", {"a": 1}, [None],
    "lm_head", ["lm_head"], [DENSE], ["re:.*"], ["re:("], 32, 5,
)  # fmt: skip
CONFIG_FIELDS = (
    "quant_method", "weight_block_size", "activation_scheme", "scale_fmt", "ignore", "ignored_layers",
    "modules_to_not_convert", "fmt", "quant_algo", "exclude_modules", "group_size", "config_groups",
)  # fmt: skip
NESTED = (
    ("config_groups", "group_0"),
    ("config_groups", "group_0", "weights"),
    ("config_groups", "group_0", "weights", "strategy"),
    ("config_groups", "group_0", "weights", "num_bits"),
    ("config_groups", "group_0", "weights", "type"),
    ("config_groups", "group_0", "weights", "block_structure"),
    ("config_groups", "group_0", "weights", "group_size"),
    ("config_groups", "group_0", "input_activations"),
    ("config_groups", "group_0", "input_activations", "strategy"),
    ("config_groups", "group_0", "input_activations", "dynamic"),
    ("config_groups", "group_0", "input_activations", "num_bits"),
)

# the fields a config error may name: a changed field can make another one wrong (a quant_method
# changed to 'modelopt' needs a quant_algo)
FIELD_NAMES = frozenset(CONFIG_FIELDS) | {k for path in NESTED for k in path} | {"quantization_config", "quantization"}


def _section(config):
    return config["quantization"] if "producer" in config else config["quantization_config"]


def _keys(obj):
    """Every key in a JSON value, recursively."""
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


class _Absent:
    def __repr__(self):
        return "<absent>"


ABSENT = _Absent()  # a field removed (or not there before)


def m_config_field(fmt, files, draw):
    config = json.loads(files[fmt.config_file])
    section = _section(config)
    nested = NESTED if "config_groups" in section else ()
    path = draw(st.sampled_from([(f,) for f in CONFIG_FIELDS] + list(nested)))
    parent = section
    for key in path[:-1]:
        parent = parent[key]
    old = parent.get(path[-1], ABSENT)
    pool = list(CONFIG_POOL) + [ABSENT]
    if isinstance(old, str):
        pool += [old.upper(), old.title()]
    value = draw(st.sampled_from([v for v in pool if v is not old and v != old]))
    if value is ABSENT:
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = value
    # another spelling of a name the parsers lower- or upper-case: the same config
    must_load = (
        isinstance(old, str) and isinstance(value, str) and value.lower() == old.lower() and path[-1] in (
            "quant_method", "activation_scheme", "quant_algo")
    )  # fmt: skip
    files[fmt.config_file] = json.dumps(config).encode()
    names = frozenset(_keys(json.loads(fmt.files[fmt.config_file])) | _keys(config) | FIELD_NAMES)
    return Mutation(
        "config_field", fmt.config_file, names, must_load, detail=f"{'.'.join(path)} = {value!r} (was {old!r})"
    )


def m_config_bytes(fmt, files, draw):
    raw = bytearray(files[fmt.config_file])
    at = draw(st.integers(0, len(raw) - 1))
    raw[at] = _byte(draw, raw[at])
    files[fmt.config_file] = bytes(raw)
    names = frozenset(_keys(json.loads(fmt.files[fmt.config_file])) | FIELD_NAMES | {"config"})
    return Mutation(
        "config_bytes", fmt.config_file, names, detail=f"byte {at}: {bytes(raw[max(0, at - 12) : at + 12])!r}"
    )


MUTATIONS = {
    "length": m_length,
    "header_byte": m_header_byte,
    "json_field": m_json_field,
    "swap_offsets": m_swap_offsets,
    "overlap": m_overlap,
    "past_end": m_past_end,
    "wrong_dtype": m_wrong_dtype,
    "wrong_shape": m_wrong_shape,
    "resize": m_resize,
    "scale_value": m_scale_value,
    "e8m0_byte": m_e8m0_byte,
    "codes_byte": m_codes_byte,
    "truncate": m_truncate,
    "extend": m_extend,
    "config_field": m_config_field,
    "config_bytes": m_config_bytes,
}
SHARDED_ONLY = {"remove_shard": m_remove_shard, "index_bytes": m_index_bytes, "index_field": m_index_field}


E8M0_FORMATS = ("fp8_ue8m0", "mxfp8")  # their scales are E8M0 bytes, and they have no float tensor


def kinds_of(name):
    """The mutations that apply to a format (each gets its share of the examples)."""
    out = [k for k in MUTATIONS if k != ("scale_value" if name in E8M0_FORMATS else "e8m0_byte")]
    return out + (list(SHARDED_ONLY) if name == "sharded" else [])


CASES = [(name, kind) for name in FORMAT_NAMES for kind in kinds_of(name)]
PER_CASE = max(1, EXAMPLES // len(CASES))


# -- the oracle ------------------------------------------------------------------------------------


class Hang(BaseException):
    """A load ran past EXAMPLE_SECONDS (a BaseException: no library handler may swallow it)."""


@contextlib.contextmanager
def deadline(seconds):
    """SIGALRM raises Hang in the load; faulthandler ends the process if even that cannot (a hang
    in C code), so CI fails rather than waits."""

    def alarm(signum, frame):
        raise Hang(f"the load ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(3 * seconds, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        faulthandler.cancel_dump_traceback_later()


def _write(directory, files):
    os.makedirs(directory)
    for name, raw in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(raw)


def check_refusal(msg, m, directory, ref_names, fmt, valid):
    """What a refusal must say: the file (or, for a tensor no longer there, the checkpoint) and the
    tensor or config field at fault, and the bad value where there is one. ``valid``: the reference
    found the files valid, so the content is at fault, not the format."""
    problems = []
    config_kind = m.kind.startswith("config")
    tensor_names = {n for f in _safetensors(fmt.files) for n in _tensor_names(fmt.files[f])}
    # a tensor renamed or dropped is missing from the checkpoint, which is named instead of a file
    gone = (tensor_names | set(m.names)) - set(ref_names) if ref_names else set(m.names)
    names_file = os.path.basename(m.file) in msg or (str(directory) in msg and any(n in msg for n in gone))
    names_what = not m.names or any(n in msg for n in m.names)
    layer = P if fmt.experts else DENSE  # a MoE layer's experts are checked against each other
    if config_kind or m.kind.startswith("index"):
        # the config's (the index's) own words, or those of the checkpoint it no longer matches: a
        # place (a file of the checkpoint, or the checkpoint) and a field, a tensor or the layer
        where = any(f in msg for f in fmt.files) or str(directory) in msg
        what = names_what or any(n in msg for n in tensor_names) or layer in msg
        if not (where and what):
            problems.append("names neither the config field (or the layer) nor its file (or the checkpoint)")
    else:
        # a valid file whose tensor does not fit the layer: the refusal may name the tensor it does
        # not fit, in its own file
        if not (names_file or (valid and any(f in msg for f in _safetensors(fmt.files)))):
            problems.append(f"does not name the file {m.file!r}")
        if not names_what:
            layer_words = {layer} if fmt.experts else {n.rsplit(".", 1)[0] for n in m.names}
            if not (valid and any(w in msg for w in layer_words)):
                problems.append(f"names none of {sorted(m.names)}")
    if m.words and not any(w in msg for w in m.words):
        problems.append(f"shows none of {m.words}")
    return problems


TALLY: dict = {}
KINDS: dict = {}


def run_example(fmt, kind, data, root, tally, by_kind):
    files = dict(fmt.files)
    m = {**MUTATIONS, **SHARDED_ONLY}[kind](fmt, files, data.draw)
    tally["tried"] += 1
    directory = os.path.join(root, str(tally["tried"]))
    _write(directory, files)
    try:
        try:
            ref, invalid = ref_checkpoint(directory), None
        except Invalid as exc:
            ref, invalid = None, str(exc)
        outcome = error = None
        try:
            with deadline(EXAMPLE_SECONDS):
                cfg, result = fmt.load(directory)
            outcome = "loaded"
        except ValueError as exc:
            if type(exc) is not ValueError:
                raise AssertionError(f"{m}: raised {type(exc).__name__}, not a ValueError of the seam: {exc}") from exc
            outcome, error = "refused", str(exc)
        except (Exception, Hang) as exc:
            raise AssertionError(f"{m}: raised {type(exc).__name__}: {exc}") from exc
        if outcome == "loaded":
            if ref is None:
                raise AssertionError(f"{m}: loaded files the reference finds invalid ({invalid})")
            try:
                want = expected_canon(fmt, ref, cfg)
            except Refuses as exc:
                raise AssertionError(f"{m}: loaded content the reference refuses ({exc})") from None
            if loaded_canon(fmt, result) != want:
                raise AssertionError(f"{m}: loaded something other than the reference reads in the same files")
            tally["loaded_equal"] += 1
        else:
            if m.must_load:
                raise AssertionError(f"{m}: a legal checkpoint refused: {error}")
            problems = check_refusal(error, m, directory, set(ref or ()), fmt, ref is not None)
            if problems:
                raise AssertionError(f"{m}: the refusal {'; '.join(problems)}: {error}")
            tally["refused"] += 1
        by_kind[kind][outcome] += 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def reads_within_files(monkeypatch):
    """Every host copy the reader makes, checked to lie inside its file before it is made."""
    real, seen = checkpoint_module.Checkpoint._host_copy, Counter()

    def host_copy(self, name, file, entry, data_start):
        end = data_start + entry["data_offsets"][1]
        size = os.path.getsize(file)
        assert end <= size, f"{name!r}: a read to byte {end} of {file!r}, {size} bytes long"
        seen["copies"] += 1
        return real(self, name, file, entry, data_start)

    monkeypatch.setattr(checkpoint_module.Checkpoint, "_host_copy", host_copy)
    return seen


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_the_valid_checkpoints_load_as_the_reference_reads_them(name, tmp_path):
    fmt = formats()[name]
    _write(tmp_path / "clean", fmt.files)
    cfg, result = fmt.load(tmp_path / "clean")
    assert loaded_canon(fmt, result) == expected_canon(fmt, ref_checkpoint(tmp_path / "clean"), cfg)


@pytest.mark.parametrize("name, kind", CASES)
def test_mutated_checkpoints_load_exactly_or_are_refused_by_name(name, kind, tmp_path, reads_within_files):
    fmt = formats()[name]
    tally, by_kind = TALLY.setdefault(name, Counter()), KINDS.setdefault(name, defaultdict(Counter))
    before = Counter(tally)

    @settings(
        max_examples=PER_CASE,
        derandomize=SEED is None,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def mutate_and_load(data):
        run_example(fmt, kind, data, tmp_path, tally, by_kind)

    if SEED is not None:
        mutate_and_load = seed(SEED)(mutate_and_load)
    mutate_and_load()
    here = tally - before
    # fewer than PER_CASE where Hypothesis ran out of distinct mutations (two shards to remove)
    assert here["tried"] == here["refused"] + here["loaded_equal"] and 1 <= here["tried"] <= PER_CASE, here
    TALLY["host copies checked"] = TALLY.get("host copies checked", 0) + reads_within_files["copies"]


def test_the_totals_over_every_format():
    if set(KINDS) != set(FORMAT_NAMES) or any(len(KINDS[n]) < len(kinds_of(n)) for n in FORMAT_NAMES):
        pytest.skip("counts the runs of every case above (run the whole module)")
    print(f"\n{'format':20s} {'tried':>6s} {'refused':>8s} {'loaded equal':>13s}   (mutations at the CI seed)")
    for name in FORMAT_NAMES:
        t = TALLY[name]
        print(f"{name:20s} {t['tried']:6d} {t['refused']:8d} {t['loaded_equal']:13d}")
        assert t["tried"] == t["refused"] + t["loaded_equal"] and t["refused"] > 0, (name, t)
        if t["tried"] >= 100:  # a short run on demand may draw no legal mutation of a format
            assert t["loaded_equal"] > 0, (name, t)
    tried = sum(TALLY[n]["tried"] for n in FORMAT_NAMES)
    refused = sum(TALLY[n]["refused"] for n in FORMAT_NAMES)
    loaded = sum(TALLY[n]["loaded_equal"] for n in FORMAT_NAMES)
    assert TALLY["host copies checked"] > 0  # the reads-within-files check saw the reads
    print(f"{'all':20s} {tried:6d} {refused:8d} {loaded:13d}")
    kinds = defaultdict(Counter)
    for name in FORMAT_NAMES:
        for kind, c in KINDS[name].items():
            kinds[kind].update(c)
    for kind in sorted(kinds):
        print(f"    {kind:14s} refused {kinds[kind]['refused']:5d}  loaded equal {kinds[kind]['loaded']:5d}")
    assert tried == refused + loaded
    assert tried >= 2000 or EXAMPLES < 2000


# -- fault injection: vtnumba._faults and the host copy's hook ------------------------------------

PROBE = _faults.register("tests.fuzz_checkpoint.probe", "a step these tests call themselves")


def test_a_fault_fires_on_the_call_it_is_armed_for_and_only_while_armed():
    assert STEP in _faults.steps() and PROBE in _faults.steps() and not _faults.armed
    with _faults.inject(PROBE, after=2) as fault:
        outcomes = []
        for _ in range(5):
            try:
                _faults.fire(PROBE, "probe call")
                outcomes.append("passed")
            except _faults.InjectedFault as exc:
                outcomes.append(str(exc))
    assert outcomes == ["passed"] * 2 + ["injected fault at step '" + PROBE + "' (call 3): probe call"] + ["passed"] * 2
    assert (fault.calls, fault.fired) == (5, 1) and not _faults.armed
    with _faults.inject(PROBE, after=1, times=None) as every:
        raised = 0
        for _ in range(4):
            with contextlib.suppress(_faults.InjectedFault):
                _faults.fire(PROBE)
                continue
            raised += 1
    assert raised == 3 and every.fired == 3
    _faults.fire(PROBE)  # disarmed: a plain call
    with pytest.raises(RuntimeError, match="the block's own error"), _faults.inject(PROBE):
        raise RuntimeError("the block's own error")
    assert not _faults.armed  # disarmed however the block ends


def test_faults_refuse_what_they_cannot_mean():
    with pytest.raises(ValueError, match=r"step must be a registered hook point, got 'checkpoint\.hostcopy'"):
        with _faults.inject("checkpoint.hostcopy"):
            pass
    for bad in (dict(after=-1), dict(after=True), dict(after=1.0), dict(times=0), dict(times=False)):
        with pytest.raises(ValueError, match="must be"), _faults.inject(PROBE, **bad):
            pass
    with _faults.inject(PROBE), pytest.raises(ValueError, match="must not be armed twice"):
        with _faults.inject(PROBE):
            pass
    assert _faults.register(PROBE, "a step these tests call themselves") == PROBE  # again, same words
    with pytest.raises(ValueError, match="must be registered once"):
        _faults.register(PROBE, "other words")
    with pytest.raises(ValueError, match="step must be a non-empty name"):
        _faults.register(" ", "blank")
    assert not _faults.armed


def test_arming_and_firing_are_thread_safe():
    threads, calls = 8, 200
    raised = Counter()

    def caller(i):
        for _ in range(calls):
            try:
                _faults.fire(PROBE)
            except _faults.InjectedFault:
                raised[i] += 1

    with _faults.inject(PROBE, after=300, times=500) as fault:
        workers = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert fault.calls == threads * calls and fault.fired == 500 == sum(raised.values())

    # a step is armed by one block at a time, whichever thread asks
    ready, armed_by, refused = threading.Barrier(threads), [], []

    def arm(i):
        ready.wait()
        try:
            with _faults.inject(PROBE):
                armed_by.append(i)
                ready_to_leave.wait()
        except ValueError:
            refused.append(i)
            with contextlib.suppress(threading.BrokenBarrierError):
                ready_to_leave.wait()

    ready_to_leave = threading.Barrier(threads)
    workers = [threading.Thread(target=arm, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(armed_by) == 1 and len(refused) == threads - 1 and not _faults.armed


# the formats whose host copies the fault is put into: both copy paths (safetensors for floats, the
# reader's own for F8 / E8M0 bytes), fused experts (one read per tensor shared by the experts'
# views) and a sharded checkpoint
FAULT_FORMATS = ("fp8_tensor", "mxfp8", "fused_experts", "sharded")


def dump(fmt, result):
    """{name: array} of everything a load returns, for a bitwise comparison."""
    parts = {"": result} if not fmt.experts else {"gate_up.": result[0], "down.": result[1]}
    out = {}
    for key, w in parts.items():
        for attr in ("data", "weight_scale", "input_scale", "bias"):
            value = getattr(w, attr, None)
            if value is not None:
                out[key + attr] = np.asarray(value)
    return out


def same_bits(got, want):
    assert sorted(got) == sorted(want)
    for key in want:
        g, w = np.asarray(got[key]), np.asarray(want[key])
        assert (g.dtype.str, g.shape, g.tobytes()) == (w.dtype.str, w.shape, w.tobytes()), key


FRESH = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import test_fuzz_checkpoint as t
arrays = {}
for arg in sys.argv[3:]:
    name, directory = arg.split("=", 1)
    fmt = t.Format(name, {}, experts={"fused_experts": "fused"}.get(name))
    _, result = fmt.load(directory)
    arrays.update({f"{name}/{k}": v for k, v in t.dump(fmt, result).items()})
np.savez(sys.argv[2], **{k: v.view(np.uint8) if v.dtype.kind == "V" else v for k, v in arrays.items()})
"""


@pytest.fixture(scope="module")
def fresh_loads(tmp_path_factory):
    """{format: its dump} loaded by a fresh Python process (one process for all the formats)."""
    root = tmp_path_factory.mktemp("fresh")
    dirs = {}
    for name in FAULT_FORMATS:
        dirs[name] = str(root / name)
        _write(dirs[name], formats()[name].files)
    out = root / "fresh.npz"
    args = [f"{n}={d}" for n, d in dirs.items()]
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, "-c", FRESH, here, str(out), *args], check=True, timeout=300)
    with np.load(out) as arrays:
        loaded = {k: arrays[k] for k in arrays.files}
    per_format = {name: {} for name in FAULT_FORMATS}
    for key, value in loaded.items():
        name, part = key.split("/", 1)
        per_format[name][part] = value
    return per_format


def _bits_of(arrays):
    """Arrays as numpy stores them in an .npz (bfloat16, a void dtype to np.savez, as bytes)."""
    return {
        k: v.view(np.uint8) if v.dtype.kind == "V" or v.dtype == ml_dtypes.bfloat16 else v for k, v in arrays.items()
    }


PROC = os.path.isdir("/proc/self/fd")  # Linux: open files and mappings are listed there (elsewhere, not checked)


def _open_fds():
    return sorted(os.listdir("/proc/self/fd")) if PROC else []


def _mapped(directory):
    if not PROC:
        return []
    with open("/proc/self/maps") as f:
        return [line for line in f if str(directory) in line]


@pytest.mark.parametrize("name", FAULT_FORMATS)
def test_a_fault_in_the_host_copy_leaves_no_trace(name, tmp_path, fresh_loads):
    fmt = formats()[name]
    directory = tmp_path / "ckpt"
    _write(directory, fmt.files)
    tensors = {n for f in _safetensors(fmt.files) for n in _tensor_names(fmt.files[f])}
    with _faults.inject(STEP, after=10**9) as count:  # armed, never due: counts the copies of a load
        fmt.load(directory)
    assert count.calls >= 2 and count.fired == 0
    from vtnumba.seam import weights as weights_module

    for reuse in (False, True):  # a path opened per load, and one Checkpoint kept across loads
        ckpt = seam.Checkpoint(directory) if reuse else None
        for after in range(count.calls):
            gc.collect()
            fds, stats, resident = _open_fds(), seam.load_stats(), len(weights_module._RESIDENT)
            state = None if ckpt is None else _deep_state(ckpt)
            result = sentinel = object()
            with _faults.inject(STEP, after=after) as fault, pytest.raises(_faults.InjectedFault) as info:
                result = fmt.load(directory, ckpt)
            assert result is sentinel  # nothing returned, not even part of a result
            assert (fault.calls, fault.fired) == (after + 1, 1)  # the load stopped at the faulted copy
            msg = str(info.value)
            assert f"step {STEP!r}" in msg and str(directory) in msg, msg
            assert any(f"{os.sep}{f}'" in msg for f in _safetensors(fmt.files)), msg  # the file
            assert any(f"tensor {t!r}" in msg for t in tensors), msg  # the tensor
            del info
            gc.collect()
            assert _open_fds() == fds, "a file left open by the failed load"
            assert not _mapped(directory), "a mapping of the checkpoint left by the failed load"
            assert seam.load_stats() == stats and len(weights_module._RESIDENT) == resident
            if ckpt is not None:
                assert _deep_state(ckpt) == state, "the Checkpoint changed by the failed load"
        # the next identical load succeeds, equal to a load in a fresh process
        _, again = fmt.load(directory, ckpt)
        same_bits(_bits_of(dump(fmt, again)), fresh_loads[name])
    assert not _faults.armed


def _deep_state(ckpt):
    return json.dumps(vars(ckpt), sort_keys=True, default=repr)
