"""One Qwen3-30B-A3B MoE layer at batch-1 decode, called a few times, for Nsight Compute to look at
the routed launches (a target for ``ncu``, not a benchmark: it prints nothing but the kernels' names).

    ncu --clock-control none -k regex:routed --launch-skip 4 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters \\
        python3 benchmarks/gpu/ncu_moe_decode.py [per_token | blocks] [--calls N]

(``--clock-control none`` leaves the GPU's clocks as they are.) The first two calls compile and
warm; ncu's ``--launch-skip`` counts the routed kernels only, two a call.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_moe import BF16, QWEN3_MOE, qwen3_layer  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scheme", choices=["per_token", "blocks"], nargs="?", default="per_token")
    parser.add_argument("--calls", type=int, default=4)
    args = parser.parse_args()
    import cupy as cp

    from vtnumba import seam

    rng = np.random.default_rng(0)
    name = "per_token" if args.scheme == "per_token" else "per_group 128x128"
    gu, dn = qwen3_layer(cp, rng, name)
    e, h, top_k = QWEN3_MOE["experts"], QWEN3_MOE["hidden"], QWEN3_MOE["top_k"]
    x = cp.asarray(rng.standard_normal((1, h)).astype(BF16))
    ids = cp.asarray(rng.permutation(e)[:top_k].reshape(1, top_k).astype(np.int32))
    weights = cp.asarray(rng.random((1, top_k)).astype(np.float32))
    for _ in range(args.calls):
        seam.moe_fp8(x, gu, dn, ids, weights)
    cp.cuda.get_current_stream().synchronize()


if __name__ == "__main__":
    main()
