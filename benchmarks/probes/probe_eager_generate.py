"""Where a converted MoE model's eager ``generate`` spends its host time: cProfile over greedy decoding
of a transformers Qwen3-MoE (Qwen3-30B-A3B shapes, ``--layers`` layers, random weights), bf16 and
converted, the functions ranked by own time and by cumulative time, and how many MoE calls took the
bound path (``BoundMoe.enqueue``) or the full one (``MoeCall.run``).

The profiler inflates every Python call, so read the ranking, not the absolute times; the tokens/s
without the profiler come first.

Run: python3 benchmarks/probes/probe_eager_generate.py [--layers 2] [--tokens 32] [--scheme per_token]
"""

import argparse
import cProfile
import io
import pstats
import time
import warnings


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--scheme", default="per_token")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    warnings.simplefilter("ignore")

    import copy

    import torch
    import transformers

    import vtnumba.torch as vtt
    from vtnumba.cuda import bound
    from vtnumba.seam import experts as se

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        num_hidden_layers=args.layers,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).eval()
    model.set_experts_implementation("grouped_mm")
    fp8 = vtt.convert(copy.deepcopy(model), args.scheme, ignore=["lm_head"])
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), device="cuda")
    kwargs = dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False)

    counts = {"bound": 0, "full": 0}
    enqueue, run = bound.BoundMoe.enqueue, se.MoeCall.run

    def counted_enqueue(self, *a):
        counts["bound"] += 1
        return enqueue(self, *a)

    def counted_run(self):
        counts["full"] += 1
        return run(self)

    bound.BoundMoe.enqueue, se.MoeCall.run = counted_enqueue, counted_run
    with torch.no_grad():
        for name, m in (("bf16", model), (args.scheme, fp8), ("bf16", model), (args.scheme, fp8)):
            m.generate(prompt, **kwargs)  # warm-up
            torch.cuda.synchronize()
            t = time.perf_counter()
            m.generate(prompt, **kwargs)
            torch.cuda.synchronize()
            print(f"{name}: {args.tokens / (time.perf_counter() - t):.1f} tokens/s (no profiler)", flush=True)
        for name, m in (("bf16", model), (args.scheme, fp8)):
            counts.update(bound=0, full=0)
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            m.generate(prompt, **kwargs)
            torch.cuda.synchronize()
            prof.disable()
            print(f"\n## {name}: MoE calls bound {counts['bound']}, full {counts['full']}")
            for order in ("tottime", "cumulative"):
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats(order).print_stats(args.top)
                print(f"\n### by {order}\n{out.getvalue()}")


if __name__ == "__main__":
    main()
