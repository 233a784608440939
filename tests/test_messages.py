"""Messages that name the right argument (issue 41, items 4 and 5), each shaped "<name> must be
<expected>, got <actual>" with the fix: non-finite weights at quantization (one rule for
``Fp8Weight.from_float``, ``Fp8Experts.from_float``, the torch layers and ``convert``, with the
``allow_nonfinite=True`` opt-in), non-finite routing weights, a swapped gate_up / down pair, a 3-D
x, Python-list routing, grad mode inside a model, ``convert``'s ``ignore=`` warning and a second
conversion to another scheme. Shapes are tiny: what is tested is the words."""

import copy
import re
import warnings

import ml_dtypes
import numpy as np
import pytest

from vtnumba import seam

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
vtt = pytest.importorskip("vtnumba.torch")
nn = torch.nn

F32 = np.float32
MX = seam.Fp8Config("mxfp8", "block", "per_group", (), (1, 32), activation_scale_format="e8m0")


def _w(*shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.1).astype(F32)


def _tiny_qwen3_moe(layers=1):
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    return transformers.Qwen3MoeForCausalLM(config).eval()


# -- non-finite weights at quantization --------------------------------------------------------------

_FIX = "fix the weight, or pass allow_nonfinite=True"


@pytest.mark.parametrize(
    "kw", [{}, dict(per_channel=True), dict(block_size=(16, 32)), dict(block_size=(1, 32), scale_format="e8m0")]
)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_from_float_refuses_a_nonfinite_weight_naming_its_index(kw, bad):
    w = _w(32, 64)
    w[5, 17] = bad
    w[9, 3] = np.nan  # a later one: the first is named
    with pytest.raises(ValueError, match=rf"w must be finite to quantize to FP8, got {bad} at index \[5, 17\].*{_FIX}"):
        seam.Fp8Weight.from_float(w, **kw)
    q = seam.Fp8Weight.from_float(w, allow_nonfinite=True, **kw)  # the opt-in: quantized as it is
    if np.isnan(bad):
        assert q.data[5, 17] == 0x7F  # e4m3's NaN code
    else:
        assert np.isfinite(q.dequantize(F32)[5, 17])  # saturated


def test_from_float_checks_bfloat16_and_refuses_a_bad_opt_in():
    w = _w(16, 32).astype(ml_dtypes.bfloat16)
    w[0, 31] = np.inf
    with pytest.raises(ValueError, match=r"w must be finite .*got inf at index \[0, 31\]"):
        seam.Fp8Weight.from_float(w)
    with pytest.raises(TypeError, match="allow_nonfinite must be True or False, got 'yes'"):
        seam.Fp8Weight.from_float(w, allow_nonfinite="yes")


def test_experts_from_float_names_the_expert_index():
    w = _w(3, 32, 64)
    w[2, 7, 1] = np.nan
    with pytest.raises(ValueError, match=rf"w must be finite to quantize to FP8, got nan at index \[2, 7, 1\].*{_FIX}"):
        seam.Fp8Experts.from_float(w, per_channel=True, activation_scheme="per_token")
    ex = seam.Fp8Experts.from_float(w, per_channel=True, activation_scheme="per_token", allow_nonfinite=True)
    assert ex.data[2, 7, 1] == 0x7F


def test_torch_layers_and_convert_refuse_nonfinite_weights_by_their_names():
    linear = nn.Linear(64, 32)
    with torch.no_grad():
        linear.weight[3, 4] = float("nan")
    with pytest.raises(ValueError, match=r"linear.weight must be finite .*got nan at index \[3, 4\]"):
        vtt.Fp8Linear.from_linear(linear, "per_group", block_size=(16, 32))
    assert vtt.Fp8Linear.from_linear(linear, "dynamic", allow_nonfinite=True).weight.view(torch.uint8)[3, 4] == 0x7F
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), copy.deepcopy(linear))
    with pytest.raises(
        ValueError, match=rf"2.weight must be finite to quantize to FP8, got nan at index \[3, 4\].*{_FIX}"
    ):
        vtt.convert(model, "per_token")
    assert isinstance(model[0], nn.Linear)  # refused before anything was converted
    assert isinstance(vtt.convert(model, "per_token", allow_nonfinite=True)[2], vtt.Fp8Linear)

    moe = _tiny_qwen3_moe()
    experts = moe.model.layers[0].mlp.experts
    with torch.no_grad():
        experts.down_proj[1, 2, 3] = float("inf")
    with pytest.raises(ValueError, match=r"module.down_proj must be finite .*got inf at index \[1, 2, 3\]"):
        vtt.Fp8Experts.from_experts(experts, "per_token")
    with pytest.raises(
        ValueError, match=r"model.layers.0.mlp.experts.down_proj must be finite .*got inf at index \[1, 2, 3\]"
    ):
        vtt.convert(moe, MX)
    assert not isinstance(moe.model.layers[0].mlp.experts, vtt.Fp8Experts)


# -- moe_fp8's arguments ---------------------------------------------------------------------------


E, H, I_DIM = 4, 64, 32


@pytest.fixture(scope="module")
def pair():
    gate_up = seam.Fp8Experts.from_float(_w(E, 2 * I_DIM, H), per_channel=True, activation_scheme="per_token")
    down = seam.Fp8Experts.from_float(_w(E, H, I_DIM, seed=1), per_channel=True, activation_scheme="per_token")
    return gate_up, down


def _routing(t=3):
    ids = np.array([[0, 1], [2, 3], [1, 2]][:t], dtype=np.int64)
    return ids, np.full(ids.shape, 0.5, F32)


def test_a_swapped_pair_is_named_not_x(pair):
    gate_up, down = pair
    x = _w(3, H)
    with pytest.raises(ValueError, match=r"gate_up must be \[E, 2I, H\] and down \[E, H, I\], got .*they are swapped"):
        seam.moe_fp8(x, down, gate_up, *_routing())
    assert seam.moe_fp8(x, gate_up, down, *_routing()).shape == (3, H)


def test_a_3d_x_is_told_its_layout_and_the_reshape(pair):
    x = _w(1, 3, H)
    with pytest.raises(ValueError, match=re.escape("x must be 2-D [T, H], got shape (1, 3, 64); flatten")):
        seam.moe_fp8(x, *pair, *_routing())


def test_list_routing_is_refused_with_the_fix(pair):
    ids, weights = _routing()
    with pytest.raises(TypeError, match=r"topk_ids must be an array \[T, k\] .*got list; pass np.asarray\(topk_ids\)"):
        seam.moe_fp8(_w(3, H), *pair, ids.tolist(), weights)
    with pytest.raises(TypeError, match=r"topk_weights must be an array \[T, k\] .*got list"):
        seam.moe_fp8(_w(3, H), *pair, ids, weights.tolist())


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_routing_weights_are_refused_on_the_cpu(pair, bad):
    ids, weights = _routing()
    weights[2, 1] = bad
    with pytest.raises(ValueError, match=rf"topk_weights must be finite, got {bad} at \(2, 1\) \(1 such weights\)"):
        seam.moe_fp8(_w(3, H), *pair, ids, weights)


# -- torch: grad mode, convert's words ---------------------------------------------------------------


def test_grad_mode_names_the_layer_input_and_the_model_call():
    model = vtt.convert(_tiny_qwen3_moe(), "per_token")
    prompt = torch.arange(4).reshape(1, 4)
    # the user passes token ids; the hidden state reaching the experts requires grad because the
    # float embedding's weight does: the message says so and gives the fix for the model call
    with pytest.raises(
        ValueError,
        match=r"(x|hidden_states) \(the input of a vtnumba Fp8(Linear|Experts)\) must not require grad, got a "
        r"tensor with requires_grad=True.*call the model under torch.no_grad\(\)",
    ):
        model(prompt)
    experts = model.model.layers[0].mlp.experts
    h = torch.randn(2, H, requires_grad=True)
    ids = torch.tensor([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match=r"hidden_states \(the input of a vtnumba Fp8Experts\) must not require grad"):
        experts(h, ids, torch.full((2, 2), 0.5))


def test_the_ignore_warning_says_which_rule_ignored_a_layer():
    moe = _tiny_qwen3_moe()
    with pytest.warns(UserWarning) as caught:
        vtt.convert(moe, "per_token", ignore=["re:.*experts"])
    text = "\n".join(str(w.message) for w in caught)
    assert "model.layers.0.mlp.experts.gate_up_proj" in text
    assert "ignored: it matches convert's ignore=['re:.*experts']" in text
    config = seam.Fp8Config("fp8", "channel", "per_token", ("re:.*experts",))
    with pytest.warns(UserWarning) as caught:
        vtt.convert(_tiny_qwen3_moe(), config)
    assert "ignored: it matches the config's ignore list" in "\n".join(str(w.message) for w in caught)


def test_convert_docstring_names_a_config_not_the_boolean_property():
    doc = vtt.convert.__doc__
    assert "(``Fp8Config.mxfp8``:" not in doc
    expr = re.search(r"``(Fp8Config\(\"mxfp8\".*?\))``", doc.replace("\n", " "))
    config = eval(re.sub(r"\s+", " ", expr.group(1)), {"Fp8Config": seam.Fp8Config})
    assert config.mxfp8 is True and config == MX


def test_converting_again_to_another_scheme_is_refused_and_the_same_scheme_is_kept():
    model = vtt.convert(_tiny_qwen3_moe(), "per_token")
    layer = model.model.layers[0].self_attn.q_proj
    with pytest.raises(
        ValueError,
        match=r"model must hold float layers to convert to 'per_group', got 'model.layers.0.self_attn.q_proj' "
        r"already converted \(Fp8Linear, activation_scheme='per_token'\).*load the float model again",
    ):
        vtt.convert(model, "per_group")
    with pytest.raises(ValueError, match=r"already converted \(Fp8Experts, activation_scheme='per_token'\)"):
        vtt.convert(model, MX, ignore=["re:.*_proj$", "lm_head"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nothing left to convert: convert warns of nothing new
        again = vtt.convert(model, "per_token")
    assert again.model.layers[0].self_attn.q_proj is layer  # the same scheme: kept as it is
