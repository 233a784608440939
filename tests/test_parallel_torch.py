"""vtnumba.torch's tensor parallelism over a real process group: torchrun starts two CPU processes
on the gloo backend (the NCCL path needs two GPUs; not run here). Their outputs must be the same on
both ranks and bit for bit the one-process simulation of seam.parallel (two float32 partials have
one sum whatever the order)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import vtnumba.torch as vtt  # noqa: E402
from vtnumba import seam  # noqa: E402
from vtnumba.testing.parallel import SimulatedGroup  # noqa: E402

HERE = Path(__file__).parent


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["per_token", "per_group"])
def test_torchrun_two_ranks_gloo_match_the_simulation(tmp_path, scheme):
    env = dict(
        os.environ,
        NCCL_NVLS_ENABLE="0",
        TP_OUT=str(tmp_path),
        TP_SCHEME=scheme,
        OMP_NUM_THREADS="1",
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
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ys = [np.load(tmp_path / f"rank{r}.npy") for r in range(2)]
    np.testing.assert_array_equal(ys[0], ys[1])

    sys.path.insert(0, str(HERE))
    try:
        os.environ["TP_SCHEME"] = scheme
        import tp_torch_worker

        model = tp_torch_worker.model()
    finally:
        sys.path.remove(str(HERE))
        os.environ.pop("TP_SCHEME", None)
    up, down = model[0].fp8_weight, model[2].fp8_weight
    x = np.random.default_rng(27).standard_normal((3, 24)).astype(np.float32)

    def rank_mlp(rank, all_reduce):
        h = seam.ColumnParallelLinearMethod(up, rank, 2).apply(x)
        h = torch.nn.functional.gelu(torch.from_numpy(h)).numpy()
        return seam.RowParallelLinearMethod(down, rank, 2, all_reduce).apply(h)

    group = SimulatedGroup(2)
    want = group.run(rank_mlp)[0]
    assert group.calls == 1 and np.count_nonzero(want) > 0
    np.testing.assert_array_equal(ys[0], want)


def test_shard_model_refuses_a_name_that_is_not_an_fp8_linear():
    m = vtt.convert(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), "dynamic")
    with pytest.raises(ValueError, match=r"plan names '1', which must be an Fp8Linear of model, got ReLU"):
        vtt.shard_model(m, {"1": "row"}, 0, 1)
    with pytest.raises(ValueError, match=r"mode must be 'column' or 'row', got 'diag'"):
        vtt.shard_linear(m[0], 0, 1, mode="diag")


def test_world_size_one_row_layer_is_the_layer_within_g3():
    torch.manual_seed(0)
    layer = vtt.convert(torch.nn.Linear(16, 8), "static", input_scales={"": 0.02})
    x = torch.randn(4, 16)
    with torch.no_grad():
        y = vtt.shard_linear(layer, 0, 1, mode="row")(x)
        want = layer(x)
    assert y.dtype == want.dtype and torch.allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_tensor_parallel_example_runs_under_torchrun_on_cpus(tmp_path):
    """examples/tensor_parallel.py as the README launches it (torchrun; gloo where there is no GPU):
    two ranks and one give the same shape, and sums within the FP8 bounds of each other."""
    sums = []
    for ranks in (2, 1):
        env = dict(
            os.environ,
            NCCL_NVLS_ENABLE="0",
            OMP_NUM_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
            PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
        )
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={ranks}",
            "--nnodes=1",
            "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}",
            str(HERE.parent / "examples" / "tensor_parallel.py"),
        ]
        done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        line = [s for s in done.stdout.splitlines() if s.startswith(f"torch, {ranks} rank(s): y (8, 256), sum ")]
        assert len(line) == 1, done.stdout
        sums.append(float(line[0].rsplit(" ", 1)[1]))
    assert abs(sums[0] - sums[1]) < 0.05 * abs(sums[1]) and sums[1] != 0


def test_shard_linear_splits_a_fused_layer_piece_by_piece():
    """A fused q/k layer (seam.fuse_fp8_shards records the pieces' widths): each rank gets its share
    of q and its share of k, as seam.ColumnParallelLinearMethod and vLLM's QKVParallelLinear do."""
    rng = np.random.default_rng(31)
    q, k = (
        seam.Fp8Weight.from_float(
            (rng.standard_normal((n, 16)) * 0.1).astype(np.float32), per_channel=True, activation_scheme="per_token"
        )
        for n in (8, 4)
    )
    layer = vtt.Fp8Linear(seam.fuse_fp8_shards([q, k]))
    shard = vtt.shard_linear(layer, 1, 2, mode="column")
    np.testing.assert_array_equal(np.asarray(shard.fp8_weight.data), np.concatenate([q.data[4:], k.data[2:]]))
    assert shard.out_features == 6
