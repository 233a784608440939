"""Host cost at decode, where eager research code runs: what an FP8 call costs the host against the
torch call a user would make instead, interleaved in one run (needs a GPU, cupy, torch; the MoE part
also transformers).

In eager decode the GPU waits on the host, so an FP8 layer wins there only by costing the host less
than torch's bf16 layer. Host microseconds per call: ``--calls`` calls enqueued back to back with no
synchronization, timed on the host, the best of ``--rounds`` rounds, each side's round right after
the other's (the H200's host drifts 2x between runs, so only same-run ratios mean anything). Device
microseconds beside them: 20 calls queued behind a GPU sleep, timed by CUDA events.

Parts (``--parts``):

- ``launch``: one kernel launch -- vtnumba's prepared launch (``PreparedLaunch.launch``: the slots
  packed once, one driver call), its unprepared launch (``Kernel.__call__``: flatten and pack per
  call), a bare ``cuda.bindings`` ``cuLaunchKernel`` of the same function and parameters, cupy's own
  elementwise launch and torch's launch of a trivial op.
- ``seam``: ``seam.matmul_fp8`` at M = 1 (bf16 x, a resident weight, cupy) for each scheme against
  torch's ``x @ w.t()`` in bf16, at Llama-3-8B's four shapes (target <= 0.8x).
- ``linear``: ``vtnumba.torch.Fp8Linear`` at M = 1 and 16, every scheme, against ``nn.Linear`` in
  bf16, 4096 x 4096 (target <= 0.7x); and a Llama-3-8B MLP's three layers (gate, up, down) at M = 1.
- ``moe``: transformers' Qwen3-MoE block (router + experts, Qwen3-30B-A3B shapes) at one token,
  converted, against its bf16 block (target <= 0.5x).

    python3 benchmarks/gpu/bench_host_decode.py [--parts launch,seam,linear,moe] [--calls 200] [--rounds 5]
"""

import argparse
import copy
import time

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)]  # (N, K)
SCHEMES = ["static", "dynamic", "per_token", "per_group"]
LLAMA_MLP = {"gate": (14336, 4096), "up": (14336, 4096), "down": (4096, 14336)}


def table(title, header):
    print(f"\n## {title}\n| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)


def row(*cells):
    print("| " + " | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells) + " |", flush=True)


def host_us(fn, calls, sync):
    """Host microseconds per call of ``calls`` calls enqueued with no synchronization between them."""
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    sync()
    return elapsed / calls * 1e6


def interleaved(sides, calls, rounds, sync):
    """{name: best host us} of each (name, fn), the sides taking turns round by round."""
    best = {name: float("inf") for name, _ in sides}
    for _ in range(rounds):
        for name, fn in sides:
            best[name] = min(best[name], host_us(fn, calls, sync))
    return best


def device_us(torch, fn, calls=20):
    """Device microseconds per call: ``calls`` calls queued behind a GPU sleep, timed by events."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2e7))
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def part_launch(torch, cp, calls, rounds):
    from vtnumba.cuda.ptx.target import cuda, types
    from vtnumba.cuda.runtime.launch import compile_kernel

    def bump(x):  # one tiny kernel, so the launch is all there is
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 1.0

    kernel = compile_kernel(bump, (types.float32[::1],))
    x = cp.zeros(256, cp.float32)
    kernel(1, 256, x)  # compiled and loaded
    stream = cp.cuda.get_current_stream()
    prepared = kernel.prepare(1, 256, x)
    t = torch.zeros(256, device="cuda")
    sides = [
        ("vtnumba prepared launch (PreparedLaunch.launch)", lambda: prepared.launch(stream.ptr)),
        ("vtnumba launch, packed per call (Kernel.__call__)", lambda: kernel(1, 256, x)),
        ("cupy elementwise x += 1", lambda: cp.add(x, 1, out=x)),
        ("torch t.add_(1)", lambda: t.add_(1)),
    ]
    try:  # the driver call itself, through NVIDIA's own Python bindings, on the same parameters
        from cuda.bindings import driver

        fn, cu_stream = driver.CUfunction(prepared._fn_ptr), driver.CUstream(stream.ptr)
        params = prepared._ptrs_address

        def bare():
            driver.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, cu_stream, params, 0)

        bare()
        sides.insert(2, ("bare cuda.bindings cuLaunchKernel", bare))
    except Exception as exc:  # cuda-bindings absent or of another API: say so, time the rest
        print(f"bare cuLaunchKernel not timed: {type(exc).__name__}: {exc}", flush=True)
    best = interleaved(sides, calls, rounds, torch.cuda.synchronize)
    table("host us per launch of a trivial kernel (best of interleaved rounds)", ["launch", "host us", "vs torch"])
    for name, _ in sides:
        row(name, best[name], f"{best[name] / best['torch t.add_(1)']:.2f}x")


def _weight(seam, rng, n, k, scheme):
    """A resident FP8 weight of random finite codes (no host quantization of a large float matrix)."""
    codes = rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8) | (rng.integers(0, 2, size=(n, k), dtype=np.uint8) << 7)
    if scheme == "per_group":
        scale = rng.uniform(1e-3, 1e-2, size=(-(-n // 128), -(-k // 128))).astype(np.float32)
        w = seam.Fp8Weight(codes, scale, block_size=(128, 128))
    else:
        scale = rng.uniform(1e-3, 1e-2, size=n if scheme == "per_token" else 1).astype(np.float32)
        w = seam.Fp8Weight(
            codes,
            scale,
            input_scale=np.float32(0.02) if scheme == "static" else None,
            activation_scheme=scheme,
        )
    return seam.ResidentFp8(w, "cuda")


def part_seam(torch, cp, calls, rounds):
    from vtnumba import seam
    from vtnumba.testing.devices import to_device

    rng = np.random.default_rng(0)
    table(
        "seam.matmul_fp8 at M = 1 (bf16 x, resident weight, cupy) against torch bf16 x @ w.t(), host us "
        "(target <= 0.8x); device us of each side's eager call",
        [
            "N x K",
            "scheme",
            "kernels (eager)",
            "bound == full path",
            "fp8 host us",
            "torch host us",
            "fp8 / torch",
            "fp8 device us",
            "torch device us",
        ],
    )
    for n, k in SHAPES:
        wt = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        xt = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        torch_dev = device_us(torch, lambda: xt @ wt.t())
        for scheme in SCHEMES:
            rw = _weight(seam, rng, n, k, scheme)
            x = to_device(rng.standard_normal((1, k)).astype(BF16), "cuda")
            full = seam.matmul_fp8(x, rw)  # the full path, then the binding
            (binding,) = rw.weight.bound_calls.values()
            # the bound call must give the full path's bytes (the fused launch quantizes as the
            # quantization kernels do and accumulates as the codes GEMV does)
            same = bool((seam.matmul_fp8(x, rw).view(cp.uint16) == full.view(cp.uint16)).all())
            best = interleaved(
                [("fp8", lambda: seam.matmul_fp8(x, rw)), ("torch", lambda: xt @ wt.t())],
                calls,
                rounds,
                torch.cuda.synchronize,
            )
            ours_dev = device_us(torch, lambda: seam.matmul_fp8(x, rw))
            row(
                f"{n} x {k}",
                scheme,
                " + ".join(binding.eager.kernels),
                "bitwise" if same else "DIFFERENT",
                best["fp8"],
                best["torch"],
                f"{best['fp8'] / best['torch']:.2f}x",
                ours_dev,
                torch_dev,
            )


def part_linear(torch, calls, rounds):
    import vtnumba.torch as vtt

    nn = torch.nn
    torch.manual_seed(0)
    table(
        "vtnumba.torch.Fp8Linear eager forward against nn.Linear bf16, 4096 x 4096, host us (target <= 0.7x)",
        [
            "M",
            "scheme",
            "kernels",
            "Fp8Linear host us",
            "nn.Linear host us",
            "fp8 / bf16",
            "fp8 device us",
            "bf16 device us",
        ],
    )
    linear = nn.Linear(4096, 4096, bias=False).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for m in (1, 16):
            x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            bf16_dev = device_us(torch, lambda: linear(x))
            for scheme in SCHEMES:
                layer = vtt.Fp8Linear.from_linear(linear, scheme, input_scale=0.02 if scheme == "static" else None)
                kernels = " + ".join(layer.kernels(x))
                best = interleaved(
                    [("fp8", lambda: layer(x)), ("bf16", lambda: linear(x))], calls, rounds, torch.cuda.synchronize
                )
                row(
                    m,
                    scheme,
                    kernels,
                    best["fp8"],
                    best["bf16"],
                    f"{best['fp8'] / best['bf16']:.2f}x",
                    device_us(torch, lambda: layer(x)),
                    bf16_dev,
                )
        table(
            "a Llama-3-8B MLP's three layers (gate, up, down) at M = 1, host us (target <= 0.7x)",
            ["scheme", "fp8 host us", "bf16 host us", "fp8 / bf16", "fp8 device us", "bf16 device us"],
        )
        bf16 = {name: nn.Linear(k, n, bias=False).to("cuda", torch.bfloat16) for name, (n, k) in LLAMA_MLP.items()}
        x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
        h = torch.randn(1, 14336, device="cuda", dtype=torch.bfloat16)

        def three(layers):
            return lambda: (layers["gate"](x), layers["up"](x), layers["down"](h))

        bf16_dev = device_us(torch, three(bf16))
        for scheme in SCHEMES:
            fp8 = {
                name: vtt.Fp8Linear.from_linear(lin, scheme, input_scale=0.02 if scheme == "static" else None)
                for name, lin in bf16.items()
            }
            best = interleaved([("fp8", three(fp8)), ("bf16", three(bf16))], calls, rounds, torch.cuda.synchronize)
            row(
                scheme,
                best["fp8"],
                best["bf16"],
                f"{best['fp8'] / best['bf16']:.2f}x",
                device_us(torch, three(fp8)),
                bf16_dev,
            )


def part_moe(torch, calls, rounds):
    import transformers
    from bench_torch_moe import QWEN3_30B  # the same shapes as the model benchmark's

    import vtnumba.torch as vtt

    cfg = transformers.Qwen3MoeConfig(num_hidden_layers=1, **dict(QWEN3_30B, vocab_size=1024))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).eval()
    table(
        "transformers' Qwen3-MoE block (router + experts, Qwen3-30B-A3B shapes) at one token, host us "
        "(target <= 0.5x the bf16 block)",
        ["scheme", "bf16 experts", "fp8 host us", "bf16 host us", "fp8 / bf16", "fp8 device us", "bf16 device us"],
    )
    x = torch.randn(1, 1, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for scheme in ("per_token", "per_group"):
            fp8 = vtt.convert(copy.deepcopy(model), scheme, ignore=["lm_head"])
            block = fp8.model.layers[0].mlp
            for impl in ("grouped_mm", "batched_mm"):
                bf16 = copy.deepcopy(model)
                if hasattr(bf16, "set_experts_implementation"):
                    bf16.set_experts_implementation(impl)
                else:
                    bf16.config._experts_implementation = impl
                peer = bf16.model.layers[0].mlp
                best = interleaved(
                    [("fp8", lambda: block(x)), ("bf16", lambda: peer(x))], calls, rounds, torch.cuda.synchronize
                )
                row(
                    scheme,
                    impl,
                    best["fp8"],
                    best["bf16"],
                    f"{best['fp8'] / best['bf16']:.2f}x",
                    device_us(torch, lambda: block(x)),
                    device_us(torch, lambda: peer(x)),
                )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="launch,seam,linear,moe")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import cupy as cp
    import torch

    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; cupy {cp.__version__}", flush=True)
    parts = args.parts.split(",")
    for name, part in (
        ("launch", lambda: part_launch(torch, cp, args.calls, args.rounds)),
        ("seam", lambda: part_seam(torch, cp, args.calls, args.rounds)),
        ("linear", lambda: part_linear(torch, args.calls, args.rounds)),
        ("moe", lambda: part_moe(torch, args.calls, args.rounds)),
    ):
        if name in parts:
            try:
                part()
            except Exception as exc:  # one part failing must not hide the others' figures
                import traceback

                print(f"part {name} failed: {type(exc).__name__}: {exc}", flush=True)
                traceback.print_exc()


if __name__ == "__main__":
    main()
