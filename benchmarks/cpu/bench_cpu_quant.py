"""CPU quantization speed: vtnumba against numpy's memcpy and numpy + ml_dtypes, same run.

    flock /tmp/vt-bench.lock python3 benchmarks/cpu/bench_cpu_quant.py

GB/s counts bytes read plus bytes written (float32: 4 + 1 per value; bfloat16: 2 + 1).
"""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np

import vtnumba as vt
from vtnumba import profile

N = 1 << 24  # 16M values, as ANCHORS.md


def median_time(fn, repeats=9):
    return profile.cpu_time(fn, repeats)[0]


def first_call_seconds():
    """A fresh process, warm on-disk cache: import + first quantize call."""
    code = (
        "import time; t0 = time.perf_counter(); import numpy as np, vtnumba as vt; "
        "vt.quantize_fp8(np.ones((4, 8), np.float32), 0.5); "
        "vt.quantize_fp8(np.ones((4, 8), np.float32), per_token=True); "
        "print(time.perf_counter() - t0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # warm the cache
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


def main():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(N, dtype=np.float32) * 100).reshape(4096, 4096)
    xb = x.astype(ml_dtypes.bfloat16)
    scale = 0.37
    inv = np.float32(1) / np.float32(scale)
    rows = []

    y = np.empty_like(x)
    t_copy = median_time(lambda: np.copyto(y, x))
    rows.append(("memcpy float32 (numpy copyto)", t_copy, 8 * N))
    t_ml = median_time(lambda: np.clip(x * inv, -448, 448).astype(ml_dtypes.float8_e4m3fn), repeats=3)
    rows.append(("numpy clip + ml_dtypes cast, f32", t_ml, 5 * N))
    t_static = median_time(lambda: vt.quantize_fp8(x, scale))
    rows.append(("vtnumba static, f32", t_static, 5 * N))
    t_static_b = median_time(lambda: vt.quantize_fp8(xb, scale))
    rows.append(("vtnumba static, bf16", t_static_b, 3 * N))
    t_dyn = median_time(lambda: vt.quantize_fp8(x))
    rows.append(("vtnumba dynamic per-tensor, f32", t_dyn, 5 * N))
    t_tok = median_time(lambda: vt.quantize_fp8(x, per_token=True))
    rows.append(("vtnumba dynamic per-token, f32", t_tok, 5 * N))
    t_tok_b = median_time(lambda: vt.quantize_fp8(xb, per_token=True))
    rows.append(("vtnumba dynamic per-token, bf16", t_tok_b, 3 * N))

    import numba

    print(f"16M values, numba threads={numba.get_num_threads()}, cores={os.cpu_count()}")
    print(f"{'op':36s} {'ms':>8s} {'GB/s':>8s} {'vs ml_dtypes':>13s}")
    for name, t, nbytes in rows:
        print(f"{name:36s} {t * 1e3:8.2f} {nbytes / t / 1e9:8.2f} {t_ml / t * (nbytes / (5 * N)):12.1f}x")
    print(f"per-token / static time (f32): {t_tok / t_static:.2f}  (target <= 1.5)")
    print(f"per-token / static time (bf16): {t_tok_b / t_static_b:.2f}  (target <= 1.5)")
    print(f"first call in a fresh process, warm cache: {first_call_seconds():.2f} s  (target < 1 s)")


if __name__ == "__main__":
    main()
