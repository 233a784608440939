"""A transformers MoE model converted by vtnumba.torch (experts as ``Fp8Experts``, attention and
lm_head as ``Fp8Linear``) against the same model in bf16, in one run (needs a CUDA GPU, torch,
cupy, transformers >= 5.17; random weights, no download).

The model is Qwen3-MoE with Qwen3-30B-A3B's shapes (hidden 2048, 128 experts of 768, top-8, 32
query / 4 KV heads of 128) and ``--layers`` layers. bf16 runs transformers' experts implementation
``--bf16-experts`` (grouped_mm: torch._grouped_mm, its default on the GPU). Parts (``--parts``):

- ``accuracy``: each side's logits on the prompt against bf16's (cosine per position).
- ``decode``: eager ``generate`` of ``--tokens`` greedy tokens (tokens/s), bf16 and each scheme
  interleaved round by round (so clock and thermal drift fall on every side alike), best round each.
- ``graph``: one decode step with a static KV cache captured into a CUDA graph and replayed
  (tokens/s), and the MoE block alone under ``torch.compile(fullgraph=True)`` (us per call; its
  output equal to eager's, bitwise, is checked).
- ``prefill``: one forward of a ``--prefill``-token prompt (ms, device time by CUDA events).
- ``profile``: torch.profiler's breakdown of one decode step and one prefill per side by kernel
  kind (moe: align / grouped GEMM / routed GEMV / SiLU-mul / combine; quant; GEMM; attention; other), and each
  side's top kernels.

    python3 benchmarks/gpu/bench_torch_moe.py [--quick] [--torchao] [--parts accuracy,decode,graph,prefill,profile]
        [--schemes per_token,per_group]

Each part prints a markdown table; a part that fails prints its error and the rest still run.
"""

import argparse
import copy
import time
import traceback

QWEN3_30B = dict(
    hidden_size=2048,
    moe_intermediate_size=768,
    intermediate_size=6144,
    num_experts=128,
    num_experts_per_tok=8,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    vocab_size=151936,
)


def table(title, header):
    print(f"\n## {title}\n| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)


def row(*cells):
    print(
        "| "
        + " | ".join(c if isinstance(c, str) else f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells)
        + " |",
        flush=True,
    )


def build(torch, layers, bf16_experts):
    import transformers

    cfg = transformers.Qwen3MoeConfig(
        num_hidden_layers=layers, max_position_embeddings=8192, tie_word_embeddings=False, **QWEN3_30B
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).eval()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(bf16_experts)
    else:
        model.config._experts_implementation = bf16_experts
    return model, cfg


def convert(torch, vtt, seam, model, scheme, calib_prompt):
    """A converted copy of the bf16 model, quantized on the GPU (experts expert by expert)."""
    fp8 = copy.deepcopy(model)
    if scheme == "mxfp8":
        config = seam.Fp8Config("mxfp8", "block", "per_group", (), (1, 32), activation_scale_format="e8m0")
        return vtt.convert(fp8, config, ignore=["lm_head"])
    scales = None
    if scheme == "static":
        scales = vtt.calibrate(fp8, lambda: fp8(calib_prompt))
    return vtt.convert(fp8, scheme, input_scales=scales, ignore=["lm_head"])


def torchao_side(torch, model):
    """The model as a torch user would quantize it with torchao: float8 rowwise dynamic activations
    and weights on every nn.Linear (``quantize_``); transformers' fused experts are no nn.Linear,
    so they stay bf16."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    ao = copy.deepcopy(model)
    quantize_(ao, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
    return ao


def sides(torch, vtt, seam, model, schemes, prompt, with_torchao=False):
    out = [("bf16", model)]
    if with_torchao:
        try:
            out.append(("torchao float8 rowwise (linears)", torchao_side(torch, model)))
        except Exception as exc:  # torchao absent or refusing this model: say so, time the others
            print(f"torchao failed: {type(exc).__name__}: {exc}", flush=True)
    for scheme in schemes:
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fp8 = convert(torch, vtt, seam, model, scheme, prompt)
            torch.cuda.synchronize()
            print(
                f"converted {scheme} in {time.perf_counter() - t0:.1f} s; {vtt.conversion_report(fp8).converted}",
                flush=True,
            )
            out.append((scheme, fp8))
        except Exception as exc:  # a scheme the GPU path cannot run yet: say so, time the others
            print(f"convert {scheme} failed: {type(exc).__name__}: {exc}", flush=True)
    return out


# -- parts ---------------------------------------------------------------------------------------


def generate_rate(torch, model, prompt, tokens):
    kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(prompt, **kwargs)
    torch.cuda.synchronize()
    return tokens / (time.perf_counter() - t0)


def part_decode(torch, models, prompt, tokens, rounds):
    table(
        f"eager generate, {tokens} tokens after a {prompt.shape[1]}-token prompt (tokens/s; best of {rounds} "
        f"interleaved rounds)",
        ["side", "tokens/s", "vs bf16", "rounds"],
    )
    best = {name: [] for name, _ in models}
    with torch.no_grad():
        for _, model in models:  # warm-up: binds, compiles, allocator
            generate_rate(torch, model, prompt, min(tokens, 8))
        for _ in range(rounds):
            for name, model in models:
                best[name].append(generate_rate(torch, model, prompt, tokens))
    base = max(best["bf16"])
    for name, rates in best.items():
        row(name, max(rates), f"{max(rates) / base:.2f}x", " ".join(f"{r:.1f}" for r in rates))


def part_accuracy(torch, models, prompt):
    """Each side's logits on the prompt against bf16's: cosine per position (mean and min)."""
    table(
        f"logits on a fixed {prompt.shape[1]}-token prompt against bf16 (cosine per position)",
        ["side", "mean cosine", "min cosine"],
    )
    with torch.no_grad():
        base = models[0][1](prompt).logits.float()
        for name, model in models[1:]:
            cos = torch.nn.functional.cosine_similarity(model(prompt).logits.float(), base, dim=-1)
            row(name, f"{float(cos.mean()):.5f}", f"{float(cos.min()):.5f}")


def _static_cache(cfg, length, torch):
    from transformers import StaticCache

    for kwargs in (
        dict(config=cfg, max_batch_size=1, max_cache_len=length, device="cuda", dtype=torch.bfloat16),
        dict(config=cfg, max_cache_len=length),
    ):
        try:
            return StaticCache(**kwargs)
        except TypeError:
            continue
    raise RuntimeError("this transformers' StaticCache takes neither known signature")


def graph_rate(torch, model, cfg, prompt, tokens, rounds):
    """Greedy decode, each step one CUDA graph replay (argmax and position on the GPU); the cache is
    emptied and the prompt prefilled again before each round, outside the clock (transformers takes
    a step's write position from the cache's contents)."""
    start = prompt.shape[1]
    cache = _static_cache(cfg, start + tokens + 8, torch)
    ids = torch.zeros((1, 1), dtype=torch.long, device="cuda")
    position = torch.tensor([start], device="cuda")

    def prefill():
        cache.reset()
        logits = model(
            input_ids=prompt, past_key_values=cache, cache_position=torch.arange(start, device="cuda"), use_cache=True
        ).logits
        ids.copy_(logits[:, -1:].argmax(-1))
        position.fill_(start)

    with torch.no_grad():
        prefill()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as torch's graph docs do
            for _ in range(2):
                model(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True).logits
            ids.copy_(out[:, -1:].argmax(-1))
            position.add_(1)
        best = 0.0
        for _ in range(rounds):
            prefill()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(tokens):
                graph.replay()
            torch.cuda.synchronize()
            best = max(best, tokens / (time.perf_counter() - t0))
    return best


def device_ms(torch, fn, calls):
    for _ in range(2):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def part_graph(torch, models, cfg, prompt, tokens, rounds):
    table(
        f"decode step in a CUDA graph (static cache), {tokens} tokens (tokens/s, best of {rounds})",
        ["side", "tokens/s", "vs bf16"],
    )
    base = None
    for name, model in models:
        try:
            rate = graph_rate(torch, model, cfg, prompt, tokens, rounds)
        except Exception as exc:
            row(name, f"failed: {type(exc).__name__}: {str(exc)[:120]}", "")
            continue
        base = rate if name == "bf16" else base
        row(name, rate, f"{rate / base:.2f}x" if base else "n/a")
    table(
        "MoE block (router + experts) under torch.compile(fullgraph=True) (device us per call)",
        ["side", "T", "eager us", "compiled us", "bitwise equal", "graph breaks"],
    )
    for name, model in models:
        block = model.model.layers[0].mlp
        for t in (1, 64):
            x = torch.randn(1, t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
            try:
                with torch.no_grad():
                    explained = torch._dynamo.explain(block)(x)
                    torch._dynamo.reset()
                    compiled = torch.compile(block, fullgraph=True)
                    same = torch.equal(compiled(x), block(x))
                    eager_us = device_ms(torch, lambda: block(x), 20) * 1e3
                    compiled_us = device_ms(torch, lambda: compiled(x), 20) * 1e3
                row(name, t, eager_us, compiled_us, str(same), explained.graph_break_count)
            except Exception as exc:
                row(name, t, f"failed: {type(exc).__name__}: {str(exc)[:120]}", "", "", "")


def part_prefill(torch, models, length, rounds):
    table(
        f"prefill of a {length}-token prompt (device ms per forward, best of {rounds} interleaved rounds)",
        ["side", "ms", "vs bf16"],
    )
    prompt = torch.randint(0, QWEN3_30B["vocab_size"], (1, length), device="cuda")
    best = {}
    with torch.no_grad():
        for _ in range(rounds):
            for name, model in models:
                ms = device_ms(torch, lambda: model(input_ids=prompt, use_cache=False), 3)
                best[name] = min(best.get(name, ms), ms)
    for name, ms in best.items():
        row(name, ms, f"{best['bf16'] / ms:.2f}x faster" if "bf16" in best else "n/a")


def _kind(name):
    low = name.lower()
    if any(
        k in low for k in ("moe", "grouped", "routed", "align", "combine", "silu", "scatter", "gather", "index_add")
    ):
        return "moe"
    if "quant" in low or "amax" in low:
        return "quant"
    if any(k in low for k in ("flash", "fmha", "attention", "sdpa", "softmax")):
        return "attention"
    if any(k in low for k in ("gemm", "nvjet", "cutlass", "xmma", "sm90", "wgmma", "cublas", "matmul")):
        return "GEMM"
    return "other"


def part_profile(torch, models, prompt, length):
    from torch.profiler import ProfilerActivity, profile

    kinds = ["moe", "quant", "GEMM", "attention", "other"]
    table(
        "torch.profiler: GPU us of one eager decode step and one prefill, by kernel kind",
        ["side", "call", *kinds, "total", "kernels"],
    )
    tops = []
    long_prompt = torch.randint(0, QWEN3_30B["vocab_size"], (1, length), device="cuda")
    with torch.no_grad():
        for name, model in models:
            out = model(input_ids=prompt, use_cache=True)
            cache, ids = out.past_key_values, out.logits[:, -1:].argmax(-1)
            calls = {
                "decode step": lambda: model(input_ids=ids, past_key_values=cache, use_cache=True),
                f"prefill {length}": lambda: model(input_ids=long_prompt, use_cache=False),
            }
            for call, fn in calls.items():
                fn()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                spent, per_kernel, count = dict.fromkeys(kinds, 0.0), {}, 0
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        us = getattr(e, "device_time", None) or e.cuda_time
                        spent[_kind(e.name)] += us
                        per_kernel[e.name] = per_kernel.get(e.name, 0.0) + us
                        count += 1
                row(name, call, *(spent[k] for k in kinds), sum(spent.values()), count)
                tops.append((name, call, sorted(per_kernel.items(), key=lambda kv: -kv[1])[:16]))
    for name, call, top in tops:
        table(f"top kernels: {name}, {call} (GPU us)", ["kernel", "us"])
        for kernel, us in top:
            row(kernel[:110], us)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="accuracy,decode,graph,prefill,profile")
    ap.add_argument(
        "--schemes",
        default="per_token,per_group,dynamic",
        help="comma-separated: dynamic, per_token, static, per_group, mxfp8",
    )
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32, help="decode's prompt length")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bf16-experts", default="grouped_mm", help="transformers' experts implementation for bf16")
    ap.add_argument("--torchao", action="store_true", help="add torchao 0.18's float8 rowwise as a side")
    ap.add_argument("--quick", action="store_true", help="2 layers, 16 tokens, prefill 512, 2 rounds, per_token only")
    args = ap.parse_args()
    if args.quick:
        args.layers, args.tokens, args.prefill, args.rounds = 2, 16, 512, 2
        args.schemes = "per_token"

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_torch_moe.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    import vtnumba.torch as vtt
    from vtnumba import seam

    print(
        f"# bench_torch_moe: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"transformers {__import__('transformers').__version__}, layers {args.layers}, bf16 experts "
        f"{args.bf16_experts}",
        flush=True,
    )
    model, cfg = build(torch, args.layers, args.bf16_experts)
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), device="cuda")
    models = sides(torch, vtt, seam, model, [s for s in args.schemes.split(",") if s], prompt, args.torchao)
    parts = {
        "accuracy": lambda: part_accuracy(torch, models, prompt),
        "decode": lambda: part_decode(torch, models, prompt, args.tokens, args.rounds),
        "graph": lambda: part_graph(torch, models, cfg, prompt, args.tokens, args.rounds),
        "prefill": lambda: part_prefill(torch, models, args.prefill, args.rounds),
        "profile": lambda: part_profile(torch, models, prompt, args.prefill),
    }
    for part in args.parts.split(","):
        if part not in parts:
            raise SystemExit(f"--parts must name parts among {', '.join(parts)}, got {part!r}")
        try:
            parts[part]()
        except Exception:
            print(f"\npart {part} failed:\n{traceback.format_exc()}", flush=True)


if __name__ == "__main__":
    main()
