"""Where the host time of a GPU call goes: cProfile over many calls of each public entry point on
cupy arrays (M = 1, N = K = 4096, warm plans), the functions sorted by their own time.

A profile inflates every Python call by the profiler's overhead, so read it for the ranking, and
take the per-call figures from bench_gpu_quant.py / bench_gpu_gemm.py (no profiler there).

Run: python3 benchmarks/gpu/profile_gpu_host.py [--calls 2000] [--top 14]   (needs cupy and a GPU)
"""

import argparse
import cProfile
import io
import pstats

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args()

    import cupy as cp
    import ml_dtypes

    import vtnumba as vt
    from vtnumba import seam
    from vtnumba.cuda import gemm

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(0)
    n = k = 4096
    x = cp.asarray(rng.standard_normal((1, k)).astype(np.float32)).astype(cp.float16)
    a = vt.quantize_fp8(x, 0.02).data
    b = cp.asarray(rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8))
    sa = cp.asarray(np.array([0.02], np.float32))
    sb = cp.asarray(np.array([0.001], np.float32))
    weight = seam.ResidentFp8(
        seam.Fp8Weight(b.get(), np.float32(0.001), input_scale=np.float32(0.02), activation_scheme="static"), "cuda"
    )
    calls = {
        "vt.quantize_fp8 static": lambda: vt.quantize_fp8(x, 0.02),
        "vt.quantize_fp8 per-token": lambda: vt.quantize_fp8(x, per_token=True),
        "vt.scaled_mm public auto": lambda: vt.scaled_mm(a, b, sa, sb, out_dtype=bf16),
        "gemm.scaled_mm cublaslt": lambda: gemm.scaled_mm(a, b, sa, sb, bf16, None, "cublaslt"),
        "vt.fp8_linear fused static": lambda: vt.fp8_linear(x, b, sb, sa, out_dtype=bf16),
        "seam.matmul_fp8 static": lambda: seam.matmul_fp8(x, weight),
    }
    for name, fn in calls.items():
        for _ in range(50):
            fn()
        cp.cuda.Device().synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            fn()
        profile.disable()
        cp.cuda.Device().synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.top)
        lines = [line for line in text.getvalue().splitlines() if line.strip()]
        print(f"\n==== {name}: {args.calls} calls ====")
        print("\n".join(lines[2:]))


if __name__ == "__main__":
    main()
