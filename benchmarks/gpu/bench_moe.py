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

    python3 benchmarks/gpu/bench_moe.py [--quick] [--parts grouped,decode,tokens] [--peer VLLM_LOG]

``--peer`` takes table 3's vLLM figures from the log of a timing of vLLM's Triton fused-MoE kernel run
apart on the same card (not in this repository: vLLM's kernel source stays out of the tree; the log's
markdown summary table has columns "T", "scheme" (channel or block), "2-GEMM us, vLLM's pick" and
"2-GEMM us, L2-cold"); without it they are the H200's of 2026-12-02 (``VLLM_TWO_GEMMS``), which on
another card compare two cards.
"""

import argparse
import contextlib
import datetime
import itertools
import os
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


# the two schemes of the layer tables: (Fp8Experts options, block size)
SCHEMES = {"per_token": (dict(activation_scheme="per_token"), None), "per_group 128x128": (dict(), (128, 128))}


def qwen3_layer(cp, rng, name):
    """(gate_up, down) Fp8Experts on the GPU at Qwen3-30B-A3B's shapes, random codes and scales."""
    from vtnumba import seam

    kw, block = SCHEMES[name]
    e, h, inter = QWEN3_MOE["experts"], QWEN3_MOE["hidden"], QWEN3_MOE["intermediate"]
    if block is None:
        sgu = cp.asarray(rng.uniform(0.5, 1.5, size=(e, 2 * inter)).astype(np.float32) * 1e-2)
        sdn = cp.asarray(rng.uniform(0.5, 1.5, size=(e, h)).astype(np.float32) * 1e-2)
    else:
        sgu = cp.asarray(rng.uniform(0.5, 1.5, size=(e, 2 * inter // 128, h // 128)).astype(np.float32) * 1e-2)
        sdn = cp.asarray(rng.uniform(0.5, 1.5, size=(e, h // 128, inter // 128)).astype(np.float32) * 1e-2)
    gu = seam.Fp8Experts(random_codes(cp, rng, (e, 2 * inter, h)), sgu, block_size=block, **kw)
    dn = seam.Fp8Experts(random_codes(cp, rng, (e, h, inter)), sdn, block_size=block, **kw)
    return gu, dn


@contextlib.contextmanager
def kernels_disabled(*names):
    """VT_DISABLE_KERNELS with ``names`` added, for the block; as it was after."""
    saved = os.environ.get("VT_DISABLE_KERNELS")
    if names:
        os.environ["VT_DISABLE_KERNELS"] = ",".join(filter(None, [saved, *names]))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("VT_DISABLE_KERNELS", None)
        else:
            os.environ["VT_DISABLE_KERNELS"] = saved


def decode_layer_table(args, cp, torch, rng, us, tb_s):
    cfg = QWEN3_MOE
    e, h, inter, top_k = cfg["experts"], cfg["hidden"], cfg["intermediate"], cfg["top_k"]
    print(
        f"\n## 2. the whole moe_fp8 layer at batch-1 decode (Qwen3-30B-A3B: {e} experts, H {h}, I {inter}, "
        f"top-{top_k} distinct) (device us)\n"
    )
    row(
        "scheme",
        "routed pass",
        "eager us",
        "graph replay us",
        "of which the graph alone us",
        "8 experts' FP8 bytes at copy rate us",
        "graph / floor",
    )
    print("|---|---|---|---|---|---|---|")
    profiles = []
    from vtnumba.cuda import experts as gx

    passes = [("wgmma", ())] if gx.routed_wgmma_reason(h, inter) is None else []
    passes.append(("mma.sync GEMV", ("routed_wgmma",)))  # the pass before the wgmma one, in the same run
    for name, (pass_name, disable) in itertools.product(SCHEMES if not args.quick else list(SCHEMES)[:1], passes):
        with kernels_disabled(*disable):
            decode_layer_row(name, pass_name, cp, rng, us, tb_s, profiles)
    for name, rec in profiles:  # where a decode step's time goes, step by step (device time, queued)
        print(f"\n{name}: " + rec.table() + "\n")


def decode_layer_row(name, pass_name, cp, rng, us, tb_s, profiles):
    """Table 2's row of scheme ``name``, its profile into ``profiles``."""
    import vtnumba.cuda as vtcuda
    from vtnumba import profile, seam

    cfg = QWEN3_MOE
    e, h, inter, top_k = cfg["experts"], cfg["hidden"], cfg["intermediate"], cfg["top_k"]
    gu, dn = qwen3_layer(cp, rng, name)
    x = cp.asarray(rng.standard_normal((1, h)).astype(BF16))
    ids = cp.asarray(rng.permutation(e)[:top_k].reshape(1, top_k).astype(np.int32))
    weights = cp.asarray(rng.random((1, top_k)).astype(np.float32))
    layer = lambda x, ids, weights: seam.moe_fp8(x, gu, dn, ids, weights)  # noqa: E731
    t_eager = us(lambda: layer(x, ids, weights))
    try:
        graph = vtcuda.capture(layer, x, ids, weights)
        t_graph = us(lambda: graph(x, ids, weights))
        # the replay less its input copies (a call copies x, ids and weights into the graph's inputs,
        # a device-to-device copy each): the graph launched on its own inputs
        stream = cp.cuda.get_current_stream()
        t_launch = us(lambda: graph.graph.launch(stream))
        eager_out, graph_out = layer(x, ids, weights), graph(x, ids, weights)
        same = bool(cp.array_equal(eager_out.view(cp.uint16), graph_out.view(cp.uint16)))
    except Exception as exc:
        t_graph = t_launch = None
        same = False
        print(f"capture failed: {type(exc).__name__}: {str(exc)[:300]}")
    floor_us = top_k * (2 * inter * h + h * inter) / (tb_s * 1e12) * 1e6
    row(
        name,
        pass_name,
        f"{t_eager:.1f}",
        "n/a" if t_graph is None else f"{t_graph:.1f}" + ("" if same else " (differs!)"),
        "n/a" if t_launch is None else f"{t_launch:.1f}",
        f"{floor_us:.1f}",
        "n/a" if t_graph is None else f"{t_graph / floor_us:.2f}x",
    )
    profiles.append((f"{name}, {pass_name}", profile.profile_moe(x, gu, dn, ids, weights, repeats=50)))


# vLLM 0.33.0's Triton fused MoE on the H200, 2026-12-02 (its two GEMMs, L2-hot / L2-cold us; the
# peer's figures, measured apart: docs/DESIGN.md cites them, benchmarks/RESULTS.md has the run)
VLLM_TWO_GEMMS = {
    ("per_token", 1): (13.1, 18.7),
    ("per_token", 8): (68.7, 69.9),
    ("per_token", 64): (153.1, 155.6),
    ("per_token", 512): (188.9, 188.6),
    ("per_group 128x128", 1): (14.4, 20.7),
    ("per_group 128x128", 8): (70.5, 72.0),
    ("per_group 128x128", 64): (152.5, 154.8),
    ("per_group 128x128", 512): (195.7, 196.2),
}
# the probe's scheme names (its markdown table's second column) as this bench's
_PEER_SCHEMES = {"channel": "per_token", "block": "per_group 128x128"}


def peer_figures(path):
    """{(scheme, T): (hot, cold)} from the markdown summary table of a vLLM fused-MoE timing's log (the
    module docstring; rows ``| T | scheme | ... |``, the columns found by their headers "2-GEMM us,
    vLLM's pick" and "2-GEMM us, L2-cold"): the peer measured on the card this bench runs on, in
    place of VLLM_TWO_GEMMS."""
    figures, header = {}, None
    for line in open(path, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            if len(cells) > 2 and cells[:2] == ["T", "scheme"]:
                header = cells
            continue
        if len(cells) != len(header) or not cells[0].isdigit() or cells[1] not in _PEER_SCHEMES:
            continue
        hot, cold = (float(cells[header.index(h)]) for h in ("2-GEMM us, vLLM's pick", "2-GEMM us, L2-cold"))
        figures[(_PEER_SCHEMES[cells[1]], int(cells[0]))] = (hot, cold)
    if not figures:
        raise SystemExit(f"--peer {path}: no row of a vLLM fused-MoE summary table found (T, scheme, ...)")
    return figures


ROUTED_TIMED_TOKENS = 8  # the routed path is timed up to this T (past it each pair re-streams its expert)
ROTATIONS = 16  # L2-cold: 16 routings in turn (at T = 1 over disjoint experts), as 16 layers read them


def routings(cp, rng, t, n):
    """n (x, ids, weights) of T tokens: softmax top-8 over random logits (normalized), ids int32; at
    T = 1 the n routings take disjoint experts (n * 8 <= E), as the vLLM timing did."""
    e, h, k = QWEN3_MOE["experts"], QWEN3_MOE["hidden"], QWEN3_MOE["top_k"]
    perm = rng.permutation(e)
    out = []
    for r in range(n):
        logits = rng.standard_normal((t, e)).astype(np.float32)
        ids = np.argsort(-logits, axis=1)[:, :k]
        if t == 1 and n * k <= e:
            ids = perm[r * k : (r + 1) * k].reshape(1, k)
        w = np.exp(np.take_along_axis(logits, ids, axis=1))
        w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)
        x = cp.asarray(rng.standard_normal((t, h)).astype(BF16))
        out.append((x, cp.asarray(ids.astype(np.int32)), cp.asarray(w)))
    return out


def _cycled(fns):
    """A callable that calls fns[0], fns[1], ... in turn, one per call."""
    state = [0]

    def call():
        fns[state[0] % len(fns)]()
        state[0] += 1

    return call


def tokens_table(args, cp, rng, us):
    """3. The layer and its two GEMMs by token count, each decode path that takes the call."""
    import os

    from vtnumba.cuda import experts as gx
    from vtnumba.seam.experts import MoeCall

    print("\n## 3. moe_fp8 by tokens T (Qwen3-30B-A3B), L2-hot and L2-cold (16 routings in turn), device us, queued\n")
    print(
        f"vLLM's figures: {args.peer} (measured on this card)\n"
        if args.peer
        else "vLLM's figures: the H200's of 2026-12-02 (VLLM_TWO_GEMMS; --peer LOG for this card's)\n"
    )
    row(
        "scheme",
        "T",
        "path",
        "launches",
        "layer hot",
        "layer cold",
        "2 GEMMs hot",
        "2 GEMMs cold",
        "vLLM 2 GEMMs hot / cold",
        "2 GEMMs cold / vLLM",
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    tokens = (1, 2, 4, 8, 64, 512) if not args.quick else (1, 8)
    for name in SCHEMES if not args.quick else list(SCHEMES)[:1]:
        gu, dn = qwen3_layer(cp, rng, name)
        for t in tokens:
            rot = routings(cp, rng, t, ROTATIONS)
            for path in ("routed", "aligned") if t <= ROUTED_TIMED_TOKENS else ("aligned",):
                saved, max_pairs = os.environ.get("VT_DISABLE_KERNELS"), gx.ROUTED_MAX_PAIRS
                if path == "aligned":
                    os.environ["VT_DISABLE_KERNELS"] = ",".join(filter(None, [saved, "routed_gemv"]))
                else:  # the routed path timed past its threshold too: the table is what sets it
                    gx.ROUTED_MAX_PAIRS = dict.fromkeys(max_pairs, t * QWEN3_MOE["top_k"])
                try:
                    calls = [MoeCall(x, gu, dn, ids, w) for x, ids, w in rot]
                    if (calls[0].routed_reason is None) != (path == "routed"):
                        continue  # this path does not take the call
                    for c in calls:
                        c.run()
                    gemm_names = ("routed_gate_up", "routed_down") if path == "routed" else ("gate_up", "down")

                    def gemms(c):
                        steps = dict(c.steps)
                        return lambda: [steps[n]() for n in gemm_names]

                    hot, cold = us(calls[0].run), us(_cycled([c.run for c in calls]))
                    g_hot, g_cold = us(gemms(calls[0])), us(_cycled([gemms(c) for c in calls]))
                finally:
                    gx.ROUTED_MAX_PAIRS = max_pairs
                    if saved is None:
                        os.environ.pop("VT_DISABLE_KERNELS", None)
                    else:
                        os.environ["VT_DISABLE_KERNELS"] = saved
                peer = (args.peer_figures or VLLM_TWO_GEMMS).get((name, t))
                row(
                    name,
                    t,
                    path,
                    len(calls[0].steps) if path == "routed" else "9-10",  # (a routed step is one launch)
                    f"{hot:.1f}",
                    f"{cold:.1f}",
                    f"{g_hot:.1f}",
                    f"{g_cold:.1f}",
                    "" if peer is None else f"{peer[0]} / {peer[1]}",
                    "" if peer is None else f"{g_cold / peer[1]:.2f}x",
                )
            rot = calls = None


# the routed GEMV configurations the sweep times (ROUTED_GEMV_CONFIGS names; tc_gemv.ROUTED_CONFIGS picks)
SWEEP_CONFIGS = ("r16_w4_d2", "r16_w8_d2", "r16_w2_d2", "r32_w4_d2", "r32_w2_d2", "r16_w4_d4")
# and the swapped wgmma pass's (sm_90; tc_gemv.ROUTED_WGMMA_CONFIGS names, ROUTED_WGMMA_CHOICE picks)
SWEEP_WGMMA_CONFIGS = ("wg_s2", "wg_s3", "wg_s4", "wg_s6")


def config_table(args, cp, rng, us):
    """4. The routed GEMVs alone at one token by configuration (per_token, L2-cold)."""
    from vtnumba.cuda import experts as gx
    from vtnumba.cuda.kernels import tc_gemv
    from vtnumba.cuda.kernels.epilogue import OUT_KIND
    from vtnumba.cuda.runtime import device

    print("\n## 4. the routed GEMVs at T = 1 by configuration (per_token and blocks, L2-cold, device us)\n")
    row("scheme", "config", "routed_gate_up us", "routed_down us")
    print("|---|---|---|---|")
    for name in SCHEMES:
        gu, dn = qwen3_layer(cp, rng, name)
        rot = routings(cp, rng, 1, ROTATIONS)
        dev = device.current()
        e, n2, _ = gu.shape
        wgmma = gx.routed_wgmma_reason(gu.shape[2], n2 // 2) is None
        names = SWEEP_CONFIGS + (SWEEP_WGMMA_CONFIGS if wgmma else ())
        for cfg_name in [c for c in names if not args.configs or c in args.configs.split(",")]:
            cfg = tc_gemv.ROUTED_GEMV_CONFIGS.get(cfg_name) or tc_gemv.ROUTED_WGMMA_CONFIGS[cfg_name]
            stage_us = []
            for stage, ex in (("gate_up", gu), ("down", dn)):
                mode, qtable, q_step, sb, sb_step, block_scaled, b = gx._routed_operands(ex)
                fns = []
                # down's counters: gate_up zeroes them in the layer; here each call's arrivals only
                # accumulate (the combine then runs in no block: the GEMV alone is timed)
                arrivals = cp.zeros(ex.shape[1], np.int32)
                for x, ids, _ in rot:
                    flat = ids.reshape(-1)
                    if stage == "gate_up":
                        hidden = cp.empty((8, n2), np.float32)
                        act = cp.empty((8, n2 // 2), np.float32)
                        *launch, shared = tc_gemv.routed_launch(
                            stage, x.view(np.uint16), OUT_KIND[BF16], qtable, q_step, b, sb, sb_step, mode, block_scaled,
                            hidden, flat, e, 8, arrivals, dev, act=act, config=cfg,
                        )  # fmt: skip
                    else:
                        act = cp.asarray(rng.standard_normal((8, n2 // 2)).astype(np.float32))
                        y = cp.empty((8, ex.shape[1]), np.float32)
                        out = cp.empty((1, ex.shape[1]), np.uint16)
                        weights = cp.full(8, 0.125, np.float32)
                        *launch, shared = tc_gemv.routed_launch(
                            stage, act.view(np.uint16), OUT_KIND[np.dtype(np.float32)], qtable, q_step, b, sb, sb_step, mode, block_scaled,
                            y, flat, e, 8, arrivals, dev, w=weights, w_kind=0, layer_out=out, out_kind=OUT_KIND[BF16], config=cfg,
                        )  # fmt: skip
                    kernel, grid, block, kargs = launch
                    fns.append(
                        lambda kernel=kernel, grid=grid, block=block, kargs=kargs, shared=shared: kernel(
                            grid, block, *kargs, shared_mem=shared
                        )
                    )
                stage_us.append(us(_cycled(fns)))
            row(name, cfg_name, f"{stage_us[0]:.1f}", f"{stage_us[1]:.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one row count per shape, one decode scheme")
    parser.add_argument(
        "--parts",
        default="grouped,decode,tokens",
        help="comma-separated tables: grouped (1), decode (2), tokens (3), configs (4: the routed GEMV sweep)",
    )
    parser.add_argument("--configs", default="", help="comma-separated configuration names for table 4 (default: all)")
    parser.add_argument(
        "--peer",
        default="",
        help="table 3's vLLM figures from this log of a vLLM fused-MoE timing run on the same card "
        "(default: the H200's of 2026-12-02)",
    )
    args = parser.parse_args()
    args.peer_figures = peer_figures(args.peer) if args.peer else None
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
    parts = args.parts.split(",")
    if "grouped" in parts:
        grouped_gemm_table(args, cp, torch, rng, us, tb_s)
    if "decode" in parts:
        decode_layer_table(args, cp, torch, rng, us, tb_s)
    if "tokens" in parts:
        tokens_table(args, cp, rng, us)
    if "configs" in parts:
        config_table(args, cp, rng, us)


if __name__ == "__main__":
    main()
