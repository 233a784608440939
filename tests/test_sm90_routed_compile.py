"""The routed MoE decode's launches on the swapped wgmma pass (kernels/tc_gemv.py, "the routed GEMVs")
with K split over a thread block cluster, offline, no GPU: the launch's grid and the cluster its PTX
declares agree (the pair on blockIdx.y, the split's rank on blockIdx.z), a block's ring is no deeper
than its K blocks, and both stages' kernels assemble for sm_90a with Hopper's native FP8 wgmma
(QGMMA), no FP8 unpack, no spill, the split ones with the cluster barrier and the distributed
shared-memory reads (the H200 runs them: tests/test_experts_gpu.py)."""

from types import SimpleNamespace

import numpy as np
import pytest
from test_sm120_compile import compile_for  # noqa: F401  (the fixture: ptxas, cuobjdump, NVVM)

from vtnumba.cuda.kernels import tc_gemv

QGMMA = "QGMMA.64"  # QGMMA.64x8x32.F32.E4M3.E4M3 (the report cuts the name at its lowercase x)
# Qwen3-30B-A3B at one token: H = 2048, I = 768, top-8 of 128 experts
H, INTER, TOP_K, EXPERTS = 2048, 768, 8, 128


def _launch(stage, config, block_scaled=False):
    """routed_launch's (kernel, grid, block, args, shared bytes) for Qwen3-30B-A3B at one token, on
    host arrays of the right shapes and an sm_90 stand-in (nothing is compiled or run)."""
    cfg = tc_gemv.ROUTED_WGMMA_CONFIGS[config]
    dev = SimpleNamespace(cc=(9, 0), sm_count=132, placeholder=lambda kind: np.zeros(1, np.float32))
    n, k = (2 * INTER, H) if stage == "gate_up" else (H, INTER)
    b = np.zeros((EXPERTS * n, k), np.uint8)
    sb = np.zeros(EXPERTS, np.float32)
    ids = np.arange(TOP_K, dtype=np.int32)
    arrivals = np.zeros(tc_gemv.routed_tiles(H, block_scaled), np.int32)
    x = np.zeros((1, H) if stage == "gate_up" else (TOP_K, INTER), np.uint16)
    head = (stage, x, 0, np.zeros(1, np.float32), 0, b, sb, 0, tc_gemv.MODE_PER_TOKEN, block_scaled)
    if stage == "gate_up":
        hidden, act = np.zeros((TOP_K, 2 * INTER), np.float32), np.zeros((TOP_K, INTER), np.float32)
        return tc_gemv.routed_launch(*head, hidden, ids, EXPERTS, TOP_K, arrivals, dev, act=act, config=cfg)
    y, out = np.zeros((TOP_K, H), np.float32), np.zeros((1, H), np.uint16)
    return tc_gemv.routed_launch(
        *head, y, ids, EXPERTS, TOP_K, arrivals, dev, w=np.zeros(TOP_K, np.float32), layer_out=out, out_kind=0,
        config=cfg,
    )  # fmt: skip


@pytest.mark.parametrize(
    "stage,config,grid,shared",
    [
        # gate_up: 768 / 32 = 24 paired column tiles; 16 K blocks, 8 / 4 a rank at split 2 / 4
        ("gate_up", "wg_s4", (24, 8), 50688),
        ("gate_up", "wg_s4_k2", (24, 8, 2), 50688),
        ("gate_up", "wg_s5_k4", (24, 8, 4), 50688),  # the ring holds a rank's 4 K blocks, not 5
        # down: 2048 / 64 = 32 column tiles; 6 K blocks, 3 / 2 a rank at split 2 / 3
        ("down", "wg_s6", (32, 8), 56512),
        ("down", "wg_s6_k2", (32, 8, 2), 31936),
        ("down", "wg_s3_k3", (32, 8, 3), 23744),
    ],
)
def test_a_split_routed_launch_is_one_cluster_per_pairs_tile(stage, config, grid, shared):
    kernel, got_grid, block, _, got_shared = _launch(stage, config)
    kernel = getattr(kernel, "kernel", kernel)  # (a DynamicSharedKernel wraps it above 48 KB)
    split = tc_gemv.ROUTED_WGMMA_CONFIGS[config].split
    assert got_grid == grid and block == 128 and got_shared == shared
    assert kernel.pyfunc.__name__ == f"routed_{stage}_wgmma"
    # the cluster spans the grid's z (the rank) and nothing else: blockIdx.z is the rank in the cluster
    assert kernel._cluster == ((1, 1, split) if split > 1 else None)
    assert split == 1 or got_grid[2] == split


def test_the_sweep_splits_k_in_clusters_of_two_to_four():
    configs = tc_gemv.ROUTED_WGMMA_CONFIGS
    assert {name: cfg.split for name, cfg in configs.items() if cfg.split > 1} == {
        "wg_s3_k2": 2,
        "wg_s4_k2": 2,
        "wg_s6_k2": 2,
        "wg_s3_k3": 3,
        "wg_s3_k4": 4,
        "wg_s5_k4": 4,
    }
    # the choice stays unsplit until an H200 sweep says otherwise
    assert all(configs[name].split == 1 for name in tc_gemv.ROUTED_WGMMA_CHOICE.values())


SPLITS = [
    (stage, config, mode, block_scaled)
    for stage in tc_gemv.ROUTED_STAGES
    for config in ("wg_s4", "wg_s4_k2", "wg_s3_k3")
    for mode, block_scaled in ((tc_gemv.MODE_PER_TOKEN, False), (tc_gemv.MODE_PER_GROUP, True))
]


@pytest.mark.parametrize("stage,config,mode,block_scaled", SPLITS)
def test_the_split_routed_kernels_assemble_for_sm_90a(compile_for, stage, config, mode, block_scaled):  # noqa: F811
    cfg = tc_gemv.ROUTED_WGMMA_CONFIGS[config]
    kernel = tc_gemv.routed_kernel(stage, cfg, mode, block_scaled, True, False, True, True)
    arch, record = compile_for((9, 0), kernel)
    assert arch == "sm_90a"
    assert set(record["sass_mma"]) == {QGMMA}, record["sass_mma"]
    assert record["sass_fp8_unpack"] == 0 and record["spill_stores"] == 0, record
    ptx = kernel.ptx((9, 0))
    clustered = cfg.split > 1
    assert (f".reqnctapercluster 1, 1, {cfg.split}" in ptx) == clustered
    assert ("barrier.cluster.arrive.release" in ptx and "mapa.shared::cluster" in ptx) == clustered
    # the rank is blockIdx.z; the pair stays blockIdx.y
    assert ("%ctaid.z" in ptx) == clustered and "%ctaid.y" in ptx
