"""Where one eager decode step of a converted Llama spends its GPU time -- torch.profiler's kernels,
grouped by name -- and, with ``--host``, its host time (cProfile of ten steps, by own time), for
bf16 and a converted model (transformers' LlamaForCausalLM with Llama-3-8B shapes, random weights).

    python3 benchmarks/gpu/profile_decode_step.py [--layers 8] [--scheme static] [--top 14] [--host]
"""

import argparse
import collections
import copy

from bench_torch_model import llama


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--scheme", default="static")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--host", action="store_true", help="also cProfile ten eager steps of each model")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    import vtnumba.torch as vtt

    model, _ = llama(torch, args.layers)
    prompt = torch.randint(0, 128256, (1, 16), device="cuda")
    converted = copy.deepcopy(model)
    scales = vtt.calibrate(converted, lambda: converted(prompt)) if args.scheme == "static" else None
    vtt.convert(converted, args.scheme, input_scales=scales, ignore=["lm_head"])
    for label, m in (("bf16", model), (args.scheme, converted)):
        with torch.no_grad():
            out = m(input_ids=prompt, use_cache=True)
            cache, ids = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(3):
                m(input_ids=ids, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                m(input_ids=ids, past_key_values=cache, use_cache=True)
                torch.cuda.synchronize()
        spent, count = collections.Counter(), collections.Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                name = e.name[:90]
                spent[name] += getattr(e, "device_time", None) or e.cuda_time
                count[name] += 1
        print(f"\n## {label}: one eager decode step, {sum(count.values())} kernels, {sum(spent.values()):.0f} us")
        print("| kernel | calls | us |\n|---|---|---|")
        for name, us in spent.most_common(args.top):
            print(f"| {name} | {count[name]} | {us:.1f} |")
        if args.host:
            import cProfile
            import pstats

            with torch.no_grad():
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(10):
                    m(input_ids=ids, past_key_values=cache, use_cache=True)
                profiler.disable()
                torch.cuda.synchronize()
            print(f"\n{label}: host time of ten eager steps, by own time")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
