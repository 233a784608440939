"""What a user saves loads back (issue 41): every saver x every loader, for every scheme, bitwise and
with each layer's format (activation scheme, block size, scale formats, rounding) intact.

Savers: ``vtnumba.torch.save_checkpoint`` to one file and to a sharded folder,
``seam.save_fp8_checkpoint`` of the model's seam layers, and a converted model's plain
``state_dict()`` written by ``safetensors.torch.save_file`` (which records no format: its loads pass
the scheme, as a user of such a file must). Loaders: ``convert(model, checkpoint=...)``,
``Fp8Linear.from_checkpoint`` / ``Fp8Experts.from_checkpoint`` and ``seam.load_fp8_linear`` /
``seam.load_fp8_experts``. Models: a tiny Qwen3-MoE (dense attention and lm_head, fused experts)
and a tiny Llama (dense only), random weights, no download; the same seed gives the fresh model the
same float weights, so the logits of the reloaded model must equal the saved model's bit for bit.

Then the seam formats the torch layers do not take (MXFP8 and E8M0-scaled dense layers, 'floor'
rounding), a per_token layer that comes back per_token, the refusals (a keyword that contradicts
the record, two names for one tensor, a record the tensors do not match), and the public layouts:
transformers' own FP8Linear / FP8Experts load what is saved, strictly.
"""

import copy
import json
import os
import warnings

import numpy as np
import pytest

from vtnumba import seam
from vtnumba.seam import saving

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
vtt = pytest.importorskip("vtnumba.torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
nn = torch.nn

VOCAB = 128
PROMPT = torch.arange(3, 3 + 2 * 12).remainder(VOCAB).reshape(2, 12)
MX = seam.Fp8Config("mxfp8", "block", "per_group", (), (1, 32), activation_scale_format="e8m0")
UE8M0 = seam.Fp8Config("fp8", "block", "per_group", (), (128, 128), activation_scale_ue8m0=True)
CONFIGS = {
    "dynamic": "dynamic",
    "per_token": "per_token",
    "static": "static",
    "per_group": "per_group",
    "per_group_ue8m0": UE8M0,
    "mxfp8": MX,
}


def _qwen3(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    return transformers.Qwen3MoeForCausalLM(cfg).eval()


def _llama(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


MODELS = {"qwen3_moe": _qwen3, "llama": _llama}


def _logits(model):
    with torch.no_grad():
        return model(PROMPT).logits


def _convert(model, config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the float router and embeddings: convert says so, by design
        if config == "static":
            prompts = [torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(s)) for s in range(2)]
            scales = vtt.calibrate(model, lambda: [model(p) for p in prompts])
            return vtt.convert(model, "static", input_scales=scales)
        return vtt.convert(model, config)


def _fp8_modules(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, (vtt.Fp8Linear, vtt.Fp8Experts))}


def _replace(model, name, layer):
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, layer)


# -- savers: (model, folder) -> (path, whether the file records the formats) ----------------------------


def _save_file(model, tmp):
    path = os.path.join(tmp, "model.safetensors")
    assert vtt.save_checkpoint(model, path) == [path]
    return path, True


def _save_shards(model, tmp):
    path = os.path.join(tmp, "sharded")
    written = vtt.save_checkpoint(model, path, max_shard_bytes=16384)
    shards = [f for f in written if f.endswith(".safetensors")]
    assert len(shards) > 1, written  # the test must exercise the index, not one file
    with open(os.path.join(path, "model.safetensors.index.json"), encoding="utf-8") as f:
        index = json.load(f)
    assert sorted(set(index["weight_map"].values())) == sorted(os.path.basename(s) for s in shards)
    return path, True


def _save_seam(model, tmp):
    layers = {}
    for name, m in _fp8_modules(model).items():
        layers[name] = m.fp8_weight if isinstance(m, vtt.Fp8Linear) else m.fp8_experts
    path = os.path.join(tmp, "seam.safetensors")
    assert seam.save_fp8_checkpoint(path, layers) == [path]
    return path, True


def _save_state_dict(model, tmp):
    path = os.path.join(tmp, "state_dict.safetensors")
    safetensors_torch.save_file(model.state_dict(), path)
    return path, False


SAVERS = {"file": _save_file, "shards": _save_shards, "seam": _save_seam, "state_dict": _save_state_dict}


# -- loaders: (path, the saved model, its config, recorded?, fresh model) -> the fresh model loaded ---------


def _kwargs(module, recorded, experts):
    """What a loader is told: nothing when the file records the format, else the saved layer's."""
    if recorded:
        return {}
    fmt = module.format
    kw = {
        "activation_scheme": fmt.activation_scheme.value,
        "block_size": fmt.block_size,
        "scale_ue8m0": fmt.scale_ue8m0,
    }
    if experts:
        kw["activation_scale_format"] = fmt.activation_scale_format
    return kw


def _load_convert(path, saved, config, recorded, fresh):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vtt.convert(fresh, None if recorded else config, checkpoint=path)


def _load_modules(path, saved, config, recorded, fresh):
    for name, m in _fp8_modules(saved).items():
        if isinstance(m, vtt.Fp8Linear):
            layer = vtt.Fp8Linear.from_checkpoint(path, name, **_kwargs(m, recorded, False))
        else:
            layer = vtt.Fp8Experts.from_checkpoint(path, name, **_kwargs(m, recorded, True))
        _replace(fresh, name, layer)
    return fresh


def _load_seam(path, saved, config, recorded, fresh):
    ckpt = seam.Checkpoint(path)  # one header parse for every layer
    for name, m in _fp8_modules(saved).items():
        if isinstance(m, vtt.Fp8Linear):
            kw = _kwargs(m, recorded, False)
            layer = vtt.Fp8Linear(seam.load_fp8_linear(ckpt, name, **kw))
        else:
            layer = vtt.Fp8Experts(*seam.load_fp8_experts(ckpt, name, **_kwargs(m, recorded, True)))
        _replace(fresh, name, layer)
    return fresh


LOADERS = {"convert": _load_convert, "modules": _load_modules, "seam": _load_seam}


@pytest.mark.parametrize("scheme", list(CONFIGS))
@pytest.mark.parametrize("family", list(MODELS))
def test_every_saver_every_loader(family, scheme, tmp_path):
    """Each saver's file read by each loader: the same FP8 layers (format equal, layer by layer) and
    the same logits, bitwise."""
    config = CONFIGS[scheme]
    saved = _convert(MODELS[family](), config)
    want = _logits(saved)
    formats = {n: m.format for n, m in _fp8_modules(saved).items()}
    assert formats and (family == "llama" or any(isinstance(m, vtt.Fp8Experts) for m in _fp8_modules(saved).values()))
    for sname, saver in SAVERS.items():
        folder = tmp_path / sname
        folder.mkdir()
        path, recorded = saver(saved, str(folder))
        for lname, loader in LOADERS.items():
            loaded = loader(path, saved, config, recorded, MODELS[family]())
            got = {n: m.format for n, m in _fp8_modules(loaded).items()}
            assert got == formats, f"{sname} -> {lname}: formats differ"
            assert torch.equal(_logits(loaded), want), f"{sname} -> {lname}: logits differ"


def test_saved_config_is_the_conversion_config(tmp_path):
    """The quantization_config a saved per_token model carries reads back (Fp8Config.from_hf of the
    folder, Fp8Config.from_checkpoint of the file) as the scheme it was converted with."""
    model = _convert(_llama(), "per_token")
    vtt.save_checkpoint(model, tmp_path / "m")
    for config in (seam.Fp8Config.from_hf(tmp_path / "m"), seam.Fp8Config.from_checkpoint(tmp_path / "m")):
        assert (config.activation_scheme, config.weight_strategy) == ("per_token", "channel")
    with open(tmp_path / "m" / "config.json", encoding="utf-8") as f:
        full = json.load(f)
    assert full["model_type"] == "llama" and full["quantization_config"]["quant_method"] == "compressed-tensors"


def test_per_token_layer_comes_back_per_token(tmp_path):
    """The issue's case: a per_token Fp8Linear saved and read by Fp8Linear.from_checkpoint with no
    keyword was 'dynamic'; it is per_token, with its per-channel scales, and computes the same."""
    torch.manual_seed(1)
    layer = vtt.Fp8Linear.from_linear(nn.Linear(64, 32), "per_token")
    vtt.save_checkpoint(nn.Sequential(layer), tmp_path / "m.safetensors")
    back = vtt.Fp8Linear.from_checkpoint(tmp_path / "m.safetensors", "0")
    assert back.activation_scheme == "per_token" and back.format == layer.format
    assert back.format.per_channel
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert torch.equal(back(x), layer(x))


# -- seam formats the torch layers do not take ----------------------------------------------------------

_RNG = np.random.default_rng(0)
_W = _RNG.standard_normal((40, 96)).astype(np.float32)
_WGU = _RNG.standard_normal((3, 64, 96)).astype(np.float32)  # gate_up [E, 2I, H]
_WDN = _RNG.standard_normal((3, 96, 32)).astype(np.float32)  # down [E, H, I]
DENSE = {
    "dynamic": dict(),
    "static": dict(input_scale=0.02),
    "per_token": dict(per_channel=True, activation_scheme="per_token"),
    "per_channel_dynamic": dict(per_channel=True, activation_scheme="dynamic"),
    "per_group": dict(block_size=(16, 32)),
    "per_group_ue8m0": dict(block_size=(16, 32), scale_ue8m0=True),
    "per_group_e8m0": dict(block_size=(16, 32), scale_format="e8m0"),
    "mxfp8": dict(block_size=(1, 32), scale_format="e8m0"),
    "mxfp8_floor": dict(block_size=(1, 32), scale_format="e8m0", scale_rounding="floor"),
}


@pytest.mark.parametrize("sharded", [False, True])
def test_seam_dense_and_experts_round_trip(sharded, tmp_path):
    """seam.save_fp8_checkpoint of dense layers and expert pairs in every format, read by the seam
    loaders (and Fp8Config.load_linear of the config the file carries, where one format is saved):
    codes, scales and formats equal, the GEMM's output bitwise."""
    bias = _RNG.standard_normal(40).astype(np.float32)
    dense = {f"d.{k}": seam.Fp8Weight.from_float(_W, bias=bias, **kw) for k, kw in DENSE.items()}
    experts = {
        f"e.{k}": tuple(seam.Fp8Experts.from_float(w, **kw) for w in (_WGU, _WDN))
        for k, kw in DENSE.items()
        if "input_scale" not in kw
    }
    experts["e.static"] = tuple(seam.Fp8Experts.from_float(w, input_scale=[0.01, 0.02, 0.03]) for w in (_WGU, _WDN))
    path = tmp_path / ("dir" if sharded else "m.safetensors")
    written = seam.save_fp8_checkpoint(path, {**dense, **experts}, max_shard_bytes=8192 if sharded else 10**9)
    assert (len(written) > 2) == sharded
    ckpt = seam.Checkpoint(path)
    x = _RNG.standard_normal((5, 96)).astype(np.float32)
    for name, w in dense.items():
        back = seam.load_fp8_linear(ckpt, name)
        assert back.format == w.format, name
        assert np.array_equal(back.data, w.data) and np.array_equal(back.weight_scale, w.weight_scale), name
        assert np.array_equal(seam.matmul_fp8(x, back), seam.matmul_fp8(x, w)), name
    for name, pair in experts.items():
        back = seam.load_fp8_experts(ckpt, name)
        for b, e in zip(back, pair):
            assert b.format == e.format, name
            assert np.array_equal(b.data, e.data) and np.array_equal(b.weight_scale, e.weight_scale), name
            assert (b.input_scale is None) == (e.input_scale is None), name
            assert e.input_scale is None or np.array_equal(b.input_scale, e.input_scale), name
    assert ckpt.quantization_config() is None  # several formats: no one config describes them
    single = tmp_path / "one.safetensors"
    seam.save_fp8_checkpoint(single, {"a": dense["d.mxfp8_floor"]})
    config = seam.Fp8Config.from_checkpoint(single)
    assert config.format.mxfp8 and config.load_linear(single, "a").weight.format == dense["d.mxfp8_floor"].format


@pytest.mark.parametrize(
    "config",
    [
        seam.Fp8Config("fp8", "tensor", "dynamic", ("lm_head",)),
        seam.Fp8Config("fp8", "tensor", "static"),
        seam.Fp8Config("compressed-tensors", "channel", "per_token", ("re:.*gate$",)),
        seam.Fp8Config("compressed-tensors", "tensor", "per_token"),
        seam.Fp8Config("fp8", "block", "per_group", (), (128, 128)),
        UE8M0,
        seam.Fp8Config("fp8", "block", "per_group", (), (128, 128), weight_scale_format="e8m0"),
        seam.Fp8Config(
            "mxfp8", "block", "per_group", (), (1, 32), activation_scale_format="e8m0", weight_scale_format="e8m0"
        ),
    ],
    ids=str,
)
def test_config_round_trips_through_hf(config):
    """Fp8Config.to_hf is read back by from_hf as an equal config (same format, same ignore list), and
    transformers accepts the 'fp8' sections as its FineGrainedFP8Config."""
    section = config.to_hf()
    back = seam.Fp8Config.from_hf(json.loads(json.dumps(section)))
    assert back == config and back.format == config.format
    if section["quant_method"] == "fp8":
        hf = transformers.FineGrainedFP8Config.from_dict(section)
        assert hf.activation_scheme == config.activation_scheme.replace("per_group", "dynamic")
        assert (None if hf.weight_block_size is None else tuple(hf.weight_block_size)) == config.weight_block_size


# -- refusals ---------------------------------------------------------------------------------------------


def test_contradicting_keyword_is_refused(tmp_path):
    """A keyword that contradicts the recorded format is refused naming both; left out, the record wins."""
    w = seam.Fp8Weight.from_float(_W, per_channel=True, activation_scheme="per_token")
    seam.save_fp8_checkpoint(tmp_path / "m.safetensors", {"l": w})
    with pytest.raises(ValueError, match=r"activation_scheme must be 'per_token'.*got 'dynamic'"):
        seam.load_fp8_linear(tmp_path / "m.safetensors", "l", activation_scheme="dynamic")
    with pytest.raises(ValueError, match=r"block_size must be None.*got \(128, 128\)"):
        vtt.Fp8Linear.from_checkpoint(tmp_path / "m.safetensors", "l", block_size=(128, 128))
    assert seam.load_fp8_linear(tmp_path / "m.safetensors", "l", activation_scheme="per_token").format == w.format


def test_record_the_tensors_do_not_match_is_refused(tmp_path):
    """A record that says per_token beside per-tensor scales (a file edited after saving) is refused."""
    w = seam.Fp8Weight.from_float(_W)
    lie = seam.Fp8Format("per_token", per_channel=True)
    saving.write_checkpoint(tmp_path / "m.safetensors", saving.dense_tensors("l", w), {"l": lie}, None)
    with pytest.raises(ValueError, match=r"must hold the format recorded.*edited"):
        seam.load_fp8_linear(tmp_path / "m.safetensors", "l")


def test_two_names_for_one_scale_are_refused(tmp_path):
    """transformers' name and the torch module's buffer name for one experts scale: ambiguous."""
    torch.manual_seed(0)
    model = _convert(_qwen3(), "dynamic")
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    name = next(k for k in sd if k.endswith("experts.gate_up_proj_scale"))
    sd[name + "_inv"] = sd[name].clone()
    safetensors_torch.save_file(sd, tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match=r"must not both be present"):
        seam.load_fp8_experts(tmp_path / "m.safetensors", name.rsplit(".", 1)[0])


def test_format_refuses_bad_combinations():
    """The format is checked once, with the fix in the words."""
    with pytest.raises(ValueError, match="activation_scheme must be one of"):
        seam.Fp8Format("per_row")
    with pytest.raises(ValueError, match="per_group' goes with block-scaled weights"):
        seam.Fp8Format("per_group")
    with pytest.raises(ValueError, match="weight_scale_format 'e8m0' needs block-scaled weights"):
        seam.Fp8Format("dynamic", weight_scale_format="e8m0")
    with pytest.raises(ValueError, match="per_channel must be False for block-scaled weights"):
        seam.Fp8Format("per_group", (128, 128), per_channel=True)
    fmt = seam.Fp8Format("per_group", (1, 32), weight_scale_format="e8m0", activation_scale_format="e8m0")
    assert fmt.activation_scale_rounding == "rceil" and fmt.mxfp8 and hash(fmt) == hash(copy.copy(fmt))
    assert seam.Fp8Format.from_record(fmt.to_record()) == fmt and "MXFP8" in str(fmt)


# -- the public layouts ----------------------------------------------------------------------------------


def test_transformers_fp8_modules_load_what_is_saved(tmp_path):
    """transformers' own FP8Linear and FP8Experts (finegrained_fp8) take the saved tensors with
    load_state_dict(strict=True): the names, shapes and dtypes are theirs (per-tensor, static and
    block-scaled; float32 block scales)."""
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    # 32 x 32 blocks: transformers keeps two block rows for gate_up (one per half) when 2I < bn
    blocks = seam.Fp8Config("fp8", "block", "per_group", (), (32, 32))
    for config, block, scheme in (
        ("dynamic", None, "dynamic"),
        ("static", None, "static"),
        (blocks, (32, 32), "dynamic"),
    ):
        model = _convert(_qwen3(), config)
        path = tmp_path / f"{scheme}{block}.safetensors"
        vtt.save_checkpoint(model, path)
        tensors = safetensors_torch.load_file(path)
        prefix = "model.layers.0.self_attn.q_proj"
        q = model.get_submodule(prefix)
        linear = fp8.FP8Linear(q.in_features, q.out_features, block_size=block, activation_scheme=scheme)
        linear.load_state_dict({k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + ".")})
        assert torch.equal(linear.weight.view(torch.uint8), q.weight.view(torch.uint8))
        experts = fp8.FP8Experts(model.config, block_size=block, activation_scheme=scheme)
        prefix = "model.layers.0.mlp.experts"
        experts.load_state_dict({k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + ".")})
        ours = model.get_submodule(prefix)
        assert torch.equal(experts.down_proj.view(torch.uint8), ours.down_proj.view(torch.uint8))
