"""``python -m vtnumba --model qwen3-moe`` (vtnumba/_moe_job.py), in tests/test_main.py's style:
``--all-schemes`` runs every MoE scheme, the footer is computed from the job's own rows (FP8 trails
where its rows say so), the noise rules mark rows, the help describes the MoE job, and the
profile's small MoE example prints a unit that shows its bytes. Shapes: --reduce 16 (hidden 128,
moe_intermediate 48), one trial."""

import io
import json

import numpy as np
import pytest

import vtnumba.__main__ as cli
from vtnumba import _moe_job, profile, seam

SMALL = ["--model", "qwen3-moe", "--reduce", "16", "--tokens", "1", "--repeats", "1", "--no-progress"]


def run_cli(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_all_schemes_runs_every_moe_scheme(capsys):
    rc, out, err = run_cli(SMALL + ["--all-schemes", "--json"], capsys)
    assert rc == 0, err
    report = json.loads(out)
    assert report["schemes"] == list(_moe_job.MOE_SCHEMES)
    assert [r["scheme"] for r in report["layers"]] == list(_moe_job.MOE_SCHEMES)
    assert all(r["ok"] and r["composite_max_diff"] <= 1e-5 * r["composite_scale"] for r in report["layers"])
    assert {g["scheme"] for g in report["regimes"]} == set(_moe_job.MOE_SCHEMES)


def test_a_scheme_the_moe_job_lacks_is_refused_in_one_line(capsys):
    rc, _, err = run_cli(SMALL + ["--scheme", "static"], capsys)
    assert rc == 2 and "--scheme must be one of per_token, dynamic, block, mxfp8 with --model qwen3-moe" in err


def _row(scheme, tokens, speedup, noisy=False):
    return dict(scheme=scheme, tokens=tokens, speedup=speedup, noisy=noisy)


def test_the_footer_follows_the_rows():
    """A row at 0.37x is no win: the footer says FP8 trails there, and why in those words; a noisy
    row is left out of the figures; a regime of noisy rows only quotes nothing."""
    rows = [
        _row("per_token", 1, 2.5),
        _row("per_token", 16, 1.9),
        _row("block", 1, 0.37),
        _row("block", 16, 9.0, noisy=True),
        _row("block", 64, 0.5),
        _row("mxfp8", 1, 3.0, noisy=True),
    ]
    groups = {(g["scheme"], g["regime"]): g for g in _moe_job.regime_summary(rows, "cpu")}
    assert groups["per_token", "decode"]["fp8"] == "wins" and groups["per_token", "decode"]["speedup_median"] == 2.2
    block = groups["block", "decode"]
    assert block["fp8"] == "trails" and block["speedup_max"] == 0.37 and block["noisy_rows"] == 1
    assert groups["block", "prefill"]["fp8"] == "trails" and groups["mxfp8", "decode"]["fp8"] is None
    lines = _moe_job.regime_lines(_moe_job.regime_summary(rows, "cpu"))
    assert lines[0].startswith("per_token decode (tokens 1, 16): FP8 wins, 1.90-2.50x, median 2.20x: at a few tokens")
    assert lines[1] == (
        "block decode (tokens 1, 16): FP8 trails, 0.37x (1 noisy rows left out): "
        + _moe_job._WHY["cpu", "decode", False]
    )
    assert "FP8 wins" not in lines[1] and lines[2].startswith("block prefill (tokens 64): FP8 trails, 0.50x: at many")
    assert "no speedup to quote, all 1 rows noisy" in lines[3] and len(lines) == 4


def test_the_printed_footer_is_the_rows_and_no_canned_claim(capsys):
    rc, out, err = run_cli(SMALL + ["--scheme", "block"], capsys)
    assert rc == 0, err
    row = out.split("\n")[2].split()
    assert row[2] == "aligned"  # the CPU runs the aligned steps (the path column)
    speedup = float(row[8].rstrip("x!"))
    footer = out[out.index("where FP8 wins, from the rows above:") :]
    assert "FP8 wins where a step reads more weight bytes" not in out  # the old canned line
    if "!" in out.split("\n")[2]:
        assert "no speedup to quote" in footer
    else:
        word = "wins" if speedup > 1.05 else "trails" if speedup < 0.95 else "ties"
        assert f"block decode (tokens 1): FP8 {word}, {speedup:.2f}x" in footer


def test_noisy_rows_are_marked_by_the_llama_jobs_rules():
    fast, slow = [1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 50.0]
    quiet = [(1.0, 0.0)] * 5
    assert cli.judge_times(fast, quiet, fast, quiet) == (1.0, 1.0, [])
    spread, base_spread, waited = cli.judge_times(fast, quiet, slow, quiet)
    assert spread == 1.0 and base_spread > cli.NOISY_SPREAD and waited == []
    waiting = [(0.001, 0.01)] + quiet[1:]  # the fastest (first) trial waited 10 ms for a CPU
    assert cli.judge_times(fast, waiting, fast, quiet)[2] == ["FP8 layer"]


def test_noisy_rows_get_the_warning_and_the_mark(monkeypatch, capsys):
    monkeypatch.setattr(cli, "judge_times", lambda *a: (1.0, 10.0, ["baseline"]))
    rc, out, err = run_cli(SMALL + ["--scheme", "per_token"], capsys)
    assert rc == 0, err
    assert "WARNING: noisy figures" in out and "per_token tokens=1 (baseline waited)" in out
    assert "10.0x!" in out and "no speedup to quote, all 1 rows noisy" in out


def test_help_describes_the_moe_job_for_tokens_and_reduce():
    text = " ".join(cli._parser().format_help().split())
    tokens = text[text.index("--tokens M [M ...] token") :][:400]
    reduce = text[text.index("--reduce REDUCE divide") :][:500]
    assert (
        "with --model qwen3-moe, tokens through the MoE layer (default: 1 16 on the CPU, 1 16 512 on the GPU)" in tokens
    )
    assert "with --model qwen3-moe, its hidden 2048 and moe_intermediate 768" in reduce


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0 B"), (512, "512 B"), (40_960, "41 kB"), (1_500_000, "1.5 MB"), (2_400_000_000, "2.4 GB")]
)
def test_byte_text_picks_a_unit_that_shows_the_count(n, text):
    assert profile._byte_text(n) == text


def test_the_small_moe_profile_prints_kilobytes_not_zero_mb():
    rng = np.random.default_rng(0)
    gu = seam.Fp8Experts.from_float(rng.standard_normal((4, 32, 32)).astype(np.float32))
    dn = seam.Fp8Experts.from_float(rng.standard_normal((4, 32, 16)).astype(np.float32))
    ids = np.array([[0, 1], [2, 1]], dtype=np.int64)
    rec = profile.profile_moe(
        rng.standard_normal((2, 32)).astype(np.float32), gu, dn, ids, np.full((2, 2), 0.5, np.float32)
    )
    head = rec.table().splitlines()[0]
    assert "0.0 MB" not in head and f"{profile._byte_text(rec.expert_bytes)} of FP8 expert weights touched" in head
    assert 3 * (32 * 32 + 32 * 16) <= rec.expert_bytes < 5000  # three experts hit: their codes and scales
    buf = io.StringIO()
    print(rec, file=buf)
    assert "kB of FP8 expert weights touched" in buf.getvalue()
