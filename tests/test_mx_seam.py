"""MXFP8 and E8M0 block scales in the seam: ``Fp8Weight`` holds them, quantizes its
activations to match, and the checkpoint formats vLLM reads for them load from real safetensors files
written here -- ModelOpt MXFP8 (hf_quant_config.json, ``weight_scale`` U8), compressed-tensors
"mxfp8-pack-quantized" (``weight_scale`` U8), transformers' "mxfp8" (``weight_scale_inv`` F8_E8M0) and
vLLM's online "mxfp8" (bf16 weights quantized as they load), and DeepSeek's UE8M0 128 x 128 blocks
(``scale`` F8_E8M0, ``weight_scale_inv`` U8) -- each equal to the weight written, bit for bit."""

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import vtnumba as vt
from vtnumba import seam
from vtnumba.testing import reference
from vtnumba.testing.gates import assert_block_g3

RNG = np.random.default_rng(25)
P = "model.layers.0.mlp.down_proj"
F32 = np.float32


def _f8(codes):
    return codes.view(ml_dtypes.float8_e4m3fn)  # safetensors writes F8_E4M3


def _e8(scales):
    return scales.view(ml_dtypes.float8_e8m0fnu)  # safetensors writes F8_E8M0


def _float_weight(n=64, k=256):
    return (RNG.standard_normal((n, k)) * 0.05).astype(F32)


def test_mxfp8_weight_is_the_mx_quantizer_and_its_layer_matmul():
    w = _float_weight()
    w8 = seam.Fp8Weight.from_float(w, block_size=(1, 32), scale_format="e8m0")
    q = vt.quantize_fp8(w, group_size=32, scale_format="e8m0")
    np.testing.assert_array_equal(w8.data, q.data)
    np.testing.assert_array_equal(w8.weight_scale, q.scale)
    assert w8.scale_format == "e8m0" and w8.activation_scale_format == "e8m0"
    assert w8.activation_scale_rounding == "rceil" and w8.nbytes == 64 * 256 + 64 * 8
    x = RNG.standard_normal((5, 256)).astype(F32)
    y = seam.matmul_fp8(x, w8)
    qx = seam.quantize_activation(x, w8)
    assert qx.scale.dtype == np.uint8 and qx.scale.flags.c_contiguous  # row-major E8M0 bytes
    np.testing.assert_array_equal(seam.matmul_fp8_prequant(qx, w8), y)
    assert assert_block_g3(y, qx.data, w8.data, qx.scale, w8.weight_scale, (1, 32)) == 5 * 64
    floor = seam.Fp8Weight.from_float(w, block_size=(1, 32), scale_format="e8m0", scale_rounding="floor")
    assert floor.activation_scale_rounding == "floor"
    np.testing.assert_array_equal(floor.weight_scale, reference.quantize_mx(w, 32, "floor").scale)
    np.testing.assert_array_equal(w8.dequantize(), q.dequantize())


def test_ue8m0_block_weight_takes_float32_activation_scales():
    w = _float_weight(256, 384)
    wd = seam.Fp8Weight.from_float(w, block_size=(128, 128), scale_format="e8m0", scale_ue8m0=True)
    assert wd.weight_scale.dtype == np.uint8 and wd.weight_scale.shape == (2, 3)
    assert wd.activation_scale_format == "float32"
    # each block's byte is the rceil rule of its amax, codes encode(w / 2^(byte - 127))
    amax = np.abs(w).reshape(2, 128, 3, 128).max(axis=(1, 3))
    np.testing.assert_array_equal(wd.weight_scale, reference.e8m0_bytes(amax, "rceil"))
    x = RNG.standard_normal((3, 384)).astype(F32)
    qx = seam.quantize_activation(x, wd)
    assert qx.scale.dtype == np.float32
    y = seam.matmul_fp8(x, wd)
    as_float = seam.Fp8Weight(wd.data, vt.decode_e8m0(wd.weight_scale), block_size=(128, 128), scale_ue8m0=True)
    np.testing.assert_array_equal(y, seam.matmul_fp8(x, as_float))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(activation_scale_format="e8m0"), "needs per-group activations"),
        (dict(block_size=(1, 32), activation_scale_format="e8m0", scale_ue8m0=True), "scale_ue8m0 must be False"),
        (dict(block_size=(1, 32), activation_scale_rounding="up"), "activation_scale_rounding must be one of"),
        (
            dict(block_size=(1, 32), activation_scale_format="float32", activation_scale_rounding="rceil"),
            "activation_scale_rounding applies to activation_scale_format='e8m0' only",
        ),
    ],
)
def test_mx_weight_errors(kwargs, words):
    codes = RNG.integers(0, 0x7E, size=(8, 64), dtype=np.uint8)
    scale = np.full((8, 2), 120, np.uint8) if "block_size" in kwargs else np.float32(0.1)
    with pytest.raises(ValueError, match=words):
        seam.Fp8Weight(codes, scale, **kwargs)


def test_nan_e8m0_weight_scale_is_refused_and_a_prequant_mismatch_named():
    codes = RNG.integers(0, 0x7E, size=(8, 64), dtype=np.uint8)
    bad = np.full((8, 2), 120, np.uint8)
    bad[3, 1] = 0xFF
    with pytest.raises(ValueError, match=r"got 0xFF \(NaN\) at block \(3, 1\)"):
        seam.Fp8Weight(codes, bad, block_size=(1, 32))
    w8 = seam.Fp8Weight(codes, np.full((8, 2), 120, np.uint8), block_size=(1, 32))
    x = RNG.standard_normal((2, 64)).astype(F32)
    q = vt.quantize_fp8(x, group_size=32)  # float32 group scales: not what an MXFP8 weight takes
    with pytest.raises(ValueError, match="q.scale_format must be the weight's activation_scale_format 'e8m0'"):
        seam.matmul_fp8_prequant(q, w8)


def test_fused_mx_shards_concatenate_exactly():
    a, b = (
        seam.Fp8Weight.from_float(_float_weight(32, 128), block_size=(1, 32), scale_format="e8m0") for _ in range(2)
    )
    fused = seam.fuse_fp8_shards([a, b])
    assert fused.scale_format == "e8m0" and fused.activation_scale_format == "e8m0"
    np.testing.assert_array_equal(fused.weight_scale, np.concatenate([a.weight_scale, b.weight_scale]))
    x = RNG.standard_normal((3, 128)).astype(F32)
    np.testing.assert_array_equal(
        seam.matmul_fp8(x, fused), np.concatenate([seam.matmul_fp8(x, a), seam.matmul_fp8(x, b)], axis=1)
    )


# -- checkpoints ---------------------------------------------------------------------------------------


def _mx(n=64, k=256):
    return seam.Fp8Weight.from_float(_float_weight(n, k), block_size=(1, 32), scale_format="e8m0")


def _same(w, want):
    np.testing.assert_array_equal(w.data, want.data)
    np.testing.assert_array_equal(w.weight_scale, want.weight_scale)
    assert w.weight_scale.dtype == np.uint8 and w.block_size == want.block_size
    assert np.count_nonzero(w.data) > w.data.size // 2


def test_modelopt_mxfp8_checkpoint(tmp_path):
    want = _mx()
    save_file(
        {f"{P}.weight": _f8(want.data), f"{P}.weight_scale": want.weight_scale},  # U8, as vLLM creates it
        str(tmp_path / "model.safetensors"),
    )
    (tmp_path / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt", "version": "0.29"},
                "quantization": {"quant_algo": "MXFP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]},
            }
        )
    )
    cfg = seam.Fp8Config.from_hf(tmp_path)
    assert cfg.weight_block_size == (1, 32) and cfg.mxfp8 and cfg.activation_scheme == "per_group"
    method = cfg.load_linear(tmp_path, P)
    _same(method.weight, want)
    assert method.weight.activation_scale_format == "e8m0"
    assert "E8M0 bytes" in method.weight.source["weight_scale"]
    x = RNG.standard_normal((4, 256)).astype(F32)
    np.testing.assert_array_equal(method.apply(x), seam.matmul_fp8(x, want))


def test_compressed_tensors_mxfp8_checkpoint(tmp_path):
    want = _mx()
    save_file(
        {f"{P}.weight": _f8(want.data), f"{P}.weight_scale": want.weight_scale}, str(tmp_path / "model.safetensors")
    )
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "mxfp8-pack-quantized",
            "ignore": ["lm_head"],
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "group",
                        "group_size": 32,
                        "symmetric": True,
                        "dynamic": False,
                        "scale_dtype": "torch.uint8",
                    },
                    "input_activations": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "group",
                        "group_size": 32,
                        "dynamic": True,
                    },
                }
            },
        }
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = seam.Fp8Config.from_hf(tmp_path)
    assert cfg.quant_method == "compressed-tensors" and cfg.mxfp8 and cfg.is_ignored("lm_head")
    _same(cfg.load_linear(tmp_path, P).weight, want)
    del config["quantization_config"]["config_groups"]["group_0"]["input_activations"]  # vLLM takes none too
    assert seam.Fp8Config.from_hf(config).mxfp8
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 64
    with pytest.raises(ValueError, match="group_size must be 32 for FP8 group weights"):
        seam.Fp8Config.from_hf(config)


def test_transformers_mxfp8_checkpoint_with_e8m0_dtype(tmp_path):
    want = _mx()
    save_file(
        {f"{P}.weight": _f8(want.data), f"{P}.weight_scale_inv": _e8(want.weight_scale)},
        str(tmp_path / "model.safetensors"),
    )
    ckpt = seam.Checkpoint(tmp_path)
    assert ckpt.dtype(f"{P}.weight_scale_inv") == "F8_E8M0"
    cfg = seam.Fp8Config.from_hf(
        {"quant_method": "mxfp8", "weight_block_size": [1, 32], "modules_to_not_convert": ["lm_head"]}
    )
    method = cfg.load_linear(tmp_path, P)
    _same(method.weight, want)
    assert method.weight.source["scale_convention"].endswith("2^(byte - 127))")
    with pytest.raises(ValueError, match=r"an MXFP8 layer; pass block_size=\(1, 32\)"):
        seam.load_fp8_linear(tmp_path, P)


def test_online_mxfp8_quantizes_a_float_checkpoint_as_it_loads(tmp_path):
    w = _float_weight()
    bias = RNG.standard_normal(64).astype(ml_dtypes.bfloat16)
    save_file({f"{P}.weight": w.astype(ml_dtypes.bfloat16), f"{P}.bias": bias}, str(tmp_path / "model.safetensors"))
    method = seam.Fp8Config.from_hf({"quant_method": "mxfp8", "activation_scheme": "dynamic"}).load_linear(tmp_path, P)
    want = seam.Fp8Weight.from_float(w.astype(ml_dtypes.bfloat16), block_size=(1, 32), scale_format="e8m0")
    _same(method.weight, want)
    np.testing.assert_array_equal(method.weight.bias, bias.astype(F32))


@pytest.mark.parametrize("name, as_dtype", [("scale", _e8), ("weight_scale_inv", lambda s: s)])
def test_deepseek_ue8m0_block_checkpoint(tmp_path, name, as_dtype):
    want = seam.Fp8Weight.from_float(
        _float_weight(256, 384), block_size=(128, 128), scale_format="e8m0", scale_ue8m0=True
    )
    save_file(
        {f"{P}.weight": _f8(want.data), f"{P}.{name}": as_dtype(want.weight_scale)}, str(tmp_path / "model.safetensors")
    )
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "quantization_config": {
                    "quant_method": "fp8",
                    "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128],
                    "scale_fmt": "ue8m0",
                }
            }
        )
    )
    cfg = seam.Fp8Config.from_hf(tmp_path)
    w = cfg.load_linear(tmp_path, P).weight
    _same(w, want)
    assert w.activation_scale_format == "float32" and w.scale_ue8m0
    x = RNG.standard_normal((2, 384)).astype(F32)
    np.testing.assert_array_equal(seam.matmul_fp8(x, w), seam.matmul_fp8(x, want))


def test_a_nan_e8m0_block_in_a_checkpoint_is_refused_naming_the_layer(tmp_path):
    want = _mx(16, 64)
    scale = want.weight_scale.copy()
    scale[5, 1] = 0xFF
    save_file({f"{P}.weight": _f8(want.data), f"{P}.weight_scale": scale}, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        ValueError,
        match=rf"layer '{P}': tensor '{P}.weight_scale' must hold finite E8M0 block "
        rf"scales \(0xFF is NaN\), got .* at block \[5, 1\]",
    ):
        seam.load_fp8_linear(tmp_path, P, block_size=(1, 32))


def test_torch_layers_refuse_e8m0_weights_and_the_seam_takes_torch_tensors():
    torch = pytest.importorskip("torch")
    import vtnumba.torch as vtt

    w8 = _mx(16, 64)
    with pytest.raises(ValueError, match="weight must have float32 scales for vtnumba.torch's Fp8Linear"):
        vtt.Fp8Linear(w8)
    x = torch.randn(3, 64)
    y = seam.matmul_fp8(x, w8)
    assert isinstance(y, torch.Tensor)
    np.testing.assert_array_equal(y.numpy(), seam.matmul_fp8(x.numpy(), w8))
