"""The dense decode layer on the swapped wgmma pass (kernels/tc_gemv.py, "the dense decode layer on
the swapped wgmma pass") against what a decode step ran before it and against bf16, device time.

For each weight shape (Qwen3-30B-A3B's attention projections, Llama-3-8B's layers) and M rows of
bf16 x, one FP8 linear layer (quantize x, GEMM, bf16 y) timed as:
- ``wgmma``: the one dense wgmma launch, its chosen split of K over a cluster (and, with --sweep,
  every split and ring depth);
- ``mma.sync``: the fused tensor-core GEMV (one launch; eager's choice before);
- ``split``: the quantization kernel and cuBLASLt (a CUDA graph's choice before);
- ``bf16``: torch's x @ w.t() on the bf16 weight (the peer).
Weights L2-cold: each call reads the next of enough copies to pass 128 MB. Device time behind a spin
kernel (vtnumba.timing.device_us), best of --rounds. Also the largest difference of the wgmma
output from the mma.sync GEMV's, relative to the largest |y|.

Run: python3 benchmarks/gpu/bench_dense_wgmma.py [--schemes per_token,static,per_group] [--m 1,4,8]
     [--sweep] [--rounds 3]   (needs cupy, torch, an sm_90 GPU)
"""

import argparse
import contextlib
import itertools
import os

import cupy as cp
import ml_dtypes
import numpy as np

from vtnumba.cuda import gemm
from vtnumba.cuda.kernels import tc_gemv
from vtnumba.cuda.kernels.epilogue import empty_out
from vtnumba.cuda.runtime import device
from vtnumba.timing import best_device_us

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = {
    "qwen3 q_proj": (4096, 2048),
    "qwen3 k/v_proj": (512, 2048),
    "qwen3 o_proj": (2048, 4096),
    "llama qkv": (6144, 4096),
    "llama o": (4096, 4096),
    "llama gate_up": (28672, 4096),
    "llama down": (4096, 14336),
}
COLD_BYTES = 128 << 20


@contextlib.contextmanager
def env(name, value):
    """The environment variable ``name`` set to ``value`` inside the block (as it was after)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def disabled(names):
    """VT_DISABLE_KERNELS with ``names`` added."""
    return env("VT_DISABLE_KERNELS", ",".join(filter(None, [os.environ.get("VT_DISABLE_KERNELS"), names])))


def split_order():
    """VT_DECODE_PATH=split: the kernel order a CUDA graph capture took at decode before."""
    return env("VT_DECODE_PATH", "split")


def layer(scheme, n, k, copies, rng):
    """Weight copies [(codes, scale_b, block_scales)] of one shape in ``scheme``."""
    out = []
    for _ in range(copies):
        codes = cp.asarray(rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8))
        if scheme == "per_group":
            blocks = cp.asarray(rng.uniform(0.5, 2.0, size=(-(-n // 128), -(-k // 128))).astype(np.float32) / 64)
            out.append((codes, None, blocks))
        elif scheme == "per_token":
            out.append((codes, cp.asarray(rng.uniform(0.5, 2.0, size=n).astype(np.float32) / 64), None))
        else:
            out.append((codes, np.float32(1 / 64), None))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", default="per_token,static,per_group")
    p.add_argument("--m", default="1,4,8")
    p.add_argument("--sweep", action="store_true", help="every split and ring depth of the wgmma launch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args()
    import torch

    dev = device.current()
    rng = np.random.default_rng(0)
    print(f"GPU: {dev.name}, {dev.sm_count} SMs; device us per layer call, weights L2-cold, best of {args.rounds}")
    for scheme in args.schemes.split(","):
        per_token, static = scheme == "per_token", scheme == "static"
        input_scale = np.float32(0.05) if static else None
        print(f"\n### {scheme}\n")
        print(
            "| shape | N x K | M | wgmma (split, stages) | mma.sync | split path | bf16 | wgmma / split | wgmma / bf16 | max diff |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name in args.shapes.split(","):
            n, k = SHAPES[name]
            copies = max(2, -(-COLD_BYTES // (n * k)))
            weights = layer(scheme, n, k, copies, rng)
            w_bf16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, copies // 2))]
            for m in (int(v) for v in args.m.split(",")):
                xf = (rng.standard_normal((m, k)) * 2).astype(np.float32)
                x = cp.asarray(xf.astype(BF16))
                xt = torch.as_tensor(x.view(cp.uint16), device="cuda").view(torch.bfloat16)
                turn = itertools.count()

                def quantize_x(x_):
                    from vtnumba.cuda import quantize

                    return quantize.quantize_activation(x_, input_scale, per_token, None)

                def fused(names="", copy=None):
                    def call():
                        codes, sb, blocks = weights[next(turn) % copies if copy is None else copy]
                        with disabled(names):  # (where the fusion does not serve: quantize, then the codes GEMV)
                            return tc_gemv.fused_linear(
                                x, codes, sb, input_scale, per_token, None, BF16, None, quantize_x, blocks
                            )

                    return call

                def planned(plan):
                    mode = (
                        tc_gemv.MODE_PER_GROUP
                        if scheme == "per_group"
                        else tc_gemv.MODE_PER_TOKEN
                        if per_token
                        else tc_gemv.MODE_STATIC
                    )
                    qscale = dev.scalar(0.0 if per_token else 0.05)

                    def call():
                        codes, sb, blocks = weights[next(turn) % copies]
                        y, y_bits = empty_out(m, n, BF16)
                        if blocks is not None:
                            sa, sbv, step = blocks[:1, :1], blocks, 0
                        else:
                            sa = dev.placeholder("f32")
                            sbv, step = (sb, 1) if per_token else (dev.scalar(sb), 0)
                        kernel, grid, block, a, shared = tc_gemv.dense_wgmma_launch(
                            m,
                            x.view(np.uint16),
                            tc_gemv.X_KIND[BF16],
                            qscale,
                            codes,
                            sa,
                            sbv,
                            step,
                            BF16,
                            None,
                            mode,
                            blocks is not None,
                            y_bits,
                            dev,
                            plan,
                        )
                        kernel(grid, block, *a, shared_mem=shared)
                        return y

                    return call

                def split_path():
                    codes, sb, blocks = weights[next(turn) % copies]
                    with disabled("dense_gemv_wgmma"), split_order():
                        from vtnumba.cuda import quantize

                        if blocks is not None:
                            return None
                        q, sa = quantize.quantize_activation(x, input_scale, per_token, None)
                        return gemm.scaled_mm(q, codes, sa, sb, BF16, None)  # the graph regime's order

                def bf16():
                    return xt @ w_bf16[next(turn) % len(w_bf16)].t()

                plan = tc_gemv.dense_wgmma_split(n, k, dev.sm_count)
                t_wg = best_device_us(fused(), rounds=args.rounds)
                t_mma = best_device_us(fused("dense_gemv_wgmma"), rounds=args.rounds)
                t_split = best_device_us(split_path, rounds=args.rounds) if scheme != "per_group" else float("nan")
                t_bf = best_device_us(bf16, rounds=args.rounds)
                y_wg = fused(copy=0)().astype(np.float32)  # the same weight on both sides
                y_mma = fused("dense_gemv_wgmma", copy=0)().astype(np.float32)
                diff = float(cp.abs(y_wg - y_mma).max() / max(float(cp.abs(y_mma).max()), 1e-30))
                print(
                    f"| {name} | {n} x {k} | {m} | {t_wg:.2f} ({plan[0]}, {plan[1]}) | {t_mma:.2f} | {t_split:.2f} | "
                    f"{t_bf:.2f} | {t_wg / t_split:.2f} | {t_wg / t_bf:.2f} | {diff:.1e} |",
                    flush=True,
                )
                if args.sweep:
                    cells = []
                    for split in (1, 2, 4, 8):
                        for stages in (3, 5):
                            if split > -(-k // 128):
                                continue
                            cells.append(
                                f"{split}/{stages}: {best_device_us(planned((split, stages)), rounds=args.rounds):.2f}"
                            )
                    print(f"|  sweep (split/stages: us) | {' ; '.join(cells)} |||||||||", flush=True)


if __name__ == "__main__":
    main()
