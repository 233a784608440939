"""``python -m vtnumba --model qwen3-moe``: one FP8 mixture-of-experts layer of Qwen3-30B-A3B
(128 experts, hidden 2048, moe_intermediate 768, top-8), at decode and prefill token counts.

For each scheme (``--scheme``, per_token by default, or ``--all-schemes``: every one of
``MOE_SCHEMES``) and token count: ``seam.moe_fp8`` against the float path a user would run instead,
timed in the same run, interleaved, the fastest trial of each side kept -- on the CPU a numpy float32 loop over
the routed experts (``x @ w.T`` per expert, SiLU-and-multiply, ``@ w_down.T``, the weighted sum), on
the GPU the same loop in cupy float16 (cuBLAS on tensor cores). Two checks: the layer equals the
composite of the seam's dense ops (per routed pair ``matmul_fp8``, SiLU-and-multiply,
``matmul_fp8``, the weighted float32 sum; on the CPU to the float32 sums' order), and its error against the float64
product of the unquantized weights stays at FP8's (under 10 %).

A row is noisy (!) by the Llama job's rules that need no ceilings: a side's trials spread wide
(p90 / median over ``NOISY_SPREAD``) or, on the CPU, a side's fastest trial waited for a CPU
(``__main__.waited_for_cpu``). The footer is computed from the rows: per scheme and regime
(decode: up to 16 tokens; prefill above), the range and median of the clean rows' speedups and
whether FP8 wins, ties or trails there.
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


def _timed_rows(device, repeats, fp8_call, base_call):
    """(fp8 seconds, baseline seconds, fp8 waits, baseline waits) per trial, the two sides in turn."""
    from vtnumba import timing

    if device == "cpu":
        waits = []
        fp8_s, base_s = timing.interleaved_cpu_samples([fp8_call, base_call], repeats, waits=waits)
        return fp8_s, base_s, waits[0], waits[1]
    fp8_s, base_s = [], []
    for _ in range(3):  # interleaved rounds of ``repeats`` calls each, the fastest call of each kept
        fp8_s.append(timing.best_device_us(fp8_call, repeats, 1) * 1e-6)
        base_s.append(timing.best_device_us(base_call, repeats, 1) * 1e-6)
    return fp8_s, base_s, [None] * 3, [None] * 3


def _schemes(args):
    if getattr(args, "all_schemes", False):
        return list(MOE_SCHEMES)
    scheme = args.scheme or "per_token"
    if scheme not in MOE_SCHEMES:
        raise ValueError(f"--scheme must be one of {', '.join(MOE_SCHEMES)} with --model qwen3-moe, got {scheme!r}")
    return [scheme]


def run(args, out, device, tokens, repeats, reduce, judge=None):
    """The MoE job's report (a dict), printed as a table unless ``args.json``. ``judge(fp8 times,
    fp8 waits, baseline times, baseline waits)`` -> (fp8 spread, baseline spread, the sides that
    waited): the main job's noise rules (``__main__.judge_times``)."""
    from vtnumba import seam
    from vtnumba.seam import experts as seam_experts
    from vtnumba.timing import NOISY_SPREAD

    cfg = QWEN3_30B_A3B
    e, h, inter, k = cfg["experts"], cfg["hidden"] // reduce, cfg["intermediate"] // reduce, cfg["top_k"]
    schemes = _schemes(args)
    rng = np.random.default_rng(30)
    w_gu = rng.standard_normal((e, 2 * inter, h), dtype=np.float32) / np.float32(np.sqrt(h))
    w_dn = rng.standard_normal((e, h, inter), dtype=np.float32) / np.float32(np.sqrt(inter))
    if device == "cpu":
        xp, dtype = np, np.float32
        base_w = (w_gu, w_dn)
    else:
        import cupy as xp

        dtype = np.float16
        base_w = (xp.asarray(w_gu.astype(np.float16)), xp.asarray(w_dn.astype(np.float16)))
    # the routings and inputs, drawn once: every scheme runs the same ones
    cases = []
    for t in tokens:
        ids, weights = _route(rng, t, e, k)
        x = rng.standard_normal((t, h), dtype=np.float32).astype(dtype)
        exact = float_loop(
            np,
            x.astype(np.float64),
            w_gu.astype(np.float64),
            w_dn.astype(np.float64),
            route_plan(np, ids, weights, np.float64),
        )
        cases.append((t, ids, weights, x, exact))
    rows = []
    for scheme in schemes:
        gu, dn = _experts(scheme, w_gu), _experts(scheme, w_dn)
        if device == "cpu":
            gu_d, dn_d = gu, dn
        else:
            gu_d, dn_d = seam.ResidentFp8(gu, "cuda").weight, seam.ResidentFp8(dn, "cuda").weight
        for t, ids, weights, x, exact in cases:
            xd, idsd, wd = (x, ids, weights) if xp is np else (xp.asarray(x), xp.asarray(ids), xp.asarray(weights))
            y = seam.moe_fp8(xd, gu_d, dn_d, idsd, wd)
            y = y if xp is np else y.get()
            ref = composite(x.astype(np.float32) if dtype == np.float16 else x, gu, dn, ids, weights)
            diff = float(np.max(np.abs(y.astype(np.float64) - ref.astype(np.float64))))
            scale = float(np.max(np.abs(ref))) or 1.0
            plan = route_plan(xp, ids, weights, dtype)
            rel = float(np.linalg.norm(y.astype(np.float64) - exact) / np.linalg.norm(exact))
            fp8_s, base_s, fp8_w, base_w_ = _timed_rows(
                device,
                repeats,
                lambda xd=xd, idsd=idsd, wd=wd, gu_d=gu_d, dn_d=dn_d: seam.moe_fp8(xd, gu_d, dn_d, idsd, wd),
                lambda xd=xd, plan=plan: float_loop(xp, xd, base_w[0], base_w[1], plan),
            )
            if judge is not None:
                spread, base_spread, waited = judge(fp8_s, fp8_w, base_s, base_w_)
            else:
                spread = base_spread = 1.0
                waited = []
            routed = len(np.unique(ids))
            # which steps ran: the GPU's routed decode (two launches) or the aligned steps
            steps = [name for name, _ in seam_experts.MoeCall(xd, gu_d, dn_d, idsd, wd).steps]
            # The composite multiplies one pair at a time (the M = 1 kernels), the grouped GEMM an
            # expert's rows together: the same float32 products summed in another order, so equal to a
            # few ulps on the CPU. The GPU's expf can differ from numpy's by an ulp, moving an
            # intermediate value across an e4m3 rounding boundary now and then: one code step of one
            # term, far under 1 %.
            ok = diff <= (1e-5 if device == "cpu" else 1e-2) * scale and rel < 0.1
            fp8_us, base_us = min(fp8_s) * 1e6, min(base_s) * 1e6
            rows.append(
                dict(
                    scheme=scheme,
                    tokens=t,
                    routed_experts=routed,
                    steps=steps,
                    path="routed" if steps[0].startswith("routed") else "aligned",
                    fp8_us=fp8_us,
                    baseline_us=base_us,
                    speedup=base_us / fp8_us,
                    spread=spread,
                    baseline_spread=base_spread,
                    waited=waited,
                    noisy=bool(spread > NOISY_SPREAD or base_spread > NOISY_SPREAD or waited),
                    composite_max_diff=diff,
                    composite_scale=scale,
                    fp8_rel_error=rel,
                    weight_mb=routed * (2 * inter * h + h * inter) / 1e6,
                    ok=bool(ok),
                )
            )
        gu = dn = gu_d = dn_d = None  # this scheme's experts go before the next scheme's are made
    baseline = (
        "numpy float32 loop over the routed experts"
        if device == "cpu"
        else "cupy float16 loop over the routed experts (cuBLAS)"
    )
    report = dict(
        model="qwen3-moe",
        device=device,
        scheme=", ".join(schemes),
        schemes=schemes,
        experts=e,
        hidden=h,
        intermediate=inter,
        top_k=k,
        reduce=reduce,
        baseline=baseline,
        layers=rows,
        regimes=regime_summary(rows, device),
        ok=all(r["ok"] for r in rows),
    )
    if not args.json:
        _print(report, out)
    return report


# decode: a few tokens per expert, the weight bytes are the traffic (the Llama job's DECODE_MAX_M)
DECODE_MAX_TOKENS = 16
_WHY = {
    ("cpu", "decode", True): "at a few tokens each hit expert's weight is the traffic, and FP8 reads a quarter "
    "of float32's bytes",
    ("cpu", "decode", False): "the bytes FP8 saves did not pay for its decode here: float32 weights small "
    "enough for the cache (a large --reduce), or a loaded machine",
    ("cpu", "prefill", True): "the grouped GEMM decodes each expert's weight once for all its rows",
    ("cpu", "prefill", False): "at many tokens per expert the work is flops, and a CPU has no FP8 arithmetic: "
    "the codes are decoded to float32 for the FMAs sgemm runs on float32 weights",
    ("cuda", "decode", True): "at a few tokens each hit expert's weight is the traffic, and FP8 reads half of "
    "float16's bytes",
    ("cuda", "decode", False): "at a few tokens the launches and the quantization cost more than the bytes "
    "FP8 saves at this size",
    ("cuda", "prefill", True): "at many tokens the work is flops, and FP8 tensor cores run at twice float16's rate",
    ("cuda", "prefill", False): "the grouped FP8 GEMM did not reach float16 cuBLAS's rate at this size",
}


def regime_summary(rows, device):
    """Per scheme and regime (decode: up to DECODE_MAX_TOKENS tokens; prefill above), from the rows
    themselves: their token counts, the range and median of the clean (not noisy) rows' speedups,
    whether FP8 wins (median over 1.05x), ties or trails (under 0.95x) there, and why."""
    out = []
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        for regime, pick in (
            ("decode", lambda r: r["tokens"] <= DECODE_MAX_TOKENS),
            ("prefill", lambda r: r["tokens"] > DECODE_MAX_TOKENS),
        ):
            picked = [r for r in rows if r["scheme"] == scheme and pick(r)]
            if not picked:
                continue
            clean = sorted(r["speedup"] for r in picked if not r["noisy"])
            median = float(np.median(clean)) if clean else None
            verdict = None if median is None else "wins" if median > 1.05 else "trails" if median < 0.95 else "ties"
            out.append(
                dict(
                    scheme=scheme,
                    regime=regime,
                    tokens=[r["tokens"] for r in picked],
                    rows=len(picked),
                    noisy_rows=len(picked) - len(clean),
                    speedup_min=clean[0] if clean else None,
                    speedup_max=clean[-1] if clean else None,
                    speedup_median=median,
                    fp8=verdict,
                    reason=None if verdict is None else _WHY[(device, regime, verdict == "wins")],
                )
            )
    return out


def regime_lines(regimes):
    """The footer: one line per scheme and regime, from ``regime_summary``."""
    lines = []
    for g in regimes:
        head = f"{g['scheme']} {g['regime']} (tokens {', '.join(map(str, g['tokens']))}): "
        if g["fp8"] is None:
            lines.append(head + f"no speedup to quote, all {g['rows']} rows noisy: rerun on a quiet machine")
            continue
        lines.append(head + verdict_text(g))
    return lines


def verdict_text(g):
    """A footer group's verdict in words (the Llama job's footer says it the same way): FP8 wins,
    ties or trails, the speedups' span and median over its clean rows, the noisy rows left out, and
    the reason ``regime_summary`` gave."""
    span = (
        f"{g['speedup_min']:.2f}x"
        if g["speedup_min"] == g["speedup_max"]
        else f"{g['speedup_min']:.2f}-{g['speedup_max']:.2f}x, median {g['speedup_median']:.2f}x"
    )
    left = f" ({g['noisy_rows']} noisy rows left out)" if g["noisy_rows"] else ""
    word = {"wins": "FP8 wins", "ties": "FP8 ties", "trails": "FP8 trails"}[g["fp8"]]
    return f"{word}, {span}{left}: {g['reason']}"


def _print(report, out):
    from vtnumba.timing import NOISY_SPREAD

    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(
        f"FP8 mixture-of-experts layer on {report['device']}: Qwen3-30B-A3B shapes ({report['experts']} experts, "
        f"hidden {report['hidden']}, moe_intermediate {report['intermediate']}, top-{report['top_k']}), scheme "
        f"{report['scheme']}, seam.moe_fp8 against {report['baseline']}"
    )
    head = (
        "scheme",
        "tokens",
        "path",
        "experts hit",
        "FP8 weights MB",
        "FP8 us",
        "float us",
        "p90/median",
        "speedup",
        "vs composite",
        "fp8 err",
    )
    p(" ".join(f"{c:>14s}" for c in head))
    for r in report["layers"]:
        spread = max(r["spread"], r["baseline_spread"])
        cells = (
            r["scheme"],
            str(r["tokens"]),
            r["path"],
            str(r["routed_experts"]),
            f"{r['weight_mb']:.1f}",
            f"{r['fp8_us']:.0f}",
            f"{r['baseline_us']:.0f}",
            f"{spread:.1f}x" + ("!" if spread > NOISY_SPREAD else ""),
            f"{r['speedup']:.2f}x" + ("!" if r["noisy"] else ""),
            "bitwise" if r["composite_max_diff"] == 0 else f"{r['composite_max_diff'] / r['composite_scale']:.1e}",
            f"{r['fp8_rel_error']:.4f}",
        )
        p(" ".join(f"{c:>14s}" for c in cells))
    p(
        "path: the aligned steps (align, quantize, gate_up, act_quantize, down, combine) or the GPU's "
        "routed decode (routed_gate_up, routed_down: each pair its own group, two launches); "
        "speedup = the float loop's time / moe_fp8's, the fastest trial of each, taken in turn; p90/median: "
        "the wider spread of the two sides' trials; vs composite: moe_fp8 against the seam's dense ops pair "
        "by pair (max |diff| / max |y| where not bitwise); fp8 err: against the float64 layer on the "
        "unquantized weights"
    )
    noisy = [
        f"{r['scheme']} tokens={r['tokens']}"
        + (f" ({', '.join(s + ' waited' for s in r['waited'])})" if r["waited"] else "")
        for r in report["layers"]
        if r["noisy"]
    ]
    if noisy:
        p(
            f"WARNING: noisy figures (p90 > {NOISY_SPREAD:.0f}x the median for the layer or its baseline, or its "
            f"fastest trial's threads waiting for a CPU; marked !): {', '.join(noisy)}. Another process was "
            f"using the machine: rerun on a quiet one before quoting them."
        )
    lines = regime_lines(report["regimes"])
    if lines:
        p("where FP8 wins, from the rows above:")
        for line in lines:
            p("  " + line)
    p("all checks passed" if report["ok"] else "CHECK FAILED: see the table")
