"""examples/minilm_fp8.py --torch on the CPU: sentence-transformers' own all-MiniLM-L6-v2 with its
Linears converted by vtnumba.torch.convert meets the targets against the unconverted model; and the
float16 export that carries the model to the H200 (examples/export_minilm_fp16.py) rebuilds a model
that embeds the sentences as the float16-rounded weights do and meets the same targets."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ex = _load("minilm_fp8")
export = _load("export_minilm_fp16")

if importlib.util.find_spec(ex.PACKAGE) is None:
    pytest.skip(f"the MiniLM weights ({ex.PACKAGE}, the 'examples' extra) are not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def model():
    return ex.sentence_transformer()


def _meets_targets(result):
    assert result["linear_layers"] == 37  # 6 layers x 6 Linears, and the pooler's
    for label in ("fp8-static", "fp8-per-token"):
        fig = result["variants"][label]
        assert fig["sentences"] == len(ex.SENTENCES) == 12
        assert fig["mean_cosine"] >= 0.99, (label, fig)
        assert fig["nearest_same"] == fig["sentences"], (label, fig)
        assert fig["min_cosine"] < 1.0  # really quantized: the embeddings moved


def test_torch_model_converted_meets_the_targets(model):
    from test_minilm_example import SENTENCE_TRANSFORMERS

    reference = ex.encode(model, ex.SENTENCES)  # the reference is sentence-transformers' model itself
    for row, values in SENTENCE_TRANSFORMERS.items():
        np.testing.assert_allclose(reference[row, :6], values, atol=2e-6)
    _meets_targets(ex.run_torch(model=model))
    assert not any(type(m).__name__ == "Fp8Linear" for m in model.modules())  # converted copies only


def test_fp16_export_rebuilds_the_model(tmp_path, model):
    path = export.export(tmp_path)
    assert path.stat().st_size < 24e6  # the 64 MiB carry holds it beside the wheels
    rebuilt = ex.sentence_transformer_from_fp16(tmp_path)
    want, got = ex.encode(model, ex.SENTENCES), ex.encode(rebuilt, ex.SENTENCES)
    cos = np.sum(want * got, axis=1)
    assert cos.min() > 0.9999 and np.abs(want - got).max() > 0  # float16-rounded weights: close, not equal
    _meets_targets(ex.run_torch(model=rebuilt))
    with pytest.raises(ex.ExampleError, match="must keep the embedding rows of every token the sentences use"):
        ex.sentence_transformer_from_fp16(tmp_path, needed=("A quokka plays the xylophone.",))
    with pytest.raises(ex.ExampleError, match="fp16 dir must hold model_fp16.safetensors"):
        ex.sentence_transformer_from_fp16(tmp_path / "missing")


def test_cli_torch_mode_is_wired(monkeypatch, capsys):
    calls = []

    def fake(model_dir, device, fp16_dir=None):
        calls.append((model_dir, device, fp16_dir))
        return {
            "device": "cpu (torch)",
            "linear_layers": 37,
            "calibration_sentences": 5,
            "variants": {
                "float32": {"seconds": 0.1},
                "fp8-static": dict(
                    sentences=12,
                    mean_cosine=0.995,
                    min_cosine=0.99,
                    neighbours=2,
                    nearest_same=12,
                    order_same=5,
                    seconds=0.2,
                ),
            },
        }

    monkeypatch.setattr(ex, "run_torch", fake)
    assert ex.main(["--torch", "--fp16-dir", "somewhere"]) == 0
    assert calls == [(None, "cpu", "somewhere")] and "fp8-static" in capsys.readouterr().out
