"""seam.Fp8Config.from_hf on the quantization configs of real FP8 checkpoints.

The fragments below are written by hand in the exact shape the producers emit:
- ModelOpt hf_quant_config.json (NVIDIA TensorRT-Model-Optimizer, docs/source/deployment/3_unified_hf.rst;
  read by vllm/model_executor/layers/quantization/modelopt.py, ModelOptQuantConfigBase.from_config), and
  the newer config.json form {"quant_method": "modelopt", "quant_algo": ..., "ignore": [...]};
- compressed-tensors config.json (llm-compressor's FP8 / FP8_DYNAMIC presets, as in the
  RedHatAI/neuralmagic "-FP8" and "-FP8-dynamic" model cards; read by vLLM's compressed_tensors.py);
- vLLM "fp8" (AutoFP8 checkpoints, and DeepSeek-V3's config.json with weight_block_size; read by
  vllm/model_executor/layers/quantization/fp8.py, Fp8Config.from_config);
- the block-scaled formats: DeepSeek-V3 / V3.1 (``scale_fmt`` "ue8m0") and Qwen3-*-FP8
  config.json, transformers' FineGrainedFP8Config as ``to_dict`` writes it
  (src/transformers/utils/quantization_config.py), and compressed-tensors' FP8_BLOCK preset
  (compressed_tensors/quantization/quant_scheme.py: weights strategy "block", block_structure
  [128, 128]; input activations dynamic strategy "group", group_size 128) as llm-compressor saves it.
"""

import json

import numpy as np
import pytest

from vtnumba import seam

MODELOPT_HF_QUANT_CONFIG = {
    "producer": {"name": "modelopt", "version": "0.19.0"},
    "quantization": {
        "quant_algo": "FP8",
        "kv_cache_quant_algo": "FP8",
        "exclude_modules": ["lm_head", "model.layers.0.mlp*"],
    },
}

MODELOPT_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "quantization_config": {
        "quant_method": "modelopt",
        "quant_algo": "fp8_per_channel_per_token",  # ModelOpt may emit lowercase; vLLM upper-cases it
        "ignore": ["lm_head", "*.mlp.gate"],
        "kv_cache_scheme": None,
    },
}

COMPRESSED_TENSORS_FP8_DYNAMIC = {
    "architectures": ["LlamaForCausalLM"],
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "config_groups": {
            "group_0": {
                "input_activations": {
                    "actorder": None,
                    "block_structure": None,
                    "dynamic": True,
                    "group_size": None,
                    "num_bits": 8,
                    "observer": None,
                    "observer_kwargs": {},
                    "strategy": "token",
                    "symmetric": True,
                    "type": "float",
                },
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {
                    "actorder": None,
                    "block_structure": None,
                    "dynamic": False,
                    "group_size": None,
                    "num_bits": 8,
                    "observer": "minmax",
                    "observer_kwargs": {},
                    "strategy": "channel",
                    "symmetric": True,
                    "type": "float",
                },
            }
        },
        "format": "float-quantized",
        "global_compression_ratio": 1.2405352996226195,
        "ignore": ["lm_head", "re:.*mlp\\.gate$"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    },
}


def _compressed_tensors_static():
    cfg = json.loads(json.dumps(COMPRESSED_TENSORS_FP8_DYNAMIC))
    group = cfg["quantization_config"]["config_groups"]["group_0"]
    group["weights"]["strategy"] = "tensor"
    group["input_activations"].update(strategy="tensor", dynamic=False, observer="minmax")
    return cfg


AUTOFP8_STATIC = {
    "architectures": ["MistralForCausalLM"],
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]},
}

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}

DEEPSEEK_V3_1 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    },
}

QWEN3_FP8 = {
    "architectures": ["Qwen3ForCausalLM"],
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "activation_scheme": "dynamic",
        "modules_to_not_convert": None,
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}

QWEN3_MOE_FP8 = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"],
    },
}

TRANSFORMERS_FINE_GRAINED_FP8 = {  # FineGrainedFP8Config(weight_block_size=(64, 128), ...).to_dict()
    "quantization_config": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [64, 128],
        "modules_to_not_convert": ["lm_head"],
        "dequantize": False,
        "scale_fmt": "float",
    },
}

COMPRESSED_TENSORS_FP8_BLOCK = {
    "architectures": ["Qwen3ForCausalLM"],
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "config_groups": {
            "group_0": {
                "format": "float-quantized",
                "input_activations": {
                    "actorder": None,
                    "block_structure": None,
                    "dynamic": True,
                    "group_size": 128,
                    "num_bits": 8,
                    "observer": None,
                    "observer_kwargs": {},
                    "strategy": "group",
                    "symmetric": True,
                    "type": "float",
                },
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {
                    "actorder": None,
                    "block_structure": [128, 128],
                    "dynamic": False,
                    "group_size": None,
                    "num_bits": 8,
                    "observer": "minmax",
                    "observer_kwargs": {},
                    "strategy": "block",
                    "symmetric": True,
                    "type": "float",
                },
            }
        },
        "format": "float-quantized",
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
    },
}


def _fp8_weight(scheme, n=4, k=8):
    return seam.Fp8Weight(
        np.zeros((n, k), np.uint8), 1.0, input_scale=0.5 if scheme == "static" else None, activation_scheme=scheme
    )


def test_modelopt_hf_quant_config_fp8():
    cfg = seam.Fp8Config.from_hf(MODELOPT_HF_QUANT_CONFIG)
    assert (cfg.quant_method, cfg.weight_strategy, cfg.activation_scheme) == ("modelopt", "tensor", "static")
    assert cfg.ignore == ("lm_head", "model.layers.0.mlp*") and cfg.weight_block_size is None
    assert cfg.ignored_by("lm_head") == "lm_head"  # exact name
    assert cfg.ignored_by("model.layers.0.mlp.down_proj") == "model.layers.0.mlp*"  # ModelOpt wildcard
    assert cfg.ignored_by("model.layers.1.mlp.down_proj") is None
    assert cfg.ignored_by("model.layers.10.mlp.down_proj") is None
    m = cfg.linear_method("model.layers.1.mlp.down_proj", _fp8_weight("static"))
    assert type(m) is seam.Fp8W8A8LinearMethod
    u = cfg.linear_method("lm_head", np.ones((4, 8), np.float32))
    assert type(u) is seam.UnquantizedLinearMethod


def test_modelopt_config_json_per_channel_per_token():
    cfg = seam.Fp8Config.from_hf(MODELOPT_CONFIG_JSON)
    assert (cfg.weight_strategy, cfg.activation_scheme) == ("channel", "per_token")
    assert cfg.is_ignored("model.layers.3.mlp.gate") and not cfg.is_ignored("model.layers.3.mlp.gate_proj")
    with pytest.raises(ValueError, match="must have activation_scheme 'per_token' like the config, got 'dynamic'"):
        cfg.linear_method("model.layers.3.mlp.up_proj", _fp8_weight("dynamic"))


def test_compressed_tensors_fp8_dynamic_channel_token():
    cfg = seam.Fp8Config.from_hf(COMPRESSED_TENSORS_FP8_DYNAMIC)
    assert (cfg.quant_method, cfg.weight_strategy, cfg.activation_scheme) == (
        "compressed-tensors",
        "channel",
        "per_token",
    )
    assert cfg.ignored_by("model.layers.7.mlp.gate") == "re:.*mlp\\.gate$"  # compressed-tensors regex
    assert not cfg.is_ignored("model.layers.7.mlp.gate_proj")
    assert not cfg.is_ignored("lm_head_extra")  # exact names are not prefixes


def test_compressed_tensors_static_tensor():
    cfg = seam.Fp8Config.from_hf(_compressed_tensors_static())
    assert (cfg.weight_strategy, cfg.activation_scheme) == ("tensor", "static")


def test_vllm_fp8_static_and_dynamic():
    cfg = seam.Fp8Config.from_hf(AUTOFP8_STATIC)
    assert (cfg.quant_method, cfg.weight_strategy, cfg.activation_scheme) == ("fp8", "tensor", "static")
    assert cfg.is_ignored("lm_head")
    dyn = seam.Fp8Config.from_hf({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}})
    assert dyn.activation_scheme == "dynamic" and dyn.ignore == ()


@pytest.mark.parametrize(
    "config, block, ignore, ue8m0",
    [
        (DEEPSEEK_V3, (128, 128), (), False),
        (DEEPSEEK_V3_1, (128, 128), (), True),
        (QWEN3_FP8, (128, 128), (), False),
        (QWEN3_MOE_FP8, (128, 128), ("lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"), False),
        (TRANSFORMERS_FINE_GRAINED_FP8, (64, 128), ("lm_head",), False),
        (COMPRESSED_TENSORS_FP8_BLOCK, (128, 128), ("lm_head",), False),
    ],
    ids=["deepseek-v3", "deepseek-v3.1", "qwen3", "qwen3-moe", "transformers", "compressed-tensors"],
)
def test_block_scaled_formats_parse(config, block, ignore, ue8m0):
    """Every block-scaled format: block weights and dynamic per-token-group activations
    whose group size is the block's bk (vLLM's "dynamic" with weight_block_size means exactly that)."""
    cfg = seam.Fp8Config.from_hf(config)
    assert (cfg.weight_strategy, cfg.activation_scheme) == ("block", "per_group")
    assert cfg.weight_block_size == block and cfg.activation_group_size == block[1]
    assert cfg.ignore == ignore and cfg.activation_scale_ue8m0 is ue8m0
    assert cfg.quant_method == ("compressed-tensors" if config is COMPRESSED_TENSORS_FP8_BLOCK else "fp8")
    if ignore:
        assert type(cfg.linear_method(ignore[-1], np.ones((2, 2), np.float32))) is seam.UnquantizedLinearMethod
        assert not cfg.is_ignored("model.layers.2.mlp.gate")


def test_vllm_fp8_reads_modules_to_not_convert_when_ignored_layers_is_empty():
    section = {"quant_method": "fp8", "activation_scheme": "dynamic", "modules_to_not_convert": ["lm_head"]}
    assert seam.Fp8Config.from_hf(section).ignore == ("lm_head",)
    section["ignored_layers"] = ["model.embed_tokens"]
    assert seam.Fp8Config.from_hf(section).ignore == ("model.embed_tokens",)  # vLLM's order
    assert seam.Fp8Config.from_hf({**section, "activation_scheme": "Dynamic"}).activation_scheme == "dynamic"


def test_block_scaled_config_takes_block_weights_and_refuses_the_others_naming_the_layer():
    cfg = seam.Fp8Config.from_hf(DEEPSEEK_V3)
    assert cfg.weight_block_size == (128, 128)
    rng = np.random.default_rng(3)
    block_weight = seam.Fp8Weight.from_float(rng.standard_normal((256, 384)).astype(np.float32), block_size=(128, 128))
    method = cfg.linear_method("model.layers.3.mlp.down_proj", block_weight)
    assert method.name == "fp8_w8a8" and method.apply(rng.standard_normal((2, 384)).astype(np.float32)).shape == (
        2,
        256,
    )
    # a per-tensor weight under a block-scaled config, or a block weight of another block size
    with pytest.raises(
        ValueError,
        match=r"weight of layer 'model.layers.3.mlp.down_proj' must have activation_scheme "
        r"'per_group'",
    ):
        cfg.linear_method("model.layers.3.mlp.down_proj", _fp8_weight("dynamic"))
    other = seam.Fp8Weight.from_float(rng.standard_normal((256, 384)).astype(np.float32), block_size=(128, 64))
    with pytest.raises(ValueError, match=r"layer 'model.layers.3.mlp.down_proj' must have block_size \(128, 128\)"):
        cfg.linear_method("model.layers.3.mlp.down_proj", other)
    # compressed-tensors' block strategy is recognized the same way
    ct = json.loads(json.dumps(COMPRESSED_TENSORS_FP8_DYNAMIC))
    ct["quantization_config"]["config_groups"]["group_0"]["weights"].update(
        strategy="block", block_structure=[128, 128]
    )
    ct["quantization_config"]["config_groups"]["group_0"]["input_activations"].update(strategy="token")
    cfg = seam.Fp8Config.from_hf(ct)
    # dynamic per-token activations beside block weights are quantized per group of bk, as vLLM does
    assert (cfg.weight_block_size, cfg.activation_scheme, cfg.activation_group_size) == ((128, 128), "per_group", 128)
    with pytest.raises(
        ValueError, match="weight of layer 'model.layers.0.self_attn.o_proj' must have activation_scheme"
    ):
        cfg.linear_method("model.layers.0.self_attn.o_proj", _fp8_weight("per_token"))
    # an ignored layer of a block-scaled checkpoint still gets its unquantized method
    ct["quantization_config"]["ignore"] = ["lm_head"]
    assert (
        type(seam.Fp8Config.from_hf(ct).linear_method("lm_head", np.ones((2, 2), np.float32)))
        is seam.UnquantizedLinearMethod
    )


def test_from_hf_reads_paths(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(AUTOFP8_STATIC))
    assert seam.Fp8Config.from_hf(tmp_path).activation_scheme == "static"
    assert seam.Fp8Config.from_hf(str(tmp_path / "config.json")).quant_method == "fp8"
    modelopt_dir = tmp_path / "modelopt"
    modelopt_dir.mkdir()
    (modelopt_dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (modelopt_dir / "hf_quant_config.json").write_text(json.dumps(MODELOPT_HF_QUANT_CONFIG))
    assert seam.Fp8Config.from_hf(modelopt_dir).quant_method == "modelopt"


@pytest.mark.parametrize(
    "config, words",
    [
        (
            {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}},
            "quant_algo must be one of FP8, FP8_PER_CHANNEL_PER_TOKEN, MXFP8, got 'NVFP4'",
        ),
        (
            {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "W4A8_AWQ"}},
            "quant_algo must be one of FP8, FP8_PER_CHANNEL_PER_TOKEN, MXFP8, got 'W4A8_AWQ'",
        ),
        ({"quantization_config": {"quant_method": "modelopt"}}, "quant_algo must be given"),
        (
            {"quantization_config": {"quant_method": "gptq", "bits": 4}},
            "quant_method must be one of modelopt, compressed-tensors, fp8, mxfp8 .*got 'gptq'",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "activation_scheme": "per_token"}},
            "activation_scheme must be 'static' or 'dynamic' in an 'fp8' config, got 'per_token'",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e5m2"}},
            "fmt must be 'e4m3'",
        ),
        ({"architectures": ["LlamaForCausalLM"]}, "config must contain a quantization_config"),
    ],
)
def test_unknown_or_unsupported_configs_are_refused(config, words):
    with pytest.raises(ValueError, match=words):
        seam.Fp8Config.from_hf(config)


def _ct_block(**acts):
    ct = json.loads(json.dumps(COMPRESSED_TENSORS_FP8_BLOCK))
    ct["quantization_config"]["config_groups"]["group_0"]["input_activations"].update(acts)
    return ct


@pytest.mark.parametrize(
    "config, words",
    [
        (
            {"quantization_config": {**DEEPSEEK_V3["quantization_config"], "activation_scheme": "static"}},
            r"activation_scheme must be 'dynamic' with weight_block_size \[128, 128\].*got 'static'",
        ),
        (
            {"quantization_config": {**DEEPSEEK_V3["quantization_config"], "weight_block_size": [128]}},
            r"weight_block_size must be two positive ints \[rows, cols\], got \[128\]",
        ),
        (
            {"quantization_config": {**DEEPSEEK_V3["quantization_config"], "weight_block_size": [0, 128]}},
            r"weight_block_size must be two positive ints \[rows, cols\], got \[0, 128\]",
        ),
        (
            {"quantization_config": {**DEEPSEEK_V3["quantization_config"], "scale_fmt": "e8m0x"}},
            "scale_fmt must be 'float' or 'ue8m0', got 'e8m0x'",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "scale_fmt": "ue8m0"}},
            "scale_fmt 'ue8m0' needs block-scaled weights",
        ),
        (
            _ct_block(group_size=64),
            r"group_0.input_activations.group_size must equal the weights' bk = 128 \(block_structure \[128, 128\]\), got 64",
        ),
        (
            _ct_block(dynamic=False, strategy="tensor"),
            r"group_0.input_activations must be dynamic with block-scaled weights.*got static strategy='tensor'",
        ),
    ],
    ids=["block-static", "block-rank", "block-zero", "scale-fmt", "ue8m0-no-block", "ct-group-size", "ct-static"],
)
def test_block_scaled_configs_that_contradict_themselves_are_refused(config, words):
    with pytest.raises(ValueError, match=words):
        seam.Fp8Config.from_hf(config)


def test_per_group_activations_need_block_weights():
    ct = json.loads(json.dumps(COMPRESSED_TENSORS_FP8_DYNAMIC))
    ct["quantization_config"]["config_groups"]["group_0"]["input_activations"].update(strategy="group", group_size=128)
    with pytest.raises(ValueError, match="strategy='group' dynamic=True \\(per-group activations come with block"):
        seam.Fp8Config.from_hf(ct)
    with pytest.raises(ValueError, match="activation_scheme 'per_group' needs block-scaled weights"):
        seam.Fp8Config("fp8", activation_scheme="per_group")
    with pytest.raises(ValueError, match="activation_scheme must be 'per_group' with block-scaled weights"):
        seam.Fp8Config("fp8", activation_scheme="dynamic", weight_block_size=(128, 128))
    with pytest.raises(ValueError, match="activation_group_size must equal the weight's bk = 128"):
        seam.Fp8Config("fp8", activation_scheme="per_group", weight_block_size=(128, 128), activation_group_size=64)
    with pytest.raises(ValueError, match="weight_block_size must be given exactly when weight_strategy is 'block'"):
        seam.Fp8Config("fp8", weight_strategy="channel", activation_scheme="per_group", weight_block_size=(128, 128))
    with pytest.raises(ValueError, match="activation_group_size must be None unless"):
        seam.Fp8Config("fp8", activation_group_size=128)
    cfg = seam.Fp8Config("fp8", activation_scheme="per_group", weight_block_size=[64, 32])
    assert (cfg.weight_strategy, cfg.weight_block_size, cfg.activation_group_size) == ("block", (64, 32), 32)


def test_compressed_tensors_schemes_outside_fp8_w8a8_are_refused():
    ct = json.loads(json.dumps(COMPRESSED_TENSORS_FP8_DYNAMIC))
    group = ct["quantization_config"]["config_groups"]["group_0"]
    group["input_activations"] = None
    with pytest.raises(ValueError, match="weight-only FP8 \\(W8A16\\) is not supported yet"):
        seam.Fp8Config.from_hf(ct)
    group["input_activations"] = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": False}
    with pytest.raises(
        ValueError, match="input_activations must be static 'tensor'.*got strategy='token' dynamic=False"
    ):
        seam.Fp8Config.from_hf(ct)
    group["weights"] = {"num_bits": 8, "type": "int", "strategy": "channel"}
    with pytest.raises(ValueError, match="weights must be 8-bit float"):
        seam.Fp8Config.from_hf(ct)


def test_linear_method_refuses_weights_that_contradict_the_config():
    cfg = seam.Fp8Config.from_hf(AUTOFP8_STATIC)
    with pytest.raises(TypeError, match="weight of layer 'model.layers.0.mlp.up_proj' must be an Fp8Weight"):
        cfg.linear_method("model.layers.0.mlp.up_proj", np.ones((4, 8), np.float32))
    with pytest.raises(
        TypeError, match="weight of layer 'lm_head' must be a float array: the config leaves it unquantized"
    ):
        cfg.linear_method("lm_head", _fp8_weight("static"))


def test_config_validates_its_fields():
    with pytest.raises(ValueError, match="quant_method must be one of"):
        seam.Fp8Config("awq")
    with pytest.raises(ValueError, match="ignore pattern must be a valid regex"):
        seam.Fp8Config("fp8", ignore=["re:("])
    with pytest.raises(TypeError, match="ignore must be a sequence"):
        seam.Fp8Config("fp8", ignore="lm_head")
