"""MXFP8 on the GPU you have, against the per-tensor FP8 GEMM and bf16, in one run (the H200's
MXFP8 figure in benchmarks/RESULTS.md; needs cupy, torch, a GPU; device time behind a queued spin, vtnumba.profile).

1. The GEMM alone, bf16 out: ``vt.scaled_mm`` with E8M0 scales per 1 x 32 on both operands
   (``block_size=(1, 32)``) against ``vt.scaled_mm`` per-tensor (cuBLASLt where it runs), with the
   kernel each picked (on sm_90 cuBLASLt refuses VEC32_UE8M0, benchmarks/probes/probe_cublaslt_mxfp8.py, so
   MXFP8 runs on vtnumba's tensor-core kernels).
2. The layer, bf16 x in: MX quantization (g = 32, E8M0) + the MX GEMM, against dynamic per-tensor
   quantization + the per-tensor GEMM, and against torch's bf16 ``x @ w.T``.

    python3 benchmarks/gpu/bench_mx_gpu.py
"""

import datetime
import subprocess

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]  # (N, K), Llama-3-8B's
MS = (1, 16, 256, 4096)


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def main():
    import cupy as cp
    import torch

    import vtnumba as vt
    from vtnumba import seam
    from vtnumba.cuda import block
    from vtnumba.profile import best_device_us

    def us(fn):
        return best_device_us(fn, 20, 3)

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    print(f"# bench_mx_gpu {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC} on {smi}")
    rng = np.random.default_rng(0)
    bf16 = torch.bfloat16

    print(
        "\n## 1. GEMM, bf16 out (device us; ratio per-tensor / MX, >= 1 means MX is as fast)\n"
        "| M | N x K | per-tensor us | MX us | ratio | MX kernel | MX on tiled_block us |\n|---|---|---|---|---|---|---|"
    )
    for n, k in SHAPES:
        b = cp.asarray(rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8))
        sb = cp.asarray([0.01], dtype=cp.float32)
        sb8 = cp.asarray(rng.integers(115, 125, size=(n, k // 32), dtype=np.uint8))
        for m in MS:
            a = cp.asarray(rng.integers(0, 0x7E, size=(m, k), dtype=np.uint8))
            sa = cp.asarray([0.02], dtype=cp.float32)
            sa8 = cp.asarray(rng.integers(120, 130, size=(m, k // 32), dtype=np.uint8))
            t_pt = us(lambda: vt.scaled_mm(a, b, sa, sb, out_dtype=bf16))
            t_mx = us(lambda: vt.scaled_mm(a, b, sa8, sb8, out_dtype=bf16, block_size=(1, 32)))
            name = block.select(block.BlockCall(a, b, sa8, sb8, (1, 32), np.dtype(np.float32), None)).name
            t_tiled = (
                us(lambda: vt.scaled_mm(a, b, sa8, sb8, out_dtype=bf16, block_size=(1, 32), kernel="tiled_block"))
                if m <= 256
                else None
            )
            row(
                m,
                f"{n}x{k}",
                f"{t_pt:.1f}",
                f"{t_mx:.1f}",
                f"{t_pt / t_mx:.2f}",
                name,
                "" if t_tiled is None else f"{t_tiled:.1f}",
            )

    print(
        "\n## 2. Layer through the seam, bf16 x in, bf16 out (device us; ratios bf16 / this)\n"
        "| M | N x K | bf16 us | per-tensor dynamic us | MX us | bf16/per-tensor | bf16/MX |\n"
        "|---|---|---|---|---|---|---|"
    )
    for n, k in SHAPES:
        wh = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        per_tensor = seam.make_linear_method(
            seam.ResidentFp8(seam.Fp8Weight.from_float(wh, activation_scheme="dynamic"), "cuda")
        )
        mx = seam.make_linear_method(
            seam.ResidentFp8(seam.Fp8Weight.from_float(wh, block_size=(1, 32), scale_format="e8m0"), "cuda")
        )
        tw = torch.as_tensor(wh, device="cuda").to(torch.bfloat16)
        for m in MS:
            xh = rng.standard_normal((m, k)).astype(BF16)
            x = cp.asarray(xh.view(np.uint16)).view(BF16)
            tx = torch.as_tensor(xh.astype(np.float32), device="cuda").to(torch.bfloat16)
            t_bf, t_pt, t_mx = us(lambda: tx @ tw.T), us(lambda: per_tensor.apply(x)), us(lambda: mx.apply(x))
            row(m, f"{n}x{k}", f"{t_bf:.1f}", f"{t_pt:.1f}", f"{t_mx:.1f}", f"{t_bf / t_pt:.2f}", f"{t_bf / t_mx:.2f}")


# Tile shapes tried for MXFP8 at small M (--configs): the default 128 x 128 tile gives N / 128 blocks
# at M = 1 (32 for N = 4096, a quarter of the H200's SMs) and runs 8 m16 tiles of which one is real.
SMALL_M_CONFIGS = {
    "16x32_w2_16x16": dict(mt=1, nt=2, wm=1, wn=2, stages=4, ldmatrix=True),
    "16x64_w2_16x32": dict(mt=1, nt=4, wm=1, wn=2, stages=4, ldmatrix=True),
    "32x64_w4_32x16": dict(mt=2, nt=2, wm=1, wn=4, stages=4, ldmatrix=True),
    "64x64_w4_32x32": dict(mt=2, nt=4, wm=2, wn=2, stages=3, ldmatrix=True),
}


def configs():
    """tensorcore_mx with each tile shape at M = 1 .. 256 (device us), every shape's output checked
    bit for bit against the default tile's (each output's k32 partials are added in K order either
    way)."""
    import cupy as cp

    from vtnumba.cuda import block
    from vtnumba.cuda.kernels import tc_gemm
    from vtnumba.profile import best_device_us

    rng = np.random.default_rng(1)
    differs = []
    names = ["default"] + list(SMALL_M_CONFIGS)
    cfgs = [tc_gemm.GEMM_DEFAULT] + [tc_gemm.TileConfig(**c) for c in SMALL_M_CONFIGS.values()]
    print(
        "\n## 3. tensorcore_mx by tile shape (device us, bf16 out; 'same' = bits equal the default's)\n"
        "| M | N x K | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names)
    )
    for n, k in SHAPES:
        b = cp.asarray(rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8))
        sb8 = cp.asarray(rng.integers(115, 125, size=(n, k // 32), dtype=np.uint8))
        for m in (1, 16, 64, 256):
            a = cp.asarray(rng.integers(0, 0x7E, size=(m, k), dtype=np.uint8))
            sa8 = cp.asarray(rng.integers(120, 130, size=(m, k // 32), dtype=np.uint8))
            call = block.BlockCall(a, b, sa8, sb8, (1, 32), BF16, None)
            cells, want = [], None
            for cfg in cfgs:
                y = cp.zeros((m, n), dtype=cp.uint16)
                try:
                    launcher, grid, threads, args = tc_gemm.gemm_launch(call, y, False, config=cfg)
                    t = best_device_us(lambda: launcher(grid, threads, *args), 20, 3)
                except Exception as exc:  # a shape this kernel refuses: say so, go on
                    cells.append(f"{type(exc).__name__}: {str(exc)[:60]}")
                    continue
                got = cp.asnumpy(y)
                want = got if want is None else want
                same = np.array_equal(got, want)
                differs += [] if same else [(m, n, k, cfg)]
                cells.append(f"{t:.1f}" + ("" if same else " DIFFERS"))
            row(m, f"{n}x{k}", *cells)
    if differs:  # a tile whose bytes are not the default's is a wrong kernel, whatever its speed
        raise SystemExit(f"{len(differs)} tile runs gave other bytes than the default tile: {differs[:4]}")


if __name__ == "__main__":
    import sys

    configs() if "--configs" in sys.argv else main()
