"""The errors a newcomer meets first, pinned word for word where it matters: each names what is at
fault (the file, the layer or the argument) and says the fix.

- a truncated safetensors file (safetensors alone says "incomplete metadata, file not fully covered",
  naming neither the file nor the layer);
- e4m3 codes stored as uint8 (U8) in a checkpoint;
- a ModelOpt hf_quant_config.json without its "producer";
- group scales of one group size passed with a block size of another (shapes that happen to match
  give a wrong result): ``vt.scaled_mm`` given the ``QuantizedActivation`` checks it; the seam's
  prequantized path checks it too.
"""

import json
import re

import ml_dtypes
import numpy as np
import pytest
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

import vtnumba as vt
from vtnumba import seam

RNG = np.random.default_rng(23)
P = "model.layers.3.self_attn.o_proj"


def _fp8_layer(tmp_path, name="model.safetensors", weight_dtype="f8"):
    """A per-tensor FP8 layer written in the on-disk format (weight, weight_scale, bias)."""
    w = seam.Fp8Weight.from_float(RNG.standard_normal((32, 64)).astype(np.float32))
    codes = w.data.view(ml_dtypes.float8_e4m3fn) if weight_dtype == "f8" else w.data
    path = tmp_path / name
    save_file(
        {f"{P}.weight": codes, f"{P}.weight_scale": w.weight_scale.reshape(()), f"{P}.bias": np.zeros(32, np.float32)},
        str(path),
    )
    return path, w


# -- truncated files ---------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [7, 1000, 2000])
def test_a_truncated_file_names_the_file_the_layer_and_the_fix(tmp_path, cut):
    path, _ = _fp8_layer(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[:-cut])
    with pytest.raises(SafetensorError):  # what safetensors alone says, for comparison: no file, no layer
        with safe_open(str(path), framework="np"):
            pass
    with pytest.raises(ValueError) as info:
        seam.load_fp8_linear(path, P)
    msg = str(info.value)
    assert msg.startswith(
        f"layer '{P}': file '{path}' must hold the {len(raw)} bytes its header describes, "
        f"got {len(raw) - cut}: the file is truncated"
    ), msg
    assert msg.endswith("download or copy it again"), msg
    assert re.search(r"cutting off [1-3] tensor\(s\) \(" + re.escape(P), msg), msg


def test_a_truncated_header_names_the_file_the_layer_and_the_fix(tmp_path):
    path, _ = _fp8_layer(tmp_path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(
        ValueError,
        match=rf"^layer '{re.escape(P)}': '{re.escape(str(path))}' must hold its "
        r"\d+-byte header, got 32 bytes of it: the file is truncated .*; "
        r"download or copy it again$",
    ):
        seam.load_fp8_linear(path, P)


def test_a_file_longer_than_its_header_says_is_named(tmp_path):
    path, _ = _fp8_layer(tmp_path)
    path.write_bytes(path.read_bytes() + b"\0" * 5)
    with pytest.raises(
        ValueError,
        match=rf"^layer '{re.escape(P)}': file '{re.escape(str(path))}' must end where "
        r"its last tensor ends \(byte \d+\), got 5 bytes more",
    ):
        seam.load_fp8_linear(path, P)


def test_a_truncated_shard_does_not_stop_the_other_shards(tmp_path):
    good, w = _fp8_layer(tmp_path, "model-00001-of-00002.safetensors")
    other = "model.layers.4.mlp.up_proj"
    save_file(
        {f"{other}.weight": w.data.view(ml_dtypes.float8_e4m3fn), f"{other}.weight_scale": w.weight_scale.reshape(())},
        str(tmp_path / "model-00002-of-00002.safetensors"),
    )
    bad = tmp_path / "model-00002-of-00002.safetensors"
    bad.write_bytes(bad.read_bytes()[:-100])
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    f"{P}.weight": good.name,
                    f"{P}.weight_scale": good.name,
                    f"{P}.bias": good.name,
                    f"{other}.weight": bad.name,
                    f"{other}.weight_scale": bad.name,
                }
            }
        )
    )
    loaded = seam.load_fp8_linear(tmp_path, P)  # its shard is whole
    np.testing.assert_array_equal(loaded.data, w.data)
    with pytest.raises(ValueError, match=rf"^layer '{other}': file '{re.escape(str(bad))}' must hold"):
        seam.load_fp8_linear(tmp_path, other)


# -- uint8 codes -------------------------------------------------------------------------------


def test_uint8_codes_get_the_way_to_read_them(tmp_path):
    path, w = _fp8_layer(tmp_path, weight_dtype="u8")
    with pytest.raises(ValueError) as info:
        seam.load_fp8_linear(path, P)
    msg = str(info.value)
    assert msg.startswith(f"layer '{P}': tensor '{P}.weight' must hold F8_E4M3 codes, got U8 in '{path}': "), msg
    assert "codes.view(ml_dtypes.float8_e4m3fn)" in msg and "t.view(torch.float8_e4m3fn)" in msg, msg
    fix = f"seam.Fp8Weight(seam.Checkpoint(path).read('{P}.weight'), weight_scale)"
    assert msg.endswith(fix), msg
    # and the fix it names works, giving the weight the codes were
    rebuilt = seam.Fp8Weight(seam.Checkpoint(path).read(f"{P}.weight"), w.weight_scale)
    np.testing.assert_array_equal(rebuilt.data, w.data)
    assert np.count_nonzero(rebuilt.data) > 0.9 * rebuilt.data.size


def test_other_integer_weights_are_named_as_not_fp8(tmp_path):
    save_file(
        {f"{P}.weight": np.ones((4, 8), np.int8), f"{P}.weight_scale": np.array(1.0, np.float32)},
        str(tmp_path / "model.safetensors"),
    )
    with pytest.raises(
        ValueError,
        match=r"must hold F8_E4M3 codes, got I8 in '.*model.safetensors': vtnumba reads "
        r"e4m3fn \(F8_E4M3\) FP8 weights only",
    ):
        seam.load_fp8_linear(tmp_path, P)


# -- hf_quant_config.json without its producer ----------------------------------------------------

MODELOPT_SECTION = {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}


def test_a_modelopt_section_without_producer_says_what_is_missing(tmp_path):
    fix = 'Fp8Config.from_hf({"quant_method": "modelopt", **config["quantization"]})'
    with pytest.raises(ValueError) as info:
        seam.Fp8Config.from_hf({"quantization": MODELOPT_SECTION})
    msg = str(info.value)
    assert msg.startswith("config's 'producer' must be a dict naming who wrote the ModelOpt 'quantization' section"), (
        msg
    )
    assert "got none; add it to the file, or pass the section itself: " + fix in msg, msg
    assert "not quantized" not in msg
    # the file, and a model directory holding it, are named
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": MODELOPT_SECTION}))
    for where in (tmp_path / "hf_quant_config.json", tmp_path):
        with pytest.raises(
            ValueError,
            match=rf"got none in '{re.escape(str(tmp_path / 'hf_quant_config.json'))}'; "
            r"add it to the file",
        ):
            seam.Fp8Config.from_hf(where)
    # a producer that is not a dict is shown as it is
    with pytest.raises(ValueError, match=r"got 'modelopt'; add it"):
        seam.Fp8Config.from_hf({"producer": "modelopt", "quantization": MODELOPT_SECTION})
    # the fix it names works
    config = seam.Fp8Config.from_hf({"quant_method": "modelopt", **MODELOPT_SECTION})
    assert (config.quant_method, config.activation_scheme, config.ignore) == ("modelopt", "static", ("lm_head",))


def test_a_config_without_any_quantization_still_says_so():
    with pytest.raises(ValueError, match="got none: the checkpoint is not quantized"):
        seam.Fp8Config.from_hf({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})


# -- group size against block size ---------------------------------------------------------------


def _block_case():
    """K = 64: 32-wide groups and 48-wide K-blocks both give 2 scales per row, so raw shapes match."""
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    w = seam.Fp8Weight.from_float(RNG.standard_normal((32, 64)).astype(np.float32), block_size=(16, 48))
    return x, w


def test_scaled_mm_checks_a_quantized_activations_group_size():
    x, w = _block_case()
    q32 = vt.quantize_fp8(x, group_size=32)
    assert q32.scale.shape == (4, 2) == (4, w.weight_scale.shape[1])  # the shapes alone cannot tell
    with pytest.raises(
        ValueError,
        match=re.escape(
            "a.group_size must be block_size's bk = 48 (each K-block of 48 is scaled by one activation scale), "
            "got 32; quantize with vt.quantize_fp8(x, group_size=48) or pass the block_size the weight was "
            "quantized with"
        ),
    ):
        vt.scaled_mm(q32, w.data, scale_b=w.weight_scale, block_size=(16, 48))
    # the matching group size runs, bitwise as the raw arrays do
    q48 = vt.quantize_fp8(x, group_size=48)
    y = vt.scaled_mm(q48, w.data, scale_b=w.weight_scale, block_size=(16, 48))
    np.testing.assert_array_equal(y, vt.scaled_mm(q48.data, w.data, q48.scale, w.weight_scale, block_size=(16, 48)))
    assert np.count_nonzero(y) == y.size


def test_the_seam_catches_the_mismatch_too():
    x, w = _block_case()
    with pytest.raises(ValueError, match=r"q.group_size must be the weight's bk = 48 \(block_size \(16, 48\)\)"):
        seam.matmul_fp8_prequant(vt.quantize_fp8(x, group_size=32), w)


def test_raw_arrays_are_not_checked_for_group_size():
    """The documented limit: raw codes and scales carry no group size. This is why the
    QuantizedActivation form exists; if raw arrays ever learn to refuse it, update the docs."""
    x, w = _block_case()
    q32 = vt.quantize_fp8(x, group_size=32)
    wrong = vt.scaled_mm(q32.data, w.data, q32.scale, w.weight_scale, block_size=(16, 48))
    right = seam.matmul_fp8(x, w)
    assert wrong.shape == right.shape and not np.array_equal(wrong, right)


@pytest.mark.parametrize(
    "call, words",
    [
        (
            lambda q, w: vt.scaled_mm(q, w.data, q.scale, w.weight_scale, block_size=(16, 48)),
            "scale_a must be None when a is a vt.QuantizedActivation (its scale, a.scale, is used), got ndarray",
        ),
        (
            lambda q, w: vt.scaled_mm(q, w.data, scale_b=w.weight_scale),
            "block_size must be given for a per-group activation (a.group_size = 48), got None; pass "
            "block_size=(bn, 48) with the weight's block scales",
        ),
        (
            lambda q, w: vt.scaled_mm(q.data, w.data, scale_b=w.weight_scale, block_size=(16, 48)),
            "scale_a must be given with raw codes a (the activation's dequantization scale), got None; or pass the "
            "vt.QuantizedActivation from vt.quantize_fp8 as a",
        ),
        (
            lambda q, w: vt.scaled_mm(q, w.data, block_size=(16, 48)),
            "scale_b must be given (the weight's dequantization scale",
        ),
    ],
)
def test_scaled_mm_with_a_quantized_activation_refuses_what_does_not_fit(call, words):
    x, w = _block_case()
    with pytest.raises(ValueError, match=re.escape(words)):
        call(vt.quantize_fp8(x, group_size=48), w)


def test_a_per_tensor_activation_with_a_block_size_is_refused():
    x, w = _block_case()
    with pytest.raises(
        ValueError,
        match=re.escape(
            "a must be quantized per group of bk = 48 for block_size (16, 48), "
            "got a 'dynamic' activation; quantize with "
            "vt.quantize_fp8(x, group_size=48)"
        ),
    ):
        vt.scaled_mm(vt.quantize_fp8(x), w.data, scale_b=w.weight_scale, block_size=(16, 48))


@pytest.mark.parametrize("kwargs", [{}, {"per_token": True}, {"scale": 0.02}])
def test_scaled_mm_takes_a_per_tensor_or_per_token_activation_as_a(kwargs):
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    w = seam.Fp8Weight.from_float(RNG.standard_normal((24, 64)).astype(np.float32), per_channel=True)
    q = vt.quantize_fp8(x, **kwargs)
    y = vt.scaled_mm(q, w.data, scale_b=w.weight_scale, out_dtype="bfloat16")
    np.testing.assert_array_equal(y, vt.scaled_mm(q.data, w.data, q.scale, w.weight_scale, out_dtype="bfloat16"))
    assert y.dtype == ml_dtypes.bfloat16 and np.count_nonzero(y.astype(np.float32)) == y.size
