"""Fusing q/k/v or gate/up shards into one FP8 weight, as upstream vLLM's fused linear layers load
them (``requantize_with_max_scale``, ``convert_to_channelwise``)."""

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _arrays
from .._arrays import Array
from ..ops import ActivationScheme, dequantize_fp8, quantize_fp8
from .weights import Fp8Weight

__all__ = ["requantize_with_max_scale", "fuse_fp8_shards"]


def requantize_with_max_scale(
    codes: Array, weight_scales: Array | Sequence[float], logical_widths: Sequence[int]
) -> tuple[np.float32, np.ndarray]:
    """Requantize stacked shards [sum(widths), K] that each have their own per-tensor scale to the
    largest of those scales; returns ``(max_scale float32, new codes)``.

    Mirrors vLLM's ``w8a8_utils.requantize_with_max_scale``: each shard is dequantized with its own
    scale and quantized statically with the max scale. Deviations, on purpose: upstream dequantizes
    to float16 first (``per_tensor_dequantize``), which rounds the value a second time; here the
    dequantized value is float32 (decode is exact, one float32 product), so only the final e4m3
    rounding remains. The input is not modified (upstream writes in place). Upstream's "unfused
    checkpoint" sentinel (scales left at finfo.min) does not arise: every shard's scale is given.
    """
    codes = _arrays.codes_uint8(codes, "codes")
    if not isinstance(codes, np.ndarray) or codes.ndim != 2:
        raise ValueError(
            f"codes must be a 2-D numpy array [sum(logical_widths), K], got "
            f"{type(codes).__name__} of shape {tuple(getattr(codes, 'shape', ()))}"
        )
    widths = [int(w) for w in logical_widths]
    scales = np.asarray(weight_scales, dtype=np.float32).reshape(-1)
    if len(widths) < 1 or min(widths) < 1:
        raise ValueError(f"logical_widths must be positive shard heights, got {list(logical_widths)}")
    if scales.size != len(widths):
        raise ValueError(f"weight_scales must have one scale per shard ({len(widths)}), got {scales.size}")
    if sum(widths) != codes.shape[0]:
        raise ValueError(
            f"logical_widths must sum to the {codes.shape[0]} rows of codes, got {widths} (sum {sum(widths)})"
        )
    bad = ~(np.isfinite(scales) & (scales > 0))
    if bad.any():
        raise ValueError(f"weight_scales must be positive and finite, got {scales.tolist()}")
    max_scale = np.float32(scales.max())
    out = np.empty_like(codes)
    start = 0
    for width, scale in zip(widths, scales):
        rows = slice(start, start + width)
        out[rows] = quantize_fp8(dequantize_fp8(codes[rows], scale), max_scale).data
        start += width
    return max_scale, out


def fuse_fp8_shards(shards: Sequence[Fp8Weight]) -> Fp8Weight:
    """One ``Fp8Weight`` from shards stacked along N (q, k, v or gate, up), as upstream's fused
    QKV / gate-up layers load them.

    - all shards per-tensor: requantized to the max scale (``requantize_with_max_scale``), so the
      fused weight keeps one per-tensor scale (what the per-tensor GEMM needs);
    - any shard per-channel: scales are expanded channel-wise and concatenated, codes unchanged
      (upstream's ``convert_to_channelwise``; exact);
    - static input scales: the max of the shards' (upstream: ``layer.input_scale.max()`` in
      ``process_weights_after_loading``), saturation-safe for every shard;
    - bias: concatenated when every shard has one (float32);
    - block-scaled shards (one block_size, one scale format): codes and block scales (float32 or E8M0
      bytes) concatenated, exact, when every shard but the last has N a multiple of bn (a block must
      not straddle two shards).
    """
    shards = list(shards)
    if not shards or not all(isinstance(s, Fp8Weight) for s in shards):
        raise TypeError(f"shards must be a non-empty sequence of Fp8Weight, got {[type(s).__name__ for s in shards]}")
    for i, s in enumerate(shards):
        if s.device != "cpu":
            raise ValueError(f"shards[{i}] must hold host (numpy) arrays, got arrays on {s.device}")
        s.host_data(f"shards[{i}]")
    k = shards[0].shape[1]
    for i, s in enumerate(shards):
        if s.shape[1] != k:
            raise ValueError(f"shards[{i}] must have K = {k} columns like shards[0], got shape {s.shape}")
    schemes = {s.activation_scheme for s in shards}
    if len(schemes) != 1:
        raise ValueError(f"shards must share one activation_scheme, got {sorted(schemes, key=str)}")
    with_bias = [s.bias is not None for s in shards]
    if any(with_bias) and not all(with_bias):
        raise ValueError(
            f"shards must all have a bias or none, got bias on shards {[i for i, b in enumerate(with_bias) if b]}"
        )
    widths = [s.shape[0] for s in shards]
    blocks = {s.block_size for s in shards}
    if blocks != {None}:
        return _fuse_block_shards(shards, blocks, widths, with_bias)
    scale: Any  # per-channel: a vector; per-tensor: one float32
    if any(s.per_channel for s in shards):
        data = np.concatenate([s.data for s in shards], axis=0)
        scale = np.concatenate([np.broadcast_to(s.weight_scale, (s.shape[0],)) for s in shards])
    else:
        scale, data = requantize_with_max_scale(
            np.concatenate([s.data for s in shards], axis=0), [s.weight_scale[0] for s in shards], widths
        )
    input_scale = None
    if schemes == {ActivationScheme.STATIC}:
        input_scale = max(np.float32(s.input_scale) for s in shards)
    bias = np.concatenate([np.asarray(s.bias, dtype=np.float32) for s in shards]) if all(with_bias) else None
    return Fp8Weight(
        data,
        scale,
        input_scale=input_scale,
        bias=bias,
        activation_scheme=schemes.pop(),
        source={"fused_from": [s.source for s in shards], "logical_widths": widths},
    )


def _fuse_block_shards(shards, blocks, widths, with_bias):
    if len(blocks) != 1:
        raise ValueError(f"shards must share one block_size, got {sorted(map(str, blocks))}")
    ((bn, bk),) = blocks
    kinds = {(s.scale_format, s.activation_scale_format, s.activation_scale_rounding) for s in shards}
    if len(kinds) != 1:
        raise ValueError(
            f"shards must share one scale format (weight, activation, rounding), got {sorted(map(str, kinds))}"
        )
    for i, s in enumerate(shards[:-1]):
        if s.shape[0] % bn:
            raise ValueError(
                f"shards[{i}] must have N a multiple of bn = {bn} to be fused (its last block would "
                f"straddle the next shard), got N = {s.shape[0]}"
            )
    bias = np.concatenate([np.asarray(s.bias, dtype=np.float32) for s in shards]) if all(with_bias) else None
    return Fp8Weight(
        np.concatenate([s.data for s in shards], axis=0),
        np.concatenate([s.weight_scale for s in shards], axis=0),
        bias=bias,
        block_size=(bn, bk),
        scale_ue8m0=shards[0].scale_ue8m0,
        activation_scale_format=shards[0].activation_scale_format,
        activation_scale_rounding=shards[0].activation_scale_rounding,
        source={"fused_from": [s.source for s in shards], "logical_widths": widths},
    )
