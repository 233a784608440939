"""Host time of a mixture-of-experts layer's eager call, and where it goes: the seam's ``moe_fp8`` on
cupy arrays, ``vtnumba.torch.Fp8Experts`` against transformers' bf16 experts module (its
``grouped_mm`` and ``batched_mm`` implementations: a model's ``generate`` ran the second at
decode on the H200), and a converted Llama MLP against bf16 ``nn.Linear``s.

Host time per call: ``calls`` calls enqueued back to back with no synchronization, timed on the host
(the GPU's queue absorbs them: a decode layer's GPU work is shorter than its host cost), the best of
``--trials`` interleaved rounds. Then cProfile over the same calls, sorted by own time: read it for
the ranking, since the profiler inflates every Python call.

Run: python3 benchmarks/gpu/profile_moe_host.py [--calls 200] [--trials 5] [--top 25] [--tokens 1]
(needs cupy, torch and transformers, and a GPU)
"""

import argparse
import copy
import cProfile
import io
import pstats
import time
import warnings

import numpy as np

# Qwen3-30B-A3B's MoE layer
E, H, INTER, TOP_K = 128, 2048, 768, 8
# Llama-3-8B's MLP
LLAMA_H, LLAMA_I = 4096, 14336


def host_us(fn, calls, sync):
    """Host microseconds per call of ``calls`` calls enqueued with no synchronization in between."""
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t
    sync()
    return host / calls * 1e6


def interleaved(sides, calls, trials, sync):
    """{name: best host us per call} of each side, the sides timed in turn ``trials`` times."""
    best = {name: float("inf") for name in sides}
    for _ in range(trials):
        for name, fn in sides.items():
            best[name] = min(best[name], host_us(fn, calls, sync))
    return best


def profile(fn, calls, top, sync):
    sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    sync()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def random_codes(cp, rng, shape):
    """e4m3 codes of both signs, no NaN (0x7F / 0xFF), on the GPU."""
    mag = rng.integers(0, 0x7F, size=shape, dtype=np.uint8)
    return cp.asarray(mag | (rng.integers(0, 2, size=shape, dtype=np.uint8) << 7))


def routing(xp, tokens, rng):
    ids = np.stack([rng.choice(E, TOP_K, replace=False) for _ in range(tokens)]).astype(np.int64)
    w = rng.random((tokens, TOP_K)).astype(np.float32)
    return xp.asarray(ids), xp.asarray(w / w.sum(1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--parts", default="seam,torch,mlp")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    warnings.simplefilter("ignore")  # convert's notes on what stays in float

    import cupy as cp

    from vtnumba import seam

    rng = np.random.default_rng(0)
    sync = cp.cuda.Device().synchronize
    profiles = []

    if "seam" in parts:
        ids, weights = routing(cp, args.tokens, rng)
        x = cp.asarray(rng.standard_normal((args.tokens, H), dtype=np.float32)).astype(cp.float16)
        sides = {}
        for scheme, block in (("per_token", None), ("blocks 128x128", (128, 128))):
            kw = dict(activation_scheme="per_token") if block is None else {}
            experts = []
            for n, k in ((2 * INTER, H), (H, INTER)):
                shape = (E, n) if block is None else (E, n // 128, k // 128)
                scale = cp.asarray(rng.uniform(0.5, 1.5, size=shape).astype(np.float32) * 1e-2)
                experts.append(seam.Fp8Experts(random_codes(cp, rng, (E, n, k)), scale, block_size=block, **kw))
            gu, dn = experts

            def call(gu=gu, dn=dn):
                return seam.moe_fp8(x, gu, dn, ids, weights)

            call()
            sides[f"seam.moe_fp8 {scheme}"] = call
        best = interleaved(sides, args.calls, args.trials, sync)
        print(f"\n## seam.moe_fp8, cupy, {args.tokens} token(s), E={E} H={H} I={INTER} top-{TOP_K}: host us per call")
        for name, us in best.items():
            print(f"  {name:40s} {us:8.1f}")
        for name, fn in sides.items():
            profiles.append((name, profile(fn, args.calls, args.top, sync)))

    if "torch" in parts or "mlp" in parts:
        import torch

        import vtnumba.torch as vtt

        tsync = torch.cuda.synchronize

    if "torch" in parts:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

        cfg = Qwen3MoeConfig(
            hidden_size=H, moe_intermediate_size=INTER, num_experts=E, num_experts_per_tok=TOP_K, num_hidden_layers=1
        )
        bf16 = {}
        for impl in ("grouped_mm", "batched_mm"):
            cfg_impl = copy.deepcopy(cfg)
            cfg_impl._experts_implementation = impl
            bf16[impl] = Qwen3MoeExperts(cfg_impl).to("cuda", torch.bfloat16)
            with torch.no_grad():
                for p in bf16[impl].parameters():
                    p.normal_(0, 0.02)
        xt = torch.randn(args.tokens, H, device="cuda", dtype=torch.bfloat16)
        tid = torch.stack([torch.randperm(E, device="cuda")[:TOP_K] for _ in range(args.tokens)])
        tw = torch.softmax(torch.randn(args.tokens, TOP_K, device="cuda"), -1).to(torch.bfloat16)
        sides = {f"bf16 Qwen3MoeExperts ({impl})": lambda m=m: m(xt, tid, tw) for impl, m in bf16.items()}
        for scheme in ("per_token", "per_group"):
            float_experts = Qwen3MoeExperts(cfg).to("cuda", torch.bfloat16)
            with torch.no_grad():
                for p in float_experts.parameters():
                    p.normal_(0, 0.02)
            fp8 = vtt.convert(torch.nn.Sequential(float_experts), scheme)[0]
            sides[f"vtt.Fp8Experts {scheme}"] = lambda fp8=fp8: fp8(xt, tid, tw)
        with torch.no_grad():
            for fn in sides.values():
                fn()
            best = interleaved(sides, args.calls, args.trials, tsync)
            print(f"\n## experts module, torch eager, {args.tokens} token(s): host us per call")
            for name, us in best.items():
                print(f"  {name:40s} {us:8.1f}")
            for name, fn in sides.items():
                profiles.append((name, profile(fn, args.calls, args.top, tsync)))

    if "mlp" in parts:

        class Mlp(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gate_proj = torch.nn.Linear(LLAMA_H, LLAMA_I, bias=False)
                self.up_proj = torch.nn.Linear(LLAMA_H, LLAMA_I, bias=False)
                self.down_proj = torch.nn.Linear(LLAMA_I, LLAMA_H, bias=False)

            def forward(self, x):
                return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

        xm = torch.randn(1, LLAMA_H, device="cuda", dtype=torch.bfloat16)
        base = Mlp().to("cuda", torch.bfloat16)
        sides = {"bf16 Llama MLP (nn.Linear)": lambda: base(xm)}
        for scheme in ("per_token", "dynamic"):
            m = vtt.convert(Mlp().to("cuda", torch.bfloat16), scheme)
            sides[f"Fp8Linear MLP {scheme}"] = lambda m=m: m(xm)
        with torch.no_grad():
            for fn in sides.values():
                fn()
                fn()
            best = interleaved(sides, args.calls, args.trials, tsync)
            print("\n## Llama-3-8B MLP, torch eager, M = 1: host us per forward")
            for name, us in best.items():
                print(f"  {name:40s} {us:8.1f}")
            for name, fn in sides.items():
                profiles.append((name, profile(fn, args.calls, args.top, tsync)))

    for name, text in profiles:
        print(f"\n## cProfile: {name}, {args.calls} calls\n{text}")


if __name__ == "__main__":
    main()
