"""Mixture-of-experts in FP8 on the GPU, against the peers a torch user would pick, in one run
(device time behind a queued spin, ``vtnumba.profile.best_device_us``; needs cupy, torch and a GPU).

1. The gate_up grouped GEMM alone (codes in, bf16 out) at DeepSeek-V3's and Qwen3-30B-A3B's
   expert shapes: vtnumba's grouped GEMM (per-row activation scales x per-channel weight scales,
   and 128 x 128 block scales with 1 x 128 activation groups) against ``torch._scaled_grouped_mm``
   (rowwise scales, the same FP8 bytes) and bf16 ``torch._grouped_mm``, with the kernel vtnumba ran
   and the FP8 weight bytes at the copy rate measured in the same run.
2. The whole ``seam.moe_fp8`` layer at batch-1 decode (Qwen3-30B-A3B: top-8 of 128 experts, 8
   distinct), eager and replayed from a CUDA graph, against reading the 8 routed experts' FP8
   weights at the copy rate.

    python3 benchmarks/gpu/bench_moe.py [--quick]
"""

import argparse
import datetime
import subprocess

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
# (label, experts E, N, K, rows per expert)
GATE_UP_SHAPES = [
    ("DeepSeek-V3 gate_up, 16 local experts", 16, 4096, 7168, (8, 512)),
    ("Qwen3-30B-A3B gate_up", 128, 1536, 2048, (8, 64)),
]
QWEN3_MOE = dict(experts=128, hidden=2048, intermediate=768, top_k=8)


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def random_codes(cp, rng, shape):
    """e4m3 codes of both signs, no NaN (0x7F / 0xFF), on the GPU."""
    mag = rng.integers(0, 0x7F, size=shape, dtype=np.uint8)
    return cp.asarray(mag | (rng.integers(0, 2, size=shape, dtype=np.uint8) << 7))


def copy_tb_s(cp, best_device_us):
    """The device's copy rate on a 1 GiB buffer, bytes read + written per second: the rate at which
    a kernel that only streams weights in can read them (the weight-read floor)."""
    src = cp.ones(1 << 28, dtype=cp.float32)
    dst = cp.empty_like(src)
    us = best_device_us(lambda: cp.copyto(dst, src), 10, 3)
    return 2 * src.nbytes / (us * 1e-6) / 1e12


def grouped_gemm_table(args, cp, torch, rng, us, tb_s):
    from vtnumba.cuda import experts as gpu_experts

    kernel_of = getattr(gpu_experts, "grouped_kernel_for", None)
    print("\n## 1. gate_up grouped GEMM, codes in, bf16 out (device us)\n")
    row(
        "shape",
        "rows / expert",
        "vtnumba scheme",
        "vtnumba us",
        "kernel",
        "torch FP8 rowwise us",
        "bf16 us",
        "vs torch FP8",
        "vs bf16",
        "weight bytes at copy rate us",
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, e, n, k, rows_each in GATE_UP_SHAPES:
        b = random_codes(cp, rng, (e, n, k))
        sb_channel = cp.asarray(rng.uniform(0.5, 1.5, size=(e, n)).astype(np.float32) * 1e-2)
        sb_block = cp.asarray(rng.uniform(0.5, 1.5, size=(e, -(-n // 128), -(-k // 128))).astype(np.float32) * 1e-2)
        b_torch = torch.as_tensor(b, device="cuda").view(torch.float8_e4m3fn).transpose(-2, -1)
        b_bf16 = (torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) * 0.02).transpose(-2, -1)
        floor_us = b.nbytes / (tb_s * 1e12) * 1e6
        for r in rows_each if not args.quick else rows_each[:1]:
            m = e * r
            a = random_codes(cp, rng, (m, k))
            sa_row = cp.asarray(rng.uniform(0.5, 1.5, size=m).astype(np.float32) * 1e-2)
            sa_group = cp.asarray(rng.uniform(0.5, 1.5, size=(m, -(-k // 128))).astype(np.float32) * 1e-2)
            offsets = cp.asarray(np.arange(e + 1, dtype=np.int32) * r)
            ends = torch.as_tensor(offsets[1:], device="cuda")
            a_torch = torch.as_tensor(a, device="cuda").view(torch.float8_e4m3fn)
            sa_torch = torch.as_tensor(sa_row, device="cuda")
            sb_torch = torch.as_tensor(sb_channel, device="cuda")
            a_bf16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            try:
                t_torch = us(
                    lambda: torch._scaled_grouped_mm(
                        a_torch, b_torch, sa_torch, sb_torch, offs=ends, out_dtype=torch.bfloat16
                    )
                )
            except Exception as exc:  # the peer runs on sm_90 / sm_100 only
                t_torch, why = None, f"{type(exc).__name__}: {exc}"
                print(f"torch._scaled_grouped_mm failed: {why[:200]}")
            try:
                t_bf16 = us(lambda: torch._grouped_mm(a_bf16, b_bf16, offs=ends))
            except Exception as exc:
                t_bf16 = None
                print(f"torch._grouped_mm failed: {type(exc).__name__}: {str(exc)[:200]}")
            for scheme, sa, sb, block in (
                ("per-token x per-channel", sa_row, sb_channel, None),
                ("1x128 groups x 128x128 blocks", sa_group, sb_block, (128, 128)),
            ):
                call = (a, sa, b, sb, offsets, BF16, block)
                t_vt = us(lambda: gpu_experts.grouped_scaled_mm(*call))
                kernel = kernel_of(*call) if kernel_of is not None else "?"
                row(
                    label,
                    r,
                    scheme,
                    f"{t_vt:.1f}",
                    kernel,
                    "n/a" if t_torch is None else f"{t_torch:.1f}",
                    "n/a" if t_bf16 is None else f"{t_bf16:.1f}",
                    "n/a" if t_torch is None else f"{t_torch / t_vt:.2f}x",
                    "n/a" if t_bf16 is None else f"{t_bf16 / t_vt:.2f}x",
                    f"{floor_us:.1f}",
                )
        b = b_torch = b_bf16 = None  # free this shape's weights before the next is built


def decode_layer_table(args, cp, torch, rng, us, tb_s):
    import vtnumba.cuda as vtcuda
    from vtnumba import profile, seam

    cfg = QWEN3_MOE
    e, h, inter, top_k = cfg["experts"], cfg["hidden"], cfg["intermediate"], cfg["top_k"]
    print(
        f"\n## 2. the whole moe_fp8 layer at batch-1 decode (Qwen3-30B-A3B: {e} experts, H {h}, I {inter}, "
        f"top-{top_k} distinct) (device us)\n"
    )
    row("scheme", "eager us", "graph replay us", "8 experts' FP8 bytes at copy rate us", "graph / floor")
    print("|---|---|---|---|---|")
    schemes = [("per_token", dict(activation_scheme="per_token"), None), ("per_group 128x128", dict(), (128, 128))]
    profiles = []
    for name, kw, block in schemes if not args.quick else schemes[:1]:
        if block is None:
            sgu = cp.asarray(rng.uniform(0.5, 1.5, size=(e, 2 * inter)).astype(np.float32) * 1e-2)
            sdn = cp.asarray(rng.uniform(0.5, 1.5, size=(e, h)).astype(np.float32) * 1e-2)
        else:
            sgu = cp.asarray(rng.uniform(0.5, 1.5, size=(e, 2 * inter // 128, h // 128)).astype(np.float32) * 1e-2)
            sdn = cp.asarray(rng.uniform(0.5, 1.5, size=(e, h // 128, inter // 128)).astype(np.float32) * 1e-2)
        gu = seam.Fp8Experts(random_codes(cp, rng, (e, 2 * inter, h)), sgu, block_size=block, **kw)
        dn = seam.Fp8Experts(random_codes(cp, rng, (e, h, inter)), sdn, block_size=block, **kw)
        x = cp.asarray(rng.standard_normal((1, h)).astype(BF16))
        ids = cp.asarray(rng.permutation(e)[:top_k].reshape(1, top_k).astype(np.int32))
        weights = cp.asarray(rng.random((1, top_k)).astype(np.float32))
        layer = lambda x, ids, weights: seam.moe_fp8(x, gu, dn, ids, weights)  # noqa: E731
        t_eager = us(lambda: layer(x, ids, weights))
        try:
            graph = vtcuda.capture(layer, x, ids, weights)
            t_graph = us(lambda: graph(x, ids, weights))
            eager_out, graph_out = layer(x, ids, weights), graph(x, ids, weights)
            same = bool(cp.array_equal(eager_out.view(cp.uint16), graph_out.view(cp.uint16)))
        except Exception as exc:
            t_graph, same = None, False
            print(f"capture failed: {type(exc).__name__}: {str(exc)[:300]}")
        floor_us = top_k * (2 * inter * h + h * inter) / (tb_s * 1e12) * 1e6
        row(
            name,
            f"{t_eager:.1f}",
            "n/a" if t_graph is None else f"{t_graph:.1f}" + ("" if same else " (differs!)"),
            f"{floor_us:.1f}",
            "n/a" if t_graph is None else f"{t_graph / floor_us:.2f}x",
        )
        profiles.append((name, profile.profile_moe(x, gu, dn, ids, weights, repeats=50)))
    for name, rec in profiles:  # where a decode step's time goes, step by step (device time, queued)
        print(f"\n{name}: " + rec.table() + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one row count per shape, one decode scheme")
    args = parser.parse_args()
    import cupy as cp
    import torch

    from vtnumba.profile import best_device_us

    def us(fn):
        return best_device_us(fn, 20, 3)

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    print(f"# bench_moe {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC} on {smi}, torch {torch.__version__}")
    rng = np.random.default_rng(0)
    tb_s = copy_tb_s(cp, best_device_us)
    print(f"copy rate: {tb_s:.2f} TB/s read + write (the floors below read the weights at this rate)")
    grouped_gemm_table(args, cp, torch, rng, us, tb_s)
    decode_layer_table(args, cp, torch, rng, us, tb_s)


if __name__ == "__main__":
    main()
