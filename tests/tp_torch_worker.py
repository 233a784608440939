"""One rank of tests/test_parallel_torch.py (gloo, CPU) and tests/test_parallel_gpu.py (TP_BACKEND=nccl,
a GPU a rank), started by torchrun: a converted two-layer MLP split column-then-row over the process
group; each rank saves its output to $TP_OUT/rank{R}.npy. On NCCL the rank also captures the forward
in a CUDA graph (the all-reduce inside it) and checks that the replay gives the eager bytes."""

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
    backend = os.environ.get("TP_BACKEND", "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    calls = []
    real = dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    dist.all_reduce = counted
    m = vtt.shard_model(model(), {"0": "column", "2": "row"}, rank, world)
    x = torch.from_numpy(np.random.default_rng(27).standard_normal((3, 24)).astype(np.float32))
    if backend == "nccl":
        m, x = m.cuda(), x.cuda()
    with torch.no_grad():
        y = m(x)
    assert len(calls) == (1 if world > 1 else 0), calls  # one rank: nothing to reduce
    if backend == "nccl":
        with torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                m(x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y_graph = m(x)
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_graph, y), (y_graph, y)
        y = y.cpu()
    np.save(os.path.join(os.environ["TP_OUT"], f"rank{rank}.npy"), y.numpy())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
