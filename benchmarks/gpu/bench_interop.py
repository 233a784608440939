"""Host time the interop layer (``vtnumba._interop``) adds per call, paired.

Three tables:

1. **numpy / cupy callers**: each op through its ``@interop`` wrapper against the function it wraps
   (``op.__wrapped__``), on the same numpy (``--device cpu``) or cupy (``--device cuda``) arrays:
   what every existing caller pays for the type checks.
2. **torch callers**: the op on torch tensors (torch CPU, or torch CUDA on torch's current stream)
   against the same op on numpy / cupy views of the same memory: the conversions in and out, the
   checks, and on the GPU entering torch's stream. Targets: at most 2 us added on the
   CPU, 3 us on the GPU.
3. **Fp8Linear**: host time per forward of ``vtnumba.torch.Fp8Linear`` (dynamic and per-token) and
   of the float ``nn.Linear`` it replaces (bfloat16 on the GPU, float32 on the CPU, where torch has
   no fast bf16 GEMM), at M = 1. Target (on the H200): FP8 / bf16 <= 1.2.

Method (as bench_seam_overhead.py): both sides run in alternating rounds of ``--calls`` calls, the
order flipping every round; the table gives each side's best round, the difference of the best rounds
and the median of the per-round paired differences, and judges the larger against the target. On the
GPU the time is host time: calls are issued back to back and the stream is synchronized after each
round, outside the timed region. Before timing, both sides' results are compared byte for byte.

    flock /tmp/vt-bench.lock python3 benchmarks/gpu/bench_interop.py
    flock /tmp/vt-bench.lock python3 benchmarks/gpu/bench_interop.py --device cuda   # on the H200
"""

import numpy as np
import torch
from bench_seam_overhead import parse_arguments, time_pair  # the paired method, shared

import vtnumba as vt
import vtnumba.torch as vtt
from vtnumba import seam
from vtnumba.testing import devices
from vtnumba.timing import paired_host_time


def _host_bytes(a):
    """The bytes of any result (numpy, cupy, torch; QuantizedActivation: codes and scale)."""
    if isinstance(a, vt.QuantizedActivation):
        return _host_bytes(a.data) + _host_bytes(a.scale)
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu()
        return (a.view(torch.int16) if a.dtype == torch.bfloat16 else a).numpy().tobytes()
    return devices.to_host(a).tobytes()


def _row(name, base_fn, test_fn, args, sync, target, ratio_target=None):
    t_base, t_test, added_min, added_paired = time_pair(
        name, base_fn, test_fn, args, sync, lambda a, b: _host_bytes(a) == _host_bytes(b)
    )
    added = max(added_min, added_paired)
    ratio = t_test / t_base
    ok = ratio <= ratio_target if ratio_target is not None else added <= target
    print(
        f"{name:<34}{t_base * 1e6:>10.2f}{t_test * 1e6:>10.2f}{added_min:>12.2f}{added_paired:>15.2f}"
        f"{ratio:>9.3f}  {'ok' if ok else 'MISSED'}"
    )
    return added, ratio, ok


def _header(title, base, test, target):
    print(f"\n{title}")
    print(
        f"{'case':<34}{base + ' us':>10}{test + ' us':>10}{'added(min)':>12}{'added(paired)':>15}"
        f"{'ratio':>9}  target {target}"
    )


def main():
    args = parse_arguments(
        __doc__,
        (
            ("--linear",),
            dict(
                type=int,
                nargs=2,
                default=None,
                metavar=("N", "K"),
                help="Fp8Linear's shape (default 4096 4096 on the GPU, 256 256 on the CPU)",
            ),
        ),
    )

    gpu = args.device == "cuda"
    rng = np.random.default_rng(0)
    if gpu:
        import cupy

        torch_device = torch.device("cuda", torch.cuda.current_device())
        stream = torch.cuda.current_stream()

        def sync():
            stream.synchronize()

        def native(t):  # a cupy view of a torch tensor's memory
            return cupy.from_dlpack(t.detach())

        target, native_name = 3.0, "cupy"
    else:
        import numba

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        torch_device = torch.device("cpu")

        def sync():
            pass

        def native(t):
            return t.numpy()

        target, native_name = 2.0, "numpy"

    def tensor(a):
        return torch.from_numpy(a).to(torch_device)

    x_t = tensor(rng.standard_normal((args.m, args.k)).astype(np.float32))
    w_t = tensor((rng.standard_normal((args.n, args.k)) * 0.05).astype(np.float32))
    bias_t = tensor(rng.standard_normal(args.n).astype(np.float32))
    x, w, bias = native(x_t), native(w_t), native(bias_t)
    wq = vt.quantize_fp8(w)
    wq_t = vt.quantize_fp8(w_t)
    qx = vt.quantize_fp8(x, per_token=True)
    qx_t = vt.quantize_fp8(x_t, per_token=True)
    fw = seam.Fp8Weight.from_float(
        w_t.cpu().numpy(), per_channel=True, activation_scheme="per_token", bias=bias_t.cpu().numpy()
    )
    fw = seam.ResidentFp8(fw, "cuda" if gpu else "cpu")

    print(
        f"interop host overhead, device={args.device}"
        + (f" ({args.threads} Numba thread(s))" if not gpu else "")
        + f", M={args.m} N={args.n} K={args.k}, {args.rounds} alternating rounds x {args.calls} calls per side"
    )

    ops = [
        ("quantize_fp8 static", vt.quantize_fp8, lambda a: ((a["x"], 0.05), {})),
        ("quantize_fp8 dynamic", vt.quantize_fp8, lambda a: ((a["x"],), {})),
        ("quantize_fp8 per_token", vt.quantize_fp8, lambda a: ((a["x"],), {"per_token": True})),
        (
            "scaled_mm",
            vt.scaled_mm,
            lambda a: ((a["qx"].data, a["wq"].data, a["qx"].scale, a["wq"].scale), {"bias": a["bias"]}),
        ),
        ("fp8_linear", vt.fp8_linear, lambda a: ((a["x"], a["wq"].data, a["wq"].scale, None), {"bias": a["bias"]})),
        ("seam.matmul_fp8", seam.matmul_fp8, lambda a: ((a["x"], fw), {})),
        ("seam.matmul_fp8_prequant", seam.matmul_fp8_prequant, lambda a: ((a["qx"], fw), {})),
    ]
    nat = {"x": x, "wq": wq, "qx": qx, "bias": bias}
    tor = {"x": x_t, "wq": wq_t, "qx": qx_t, "bias": bias_t}

    worst = {}
    _header(
        f"1. {native_name} callers: the @interop wrapper against the function it wraps",
        "bare",
        "wrapped",
        f"<= {target:g} us",
    )
    for name, fn, build in ops:
        a, k = build(nat)
        worst.setdefault("wrapper", []).append(
            _row(name, lambda: fn.__wrapped__(*a, **k), lambda: fn(*a, **k), args, sync, target)[0]
        )

    _header(
        f"2. torch callers: the op on torch {args.device} tensors against {native_name} views of them",
        native_name,
        "torch",
        f"<= {target:g} us",
    )
    with torch.inference_mode():
        for name, fn, build in ops:
            a, k = build(nat)
            at, kt = build(tor)
            worst.setdefault("torch", []).append(
                _row(name, lambda: fn(*a, **k), lambda: fn(*at, **kt), args, sync, target)[0]
            )

    n, k_in = args.linear or ((4096, 4096) if gpu else (256, 256))
    float_dtype = torch.bfloat16 if gpu else torch.float32
    linear = torch.nn.Linear(k_in, n, device=torch_device, dtype=float_dtype)
    x1 = torch.randn(1, k_in, device=torch_device, dtype=float_dtype)
    _header(
        f"3. Fp8Linear forward at M=1 (N={n} K={k_in}) against nn.Linear {str(float_dtype)[6:]}",
        "linear",
        "fp8",
        "ratio <= 1.2 (GPU)",
    )
    with torch.inference_mode():
        for scheme in ("dynamic", "per_token"):
            layer = vtt.Fp8Linear.from_linear(linear, scheme)
            layer(x1)
            sync()
            # different arithmetic (float vs FP8): no byte comparison, just time both
            for _ in range(50):
                linear(x1), layer(x1)
            sync()
            t_lin, t_fp8, paired = paired_host_time(
                lambda: linear(x1), lambda: layer(x1), args.calls, args.rounds, sync
            )
            ratio = t_fp8 / t_lin
            verdict = ("ok" if ratio <= 1.2 else "MISSED") if gpu else "(GPU target)"
            print(
                f"{'Fp8Linear ' + scheme:<34}{t_lin * 1e6:>10.2f}{t_fp8 * 1e6:>10.2f}{(t_fp8 - t_lin) * 1e6:>12.2f}"
                f"{paired * 1e6:>15.2f}{ratio:>9.3f}  {verdict}"
            )
    print(
        f"\nworst added host time: wrapper {max(worst['wrapper']):.2f} us, torch {max(worst['torch']):.2f} us "
        f"per call (target <= {target:g} us: "
        f"{'met' if max(max(v) for v in worst.values()) <= target else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
