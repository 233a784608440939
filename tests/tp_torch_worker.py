"""One rank of tests/test_parallel_torch.py, started by torchrun: a converted two-layer MLP split
column-then-row over the gloo process group; each rank saves its output to $TP_OUT/rank{R}.npy."""

import os

import numpy as np
import torch
import torch.distributed as dist

import vtnumba.torch as vtt


def model():
    torch.manual_seed(26)
    inter = 256 if os.environ.get("TP_SCHEME") == "per_group" else 32  # per_group: 128 x 128 blocks, 128 per rank
    m = torch.nn.Sequential(torch.nn.Linear(24, inter), torch.nn.GELU(), torch.nn.Linear(inter, 16))
    return vtt.convert(m, os.environ.get("TP_SCHEME", "per_token"))


def main():
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0"
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    calls = []
    real = dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    dist.all_reduce = counted
    m = vtt.shard_model(model(), {"0": "column", "2": "row"}, rank, world)
    x = torch.from_numpy(np.random.default_rng(27).standard_normal((3, 24)).astype(np.float32))
    with torch.no_grad():
        y = m(x)
    assert len(calls) == 1, calls
    np.save(os.path.join(os.environ["TP_OUT"], f"rank{rank}.npy"), y.numpy())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
