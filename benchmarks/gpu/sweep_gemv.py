"""The decode GEMV's block shape, swept on the device: rows per block, threads per block and
launch bounds, device time at M = 1 and 4 beside cuBLASLt (vtnumba's own path, = torch._scaled_mm)
in the same run. It chose ``gemv_rows`` and ``GEMV_THREADS`` in vtnumba/cuda/kernels/gemv.py.

Run: python3 benchmarks/gpu/sweep_gemv.py   (needs cupy, torch, a GPU)
"""

import cupy as cp
import ml_dtypes
import numpy as np

from vtnumba.cuda import gemm
from vtnumba.cuda.kernels import gemv
from vtnumba.cuda.ptx.codec import hardware_available
from vtnumba.cuda.runtime import device
from vtnumba.profile import best_device_us as best_of

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)]  # (N, K)


# (rows per block, threads per block, min resident blocks per SM for the launch bounds; 0: none)
VARIANTS = {
    ("codes", 1): [(4, 256, 0), (4, 256, 4), (2, 256, 0), (4, 128, 0), (4, 128, 8), (2, 128, 8), (8, 256, 2)],
    ("fused static", 1): [(4, 256, 0), (4, 256, 3), (8, 256, 0), (4, 128, 0), (4, 128, 6)],
    ("codes", 4): [(2, 256, 0), (1, 256, 0), (2, 128, 0)],
}


def main():
    rng = np.random.default_rng(0)
    hw = hardware_available(device.current().cc)
    one = cp.asarray(np.array([0.01], np.float32))
    for (name, m), variants in VARIANTS.items():
        mode = gemv.GemvStage.CODES if name == "codes" else gemv.GemvStage.STATIC
        print(f"\n{name}, M = {m}: device us per call (rows / threads / min blocks per SM)")
        print("| N x K | cublaslt | " + " | ".join(f"{r}/{t}/{b or '-'}" for r, t, b in variants) + " |")
        print("|" + "---|" * (2 + len(variants)))
        for n, k in SHAPES:
            a = cp.asarray(rng.integers(0, 0x7E, size=(m, k), dtype=np.uint8))
            b = cp.asarray(rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8))
            x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32)).view(cp.uint16)
            y = cp.empty((m, n), dtype=cp.uint16)
            bias = cp.zeros(1, dtype=cp.uint16)
            t_lt = best_of(lambda: gemm.scaled_mm(a, b, one, one, BF16, None, "cublaslt"))
            cells = []
            for rows, threads, min_blocks in variants:
                launcher = gemv.gemv_launcher(m, hw, False, mode, rows, threads, min_blocks)
                args = (a, x, gemv.XKind.FLOAT32, one, b, one, 0, one, 0, bias, 0, y, 2)
                cells.append(best_of(lambda: launcher(-(-n // rows), threads, *args)))
            print(f"| {n} x {k} | {t_lt:.1f} | " + " | ".join(f"{t:.1f}" for t in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
