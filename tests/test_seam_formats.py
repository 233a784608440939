"""seam.formats: the registry of checkpoint formats behind Fp8Config.from_hf."""

import json
from pathlib import Path

import pytest

from vtnumba import seam
from vtnumba.seam import formats

KNOWN = ("modelopt", "compressed-tensors", "fp8", "mxfp8")


@pytest.fixture
def toy():
    """A toy format registered for one test and removed after it, even when the test fails."""

    @formats.register("toy-fp8", matches=lambda method: method.startswith("toy-fp8"))
    def parse_toy(section):
        return seam.Fp8Config("toy-fp8", "channel", "per_token", tuple(section.get("skip") or ()))

    yield parse_toy
    if "toy-fp8" in formats.names():
        formats.unregister("toy-fp8")


def test_the_registry_lists_every_format_each_from_its_own_module():
    assert formats.names() == KNOWN
    modules = {p.stem for p in Path(formats.__file__).parent.glob("*.py") if p.stem != "__init__"}
    registered = {formats.parser(name).__module__.rsplit(".", 1)[1] for name in formats.names()}
    assert registered == modules, "every module of seam/formats registers a format"


@pytest.mark.parametrize("method", ["gptq", "awq", "bitsandbytes"])
def test_an_unknown_quant_method_is_refused_naming_the_known_ones(method):
    with pytest.raises(ValueError, match=f"got '{method}'") as err:
        seam.Fp8Config.from_hf({"quantization_config": {"quant_method": method}})
    assert f"quant_method must be one of {', '.join(KNOWN)} " in str(err.value)
    with pytest.raises(ValueError, match=f"quant_method must be one of {', '.join(KNOWN)}, got '{method}'"):
        seam.Fp8Config(method)
    with pytest.raises(ValueError, match=f"format name must be one of {', '.join(KNOWN)}, got '{method}'"):
        formats.parser(method)


def test_a_registered_format_is_read_by_from_hf_until_unregistered(toy, tmp_path):
    assert formats.names() == KNOWN + ("toy-fp8",)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "quantization_config": {"quant_method": "TOY-FP8-v2", "skip": ["lm_head"]},
    }
    cfg = seam.Fp8Config.from_hf(config)
    assert cfg == seam.Fp8Config("toy-fp8", "channel", "per_token", ("lm_head",))
    assert cfg.is_ignored("lm_head") and not cfg.is_ignored("model.layers.0.mlp.up_proj")
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert seam.Fp8Config.from_hf(tmp_path) == cfg
    with pytest.raises(ValueError, match="quant_method must be one of .*toy-fp8 .*got 'gptq'"):
        seam.Fp8Config.from_hf({"quant_method": "gptq"})

    formats.unregister("toy-fp8")
    assert formats.names() == KNOWN
    with pytest.raises(ValueError, match=f"quant_method must be one of {', '.join(KNOWN)} .*got 'TOY-FP8-v2'"):
        seam.Fp8Config.from_hf(config)
    with pytest.raises(ValueError, match="quant_method must be one of"):
        seam.Fp8Config("toy-fp8")


def test_the_known_formats_still_parse_through_the_registry():
    assert formats.parse({"quant_method": "fp8", "activation_scheme": "dynamic"}) == seam.Fp8Config("fp8")
    assert formats.parse({"quant_method": "modelopt_fp4", "quant_algo": "FP8"}).quant_method == "modelopt"
    assert formats.parser("mxfp8")({}).mxfp8


def test_register_and_unregister_refuse_bad_names(toy):
    with pytest.raises(ValueError, match="format name must not be registered already, got 'fp8'"):
        formats.register("fp8")(toy)
    with pytest.raises(ValueError, match="format name must not be registered already, got 'toy-fp8'"):
        formats.register("toy-fp8")(toy)
    with pytest.raises(ValueError, match="format name must be a non-empty lower-case string, got 'Toy'"):
        formats.register("Toy")
    with pytest.raises(ValueError, match="format name must be a non-empty lower-case string, got ''"):
        formats.register("")
    with pytest.raises(TypeError, match="matches must be callable"):
        formats.register("toy-2", matches="toy")
    with pytest.raises(TypeError, match="parser must be callable"):
        formats.register("toy-2")("not a function")
    assert "toy-2" not in formats.names()
    with pytest.raises(ValueError, match="format name must be registered, got 'gptq'"):
        formats.unregister("gptq")
