"""Tensor parallelism's communication on GPUs (the H200 run proves these, CI skips them).

One GPU runs a communicator of one rank: NCCL's all-reduce is then a copy, but the calls, the streams
and the CUDA graph capture are the real ones, through torch.distributed (NCCL backend) and through
cupy.cuda.nccl. With two GPUs or more, torchrun starts a rank a GPU and the split MLP must give the
same bytes on every rank, replayed from a CUDA graph too (tests/tp_torch_worker.py)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vtnumba import seam

pytestmark = pytest.mark.gpu
HERE = Path(__file__).parent
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off in every process


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torch_nccl_all_reduce_runs_on_the_stream_and_captures_on_one_rank():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1, device_id=torch.device("cuda", 0)
    )
    try:
        gen = torch.Generator(device="cuda").manual_seed(0)
        partial = torch.randn(5, 48, device="cuda", generator=gen)
        bias = torch.randn(48, device="cuda", generator=gen)
        want = (partial + bias).to(torch.bfloat16)
        all_reduce = seam.torch_all_reduce()
        buf = partial.clone()
        np.testing.assert_array_equal(
            seam.combine_partials(buf, all_reduce, bias=bias, out_dtype=torch.bfloat16).view(torch.int16).cpu().numpy(),
            want.view(torch.int16).cpu().numpy(),
        )
        graph = torch.cuda.CUDAGraph()
        static = partial.clone()
        with torch.cuda.graph(graph):
            out = seam.combine_partials(static, all_reduce, bias=bias, out_dtype=torch.bfloat16)
        static.copy_(partial)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.count_nonzero(out) > 0
    finally:
        dist.destroy_process_group()


def test_cupy_nccl_all_reduce_captures_on_one_rank(cp):
    from cupy.cuda import nccl

    import vtnumba.cuda as gpu

    if not nccl.available:
        pytest.skip("cupy's NCCL binding found no libnccl here")
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    rng = np.random.default_rng(1)
    partial = cp.asarray(rng.standard_normal((4, 40)).astype(np.float32))
    bias = cp.asarray(rng.standard_normal(40).astype(np.float32))
    all_reduce = seam.nccl_all_reduce(comm)
    want = cp.asnumpy(partial + bias)
    got = seam.combine_partials(partial.copy(), all_reduce, bias=bias)
    np.testing.assert_array_equal(cp.asnumpy(got), want)
    replay = gpu.capture(lambda p: seam.combine_partials(p, all_reduce, bias=bias), partial.copy())
    np.testing.assert_array_equal(cp.asnumpy(replay(partial.copy())), want)
    assert np.count_nonzero(want) > 0


@pytest.mark.parametrize("scheme", ["per_token", "per_group"])
def test_torchrun_nccl_ranks_agree_eager_and_replayed(tmp_path, scheme):
    torch = pytest.importorskip("torch")
    world = torch.cuda.device_count()
    if world < 2:
        pytest.skip(f"needs two GPUs for two NCCL ranks (NCCL refuses two ranks on one GPU), found {world}")
    env = dict(
        os.environ,
        NCCL_NVLS_ENABLE="0",
        TP_OUT=str(tmp_path),
        TP_SCHEME=scheme,
        TP_BACKEND="nccl",
        PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        str(HERE / "tp_torch_worker.py"),
    ]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ys = [np.load(tmp_path / f"rank{r}.npy") for r in range(2)]
    np.testing.assert_array_equal(ys[0], ys[1])
    assert np.count_nonzero(ys[0]) > 0
