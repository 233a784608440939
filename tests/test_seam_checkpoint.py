"""seam.load_fp8_linear on small checkpoints written in the exact on-disk format (safetensors, F8_E4M3
codes), in the tensor layouts real producers use:

- ModelOpt FP8: ``weight`` F8_E4M3 [N, K], ``weight_scale`` F32 [], ``input_scale`` F32 [];
- compressed-tensors FP8-dynamic: ``weight_scale`` BF16 [N, 1], no input scale;
- DeepSeek-V3 style: ``weight_scale_inv`` F32 [ceil(N/128), ceil(K/128)] (block-scaled);
- sharded checkpoints: ``model.safetensors.index.json`` with a ``weight_map``.
"""

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import vtnumba as vt
from vtnumba import seam
from vtnumba.testing import reference

RNG = np.random.default_rng(62)
P = "model.layers.0.mlp.down_proj"


def _f8(codes):
    return codes.view(ml_dtypes.float8_e4m3fn)  # safetensors writes this dtype as F8_E4M3


def _quantized(n=16, k=32, per_channel=False):
    w = (RNG.standard_normal((n, k)) * 0.05).astype(np.float32)
    fw = seam.Fp8Weight.from_float(w, per_channel=per_channel)
    return w, fw


def test_modelopt_layout_round_trips_exactly(tmp_path):
    _, fw = _quantized()
    path = tmp_path / "model.safetensors"
    save_file(
        {
            f"{P}.weight": _f8(fw.data),
            f"{P}.weight_scale": fw.weight_scale.reshape(()),
            f"{P}.input_scale": np.array(0.0213, np.float32),
        },
        str(path),
    )
    with safe_open(str(path), framework="np") as f:  # the file really holds F8_E4M3 codes
        assert f.get_slice(f"{P}.weight").get_dtype() == "F8_E4M3"
    w = seam.load_fp8_linear(path, P)
    np.testing.assert_array_equal(w.data, fw.data)
    assert w.data.dtype == np.uint8 and np.count_nonzero(w.data) > 0.9 * w.data.size
    assert w.weight_scale[0] == fw.weight_scale[0] and not w.per_channel
    assert w.activation_scheme == "static" and w.input_scale == np.float32(0.0213)
    assert w.source["scale_convention"].startswith("weight_scale read as the dequantization multiplier")
    assert w.source["files"] == ["model.safetensors"] and f"{P}.input_scale" in w.source["tensors"]


def test_compressed_tensors_bf16_per_channel_n1_scale(tmp_path):
    _, fw = _quantized(per_channel=True)
    scale_bf16 = fw.weight_scale.astype(ml_dtypes.bfloat16).reshape(-1, 1)  # [N, 1] as llm-compressor writes
    save_file({f"{P}.weight": _f8(fw.data), f"{P}.weight_scale": scale_bf16}, str(tmp_path / "model.safetensors"))
    w = seam.load_fp8_linear(tmp_path, P, activation_scheme="per_token")  # a directory
    assert w.per_channel and w.weight_scale.shape == (16,) and w.activation_scheme == "per_token"
    np.testing.assert_array_equal(w.weight_scale, scale_bf16.astype(np.float32).reshape(-1))
    assert "per-channel, shape [16, 1], BF16" in w.source["weight_scale"]
    w_flat = seam.load_fp8_linear(tmp_path, P)  # [N] and [N, 1] read alike; no input scale -> dynamic
    assert w_flat.activation_scheme == "dynamic"


def test_weight_scale_inv_is_read_as_the_dequantization_multiplier(tmp_path):
    # DeepSeek-V3's weight_dequant: y = codes * weight_scale_inv. A loader that inverted it would be
    # off by scale^2 (here 0.004^2): the dequantized weight must match the float weight.
    w_float, fw = _quantized()
    save_file(
        {f"{P}.weight": _f8(fw.data), f"{P}.weight_scale_inv": fw.weight_scale.reshape(())},
        str(tmp_path / "model.safetensors"),
    )
    w = seam.load_fp8_linear(tmp_path / "model.safetensors", P)
    assert w.weight_scale[0] == fw.weight_scale[0]
    assert "weight_scale_inv read as the dequantization multiplier" in w.source["scale_convention"]
    err = np.abs(w.dequantize() - w_float)
    assert np.all(err <= np.abs(w_float) * 2.0**-4 + float(fw.weight_scale[0]) * 2.0**-10)


def test_block_scaled_layer_needs_its_block_size(tmp_path):
    codes = RNG.integers(0, 0x7E, size=(256, 384), dtype=np.uint8)
    save_file(
        {f"{P}.weight": _f8(codes), f"{P}.weight_scale_inv": np.full((2, 3), 0.01, np.float32)},
        str(tmp_path / "model.safetensors"),
    )
    with pytest.raises(
        ValueError,
        match=rf"tensor '{P}.weight_scale_inv' has shape \[2, 3\].*a block-scaled layer; "
        r"pass block_size",
    ):
        seam.load_fp8_linear(tmp_path, P)


@pytest.mark.parametrize("scale_dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_block_scaled_layer_reads_its_scales_exactly(tmp_path, scale_dtype):
    from vtnumba.testing.gates import assert_block_g3

    codes = RNG.integers(0, 0x7E, size=(200, 384), dtype=np.uint8)  # N = 200: a short last row-block
    scales = RNG.uniform(1e-4, 1e-2, size=(2, 3)).astype(scale_dtype)
    save_file({f"{P}.weight": _f8(codes), f"{P}.weight_scale_inv": scales}, str(tmp_path / "model.safetensors"))
    w = seam.load_fp8_linear(tmp_path, P, block_size=(128, 128))
    assert w.block_size == (128, 128) and w.activation_scheme == "per_group"
    np.testing.assert_array_equal(w.weight_scale, scales.astype(np.float32))  # widened exactly
    np.testing.assert_array_equal(w.data, codes)
    x = RNG.standard_normal((3, 384)).astype(np.float32)
    q = seam.quantize_activation(x, w)
    y = seam.matmul_fp8(x, w)
    assert assert_block_g3(y, q.data, codes, q.scale, scales.astype(np.float32), (128, 128)) > 500


@pytest.mark.parametrize("bad", [np.nan, np.inf, 0.0, -0.5])
def test_bad_block_scales_name_the_layer_and_the_block(tmp_path, bad):
    scales = np.full((2, 3), 0.01, np.float32)
    scales[1, 2] = bad
    save_file(
        {f"{P}.weight": _f8(np.ones((256, 384), np.uint8)), f"{P}.weight_scale_inv": scales},
        str(tmp_path / "model.safetensors"),
    )
    with pytest.raises(
        ValueError,
        match=rf"layer '{P}': tensor '{P}.weight_scale_inv' must hold positive finite "
        r"block scales, got .* at block \[1, 2\]",
    ):
        seam.load_fp8_linear(tmp_path, P, block_size=(128, 128))
    with pytest.raises(ValueError, match=r"must have shape \[2, 6\]"):
        seam.load_fp8_linear(tmp_path, P, block_size=(128, 64))


def test_block_scaled_shards_fuse_when_n_is_a_multiple_of_bn(tmp_path):
    shards = {"q": (256, 384), "k": (128, 384), "v": (100, 384)}
    tensors = {}
    for name, (n, k) in shards.items():
        tensors[f"{name}.weight"] = _f8(RNG.integers(0, 0x7E, size=(n, k), dtype=np.uint8))
        tensors[f"{name}.weight_scale_inv"] = RNG.uniform(1e-3, 1e-2, size=(-(-n // 128), 3)).astype(np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    fused = seam.load_fp8_fused_linear(tmp_path, ["q", "k", "v"], block_size=(128, 128))
    assert fused.shape == (484, 384) and fused.weight_scale.shape == (4, 3)
    np.testing.assert_array_equal(fused.weight_scale[2], tensors["k.weight_scale_inv"][0])
    with pytest.raises(ValueError, match=r"shards\[0\] must have N a multiple of bn = 128"):
        seam.load_fp8_fused_linear(tmp_path, ["v", "q"], block_size=(128, 128))


def test_sharded_checkpoint_through_its_index(tmp_path):
    _, fw = _quantized(per_channel=True)
    bias = RNG.standard_normal(16).astype(ml_dtypes.bfloat16)
    save_file({f"{P}.weight": _f8(fw.data)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(
        {
            f"{P}.weight_scale": fw.weight_scale,
            f"{P}.bias": bias,
            "lm_head.weight": np.ones((4, 32), ml_dtypes.bfloat16),
        },
        str(tmp_path / "model-00002-of-00002.safetensors"),
    )
    index = {
        "metadata": {"total_size": 16 * 32 + 16 * 4 + 16 * 2 + 4 * 32 * 2},
        "weight_map": {
            f"{P}.weight": "model-00001-of-00002.safetensors",
            f"{P}.weight_scale": "model-00002-of-00002.safetensors",
            f"{P}.bias": "model-00002-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        },
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    for where in (tmp_path, tmp_path / "model.safetensors.index.json"):
        w = seam.load_fp8_linear(where, P)
        np.testing.assert_array_equal(w.data, fw.data)
        np.testing.assert_array_equal(w.weight_scale, fw.weight_scale)
        np.testing.assert_array_equal(w.bias.view(np.uint16), bias.view(np.uint16))
        assert w.source["files"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight, b = seam.load_float_linear(tmp_path, "lm_head")
    assert weight.dtype == ml_dtypes.bfloat16 and weight.shape == (4, 32) and b is None


def test_dynamic_scheme_ignores_a_stored_input_scale_and_says_so(tmp_path):
    _, fw = _quantized()
    save_file(
        {
            f"{P}.weight": _f8(fw.data),
            f"{P}.weight_scale": fw.weight_scale,
            f"{P}.input_scale": np.array([0.5], np.float32),
        },
        str(tmp_path / "model.safetensors"),
    )
    w = seam.load_fp8_linear(tmp_path, P, activation_scheme="dynamic")
    assert w.input_scale is None and w.activation_scheme == "dynamic"
    assert "ignored" in w.source["input_scale"]


# -- refusals, each naming the tensor -------------------------------------------------------


def _write(tmp_path, **tensors):
    save_file({f"{P}.{k}": np.asarray(v) for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    return tmp_path


GOOD_CODES = np.arange(16 * 8, dtype=np.uint8).reshape(16, 8) % 0x7E


@pytest.mark.parametrize(
    "tensors, words",
    [
        (dict(weight_scale=np.float32(1.0)), f"tensor '{P}.weight' must be in the checkpoint"),
        (
            dict(weight=_f8(GOOD_CODES)),
            rf"tensor {P}.weight_scale \(or {P}.weight_scale_inv, or {P}.scale\) must be in the checkpoint .* got none",
        ),
        (
            dict(weight=_f8(GOOD_CODES), weight_scale=np.float32(1.0), weight_scale_inv=np.float32(1.0)),
            "must not all be present",
        ),
        (
            dict(weight=_f8(GOOD_CODES), weight_scale=np.ones(17, np.float32)),
            rf"tensor '{P}.weight_scale' must have shape \[\] or \[1\] \(per-tensor\), \[16\] or \[16, 1\]",
        ),
        (
            dict(weight=_f8(GOOD_CODES), weight_scale=np.array([1.0] * 15 + [np.nan], np.float32)),
            rf"tensor '{P}.weight_scale' must hold positive finite scales, got \[nan\] at \[15\]",
        ),
        (
            dict(weight=_f8(GOOD_CODES), weight_scale=np.array(0.0, np.float32)),
            rf"tensor '{P}.weight_scale' must hold positive finite scales",
        ),
        (
            dict(weight=_f8(GOOD_CODES), weight_scale=np.float32(1.0), input_scale=np.array(np.inf, np.float32)),
            rf"tensor '{P}.input_scale' must be a positive finite scale",
        ),
        (
            dict(weight=_f8(GOOD_CODES), weight_scale=np.float32(1.0), input_scale=np.ones(2, np.float32)),
            rf"tensor '{P}.input_scale' must be a scalar",
        ),
        (
            dict(weight=np.ones((16, 8), ml_dtypes.bfloat16), weight_scale=np.float32(1.0)),
            rf"tensor '{P}.weight' must hold F8_E4M3 codes, got BF16: the layer is not FP8-quantized",
        ),
        (
            dict(weight=_f8(np.full((16, 8), 0xFF, np.uint8)), weight_scale=np.float32(1.0)),
            rf"tensor '{P}.weight' must hold finite e4m3 codes, got 128 NaN codes",
        ),
        (
            dict(weight=_f8(GOOD_CODES), weight_scale=np.float32(1.0), bias=np.ones(8, np.float32)),
            rf"tensor '{P}.bias' must have shape \[16\]",
        ),
        (
            dict(weight=_f8(GOOD_CODES), weight_scale=np.ones(16, np.int32)),
            rf"tensor '{P}.weight_scale' must be a float tensor",
        ),
    ],
)
def test_bad_checkpoints_are_refused_naming_the_tensor(tmp_path, tensors, words):
    with pytest.raises(ValueError, match=words):
        seam.load_fp8_linear(_write(tmp_path, **tensors), P)


def test_static_scheme_without_an_input_scale_is_refused(tmp_path):
    _write(tmp_path, weight=_f8(GOOD_CODES), weight_scale=np.float32(1.0))
    with pytest.raises(
        ValueError, match=rf"tensor '{P}.input_scale' must be in the checkpoint for activation_scheme='static'"
    ):
        seam.load_fp8_linear(tmp_path, P, activation_scheme="static")


def test_bad_paths_are_refused(tmp_path):
    with pytest.raises(ValueError, match="path must be a .safetensors file, an index .json or a model directory"):
        seam.load_fp8_linear(tmp_path / "nope.safetensors", P)
    with pytest.raises(ValueError, match="path must hold model.safetensors"):
        seam.load_fp8_linear(tmp_path, P)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "missing.safetensors"}}))
    with pytest.raises(
        ValueError, match="shard 'missing.safetensors' named in model.safetensors.index.json must exist"
    ):
        seam.load_fp8_linear(tmp_path, P)


# -- fused shards and a model directory end to end --------------------------------------------


def test_fused_qkv_from_a_checkpoint(tmp_path):
    tensors, shards = {}, []
    for name, n, s in (("q_proj", 16, 0.011), ("k_proj", 8, 0.023), ("v_proj", 8, 0.017)):
        codes = RNG.integers(0, 0x7E, size=(n, 32), dtype=np.uint8) | (
            RNG.integers(0, 2, size=(n, 32), dtype=np.uint8) << 7
        )
        prefix = f"model.layers.0.self_attn.{name}"
        tensors.update(
            {
                f"{prefix}.weight": _f8(codes),
                f"{prefix}.weight_scale": np.array(s, np.float32),
                f"{prefix}.input_scale": np.array(0.02 + n / 1000, np.float32),
            }
        )
        shards.append(prefix)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    fused = seam.load_fp8_fused_linear(tmp_path, shards)
    assert fused.shape == (32, 32) and fused.weight_scale[0] == np.float32(0.023)
    assert fused.input_scale == np.float32(0.036) and fused.activation_scheme == "static"
    expected = seam.fuse_fp8_shards([seam.load_fp8_linear(tmp_path, p) for p in shards])
    np.testing.assert_array_equal(fused.data, expected.data)
    np.testing.assert_array_equal(
        fused.data[16:24], tensors[f"{shards[1]}.weight"].view(np.uint8)
    )  # max-scale shard kept
    assert np.count_nonzero(fused.data[:16] != tensors[f"{shards[0]}.weight"].view(np.uint8)) > 0


def test_config_and_checkpoint_end_to_end(tmp_path):
    w_float, _ = _quantized(n=16, k=32)
    fw = seam.Fp8Weight.from_float(w_float, input_scale=0.01)
    head = RNG.standard_normal((8, 16)).astype(ml_dtypes.bfloat16)
    save_file(
        {
            f"{P}.weight": _f8(fw.data),
            f"{P}.weight_scale": fw.weight_scale.reshape(()),
            f"{P}.input_scale": np.array(0.01, np.float32),
            "lm_head.weight": head,
        },
        str(tmp_path / "model.safetensors"),
    )
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "quantization_config": {
                    "quant_method": "fp8",
                    "activation_scheme": "static",
                    "ignored_layers": ["lm_head"],
                }
            }
        )
    )
    cfg = seam.Fp8Config.from_hf(tmp_path)
    down = cfg.load_linear(tmp_path, P)
    lm_head = cfg.load_linear(tmp_path, "lm_head")
    assert (down.name, lm_head.name) == ("fp8_w8a8", "unquantized")
    x = RNG.standard_normal((3, 32)).astype(np.float32)
    y = down.apply(x)
    np.testing.assert_array_equal(y, seam.matmul_fp8(x, fw))
    q = reference.quantize(x, 0.01)
    ref, bound = reference.scaled_mm(q.data, fw.data, q.scale, fw.weight_scale)
    assert np.all(np.abs(y - ref) <= bound + reference.out_rounding(ref, np.float32))
    logits = lm_head.apply(y)
    np.testing.assert_allclose(logits, y @ head.astype(np.float32).T, rtol=1e-5, atol=1e-5)
    assert vt.quantize_fp8(x, 0.01).scheme == down.weight.activation_scheme
