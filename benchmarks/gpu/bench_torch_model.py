"""A torch model converted by vtnumba, timed as its user meets it, against the same model in bf16 and
against torch's own FP8 path, in the same run (needs torch, cupy, a GPU; transformers for --parts decode).

Parts (``--parts``, comma-separated; all by default):

- ``mlp``: the Llama-3-8B MLP (gate and up 14336 x 4096, down 4096 x 14336, bf16, SiLU(gate) * up)
  as a torch module; ``vtnumba.torch.convert`` of it per scheme; and torch's own FP8 peer per scheme
  (the quantization under torch.compile, then ``torch._scaled_mm``: per-tensor, rowwise, or 128 x 128
  block scales). Device time per forward: M <= 16 replayed from a CUDA graph on every side, larger M
  eager behind a queued sleep (pure GPU time).
- ``profile``: torch.profiler's breakdown of one converted forward per scheme (quantization, GEMM,
  epilogue, other), and the torch peer's.
- ``kernels``: the quantization kernels (per-group in its three forms, per-token, dynamic in one or
  two launches) and the f32-staged epilogue on Llama shapes, in TB/s against torch's copy.
- ``host``: host microseconds per eager forward of one 4096 x 4096 layer at M = 1: ``Fp8Linear``
  against ``nn.Linear`` in bf16 (a loop of calls behind a queued sleep, so the GPU never holds the
  host back).
- ``decode``: transformers' ``LlamaForCausalLM`` with Llama-3-8B shapes (``--layers`` layers, random
  weights, no download), greedy decode of ``--tokens`` tokens: eager ``generate`` (tokens/s, best of
  3 after a warm-up) and each side's best path -- one decode step with a static KV cache captured in
  a CUDA graph and replayed -- with the host and device time of one eager step; bf16 and every
  scheme, lm_head kept in bf16.
- ``convert``: time and GPU memory to convert a model with Llama-3-8B linear shapes (32 layers x 7
  linears) that already sits on the GPU.

    python3 benchmarks/gpu/bench_torch_model.py [--parts mlp,profile,host,convert,decode,graph] [--ms 1,16,256,4096]
"""

import argparse
import copy
import os
import time

SCHEMES = ["static", "dynamic", "per_token", "per_group"]
LLAMA_8B = dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=128256)
LINEARS_8B = {
    "q_proj": (4096, 4096),
    "k_proj": (1024, 4096),
    "v_proj": (1024, 4096),
    "o_proj": (4096, 4096),
    "gate_proj": (14336, 4096),
    "up_proj": (14336, 4096),
    "down_proj": (4096, 14336),
}


def table(title, header):
    print(f"\n## {title}\n| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)


def row(*cells):
    print(
        "| "
        + " | ".join(c if isinstance(c, str) else f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells)
        + " |",
        flush=True,
    )


def ratio(a, b):
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"


# -- timing ----------------------------------------------------------------------------------------


def device_us(torch, fn, calls=20, graph=False, sleep_cycles=int(2e7)):
    """GPU microseconds per call of fn(): eager calls behind a queued sleep (long enough that the
    host enqueues every call before the GPU starts: ``sleep_cycles``), or (graph=True) the calls
    captured once into a CUDA graph and replayed behind the sleep."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        run = g.replay
        reps = 1
    else:
        run, reps = fn, calls
    best = None
    for _ in range(3):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        start.record()
        for _ in range(reps):
            run()
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1e3 / calls
        best = us if best is None else min(best, us)
    return best


def host_us(torch, fn, calls=200):
    """Host microseconds per call: a loop of calls behind a long queued sleep (the GPU cannot push
    back), the host clock around it."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = None
    for _ in range(5):
        torch.cuda._sleep(int(1e9))
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        best = t if best is None else min(best, t)
    return best


# -- the models ------------------------------------------------------------------------------------


def mlp_module(torch, hidden, intermediate, dtype):
    nn = torch.nn

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
            self.up_proj = nn.Linear(hidden, intermediate, bias=False)
            self.down_proj = nn.Linear(intermediate, hidden, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    torch.manual_seed(0)
    m = Mlp().to("cuda", dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
    return m.eval()


def converted(torch, vtt, model, scheme, sample):
    model = copy.deepcopy(model)
    scales = vtt.calibrate(model, lambda: model(sample)) if scheme == "static" else None
    return vtt.convert(model, scheme, input_scales=scales, ignore=["lm_head"])


class TorchFp8Peer:
    """torch's own FP8 linear path for a scheme: the activation quantized by a torch.compile'd
    function, then ``torch._scaled_mm`` (cuBLASLt) with the weight quantized as vtnumba does."""

    def __init__(self, torch, vtt, linear, scheme, input_scale=None):
        self.torch, self.scheme = torch, scheme
        layer = vtt.Fp8Linear.from_linear(linear, scheme, input_scale=input_scale)
        self.w_t = layer.weight.t()  # [K, N] column-major, what _scaled_mm's b must be
        f8 = torch.float8_e4m3fn
        if scheme == "per_group":
            self.sb = layer.weight_scale.t()  # [K/128, N/128]
        elif scheme == "per_token":
            self.sb = layer.weight_scale.reshape(1, -1)
        else:
            self.sb = layer.weight_scale.reshape(())
        inv = None if input_scale is None else torch.tensor(1.0 / float(input_scale), device="cuda")
        self.sa_static = None if input_scale is None else torch.tensor(float(input_scale), device="cuda")

        def quant_static(x):
            return (x.float() * inv).clamp(-448, 448).to(f8)

        def quant_dynamic(x):
            s = torch.clamp_min(x.abs().amax().float() / 448, 1 / (448 * 512))
            return (x.float() / s).clamp(-448, 448).to(f8), s

        def quant_token(x):
            s = torch.clamp_min(x.abs().amax(dim=-1, keepdim=True).float() / 448, 1 / (448 * 512))
            return (x.float() / s).clamp(-448, 448).to(f8), s

        def quant_group(x):
            m, k = x.shape
            g = x.float().view(m, k // 128, 128)
            s = torch.clamp_min(g.abs().amax(dim=-1, keepdim=True), 1e-10) / 448
            q = (g / s).clamp(-448, 448).to(f8).view(m, k)
            return q, s.view(m, k // 128).t().contiguous().t()  # [M, K/128], m contiguous

        fn = {"static": quant_static, "dynamic": quant_dynamic, "per_token": quant_token, "per_group": quant_group}[
            scheme
        ]
        self.quant = torch.compile(fn, dynamic=False)

    def __call__(self, x):
        torch = self.torch
        x2 = x.reshape(-1, x.shape[-1])
        if self.scheme == "static":
            q, sa = self.quant(x2), self.sa_static
        else:
            q, sa = self.quant(x2)
        y = torch._scaled_mm(q, self.w_t, scale_a=sa, scale_b=self.sb, out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], -1)


def peer_mlp(torch, vtt, model, scheme, sample):
    scales = vtt.calibrate(model, lambda: model(sample)) if scheme == "static" else {}
    gate, up, down = (
        TorchFp8Peer(torch, vtt, getattr(model, n), scheme, scales.get(n))
        for n in ("gate_proj", "up_proj", "down_proj")
    )
    silu = torch.nn.functional.silu
    return lambda x: down(silu(gate(x)) * up(x))


# -- the parts ---------------------------------------------------------------------------------------


def part_mlp(torch, vtt, ms, f32_staged_row=False):
    h, i = LLAMA_8B["hidden"], LLAMA_8B["intermediate"]
    model = mlp_module(torch, h, i, torch.bfloat16)
    sample = torch.randn(64, h, device="cuda", dtype=torch.bfloat16)
    table(
        "Llama-3-8B MLP (gate/up 14336x4096, down 4096x14336, bf16): device us per forward "
        "(M <= 16 replayed from a CUDA graph, larger M eager)",
        [
            "scheme",
            "M",
            "bf16 us",
            "vtnumba us",
            "vtnumba vs bf16",
            "torch fp8 us",
            "torch fp8 vs bf16",
            "vtnumba vs torch fp8",
        ],
    )
    with torch.no_grad():
        bf16_us = {
            m: device_us(
                torch,
                lambda x=torch.randn(m, h, device="cuda", dtype=torch.bfloat16): model(x),  # noqa: B008 (one input per m)
                graph=m <= 16,
            )
            for m in ms
        }
        for scheme in SCHEMES + (["per_token f32-staged"] if f32_staged_row else []):
            # the optional last row: per-token with cuBLASLt's OUTER_VEC plans refused at every M, so
            # its GEMMs run cuBLASLt into float32 and the 8-wide Numba epilogue (gemm.OUTER_VEC_MIN_M)
            staged = scheme.endswith("f32-staged")
            if staged:
                os.environ["VT_DISABLE_KERNELS"] = "cublaslt"
            scheme = scheme.split()[0]
            ours = converted(torch, vtt, model, scheme, sample)
            peer = peer_mlp(torch, vtt, model, scheme, sample)
            for m in ms:
                x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
                vt_us = device_us(torch, lambda: ours(x), graph=m <= 16)
                try:
                    peer_us = device_us(torch, lambda: peer(x), graph=m <= 16)
                except Exception as exc:  # torch refuses some shapes (block scales at M = 1)
                    peer_us = None
                    print(f"  torch fp8 {scheme} M={m}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                row(
                    scheme + (" f32-staged" if staged else ""),
                    m,
                    bf16_us[m],
                    vt_us,
                    ratio(bf16_us[m], vt_us),
                    "n/a" if peer_us is None else peer_us,
                    ratio(bf16_us[m], peer_us),
                    ratio(peer_us, vt_us),
                )
            os.environ.pop("VT_DISABLE_KERNELS", None)
            ours = peer = None
            torch.cuda.empty_cache()
    print("vs: time of the other side / time of this side (above 1: this side is faster)")


def _category(name):
    if "vtnumba" in name:
        if "quantize" in name or "amax" in name:
            return "quant"
        if "epilogue" in name:
            return "epilogue"
        return "GEMM"
    if "gemm" in name.lower() or "nvjet" in name or "xmma" in name or "cutlass" in name:
        return "GEMM"
    if "triton" in name:
        return "quant"
    return "other"


def part_profile(torch, vtt, ms):
    from torch.profiler import ProfilerActivity, profile

    h, i = LLAMA_8B["hidden"], LLAMA_8B["intermediate"]
    model = mlp_module(torch, h, i, torch.bfloat16)
    sample = torch.randn(64, h, device="cuda", dtype=torch.bfloat16)
    table(
        "torch.profiler: where one MLP forward's GPU time goes (us; eager, after warm-up)",
        ["side", "scheme", "M", "quant", "GEMM", "epilogue", "other", "total", "kernels"],
    )
    with torch.no_grad():
        for scheme in SCHEMES:
            sides = [
                ("vtnumba", converted(torch, vtt, model, scheme, sample)),
                ("torch fp8", peer_mlp(torch, vtt, model, scheme, sample)),
            ]
            for side, fn in sides:
                for m in ms:
                    x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16)
                    try:
                        for _ in range(3):
                            fn(x)
                        torch.cuda.synchronize()
                        with profile(activities=[ProfilerActivity.CUDA]) as prof:
                            fn(x)
                            torch.cuda.synchronize()
                    except Exception:
                        continue
                    spent = {"quant": 0.0, "GEMM": 0.0, "epilogue": 0.0, "other": 0.0}
                    count = 0
                    for e in prof.events():
                        if e.device_type == torch.autograd.DeviceType.CUDA:
                            spent[_category(e.name)] += getattr(e, "device_time", None) or e.cuda_time
                            count += 1
                    row(
                        side,
                        scheme,
                        m,
                        spent["quant"],
                        spent["GEMM"],
                        spent["epilogue"],
                        spent["other"],
                        sum(spent.values()),
                        count,
                    )


def part_host(torch, vtt):
    nn = torch.nn
    torch.manual_seed(0)
    linear = nn.Linear(4096, 4096, bias=False).to("cuda", torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    table(
        "host us per eager forward, 4096 x 4096, M = 1, bf16 x (loop behind a queued sleep)",
        ["layer", "host us", "vs nn.Linear (<= 1.3x)", "device us"],
    )
    with torch.no_grad():
        base = host_us(torch, lambda: linear(x))
        row("nn.Linear bf16", base, "1.00x", device_us(torch, lambda: linear(x)))
        for scheme in SCHEMES:
            layer = vtt.Fp8Linear.from_linear(linear, scheme, input_scale=0.01 if scheme == "static" else None)
            us = host_us(torch, lambda: layer(x))
            row(f"Fp8Linear {scheme}", us, f"{us / base:.2f}x", device_us(torch, lambda: layer(x)))


def part_kernels(torch):
    """The quantization and epilogue kernels a converted Llama runs, on its shapes, against torch's copy of
    the same bytes."""
    import cupy
    import numpy as np

    from vtnumba._interop import to_native
    from vtnumba.cuda import quantize as backend
    from vtnumba.cuda.kernels import epilogue, quant

    backend._backend()
    table(
        "quantization kernels, bf16 x: device us and TB/s (bytes read + written); copy = torch clone of x",
        ["kernel", "M x K", "us", "TB/s", "copy TB/s", "vs copy"],
    )
    for m, k in [(256, 4096), (256, 14336), (4096, 4096), (4096, 14336)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xc = to_native(x)
        copy_rate = 2 * x.nbytes / device_us(torch, lambda: x.clone()) / 1e6
        group_bytes = 2 * m * k + m * k + 4 * m * (k // 128)
        xin, kind, shape, n, aligned, _ = backend._input(xc)
        out, scales = cupy.empty(shape, np.uint8), backend._group_scales(m, k // 128, True)
        encoder = backend.encoder_in_use()
        forms = {
            "per-group 128, a chunk a lane": quant.per_group_vector_kernel(kind, encoder, False, 8, True),
            "per-group 128, 16-wide loop": quant.per_group_vector_kernel(kind, encoder, False, 8, False),
            "per-group 128, element per lane": quant.per_group_kernel(kind, encoder, False) + (quant.GROUP_WARPS,),
        }
        for label, (kernel, threads, per_block) in forms.items():
            blocks = max(1, min(-(-m * (k // 128) // per_block), quant.MAX_BLOCKS))
            args = (xin, backend._flat(out), backend._flat(scales.T), m, k, 128, 1, m)
            us = device_us(torch, lambda: kernel(blocks, threads, *args))
            row(label, f"{m} x {k}", us, group_bytes / us / 1e6, copy_rate, f"{group_bytes / us / 1e6 / copy_rate:.2f}")
        us = device_us(torch, lambda: backend.quantize_per_token(xc, None))
        nbytes = 3 * m * k + 4 * m
        row("per-token", f"{m} x {k}", us, nbytes / us / 1e6, copy_rate, f"{nbytes / us / 1e6 / copy_rate:.2f}")
    table(
        "dynamic per-tensor quantization, bf16 x: device us per call (eager, queued behind a sleep)",
        ["M x K", "one launch (one block)", "two launches (amax partials, quantize)"],
    )
    for m, k in [(1, 4096), (1, 14336), (16, 4096), (4, 16384), (64, 16384)]:
        xc = to_native(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        saved = quant.SMALL_DYNAMIC_MAX
        quant.SMALL_DYNAMIC_MAX = 1 << 30
        one = device_us(torch, lambda: backend.quantize_dynamic(xc))
        quant.SMALL_DYNAMIC_MAX = 0
        two = device_us(torch, lambda: backend.quantize_dynamic(xc))
        quant.SMALL_DYNAMIC_MAX = saved
        row(f"{m} x {k}", one, two)
    table(
        "f32-staged epilogue, float32 accumulator -> bf16 y, per-row x per-channel scales: TB/s (read 4 + "
        "write 2 bytes an element) against torch's copy of the accumulator",
        [
            "M x N",
            "8-wide us",
            "8-wide TB/s",
            "element-per-thread us",
            "element TB/s",
            "copy TB/s",
            "8-wide vs copy (>= 0.8)",
        ],
    )
    for m, n in [(256, 14336), (4096, 4096), (4096, 14336)]:
        acc = torch.randn(m, n, device="cuda")
        copy_rate = 2 * acc.nbytes / device_us(torch, lambda: acc.clone()) / 1e6
        accc, y = to_native(acc), cupy.empty((m, n), np.uint16)
        sa, sb = (
            cupy.random.uniform(0.01, 0.1, m).astype(np.float32),
            cupy.random.uniform(0.01, 0.1, n).astype(np.float32),
        )
        bias = cupy.zeros(1, np.uint16)
        launch = epilogue.epilogue_launch(accc, y, sa, 1, sb, 1, bias, 0, epilogue.OutKind.BFLOAT16)
        wide = device_us(torch, lambda: launch[0](launch[1], launch[2], *launch[3]))
        one_kernel = epilogue.epilogue_kernel(False)
        blocks = max(1, min((m * n + 255) // 256, 4096))
        one = device_us(torch, lambda: one_kernel(blocks, 256, accc, y, sa, 1, sb, 1, bias, 0, 2))
        nbytes = 6 * m * n
        row(
            f"{m} x {n}",
            wide,
            nbytes / wide / 1e6,
            one,
            nbytes / one / 1e6,
            copy_rate,
            f"{nbytes / wide / 1e6 / copy_rate:.2f}",
        )


def llama(torch, layers):
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=LLAMA_8B["hidden"],
        intermediate_size=LLAMA_8B["intermediate"],
        num_attention_heads=LLAMA_8B["heads"],
        num_key_value_heads=LLAMA_8B["kv_heads"],
        num_hidden_layers=layers,
        vocab_size=LLAMA_8B["vocab"],
        max_position_embeddings=4096,
        rope_theta=500000.0,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    return model.eval(), cfg


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


def graph_decode_tokens_per_s(torch, model, cfg, prompt, tokens):
    """Greedy decode with a static KV cache, each step one CUDA graph replay (the argmax and the
    next position on the GPU too): tokens per second over ``tokens`` steps, best of 3.

    Before every round the cache is emptied and the prompt prefilled again, outside the clock:
    transformers 5.17's Llama takes a step's write position from the cache's contents, not only
    from ``cache_position``, so replays without a reset walk past the cache's end (the device-side
    assert in ``index_copy_`` that an earlier version of this harness hit on the H200)."""
    length = prompt.shape[1] + tokens + 8
    cache = _static_cache(cfg, length, torch)
    start = prompt.shape[1]
    with torch.no_grad():
        ids = torch.zeros((1, 1), dtype=torch.long, device="cuda")
        position = torch.tensor([start], device="cuda")

        def prefill():
            cache.reset()
            pos = torch.arange(start, device="cuda")
            logits = model(input_ids=prompt, past_key_values=cache, cache_position=pos, use_cache=True).logits
            ids.copy_(logits[:, -1:].argmax(-1))
            position.fill_(start)

        prefill()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True).logits
            ids.copy_(out[:, -1:].argmax(-1))
            position.add_(1)
        best = None
        for _ in range(3):
            prefill()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(tokens):
                graph.replay()
            torch.cuda.synchronize()
            rate = tokens / (time.perf_counter() - t0)
            best = rate if best is None else max(best, rate)
    return best


def eager_step_us(torch, model, prompt):
    """(wall us, device us) of one eager decode step (a dynamic cache after the prompt): the wall time
    of a loop of steps synchronized once (a step is host-bound: its host cost), and the GPU time of
    steps queued behind a sleep long enough (~0.1 s) for the host to enqueue them all."""
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        cache, ids = out.past_key_values, out.logits[:, -1:].argmax(-1)

        def step():  # the cache grows by a token a call: forty calls stay a short context
            model(input_ids=ids, past_key_values=cache, use_cache=True)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 10 * 1e6
        device = device_us(torch, step, calls=5, sleep_cycles=int(3e8))
    return wall, device


def part_decode(torch, vtt, layers, tokens, eager=True, graphs=True, schemes=SCHEMES, prompt_len=32, rounds=3):
    model, cfg = llama(torch, layers)
    prompt = torch.randint(0, LLAMA_8B["vocab"], (1, prompt_len), device="cuda")
    sample = torch.randint(0, LLAMA_8B["vocab"], (1, 32), device="cuda")
    converted_models = {"bf16": model}
    for scheme in schemes:
        m = copy.deepcopy(model)
        scales = vtt.calibrate(m, lambda: m(sample)) if scheme == "static" else None
        converted_models[scheme] = vtt.convert(m, scheme, input_scales=scales, ignore=["lm_head"])
    if eager:
        table(
            f"transformers LlamaForCausalLM, Llama-3-8B shapes, {layers} layers, random weights: greedy eager "
            f"generate of {tokens} tokens after a {prompt_len}-token prompt (lm_head bf16), best of {rounds} "
            f"rounds interleaved side by side",
            [
                "model",
                "eager generate tok/s",
                "vs bf16",
                "rounds",
                "eager step wall us",
                "eager step device us",
                "device-bound tok/s (1e6 / step device us)",
                "vs bf16",
            ],
        )
        kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        rates = {scheme: [] for scheme in converted_models}
        with torch.no_grad():
            for m in converted_models.values():  # warm-up: compiles, binds, fills the allocator
                m.generate(prompt, **dict(kwargs, max_new_tokens=8, min_new_tokens=8))
            for _ in range(rounds):  # the host drifts: every side gets each round's conditions
                for scheme, m in converted_models.items():
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    m.generate(prompt, **kwargs)
                    torch.cuda.synchronize()
                    rates[scheme].append(tokens / (time.perf_counter() - t0))
        base = {}
        for scheme, m in converted_models.items():
            rate = max(rates[scheme])
            host, dev = eager_step_us(torch, m, prompt)
            bound = 1e6 / dev
            if scheme == "bf16":
                base = {"eager": rate, "bound": bound}
            row(
                scheme,
                rate,
                ratio(rate, base["eager"]),
                " ".join(f"{r:.1f}" for r in rates[scheme]),
                host,
                dev,
                bound,
                ratio(bound, base["bound"]),
            )
        table(
            "where an eager decode step's host time goes (a dynamic cache after the prompt; each linear "
            "layer's forward timed on the host)",
            ["model", "step host us", "in the linear layers us", "linear layers", "per layer us", "outside them us"],
        )
        from _host_share import host_share

        from vtnumba.torch import Fp8Linear

        for scheme, m in converted_models.items():
            with torch.no_grad():
                out = m(input_ids=prompt, use_cache=True)
                cache, ids = out.past_key_values, out.logits[:, -1:].argmax(-1)
                step_us, inside, count = host_share(
                    torch,
                    m,
                    (torch.nn.Linear, Fp8Linear),
                    lambda m=m, ids=ids, cache=cache: m(input_ids=ids, past_key_values=cache, use_cache=True),
                )
            row(scheme, step_us, inside, count, inside / count, step_us - inside)
    if not graphs:
        return
    # each side's best path: one decode step with a static KV cache captured in a CUDA graph
    table(
        "the same, one decode step with a static KV cache captured in a CUDA graph and replayed",
        ["model", "graph step tok/s", "vs bf16"],
    )
    base_graph = None
    for scheme, m in converted_models.items():
        try:
            rate = graph_decode_tokens_per_s(torch, m, cfg, prompt, tokens)
        except Exception as exc:
            print(f"  graph decode {scheme}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        base_graph = base_graph or rate
        row(scheme, rate, ratio(rate, base_graph))


def part_convert(torch, vtt, layers=32):
    nn = torch.nn
    table(
        f"convert of a model on the GPU with Llama-3-8B linear shapes ({layers} layers x 7 linears, bf16)",
        ["scheme", "convert s", "GPU GB before", "GPU GB after", "peak GB during", "bf16 weights freed"],
    )
    for scheme in SCHEMES:
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = nn.ModuleList(
                [
                    nn.ModuleDict(
                        {name: nn.Linear(k, n, bias=False, dtype=torch.bfloat16) for name, (n, k) in LINEARS_8B.items()}
                    )
                    for _ in range(layers)
                ]
            )
        scales = {f"{i}.{name}": 0.02 for i in range(layers) for name in LINEARS_8B} if scheme == "static" else None
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        vtt.convert(model, scheme, input_scales=scales)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        after, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        freed = not any(isinstance(mod, nn.Linear) for mod in model.modules())
        row(scheme, seconds, before / 1e9, after / 1e9, peak / 1e9, "yes" if freed and after < 0.6 * before else "no")
        del model
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--parts",
        default="mlp,profile,host,kernels,convert,decode,graph",
        help="also 'staged': the MLP's per-token row with OUTER_VEC refused at every M",
    )
    ap.add_argument("--ms", default="1,16,256,4096")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32, help="decode's prompt length")
    ap.add_argument("--rounds", type=int, default=3, help="decode's interleaved rounds")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="decode's schemes (bf16 always runs)")
    args = ap.parse_args()
    import torch

    import vtnumba.torch as vtt

    parts = args.parts.split(",")
    ms = [int(m) for m in args.ms.split(",")]
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    if "mlp" in parts:
        part_mlp(torch, vtt, ms, f32_staged_row="staged" in parts)
    if "profile" in parts:
        part_profile(torch, vtt, [16, 4096])
    if "host" in parts:
        part_host(torch, vtt)
    if "kernels" in parts:
        part_kernels(torch)
    if "convert" in parts:
        part_convert(torch, vtt)
    if "decode" in parts or "graph" in parts:  # 'graph' alone: only each side's best path
        part_decode(
            torch,
            vtt,
            args.layers,
            args.tokens,
            eager="decode" in parts,
            graphs="graph" in parts,
            schemes=args.schemes.split(","),
            prompt_len=args.prompt,
            rounds=args.rounds,
        )


if __name__ == "__main__":
    main()
