"""``python -m vtnumba --model qwen3-moe``: one FP8 mixture-of-experts layer of Qwen3-30B-A3B
(128 experts, hidden 2048, moe_intermediate 768, top-8), at decode and prefill token counts.

For each token count: ``seam.moe_fp8`` against the float path a user would run instead, timed in
the same run, interleaved, the minimum of several rounds kept -- on the CPU a numpy float32 loop over
the routed experts (``x @ w.T`` per expert, SiLU-and-multiply, ``@ w_down.T``, the weighted sum), on
the GPU the same loop in cupy float16 (cuBLAS on tensor cores). Two checks: the layer equals the
composite of the seam's dense ops (per routed pair ``matmul_fp8``, SiLU-and-multiply,
``matmul_fp8``, the weighted float32 sum; on the CPU to the float32 sums' order), and its error against the float64
product of the unquantized weights stays at FP8's (under 10 %).
"""

import numpy as np

QWEN3_30B_A3B = dict(experts=128, hidden=2048, intermediate=768, top_k=8)
MOE_SCHEMES = ("per_token", "dynamic", "block", "mxfp8")


def _experts(scheme, w):
    from vtnumba import seam

    if scheme == "per_token":
        return seam.Fp8Experts.from_float(w, per_channel=True, activation_scheme="per_token")
    if scheme == "dynamic":
        return seam.Fp8Experts.from_float(w)
    if scheme == "block":
        return seam.Fp8Experts.from_float(w, block_size=(128, 128))
    return seam.Fp8Experts.from_float(w, block_size=(1, 32), scale_format="e8m0")


def _route(rng, t, e, k):
    """Each token's k distinct experts and softmax-like weights, as a router gives them."""
    ids = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(np.int32)
    w = rng.random((t, k)).astype(np.float32)
    return ids, w / w.sum(axis=1, keepdims=True)


def route_plan(xp, ids, weights, dtype):
    """For each routed expert: (e, its tokens, their routing weights [rows, 1]) as ``xp`` arrays, from
    the host ids -- the loop's bookkeeping, done once, so timing the loop times its arithmetic (on
    the GPU a per-call look at the ids would synchronize with the host)."""
    flat = np.asarray(ids).reshape(-1)
    k = ids.shape[1]
    w = np.asarray(weights).reshape(-1)
    plan = []
    for e in np.unique(flat):
        pairs = np.flatnonzero(flat == e)
        plan.append((int(e), xp.asarray(pairs // k), xp.asarray(w[pairs][:, None].astype(dtype))))
    return plan


def float_loop(xp, x, w_gate_up, w_down, plan):
    """The float layer a user writes: for each routed expert, its rows through gate_up, SiLU-and-
    multiply, down, weighted and summed per token (``plan``: ``route_plan``'s)."""
    half = w_gate_up.shape[1] // 2
    out = xp.zeros((x.shape[0], w_down.shape[1]), dtype=x.dtype)
    for e, rows, w in plan:
        h = x[rows] @ w_gate_up[e].T
        g, u = h[:, :half], h[:, half:]
        y = (g / (1 + xp.exp(-g)) * u) @ w_down[e].T
        out[rows] += w * y  # a token meets an expert once (distinct top-k), so no two rows collide
    return out


def composite(x, gu, dn, ids, weights):
    """``moe_fp8`` from the seam's dense ops, pair by pair (CPU, numpy): the contract in DESIGN.md."""
    import vtnumba as vt
    from vtnumba import seam
    from vtnumba.ops import ActivationScheme

    t, k = ids.shape
    out = np.zeros((t, x.shape[1]), dtype=np.float32)
    q_all = vt.quantize_fp8(x) if gu.activation_scheme == "dynamic" else None
    hidden = {}
    for tok in range(t):
        for j in range(k):
            e = int(ids[tok, j])
            if q_all is not None:
                q = vt.QuantizedActivation(q_all.data[tok : tok + 1], q_all.scale, scheme=ActivationScheme.DYNAMIC)
                hidden[tok, j] = seam.matmul_fp8_prequant(q, gu.expert(e), out_dtype=np.float32)
            else:
                hidden[tok, j] = seam.matmul_fp8(x[tok : tok + 1], gu.expert(e), out_dtype=np.float32)
    half = gu.shape[1] // 2
    acts = {key: h[:, :half] / (np.float32(1.0) + np.exp(-h[:, :half])) * h[:, half:] for key, h in hidden.items()}
    if dn.activation_scheme == "dynamic":
        stacked = np.concatenate(list(acts.values()))
        scale = vt.quantize_fp8(stacked).scale
        for tok in range(t):
            for j in range(k):
                q = vt.quantize_fp8(acts[tok, j], scale)
                q = vt.QuantizedActivation(q.data, scale, scheme=ActivationScheme.DYNAMIC)
                out[tok] += (
                    weights[tok, j] * seam.matmul_fp8_prequant(q, dn.expert(int(ids[tok, j])), out_dtype=np.float32)[0]
                )
    else:
        for tok in range(t):
            for j in range(k):
                out[tok] += (
                    weights[tok, j]
                    * seam.matmul_fp8(acts[tok, j], dn.expert(int(ids[tok, j])), out_dtype=np.float32)[0]
                )
    return out.astype(x.dtype)


def run(args, out, device, tokens, repeats, reduce):
    """The MoE job's report (a dict), printed as a table unless ``args.json``."""
    from vtnumba import seam
    from vtnumba.timing import best_device_us, cpu_time

    cfg = QWEN3_30B_A3B
    e, h, inter, k = cfg["experts"], cfg["hidden"] // reduce, cfg["intermediate"] // reduce, cfg["top_k"]
    scheme = args.scheme or "per_token"
    if scheme not in MOE_SCHEMES:
        raise ValueError(f"--scheme must be one of {', '.join(MOE_SCHEMES)} with --model qwen3-moe, got {scheme!r}")
    rng = np.random.default_rng(30)
    w_gu = rng.standard_normal((e, 2 * inter, h), dtype=np.float32) / np.float32(np.sqrt(h))
    w_dn = rng.standard_normal((e, h, inter), dtype=np.float32) / np.float32(np.sqrt(inter))
    gu, dn = _experts(scheme, w_gu), _experts(scheme, w_dn)
    if device == "cpu":
        xp, dtype, timer = np, np.float32, (lambda fn: cpu_time(fn, repeats=repeats)[1] * 1e6)
        base_w = (w_gu, w_dn)
        gu_d, dn_d = gu, dn
    else:
        import cupy as xp

        dtype = np.float16
        timer = lambda fn: best_device_us(fn, repeats, 1)  # noqa: E731
        base_w = (xp.asarray(w_gu.astype(np.float16)), xp.asarray(w_dn.astype(np.float16)))
        gu_d, dn_d = seam.ResidentFp8(gu, "cuda").weight, seam.ResidentFp8(dn, "cuda").weight
    rows = []
    for t in tokens:
        ids, weights = _route(rng, t, e, k)
        x = rng.standard_normal((t, h), dtype=np.float32).astype(dtype)
        xd, idsd, wd = (x, ids, weights) if xp is np else (xp.asarray(x), xp.asarray(ids), xp.asarray(weights))
        y = seam.moe_fp8(xd, gu_d, dn_d, idsd, wd)
        y = y if xp is np else y.get()
        ref = composite(x.astype(np.float32) if dtype == np.float16 else x, gu, dn, ids, weights)
        diff = float(np.max(np.abs(y.astype(np.float64) - ref.astype(np.float64))))
        scale = float(np.max(np.abs(ref))) or 1.0
        exact = float_loop(
            np,
            x.astype(np.float64),
            w_gu.astype(np.float64),
            w_dn.astype(np.float64),
            route_plan(np, ids, weights, np.float64),
        )
        plan = route_plan(xp, ids, weights, dtype)
        rel = float(np.linalg.norm(y.astype(np.float64) - exact) / np.linalg.norm(exact))
        fp8_us, base_us = [], []
        for _ in range(3):  # interleaved rounds, the fastest of each side kept
            fp8_us.append(timer(lambda xd=xd, idsd=idsd, wd=wd: seam.moe_fp8(xd, gu_d, dn_d, idsd, wd)))
            base_us.append(timer(lambda xd=xd, plan=plan: float_loop(xp, xd, base_w[0], base_w[1], plan)))
        routed = len(np.unique(ids))
        bytes_fp8 = routed * (2 * inter * h + h * inter)
        # The composite multiplies one pair at a time (the M = 1 kernels), the grouped GEMM an expert's
        # rows together: the same float32 products summed in another order, so equal to a few ulps on
        # the CPU. The GPU's expf can differ from numpy's by an ulp, moving an intermediate value
        # across an e4m3 rounding boundary now and then: one code step of one term, far under 1 %.
        ok = diff <= (1e-5 if device == "cpu" else 1e-2) * scale and rel < 0.1
        rows.append(
            dict(
                tokens=t,
                routed_experts=routed,
                fp8_us=min(fp8_us),
                baseline_us=min(base_us),
                speedup=min(base_us) / min(fp8_us),
                composite_max_diff=diff,
                composite_scale=scale,
                fp8_rel_error=rel,
                weight_mb=bytes_fp8 / 1e6,
                ok=bool(ok),
            )
        )
    baseline = (
        "numpy float32 loop over the routed experts"
        if device == "cpu"
        else "cupy float16 loop over the routed experts (cuBLAS)"
    )
    report = dict(
        model="qwen3-moe",
        device=device,
        scheme=scheme,
        experts=e,
        hidden=h,
        intermediate=inter,
        top_k=k,
        reduce=reduce,
        baseline=baseline,
        layers=rows,
        ok=all(r["ok"] for r in rows),
    )
    if not args.json:
        _print(report, out)
    return report


def _print(report, out):
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(
        f"FP8 mixture-of-experts layer on {report['device']}: Qwen3-30B-A3B shapes ({report['experts']} experts, "
        f"hidden {report['hidden']}, moe_intermediate {report['intermediate']}, top-{report['top_k']}), scheme "
        f"{report['scheme']}, seam.moe_fp8 against {report['baseline']}"
    )
    head = ("tokens", "experts hit", "FP8 weights MB", "FP8 us", "float us", "speedup", "vs composite", "fp8 err")
    p(" ".join(f"{c:>14s}" for c in head))
    for r in report["layers"]:
        cells = (
            str(r["tokens"]),
            str(r["routed_experts"]),
            f"{r['weight_mb']:.1f}",
            f"{r['fp8_us']:.0f}",
            f"{r['baseline_us']:.0f}",
            f"{r['speedup']:.2f}x",
            "bitwise" if r["composite_max_diff"] == 0 else f"{r['composite_max_diff'] / r['composite_scale']:.1e}",
            f"{r['fp8_rel_error']:.4f}",
        )
        p(" ".join(f"{c:>14s}" for c in cells))
    p(
        "speedup = the float loop's time / moe_fp8's, the fastest of 3 interleaved rounds each; vs composite: "
        "moe_fp8 against the seam's dense ops pair by pair (max |diff| / max |y| where not bitwise); fp8 err: "
        "against the float64 layer on the unquantized weights"
    )
    p(
        "FP8 wins where a step reads more weight bytes than it computes: decode reads each hit expert once, at a "
        "quarter of float32's bytes"
    )
    p("all checks passed" if report["ok"] else "CHECK FAILED: see the table")
