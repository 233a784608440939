"""GPU quantization speed against torch.compile, measured in the same run (DEVICE.md's method).

- Device time and host time: ``vtnumba.profile``'s timers (a spin kernel queued before the timed
  calls; a host-clock loop synchronized once at the end).
- Graph replay: N quantize calls captured on a cupy stream, the graph replayed in a loop.

Prints GB/s (bytes read + written) against torch's copy and torch.compile of the same formula, and
the host microseconds of one ``vt.quantize_fp8`` call. Needs cupy, torch and a GPU.

    python3 benchmarks/gpu/bench_gpu_quant.py [--size 8192]
"""

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


import cupy as cp  # noqa: E402
import ml_dtypes  # noqa: E402
import torch  # noqa: E402

import vtnumba as vt  # noqa: E402
import vtnumba.cuda as backend  # noqa: E402
from vtnumba import profile  # noqa: E402
from vtnumba.cuda.kernels import quant  # noqa: E402

# 8192^2 float32 quantizations take ~80 us each: 30 calls behind the spin per measurement
gpu_us = functools.partial(profile.device_us, repeats=30)
host_us = functools.partial(profile.host_us, warmup=50)
FP8 = torch.float8_e4m3fn
FLOOR = 1.0 / (448.0 * 512.0)
ROWS = []


def row(*cells):
    ROWS.append(cells)
    print(" | ".join(str(c) for c in cells), flush=True)


def as_cupy(t):
    """A cupy view of a torch CUDA tensor (bf16 through its int16 bits)."""
    if t.dtype == torch.bfloat16:
        return cp.asarray(t.view(torch.int16)).view(np.dtype(ml_dtypes.bfloat16))
    return cp.asarray(t)


def check(codes, ref, what):
    bad = int((torch.as_tensor(codes, device="cuda") != ref.view(torch.uint8)).sum())
    if bad:
        raise SystemExit(f"{what}: {bad} codes differ from torch's clamp+cast (non-NaN input)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=8192)
    args = parser.parse_args()
    n = args.size
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    print(
        f"# {dev}, numba-cuda quant vs torch {torch.__version__} torch.compile, {n}x{n}, "
        f"encoder {backend.encoder_in_use()}"
    )

    x32 = torch.randn(n, n, device="cuda") * 3
    xb = x32.to(torch.bfloat16)
    cx32, cxb = as_cupy(x32), as_cupy(xb)
    scale = 0.37
    inv_t = torch.tensor(1.0 / np.float32(scale), device="cuda", dtype=torch.float32)
    ub_t = torch.tensor(0.5, device="cuda")

    def t_static(x):
        return (x.float() * inv_t).clamp(-448.0, 448.0).to(FP8)

    def t_per_token(x):  # upstream's per-token formula
        amax = x.abs().amax(dim=-1, keepdim=True).float()
        s = (torch.minimum(amax, ub_t) / 448.0).clamp(min=FLOOR)
        return (x.float() / s).clamp(-448.0, 448.0).to(FP8), s

    def t_dynamic(x):
        s = (x.abs().amax().float() / 448.0).clamp(min=FLOOR)
        return (x.float() / s).clamp(-448.0, 448.0).to(FP8), s

    c_static = torch.compile(t_static)
    c_per_token = torch.compile(t_per_token)
    c_dynamic = torch.compile(t_dynamic)

    # correctness against torch on this data (non-NaN: the policies agree)
    check(vt.quantize_fp8(cx32, scale).data, c_static(x32), "static f32")
    check(vt.quantize_fp8(cxb, scale).data, c_static(xb), "static bf16")

    copy_t = gpu_us(lambda: xb.clone())
    copy_bw = 2 * xb.numel() * 2 / copy_t / 1e3
    row("work", "vtnumba us", "GB/s", "torch.compile us", "GB/s", "ratio (>=1 is faster)")
    row("copy bf16 (torch clone, the ceiling)", "", "", f"{copy_t:.1f}", f"{copy_bw:.0f}", "")

    def bench(label, ours, peer, nbytes):
        try:  # alternate, keep each side's best of 3: clocks and neighbours drift
            t_ours, t_peer = float("inf"), float("inf")
            for _ in range(3):
                t_ours, t_peer = min(t_ours, gpu_us(ours)), min(t_peer, gpu_us(peer))
        except Exception as exc:  # report and go on: one failing row must not hide the others
            row(label, f"failed: {exc.__class__.__name__}: {exc}"[:200], "", "", "", "")
            return
        row(
            label,
            f"{t_ours:.1f}",
            f"{nbytes / t_ours / 1e3:.0f}",
            f"{t_peer:.1f}",
            f"{nbytes / t_peer / 1e3:.0f}",
            f"{t_peer / t_ours:.2f}x",
        )

    elems = xb.numel()
    bench("static bf16 -> e4m3", lambda: vt.quantize_fp8(cxb, scale), lambda: c_static(xb), 3 * elems)
    bench("static f32 -> e4m3", lambda: vt.quantize_fp8(cx32, scale), lambda: c_static(x32), 5 * elems)
    bench(
        "static bf16, portable encoder",
        lambda: backend.quantize_static(cxb, np.float32(scale), encoder="portable"),
        lambda: c_static(xb),
        3 * elems,
    )
    bench("dynamic per-tensor bf16", lambda: vt.quantize_fp8(cxb), lambda: c_dynamic(xb), 3 * elems)
    bench(
        "dynamic per-token bf16 (ub)",
        lambda: vt.quantize_fp8(cxb, per_token=True, scale_ub=0.5),
        lambda: c_per_token(xb),
        3 * elems,
    )

    # host cost per call, decode-sized activation
    small = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)
    cs = as_cupy(small)
    kernel = quant.static_kernel("bfloat16", backend.encoder_in_use(), False)
    out = cp.empty(small.numel(), dtype=cp.uint8)
    from vtnumba.cuda.runtime.launch import Buffer

    xin, o = Buffer(cs.data.ptr, (cs.size,), (2,)), Buffer(out.data.ptr, (out.size,), (1,))
    row()
    row("host cost, 1x4096 bf16", "us per call", "", "", "", "")
    row("vt.quantize_fp8 static", f"{host_us(lambda: vt.quantize_fp8(cs, scale)):.2f}", "", "", "", "")
    row("vt.quantize_fp8 dynamic", f"{host_us(lambda: vt.quantize_fp8(cs)):.2f}", "", "", "", "")
    row("vt.quantize_fp8 per-token", f"{host_us(lambda: vt.quantize_fp8(cs, per_token=True)):.2f}", "", "", "", "")
    row(
        "launch only (Kernel.__call__)",
        f"{host_us(lambda: kernel(1, quant.THREADS, xin, o, np.float32(scale), 256)):.2f}",
        "",
        "",
        "",
        "",
    )
    row(
        "backend only (no ops boundary)",
        f"{host_us(lambda: backend.quantize_static(cs, np.float32(scale))):.2f}",
        "",
        "",
        "",
        "",
    )
    # where the host time goes (for the boundary in vtnumba/ops.py and _arrays.py)
    row("  cupy.empty((1, 4096), uint8)", f"{host_us(lambda: cp.empty((1, 4096), dtype=cp.uint8)):.2f}", "", "", "", "")
    row(
        "  hasattr(x, '__cuda_array_interface__')",
        f"{host_us(lambda: hasattr(cs, '__cuda_array_interface__')):.2f}",
        "",
        "",
        "",
        "",
    )
    row("  np.dtype(x.dtype)", f"{host_us(lambda: np.dtype(cs.dtype)):.2f}", "", "", "", "")
    row("  x.flags.c_contiguous", f"{host_us(lambda: cs.flags.c_contiguous):.2f}", "", "", "", "")
    row(
        "  cupy.cuda.get_current_stream().ptr",
        f"{host_us(lambda: cp.cuda.get_current_stream().ptr):.2f}",
        "",
        "",
        "",
        "",
    )
    row("  cupy elementwise x + x (cupy's own launch)", f"{host_us(lambda: cs + cs):.2f}", "", "", "", "")
    row("torch eager static formula", f"{host_us(lambda: t_static(small)):.2f}", "", "", "", "")
    row("torch.compile static formula", f"{host_us(lambda: c_static(small)):.2f}", "", "", "", "")

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        vt.quantize_fp8(cs, scale)
        stream.synchronize()
        stream.begin_capture()
        kept = [vt.quantize_fp8(cs, scale) for _ in range(20)]
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        t0 = time.perf_counter()
        reps = 500
        for _ in range(reps):
            graph.launch(stream)
        enqueued = time.perf_counter() - t0
        stream.synchronize()
        finished = time.perf_counter() - t0
    del kept
    row("graph replay of 20 quantize calls: host us per kernel", f"{enqueued / reps / 20 * 1e6:.2f}", "", "", "", "")
    row("same, until the GPU finished: us per kernel", f"{finished / reps / 20 * 1e6:.2f}", "", "", "", "")

    print("\n==== GPU quantization table ====")
    for r in ROWS:
        print(" | ".join(str(c) for c in r))


if __name__ == "__main__":
    os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")
    main()
