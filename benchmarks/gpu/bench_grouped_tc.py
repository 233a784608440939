"""The grouped tensor-core GEMV (vtnumba/cuda/kernels/tc_gemv.py, ``grouped_gemv``) at the MoE decode
shapes, against torch's grouped GEMMs measured in the same run.

Shapes (E experts, N, K; every expert routed the same number of rows):
  qwen3_gate_up     128 x 1536 x 2048   Qwen3-30B-A3B's experts
  qwen3_down        128 x 2048 x 768
  deepseek_gate_up   16 x 4096 x 7168   DeepSeek-V3's experts (the 16 a rank holds at EP = 16)

Per shape and routing (``--rows``: 1, 8 and 16 rows in every expert, and 1 row in each of 8 experts
with the rest empty -- decode at one token, top-8 -- by default) it prints the device time of
  - ours: grouped_gemv, per-row x per-channel float32 scales, bf16 out, in passes of 16 rows (the
    kernel a caller gets without rows_hint) and of 8 (rows_hint=8: 9..16 rows take two passes);
    ``--configs``: every GEMV configuration, both pass sizes, with and without the register cap;
  - ours block-scaled (``--block``): 128 x 128 float32 weight scales, 1 x 128 activation scales;
  - torch._scaled_grouped_mm: rowwise (float32 scale per row of a and per output channel of b),
    a [P, K] float8_e4m3fn, b as the [E, K, N] column-major view of the [E, N, K] weight, offs the
    int32 cumulative ends [E], bf16 out -- the peer the target is set against;
  - torch._grouped_mm on bf16 weights (twice the bytes);
with TB/s against the weight bytes each one must read (FP8: E N K; bf16: 2 E N K), the floor at
4 TB/s, and ours over torch's FP8 time. Ours is also compared with torch's FP8 result (max
|difference| / max |torch|: a sanity check, not the accuracy gate, which is the tests').

Device time: torch.cuda._sleep holds the GPU while every timed launch is enqueued behind it, then
CUDA events around ``--repeats`` launches (docs/DEVICE.md, "Timing: device time and host cost, measured apart"); the best of ``--rounds``. All work
runs on torch's current stream (vtnumba launches on cupy's current stream: the same stream here).

``--wgmma`` adds the grouped GEMV on the swapped wgmma pass (sm_90; ``grouped_wgmma_launch``) at
each ring depth, per-row x per-channel and 128 x 128 block scales.

``--kernels`` adds each kernel of ``vtnumba.cuda.experts`` run by name through ``grouped_scaled_mm``
(bf16 out): the GEMV, the grouped tiled GEMMs (wgmma, mma.sync) with their tile map, and
``per_expert`` (its read-back synchronizes, so its figure is wall time, marked host-bound). With
``--rows 16,64,128,512`` it shows where prefill's kernels cross over.

Run: python3 benchmarks/gpu/bench_grouped_tc.py [--quick] [--shapes qwen3_gate_up,deepseek_gate_up]
     [--rows 1,8,16,32,64] [--configs] [--block] [--kernels] [--repeats 50] [--rounds 3]
(needs cupy, torch, numba-cuda and a GPU with the FP8 mma, sm_89 or later)
"""

import argparse
import datetime
import subprocess
import sys
import time
import traceback

import numpy as np

SHAPES = {
    "qwen3_gate_up": (128, 1536, 2048),
    "qwen3_down": (128, 2048, 768),
    "deepseek_gate_up": (16, 4096, 7168),
}
FLOOR_TBS = 4.0  # the H200's HBM3e rate the target is written against


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="gate_up shapes, 8 rows, fewer repeats: a smoke run")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names of SHAPES")
    p.add_argument(
        "--rows",
        default="1,8,16,1x8",
        help="rows per expert, comma-separated; RxA: R rows in each of A experts, the rest empty",
    )
    p.add_argument("--configs", action="store_true", help="also time every GEMV configuration (GEMV_CONFIGS)")
    p.add_argument("--block", action="store_true", help="also time the block-scaled (128 x 128) grouped GEMV")
    p.add_argument(
        "--wgmma", action="store_true", help="also time the grouped GEMV on the swapped wgmma pass, each ring depth"
    )
    p.add_argument("--no-torch", action="store_true", help="skip torch's grouped GEMMs")
    p.add_argument(
        "--kernels",
        action="store_true",
        help="also time every kernel of vtnumba.cuda.experts by name through grouped_scaled_mm (the tile map, "
        "per_expert's read-back and its calls included): the GEMV, the grouped tiled GEMMs, per_expert",
    )
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.rows, args.repeats, args.rounds = "qwen3_gate_up,deepseek_gate_up", "8", 20, 2
    args.shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    args.rows = [_routing(r) for r in args.rows.split(",") if r]
    return args


def _routing(spec):
    """(rows per routed expert, routed experts or None for all) of "8" or "1x8"."""
    rows, _, active = spec.partition("x")
    return int(rows), (int(active) if active else None)


def device_us(torch, fn, repeats, rounds):
    """Device microseconds per call: a queued sleep, then events around ``repeats`` calls; the best
    of ``rounds``. Returns (us, note): the note says when the host could not stay ahead."""
    stream = torch.cuda.current_stream()
    fn()
    torch.cuda.synchronize()
    cycles, best, note = int(1e8), float("inf"), ""
    for _ in range(rounds):
        for _attempt in range(4):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(cycles)
            start.record(stream)
            h0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            enqueue = time.perf_counter() - h0
            end.record(stream)
            end.synchronize()
            # ~1.5 GHz or more: the sleep lasts at least cycles / 2e9 s; it must outlast the enqueueing
            if enqueue < cycles / 2e9:
                note = ""
                break
            cycles *= 4
            note = "host-bound: includes launch gaps"
        best = min(best, start.elapsed_time(end) * 1e3 / repeats)
    return best, note


def header(torch):
    import cupy as cp

    props = torch.cuda.get_device_properties(0)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    print(f"# grouped tensor-core GEMV, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}")
    print(
        f"{props.name} (sm_{props.major}{props.minor}), torch {torch.__version__}, cupy {cp.__version__}, "
        f"commit {commit or '?'}"
    )


def main(argv=None):
    args = parse(argv)
    import cupy as cp
    import torch

    from vtnumba.cuda.kernels import tc_gemv
    from vtnumba.cuda.runtime import device

    header(torch)
    torch.manual_seed(0)
    with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        dev = device.current()
        for name in args.shapes:
            e, n, k = SHAPES[name]
            w_fp8 = (torch.randn(e, n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
            b = cp.asarray(w_fp8.view(torch.uint8))
            w_bf16 = None if args.no_torch else w_fp8.to(torch.bfloat16)
            wbytes = e * n * k
            sb = torch.rand(e, n, device="cuda") * 0.01 + 0.001
            sb_block = torch.rand(e, -(-n // 128), -(-k // 128), device="cuda") * 0.05 + 0.01
            print(
                f"\n## {name}: E = {e}, N = {n}, K = {k}; FP8 weights {wbytes / 1e6:.0f} MB, "
                f"{wbytes / FLOOR_TBS / 1e6:.1f} us at {FLOOR_TBS:g} TB/s"
            )
            print(
                "| rows/expert | kernel | us | TB/s (routed weights) | torch FP8 / this | max diff vs torch FP8 "
                "| note |"
            )
            print("|---|---|---|---|---|---|---|", flush=True)
            for rows, active in args.rows:
                active = e if active is None else min(active, e)
                counts = np.zeros(e, dtype=np.int32)
                counts[np.linspace(0, e - 1, active).astype(int)] = rows  # spread over the experts
                p = rows * active
                routed_bytes = active * n * k
                rows_label = f"{rows}" if active == e else f"{rows} in {active} experts"
                x_fp8 = (torch.randn(p, k, device="cuda") * 2).to(torch.float8_e4m3fn)
                a = cp.asarray(x_fp8.view(torch.uint8))
                sa = torch.rand(p, device="cuda") * 0.02 + 0.001
                sa_block = torch.rand(p, -(-k // 128), device="cuda") * 0.02 + 0.001
                offsets_t = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), device="cuda", dtype=torch.int32)
                offsets = cp.asarray(offsets_t)
                y = torch.empty(p, n, device="cuda", dtype=torch.bfloat16)
                y_bits = cp.asarray(y.view(torch.int16)).view(cp.uint16)
                sa_c, sb_c = cp.asarray(sa), cp.asarray(sb)
                reference, ref_us = None, None

                def emit(label, us, out, note, nbytes):
                    """One row, printed as soon as it is measured (a run cut short keeps what it had)."""
                    ratio = f"{ref_us / us:.2f}x" if ref_us else "-"
                    diff = "-"
                    if out is not None and reference is not None:
                        r = reference.float()
                        diff = f"{((out.float() - r).abs().max() / r.abs().max()).item():.1e}"
                    print(
                        f"| {rows_label} | {label} | {us:.1f} | {nbytes / us / 1e6:.2f} | {ratio} | {diff} | {note} |",
                        flush=True,
                    )

                if not args.no_torch:
                    offs = offsets_t[1:].contiguous()
                    try:

                        def torch_fp8():
                            return torch._scaled_grouped_mm(
                                x_fp8, w_fp8.transpose(-2, -1), sa, sb, offs=offs, out_dtype=torch.bfloat16
                            )

                        reference = torch_fp8()
                        ref_us, note = device_us(torch, torch_fp8, args.repeats, args.rounds)
                        emit("torch._scaled_grouped_mm (rowwise)", ref_us, None, note, routed_bytes)
                    except Exception as exc:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
                        print(
                            f"| {rows_label} | torch._scaled_grouped_mm | - | - | - | - | failed: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]} |",
                            flush=True,
                        )
                    try:
                        x_bf16 = x_fp8.to(torch.bfloat16)

                        def torch_bf16():
                            return torch._grouped_mm(
                                x_bf16, w_bf16.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16
                            )

                        torch_bf16()
                        us, note = device_us(torch, torch_bf16, args.repeats, args.rounds)
                        emit("torch._grouped_mm (bf16 weights)", us, None, note, 2 * routed_bytes)
                    except Exception as exc:  # noqa: BLE001
                        print(
                            f"| {rows_label} | torch._grouped_mm | - | - | - | - | failed: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]} |",
                            flush=True,
                        )

                # rows_hint None: passes of 16 rows (what a caller without a bound gets); rows_hint 8:
                # passes of 8 (fewer registers, more blocks a multiprocessor; 9..16 rows take two)
                variants = [("ours, 16-row passes", None, None, True), ("ours, 8-row passes", 8, None, True)]
                if args.kernels:  # the GEMV is timed among the experts' kernels instead
                    variants = []
                if args.configs:  # + without the register cap (tc_gemv.GROUPED_REGISTER_CAP)
                    variants += [
                        (
                            f"ours, {cfg_name}, {pass_rows}-row passes{'' if bounded else ', uncapped'}",
                            pass_rows,
                            cfg,
                            bounded,
                        )
                        for cfg_name, cfg in tc_gemv.GEMV_CONFIGS.items()
                        if not cfg_name.startswith("sim_")
                        for pass_rows in (8, 16)
                        for bounded in (True, False)
                    ]
                for label, hint, cfg, bounded in variants:
                    reason = tc_gemv.grouped_gemv_reason(a, sa_c, b, sb_c, None, dev)
                    if reason:
                        print(f"| {rows_label} | {label} | - | - | - | - | cannot run: {reason} |", flush=True)
                        continue
                    kernel, grid, block, kargs = tc_gemv.grouped_gemv_launch(
                        a, sa_c, b, sb_c, offsets, y_bits, _bf16(), None, dev, hint, cfg, bounded
                    )
                    prepared = kernel.prepare(grid, block, *kargs)
                    stream_ptr = torch.cuda.current_stream().cuda_stream

                    def ours(prepared=prepared, stream_ptr=stream_ptr):
                        prepared.launch(stream_ptr)

                    ours()
                    out = y.clone()
                    us, note = device_us(torch, ours, args.repeats, args.rounds)
                    emit(f"{label} ({grid[0]} x {grid[1]} blocks of {block})", us, out, note, routed_bytes)
                if args.block:
                    sa_b, sb_b = cp.asarray(sa_block), cp.asarray(sb_block)
                    reason = tc_gemv.grouped_gemv_reason(a, sa_b, b, sb_b, (128, 128), dev)
                    if reason:
                        print(
                            f"| {rows_label} | ours block-scaled | - | - | - | - | cannot run: {reason} |", flush=True
                        )
                    else:
                        kernel, grid, block, kargs = tc_gemv.grouped_gemv_launch(
                            a, sa_b, b, sb_b, offsets, y_bits, _bf16(), (128, 128), dev
                        )
                        prepared = kernel.prepare(grid, block, *kargs)
                        stream_ptr = torch.cuda.current_stream().cuda_stream
                        us, note = device_us(torch, lambda: prepared.launch(stream_ptr), args.repeats, args.rounds)
                        emit("ours block-scaled 128 x 128, 16-row passes", us, None, note, routed_bytes)

                if args.wgmma:  # the swapped wgmma pass's grouped GEMV, each ring depth (sm_90)
                    sa_b, sb_b = cp.asarray(sa_block), cp.asarray(sb_block)
                    for scale_kind, sa_w, sb_w, blocks in (
                        ("per-row x per-channel", sa_c, sb_c, None),
                        ("block-scaled 128 x 128", sa_b, sb_b, (128, 128)),
                    ):
                        reason = tc_gemv.grouped_wgmma_reason(a, sa_w, b, sb_w, blocks, dev)
                        if reason:
                            print(f"| {rows_label} | wgmma GEMV {scale_kind} | - | - | - | - | cannot run: {reason} |")
                            continue
                        for stages in (3, 4, 5):
                            kernel, grid, block, kargs, _ = tc_gemv.grouped_wgmma_launch(
                                a, sa_w, b, sb_w, offsets, y_bits, _bf16(), blocks, dev, stages=stages
                            )
                            prepared = kernel.prepare(grid, block, *kargs)
                            stream_ptr = torch.cuda.current_stream().cuda_stream
                            prepared.launch(stream_ptr)
                            out = y.clone() if blocks is None else None
                            us, note = device_us(
                                torch, lambda p=prepared, s=stream_ptr: p.launch(s), args.repeats, args.rounds
                            )
                            emit(f"wgmma GEMV {scale_kind}, {stages} stages ({grid[0]} x {grid[1]} blocks)", us, out,
                                 note, routed_bytes)  # fmt: skip

                if args.kernels:
                    from vtnumba.cuda import experts
                    from vtnumba.cuda.kernels import sm90_wgmma_gemm

                    threshold = sm90_wgmma_gemm.GROUPED_64_BELOW
                    # the wgmma tiles in each grouped configuration (the threshold moved to force it),
                    # then as chosen; the other kernels as named
                    for kname, below in (
                        ("wgmma_grouped_gemv", threshold),
                        ("tensorcore_grouped_gemv", threshold),
                        ("wgmma_grouped_gemm", 1 << 30),
                        ("wgmma_grouped_gemm", 0),
                        ("wgmma_grouped_gemm", threshold),
                        ("tensorcore_grouped_gemm", threshold),
                        ("per_expert", threshold),
                    ):
                        label = kname
                        if kname == "wgmma_grouped_gemm":
                            tiles = {1 << 30: "64-row tiles", 0: "128-row tiles"}.get(below, "as chosen")
                            label = f"{kname} ({tiles})"
                        sm90_wgmma_gemm.GROUPED_64_BELOW = below
                        try:

                            def named(kname=kname):
                                return experts.grouped_scaled_mm(a, sa_c, b, sb_c, offsets, _bf16(), None, kernel=kname)

                            out = torch.as_tensor(named().view(cp.uint16), device="cuda").view(torch.bfloat16)
                            # per_expert synchronizes and costs ~100 us of host time an expert: a few calls
                            reps, rounds = (2, 1) if kname == "per_expert" else (args.repeats, args.rounds)
                            us, note = device_us(torch, named, reps, rounds)
                            emit(f"experts kernel={label}", us, out, note, routed_bytes)
                        except Exception as exc:  # noqa: BLE001 - a kernel that refuses the shape is reported
                            print(
                                f"| {rows_label} | experts kernel={label} | - | - | - | - | cannot run: "
                                f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]} |",
                                flush=True,
                            )
                        finally:
                            sm90_wgmma_gemm.GROUPED_64_BELOW = threshold

            w_bf16 = None  # free it before the next shape's
            torch.cuda.empty_cache()


def _bf16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:  # noqa: BLE001 - say where a run on a machine without a GPU or a wheel stops
        traceback.print_exc()
        sys.exit(1)
