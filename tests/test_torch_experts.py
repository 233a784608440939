"""vtnumba.torch's MoE experts on the CPU: Fp8Experts is seam.moe_fp8 on the tensors (bitwise), in
every scheme; convert turns tiny transformers MoE models (random weights, no download) into FP8
with no floating-point 3-D weight left and logits close to the float model's; torch.compile traces
the experts with no graph break and computes the same bytes; layouts it does not know stay in float
with a warning naming each weight; state_dict round-trips; conversion_report says what is left.

Sizes: H = 256 and I = 160 so that the 128 x 128 blocks of 'per_group' leave more than one group
per row along both K dimensions (H for gate_up, I for down)."""

import copy
import warnings

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from vtnumba import seam

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
vtt = pytest.importorskip("vtnumba.torch")
nn = torch.nn

from vtnumba.torch import experts as vtt_experts  # noqa: E402

H, I, E, K_TOP, VOCAB = 256, 160, 8, 2, 128
MX = seam.Fp8Config("mxfp8", "block", "per_group", (), (1, 32), activation_scale_format="e8m0")
SCHEMES = ["dynamic", "per_token", "static", "per_group", "mxfp8"]


def _qwen3_config(layers=2):
    return transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=H,
        intermediate_size=256,
        moe_intermediate_size=I,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=E,
        num_experts_per_tok=K_TOP,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )


def _mixtral_config(layers=2):
    return transformers.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=H,
        intermediate_size=I,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=E,
        num_experts_per_tok=K_TOP,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )


def _model(family="qwen3", seed=0):
    torch.manual_seed(seed)
    if family == "qwen3":
        return transformers.Qwen3MoeForCausalLM(_qwen3_config()).eval()
    return transformers.MixtralForCausalLM(_mixtral_config()).eval()


PROMPT = torch.arange(3, 3 + 2 * 12).remainder(VOCAB).reshape(2, 12)  # a fixed prompt, two sequences


def _config(scheme):
    return MX if scheme == "mxfp8" else scheme


def _calibrated(model):
    prompts = [torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(s)) for s in range(3)]
    return vtt.calibrate(model, lambda: [model(p) for p in prompts])


def _convert(model, scheme):
    scales = _calibrated(model) if scheme == "static" else None
    return vtt.convert(model, _config(scheme), input_scales=scales)


def _float_3d(model):
    return [
        n
        for n, p in model.named_parameters()
        if p.dim() == 3 and p.is_floating_point() and p.dtype != torch.float8_e4m3fn
    ]


def _experts_module(seed=0):
    torch.manual_seed(seed)
    module = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts(_qwen3_config())
    with torch.no_grad():
        module.gate_up_proj.normal_(0, 0.05)
        module.down_proj.normal_(0, 0.05)
    return module


def _routing(t, seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K_TOP] for _ in range(t)])
    ids[0, 1] = E  # transformers' sentinel: routes nothing
    weights = torch.softmax(torch.randn(t, K_TOP, generator=g), dim=-1)
    return x, ids, weights


def _seam_reference(module, scheme, scales=None):
    """seam.Fp8Experts.from_float of the float weights, in the scheme's words."""
    kw = {
        "dynamic": {},
        "per_token": dict(per_channel=True, activation_scheme="per_token"),
        "per_group": dict(block_size=(128, 128)),
        "mxfp8": dict(block_size=(1, 32), scale_format="e8m0"),
    }
    out = []
    for name in ("gate_up_proj", "down_proj"):
        w = getattr(module, name).detach().numpy()
        extra = dict(input_scale=scales[name]) if scheme == "static" else kw[scheme]
        out.append(seam.Fp8Experts.from_float(w, **extra))
    return out


def _from_experts(module, scheme, scales=None):
    if scheme == "mxfp8":
        return vtt.Fp8Experts.from_experts(module, "per_group", mxfp8=True)
    return vtt.Fp8Experts.from_experts(module, scheme, input_scales=scales)


# -- the layer is the seam ------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_fp8_experts_is_seam_moe_fp8_bitwise(scheme):
    module = _experts_module()
    scales = {"gate_up_proj": 0.011, "down_proj": np.linspace(0.005, 0.006, E)} if scheme == "static" else None
    layer = _from_experts(module, scheme, scales)
    gu, dn = _seam_reference(module, scheme, scales)
    mine_gu, mine_dn = layer.fp8_experts
    np.testing.assert_array_equal(mine_gu.data, gu.data)
    np.testing.assert_array_equal(mine_dn.data, dn.data)
    np.testing.assert_array_equal(mine_gu.weight_scale, gu.weight_scale)
    assert mine_gu.activation_scheme == gu.activation_scheme and mine_gu.block_size == gu.block_size
    assert layer.gate_up_proj.dtype == torch.float8_e4m3fn and layer.gate_up_proj.shape == (E, 2 * I, H)
    assert layer.down_proj.shape == (E, H, I)
    assert (layer.gate_up_proj_input_scale is not None) == (scheme == "static")
    x, ids, weights = _routing(6)
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            y = layer(xd, ids, weights)
            want = seam.moe_fp8(xd, gu, dn, ids, weights)  # torch in, torch out; same bytes as numpy in
            assert y.dtype == dtype and y.shape == (6, H)
            assert torch.equal(y, want)
        np.testing.assert_array_equal(
            layer(x, ids, weights).numpy(), seam.moe_fp8(x.numpy(), gu, dn, ids.numpy(), weights.numpy())
        )
        # FP8 against the float experts: close, not equal. The float module gets the sentinel slot as
        # expert 0 at weight 0 (the same sum): transformers 5.17 (the GPU image's) one-hots the ids over
        # E classes and refuses the sentinel, where 5.25 one-hots over E + 1 and skips it
        sentinel = ids == E
        ref = module(x, ids.masked_fill(sentinel, 0), weights.masked_fill(sentinel, 0.0))
        y = layer(x, ids, weights)
    cos = torch.nn.functional.cosine_similarity(y, ref, dim=-1)
    assert cos.min() > 0.98 and not torch.equal(y, ref)
    assert f"activation_scheme={'per_group' if scheme == 'mxfp8' else scheme!r}" in repr(layer)


def test_leading_dimensions_and_bad_input():
    layer = vtt.Fp8Experts.from_experts(_experts_module(), "dynamic")
    x, ids, weights = _routing(6)
    with torch.no_grad():
        flat = layer(x, ids, weights)
        assert torch.equal(
            layer(x.reshape(2, 3, H), ids.reshape(2, 3, K_TOP), weights.reshape(2, 3, K_TOP)), flat.reshape(2, 3, H)
        )
        with pytest.raises(ValueError, match=r"hidden_states must be \[\.\.\., H\] with H = 256"):
            layer(x[:, :64], ids, weights)
        with pytest.raises(TypeError, match="hidden_states must be a torch.Tensor, got ndarray"):
            layer(x.numpy(), ids, weights)
    with pytest.raises(ValueError, match=r"hidden_states \(the input of a vtnumba Fp8Experts\) must not require grad"):
        layer(x.requires_grad_(True), ids, weights)
    with pytest.raises(TypeError, match="gate_up must be a seam.Fp8Experts or a ResidentFp8 of one, got Tensor"):
        vtt.Fp8Experts(x, x)
    with pytest.raises(ValueError, match="input_scales\\['gate_up_proj'\\] must be given for scheme 'static'"):
        vtt.Fp8Experts.from_experts(_experts_module(), "static")
    with pytest.raises(ValueError, match="scheme must be 'per_group' with mxfp8=True"):
        vtt.Fp8Experts.from_experts(_experts_module(), "dynamic", mxfp8=True)


# -- convert on whole models ---------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "mixtral"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_moe_model_converts_in_every_scheme(family, scheme):
    model = _model(family)
    with torch.no_grad():
        ref = model(PROMPT).logits
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left in float that convert would warn about
        converted = _convert(copy.deepcopy(model), scheme)
    assert _float_3d(converted) == []
    kinds = {type(m).__name__ for m in converted.modules()}
    assert "Fp8Experts" in kinds and "Fp8Linear" in kinds
    block = converted.model.layers[0].mlp
    assert isinstance(block.experts, vtt.Fp8Experts) and not isinstance(block.gate, vtt.Fp8Linear)  # router: float
    with torch.no_grad():
        y = converted(PROMPT).logits
    cos = torch.nn.functional.cosine_similarity(y.flatten(0, 1), ref.flatten(0, 1), dim=-1)
    assert cos.mean() >= 0.99, float(cos.mean())
    assert not torch.equal(y, ref)


def test_static_scales_are_per_expert_from_calibrate():
    model = _model()
    scales = _calibrated(model)
    name = "model.layers.0.mlp.experts"
    gu, dn = scales[f"{name}.gate_up_proj"], scales[f"{name}.down_proj"]
    assert gu.shape == dn.shape == (E,) and gu.dtype == np.float32 and (gu > 0).all() and (dn > 0).all()
    assert len(set(gu.tolist())) > 1  # one scale per expert, from the tokens routed to it
    assert "model.layers.0.self_attn.q_proj" in scales  # the Linears', as before
    converted = vtt.convert(copy.deepcopy(model), "static", input_scales=scales)
    layer = converted.get_submodule(name)
    np.testing.assert_array_equal(layer.gate_up_proj_input_scale.numpy(), gu)
    np.testing.assert_array_equal(layer.fp8_experts[1].input_scale, dn)
    del scales[f"{name}.down_proj"]
    with pytest.raises(
        ValueError,
        match=rf"input_scales must give the scales of experts '{name}' \(static "
        rf"activations: '{name}.down_proj'\)",
    ):
        vtt.convert(copy.deepcopy(model), "static", input_scales=scales)


def test_routers_and_shared_experts():
    """Qwen2-MoE: the shared expert's Linears convert, its sigmoid gate and the router stay float."""
    torch.manual_seed(0)
    config = transformers.Qwen2MoeConfig(
        vocab_size=VOCAB,
        hidden_size=H,
        intermediate_size=256,
        moe_intermediate_size=I,
        shared_expert_intermediate_size=192,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=E,
        num_experts_per_tok=K_TOP,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = transformers.Qwen2MoeForCausalLM(config).eval()
    with torch.no_grad():
        ref = model(PROMPT).logits
    converted = vtt.convert(copy.deepcopy(model), "per_token")
    block = converted.model.layers[0].mlp
    assert isinstance(block.experts, vtt.Fp8Experts)
    assert isinstance(block.shared_expert.gate_proj, vtt.Fp8Linear)
    assert type(block.shared_expert_gate) is nn.Linear and not isinstance(block.gate, vtt.Fp8Linear)
    with torch.no_grad():
        y = converted(PROMPT).logits
    assert torch.nn.functional.cosine_similarity(y.flatten(0, 1), ref.flatten(0, 1), dim=-1).mean() >= 0.99


def _verified_modules():
    cfgs = {
        "Qwen3MoeExperts": ("qwen3_moe", _qwen3_config(1)),
        "MixtralExperts": ("mixtral", _mixtral_config(1)),
        "Qwen2MoeExperts": (
            "qwen2_moe",
            transformers.Qwen2MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E),
        ),
        "OlmoeExperts": ("olmoe", transformers.OlmoeConfig(hidden_size=H, intermediate_size=I, num_experts=E)),
        "DeepseekV3Experts": (
            "deepseek_v3",
            transformers.DeepseekV3Config(hidden_size=H, moe_intermediate_size=I, n_routed_experts=E),
        ),
    }
    for cls_name, (family, config) in cfgs.items():
        module = getattr(getattr(transformers.models, family), f"modeling_{family}")
        yield cls_name, getattr(module, cls_name)(config)


def test_every_verified_experts_class_is_recognised():
    names = []
    for cls_name, module in _verified_modules():
        assert vtt_experts._unsupported_reason(module) is None, cls_name
        with torch.no_grad():
            module.gate_up_proj.normal_(0, 0.05)
            module.down_proj.normal_(0, 0.05)
        converted = vtt.convert(module, "dynamic")  # a bare experts module converts to its Fp8Experts
        assert isinstance(converted, vtt.Fp8Experts) and converted.num_experts == E
        names.append(cls_name)
    assert tuple(sorted(names)) == tuple(sorted(vtt_experts.VERIFIED))


# -- layouts left in float -------------------------------------------------------------------------


class _Toy(nn.Module):
    """A layout vtnumba does not know: experts [E, K, N] (transposed), named otherwise."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)
        self.weight = nn.Parameter(torch.randn(4, 64, 32))
        self.table = nn.Parameter(torch.randn(1024, 300))  # 1.2 MiB, 2-D, no Linear's


def test_an_unknown_layout_is_left_in_float_with_a_warning():
    with pytest.warns(UserWarning) as caught:
        model = vtt.convert(_Toy(), "dynamic")
    assert len(caught) == 1  # one warning naming every weight left in float
    text = str(caught[0].message)
    assert "left 2 weight(s) in floating point" in text
    assert (
        "weight [4, 64, 32] float32: _Toy is not a layout vtnumba converts: its parameters are ['table', 'weight'], "
        in text
    )
    assert "table [1024, 300] float32: a _Toy weight, not an nn.Linear" in text
    assert isinstance(model.proj, vtt.Fp8Linear) and model.weight.dtype == torch.float32
    # ignored: the 2-D weight is the caller's choice, a 3-D one is still named
    with pytest.warns(
        UserWarning, match=r"weight \[4, 64, 32\] float32: ignored: it matches convert's ignore=\[''\]"
    ) as caught:
        vtt.convert(_Toy(), "dynamic", ignore=[""])
    assert "table" not in str(caught[0].message)


def test_gpt_oss_experts_are_left_in_float():
    """gpt-oss: [E, H, 2I] with biases, interleaved gate/up and a clamped SwiGLU -- never converted."""
    config = transformers.GptOssConfig(hidden_size=64, intermediate_size=64, num_local_experts=4)
    experts = transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts(config)
    reason = vtt_experts._unsupported_reason(experts)
    assert reason.startswith("it has parameters beside gate_up_proj and down_proj (down_proj_bias, gate_up_proj_bias")
    holder = nn.ModuleDict({"experts": experts})
    with pytest.warns(
        UserWarning,
        match=r"experts.gate_up_proj \[4, 64, 128\] float32: GptOssExperts is not a "
        r"layout vtnumba converts",
    ):
        vtt.convert(holder, "dynamic")
    assert holder["experts"] is experts and experts.gate_up_proj.dtype == torch.float32
    with pytest.raises(
        ValueError, match="module must be a fused experts module .* got a GptOssExperts: it has parameters beside"
    ):
        vtt.Fp8Experts.from_experts(experts)


# -- torch.compile ---------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["per_token", "static"])
def test_compile_fullgraph_equals_eager(scheme):
    model = _model()
    converted = _convert(copy.deepcopy(model), scheme)
    block = converted.model.layers[0].mlp  # router, then the experts' custom op
    x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(5))
    torch._dynamo.reset()
    with torch.no_grad():
        eager = block(x)
        explained = torch._dynamo.explain(block)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(x), eager)
        graph = explained.graphs[0]
    assert "vtnumba.moe_fp8" in str(graph.code)  # the op, not its inside, in the graph


# -- state -----------------------------------------------------------------------------------------


def test_state_dict_round_trip_and_moves():
    a = vtt.convert(_model(seed=0), "per_group")
    b = vtt.convert(_model(seed=1), "per_group")
    sd = a.state_dict()
    name = "model.layers.1.mlp.experts"
    assert sd[f"{name}.gate_up_proj"].dtype == torch.float8_e4m3fn
    assert sd[f"{name}.gate_up_proj_scale"].shape == (E, 3, 2) and sd[f"{name}.down_proj_scale"].shape == (E, 2, 2)
    assert f"{name}.gate_up_proj_input_scale" not in sd  # None buffers are not saved
    with torch.no_grad():
        want = a(PROMPT).logits
        assert not torch.equal(b(PROMPT).logits, want)  # b's states are built, then replaced below
        b.load_state_dict(sd)
        assert torch.equal(b(PROMPT).logits, want)
    layer = b.get_submodule(name)
    layer.half()  # a module-wide dtype change keeps the format's dtypes
    assert layer.gate_up_proj.dtype == torch.float8_e4m3fn and layer.gate_up_proj_scale.dtype == torch.float32
    x, ids, weights = _routing(4)
    with torch.no_grad():
        assert torch.equal(layer(x, ids, weights), a.get_submodule(name)(x, ids, weights))
        # an in-place write to a buffer is seen by the next forward (the state is rebuilt)
        layer.down_proj_scale.mul_(2)
        np.testing.assert_allclose(
            layer(x, ids, weights).numpy(), 2 * a.get_submodule(name)(x, ids, weights).numpy(), rtol=1e-6, atol=1e-7
        )


def test_conversion_report():
    model = vtt.convert(_model(), "dynamic")
    report = vtt.conversion_report(model)
    assert report.converted == {"Fp8Experts": 2, "Fp8Linear": 9}  # 4 attention projections a layer, lm_head
    assert report.left_in_float == ()
    # float buffers count too (the rotary embedding's inv_freq)
    assert set(report.float_bytes) == {"Embedding", "Qwen3MoeTopKRouter", "Qwen3MoeRMSNorm", "Qwen3MoeRotaryEmbedding"}
    assert (
        report.float_bytes["Embedding"] == VOCAB * H * 4 and report.float_bytes["Qwen3MoeTopKRouter"] == 2 * E * H * 4
    )
    attention = (256 + 128 + 128) * H + H * 256  # q, k, v (2 kv heads), o
    codes = 2 * (E * 2 * I * H + E * H * I) + 2 * attention + VOCAB * H  # the experts', the projections', lm_head's
    assert codes < report.fp8_bytes < codes * 1.01
    text = str(report)
    assert "converted: 2 Fp8Experts, 9 Fp8Linear" in text and "Embedding: 0.12 MiB" in text
    toy = vtt.conversion_report(_Toy())
    assert toy.converted == {} and toy.float_bytes == {"_Toy": (4 * 64 * 32 + 1024 * 300) * 4, "Linear": 64 * 65 * 4}
    assert [w.split(":")[0] for w in toy.left_in_float] == ["weight [4, 64, 32] float32", "table [1024, 300] float32"]


# -- checkpoints ----------------------------------------------------------------------------------


def test_convert_reads_experts_from_a_checkpoint(tmp_path):
    """convert(..., checkpoint=path) reads each experts module's FP8 tensors under its name
    (seam.load_fp8_experts: here the per-expert layout of ModelOpt / compressed-tensors FP8), as it reads each Linear's."""
    module = _experts_module()
    prefix = "model.layers.0.mlp.experts"
    tensors = {}
    for e in range(E):
        gate, up = module.gate_up_proj[e].detach().numpy()[:I], module.gate_up_proj[e].detach().numpy()[I:]
        for proj, w in (("gate_proj", gate), ("up_proj", up), ("down_proj", module.down_proj[e].detach().numpy())):
            fw = seam.Fp8Weight.from_float(np.ascontiguousarray(w))
            tensors[f"{prefix}.{e}.{proj}.weight"] = fw.data.view(ml_dtypes.float8_e4m3fn)
            tensors[f"{prefix}.{e}.{proj}.weight_scale"] = fw.weight_scale.reshape(())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = nn.Module()
    model.model = nn.Module()
    model.model.layers = nn.ModuleList([nn.Module()])
    model.model.layers[0].mlp = nn.Module()
    model.model.layers[0].mlp.experts = module
    vtt.convert(model, seam.Fp8Config("fp8", "tensor", "dynamic"), checkpoint=tmp_path)
    layer = model.get_submodule(prefix)
    want = seam.load_fp8_experts(tmp_path, prefix, activation_scheme="dynamic")
    assert isinstance(layer, vtt.Fp8Experts) and layer.activation_scheme == "dynamic"
    for mine, theirs in zip(layer.fp8_experts, want):
        np.testing.assert_array_equal(mine.data, theirs.data)
        np.testing.assert_array_equal(mine.weight_scale, theirs.weight_scale)
    x, ids, weights = _routing(5)
    with torch.no_grad():
        assert torch.equal(layer(x, ids, weights), seam.moe_fp8(x, *want, ids, weights))
