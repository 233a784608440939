"""GB10 / Blackwell workstations (sm_121 / sm_120): the block-scaled FP8 mma against the plain one, in
vtnumba's own tensor-core kernels, measured in one run -- the speedup the design could only state on paper.

    python3 benchmarks/gpu/bench_gb10_mx.py            # needs cupy, numba-cuda, a GPU (any: see below)

For each shape it times the tiled tensor-core GEMM (bf16 out) with each mma the GPU has:

- ``plain``: ``mma.sync ... e4m3.e4m3.f32`` (QMMA.16832 on sm_12x; half rate there, flashinfer #3628);
- ``unit``: the block-scaled ``kind::mxf8f6f4`` mma with unit scales (QMMA.SF), what vtnumba runs for
  per-tensor / per-channel / 128 x 128-block FP8 on sm_12x;
- ``mx``: the same instruction with MXFP8's real E8M0 scales (a scale byte per row and per column of
  each 32-wide K block, read from global memory per k32 step);
- ``mx_explicit``: MXFP8 on the plain mma, the k32 partial scaled in float32 (sm_89 / sm_90's form);

and the decode GEMV at M = 1 and 16 (plain vs unit). It prints microseconds, TFLOP/s and the ratio
plain / block-scaled: the speedup of the instruction vtnumba picks on sm_12x. On a GPU without the
block-scaled mma (sm_89, sm_90) only plain and mx_explicit run; the others print why not.

Expected on a GB10 (on paper; not measured): the SASS of both GEMMs is the same loop with one
QMMA.SF in place of each QMMA.16832 (tests/test_sm120_compile.py; 16 per k32 step of a warp, no
conversion), so where the GEMM is bound by the mma rate the ratio approaches the instruction's 2x (102
against 202 TFLOPS on an RTX 5060 Ti, flashinfer #3628). Each mma's k32 partial is then added into
float32 registers (4 FADD a QMMA, promotion per mma), and the tile's copies and ldmatrix reads do not
speed up, so expect about 1.5-1.9x at 4096^3 for ``unit`` and a little less for ``mx`` (its scale
bytes are global loads inside the k-loop). The decode GEMV reads the weight once at about 273 GB/s
(GB10's LPDDR5x): bound by memory, it should gain little (about 1.0-1.2x).
"""

import datetime
import subprocess
import sys

import cupy as cp
import numpy as np

from vtnumba.cuda.kernels import tc_gemm as tc
from vtnumba.cuda.kernels import tc_gemv
from vtnumba.cuda.ptx import sm120_mma
from vtnumba.cuda.ptx.codec import hardware_available
from vtnumba.cuda.runtime import device
from vtnumba.profile import best_device_us

OUT_BF16 = 2
GEMM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096)]  # (M, N, K)
GEMV_SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]  # (N, K)


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def gemm_fn(kind, a, b, sa, sb, sa8, sb8):
    m, n = a.shape[0], b.shape[0]
    cfg = tc.GEMM_DEFAULT
    bm, bn = tc.tile_shape(cfg)
    y = cp.empty((m, n), dtype=cp.uint16)
    bias = cp.zeros(1, dtype=cp.uint16)
    launcher = tc.gemm_launcher(cfg, tc.PER_MMA, False, False, False, kind)
    grid, threads = (-(-n // bn), -(-m // bm)), 32 * cfg.wm * cfg.wn
    s_a, s_b = (sa8, sb8) if kind in tc.MX_KINDS else (sa, sb)
    return lambda: launcher(grid, threads, a, b, s_a, 0, s_b, 0, bias, 0, y, OUT_BF16)


def gemv_fn(unit, a, b, sa, sb):
    m, n = a.shape[0], b.shape[0]
    cfg = tc_gemv.gemv_config(m, b.shape[1])
    y = cp.empty((m, n), dtype=cp.uint16)
    bias = cp.zeros(1, dtype=cp.uint16)
    x = cp.zeros((1, 2), dtype=cp.uint16)
    hardware = hardware_available(device.current().cc)
    launcher = tc_gemv.gemv_launcher(m, cfg, tc_gemv.MODE_CODES, False, hardware, False, False, unit)
    blocks, threads = -(-n // (16 * cfg.rt)), 32 * cfg.warps
    return lambda: launcher(blocks, threads, a, x, 0, sa, b, sa, 0, sb, 0, bias, 0, y, OUT_BF16)


def codes(rng, rows, cols):
    c = rng.integers(0, 0x7E, size=(rows, cols), dtype=np.uint8) | (
        rng.integers(0, 2, size=(rows, cols), dtype=np.uint8) << 7
    )
    return cp.asarray(c)


def timed(fn, repeats):
    try:
        return best_device_us(fn, repeats, 2), None
    except Exception as exc:  # a kind this GPU lacks: say why, go on
        return None, f"{exc.__class__.__name__}: {exc}"[:100]


def main():
    cc = device.current().cc
    has_sf = sm120_mma.available(cc)
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(
        f"# bench_gb10_mx {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC} on {smi}; "
        f"sm_{cc[0]}{cc[1]}; block-scaled mma here: {has_sf}"
    )
    kinds = ["plain", "unit", "mx", "mx_explicit"] if has_sf else ["plain", "mx_explicit"]
    rng = np.random.default_rng(0)
    sa = cp.asarray([0.5], dtype=cp.float32)
    sb = cp.asarray([0.25], dtype=cp.float32)
    print(
        "\n## tiled tensor-core GEMM, bf16 out (ratio: plain / this)\n| M x N x K | mma | us | TFLOP/s | ratio |"
        "\n|---|---|---|---|---|"
    )
    for m, n, k in GEMM_SHAPES:
        a, b = codes(rng, m, k), codes(rng, n, k)
        sa8 = cp.asarray(rng.integers(120, 130, size=(m, k // 32), dtype=np.uint8))
        sb8 = cp.asarray(rng.integers(115, 125, size=(n, k // 32), dtype=np.uint8))
        flops = 2 * m * n * k
        t_plain = None
        for kind in kinds:
            t, why = timed(gemm_fn(kind, a, b, sa, sb, sa8, sb8), 10)
            if t is None:
                row(f"{m}x{n}x{k}", kind, "failed", why, "")
                continue
            t_plain = t if kind == "plain" else t_plain
            row(f"{m}x{n}x{k}", kind, f"{t:.0f}", f"{flops / t / 1e6:.0f}", f"{t_plain / t:.2f}" if t_plain else "")
    print(
        "\n## decode GEMV (codes in), bf16 out (ratio: plain / unit)\n| M | N x K | mma | us | GB/s of weight "
        "| ratio |\n|---|---|---|---|---|---|"
    )
    for n, k in GEMV_SHAPES:
        b = codes(rng, n, k)
        for m in (1, 16):
            a = codes(rng, m, k)
            t_plain = None
            for unit in (False, True) if has_sf else (False,):
                t, why = timed(gemv_fn(unit, a, b, sa, sb), 50)
                label = "unit" if unit else "plain"
                if t is None:
                    row(m, f"{n}x{k}", label, "failed", why, "")
                    continue
                t_plain = t if not unit else t_plain
                row(m, f"{n}x{k}", label, f"{t:.1f}", f"{n * k / t / 1e3:.0f}", f"{t_plain / t:.2f}" if t_plain else "")


if __name__ == "__main__":
    sys.exit(main())
