"""What one bound decode call does on the host, counted without a GPU (issue 39, item 4).

``vtnumba.testing.recording.RecordingRuntime`` stands in for cupy, the driver's launch, module
loading and nvmath's cuBLASLt; the kernels still compile to PTX with Numba and the launcher still
packs their parameters. Each case calls a layer twice (the first call runs the full path and binds,
the second is bound), then records the third call -- on another activation of the same signature --
and its counts must be exactly those of ``EXPECTED``: the kernels launched, in order, cuBLASLt
matmuls, cuBLASLt attribute sets, device allocations, and at most so many Python function calls.
A change that adds a launch or an allocation to a bound call fails here, on the CPU machine.

The recording runs in a process of its own (this file, run as a script): vtnumba binds cupy and
cuBLASLt into module globals at first use, so the stand-ins must never meet another test's imports.
The torch modules cannot run here (a torch CUDA tensor needs a GPU); the ``enqueue`` cases count
what their bound call runs per call -- ``BoundLinear.enqueue`` / ``BoundMoe.enqueue``, which
``vtnumba.torch.custom_ops`` calls after its two ``torch.empty`` (y and the scratch block, from
torch's allocator: not counted here).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Row(NamedTuple):
    kernels: tuple  # the kernels launched, in order (their number is the launch count)
    matmuls: int  # cublasLtMatmul calls
    attribute_sets: int  # cublasLtMatmulDescSetAttribute calls
    allocations: int  # device allocations (cupy pool mallocs)
    max_python_calls: int  # a ceiling on Python function calls (sys.setprofile 'call' events)


def MOE(*routed, silu=("silu",)):
    """An aligned MoE decode call's kernels: the routing (align, the active-experts map), ``routed``
    (the activation's quantization and gathers, in the scheme's order), gate_up, the SiLU-and-quantize
    launches ``silu`` (dynamic: its amax pass, then the quantization), down, the combine. On the
    recorder's sm_90 the grouped GEMMs are the swapped wgmma pass's grouped GEMV (kernels/tc_gemv.py)."""
    grouped = "grouped_gemv_wgmma"
    return ("_align", "_active_experts", *routed, grouped, *silu, grouped, "combine")


# A routed MoE decode call (vtnumba.cuda.experts.routed_*): gate_up with x's quantization and SiLU
# fused in, down with act's and the combine (docs/DESIGN.md, "MoE decode: two launches").
# On sm_90 (the recorder's stand-in GPU) their pass is the swapped wgmma one (kernels/sm90_wgmma_gemv.py),
# named apart; under the lever VT_DENSE_CUBLASLT_FP8=0 the tensor-core GEMV's (strict G3).
ROUTED = ("routed_gate_up_wgmma", "routed_down_wgmma")
ROUTED_STRICT = ("routed_gate_up", "routed_down")


SILU2 = ("silu", "silu")

# TODAY's counts for one bound decode call (M = 1, N = K = 256, bfloat16 x; MoE: one token, 8 experts,
# H = I = 256, top-2). Every number here is a pinned fact of the host path: a change to this table needs
# its reason in the commit message (what was added or removed, and why it pays).
EXPECTED = {
    # case                  kernels launched, in order                                    mm attr alloc py<=
    # at decode an eager call is the one fused launch: the tensor-core GEMV ("gemv") quantizes x as
    # it reads it; y is the one allocation (docs/DESIGN.md, "Decode: one launch in eager"). On the
    # recorder's sm_90 the one-row per-tensor and per-token layers take the dense wgmma launch, in a
    # capture too (docs/DESIGN.md, "The dense decode layer on wgmma"); 1 x 128 groups keep the GEMV
    "matmul_fp8 static":    Row(("dense_gemv_wgmma",),                                     0, 0, 1, 14),
    "matmul_fp8 dynamic":   Row(("dense_gemv_wgmma",),                                     0, 0, 1, 14),
    "matmul_fp8 per_token": Row(("dense_gemv_wgmma",),                                     0, 0, 1, 14),
    "matmul_fp8 per_group": Row(("gemv",),                                                 0, 0, 1, 14),
    # MoE: dynamic per-tensor takes the aligned steps (the hidden rows' one scale spans every pair)
    "moe_fp8 dynamic":      Row(MOE("quantize_dynamic_small", "gather", silu=SILU2),      0, 0, 2, 33),
    "moe_fp8 static":       Row(ROUTED,                                                    0, 0, 2, 19),
    "moe_fp8 per_token":    Row(ROUTED,                                                    0, 0, 2, 19),
    "moe_fp8 per_group":    Row(ROUTED,                                                    0, 0, 2, 19),
    "moe_fp8 per_token strict": Row(ROUTED_STRICT,                                         0, 0, 2, 19),
    # the torch modules' per-call part, on y (and scratch) pointers they allocated (one torch.empty
    # at decode, two on the split path, not counted here: they come on top)
    "enqueue dense dynamic":   Row(("dense_gemv_wgmma",),                                  0, 0, 0, 5),
    "enqueue dense per_token": Row(("dense_gemv_wgmma",),                                  0, 0, 0, 5),
    "enqueue moe per_token":   Row(ROUTED,                                                 0, 0, 0, 7),
    # what a CUDA graph capture of the same decode call records: the split path, device time alone
    # counting there (quantize + cuBLASLt; per-token scales through the f32-staged epilogue)
    "captured dense dynamic":   Row(("dense_gemv_wgmma",),                                 0, 0, 0, 15),
    "captured dense per_token": Row(("dense_gemv_wgmma",),                                 0, 0, 0, 17),
}  # fmt: skip


def _counted(counts):
    """The pinned fields of one recorded call, from the worker's JSON."""
    return Row(tuple(counts["kernels"]), counts["matmuls"], counts["attribute_sets"], counts["allocations"], 0)


def _mismatches(row, counts):
    """What differs between a pinned row and a recorded call (empty: they agree)."""
    got = _counted(counts)
    fields = zip(Row._fields[:4], row[:4], got[:4])
    wrong = [f"{name}: pinned {want!r}, counted {have!r}" for name, want, have in fields if want != have]
    if counts["python_calls"] > row.max_python_calls:
        wrong.append(f"python calls: at most {row.max_python_calls} pinned, counted {counts['python_calls']}")
    return wrong


# -- the pytest side: one worker process for every case --------------------------------------------


@pytest.fixture(scope="module")
def recorded():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VT_", "VTNUMBA_", "NUMBA_ENABLE_CUDASIM"))}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    )
    proc = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_bound_decode_call_does_exactly_the_pinned_host_work(recorded, case):
    counts = recorded["cases"][case]
    assert not _mismatches(EXPECTED[case], counts), (case, _mismatches(EXPECTED[case], counts), counts["functions"])
    assert len(counts["kernels"]) + counts["matmuls"] > 0  # it recorded work, not an empty call


@pytest.mark.parametrize("scheme", ["static", "dynamic", "per_token", "per_group"])
def test_explain_says_what_each_regime_of_a_decode_signature_runs(recorded, scheme):
    """One binding per signature, two calls at decode: ``seam.explain`` names the fused launch for eager
    code and the split path (quantize, then the GEMM) a CUDA graph capture records; on the recorder's
    sm_90 a one-row per-tensor or per-token layer names the one dense wgmma launch for both."""
    text = recorded["explain"][f"matmul_fp8 {scheme}"]
    if scheme == "per_group":
        assert text.startswith("x (1, 256) bfloat16: eager: fused_tensorcore_gemv; graph capture: quantize_"), text
    else:
        assert text == "x (1, 256) bfloat16: eager: dense_gemv_wgmma", text
    assert "not the fused launch" not in text, text
    moe = recorded["explain"]["moe_fp8 per_token"]
    assert "2 launches" in moe and "graph capture" not in moe, moe  # one MoE call serves both regimes


def test_every_recorded_case_is_pinned(recorded):
    assert sorted(recorded["cases"]) == sorted(EXPECTED)


@pytest.mark.parametrize("case", sorted(c for c in EXPECTED if not c.startswith(("enqueue", "captured"))))
def test_the_recorded_launches_carry_this_calls_pointers(recorded, case):
    """The recorder sees the launcher's real parameters: the recorded call's own x (an activation the
    binding never saw) is in the parameters of a launch (the quantization's, or MoE's gather), and its
    result y is what its last step wrote (the last launch's parameters, or the last matmul's D)."""
    counts = recorded["cases"][case]
    assert any(counts["x_ptr"] in params for params in counts["all_params"])
    assert counts["y_ptr"] in counts["last_params"] or counts["y_ptr"] == counts["last_matmul_d"]
    assert counts["x_ptr"] != counts["bind_x_ptr"]


def test_an_added_launch_or_allocation_fails_the_pins(recorded):
    """The pins can fail: with ``BoundLinear.__call__`` given one more allocation, and with its
    enqueue run twice (one more of each launch and matmul), the recorded counts break the table."""
    case = "matmul_fp8 dynamic"
    extra_alloc, extra_launch = recorded["mutants"]["allocation"], recorded["mutants"]["launch"]
    assert _mismatches(EXPECTED[case], recorded["cases"][case]) == []
    assert any(w.startswith("allocations") for w in _mismatches(EXPECTED[case], extra_alloc))
    assert any(w.startswith("kernels") for w in _mismatches(EXPECTED[case], extra_launch))
    assert extra_alloc["allocations"] == EXPECTED[case].allocations + 1
    assert len(extra_launch["kernels"]) == 2 * len(EXPECTED[case].kernels)


def test_the_routed_decode_takes_up_to_the_measured_pairs_on_each_pass(recorded):
    """How many routed pairs (T k) a call takes the routed decode for, on the recorder's sm_90: 64 (T = 8
    at top-8) on the swapped wgmma pass, where the H200's sweep found it ahead of the aligned steps at
    every T up to 8; on the GEMV's pass (the wgmma one disabled) 16 per-token and static, 32 for
    blocks (benchmarks/RESULTS.md, 2026-12-03 13:49 and 2026-12-02 12:57)."""
    assert recorded["routed_max_pairs"] == {
        "wgmma": {"static": 64, "per_token": 64, "per_group": 64},
        "mma.sync": {"static": 16, "per_token": 16, "per_group": 32},
    }


def test_the_cpu_host_benchmark_runs_and_counts_what_the_pins_count(tmp_path):
    """benchmarks/cpu/bench_host_cost.py, the timing side of these pins, runs in CI (briefly: the
    figures are its own run's): every row timed, and each pinned case's
    launches, matmuls and allocations those of the table above."""
    out = tmp_path / "host_cost.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VT_", "VTNUMBA_", "NUMBA_ENABLE_CUDASIM"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    script = ROOT / "benchmarks" / "cpu" / "bench_host_cost.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--repeat", "50", "--rounds", "1", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {row["call"]: row for row in json.loads(out.read_text())["rows"]}
    checked = 0
    for case, pinned in EXPECTED.items():
        row = rows.get(case)
        if row is None:
            continue
        # timed (the Python part is a difference of two timings, noisy on a loaded machine: not gated)
        assert row["us"] > 0, row
        got = (row["launches"], row["matmuls"], row["allocations"])
        assert got == (len(pinned.kernels), pinned.matmuls, pinned.allocations), (case, row)
        checked += 1
    assert checked >= 8, sorted(rows)  # the dense and MoE calls and their enqueues were timed


def test_nothing_on_the_production_path_imports_the_recorder():
    """The stand-ins must never reach a user's process: no vtnumba module outside vtnumba/testing
    names the recorder."""
    package = ROOT / "vtnumba"
    sources = [p for p in package.rglob("*.py") if "testing" not in p.relative_to(package).parts]
    assert len(sources) > 50
    imports = re.compile(r"testing(\.| import )recording\b")
    assert [p for p in sources if imports.search(p.read_text(encoding="utf-8"))] == []
    assert imports.search("from vtnumba.testing import recording")  # the pattern finds an import


# -- the worker: run as a script, it records every case and prints one JSON line ---------------------


def _record(rt, decode, step):
    """The third call of ``decode`` (after its first two bound it), recorded twice over: once with the
    profiler for the counts, once with the parameter snapshots for the pointers."""
    with rt.record() as counts:
        y = step()
    with rt.record(python_calls=False, snapshot_params=True) as snap:
        y = step()
    matmul_d = snap.matmul_pointers[-1][2] if snap.matmul_pointers else None
    return {
        **{k: v for k, v in counts.summary().items() if k != "launches"},
        "python_calls": counts.python_calls,
        "functions": dict(counts.python_functions),
        "all_params": [list(launch.params) for launch in snap.launches],
        "last_params": list(snap.launches[-1].params) if snap.launches else [],
        "last_matmul_d": matmul_d,
        "x_ptr": decode.current.data.ptr,
        "bind_x_ptr": decode.x.data.ptr,
        "y_ptr": y.data.ptr if y is not None else None,
    }


def _worker():
    import warnings

    from vtnumba.testing import recording

    warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    out = {"cases": {}, "mutants": {}}
    with recording.RecordingRuntime() as rt:
        import cupy

        from vtnumba.cuda import bound

        calls = {}
        for scheme in recording.DENSE_SCHEMES:
            calls[f"matmul_fp8 {scheme}"] = recording.dense_decode(cupy, scheme)
        for scheme in recording.MOE_SCHEMES:
            calls[f"moe_fp8 {scheme}"] = recording.moe_decode(cupy, scheme)
        from vtnumba import seam

        out["explain"] = {}
        for name, decode in calls.items():
            decode.bind()
            decode.use(decode.other_x)
            out["cases"][name] = _record(rt, decode, decode.call)
            out["explain"][name] = seam.explain(decode.owner)
        os.environ["VT_DENSE_CUBLASLT_FP8"] = "0"  # the lever: strict G3, the routed GEMV's pass
        decode = recording.moe_decode(cupy, "per_token")
        decode.bind()
        decode.use(decode.other_x)
        out["cases"]["moe_fp8 per_token strict"] = _record(rt, decode, decode.call)
        del os.environ["VT_DENSE_CUBLASLT_FP8"]
        from vtnumba.cuda import experts as gpu_experts

        out["routed_max_pairs"] = {}  # by pass: the most pairs (T k) each scheme routes at H = I = 256
        for label, disabled in (("wgmma", None), ("mma.sync", "routed_wgmma")):
            if disabled:
                os.environ["VT_DISABLE_KERNELS"] = disabled
            out["routed_max_pairs"][label] = {
                scheme: gpu_experts.routed_max_pairs(scheme, 256, 256)
                for scheme in ("static", "per_token", "per_group")
            }
            os.environ.pop("VT_DISABLE_KERNELS", None)
        for name, source in (
            ("enqueue dense dynamic", "matmul_fp8 dynamic"),
            ("enqueue dense per_token", "matmul_fp8 per_token"),
            ("enqueue moe per_token", "moe_fp8 per_token"),
        ):
            decode = calls[source]
            decode.enqueue()  # the first enqueue on these y / scratch pointers sets cuBLASLt's anew
            out["cases"][name] = _record(rt, decode, decode.enqueue)
        for scheme in ("dynamic", "per_token"):  # what a CUDA graph capture of a decode call records
            decode = calls[f"matmul_fp8 {scheme}"]
            enqueue = decode.graph_enqueue()
            enqueue()
            out["cases"][f"captured dense {scheme}"] = _record(rt, decode, enqueue)

        # the mutants: what the pins must catch
        decode = calls["matmul_fp8 dynamic"]
        original_call, original_enqueue = bound.BoundLinear.__call__, bound.BoundLinear.enqueue

        def call_with_one_more_allocation(self, x, stream_ptr):
            bound.device.xp.empty(16, dtype="uint8")
            return original_call(self, x, stream_ptr)

        def enqueue_twice(self, *args, **kwargs):
            original_enqueue(self, *args, **kwargs)
            original_enqueue(self, *args, **kwargs)

        bound.BoundLinear.__call__ = call_with_one_more_allocation
        out["mutants"]["allocation"] = _record(rt, decode, decode.call)
        bound.BoundLinear.__call__, bound.BoundLinear.enqueue = original_call, enqueue_twice
        out["mutants"]["launch"] = _record(rt, decode, decode.call)
        bound.BoundLinear.enqueue = original_enqueue
    print(json.dumps(out))


if __name__ == "__main__":
    _worker()
