"""all-MiniLM-L6-v2 written as a DeepSeek-V3-format FP8 checkpoint -- quantized by an independent
path (numpy + ml_dtypes: 128 x 128 blocks, bf16 ``weight_scale_inv`` as Qwen3-FP8 ships them,
sharded safetensors with an index, a config.json with ``weight_block_size``) -- then read back
through ``Fp8Config.from_hf`` and the loader: the same embeddings as the same weights held in
memory, and within the FP8 targets of the float32 model."""

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file
from test_minilm_example import ex

from vtnumba import seam

CONFIG = {
    "quantization_config": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [128, 128],
    }
}


def deepseek_block_quantize(w, block=128):
    """(float8_e4m3fn codes, bf16 scale_inv [ceil(N/128), ceil(K/128)]) the way DeepSeek-V3's
    conversion script does it: amax per block, scale = amax / 448, codes = clamp(w / scale)."""
    n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    padded = np.zeros((nb * block, kb * block), np.float32)
    padded[:n, :k] = np.abs(w)
    amax = padded.reshape(nb, block, kb, block).max(axis=(1, 3))
    scale = (np.maximum(amax, np.float32(1e-10)) / np.float32(448.0)).astype(ml_dtypes.bfloat16)
    full = np.repeat(np.repeat(scale.astype(np.float32), block, 0), block, 1)[:n, :k]
    codes = np.clip(w / full, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return codes, scale


@pytest.fixture(scope="module")
def model():
    return ex.MiniLM()


def test_deepseek_format_checkpoint_reads_back_to_the_same_embeddings(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("minilm-deepseek")
    shards, weight_map, in_memory = ({}, {}), {}, {}
    for i, (name, (w, bias)) in enumerate(sorted(model.linear_weights.items())):
        codes, scale = deepseek_block_quantize(w)
        shard = i % 2  # layers spread over two files, found through the index
        tensors = {f"{name}.weight": codes, f"{name}.weight_scale_inv": scale, f"{name}.bias": bias}
        shards[shard].update(tensors)
        weight_map.update({t: f"model-0000{shard + 1}-of-00002.safetensors" for t in tensors})
        in_memory[name] = seam.make_linear_method(
            seam.Fp8Weight(codes.view(np.uint8), scale.astype(np.float32), bias=bias, block_size=(128, 128))
        )
    for shard, tensors in enumerate(shards):
        save_file(tensors, str(root / f"model-0000{shard + 1}-of-00002.safetensors"))
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps(CONFIG))

    cfg = seam.Fp8Config.from_hf(root)
    assert (cfg.weight_block_size, cfg.activation_scheme) == ((128, 128), "per_group")
    loaded = {name: cfg.load_linear(root, name) for name in model.linear_weights}
    assert len(loaded) == 36 and all(m.weight.block_size == (128, 128) for m in loaded.values())
    emb = model.embed(ex.SENTENCES, loaded)
    np.testing.assert_array_equal(emb, model.embed(ex.SENTENCES, in_memory))
    fig = ex.compare(model.embed(ex.SENTENCES, model.float_linears()), emb)
    assert fig["mean_cosine"] >= 0.99 and fig["nearest_same"] == fig["sentences"] == 12
    assert fig["min_cosine"] < 1.0  # really quantized
