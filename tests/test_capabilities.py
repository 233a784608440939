"""vtnumba.cuda.capabilities: the rules per GPU (checked here for GPUs this machine does not have),
the report without a GPU, on the GPU, and under the CUDA simulator."""

import json

import pytest

import vtnumba.cuda
from vtnumba.cuda.capabilities import PATHS, Capabilities, capabilities, path_rules, version_text
from vtnumba.cuda.runtime import cublaslt

KEYS = [key for key, _ in PATHS]
CUBLASLT_12_9, CUBLASLT_13_1, CUBLASLT_12_8 = 120900, 130100, 120800


def runs(rules):
    """The paths the rules allow."""
    assert list(rules) == KEYS  # every path, in the report's order
    return {key for key, why in rules.items() if why is None}


def test_hopper_h100_h200_runs_every_path_but_sm12x_s():
    assert runs(path_rules((9, 0), CUBLASLT_12_9)) == set(KEYS) - {"tensor_core_block_scaled_mma"}
    assert runs(path_rules((9, 0), CUBLASLT_13_1)) == set(KEYS) - {"tensor_core_block_scaled_mma"}
    # before cuBLASLt 12.9: per-tensor only among the cuBLASLt modes
    old = path_rules((9, 0), CUBLASLT_12_8)
    assert runs(old) == {
        "cublaslt_per_tensor",
        "hardware_e4m3_cvt",
        "tensor_core_mma",
        "tensor_core_wgmma",
        "mxfp8_tensor_core",
    }
    assert "cuBLASLt >= 12.9" in old["cublaslt_outer_vector"] and "cuBLASLt >= 12.9" in old["cublaslt_block_128x128"]
    assert "12.8.0" in old["cublaslt_block_128x128"]


def test_gb10_has_no_128x128_block_mode_and_takes_the_block_scaled_mma():
    for cc in ((12, 1), (12, 0)):
        rules = path_rules(cc, CUBLASLT_13_1)
        assert runs(rules) == set(KEYS) - {"cublaslt_block_128x128", "tensor_core_wgmma"}
        assert rules["tensor_core_block_scaled_mma"] is None and rules["mxfp8_tensor_core"] is None
    assert "sm_120a / sm_121a" in path_rules((10, 0), CUBLASLT_13_1)["tensor_core_block_scaled_mma"]
    rules = path_rules((12, 1), CUBLASLT_13_1)
    assert rules["tensor_core_wgmma"] == (
        "wgmma is an sm_90a instruction (arch-specific: Hopper only), this GPU is sm_121"
    )
    why = rules["cublaslt_block_128x128"]
    assert "Hopper (sm_90) only" in why and "sm_121" in why and "MXFP8" in why


def test_ada_runs_per_tensor_fp8_but_no_vector_or_block_scales():
    rules = path_rules((8, 9), CUBLASLT_13_1)
    assert runs(rules) == {"cublaslt_per_tensor", "hardware_e4m3_cvt", "tensor_core_mma", "mxfp8_tensor_core"}
    assert "sm_90+" in rules["cublaslt_outer_vector"] and "sm_89" in rules["cublaslt_outer_vector"]
    assert "Hopper (sm_90) only" in rules["cublaslt_block_128x128"] and "MXFP8" not in rules["cublaslt_block_128x128"]


def test_ampere_has_no_fp8_at_all():
    rules = path_rules((8, 0), CUBLASLT_13_1)
    assert runs(rules) == set()
    for key in ("cublaslt_per_tensor", "cublaslt_outer_vector", "cublaslt_block_128x128"):
        assert rules[key] == "cuBLASLt's FP8 GEMM needs FP8 tensor cores (sm_89+), this GPU is sm_80"
    assert "portable encoder" in rules["hardware_e4m3_cvt"]
    assert rules["tensor_core_mma"] == "mma.sync with e4m3 operands needs sm_89+, this GPU is sm_80"


def test_without_cublaslt_the_numba_paths_remain():
    rules = path_rules((9, 0), None, cublaslt_reason="nvmath-python is not installed")
    assert runs(rules) == {"hardware_e4m3_cvt", "tensor_core_mma", "tensor_core_wgmma", "mxfp8_tensor_core"}
    assert rules["cublaslt_per_tensor"] == rules["cublaslt_block_128x128"] == "nvmath-python is not installed"
    assert "11.11" in path_rules((9, 0), 110800)["cublaslt_per_tensor"]  # cuBLASLt before FP8


def test_simulator_runs_no_hardware_path():
    rules = path_rules(None, None, simulator=True)
    assert runs(rules) == set()
    assert all("simulator" in why for why in rules.values())


@pytest.mark.parametrize("cc", [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (12, 1)])
def test_rules_agree_with_the_paths_that_use_them(cc):
    """The report's rules are the ones the GEMM and the encoder apply, not a copy of them."""
    from vtnumba.cuda.ptx.codec import hardware_available
    from vtnumba.cuda.ptx.sm90_wgmma import available as wgmma_available

    for version in (CUBLASLT_12_8, CUBLASLT_12_9):
        rules = path_rules(cc, version)
        if rules["cublaslt_per_tensor"] is None:
            assert rules["cublaslt_outer_vector"] == cublaslt.outer_vec_reason(cc, version)
        assert (rules["hardware_e4m3_cvt"] is None) == hardware_available(cc)
        # the block-scaled mma: the rule the tensor-core kernels' mma choice applies
        from vtnumba.cuda.kernels.tc_gemm import mma_kind_for

        assert (rules["tensor_core_block_scaled_mma"] is None) == (
            mma_kind_for(cc) == "unit" and mma_kind_for(cc, True) == "mx"
        )
        assert (rules["tensor_core_wgmma"] is None) == wgmma_available(cc)


def test_version_text():
    assert version_text(120901) == "12.9.1" and version_text(130100) == "13.1.0"
    assert version_text(12080, 2) == "12.8" and version_text(13010, 2) == "13.1"
    assert version_text(None) is None


def test_report_shows_in_text_html_and_json():
    caps = Capabilities("NVIDIA GB10", (12, 1), 48, "13.0", "13.0", "13.1.0", path_rules((12, 1), CUBLASLT_13_1))
    text = str(caps)
    assert text.splitlines()[0] == "NVIDIA GB10, sm_121, 48 SMs; CUDA runtime 13.0, driver 13.0, cuBLASLt 13.1.0"
    assert len(text.splitlines()) == 1 + len(PATHS)
    assert "128x128 block scales" in text and "no: cuBLASLt's 128x128" in text
    page = caps._repr_html_()
    assert page.count("<tr>") == 1 + len(PATHS) and "NVIDIA GB10" in page
    d = json.loads(json.dumps(caps.as_dict()))
    assert d["cc"] == [12, 1] and d["paths"]["cublaslt_outer_vector"] == {"available": True, "why_not": None}
    assert d["paths"]["cublaslt_block_128x128"]["available"] is False
    assert caps.available("cublaslt_per_tensor") and not caps.available("cublaslt_block_128x128")
    with pytest.raises(ValueError, match="path must be one of"):
        caps.available("int8")


def test_exported_from_vtnumba_cuda():
    assert vtnumba.cuda.capabilities is capabilities


def test_without_a_gpu_it_says_why():
    reason = vtnumba.cuda.gpu_unavailable_reason()
    if reason is None:
        pytest.skip("a usable GPU is present")
    caps = capabilities()
    assert caps.gpu is None and caps.cc is None and caps.reason == reason
    assert not any(caps.available(key) for key in KEYS)
    assert str(caps).splitlines()[0] == f"no GPU: {reason}; kernels built by {caps.compiler}"
    json.dumps(caps.as_dict())


@pytest.mark.gpu
def test_on_the_gpu():
    import cupy

    from vtnumba.cuda.runtime import device

    caps = capabilities()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    assert caps.reason is None and caps.gpu and caps.cc == (props["major"], props["minor"])
    assert caps.sm_count == props["multiProcessorCount"]
    version = device.current().cublaslt().version
    assert caps.cublaslt == version_text(version) and caps.cuda_runtime and caps.cuda_driver
    assert caps.paths == path_rules(caps.cc, version)  # the lever is on by default
    json.dumps(caps.as_dict())


@pytest.mark.gpu
def test_the_lever_turns_the_cublaslt_paths_off(monkeypatch):
    from vtnumba.cuda.runtime import device

    monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", "0")
    caps = capabilities()
    rules = path_rules(caps.cc, device.current().cublaslt().version)
    turned_off = 0
    for key in ("cublaslt_per_tensor", "cublaslt_outer_vector", "cublaslt_block_128x128"):
        if rules[key] is None:  # a path this GPU has: the lever's reason
            assert "VT_DENSE_CUBLASLT_FP8=0" in caps.paths[key]
            turned_off += 1
        else:  # a path it lacks keeps its own reason
            assert caps.paths[key] == rules[key]
    assert turned_off >= 1  # per-tensor FP8 runs on every GPU these tests target (sm_89+)
    assert caps.paths["hardware_e4m3_cvt"] == rules["hardware_e4m3_cvt"]


@pytest.mark.cudasim
def test_under_the_simulator():
    caps = capabilities()
    assert caps.gpu == "CUDA simulator" and caps.reason is None
    assert not any(caps.available(key) for key in KEYS)
    assert all("simulator" in caps.paths[key] for key in KEYS)


def test_the_report_names_the_moe_paths():
    """The MoE paths (moe_path_rules) join the report's lines and its JSON: on sm_89+ the tensor-core
    grouped GEMV and the tiled mma.sync prefill GEMM run (the wgmma one on sm_90 only), before sm_89 the
    CUDA-core grouped kernel does; the per-expert prefill path follows cuBLASLt's per-tensor rule."""
    from vtnumba.cuda.capabilities import MOE_PATHS, moe_path_rules

    for cc, tensor_core, wgmma in (((9, 0), True, True), ((8, 0), False, False), ((12, 1), True, False)):
        rules = path_rules(cc, CUBLASLT_13_1)
        caps = Capabilities(
            "GPU", cc, 132, "13.0", "13.0", "13.1.0", rules, moe_paths=moe_path_rules(cc, rules["cublaslt_per_tensor"])
        )
        lines = str(caps).splitlines()
        assert len(lines) == 1 + len(PATHS) + len(MOE_PATHS)
        assert any("MoE grouped GEMM on CUDA cores" in line and line.endswith("yes") for line in lines)
        d = json.loads(json.dumps(caps.as_dict()))
        assert d["moe_paths"]["moe_grouped_tensor_core"]["available"] is tensor_core
        assert d["moe_paths"]["moe_grouped_tiled_mma"]["available"] is tensor_core
        assert d["moe_paths"]["moe_grouped_tiled_wgmma"]["available"] is wgmma
        assert d["moe_paths"]["moe_routing"] == {"available": True, "why_not": None}


def test_the_report_names_the_compiler_of_the_kernels():
    """capabilities() says which compiler builds the GPU kernels (numba-cuda unless
    VTNUMBA_CUDA_TARGET picks numba-cuda-mlir), in its header line and its JSON, GPU or not."""
    from vtnumba.cuda.capabilities import compiler_text
    from vtnumba.cuda.ptx.target import TARGET, TARGETS

    caps = capabilities()
    assert TARGET in TARGETS and caps.compiler == compiler_text() and caps.compiler.startswith(TARGET + " ")
    assert caps.header().endswith(f"kernels built by {caps.compiler}")
    assert json.loads(json.dumps(caps.as_dict()))["compiler"] == caps.compiler
    rules = path_rules((9, 0), CUBLASLT_13_1)
    gpu = Capabilities("GPU", (9, 0), 132, "13.0", "13.0", "13.1.0", rules, compiler="numba-cuda-mlir 0.6.0")
    assert gpu.header().endswith("; kernels built by numba-cuda-mlir 0.6.0")
