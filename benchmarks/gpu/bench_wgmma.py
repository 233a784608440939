"""The wgmma GEMM (vtnumba/cuda/kernels/sm90_wgmma_gemm.py) on the H200 against cuBLASLt, torch and tc_gemm's mma.sync
kernel, measured in the same run. Device time behind a queued sleep (vtnumba.timing, DEVICE.md).

Tables, each with its target:
  0. a correctness check first: odd shapes, every scale layout, against the float64 reference
  1. GEMM 4096^3 per-tensor: configurations x promotions vs cuBLASLt (>= 0.5x; ship >= 0.25x)
  2. GEMM 28672 x 4096 at M = 4096
  3. block-scaled 4096^3 vs torch's block-scaled _scaled_mm
  4. accuracy on uniformly drawn codes: worst error / G3 bound, beside cuBLASLt and tc_gemm
  5. the roofline: each kernel's FLOP/byte, TFLOP/s, and the share of min(peak, intensity x copy
     bandwidth) it reaches (the peak: cuBLASLt's FP8 4096^3 of table 1); a PNG beside it when
     matplotlib is there (argument 2: the directory)

Run: python3 benchmarks/gpu/bench_wgmma.py [output directory]   (needs cupy, torch, numba-cuda, nvmath-python;
an sm_90 GPU)
"""

import datetime
import subprocess
import sys

import cupy as cp
import ml_dtypes
import numpy as np
import torch
from bench_tensorcore import block_table, codes, row, table  # this directory: the same tables and codes

from vtnumba.cuda import gemm
from vtnumba.cuda.kernels import sm90_wgmma_gemm as wg
from vtnumba.cuda.kernels import tc_gemm as tc
from vtnumba.cuda.runtime import device
from vtnumba.profile import Ceilings, ProfileRecord, best_device_us, roofline_plot
from vtnumba.testing import reference

BF16 = np.dtype(ml_dtypes.bfloat16)
OUT_F32, OUT_BF16 = 0, 2
RECORDS = []
BEST_NAME = ["128x128_s4"]  # table 1's fastest per_128 configuration


def wg_fn(a, b, sa, sb, cfg, promotion, block=False, out=OUT_BF16, y=None):
    m, n = a.shape[0], b.shape[0]
    y = cp.empty((m, n), dtype=cp.float32 if out == OUT_F32 else cp.uint16) if y is None else y
    bias = cp.zeros(1, dtype=cp.uint16)
    launcher = wg.gemm_launcher(cfg, promotion, block, out == OUT_F32)
    grid = (-(-n // cfg.bn), -(-m // wg.block_rows(cfg)))
    return lambda: launcher(grid, wg.threads(cfg), a, b, sa, 0, sb, 0, bias, 0, y, out)


def tc_fn(a, b, sa, sb, block=False):
    cfg = tc.GEMM_DEFAULT
    m, n = a.shape[0], b.shape[0]
    bm, bn = tc.tile_shape(cfg)
    y = cp.empty((m, n), dtype=cp.uint16)
    launcher = tc.gemm_launcher(cfg, tc.PER_MMA, block, True, False)
    return lambda: launcher(
        (-(-n // bn), -(-m // bm)),
        32 * cfg.wm * cfg.wn,
        a,
        b,
        sa,
        0,
        sb,
        0,
        cp.zeros(1, dtype=cp.uint16),
        0,
        y,
        OUT_BF16,
    )


def timed_row(label, make, flops, nbytes, t_peer, repeats=10):
    try:
        t = best_device_us(make(), repeats, 2)
    except Exception as exc:  # one configuration must not cost the rest
        row(label, f"failed: {exc.__class__.__name__}: {exc}"[:200], "", "")
        return None
    row(label, f"{t:.0f}", f"{flops / t / 1e6:.0f}", f"{t_peer / t:.3f}")
    RECORDS.append(ProfileRecord(label, "cuda", "device", t * 1e-6, t * 1e-6, repeats, flops=flops, bytes=nbytes))
    return t


def correctness():
    table(
        "0. correctness: worst |err| / bound against the float64 reference (NaN-poisoned outputs)",
        ["shape M x N x K", "scales", "promotion", "config", "elements", "err / tensor_core_bound", "err / G3"],
    )
    rng = np.random.default_rng(1)
    failures = 0
    for m, n, k in ((128, 128, 128), (200, 136, 272), (64, 96, 32), (333, 520, 1040), (256, 384, 4096)):
        ah = (rng.standard_normal((m, k)) * 0.5).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        bh = (rng.standard_normal((n, k)) * 0.5).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        a, b = cp.asarray(ah), cp.asarray(bh)
        for scales in ("tensor", "row x channel", "block"):
            block = scales == "block"
            if block:
                kb = -(-k // 128)
                sah = rng.uniform(0.5, 2.0, (m, kb)).astype(np.float32)
                sbh = rng.uniform(0.5, 2.0, (-(-n // 128), kb)).astype(np.float32)
                ref, g3 = reference.block_scaled_mm(ah, bh, sah, sbh, (128, 128))
                tcb = g3 + reference.block_tensor_core_allowance(ah, bh, sah, sbh, (128, 128))
            elif scales == "tensor":
                sah, sbh = np.float32(0.5), np.float32(0.25)
                ref, g3 = reference.scaled_mm(ah, bh, sah, sbh)
                tcb = reference.tensor_core_bound(ah, bh, sah, sbh)
            else:
                sah = rng.uniform(0.5, 2.0, m).astype(np.float32)
                sbh = rng.uniform(0.5, 2.0, n).astype(np.float32)
                ref, g3 = reference.scaled_mm(ah, bh, sah[:, None], sbh[None, :])
                tcb = reference.tensor_core_bound(ah, bh, sah[:, None], sbh[None, :])
            for promotion in wg.PROMOTIONS if not block else (wg.PER_128,):
                for name in ("128x128_s4", "64x128_s3_x2", "ws_128x128_s4"):
                    cfg = wg.WG_CONFIGS[name]
                    y = cp.full((m, n), cp.nan, dtype=cp.float32)
                    sa = cp.asarray(np.atleast_1d(sah))
                    sb = cp.asarray(np.atleast_1d(sbh))
                    launcher = wg.gemm_launcher(cfg, promotion, block, True)
                    sa_step = 0 if block or scales == "tensor" else 1
                    launcher(
                        (-(-n // cfg.bn), -(-m // wg.block_rows(cfg))),
                        wg.threads(cfg),
                        a,
                        b,
                        sa,
                        sa_step,
                        sb,
                        sa_step,
                        cp.zeros(1, dtype=cp.uint16),
                        0,
                        y,
                        OUT_F32,
                    )
                    yh = y.get().astype(np.float64)
                    err = np.abs(yh - ref)
                    r_tc = float(np.max(err / tcb)) if np.isfinite(yh).all() else float("nan")
                    r_g3 = float(np.max(err / g3)) if np.isfinite(yh).all() else float("nan")
                    ok = np.isfinite(yh).all() and r_tc <= 1.0 and np.count_nonzero(ref) > 0
                    failures += not ok
                    row(f"{m} x {n} x {k}", scales, promotion, name, y.size, f"{r_tc:.4f}", f"{r_g3:.3f}")
    print(f"correctness: {failures} failing case(s)", flush=True)
    return failures


def gemm_tables(gen, sa, sb, ta_s, tb_s):
    s = 4096
    a, ta = codes(gen, s, s)
    b, tb = codes(gen, s, s)
    flops, nbytes = 2 * s**3, 2 * s * s + 2 * s * s
    table(
        "1. GEMM M = N = K = 4096, per-tensor scales, bf16 out",
        ["kernel", "us", "TFLOP/s", "cuBLASLt / this (>= 0.5; ship >= 0.25)"],
    )
    t_lt = best_device_us(lambda: gemm.scaled_mm(a, b, sa, sb, BF16, None, "cublaslt"), 20, 2)
    t_torch = best_device_us(
        lambda: torch._scaled_mm(ta, tb.t(), scale_a=ta_s, scale_b=tb_s, out_dtype=torch.bfloat16), 20, 2
    )
    row("cuBLASLt (vtnumba)", f"{t_lt:.0f}", f"{flops / t_lt / 1e6:.0f}", "1.00")
    row("torch._scaled_mm", f"{t_torch:.0f}", f"{flops / t_torch / 1e6:.0f}", f"{t_lt / t_torch:.3f}")
    RECORDS.append(ProfileRecord("cuBLASLt", "cuda", "device", t_lt * 1e-6, t_lt * 1e-6, 20, flops=flops, bytes=nbytes))
    timed_row("vt mma.sync tc_gemm (per_mma)", lambda: tc_fn(a, b, sa, sb), flops, nbytes, t_lt, 5)
    best = (float("inf"), None)
    for name, cfg in wg.WG_CONFIGS.items():
        for promotion in wg.PROMOTIONS:
            t = timed_row(
                f"vt wgmma {name} ({promotion})", lambda: wg_fn(a, b, sa, sb, cfg, promotion), flops, nbytes, t_lt
            )
            if t is not None and promotion == wg.PER_128 and t < best[0]:
                best = (t, name)
    print(f"fastest wgmma configuration (per_128): {best[1]}", flush=True)
    BEST_NAME[0] = best[1] or "128x128_s4"

    table(
        "2. GEMM M = 4096, N x K = 28672 x 4096, per-tensor, bf16 out", ["kernel", "us", "TFLOP/s", "cuBLASLt / this"]
    )
    n, k = 28672, 4096
    b2, tb2 = codes(gen, n, k)
    flops2, nbytes2 = 2 * s * n * k, s * k + n * k + 2 * s * n
    t_lt2 = best_device_us(lambda: gemm.scaled_mm(a, b2, sa, sb, BF16, None, "cublaslt"), 10, 2)
    t_torch2 = best_device_us(
        lambda: torch._scaled_mm(ta, tb2.t(), scale_a=ta_s, scale_b=tb_s, out_dtype=torch.bfloat16), 10, 2
    )
    row("cuBLASLt", f"{t_lt2:.0f}", f"{flops2 / t_lt2 / 1e6:.0f}", "1.00")
    row("torch._scaled_mm", f"{t_torch2:.0f}", f"{flops2 / t_torch2 / 1e6:.0f}", f"{t_lt2 / t_torch2:.3f}")
    for name in dict.fromkeys((best[1] or "128x128_s4", "128x128_s4")):
        for promotion in wg.PROMOTIONS:
            timed_row(
                f"vt wgmma {name} ({promotion}) 28672",
                lambda: wg_fn(a, b2, sa, sb, wg.WG_CONFIGS[name], promotion),
                flops2,
                nbytes2,
                t_lt2,
                5,
            )

    sa_c, sb_c, t_tblk = block_table(gen, ta, tb, s, flops)  # [M, KB] m-contiguous, [NB, KB]
    timed_row(
        "vt mma.sync tc_gemm block (per_mma)", lambda: tc_fn(a, b, sa_c, sb_c, block=True), flops, nbytes, t_tblk, 5
    )
    sa_k = cp.ascontiguousarray(sa_c)  # [M, KB] k-contiguous: the layout ablation
    for name, cfg in wg.WG_CONFIGS.items():
        if 128 % cfg.bn == 0:
            timed_row(
                f"vt wgmma {name} block (per_128)",
                lambda: wg_fn(a, b, sa_c, sb_c, cfg, wg.PER_128, block=True),
                flops,
                nbytes,
                t_tblk,
            )
    timed_row(
        f"vt wgmma {BEST_NAME[0]} block, k-contiguous scale_a",
        lambda: wg_fn(a, b, sa_k, sb_c, wg.WG_CONFIGS[BEST_NAME[0]], wg.PER_128, block=True),
        flops,
        nbytes,
        t_tblk,
    )
    return t_lt


def accuracy_table():
    table(
        "4. accuracy on uniformly drawn codes (magnitudes 2^-9 .. 448), M = N = 512: worst |err| / G3 bound",
        [
            "K",
            "wgmma per_128",
            "wgmma per_wgmma",
            "mma.sync tc_gemm per_mma",
            "cuBLASLt",
            "wgmma per_128 / tensor_core_bound",
        ],
    )
    rng = np.random.default_rng(0)
    one = cp.ones(1, dtype=cp.float32)
    for k in (32, 256, 4096):
        ah = rng.integers(0, 256, size=(512, k), dtype=np.uint8)
        bh = rng.integers(0, 256, size=(512, k), dtype=np.uint8)
        for h in (ah, bh):
            h[(h & 0x7F) == 0x7F] = 0x3C  # no NaN codes
        ref, bound = reference.scaled_mm(ah, bh, 1.0, 1.0)
        tcb = reference.tensor_core_bound(ah, bh, 1.0, 1.0)
        ad, bd = cp.asarray(ah), cp.asarray(bh)

        def err(y):
            return np.abs(y.astype(np.float64) - ref)

        outs = []
        for promotion in wg.PROMOTIONS:
            y = cp.full((512, 512), cp.nan, dtype=cp.float32)
            wg_fn(ad, bd, one, one, wg.DEFAULTS[promotion], promotion, out=OUT_F32, y=y)()
            outs.append(y.get())
        cfg = tc.GEMM_DEFAULT
        bm, bn = tc.tile_shape(cfg)
        y_tc = cp.full((512, 512), cp.nan, dtype=cp.float32)
        tc.gemm_launcher(cfg, tc.PER_MMA, False, True, True)(
            (-(-512 // bn), -(-512 // bm)),
            32 * cfg.wm * cfg.wn,
            ad,
            bd,
            one,
            0,
            one,
            0,
            cp.zeros(1, cp.uint16),
            0,
            y_tc,
            0,
        )
        y_lt = gemm.scaled_mm(ad, bd, np.float32(1), np.float32(1), np.dtype(np.float32), None, "cublaslt").get()
        row(
            k,
            *(f"{np.max(err(y) / bound):.3f}" for y in (*outs, y_tc.get(), y_lt)),
            f"{np.max(err(outs[0]) / tcb):.4f}",
        )


def roofline(t_lt, outdir):
    src = cp.ones(1 << 29, dtype=cp.uint8)
    dst = cp.empty_like(src)
    bw = 2 * src.nbytes / (best_device_us(lambda: cp.copyto(dst, src), 10, 2) * 1e-6)
    peak = 2 * 4096**3 / (t_lt * 1e-6)
    table(
        f"5. roofline (copy {bw / 1e12:.2f} TB/s read + write; peak = cuBLASLt FP8 4096^3, {peak / 1e12:.0f} TFLOP/s)",
        ["kernel", "FLOP/byte", "TFLOP/s", "roof TFLOP/s", "share of roof"],
    )
    for r in RECORDS:
        roof = min(peak, r.intensity * bw)
        row(r.name, f"{r.intensity:.0f}", f"{r.gflops / 1e3:.0f}", f"{roof / 1e12:.0f}", f"{r.gflops * 1e9 / roof:.3f}")
    if outdir:
        try:
            ceilings = Ceilings("cuda", bw / 1e9, peak / 1e9, "cuBLASLt FP8 4096^3")
            picked = [
                r
                for r in RECORDS
                if r.name in ("cuBLASLt", "vt mma.sync tc_gemm (per_mma)")
                or r.name.startswith(f"vt wgmma {BEST_NAME[0]} (")
            ]
            roofline_plot(
                picked,
                ceilings,
                path=f"{outdir}/roofline_wgmma.png",
                title="FP8 GEMM 4096^3 on the H200 (measured ceilings)",
            )
            print(f"roofline figure: {outdir}/roofline_wgmma.png")
        except Exception as exc:
            print(f"roofline figure not drawn: {exc.__class__.__name__}: {exc}")


def main(argv):
    outdir = argv[0] if argv else None
    cc = device.current().cc
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    now = datetime.datetime.now(datetime.UTC)
    print(f"# bench_wgmma {now:%Y-%m-%d %H:%M UTC} on {smi}; sm_{cc[0]}{cc[1]}")
    failures = correctness()
    gen = torch.Generator(device="cuda").manual_seed(0)
    sa = cp.asarray([0.5], dtype=cp.float32)
    sb = cp.asarray([0.25], dtype=cp.float32)
    ta_s, tb_s = torch.as_tensor(sa, device="cuda").reshape(()), torch.as_tensor(sb, device="cuda").reshape(())
    t_lt = gemm_tables(gen, sa, sb, ta_s, tb_s)
    accuracy_table()
    roofline(t_lt, outdir)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
