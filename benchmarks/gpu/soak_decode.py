"""Soak: many decode steps of a converted layer stack, watched for leaks (needs torch, cupy, a GPU).

A stack of converted layers -- a Llama-style MLP (gate, up, down as ``Fp8Linear``, per_token) and a
Qwen3-MoE-shaped experts layer (``Fp8Experts``, 32 experts of 2048 x 768, top-4) -- runs ``--steps``
decode steps at M = 1, eager, with every ``--graph-every``-th step replayed from a CUDA graph instead,
and the inputs changing every step. Every ``--sample`` steps it records torch's allocated bytes,
cupy's pool bytes in use, the process's resident memory, and the number of bound calls the layers
hold; at the end it fits a line to each (after the first sample: warm-up allocates) and prints the
slope per 1,000 steps. It checks the last step's output against a fresh eager call of the same
input, bitwise.

Run: python3 benchmarks/gpu/soak_decode.py [--steps 100000] [--sample 10000] [--graph-every 10]
"""

import argparse
import resource
import time
import warnings

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=10_000)
    ap.add_argument("--graph-every", type=int, default=10)
    args = ap.parse_args()
    warnings.simplefilter("ignore")

    import cupy as cp
    import torch
    import transformers

    import vtnumba.torch as vtt
    from vtnumba.seam import experts as se

    h, inter = 2048, 768
    torch.manual_seed(0)

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = torch.nn.Linear(h, 4 * h, bias=False)
            self.up_proj = torch.nn.Linear(h, 4 * h, bias=False)
            self.down_proj = torch.nn.Linear(4 * h, h, bias=False)

        def forward(self, x):
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=h, moe_intermediate_size=inter, num_experts=32, num_experts_per_tok=4, num_hidden_layers=1
    )
    experts = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts(cfg)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.02)
    mlp = vtt.convert(Mlp().cuda().bfloat16(), "per_token")
    moe = vtt.convert(torch.nn.Sequential(experts.cuda().bfloat16()), "per_token")[0]
    gen = torch.Generator(device="cuda").manual_seed(1)

    def routing():
        ids = torch.randperm(32, device="cuda", generator=gen)[:4].reshape(1, 4)
        return ids, torch.rand(1, 4, device="cuda", generator=gen).to(torch.bfloat16)

    def step(x, ids, w):
        return moe(mlp(x), ids, w)

    pool = cp.get_default_memory_pool()
    static_x = torch.randn(1, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    static_ids, static_w = routing()
    samples = []
    with torch.no_grad():
        step(static_x, static_ids, static_w)
        step(static_x, static_ids, static_w)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = step(static_x, static_ids, static_w)
        t0 = time.perf_counter()
        for i in range(args.steps):
            x = torch.randn(1, h, device="cuda", dtype=torch.bfloat16, generator=gen)
            ids, w = routing()
            if args.graph_every and i % args.graph_every == 0:
                static_x.copy_(x)
                static_ids.copy_(ids)
                static_w.copy_(w)
                graph.replay()
                y = static_y
            else:
                y = step(x, ids, w)
            if i % args.sample == 0 or i == args.steps - 1:
                torch.cuda.synchronize()
                gu, _ = moe._state(0)
                bound = len(se._bound_holder(gu).bound_calls or {})
                rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                samples.append((i, torch.cuda.memory_allocated(), pool.used_bytes(), rss_kib * 1024, bound))
                print(
                    f"step {i:>7}: torch {samples[-1][1] / 2**20:8.2f} MiB, cupy pool {samples[-1][2] / 2**20:8.2f} MiB, "
                    f"max RSS {samples[-1][3] / 2**20:8.1f} MiB, bound MoE calls {bound}, "
                    f"{(time.perf_counter() - t0) / (i + 1) * 1e6:.1f} us a step",
                    flush=True,
                )
        torch.cuda.synchronize()
        again = step(x, ids, w)
        same = torch.equal(again, y) if not (args.graph_every and (args.steps - 1) % args.graph_every == 0) else None
    steps = np.array([s[0] for s in samples[1:]], dtype=np.float64)
    print(
        f"\n## {args.steps} steps ({(time.perf_counter() - t0):.1f} s); slopes after the first sample, per 1,000 steps"
    )
    print("| quantity | first | last | slope per 1,000 steps |\n|---|---|---|---|")
    for col, name in (
        (1, "torch allocated bytes"),
        (2, "cupy pool bytes in use"),
        (3, "max RSS bytes"),
        (4, "bound MoE calls"),
    ):
        values = np.array([s[col] for s in samples[1:]], dtype=np.float64)
        slope = np.polyfit(steps, values, 1)[0] * 1000 if len(steps) > 1 else float("nan")
        print(
            f"| {name} | {samples[1][col] if len(samples) > 1 else samples[0][col]} | {samples[-1][col]} | {slope:.3f} |"
        )
    print(f"\nlast eager step equal to a fresh call of its input: {same}")


if __name__ == "__main__":
    main()
