"""vtnumba.torch on the CPU: Fp8Linear is seam.matmul_fp8 on the tensor (bitwise), built from an
nn.Linear, a seam weight or a checkpoint; convert swaps the Linears a config selects and skips the
ignored ones; calibrate gives static scales; inference only."""

import copy

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from vtnumba import seam

torch = pytest.importorskip("torch")
vtt = pytest.importorskip("vtnumba.torch")
nn = torch.nn

RNG = np.random.default_rng(1515)


class Block(nn.Module):
    """A small model with nested names, as HF models have (model.layers.0.mlp.up_proj, lm_head)."""

    def __init__(self, k=64, hidden=96, vocab=40):
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.ModuleDict({"up_proj": nn.Linear(k, hidden), "down_proj": nn.Linear(hidden, k)}) for _ in range(2)]
        )
        self.norm = nn.LayerNorm(k)
        self.lm_head = nn.Linear(k, vocab, bias=False)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer["down_proj"](torch.relu(layer["up_proj"](x)))
        return self.lm_head(self.norm(x))


def _model():
    torch.manual_seed(0)
    return Block().eval()


def _x(*shape):
    return torch.from_numpy(RNG.standard_normal(shape).astype(np.float32))


def _linear_names(model, kind):
    return sorted(name for name, m in model.named_modules() if isinstance(m, kind))


@pytest.mark.parametrize("scheme", ["dynamic", "per_token", "static"])
def test_fp8_linear_is_the_seam_bitwise(scheme):
    torch.manual_seed(1)
    linear = nn.Linear(64, 48)
    layer = vtt.Fp8Linear.from_linear(linear, scheme, input_scale=0.02 if scheme == "static" else None)
    w = layer.fp8_weight  # the seam's view of the layer's buffers
    assert isinstance(w, seam.Fp8Weight) and w.activation_scheme == scheme
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight.shape == (48, 64)
    assert set(dict(layer.named_buffers())) == {"weight", "weight_scale", "bias"} | (
        {"input_scale"} if scheme == "static" else set()
    )
    assert w.per_channel == (scheme == "per_token") and w.bias is not None
    ref = seam.Fp8Weight.from_float(
        linear.weight.detach().numpy(),
        input_scale=0.02 if scheme == "static" else None,
        per_channel=scheme == "per_token",
        activation_scheme=scheme,
        bias=linear.bias.detach().numpy(),
    )
    np.testing.assert_array_equal(w.data, ref.data)
    x = _x(2, 5, 64)
    with torch.no_grad():
        y = layer(x)
        want = seam.matmul_fp8(x.numpy(), ref)
        assert isinstance(y, torch.Tensor) and y.shape == (2, 5, 48) and y.dtype == torch.float32
        np.testing.assert_array_equal(y.numpy(), want)
        # FP8, not the float layer: close to it, not equal
        err = (y - linear(x)).abs().max().item()
        assert 0 < err < 0.1 * linear(x).abs().max().item()
        yb = layer(x.to(torch.bfloat16))
    assert yb.dtype == torch.bfloat16  # the output follows the input's dtype
    assert "activation_scheme=" in repr(layer) and "in_features=64, out_features=48" in repr(layer)


def test_fp8_linear_from_a_seam_weight_and_a_checkpoint(tmp_path):
    w = (RNG.standard_normal((32, 64)) * 0.05).astype(np.float32)
    fw = seam.Fp8Weight.from_float(w, input_scale=0.03)
    prefix = "model.layers.0.mlp.up_proj"
    save_file(
        {
            f"{prefix}.weight": fw.data.view(ml_dtypes.float8_e4m3fn),
            f"{prefix}.weight_scale": fw.weight_scale.reshape(()),
            f"{prefix}.input_scale": np.array(0.03, np.float32),
        },
        str(tmp_path / "model.safetensors"),
    )
    x = _x(3, 64)
    want = seam.matmul_fp8(x.numpy(), fw)
    with torch.inference_mode():
        for layer in (
            vtt.Fp8Linear(fw),
            vtt.Fp8Linear(seam.ResidentFp8(fw, "cpu")),
            vtt.Fp8Linear.from_checkpoint(tmp_path, prefix),
        ):
            assert layer.activation_scheme == "static" and (layer.in_features, layer.out_features) == (64, 32)
            np.testing.assert_array_equal(layer(x).numpy(), want)
    with pytest.raises(TypeError, match="weight must be a seam Fp8Weight or ResidentFp8, got Tensor"):
        vtt.Fp8Linear(torch.from_numpy(w))


def test_convert_swaps_the_selected_linears_and_skips_ignored():
    model = _model()
    x = _x(4, 64)
    with torch.no_grad():
        ref = model(x)
    converted = vtt.convert(copy.deepcopy(model), "per_token", ignore=["lm_head"])
    assert _linear_names(converted, vtt.Fp8Linear) == [
        "layers.0.down_proj",
        "layers.0.up_proj",
        "layers.1.down_proj",
        "layers.1.up_proj",
    ]
    assert type(converted.lm_head) is nn.Linear  # ignored: left as it was
    with torch.inference_mode():
        y = converted(x)
    cos = torch.nn.functional.cosine_similarity(y, ref, dim=-1)
    assert y.shape == ref.shape and cos.min() > 0.99 and (y - ref).abs().max() > 0

    # an Fp8Config: its scheme, its weight granularity, its ignore patterns (ModelOpt's globs here)
    config = seam.Fp8Config("modelopt", "tensor", "dynamic", ("*lm_head*", "layers.1.*"))
    converted = vtt.convert(copy.deepcopy(model), config)
    assert _linear_names(converted, vtt.Fp8Linear) == ["layers.0.down_proj", "layers.0.up_proj"]
    assert not converted.layers[0]["up_proj"].fp8_weight.per_channel
    config = seam.Fp8Config("compressed-tensors", "channel", "per_token", ("re:.*down_proj",))
    converted = vtt.convert(copy.deepcopy(model), config)
    assert _linear_names(converted, vtt.Fp8Linear) == ["layers.0.up_proj", "layers.1.up_proj", "lm_head"]
    assert converted.lm_head.fp8_weight.per_channel and converted.lm_head.bias is None

    # a bare Linear converts to its Fp8Linear
    assert isinstance(vtt.convert(nn.Linear(8, 4)), vtt.Fp8Linear)


def test_static_scales_from_calibrate():
    model = _model()
    samples = [_x(3, 64) for _ in range(4)]
    scales = vtt.calibrate(model, lambda: [model(s) for s in samples])
    assert sorted(scales) == _linear_names(model, nn.Linear)
    amax = max(float(s.abs().max()) for s in samples)  # the first layers see the samples themselves
    assert scales["layers.0.up_proj"] == np.float32(amax / 448)
    assert all(np.isfinite(s) and s > 0 for s in scales.values())
    converted = vtt.convert(copy.deepcopy(model), "static", input_scales=scales)
    layer = converted.layers[0]["up_proj"]
    assert layer.activation_scheme == "static" and layer.fp8_weight.input_scale == scales["layers.0.up_proj"]
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(converted(samples[0]), model(samples[0]), dim=-1)
    assert cos.min() > 0.99


def test_convert_from_a_checkpoint(tmp_path):
    model = _model()
    tensors = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and name != "lm_head":
            fw = seam.Fp8Weight.from_float(m.weight.detach().numpy())
            tensors[f"{name}.weight"] = fw.data.view(ml_dtypes.float8_e4m3fn)
            tensors[f"{name}.weight_scale"] = fw.weight_scale.reshape(())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    converted = vtt.convert(
        copy.deepcopy(model), seam.Fp8Config("fp8", "tensor", "dynamic", ("lm_head",)), checkpoint=tmp_path
    )
    layer = converted.layers[1]["down_proj"]
    np.testing.assert_array_equal(layer.fp8_weight.data, tensors["layers.1.down_proj.weight"].view(np.uint8))
    assert layer.bias is None and layer.fp8_weight.source["files"] == ["model.safetensors"]


def test_bad_input_is_named():
    model = _model()
    with pytest.raises(ValueError, match="input_scales must give a scale for layer 'layers.0.up_proj'.*calibrate"):
        vtt.convert(copy.deepcopy(model), "static")
    with pytest.raises(ValueError, match="input_scale must be given for scheme 'static'"):
        vtt.Fp8Linear.from_linear(nn.Linear(8, 4), "static")
    with pytest.raises(ValueError, match="config must be one of static, dynamic, per_token, per_group, got 'fp4'"):
        vtt.convert(model, "fp4")
    with pytest.raises(TypeError, match="config must be a seam.Fp8Config or a scheme"):
        vtt.convert(model, 8)
    with pytest.raises(ValueError, match="weight_block_size must be given exactly when weight_strategy is 'block'"):
        vtt.convert(copy.deepcopy(model), seam.Fp8Config("fp8", "tensor", "dynamic", (), (128, 128)))
    with pytest.raises(TypeError, match="linear must be a torch.nn.Linear, got Conv1d"):
        vtt.Fp8Linear.from_linear(nn.Conv1d(2, 2, 1))
    layer = vtt.Fp8Linear.from_linear(nn.Linear(16, 8))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got ndarray"):
        layer(np.ones((2, 16), np.float32))


def test_block_scaled_conversion_follows_the_config():
    model = _model()
    converted = vtt.convert(copy.deepcopy(model), seam.Fp8Config("fp8", "block", "per_group", (), (32, 32)))
    layers = [m for m in converted.modules() if isinstance(m, vtt.Fp8Linear)]
    assert layers and all(m.block_size == (32, 32) and m.activation_scheme == "per_group" for m in layers)
    by_name = vtt.convert(copy.deepcopy(model), "per_group")
    assert {m.block_size for m in by_name.modules() if isinstance(m, vtt.Fp8Linear)} == {(128, 128)}
    first = next(m for m in model.modules() if isinstance(m, nn.Linear))
    x = _x(4, first.in_features)
    with torch.inference_mode():
        ref, got = first(x), vtt.Fp8Linear.from_linear(first, "per_group", block_size=(32, 32))(x)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert float((got - ref).norm() / ref.norm()) < 0.1


def test_training_is_refused_clearly():
    """Inference only: a forward whose input requires grad, under grad mode, raises instead of
    returning a result whose gradient would silently be missing."""
    model = vtt.convert(_model(), "dynamic", ignore=["lm_head"])
    x = _x(2, 64).requires_grad_(True)
    with pytest.raises(ValueError, match=r"x \(the input of a vtnumba Fp8Linear\) must not require grad"):
        model(x)
    with torch.no_grad():
        assert model(x).shape == (2, 40)


def test_buffers_follow_the_module_but_keep_their_format():
    """model.to(dtype) / .half() move an Fp8Linear's buffers without casting the FP8 weight or its
    float32 scales (the bias follows the module, as nn.Linear's does); state_dict round-trips."""
    model = vtt.convert(_model(), "static", input_scales={n: 0.02 for n in _linear_names(_model(), nn.Linear)})
    layer = model.layers[0]["up_proj"]
    x = _x(3, 64)
    with torch.inference_mode():
        want = layer(x)
    state = copy.deepcopy(model.state_dict())
    assert state["layers.0.up_proj.weight"].dtype == torch.float8_e4m3fn
    assert state["layers.0.up_proj.input_scale"].dtype == torch.float32
    model.to(torch.bfloat16)
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale.dtype == torch.float32
    assert layer.input_scale.dtype == torch.float32 and layer.bias.dtype == torch.bfloat16
    assert list(dict(layer.named_buffers())) == ["weight", "weight_scale", "input_scale", "bias"]
    # a fresh model of the same shape takes the saved buffers and gives the same bytes
    fresh = vtt.convert(_model(), "static", input_scales={n: 0.5 for n in _linear_names(_model(), nn.Linear)})
    with torch.inference_mode():
        before = fresh.layers[0]["up_proj"](x)
        fresh.load_state_dict(state)
        after = fresh.layers[0]["up_proj"](x)
    assert not torch.equal(before, want)
    np.testing.assert_array_equal(after.numpy(), want.numpy())


def test_block_layer_says_it_is_block_scaled():
    layer = vtt.Fp8Linear.from_linear(nn.Linear(64, 32), "per_group", block_size=(16, 32))
    assert "weight_scale=block (16, 32)" in repr(layer) and "activation_scheme='per_group'" in repr(layer)
    assert tuple(layer.weight_scale.shape) == (2, 2)


def test_custom_op_fake_gives_shapes_and_dtypes():
    """torch.ops.vtnumba.fp8_linear's fake implementation (what torch.compile traces with): the
    output shape [..., N] and dtype (x's, or the layer's out_dtype), on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = vtt.Fp8Linear.from_linear(nn.Linear(64, 48), "per_token", out_dtype=torch.bfloat16)
    plain = vtt.Fp8Linear.from_linear(nn.Linear(64, 48), "dynamic")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x = mode.from_tensor(_x(2, 5, 64))
        for module, dtype in ((layer, torch.bfloat16), (plain, torch.float32)):
            y = torch.ops.vtnumba.fp8_linear(
                x,
                module.weight,
                module.weight_scale,
                module.input_scale,
                module.bias,
                module.activation_scheme.value,
                None,
                False,
                "" if module.out_dtype is None else "bfloat16",
            )
            assert tuple(y.shape) == (2, 5, 48) and y.dtype == dtype


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token", "per_group"])
def test_compiled_model_equals_eager_with_no_graph_break(scheme):
    """torch.compile(fullgraph=True) traces a converted model (the layers are one custom op each)
    and runs it to the eager bytes, on the CPU."""
    torch._dynamo.reset()
    model = _model()
    scales = {n: 0.03 for n in _linear_names(model, nn.Linear)} if scheme == "static" else None
    converted = vtt.convert(model, scheme, input_scales=scales, ignore=["lm_head"])
    x = _x(4, 64)
    with torch.inference_mode():
        eager = converted(x)
        explained = torch._dynamo.explain(converted)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        compiled = torch.compile(converted, fullgraph=True, backend="aot_eager")
        got = compiled(x)
    np.testing.assert_array_equal(got.numpy(), eager.numpy())
    assert np.count_nonzero(eager.numpy()) > 0


def test_inductor_compiles_a_converted_model():
    """The default backend (inductor) around the custom ops, on the CPU: the eager bytes (a model
    whose other ops are exact, so that inductor's fusions cannot move a rounding)."""
    torch._dynamo.reset()
    torch.manual_seed(2)
    converted = vtt.convert(nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 32)), "per_token")
    x = _x(4, 64)
    with torch.inference_mode():
        eager = converted(x)
        got = torch.compile(converted, fullgraph=True)(x)
    np.testing.assert_array_equal(got.numpy(), eager.numpy())
