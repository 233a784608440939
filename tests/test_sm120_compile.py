"""GB10 and Blackwell workstations without the GPU (none is at hand to run them): the kernels that run there compile to
PTX for compute capability 12.1 and 12.0 and assemble with ptxas for the arch-specific sm_121a /
sm_120a, and their SASS is what the design says -- the block-scaled kernels issue the native
``QMMA.SF.16832.F32.E4M3.E4M3.E8`` (MXFP8 with real scales, the other formats with unit scales) and
no FP8-to-f16 conversion (F2FP ... UNPACK, sm_90's lowering of the FP8 mma) anywhere, and the MX
tensor-core GEMM spills nothing and converts nothing at all.

It needs numba-cuda's NVVM and the CUDA 13 tools (``nvidia-nvvm``, ``nvidia-cuda-nvcc`` for ptxas,
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``; the ``test`` extra installs them on Linux) and
skips, naming what is missing, where they are not. No GPU: numba-cuda's "current device" is stood in
for (docs/DEVICE.md, "Compiling for a GPU you do not have"). tools/ptx_report.py --cc 12.1 --sass
builds the whole inventory the same way."""

import os
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # the repository's tools/
ptx_report = pytest.importorskip("tools.ptx_report", reason="needs the repository's tools/ (a source checkout)")

TARGETS = [((12, 1), "sm_121a"), ((12, 0), "sm_120a")]


def _toolchain_reason():
    path = ptx_report.tool_path()
    missing = [tool for tool in ("ptxas", "cuobjdump", "nvdisasm") if shutil.which(tool, path=path) is None]
    if missing:
        return (
            f"needs the CUDA 13 tools {', '.join(missing)} (pip install nvidia-cuda-nvcc nvidia-cuda-cuobjdump "
            f"nvidia-cuda-nvdisasm: the test extra on Linux)"
        )
    try:
        from numba.cuda.cudadrv import nvvm

        nvvm.NVVM()
    except Exception as exc:  # numba-cuda missing, or no libnvvm (the nvidia-nvvm wheel)
        return f"needs numba-cuda with NVVM (pip install numba-cuda nvidia-nvvm): {type(exc).__name__}: {exc}"
    return None


@pytest.fixture
def compile_for(monkeypatch):
    reason = _toolchain_reason()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("PATH", ptx_report.tool_path())
    import numba.cuda.dispatcher as dispatcher

    def build(cc, kernel):
        class _Device:  # numba-cuda compiles device functions for "the current device"
            compute_capability = cc

        monkeypatch.setattr(dispatcher, "get_current_device", lambda: _Device())
        ptx = kernel.ptx(cc)
        arch = f"sm_{cc[0]}{cc[1]}{getattr(kernel, '_arch', '')}"
        return arch, {**ptx_report._ptxas(ptx, arch), **ptx_report._sass(ptx, arch)}

    return build


QMMA_SF = "QMMA.SF.16832.F32.E4M3.E4M3.E8"
QMMA = "QMMA.16832.F32.E4M3.E4M3"


@pytest.mark.parametrize("cc,arch", TARGETS, ids=[t[1] for t in TARGETS])
def test_block_scaled_tensor_core_kernels_assemble_to_qmma_sf(compile_for, cc, arch):
    from vtnumba.cuda.kernels import tc_gemm, tc_gemv

    cfg = tc_gemm.GEMM_DEFAULT
    kernels = {
        "tc_gemm mx": tc_gemm.gemm_launcher(cfg, tc_gemm.PER_MMA, False, False, True, "mx"),
        "tc_gemm unit": tc_gemm.gemm_launcher(cfg, tc_gemm.PER_MMA, False, False, False, "unit"),
        "tc_gemm unit block": tc_gemm.gemm_launcher(cfg, tc_gemm.PER_MMA, True, False, True, "unit"),
        "tc_gemv unit m=1": tc_gemv.gemv_launcher(
            1, tc_gemv.gemv_config(1, 4096), tc_gemv.MODE_CODES, False, True, False, True, True
        ),
        "tc_gemv unit m=16 per_group": tc_gemv.gemv_launcher(
            16, tc_gemv.gemv_config(16, 4096), tc_gemv.MODE_PER_GROUP, True, True, False, False, True
        ),
    }
    for label, kernel in kernels.items():
        got_arch, record = compile_for(cc, kernel)
        assert got_arch == arch, label  # the arch-specific target: plain sm_12x refuses the instruction
        assert set(record["sass_mma"]) == {QMMA_SF}, (label, record["sass_mma"])
        assert record["sass_fp8_unpack"] == 0, (label, record)  # native FP8: no operand converted to f16
        assert record["registers"] <= 255, (label, record)
    mx = compile_for(cc, kernels["tc_gemm mx"])[1]
    assert mx["spill_stores"] == mx["spill_loads"] == 0 and mx["sass_f2fp"] == 0, mx  # no conversion at all
    assert mx["sass_mma"][QMMA_SF] >= 16  # every m16 x n8 tile of the warp, per k32 step


@pytest.mark.parametrize("cc,arch", TARGETS, ids=[t[1] for t in TARGETS])
def test_the_other_gpu_kernels_assemble_for_sm12x(compile_for, cc, arch):
    """The MX quantization kernels, the CUDA-core block kernel on E8M0 bytes and the plain-mma MX GEMM
    (sm_89 / sm_90's) compile for 12.x too (its native QMMA, no conversion)."""
    from vtnumba.cuda.kernels import quant, tc_gemm, tiled

    plain = arch[:-1]
    for label, kernel in {
        "quant per_group e8m0": quant.per_group_kernel("bfloat16", "hardware", False, "rceil")[0],
        "quant per_group16 e8m0": quant.per_group_vector_kernel("float32", "hardware", False, 2, True, "floor")[0],
        "tiled_block e8m0": tiled.tiled_block_kernel(True, True, True),
    }.items():
        got_arch, record = compile_for(cc, kernel)
        assert got_arch == plain and record["registers"] > 0, (label, record)
    got_arch, record = compile_for(
        cc, tc_gemm.gemm_launcher(tc_gemm.GEMM_DEFAULT, "per_mma", False, False, True, "mx_explicit")
    )
    assert got_arch == plain and set(record["sass_mma"]) == {QMMA} and record["sass_fp8_unpack"] == 0, record


def test_the_toolchain_reason_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(ptx_report, "tool_path", lambda: os.devnull)  # a PATH with nothing on it
    reason = _toolchain_reason()
    assert "ptxas" in reason and "cuobjdump" in reason and "nvidia-cuda-nvcc" in reason


@pytest.mark.parametrize("cc,arch", TARGETS, ids=[t[1] for t in TARGETS])
def test_the_moe_kernels_assemble_for_sm12x(compile_for, cc, arch):
    """GB10's mixture of experts: the grouped tensor-core GEMV issues the native block-scaled QMMA.SF
    (unit scales) with no FP8 unpack, so do the routed decode's GEMVs (no spill either) and the
    grouped tiled GEMM (unit and MXFP8 scales), and the
    CUDA-core grouped GEMM (E8M0 MXFP8 scales too), the active-experts map, the row tile map, align,
    SiLU-quantize and combine kernels assemble for 12.x."""
    from vtnumba.cuda.kernels import grouped_gemm, moe, tc_gemm, tc_gemv

    plain = arch[:-1]
    # the grouped tiled GEMM (prefill) on the block-scaled mma, unit scales and MXFP8's
    for kind in ("unit", "mx"):
        kernel = tc_gemm.gemm_launcher(tc_gemm.GEMM_DEFAULT, "per_mma", False, False, False, kind, True)
        got_arch, record = compile_for(cc, kernel)
        assert got_arch == arch and set(record["sass_mma"]) == {QMMA_SF}, (kind, record["sass_mma"])
        assert record["sass_fp8_unpack"] == 0 and record["spill_stores"] == 0, (kind, record)
    for label, rows, block in (("codes", 8, False), ("codes", 16, False), ("block", 8, True)):
        kernel = tc_gemv.gemv_launcher(
            rows, tc_gemv.gemv_config(rows, 2048), tc_gemv.MODE_CODES, block, True, False, False, True, True
        )
        got_arch, record = compile_for(cc, kernel)
        assert got_arch == arch and set(record["sass_mma"]) == {QMMA_SF}, (label, rows, record["sass_mma"])
        assert record["sass_fp8_unpack"] == 0 and record["registers"] <= 255, (label, rows, record)
    # the routed decode's two GEMVs (no align): per-token, static and 1 x 128 group activations
    for stage in tc_gemv.ROUTED_STAGES:
        for mode, block in (
            (tc_gemv.MODE_PER_TOKEN, False),
            (tc_gemv.MODE_STATIC, False),
            (tc_gemv.MODE_PER_GROUP, True),
        ):
            kernel = tc_gemv.routed_kernel(
                stage, tc_gemv.routed_config(stage, block), mode, block, True, False, True, True
            )
            got_arch, record = compile_for(cc, kernel)
            assert got_arch == arch and set(record["sass_mma"]) == {QMMA_SF}, (stage, mode, record["sass_mma"])
            assert record["sass_fp8_unpack"] == 0 and record["spill_stores"] == 0, (stage, mode, record)
    for label, kernel in {
        "grouped mx": grouped_gemm.grouped_launcher(1, 4, 128, 2, True, True, True, True, False),
        "grouped per-channel": grouped_gemm.grouped_launcher(4, 2, 128, 1, False, False, False, True, True),
        "grouped_general": grouped_gemm.general_launcher(False, True, True),
        "active experts": moe.active_experts_kernel(),
        "row tiles": moe.row_tiles_kernel(),
        "align": moe.align_kernel(True),
        "silu per_group e8m0": moe.silu_kernel(moe.SiluMode.PER_GROUP, "hardware", False, "rceil"),
        "combine": moe.combine_kernel(moe.WeightKind.FLOAT32, False),
    }.items():
        got_arch, record = compile_for(cc, kernel)
        assert got_arch == plain and record["registers"] > 0 and record["spill_stores"] == 0, (label, record)
