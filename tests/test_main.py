"""``python -m vtnumba``: the job's figures, its outputs (table, JSON, roofline) and its bad input.

The runs here use ``--reduce 32`` (Llama-3-8B's dimensions / 32) and one repeat so the whole file
stays within seconds on CI's two cores; the default run is what the README shows.
"""

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vtnumba.__main__ as cli
from vtnumba import seam

SMALL = ["--reduce", "32", "--tokens", "2", "40", "--repeats", "1", "--no-progress"]


def run_cli(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def small_report():
    """One small run, shared: its JSON report."""
    buf = io.StringIO()
    args = cli._parser().parse_args(SMALL + ["--json"])
    cli.run(args, out=buf)
    return json.loads(buf.getvalue())


def test_report_covers_every_layer_at_every_token_count(small_report):
    layers = small_report["layers"]
    assert [(r["layer"], r["m"]) for r in layers] == [(name, m) for m in (2, 40) for name, _, _ in cli.LLAMA3_8B_LAYERS]
    for r, (name, n, k) in zip(layers, list(cli.LLAMA3_8B_LAYERS) * 2):
        assert (r["n"], r["k"]) == (n // 32, k // 32)
        assert r["time_s"] > 0 and r["baseline_time_s"] > 0 and r["quant_time_s"] > 0
        assert r["speedup"] == pytest.approx(r["baseline_time_s"] / r["time_s"])
        assert r["gflops"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / r["time_s"] / 1e9)
    # the path names the kernel the CPU GEMM picked: both sides of its M crossover appear
    # which CPU kernel runs is the GEMM's own shape rule (vtnumba.cpu.gemm); the table must name it
    from vtnumba.cpu.gemm import KERNELS
    assert {r["path"].split(", ")[-1] for r in layers} <= set(KERNELS) - {"reference"}
    assert small_report["reduction"].startswith("N and K divided by 32")


def test_accuracy_figures_are_real_comparisons(small_report):
    for r in small_report["layers"]:
        assert r["g3_ok"] and 0 <= r["g3_ratio"] <= 1
        # e4m3 has 3 mantissa bits: an FP8 product of Gaussian data is a few percent off the exact
        # one. Zero would mean the comparison compared nothing; 10% would mean broken scales.
        assert 0.01 < r["fp8_rel_error"] < 0.1
    assert small_report["ok"] is True


def test_selfcheck_compares_against_the_oracle(small_report):
    checks = small_report["selfcheck"]
    assert [c["scheme"] for c in checks] == ["static scale 0.0092", "dynamic per-tensor", "dynamic per-token"]
    for c in checks:
        assert c["mismatches"] == 0
        assert c["nonzero_codes"] > 0.99 * c["values"]  # the codes compared are not all zero


def test_ceilings_are_measured(small_report):
    c = small_report["ceilings"]
    assert c["device"] == "cpu" and c["copy_gbytes_per_s"] > 0 and c["peak_gflops"] > 0


def test_a_wrong_gemm_fails_the_run(monkeypatch, capsys):
    """The G3 gate can fail: a 1% error in the FP8 path turns the run red (exit 1)."""
    real = seam.matmul_fp8
    monkeypatch.setattr(seam, "matmul_fp8", lambda x, w, out_dtype=None: real(x, w, out_dtype) * np.float32(1.01))
    rc, out, _ = run_cli(SMALL[:2] + ["--tokens", "2", "--repeats", "1", "--no-progress", "--skip-selfcheck"], capsys)
    assert rc == 1
    assert "CHECK FAILED" in out


def test_table_output(capsys):
    rc, out, err = run_cli(SMALL[:2] + ["--tokens", "2", "--repeats", "1", "--no-progress", "--skip-selfcheck"], capsys)
    assert rc == 0, err
    for word in ("q_proj", "down_proj", "GFLOP/s", "speedup", "numpy sgemm", "N and K divided by 32",
                 "all checks passed"):
        assert word in out
    assert err == ""  # no progress bar when disabled (and never on a non-terminal)


def test_roofline_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roofline.png"
    rc, out, _ = run_cli(SMALL[:2] + ["--tokens", "2", "--repeats", "1", "--no-progress", "--skip-selfcheck",
                                      "--plot", str(png)], capsys)
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert str(png) in out


def test_progress_bar_draws_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = cli.Progress(4, stream=tty, width=8)
    for label in ("one", "two"):
        bar.begin(label)
        bar.end()
    bar.begin("three")
    bar.close()
    text = tty.getvalue()
    assert "[--------] 0/4" in text and "one" in text
    assert "[####----] 2/4" in text and "three" in text and text.endswith("\r")
    pipe = io.StringIO()
    cli.Progress(4, stream=pipe).begin("one")
    assert pipe.getvalue() == ""


@pytest.mark.parametrize("argv, needle", [
    (["--device", "tpu"], "--device must be 'cpu' or 'cuda', got 'tpu'"),
    (["--reduce", "3"], "--reduce must divide every Llama-3-8B dimension"),
    (["--reduce", "0"], "must be a positive integer, got '0'"),
    (["--tokens", "x"], "must be a positive integer, got 'x'"),
    (["--plot", "/nonexistent-dir/roofline.png"], "--plot must name a file in an existing directory"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_bad_input_is_one_line(argv, needle, capsys):
    rc, out, err = run_cli(argv + ["--no-progress"], capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("vtnumba: error: ") and needle in err
    assert "Traceback" not in err


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    rc, _, err = run_cli(["--plot", str(tmp_path / "r.png"), "--no-progress"], capsys)
    assert rc == 2
    assert "pip install 'vtnumba[plot]'" in err and err.count("\n") == 1


def test_gpu_requested_without_one(capsys):
    reason = cli.gpu_unavailable_reason()
    if reason is None:
        pytest.skip("a usable GPU is present")
    rc, _, err = run_cli(["--device", "cuda", "--no-progress"], capsys)
    assert rc == 2
    assert err == f"vtnumba: error: --device cuda: {reason}\n"


def test_module_entry_point_exits_cleanly_on_expected_errors():
    """The real process: one line on stderr, exit 2, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "vtnumba", "--device", "tpu"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == "vtnumba: error: --device must be 'cpu' or 'cuda', got 'tpu'\n"
    assert proc.stdout == ""


@pytest.mark.gpu
def test_cuda_run(capsys):
    rc, out, err = run_cli(["--device", "cuda", "--reduce", "4", "--tokens", "16", "--repeats", "10",
                            "--no-progress", "--json"], capsys)
    assert rc == 0, err
    report = json.loads(out)
    assert report["device"] == "cuda" and all(r["g3_ok"] for r in report["layers"])
    assert all(r["host_s"] is not None and r["host_s"] > 0 for r in report["layers"])


README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_commands_and_tour_run():
    """The README's two commands are exactly CI's, and its tour's Python blocks run as written
    (the cupy block only where a GPU is)."""
    text = README.read_text()
    assert 'python3 -m pip install ".[test]" && python3 -m vtnumba ' in text
    assert 'python3 -m pip install ".[test]" && python3 -m pytest -q ' in text
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 5
    namespace = {}
    ran = 0
    for block in blocks:
        if "import cupy" in block and cli.gpu_unavailable_reason() is not None:
            continue
        exec(compile(block, str(README), "exec"), namespace)
        ran += 1
    namespace["test_my_quantizer"]()  # the hypothesis example is a working property test
    assert ran >= 4 and namespace["y"].shape == (4, 32) and len(namespace["res"]) == 2
