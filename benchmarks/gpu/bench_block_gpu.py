"""Block-scaled FP8 on the GPU (128 x 128 weight blocks, 1 x 128 activation groups) against torch
in the same run (needs cupy, torch, a GPU; device time behind a queued spin, vtnumba.profile).

1. cuBLASLt's block path against torch's block-scaled ``_scaled_mm`` (scale_a [M, K/128] with
   strides (1, M), scale_b = sb.t()) at M >= 16, and against vtnumba's per-tensor cuBLASLt path.
2. Decode, M = 1, 4, 16: the best vtnumba block kernel (the tensor-core GEMV; cuBLASLt refuses
   M = 1) against cuBLASLt's block path, with the weight-read floor; the whole block layer at M = 1
   (group quantization + GEMM, bf16 x) against torch's bf16 matmul.
3. Group quantization (bf16 -> e4m3, g = 128) against torch.compile of the same formula.

    python3 benchmarks/gpu/bench_block_gpu.py
"""

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(4096, 4096), (28672, 4096), (4096, 14336)]


def table(title, header):
    print(f"\n## {title}\n| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def main():
    import cupy as cp
    import torch

    import vtnumba as vt
    from vtnumba import seam
    from vtnumba.profile import best_device_us

    def us(fn):
        return best_device_us(fn, 30, 3)

    gen = torch.Generator(device="cuda").manual_seed(0)
    copy_bw = 4.2e12  # bytes/s read + write, the H200's measured copy rate (ANCHORS.md)

    def operands(m, n, k):
        a = (torch.randn(m, k, device="cuda", generator=gen) * 2).to(torch.float8_e4m3fn)
        b = (torch.randn(n, k, device="cuda", generator=gen) * 2).to(torch.float8_e4m3fn)
        sa = torch.rand(m, k // 128, device="cuda", generator=gen) * 0.01 + 0.001
        sb = torch.rand(n // 128, k // 128, device="cuda", generator=gen) * 0.01 + 0.001
        return a, b, sa, sb

    def vt_args(a, b, sa, sb):
        return (
            cp.asarray(a.view(torch.uint8)),
            cp.asarray(b.view(torch.uint8)),
            cp.asarray(sa.t().contiguous()).T,
            cp.asarray(sb),
        )  # scale_a m-contiguous, as cuBLASLt reads it

    table(
        "1. cuBLASLt block path vs torch block _scaled_mm and vs per-tensor cuBLASLt (bf16 out, device us)",
        [
            "M",
            "N x K",
            "torch block us",
            "vt block us",
            "torch/vt (>= 0.97)",
            "vt per-tensor us",
            "block/per-tensor (<= 1.10)",
        ],
    )
    for m in (16, 1024, 4096):
        for n, k in SHAPES:
            a, b, sa, sb = operands(m, n, k)
            sa_t = sa.t().contiguous().t()  # strides (1, M)
            t_torch = us(lambda: torch._scaled_mm(a, b.t(), scale_a=sa_t, scale_b=sb.t(), out_dtype=torch.bfloat16))
            ca, cb, csa, csb = vt_args(a, b, sa, sb)
            t_vt = us(
                lambda: vt.scaled_mm(ca, cb, csa, csb, out_dtype=BF16, block_size=(128, 128), kernel="cublaslt_block")
            )
            one = cp.ones(1, cp.float32)
            t_pt = us(lambda: vt.scaled_mm(ca, cb, one, one, out_dtype=BF16, kernel="cublaslt"))
            row(
                m,
                f"{n} x {k}",
                f"{t_torch:.1f}",
                f"{t_vt:.1f}",
                f"{t_torch / t_vt:.3f}",
                f"{t_pt:.1f}",
                f"{t_vt / t_pt:.2f}",
            )

    table(
        "2. decode: block kernels at M = 1, 4, 16 (device us; weight-read floor at the copy rate)",
        [
            "M",
            "N x K",
            "tensor-core block GEMV",
            "tiled block",
            "cuBLASLt block",
            "cuBLASLt block / GEMV (>= 1.3)",
            "floor",
        ],
    )
    for n, k in SHAPES[:2]:
        for m in (1, 4, 16):
            a, b, sa, sb = operands(m, n, k)
            ca, cb, csa, csb = vt_args(a, b, sa, sb)

            def run(kernel):
                return us(lambda: vt.scaled_mm(ca, cb, csa, csb, out_dtype=BF16, block_size=(128, 128), kernel=kernel))

            t_gemv = run("tensorcore_block_gemv")
            t_tiled = run("tiled_block")
            t_lt = run("cublaslt_block") if m % 4 == 0 else float("nan")
            row(
                m,
                f"{n} x {k}",
                f"{t_gemv:.1f}",
                f"{t_tiled:.1f}",
                f"{t_lt:.1f}",
                f"{t_lt / t_gemv:.2f}" if m % 4 == 0 else "cuBLASLt refuses M = 1",
                f"{2 * n * k / copy_bw * 1e6:.1f}",
            )

    table(
        "2b. the whole block layer at M = 1 (bf16 x -> group quant -> block GEMM -> bf16 y) vs torch bf16 matmul",
        ["N x K", "torch bf16 us", "vt block layer us", "bf16 / vt (>= 1.3)"],
    )
    for n, k in SHAPES:
        rng = np.random.default_rng(n)
        w = seam.ResidentFp8(
            seam.Fp8Weight.from_float((rng.standard_normal((n, k)) * 0.02).astype(np.float32), block_size=(128, 128)),
            "cuda",
        )
        layer = seam.make_linear_method(w)
        xh = rng.standard_normal((1, k)).astype(BF16)
        x = cp.asarray(xh.view(np.uint16)).view(BF16)
        tx = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        tw = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        t_bf16 = us(lambda: tx @ tw.t())
        t_layer = us(lambda: layer.apply(x))
        row(f"{n} x {k}", f"{t_bf16:.1f}", f"{t_layer:.1f}", f"{t_bf16 / t_layer:.2f}")

    table(
        "3. group quantization bf16 -> e4m3, g = 128 (device us)",
        ["M x K", "torch.compile us", "vt us", "compile / vt (>= 0.9)"],
    )

    def torch_group_quant(x):
        g = x.float().view(x.shape[0], -1, 128)
        amax = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10)
        s = amax / 448.0
        return (g / s).clamp(-448, 448).to(torch.float8_e4m3fn).view(x.shape), s.squeeze(-1)

    compiled = torch.compile(torch_group_quant)
    for m, k in ((1, 4096), (16, 4096), (4096, 7168), (8192, 8192)):
        tx = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        x = cp.asarray(tx.view(torch.int16)).view(BF16)
        compiled(tx)
        t_c = us(lambda: compiled(tx))
        t_v = us(lambda: vt.quantize_fp8(x, group_size=128, column_major_scales=True))
        row(f"{m} x {k}", f"{t_c:.1f}", f"{t_v:.1f}", f"{t_c / t_v:.2f}")


if __name__ == "__main__":
    main()
