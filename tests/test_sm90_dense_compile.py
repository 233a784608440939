"""The dense decode layer on the swapped wgmma pass (kernels/tc_gemv.py), offline, no GPU: how its K
is split over a cluster for a weight shape, the cluster shape written into the PTX, and the kernels
assembled for sm_90a with Hopper's native FP8 wgmma (QGMMA), no FP8 unpack, no spill, the split forms
with the cluster barrier and the distributed shared-memory reads (the H200 runs them:
tests/test_dense_wgmma_gpu.py)."""

import re

import pytest
from test_sm120_compile import compile_for  # noqa: F401  (the fixture: ptxas, cuobjdump, NVVM)

from vtnumba.cuda.kernels import tc_gemv
from vtnumba.cuda.runtime.launch import with_cluster_dims

QGMMA = "QGMMA.64"  # QGMMA.64x8x32.F32.E4M3.E4M3 (the report cuts the name at its lowercase x)


def test_the_split_follows_the_tiles():
    # (N, K) -> (split, stages) on the H200's 132 multiprocessors: at most a block a multiprocessor
    assert tc_gemv.dense_wgmma_split(4096, 2048, 132) == (2, 5)  # Qwen3-30B-A3B q_proj
    assert tc_gemv.dense_wgmma_split(2048, 4096, 132) == (4, 5)  # its o_proj
    assert tc_gemv.dense_wgmma_split(512, 2048, 132) == (8, 3)  # its k_proj, v_proj
    assert tc_gemv.dense_wgmma_split(28672, 4096, 132) == (1, 5)  # 448 tiles: no split
    assert tc_gemv.dense_wgmma_split(64, 256, 132) == (2, 2)  # no more blocks than K blocks
    assert tc_gemv.dense_wgmma_split(96, 2176, 132) == (6, 4)  # 17 K blocks: 6 blocks of 3, none idle


def test_the_dense_wgmma_launch_is_chosen_where_the_h200_measured_it_fastest(monkeypatch):
    """dense_wgmma_reason on an H200's numbers (sm_90, 132 multiprocessors), no GPU: one row, per-tensor
    or per-token scales, at most 66 64-row tiles (tc_gemv's table above DENSE_WGMMA_CHOSEN_MAX_M); every
    other call keeps the GEMV or cuBLASLt, and the two levers turn it off. The H200 pins the kernel
    that then runs (tests/test_dense_wgmma_gpu.py)."""
    from types import SimpleNamespace

    from vtnumba.cuda.ptx import sm90_wgmma

    monkeypatch.setattr(tc_gemv, "SIMULATOR", False)
    monkeypatch.setattr(sm90_wgmma, "available", lambda cc: tuple(cc) == (9, 0))
    monkeypatch.delenv("VT_DISABLE_KERNELS", raising=False)
    monkeypatch.delenv("VT_DENSE_CUBLASLT_FP8", raising=False)
    h200 = SimpleNamespace(cc=(9, 0), sm_count=132)
    chosen = [
        (n, k, mode)
        for n, k in [(4096, 2048), (512, 2048), (2048, 4096), (4096, 4096), (4224, 2048), (4288, 2048)]
        for mode in (tc_gemv.MODE_STATIC, tc_gemv.MODE_DYNAMIC, tc_gemv.MODE_PER_TOKEN, tc_gemv.MODE_PER_GROUP)
        if tc_gemv.dense_wgmma_reason(1, k, mode, h200, n) is None
    ]
    assert {(n, k) for n, k, _ in chosen} == {(4096, 2048), (512, 2048), (2048, 4096), (4096, 4096), (4224, 2048)}
    assert {mode for _, _, mode in chosen} == {tc_gemv.MODE_STATIC, tc_gemv.MODE_DYNAMIC, tc_gemv.MODE_PER_TOKEN}
    assert "M = 2" in tc_gemv.dense_wgmma_reason(2, 2048, tc_gemv.MODE_PER_TOKEN, h200, 4096)
    assert "fill the GPU" in tc_gemv.dense_wgmma_reason(1, 4096, tc_gemv.MODE_PER_TOKEN, h200, 28672)
    assert "sm_90" in tc_gemv.dense_wgmma_reason(1, 2048, tc_gemv.MODE_PER_TOKEN, SimpleNamespace(cc=(12, 1)), 4096)
    monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", "0")
    assert "VT_DENSE_CUBLASLT_FP8" in tc_gemv.dense_wgmma_reason(1, 2048, tc_gemv.MODE_PER_TOKEN, h200, 4096)
    monkeypatch.delenv("VT_DENSE_CUBLASLT_FP8")
    monkeypatch.setenv("VT_DISABLE_KERNELS", tc_gemv.DENSE_WGMMA_KERNEL)
    assert "VT_DISABLE_KERNELS" in tc_gemv.dense_wgmma_reason(1, 2048, tc_gemv.MODE_PER_TOKEN, h200, 4096)


def test_the_cluster_shape_goes_before_the_kernel_body():
    ptx = ".visible .entry k(\n\t.param .u64 a\n)\n.maxntid 128, 1, 1\n{\n\tret;\n}\n"
    out = with_cluster_dims(ptx, (1, 4, 1))
    assert out.index(".reqnctapercluster 1, 4, 1") < out.index("{") and out.count(".reqnctapercluster") == 1
    with pytest.raises(RuntimeError, match="no .entry"):
        with_cluster_dims(".version 8.0\n", (1, 2, 1))


@pytest.mark.parametrize(
    "m,split,stages,mode,block_scaled",
    [
        (1, 8, 3, tc_gemv.MODE_PER_TOKEN, False),
        (8, 2, 5, tc_gemv.MODE_STATIC, False),
        (4, 4, 5, tc_gemv.MODE_DYNAMIC, False),
        (1, 4, 5, tc_gemv.MODE_PER_GROUP, True),
        (4, 2, 5, tc_gemv.MODE_CODES, False),
        (2, 1, 5, tc_gemv.MODE_CODES, True),
    ],
)
def test_the_dense_wgmma_kernels_assemble_for_sm_90a(compile_for, m, split, stages, mode, block_scaled):  # noqa: F811
    kernel = tc_gemv.dense_wgmma_kernel(m, split, stages, mode, block_scaled, True, False)
    arch, record = compile_for((9, 0), kernel)
    assert arch == "sm_90a"
    assert set(record["sass_mma"]) == {QGMMA}, record["sass_mma"]
    assert record["sass_fp8_unpack"] == 0 and record["spill_stores"] == 0, record
    assert record["advisories"] == [], record["advisories"]  # no wgmma serialized, no wait injected
    ptx = kernel.ptx((9, 0))
    clustered = split > 1
    assert (f".reqnctapercluster 1, {split}, 1" in ptx) == clustered
    assert ("barrier.cluster.arrive.release" in ptx and "mapa.shared::cluster" in ptx) == clustered


@pytest.mark.parametrize(
    "stages,block_scaled,out_is_float32", [(2, False, False), (4, False, True), (4, True, False), (3, True, True)]
)
def test_the_grouped_wgmma_gemv_assembles_for_sm_90a(compile_for, stages, block_scaled, out_is_float32):  # noqa: F811
    """The MoE decode's grouped GEMV on the same pass (grid rows the active experts, 8 rows a pass):
    native FP8 wgmma only, no unpack, no spill, no wgmma serialized; the codes reach shared memory
    by cp.async (16 bytes a copy), not by byte loads."""
    kernel = tc_gemv.grouped_wgmma_kernel(stages, block_scaled, True, out_is_float32)
    arch, record = compile_for((9, 0), kernel)
    assert arch == "sm_90a"
    assert set(record["sass_mma"]) == {QGMMA}, record["sass_mma"]
    assert record["sass_fp8_unpack"] == 0 and record["spill_stores"] == 0, record
    assert record["advisories"] == [], record["advisories"]
    ptx = kernel.ptx((9, 0))
    loads = set(re.findall(r"\bld\.[.\w]*u8\b", ptx))  # byte loads (the old copy's ld.u8)
    assert "cp.async.cg.shared.global" in ptx and not loads, loads
