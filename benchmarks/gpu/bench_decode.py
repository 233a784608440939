"""Decode at the speed of the GPU: host cost per call and the Llama-3-8B block per token, against
torch in the same run (needs cupy, torch, a GPU).

1. Host microseconds per call at M = 1 (bf16 activation, ResidentFp8 weight): ``layer.apply(x)`` for
   each activation scheme (the bound fast path after the first call) against torch's bf16
   ``x @ w.t()``, with the layer's device time beside it; ``vt.quantize_fp8`` against cupy's own
   elementwise launch ``x + x``; ``vt.scaled_mm`` against ``torch._scaled_mm``.
2. The seven linear layers of a Llama-3-8B decoder block with SiLU(gate) * up, at M = 1, wall time
   per block: vtnumba eager, vtnumba replayed from a graph (``vtnumba.cuda.capture``), torch bf16
   eager, torch bf16 in ``torch.cuda.CUDAGraph``.

    python3 benchmarks/gpu/bench_decode.py [--calls 2000] [--blocks 300]
"""

import argparse
import time

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)]  # (N, K)
LLAMA_8B = {
    "q": (4096, 4096),
    "k": (1024, 4096),
    "v": (1024, 4096),
    "o": (4096, 4096),
    "gate": (14336, 4096),
    "up": (14336, 4096),
    "down": (4096, 14336),
}


def table(title, header):
    print(f"\n## {title}\n| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def wall_us(fn, n, sync):
    """Wall microseconds per call of a loop of n calls, synchronized once at the end (what a decode
    loop sees: max of host and device time per step)."""
    for _ in range(10):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=300)
    args = ap.parse_args()

    import cupy as cp
    import torch

    import vtnumba as vt
    import vtnumba.cuda as vcuda
    from vtnumba import seam
    from vtnumba.profile import best_device_us, host_us

    rng = np.random.default_rng(0)
    sync = torch.cuda.synchronize

    def bf16_gpu(shape, scale=1.0):
        host = (rng.standard_normal(shape) * scale).astype(BF16)
        return cp.asarray(host.view(np.uint16)).view(BF16), torch.from_numpy(host.view(np.int16)).cuda().view(
            torch.bfloat16
        )

    def fp8_weight(n, k, scheme):
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        return seam.ResidentFp8(
            seam.Fp8Weight.from_float(
                w, input_scale=np.float32(4.0 / 448) if scheme == "static" else None, activation_scheme=scheme
            ),
            "cuda",
        )

    table(
        "host us per call at M = 1 (bf16 x): the FP8 layer vs torch bf16 x @ w.t()",
        ["N x K", "scheme", "vtnumba host", "torch bf16 host", "host ratio", "vtnumba device", "torch device"],
    )
    for n, k in SHAPES:
        x, tx = bf16_gpu((1, k))
        tw = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        t_host = host_us(lambda: tx @ tw.t(), args.calls)
        t_dev = best_device_us(lambda: tx @ tw.t())
        for scheme in ("static", "dynamic", "per_token"):
            layer = seam.make_linear_method(fp8_weight(n, k, scheme))
            v_host = host_us(lambda: layer.apply(x), args.calls)
            v_dev = best_device_us(lambda: layer.apply(x))
            row(
                f"{n}x{k}",
                scheme,
                f"{v_host:.1f}",
                f"{t_host:.1f}",
                f"{t_host / v_host:.2f}x",
                f"{v_dev:.1f}",
                f"{t_dev:.1f}",
            )

    table("host us per call of the public ops (4096^2, M = 1)", ["call", "host us", "peer", "peer host us", "ratio"])
    x, tx = bf16_gpu((1, 4096))
    xx = cp.asarray(rng.standard_normal((1, 4096)).astype(np.float32))
    q = vt.quantize_fp8(x, 0.02)
    b = cp.asarray(rng.integers(0, 0x7E, size=(4096, 4096), dtype=np.uint8))
    sa, sb = cp.asarray(np.array([0.02], np.float32)), cp.asarray(np.array([0.001], np.float32))
    ta = torch.as_tensor(q.data, device="cuda").view(torch.float8_e4m3fn)
    tb = torch.as_tensor(b, device="cuda").view(torch.float8_e4m3fn)
    tsa, tsb = torch.as_tensor(sa, device="cuda"), torch.as_tensor(sb, device="cuda")
    vq = host_us(lambda: vt.quantize_fp8(x, 0.02), args.calls)
    cq = host_us(lambda: xx + xx, args.calls)
    row("vt.quantize_fp8 static", f"{vq:.1f}", "cupy x + x", f"{cq:.1f}", f"{cq / vq:.2f}x")
    vm = host_us(lambda: vt.scaled_mm(q.data, b, sa, sb, out_dtype=BF16), args.calls)
    tm = host_us(lambda: torch._scaled_mm(ta, tb.t(), scale_a=tsa, scale_b=tsb, out_dtype=torch.bfloat16), args.calls)
    row("vt.scaled_mm", f"{vm:.1f}", "torch._scaled_mm", f"{tm:.1f}", f"{tm / vm:.2f}x")

    # -- the Llama-3-8B block -------------------------------------------------------------------
    silu_mul_bits = cp.ElementwiseKernel(
        "uint16 g, uint16 u",
        "uint16 y",
        """float gf = __uint_as_float(((unsigned int)g) << 16), uf = __uint_as_float(((unsigned int)u) << 16);
        unsigned int r = __float_as_uint(gf / (1.0f + expf(-gf)) * uf);
        y = (unsigned short)((r + 0x7FFFu + ((r >> 16) & 1u)) >> 16);""",
        "vt_silu_mul_bf16",
    )
    table(
        "Llama-3-8B decoder block (7 linear layers + SiLU), M = 1, bf16 activations: us per block",
        [
            "scheme",
            "vtnumba eager",
            "vtnumba graph",
            "torch bf16 eager",
            "torch bf16 graph",
            "eager ratio",
            "graph ratio",
        ],
    )
    torch_w = {
        name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for name, (n, k) in LLAMA_8B.items()
    }

    def torch_block(h):
        q = h @ torch_w["q"].t()
        h @ torch_w["k"].t()
        h @ torch_w["v"].t()
        o = q @ torch_w["o"].t()
        g, u = o @ torch_w["gate"].t(), o @ torch_w["up"].t()
        return (torch.nn.functional.silu(g) * u) @ torch_w["down"].t()

    x, tx = bf16_gpu((1, 4096))
    t_eager = wall_us(lambda: torch_block(tx), args.blocks, sync)
    static_tx = tx.clone()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch_block(static_tx)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        torch_block(static_tx)
    t_graph = wall_us(graph.replay, args.blocks, sync)
    for scheme in ("static", "dynamic", "per_token"):
        layers = {name: seam.make_linear_method(fp8_weight(n, k, scheme)) for name, (n, k) in LLAMA_8B.items()}

        def block(h):
            q = layers["q"].apply(h)
            layers["k"].apply(h)
            layers["v"].apply(h)
            o = layers["o"].apply(q)
            g, u = layers["gate"].apply(o), layers["up"].apply(o)
            return layers["down"].apply(silu_mul_bits(g.view(np.uint16), u.view(np.uint16)).view(BF16))

        v_eager = wall_us(lambda: block(x), args.blocks, sync)
        step = vcuda.capture(block, x)
        v_graph = wall_us(lambda: step(x), args.blocks, sync)
        row(
            scheme,
            f"{v_eager:.1f}",
            f"{v_graph:.1f}",
            f"{t_eager:.1f}",
            f"{t_graph:.1f}",
            f"{t_eager / v_eager:.2f}x",
            f"{t_graph / v_graph:.2f}x",
        )
    print(
        "\nratio = torch time / vtnumba time (above 1: vtnumba faster); eager = wall time per block of a loop "
        "synchronized once; graph = wall time per replay of the captured block",
        flush=True,
    )


if __name__ == "__main__":
    main()
