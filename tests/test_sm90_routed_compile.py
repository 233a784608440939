"""The routed MoE decode's wgmma kernels (kernels/tc_gemv.py's routed_kernel on the swapped wgmma pass),
offline, no GPU: they assemble for sm_90a with Hopper's native FP8 wgmma (QGMMA), no FP8 unpack, no
spill, no wgmma advisory from ptxas, and within a ceiling of SASS instructions.

Why a ceiling: a routed block runs one warp a scheduler, so its time follows the instructions each
warp issues one after another (Nsight Compute, benchmarks/RESULTS.md 2026-12-03), and the kernel's
code is read cold by every block; a change that adds index arithmetic is seen here, where no timing
would see it. The ceilings are the counts at 2026-12-06 (ecead65) plus about 3%: lower them when a
change takes instructions out. The H200 runs the kernels (tests/test_experts_gpu.py)."""

import pytest
from test_sm120_compile import compile_for  # noqa: F401  (the fixture: ptxas, cuobjdump, NVVM)

from vtnumba.cuda.kernels import tc_gemv

QGMMA = "QGMMA.64"

# (stage, mode, block-scaled) -> the most SASS instructions allowed (the count in the comment)
CEILINGS = {
    ("gate_up", tc_gemv.MODE_STATIC, False): 2010,  # 1,952
    ("gate_up", tc_gemv.MODE_PER_TOKEN, False): 2480,  # 2,408
    ("gate_up", tc_gemv.MODE_PER_GROUP, True): 2100,  # 2,040
    ("down", tc_gemv.MODE_STATIC, False): 2610,  # 2,536
    ("down", tc_gemv.MODE_PER_TOKEN, False): 3170,  # 3,080
    ("down", tc_gemv.MODE_PER_GROUP, True): 2770,  # 2,688
}


@pytest.mark.parametrize("stage,mode,block_scaled", list(CEILINGS))
def test_the_routed_wgmma_kernels_assemble_for_sm_90a_within_their_ceilings(
    compile_for,  # noqa: F811
    stage,
    mode,
    block_scaled,
):
    cfg = tc_gemv.routed_config(stage, block_scaled, wgmma=True)
    # as the H200 compiles it: hardware encoder, float32 chains, no sm_120 unit scales, int64 ids (torch)
    kernel = tc_gemv.routed_kernel(stage, cfg, mode, block_scaled, True, True, False, True)
    arch, record = compile_for((9, 0), kernel)
    assert arch == "sm_90a"
    assert set(record["sass_mma"]) == {QGMMA}, record["sass_mma"]
    assert record["sass_fp8_unpack"] == 0 and record["spill_stores"] == 0, record
    assert record["advisories"] == [], record["advisories"]  # no wgmma serialized, no wait injected
    count, ceiling = record["sass_instructions"], CEILINGS[(stage, mode, block_scaled)]
    assert 500 < count <= ceiling, f"{stage} mode {mode}: {count} SASS instructions, ceiling {ceiling}"
