"""seam.load_fp8_experts on small MoE checkpoints written in the on-disk formats real producers use:

- per expert, block-scaled ``weight_scale_inv`` F32 / BF16 [ceil(N/128), ceil(K/128)] (Qwen3-30B-A3B-FP8,
  DeepSeek-V3), or UE8M0 bytes F8_E8M0 / U8 (DeepSeek's later releases);
- per expert, MXFP8 (E8M0 ``weight_scale_inv`` per 1 x 32, transformers' "mxfp8");
- per expert, per-tensor ``weight_scale`` F32 [] with an ``input_scale`` per projection (ModelOpt FP8;
  gate and up with different scales and input scales);
- per expert, per-channel ``weight_scale`` BF16 [N, 1] (compressed-tensors FP8_DYNAMIC);
- fused, transformers' FP8Experts parameters (``gate_up_proj`` [E, 2I, H], ``gate_up_proj_scale_inv``,
  ``down_proj`` [E, H, I], ``down_proj_scale_inv``; per-tensor: [E, 2, 1] for the gate and up halves,
  with ``*_activation_scale`` [E]), as transformers/integrations/finegrained_fp8.py allocates them;
- a sharded checkpoint through its index.

Each expert is checked bit for bit against ``load_fp8_linear`` of the same tensors (gate and up fused by
``fuse_fp8_shards``), and ``moe_fp8`` on the loaded experts against a float64 reference.
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from vtnumba import seam

RNG = np.random.default_rng(2025)
P = "model.layers.0.mlp.experts"
# I = 256: the down projection's K spans two 128-groups, as every real MoE's does
E, I, H = 3, 256, 384
BLOCK = (128, 128)


def _f8(codes):
    return codes.view(ml_dtypes.float8_e4m3fn)  # safetensors writes F8_E4M3


def _float_experts():
    """gate, up [E, I, H] and down [E, H, I], each expert at its own magnitude (so per-tensor scales
    differ between experts and between gate and up)."""
    mag = RNG.uniform(0.02, 0.1, size=(3, E))
    gate, up = (RNG.standard_normal((E, I, H)) * mag[i][:, None, None] for i in range(2))
    down = RNG.standard_normal((E, H, I)) * mag[2][:, None, None]
    return {
        "gate_proj": gate.astype(np.float32),
        "up_proj": up.astype(np.float32),
        "down_proj": down.astype(np.float32),
    }


def _calibrated_input_scales(floats):
    """Static input scales as a calibration pass sets them: amax / 448 of each projection's inputs over
    sample tokens, with some headroom, a different margin for each (so gate's and up's differ)."""
    x = RNG.standard_normal((256, H))
    scales = {}
    for e in range(E):
        g, u = x @ floats["gate_proj"][e].T, x @ floats["up_proj"][e].T
        for proj, inputs in (("gate_proj", x), ("up_proj", x), ("down_proj", g / (1 + np.exp(-g)) * u)):
            scales[proj, e] = np.float32(np.abs(inputs).max() / 448 * RNG.uniform(1.1, 1.5))
    return scales


def _per_expert_tensors(kind, prefix=P, floats=None):
    """The tensors of a per-expert checkpoint of ``kind`` (quantized from ``floats``, else fresh ones)
    and the load_fp8_experts keywords it needs."""
    tensors = {}
    floats = floats or _float_experts()
    input_scales = _calibrated_input_scales(floats)
    for proj, w in floats.items():
        for e in range(E):
            name = f"{prefix}.{e}.{proj}"
            if kind in ("block", "block_bf16"):
                fw = seam.Fp8Weight.from_float(w[e], block_size=BLOCK)
                scale = fw.weight_scale.astype(ml_dtypes.bfloat16) if kind == "block_bf16" else fw.weight_scale
                tensors[f"{name}.weight_scale_inv"] = scale
            elif kind in ("ue8m0", "ue8m0_u8"):
                fw = seam.Fp8Weight.from_float(w[e], block_size=BLOCK, scale_format="e8m0", scale_ue8m0=True)
                scale = fw.weight_scale if kind == "ue8m0_u8" else fw.weight_scale.view(ml_dtypes.float8_e8m0fnu)
                tensors[f"{name}.weight_scale_inv"] = scale
            elif kind == "mxfp8":
                fw = seam.Fp8Weight.from_float(w[e], block_size=(1, 32), scale_format="e8m0")
                tensors[f"{name}.weight_scale_inv"] = fw.weight_scale.view(ml_dtypes.float8_e8m0fnu)
            elif kind == "tensor":
                fw = seam.Fp8Weight.from_float(w[e])
                tensors[f"{name}.weight_scale"] = fw.weight_scale.reshape(())
                tensors[f"{name}.input_scale"] = np.array(input_scales[proj, e], np.float32)
            elif kind == "channel":
                fw = seam.Fp8Weight.from_float(w[e], per_channel=True)
                tensors[f"{name}.weight_scale"] = fw.weight_scale.astype(ml_dtypes.bfloat16).reshape(-1, 1)
            tensors[f"{name}.weight"] = _f8(fw.data)
    kw = {
        "block": dict(block_size=BLOCK),
        "block_bf16": dict(block_size=BLOCK),
        "ue8m0": dict(block_size=BLOCK, scale_ue8m0=True),
        "ue8m0_u8": dict(block_size=BLOCK, scale_ue8m0=True),
        "mxfp8": dict(block_size=(1, 32)),
        "tensor": {},
        "channel": dict(activation_scheme="per_token"),
    }[kind]
    return tensors, kw


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint32) if a.dtype == np.float32 else a


def _assert_same_weight(got, want):
    np.testing.assert_array_equal(got.data, want.data)
    np.testing.assert_array_equal(_bits(got.weight_scale), _bits(np.asarray(want.weight_scale)))
    assert got.input_scale == want.input_scale or (got.input_scale is None and want.input_scale is None)
    assert (got.activation_scheme, got.block_size, got.per_channel, got.scale_format, got.scale_ue8m0) == (
        want.activation_scheme,
        want.block_size,
        want.per_channel,
        want.scale_format,
        want.scale_ue8m0,
    )


def _assert_per_expert_matches_dense(path, gate_up, down, kw):
    for e in range(E):
        gate, up, dn = (seam.load_fp8_linear(path, f"{P}.{e}.{p}", **kw) for p in ("gate_proj", "up_proj", "down_proj"))
        _assert_same_weight(gate_up.expert(e), seam.fuse_fp8_shards([gate, up]))
        _assert_same_weight(down.expert(e), dn)


def _assert_moe_close(gate_up, down, floats, tokens=7, k=2):
    """moe_fp8 on the loaded experts against float64 arithmetic on the float weights the checkpoint
    was quantized from, so a loader's slip shows as well as the layer's. The FP8 path rounds four
    times to e4m3 (the weights, x, silu(g) * u, and again the weights of down), each at most 2^-4
    relative (3 mantissa bits) and of random sign: a few percent of the output's norm in all. 0.12
    still catches what a loader can get wrong -- a scale off by 2x, gate and up swapped, an
    expert's weights under another's index -- each an error of the output's own size."""
    x = RNG.standard_normal((tokens, H)).astype(np.float32)
    ids = np.stack([RNG.choice(E, size=k, replace=False) for _ in range(tokens)]).astype(np.int32)
    weights = RNG.dirichlet(np.ones(k), size=tokens).astype(np.float32)
    y = seam.moe_fp8(x, gate_up, down, ids, weights)
    gate, up, dn = (floats[p].astype(np.float64) for p in ("gate_proj", "up_proj", "down_proj"))
    ref = np.zeros((tokens, H))
    for t in range(tokens):
        for j in range(k):
            e, xt = ids[t, j], x[t].astype(np.float64)
            g, u = gate[e] @ xt, up[e] @ xt
            ref[t] += weights[t, j] * (dn[e] @ (g / (1 + np.exp(-g)) * u))
    assert y.shape == (tokens, H) and y.dtype == np.float32
    rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert rel < 0.12, rel


# -- per-expert layouts ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["block", "block_bf16", "ue8m0", "ue8m0_u8", "mxfp8", "tensor", "channel"])
def test_per_expert_layouts_load_as_load_fp8_linear_reads_them(tmp_path, kind):
    floats = _float_experts()
    tensors, kw = _per_expert_tensors(kind, floats=floats)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    gate_up, down = seam.load_fp8_experts(tmp_path, P, **kw)
    assert gate_up.shape == (E, 2 * I, H) and down.shape == (E, H, I)
    _assert_per_expert_matches_dense(tmp_path, gate_up, down, kw)
    _assert_moe_close(gate_up, down, floats)
    assert gate_up.source["layout"] == "per_expert" and gate_up.source["num_experts"] == E
    assert (
        gate_up.source["files"] == ["model.safetensors"] and "fusion" in gate_up.source and "fusion" not in down.source
    )
    assert f"{P}.{E - 1}.up_proj.weight" in gate_up.source["tensors"]
    assert all(".down_proj." in t for t in down.source["tensors"])
    assert "read as the dequantization multiplier" in gate_up.source["scale_convention"]


def test_block_experts_keep_their_scales_exactly(tmp_path):
    tensors, kw = _per_expert_tensors("block_bf16")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    gate_up, down = seam.load_fp8_experts(tmp_path, P, **kw)
    assert gate_up.weight_scale.shape == (E, 4, 3) and down.weight_scale.shape == (E, 3, 2)
    assert gate_up.activation_scheme == "per_group" and gate_up.block_size == BLOCK
    # gate's block rows first, then up's, in the fused expert; bf16 widened exactly
    np.testing.assert_array_equal(
        gate_up.weight_scale[1, 2:], tensors[f"{P}.1.up_proj.weight_scale_inv"].astype(np.float32)
    )
    np.testing.assert_array_equal(gate_up.data[1, :I], tensors[f"{P}.1.gate_proj.weight"].view(np.uint8))


def test_ue8m0_experts_keep_their_bytes(tmp_path):
    tensors, kw = _per_expert_tensors("ue8m0")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    gate_up, down = seam.load_fp8_experts(tmp_path, P, **kw)
    assert gate_up.scale_format == "e8m0" and gate_up.weight_scale.dtype == np.uint8 and gate_up.scale_ue8m0
    np.testing.assert_array_equal(down.weight_scale[2], tensors[f"{P}.2.down_proj.weight_scale_inv"].view(np.uint8))
    assert "E8M0 bytes" in down.source["weight_scale"]


def test_per_tensor_gate_and_up_are_fused_at_the_larger_scale(tmp_path):
    tensors, kw = _per_expert_tensors("tensor")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    gate_up, down = seam.load_fp8_experts(tmp_path, P)
    assert gate_up.activation_scheme == "static" and gate_up.weight_scale.shape == (E,) and not gate_up.per_channel
    for e in range(E):
        sg, su = (tensors[f"{P}.{e}.{p}.weight_scale"] for p in ("gate_proj", "up_proj"))
        ig, iu = (tensors[f"{P}.{e}.{p}.input_scale"] for p in ("gate_proj", "up_proj"))
        assert sg != su and ig != iu  # the case vLLM requantizes
        assert gate_up.weight_scale[e] == max(sg, su) and gate_up.input_scale[e] == max(ig, iu)
        assert down.input_scale[e] == tensors[f"{P}.{e}.down_proj.input_scale"]
        kept = slice(0, I) if sg > su else slice(I, 2 * I)  # the shard at the max scale keeps its codes
        np.testing.assert_array_equal(
            gate_up.data[e, kept], tensors[f"{P}.{e}.{'gate_proj' if sg > su else 'up_proj'}.weight"].view(np.uint8)
        )
    assert gate_up.source["input_scale"] == "per expert (max of gate's and up's)"
    dynamic, _ = seam.load_fp8_experts(tmp_path, P, activation_scheme="dynamic")  # stored input scales ignored
    assert dynamic.input_scale is None and dynamic.activation_scheme == "dynamic"


def test_per_channel_scales_concatenate(tmp_path):
    tensors, kw = _per_expert_tensors("channel")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    gate_up, down = seam.load_fp8_experts(tmp_path, P, **kw)
    assert gate_up.per_channel and gate_up.weight_scale.shape == (E, 2 * I) and down.weight_scale.shape == (E, H)
    want = np.concatenate(
        [tensors[f"{P}.2.{p}.weight_scale"].astype(np.float32).reshape(-1) for p in ("gate_proj", "up_proj")]
    )
    np.testing.assert_array_equal(gate_up.weight_scale[2], want)
    np.testing.assert_array_equal(gate_up.data[2, I:], tensors[f"{P}.2.up_proj.weight"].view(np.uint8))


# -- transformers' fused layout ----------------------------------------------------------------------


def _fused_block_tensors(floats=None):
    w = floats or _float_experts()
    gu = [
        seam.Fp8Weight.from_float(np.concatenate([w["gate_proj"][e], w["up_proj"][e]]), block_size=BLOCK)
        for e in range(E)
    ]
    dn = [seam.Fp8Weight.from_float(w["down_proj"][e], block_size=BLOCK) for e in range(E)]
    return {
        f"{P}.gate_up_proj": _f8(np.stack([x.data for x in gu])),
        f"{P}.gate_up_proj_scale_inv": np.stack([x.weight_scale for x in gu]),
        f"{P}.down_proj": _f8(np.stack([x.data for x in dn])),
        f"{P}.down_proj_scale_inv": np.stack([x.weight_scale for x in dn]),
    }


def _spy_reads(monkeypatch):
    """The (tensor, file) of every Checkpoint.read from now on: the one way checkpoint.py reads data."""
    reads, real_read = [], seam.Checkpoint.read
    monkeypatch.setattr(
        seam.Checkpoint, "read", lambda self, name: reads.append((name, self.file(name))) or real_read(self, name)
    )
    return reads


def test_fused_transformers_block_layout(tmp_path, monkeypatch):
    floats = _float_experts()
    tensors = _fused_block_tensors(floats)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert seam.Fp8Config.experts_layout(tmp_path, P) == "fused"
    reads = _spy_reads(monkeypatch)
    gate_up, down = seam.load_fp8_experts(tmp_path, P, block_size=BLOCK)
    assert sorted(n for n, _ in reads) == sorted(tensors)  # each fused tensor once, not once per expert
    monkeypatch.undo()
    assert gate_up.shape == (E, 2 * I, H) and gate_up.weight_scale.shape == (E, 4, 3)
    # the same slices written as dense layers, read by load_fp8_linear
    dense = {}
    for e in range(E):
        for proj in ("gate_up_proj", "down_proj"):
            dense[f"{P}.{e}.{proj}.weight"] = tensors[f"{P}.{proj}"][e]
            dense[f"{P}.{e}.{proj}.weight_scale_inv"] = tensors[f"{P}.{proj}_scale_inv"][e]
    save_file(dense, str(tmp_path / "dense.safetensors"))
    for e in range(E):
        _assert_same_weight(
            gate_up.expert(e),
            seam.load_fp8_linear(tmp_path / "dense.safetensors", f"{P}.{e}.gate_up_proj", block_size=BLOCK),
        )
        _assert_same_weight(
            down.expert(e), seam.load_fp8_linear(tmp_path / "dense.safetensors", f"{P}.{e}.down_proj", block_size=BLOCK)
        )
    _assert_moe_close(gate_up, down, floats)
    assert gate_up.source["layout"] == "fused"
    assert gate_up.source["tensors"] == [f"{P}.gate_up_proj", f"{P}.gate_up_proj_scale_inv"]
    assert f"{P}.gate_up_proj_scale_inv[0]" in gate_up.source["weight_scale"]


def test_fused_transformers_per_tensor_halves_with_static_scales(tmp_path):
    # transformers' FP8Experts without blocks: gate_up_proj_scale_inv [E, 2, 1] (gate half, up half),
    # down_proj_scale_inv [E, 1, 1], activation scales [E] (activation_scheme "static")
    w = _float_experts()
    halves = [[seam.Fp8Weight.from_float(w[p][e]) for p in ("gate_proj", "up_proj")] for e in range(E)]
    dn = [seam.Fp8Weight.from_float(w["down_proj"][e]) for e in range(E)]
    calibrated = _calibrated_input_scales(w)
    act_gu = np.array([max(calibrated["gate_proj", e], calibrated["up_proj", e]) for e in range(E)], np.float32)
    act_dn = np.array([calibrated["down_proj", e] for e in range(E)], np.float32)
    save_file(
        {
            f"{P}.gate_up_proj": _f8(np.stack([np.concatenate([g.data, u.data]) for g, u in halves])),
            f"{P}.gate_up_proj_scale_inv": np.stack([[g.weight_scale, u.weight_scale] for g, u in halves]),
            f"{P}.gate_up_proj_activation_scale": act_gu,
            f"{P}.down_proj": _f8(np.stack([d.data for d in dn])),
            f"{P}.down_proj_scale_inv": np.stack([d.weight_scale.reshape(1, 1) for d in dn]),
            f"{P}.down_proj_activation_scale": act_dn,
        },
        str(tmp_path / "model.safetensors"),
    )
    gate_up, down = seam.load_fp8_experts(tmp_path, P)
    assert gate_up.activation_scheme == "static" and gate_up.weight_scale.shape == (E,)
    dense = {}
    for e, (g, u) in enumerate(halves):
        for name, x, s in (("gate", g, act_gu[e]), ("up", u, act_gu[e]), ("down", dn[e], act_dn[e])):
            dense.update(
                {
                    f"{e}.{name}.weight": _f8(x.data),
                    f"{e}.{name}.weight_scale_inv": x.weight_scale,
                    f"{e}.{name}.input_scale": np.array(s),
                }
            )
    save_file(dense, str(tmp_path / "dense.safetensors"))
    for e in range(E):
        want = seam.load_fp8_fused_linear(tmp_path / "dense.safetensors", [f"{e}.gate", f"{e}.up"])
        _assert_same_weight(gate_up.expert(e), want)
        _assert_same_weight(down.expert(e), seam.load_fp8_linear(tmp_path / "dense.safetensors", f"{e}.down"))
    np.testing.assert_array_equal(gate_up.input_scale, act_gu)
    _assert_moe_close(gate_up, down, w)


# -- sharded checkpoints: only this layer's tensors are read ----------------------------------------


def test_sharded_experts_read_only_their_tensors(tmp_path, monkeypatch):
    tensors, kw = _per_expert_tensors("block")
    other, _ = _per_expert_tensors("block", prefix="model.layers.1.mlp.experts")
    names = sorted(tensors)
    shards = {
        "model-00001-of-00003.safetensors": names[: len(names) // 2],
        "model-00002-of-00003.safetensors": names[len(names) // 2 :],
        "model-00003-of-00003.safetensors": sorted(other),
    }
    everything = {**tensors, **other}
    for file, held in shards.items():
        save_file({n: everything[n] for n in held}, str(tmp_path / file))
    index = {"metadata": {}, "weight_map": {n: f for f, held in shards.items() for n in held}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))

    reads = _spy_reads(monkeypatch)
    gate_up, down = seam.load_fp8_experts(tmp_path, P, **kw)
    assert sorted(n for n, _ in reads) == names  # each of this layer's tensors once, nothing else
    assert {os.path.basename(f) for _, f in reads} == set(shards) - {"model-00003-of-00003.safetensors"}
    assert gate_up.source["files"] == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"]
    monkeypatch.undo()
    _assert_per_expert_matches_dense(tmp_path / "model.safetensors.index.json", gate_up, down, kw)


def test_a_missing_shard_is_named(tmp_path):
    tensors, kw = _per_expert_tensors("block")
    save_file(tensors, str(tmp_path / "model-00001-of-00002.safetensors"))
    weight_map = {n: "model-00001-of-00002.safetensors" for n in tensors}
    weight_map[f"{P}.9.gate_proj.weight"] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(
        ValueError,
        match=rf"layer '{P}': shard 'model-00002-of-00002.safetensors' named in "
        r"model.safetensors.index.json must exist, got missing",
    ):
        seam.load_fp8_experts(tmp_path, P, **kw)


# -- Fp8Config: which layout, and loading with the config's scheme ------------------------------------


def test_config_tells_the_layout_and_loads_with_its_scheme(tmp_path):
    tensors, kw = _per_expert_tensors("block")
    save_file(
        {**tensors, "model.layers.0.mlp.gate.weight": np.ones((E, H), ml_dtypes.bfloat16)},
        str(tmp_path / "model.safetensors"),
    )
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "num_experts": E,
                "quantization_config": {
                    "quant_method": "fp8",
                    "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128],
                    "modules_to_not_convert": ["lm_head", "re:.*mlp\\.gate$"],
                },
            }
        )
    )
    cfg = seam.Fp8Config.from_hf(tmp_path)
    assert cfg.experts_layout(tmp_path, P) == "per_expert"
    assert cfg.experts_layout(tmp_path, "model.layers.0.mlp") is None  # the MoE block, not its experts
    assert cfg.experts_layout(tmp_path, "model.layers.0.mlp.gate") is None
    ckpt = seam.Checkpoint(tmp_path)
    gate_up, down = cfg.load_experts(ckpt, P, num_experts=E)
    want_gu, want_dn = seam.load_fp8_experts(tmp_path, P, **kw)
    for e in range(E):
        _assert_same_weight(gate_up.expert(e), want_gu.expert(e))
        _assert_same_weight(down.expert(e), want_dn.expert(e))

    modelopt = seam.Fp8Config.from_hf({"quant_method": "modelopt", "quant_algo": "FP8"})
    with pytest.raises(
        ValueError,
        match=rf"tensor '{P}.0.gate_proj.weight_scale_inv' has shape \[2, 3\] for a weight "
        r"of shape \[256, 384\]: a block-scaled layer; pass block_size",
    ):
        modelopt.load_experts(ckpt, P)  # a per-tensor config does not read block-scaled experts
    skip_one = seam.Fp8Config.from_hf(
        {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
            "ignored_layers": [f"{P}.1.down_proj"],
        }
    )
    with pytest.raises(
        ValueError,
        match=rf"experts '{P}' must be FP8-quantized to load as seam.Fp8Experts, got "
        rf"'{P}.1.down_proj' left unquantized by the ignore entry",
    ):
        skip_one.load_experts(ckpt, P)


def test_config_static_and_per_token_schemes(tmp_path):
    tensors, _ = _per_expert_tensors("tensor")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    gate_up, _ = seam.Fp8Config.from_hf({"quant_method": "modelopt", "quant_algo": "FP8"}).load_experts(tmp_path, P)
    assert gate_up.activation_scheme == "static" and gate_up.input_scale.shape == (E,)
    (tmp_path / "model.safetensors").unlink()
    tensors, _ = _per_expert_tensors("channel")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    pcpt = seam.Fp8Config.from_hf({"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"})
    gate_up, down = pcpt.load_experts(tmp_path, P)
    assert gate_up.activation_scheme == down.activation_scheme == "per_token" and gate_up.per_channel


# -- refusals -------------------------------------------------------------------------------------


def _saved(tmp_path, tensors):
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_a_missing_expert_is_named_by_its_index(tmp_path):
    tensors, kw = _per_expert_tensors("block")
    del tensors[f"{P}.1.up_proj.weight"], tensors[f"{P}.1.up_proj.weight_scale_inv"]
    path = _saved(tmp_path, tensors)
    with pytest.raises(
        ValueError,
        match=rf"checkpoint must hold {P}.1.up_proj.weight \(expert 1 of 3\), got none in "
        rf".*{tmp_path.name}",
    ):
        seam.load_fp8_experts(path, P, **kw)
    with pytest.raises(ValueError, match=rf"checkpoint must hold {P}.1.up_proj.weight \(expert 1 of 5\)"):
        seam.load_fp8_experts(path, P, num_experts=5, **kw)


def test_a_missing_last_expert_needs_num_experts_to_be_seen(tmp_path):
    tensors, kw = _per_expert_tensors("block")
    path = _saved(tmp_path, tensors)
    with pytest.raises(ValueError, match=rf"checkpoint must hold {P}.3.gate_proj.weight \(expert 3 of 4\), got none"):
        seam.load_fp8_experts(path, P, num_experts=4, **kw)
    with pytest.raises(
        ValueError, match=rf"num_experts must cover every expert stored under '{P}', got 2 with expert 2"
    ):
        seam.load_fp8_experts(path, P, num_experts=2, **kw)
    with pytest.raises(ValueError, match=r"num_experts must be a positive int, got 0"):
        seam.load_fp8_experts(path, P, num_experts=0, **kw)


def test_mixed_schemes_are_refused_naming_the_expert(tmp_path):
    tensors, _ = _per_expert_tensors("tensor")
    channel, _ = _per_expert_tensors("channel")
    for key in (f"{P}.2.up_proj.weight", f"{P}.2.up_proj.weight_scale"):
        tensors[key] = channel[key]
    del tensors[f"{P}.2.up_proj.input_scale"]
    with pytest.raises(
        ValueError,
        match=rf"expert 2's up_proj \({P}.2.up_proj\) must be quantized like expert 0's "
        r"gate_proj \(per-tensor weight_scale with input_scale; one scheme for the whole "
        r"MoE layer\), got per-channel weight_scale without input_scale",
    ):
        seam.load_fp8_experts(_saved(tmp_path, tensors), P)


def test_mixed_block_scale_formats_are_refused(tmp_path):
    tensors, kw = _per_expert_tensors("block")
    e8m0, _ = _per_expert_tensors("ue8m0_u8")
    tensors[f"{P}.1.down_proj.weight_scale_inv"] = e8m0[f"{P}.1.down_proj.weight_scale_inv"]
    with pytest.raises(ValueError, match=r"expert 1's down_proj .* got block weight_scale_inv \(E8M0 bytes\)"):
        seam.load_fp8_experts(_saved(tmp_path, tensors), P, **kw)


def test_wrong_shapes_are_refused(tmp_path):
    tensors, kw = _per_expert_tensors("block")
    tensors[f"{P}.2.down_proj.weight"] = _f8(np.zeros((H, I // 2), np.uint8))
    tensors[f"{P}.2.down_proj.weight_scale_inv"] = np.ones((3, 1), np.float32)
    with pytest.raises(
        ValueError,
        match=rf"tensor '{P}.2.down_proj.weight' must have shape \[H, I\] = \[384, 256\] "
        r"\(expert 0's gate_proj is \[I, H\] = \[256, 384\]\), got \[384, 128\]",
    ):
        seam.load_fp8_experts(_saved(tmp_path, tensors), P, **kw)


@pytest.mark.parametrize(
    "change, words",
    [
        (
            lambda t: t.update({f"{P}.down_proj": _f8(np.zeros((E, H, I - 128), np.uint8))}),
            rf"tensor '{P}.down_proj' must be \[E, H, I\] = \[3, 384, 256\] for {P}.gate_up_proj \[E, 2I, H\] = "
            r"\[3, 512, 384\], got \[3, 384, 128\]",
        ),
        (
            lambda t: t.update({f"{P}.gate_up_proj_scale_inv": np.ones((E - 1, 4, 3), np.float32)}),
            rf"tensor '{P}.gate_up_proj_scale_inv' must have leading dimension E = 3",
        ),
        (
            lambda t: t.update({f"{P}.down_proj_scale_inv": np.ones((E, 3, 3), np.float32)}),
            rf"tensor '{P}.down_proj_scale_inv\[0\]' must have shape \[3, 2\]",
        ),
        (lambda t: t.pop(f"{P}.down_proj_scale_inv"), rf"checkpoint must hold {P}.down_proj_scale_inv"),
        (
            lambda t: t[f"{P}.gate_up_proj_scale_inv"].__setitem__((1, 3, 2), 0.0),
            rf"layer '{P}.gate_up_proj\[1\]': tensor '{P}.gate_up_proj_scale_inv\[1\]' must hold positive finite block "
            r"scales, got .*0\.0\)? at block \[3, 2\]",
        ),
        (
            lambda t: t[f"{P}.down_proj_scale_inv"].__setitem__((2, 0, 1), np.nan),
            rf"tensor '{P}.down_proj_scale_inv\[2\]' must hold positive finite block scales, got .*nan",
        ),
        (
            lambda t: t[f"{P}.gate_up_proj"].view(np.uint8).__setitem__((2, 5, 7), 0x7F),
            rf"tensor '{P}.gate_up_proj\[2\]' must hold finite e4m3 codes, got 1 NaN codes",
        ),
        (
            lambda t: t.update({f"{P}.gate_up_proj_bias": np.zeros((E, 2 * I), np.float32)}),
            rf"tensor '{P}.gate_up_proj_bias' must be absent \(seam.Fp8Experts takes no bias\)",
        ),
        (
            lambda t: t.update({f"{P}.0.gate_proj.weight": _f8(np.zeros((I, H), np.uint8))}),
            rf"experts under '{P}' must be stored either per expert .* or fused .* got both",
        ),
    ],
)
def test_bad_fused_checkpoints_are_refused_naming_the_tensor(tmp_path, change, words):
    tensors = _fused_block_tensors()
    change(tensors)
    with pytest.raises(ValueError, match=words):
        seam.load_fp8_experts(_saved(tmp_path, tensors), P, block_size=BLOCK)


@pytest.mark.parametrize("bad", [np.nan, 0.0, -1.0])
def test_bad_per_expert_scales_are_refused(tmp_path, bad):
    tensors, _ = _per_expert_tensors("tensor")
    tensors[f"{P}.2.down_proj.weight_scale"] = np.array(bad, np.float32)
    with pytest.raises(ValueError, match=rf"tensor '{P}.2.down_proj.weight_scale' must hold positive finite scales"):
        seam.load_fp8_experts(_saved(tmp_path, tensors), P)
    tensors[f"{P}.2.down_proj.weight_scale"] = np.array(0.01, np.float32)
    tensors[f"{P}.1.up_proj.input_scale"] = np.array(bad, np.float32)
    with pytest.raises(ValueError, match=rf"tensor '{P}.1.up_proj.input_scale' must be a positive finite scale"):
        seam.load_fp8_experts(_saved(tmp_path, tensors), P)


def test_fp8_experts_itself_refuses_bad_scales():
    # what the loader hands over is validated again by Fp8Experts, whoever builds it
    codes = np.zeros((E, 8, 16), np.uint8)
    with pytest.raises(
        ValueError, match=r"weight_scale must be positive and finite for every expert, got .* \(expert 1"
    ):
        seam.Fp8Experts(codes, np.array([1.0, np.nan, 1.0], np.float32))
    with pytest.raises(
        ValueError, match=r"input_scale must be positive and finite for every expert, got .* for expert 2"
    ):
        seam.Fp8Experts(codes, np.ones(E, np.float32), input_scale=np.array([1.0, 1.0, -1.0], np.float32))


def test_other_refusals(tmp_path):
    tensors, kw = _per_expert_tensors("block")
    tensors[f"{P}.0.up_proj.bias"] = np.zeros(I, np.float32)
    with pytest.raises(
        ValueError, match=rf"tensor '{P}.0.up_proj.bias' must be absent \(seam.Fp8Experts takes no bias\)"
    ):
        seam.load_fp8_experts(_saved(tmp_path, tensors), P, **kw)
    with pytest.raises(
        ValueError, match=r"checkpoint must hold the experts of 'model.layers.7.mlp.experts' .* got none"
    ):
        seam.load_fp8_experts(tmp_path, "model.layers.7.mlp.experts", **kw)
    del tensors[f"{P}.0.up_proj.bias"]
    with pytest.raises(
        ValueError, match=rf"tensor '{P}.0.gate_proj.weight_scale_inv' has shape \[2, 3\].*pass block_size"
    ):
        seam.load_fp8_experts(_saved(tmp_path, tensors), P)  # block scales without block_size
