"""A converted MLP split over ranks with vtnumba's tensor parallelism, one process a rank.

torch, started by torchrun (NCCL a GPU a rank where there are GPUs, gloo on CPUs):

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 examples/tensor_parallel.py

cupy, started by mpirun (mpi4py hands NCCL's unique id from rank 0 to the others):

    NCCL_NVLS_ENABLE=0 mpirun -n 2 python examples/tensor_parallel.py --cupy

Each rank holds its share of the weights: the up projection split by output features (column
parallel), the down projection by input features (row parallel), so the MLP makes one all-reduce.
Rank 0 prints the result's checksum, the same on every rank and for every number of ranks within
the FP8 bounds (docs/DESIGN.md, "Tensor parallelism"). Keep NVLink multicast off (NCCL_NVLS_ENABLE=0).
"""

import os
import sys

import numpy as np

HIDDEN, INTER = 256, 1024


def float_weights():
    rng = np.random.default_rng(0)
    return (
        (rng.standard_normal((INTER, HIDDEN)) * 0.05).astype(np.float32),
        (rng.standard_normal((HIDDEN, INTER)) * 0.05).astype(np.float32),
        rng.standard_normal((8, HIDDEN)).astype(np.float32),
    )


def with_torch():
    import torch
    import torch.distributed as dist

    import vtnumba.torch as vtt

    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if gpu else "gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    up, down, x = (torch.from_numpy(a) for a in float_weights())
    model = torch.nn.Sequential(
        torch.nn.Linear(HIDDEN, INTER, bias=False), torch.nn.SiLU(), torch.nn.Linear(INTER, HIDDEN, bias=False)
    )
    with torch.no_grad():
        model[0].weight.copy_(up)
        model[2].weight.copy_(down)
    model = vtt.shard_model(vtt.convert(model, "per_token"), {"0": "column", "2": "row"}, rank, world)
    if gpu:
        model, x = model.cuda(), x.cuda()
    with torch.no_grad():
        y = model(x)
    if rank == 0:
        print(f"torch, {world} rank(s): y {tuple(y.shape)}, sum {float(y.double().sum()):.4f}")
    dist.destroy_process_group()


def with_cupy():
    import cupy as cp
    from cupy.cuda import nccl
    from mpi4py import MPI

    from vtnumba import seam

    mpi = MPI.COMM_WORLD
    rank, world = mpi.Get_rank(), mpi.Get_size()
    cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
    uid = mpi.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
    comm = nccl.NcclCommunicator(world, uid, rank)
    up, down, x = float_weights()
    up = seam.ColumnParallelLinearMethod(
        seam.Fp8Weight.from_float(up, per_channel=True, activation_scheme="per_token"), rank, world
    )
    down = seam.RowParallelLinearMethod(
        seam.Fp8Weight.from_float(down, per_channel=True, activation_scheme="per_token"),
        rank,
        world,
        seam.nccl_all_reduce(comm),
    )
    h = up.apply(cp.asarray(x))
    h = h / (1 + cp.exp(-h))  # SiLU on this rank's features
    kr = INTER // world
    assert h.shape == (x.shape[0], kr)
    y = down.apply(h)
    cp.cuda.get_current_stream().synchronize()
    if rank == 0:
        print(f"cupy, {world} rank(s): y {tuple(y.shape)}, sum {float(y.astype(cp.float64).sum()):.4f}")


if __name__ == "__main__":
    with_cupy() if "--cupy" in sys.argv else with_torch()
