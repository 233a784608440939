"""vtnumba's tensor-core kernels (vtnumba/cuda/kernels/tc_gemm.py, tc_gemv.py) on the H200 against cuBLASLt and
torch measured in the same run. Device time behind a queued sleep (gpu_timing.py, DEVICE.md).

Tables, each with its target:
  1. GEMM 4096^3 per-tensor: tile configurations (e4m3 mma and f16-staged) and promotions vs
     cuBLASLt, torch._scaled_mm (>= 0.5x cuBLASLt; the floor to ship 0.25x)
  2. GEMM 28672 x 4096 at M = 4096: table 1's fastest and the e4m3 default
  3. block-scaled 4096^3 (1 x 128 x 128 x 128) vs torch's block-scaled _scaled_mm, each configuration
     able to hold the K-block partial
  4. decode GEMV at M = 1, 4, 16 on four shapes vs cuBLASLt, with the weight-read floor
     (>= 1.3x cuBLASLt at 4096^2, >= 1.0x elsewhere); the GEMV's configurations at M = 1
  5. the fused static FP8 layer at M = 1 (bf16 x) vs torch's bf16 matmul (>= 1.8x)
  6. accuracy on uniformly drawn codes: worst error / G3 bound, each promotion (the e4m3 kernel and
     the f16-staged one) beside cuBLASLt

Run: python3 benchmarks/gpu/bench_tensorcore.py [gemm | gemm1 | gemm_all] [decode] [accuracy]   (all by
default; gemm1: table 1 only; gemm_all: with every e4m3 tile configuration, not only the default;
needs cupy, torch, numba-cuda, nvmath-python; a GPU)
"""

import datetime
import subprocess
import sys

import cupy as cp
import ml_dtypes
import numpy as np
import torch

import vtnumba as vt
from vtnumba.cuda import gemm
from vtnumba.cuda.kernels import tc_gemm as tc
from vtnumba.cuda.kernels import tc_gemv
from vtnumba.cuda.ptx.codec import hardware_available
from vtnumba.cuda.runtime import device
from vtnumba.profile import best_device_us
from vtnumba.testing import reference


def best_of(fn, repeats=50, rounds=3):
    return best_device_us(fn, repeats, rounds)


BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)]  # (N, K)
OUT_BF16 = 2


def table(title, header):
    print(f"\n## {title}\n| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def codes(gen, rows, cols):
    """Layer-like e4m3 codes (a Gaussian's), as a cupy array and a torch float8 view."""
    t = (torch.randn(rows, cols, device="cuda", generator=gen) * 0.5).to(torch.float8_e4m3fn)
    return cp.asarray(t.view(torch.uint8)), t


def gemm_fn(a, b, sa, sb, cfg, promotion, chain, block=False):
    """A zero-overhead launch of the tensor-core GEMM (bf16 out) with an explicit configuration."""
    m, n = a.shape[0], b.shape[0]
    bm, bn = tc.tile_shape(cfg)
    y = cp.empty((m, n), dtype=cp.uint16)
    bias = cp.zeros(1, dtype=cp.uint16)
    launcher = tc.gemm_launcher(cfg, promotion, block, chain, False)
    grid, threads = (-(-n // bn), -(-m // bm)), 32 * cfg.wm * cfg.wn
    return lambda: launcher(grid, threads, a, b, sa, 0, sb, 0, bias, 0, y, OUT_BF16)


def gemv_fn(a, b, sa, sb, cfg, hardware, chain):
    m, n = a.shape[0], b.shape[0]
    y = cp.empty((m, n), dtype=cp.uint16)
    bias = cp.zeros(1, dtype=cp.uint16)
    x = cp.zeros((1, 2), dtype=cp.uint16)
    launcher = tc_gemv.gemv_launcher(m, cfg, tc_gemv.MODE_CODES, False, hardware, chain, False)
    blocks, threads = -(-n // (16 * cfg.rt)), 32 * cfg.warps
    return lambda: launcher(blocks, threads, a, x, 0, sa, b, sa, 0, sb, 0, bias, 0, y, OUT_BF16)


def copy_bandwidth():
    """Device copy bandwidth (bytes read + written per second) on 512 MiB."""
    src = cp.ones(1 << 29, dtype=cp.uint8)
    dst = cp.empty_like(src)
    t = best_of(lambda: cp.copyto(dst, src), 10)
    return 2 * src.nbytes / (t * 1e-6)


def main(sections):
    gen = torch.Generator(device="cuda").manual_seed(0)
    cc = device.current().cc
    chain = tc.chains_in_float32(cc)
    hardware = hardware_available(cc)
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(
        f"# bench_tensorcore {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC} on {smi}; "
        f"sm_{cc[0]}{cc[1]}, chained C = promotion per mma: {chain}"
    )
    bandwidth = copy_bandwidth()
    print(f"device copy bandwidth: {bandwidth / 1e12:.2f} TB/s (read + write)")
    sa = cp.asarray([0.5], dtype=cp.float32)
    sb = cp.asarray([0.25], dtype=cp.float32)
    ta_s, tb_s = torch.as_tensor(sa, device="cuda").reshape(()), torch.as_tensor(sb, device="cuda").reshape(())

    if "gemm" in sections or "gemm1" in sections or "gemm_all" in sections:
        gemm_tables(
            gen,
            sa,
            sb,
            ta_s,
            tb_s,
            chain,
            only_first="gemm1" in sections and "gemm" not in sections,
            all_e4m3="gemm_all" in sections,
        )
    if "decode" in sections:
        decode_tables(gen, sa, sb, ta_s, tb_s, chain, hardware, bandwidth)
    if "accuracy" in sections:
        accuracy_table(chain)


E4M3_DEFAULT = "128x128_w8_32x64"  # the e4m3-mma tile the GPU tests first ran on
# the f16-staged variants measured with the tensor core's own accumulation too
F16_CHAINED = ("f16ab_128x128_w8_32x64", "f16b_128x128_w8_32x64", "f16a_128x256_w8_64x64")
BEST = {}  # filled by table 1: "gemm" (any tile), "block" (BN dividing 128 with a K-block partial)


def timed_row(label, make, flops, t_peer, repeats=10):
    """One table row: device us of make()'s launch, TFLOP/s, the peer's time / this; None (and a
    'failed' row) when compiling or running it raises -- one configuration must not cost the rest."""
    try:
        t = best_of(make(), repeats, 2)
    except Exception as exc:
        row(label, f"failed: {exc.__class__.__name__}: {exc}"[:160], "", "")
        return None
    row(label, f"{t:.0f}", f"{flops / t / 1e6:.0f}", f"{t_peer / t:.3f}")
    return t


def block_table(gen, ta, tb, s, flops):
    """Table 3's header and peer: block scales for an s^3 GEMM (1 x 128 activation groups, 128 x 128
    weight blocks) and torch's block-scaled _scaled_mm on them. Returns the scales as the kernels take
    them -- [M, KB] m-contiguous (torch's and cuBLASLt's layout) and [NB, KB] -- and torch's time
    (NaN when torch refuses)."""
    table(
        "3. block-scaled GEMM 4096^3 (1 x 128 activation groups, 128 x 128 weight blocks), bf16 out",
        ["kernel", "us", "TFLOP/s", "torch block / this"],
    )
    kb = s // 128
    sa_blk = torch.rand(kb, s, device="cuda", generator=gen) * 0.01 + 0.001
    sb_blk = torch.rand(s // 128, kb, device="cuda", generator=gen) * 0.01 + 0.001
    t_tblk = float("nan")
    try:
        t_tblk = best_of(
            lambda: torch._scaled_mm(ta, tb.t(), scale_a=sa_blk.t(), scale_b=sb_blk.t(), out_dtype=torch.bfloat16), 10
        )
        row("torch block _scaled_mm", f"{t_tblk:.0f}", f"{flops / t_tblk / 1e6:.0f}", "1.00")
    except Exception as exc:
        row("torch block _scaled_mm", f"failed: {exc.__class__.__name__}: {exc}"[:120], "", "")
    return cp.asarray(sa_blk).T, cp.asarray(sb_blk), t_tblk


def block_capable(cfg):
    bm, bn = tc.tile_shape(cfg)
    return 128 % bn == 0 and cfg.mt * cfg.nt <= 16  # 32 x 64 warp tiles: room for the K-block partial


def gemm_tables(gen, sa, sb, ta_s, tb_s, chain, only_first=False, all_e4m3=False):
    # 1. 4096^3 -------------------------------------------------------------------------------------
    table(
        "1. GEMM M = N = K = 4096, per-tensor scales, bf16 out",
        ["kernel", "us", "TFLOP/s", "cuBLASLt / this (>= 0.5; ship >= 0.25)"],
    )
    s = 4096
    a, ta = codes(gen, s, s)
    b, tb = codes(gen, s, s)
    flops = 2 * s**3
    t_lt = best_of(lambda: gemm.scaled_mm(a, b, sa, sb, BF16, None, "cublaslt"), 20)
    t_torch = best_of(lambda: torch._scaled_mm(ta, tb.t(), scale_a=ta_s, scale_b=tb_s, out_dtype=torch.bfloat16), 20)
    row("cuBLASLt (vtnumba)", f"{t_lt:.0f}", f"{flops / t_lt / 1e6:.0f}", "1.00")
    row("torch._scaled_mm", f"{t_torch:.0f}", f"{flops / t_torch / 1e6:.0f}", f"{t_lt / t_torch:.2f}")
    e4m3_default = E4M3_DEFAULT
    # (name, config, promotion, chain, the default semantics): the e4m3 kernel chains C on sm_90
    # (promotion per mma there); the f16-staged kernel promotes per k32 explicitly
    variants = []
    for name, cfg in tc.GEMM_CONFIGS.items():
        if name.startswith("sim") or (not cfg.f16 and name != e4m3_default and not all_e4m3):
            continue
        variants.append((name, cfg, tc.PER_MMA, chain and not cfg.f16, True))
    e4m3 = tc.GEMM_CONFIGS[e4m3_default]
    if chain:
        variants.append((e4m3_default + " explicit promotion", e4m3, tc.PER_MMA, False, False))
    variants.append((e4m3_default + " per_128", e4m3, tc.PER_128, chain, False))
    for name in F16_CHAINED:
        variants.append((name + " tensor-core accumulation", tc.GEMM_CONFIGS[name], tc.PER_MMA, True, False))
    for name, cfg in tc.GEMM_CONFIGS.items():
        if cfg.f16 and block_capable(cfg) and not name.startswith("sim"):
            variants.append((name + " per_128", cfg, tc.PER_128, False, False))
    best, best_block = (float("inf"), None), (float("inf"), None)
    for name, cfg, promotion, ch, default in variants:
        form = ", chained C" if ch and promotion == tc.PER_MMA and not cfg.f16 else ""
        t = timed_row(f"vt {name} ({promotion}{form})", lambda: gemm_fn(a, b, sa, sb, cfg, promotion, ch), flops, t_lt)
        if t is None:
            continue
        if default and t < best[0]:
            best = (t, name)
        if default and block_capable(cfg) and t < best_block[0]:
            best_block = (t, name)
    BEST["gemm"] = best[1] or e4m3_default
    BEST["block"] = best_block[1] or e4m3_default
    print(f"best (promotion per mma): {BEST['gemm']}; best able to hold block scales: {BEST['block']}")
    if only_first:
        return

    # 2. 28672 x 4096 at M = 4096 ------------------------------------------------------------------
    table(
        "2. GEMM M = 4096, N x K = 28672 x 4096, per-tensor, bf16 out", ["kernel", "us", "TFLOP/s", "cuBLASLt / this"]
    )
    n, k = 28672, 4096
    b2, tb2 = codes(gen, n, k)
    flops2 = 2 * s * n * k
    t_lt2 = best_of(lambda: gemm.scaled_mm(a, b2, sa, sb, BF16, None, "cublaslt"), 10)
    t_torch2 = best_of(lambda: torch._scaled_mm(ta, tb2.t(), scale_a=ta_s, scale_b=tb_s, out_dtype=torch.bfloat16), 10)
    row("cuBLASLt", f"{t_lt2:.0f}", f"{flops2 / t_lt2 / 1e6:.0f}", "1.00")
    row("torch._scaled_mm", f"{t_torch2:.0f}", f"{flops2 / t_torch2 / 1e6:.0f}", f"{t_lt2 / t_torch2:.2f}")
    for name in dict.fromkeys((BEST["gemm"], e4m3_default)):
        cfg = tc.GEMM_CONFIGS[name]
        timed_row(
            f"vt {name}",
            lambda: gemm_fn(a, b2, sa, sb, cfg, tc.PER_MMA, chain and not cfg.f16),
            flops2,
            t_lt2,
            repeats=5,
        )

    # 3. block-scaled 4096^3 ------------------------------------------------------------------------
    sa_c, sb_c, t_tblk = block_table(gen, ta, tb, s, flops)
    block_names = [e4m3_default] + [
        name
        for name in tc.GEMM_CONFIGS
        if tc.GEMM_CONFIGS[name].f16 and block_capable(tc.GEMM_CONFIGS[name]) and not name.startswith("sim")
    ]
    for name in block_names:
        cfg = tc.GEMM_CONFIGS[name]
        for promotion in (tc.PER_MMA, tc.PER_128):
            timed_row(
                f"vt {name} block ({promotion})",
                lambda: gemm_fn(a, b, sa_c, sb_c, cfg, promotion, chain and not cfg.f16, block=True),
                flops,
                t_tblk,
            )


def decode_tables(gen, sa, sb, ta_s, tb_s, chain, hardware, bandwidth):
    # 4. decode GEMV ----------------------------------------------------------------------------------
    table(
        "4. decode GEMV, codes in, per-tensor, bf16 out: device us",
        [
            "M",
            "N x K",
            "torch _scaled_mm",
            "cuBLASLt",
            "CUDA-core GEMV",
            "vt tensor-core GEMV",
            "weight-read floor",
            "cuBLASLt / vt (>= 1.3 at 4096^2, >= 1.0)",
        ],
    )
    for m in (1, 4, 16):
        for n, k in SHAPES:
            am, tam = codes(gen, m, k)
            bm_, tbm = codes(gen, n, k)
            t_t = best_of(lambda: torch._scaled_mm(tam, tbm.t(), scale_a=ta_s, scale_b=tb_s, out_dtype=torch.bfloat16))
            t_l = best_of(lambda: gemm.scaled_mm(am, bm_, sa, sb, BF16, None, "cublaslt"))
            t_c = (
                best_of(lambda: gemm.scaled_mm(am, bm_, sa, sb, BF16, None, "decode_gemv")) if m <= 4 else float("nan")
            )
            t_v = best_of(gemv_fn(am, bm_, sa, sb, tc_gemv.gemv_config(m, k), hardware, chain))
            floor = n * k / bandwidth * 1e6  # the weight's bytes at the device copy's rate
            row(
                m,
                f"{n} x {k}",
                f"{t_t:.1f}",
                f"{t_l:.1f}",
                f"{t_c:.1f}",
                f"{t_v:.1f}",
                f"{floor:.1f}",
                f"{t_l / t_v:.2f}",
            )
    for m in (1, 16):
        names = [name for name in tc_gemv.GEMV_CONFIGS if "sim" not in name and (m <= 8 or "d4" not in name)]
        table(f"4b. the GEMV's configurations at M = {m}: device us", ["N x K"] + names)
        for n, k in SHAPES:
            am, _ = codes(gen, m, k)
            bm_, _ = codes(gen, n, k)
            row(
                f"{n} x {k}",
                *(
                    f"{best_of(gemv_fn(am, bm_, sa, sb, tc_gemv.GEMV_CONFIGS[name], hardware, chain)):.1f}"
                    for name in names
                ),
            )

    # 5. the fused static layer at M = 1 -----------------------------------------------------------------
    table(
        "5. FP8 linear layer at M = 1, static per-tensor (bf16 x -> quantize -> GEMM -> bf16 y), one launch",
        ["N x K", "torch bf16 matmul us", "vt fused static us", "vt fused per-token us", "bf16 / vt static (>= 1.8)"],
    )
    in_scale = cp.asarray([0.02], dtype=cp.float32)
    for n, k in SHAPES:
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = (torch.randn(n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
        t_bf16 = best_of(lambda: x @ w.t())
        xc = cp.asarray(x.view(torch.int16)).view(BF16)
        bw = cp.asarray(w.to(torch.float8_e4m3fn).view(torch.uint8))
        t_static = best_of(lambda: vt.fp8_linear(xc, bw, sb, in_scale, out_dtype=BF16))
        t_token = best_of(lambda: vt.fp8_linear(xc, bw, sb, per_token=True, out_dtype=BF16))
        row(f"{n} x {k}", f"{t_bf16:.1f}", f"{t_static:.1f}", f"{t_token:.1f}", f"{t_bf16 / t_static:.2f}")


def accuracy_table(chain):
    # 6. accuracy -----------------------------------------------------------------------------------
    def f16_pick(key):  # table 1's fastest f16-staged configuration, if it ran
        name = BEST.get(key)
        return name if name and tc.GEMM_CONFIGS[name].f16 else "f16ab_128x128_w8_32x64"

    f16_name, f16_split = f16_pick("gemm"), f16_pick("block")
    table(
        "6. accuracy on uniformly drawn codes (magnitudes 2^-9 .. 448), M = N = 512: worst |err| / G3 bound",
        [
            "K",
            "vt per_mma",
            "vt per_mma explicit",
            "vt per_128",
            f"vt {f16_name} per_mma",
            f"vt {f16_name} tensor-core accumulation",
            f"vt {f16_split} per_128",
            "vt GEMV M=16",
            "cuBLASLt",
            "torch._scaled_mm",
        ],
    )
    rng = np.random.default_rng(0)
    one = cp.ones(1, dtype=cp.float32)
    e4m3 = tc.GEMM_CONFIGS[E4M3_DEFAULT]
    for k in (256, 4096):
        ah = rng.integers(0, 256, size=(512, k), dtype=np.uint8)
        bh = rng.integers(0, 256, size=(512, k), dtype=np.uint8)
        for h in (ah, bh):
            h[(h & 0x7F) == 0x7F] = 0x3C
        ref, bound = reference.scaled_mm(ah, bh, 1.0, 1.0)
        ad, bd = cp.asarray(ah), cp.asarray(bh)

        def ratio(y):
            return f"{np.max(np.abs(y.astype(np.float64) - ref) / bound):.3f}"

        def run(cfg, promotion, ch):
            bm, bn = tc.tile_shape(cfg)
            y = cp.full((512, 512), cp.nan, dtype=cp.float32)
            tc.gemm_launcher(cfg, promotion, False, ch, True)(
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
                y,
                0,
            )
            return y.get()

        outs = [
            run(e4m3, tc.PER_MMA, chain),
            run(e4m3, tc.PER_MMA, False),
            run(e4m3, tc.PER_128, chain),
            run(tc.GEMM_CONFIGS[f16_name], tc.PER_MMA, False),
            run(tc.GEMM_CONFIGS[f16_name], tc.PER_MMA, True),
            run(tc.GEMM_CONFIGS[f16_split], tc.PER_128, False),
        ]
        cells = [ratio(y) for y in outs]
        y16 = gemm.TensorCoreGemv().run(gemm.GemmCall(ad[:16], bd, np.float32(1), np.float32(1), F32, None)).get()
        ref16, bound16 = ref[:16], bound[:16]
        cells.append(f"{np.max(np.abs(y16.astype(np.float64) - ref16) / bound16):.3f}")
        y_lt = gemm.scaled_mm(ad, bd, np.float32(1), np.float32(1), F32, None, "cublaslt").get()
        ta_u = torch.as_tensor(ad, device="cuda").view(torch.float8_e4m3fn)
        tb_u = torch.as_tensor(bd, device="cuda").view(torch.float8_e4m3fn)
        one_t = torch.ones((), device="cuda")
        y_t = torch._scaled_mm(ta_u, tb_u.t(), scale_a=one_t, scale_b=one_t, out_dtype=torch.float32).cpu().numpy()
        row(k, *cells, ratio(y_lt), ratio(y_t))
        same = int((outs[3] == outs[0]).sum())
        print(
            f"K = {k}: {f16_name} per_mma equals the e4m3 kernel's per_mma (chained C = {chain}) in "
            f"{same} of {outs[0].size} elements",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main(set(sys.argv[1:]) or {"gemm", "decode", "accuracy"}))
