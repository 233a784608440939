"""``python -m vtnumba``: the job's figures, its baseline, its columns (never blank without a
reason), its schemes, its outputs (table, JSON, roofline) and its bad input.

The runs here use ``--reduce 32`` (Llama-3-8B's dimensions / 32; ``--reduce 16`` where the block
scheme needs whole 128-wide blocks) and one repeat so the whole file stays within seconds on CI's
two cores; the default run is what the README shows. The GPU half (``gpu`` marker) runs on the H200.
"""

import dataclasses
import importlib.util
import io
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import vtnumba.__main__ as cli
from vtnumba import seam, timing

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
    for r, (_, n, k) in zip(layers, list(cli.LLAMA3_8B_LAYERS) * 2):
        assert (r["n"], r["k"]) == (n // 32, k // 32)
        assert r["scheme"] == "dynamic"  # the default scheme
        assert r["device_us"] > 0 and r["baseline_us"] > 0 and r["quant_us"] > 0
        assert r["speedup"] == pytest.approx(r["baseline_us"] / r["device_us"])
        # the share comes from the fastest call of each (medians taken apart gave shares above 100%)
        assert r["quant_share"] == pytest.approx(min(r["quant_min_us"], r["device_min_us"]) / r["device_min_us"])
        assert 0 < r["quant_share"] <= 1
        assert r["spread"] >= 1 and r["baseline_spread"] >= 1 and isinstance(r["noisy"], bool)
        assert r["gflops"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / (r["device_us"] * 1e-6) / 1e9)
    # which CPU kernel runs is the GEMM's own shape rule (vtnumba.cpu.gemm); the table must name it
    from vtnumba.cpu.gemm import KERNELS

    assert {r["kernel"] for r in layers} <= set(KERNELS) - {"reference"}
    assert small_report["reduction"].startswith("N and K divided by 32")
    assert small_report["schemes"] == ["dynamic"] and small_report["skipped_schemes"] == {}


# -- the baseline --------------------------------------------------------------------------------


def test_baseline_is_what_a_user_of_the_device_runs_instead(small_report):
    cpu, gpu = cli.baseline_for("cpu"), cli.baseline_for("cuda")
    assert cpu.dtype == "float32" and "numpy" in cpu.label and "sgemm" in cpu.label
    # on the GPU: half precision on tensor cores, never float32 sgemm
    assert gpu.dtype == "float16" and "cuBLAS" in gpu.label and "tensor cores" in gpu.label
    assert "sgemm" not in gpu.label and gpu.column != cpu.column
    # the report names the baseline it measured, and the FP8 layer takes the baseline's activations
    assert small_report["baseline"] == {"label": cpu.label, "column": cpu.column, "dtype": "float32"}
    assert small_report["activation_dtype"] == "float32"
    assert cli._Device("cpu").dtype == np.float32


# -- the columns ---------------------------------------------------------------------------------

NUMBER_COLUMNS = (
    "device_us",
    "host_us",
    "graph_us",
    "quant_us",
    "quant_share",
    "gflops",
    "gbytes_per_s",
    "baseline_us",
    "baseline_host_us",
    "speedup",
    "g3_ratio",
    "fp8_rel_error",
)


def column_problems(row):
    """Each column of ``row`` that is neither a finite number nor None with a reason."""
    problems = []
    for key in NUMBER_COLUMNS:
        value = row[key]
        if value is None:
            why = row["unavailable"].get(key) or {}
            if not why.get("label") or not why.get("reason"):
                problems.append(f"{key} is None without a reason")
        elif not (isinstance(value, float) and np.isfinite(value) and value >= 0):
            problems.append(f"{key} = {value!r}")
    return problems


def test_no_column_is_blank_without_a_reason(small_report):
    checked = 0
    for row in small_report["layers"]:
        assert column_problems(row) == []
        # on the CPU the host and graph columns say why they do not apply
        for key in ("host_us", "graph_us", "baseline_host_us"):
            assert row[key] is None and row["unavailable"][key]["label"] == "cpu"
            checked += 1
    assert checked == 3 * len(small_report["layers"])
    # the check itself can fail: a number dropped without a reason is caught
    doctored = dict(small_report["layers"][0], device_us=None)
    assert column_problems(doctored) == ["device_us is None without a reason"]


def test_table_cells_are_never_blank(small_report):
    heads, rows, keys = cli.table_cells(small_report)
    assert {"device us", "host us", "graph us", "quant us (share)", "sgemm us"} <= set(heads)
    assert len(rows) == len(small_report["layers"])
    for row in rows:
        assert all(cell.strip() for cell in row)
        assert row[keys.index("host_us")] == "n/a (cpu)" and row[keys.index("graph_us")] == "n/a (cpu)"
        assert re.fullmatch(r"\d+\.\d \(\d+%\)", row[keys.index("quant_us")])
    # a None without a reason still shows, and says it has none
    doctored = dict(small_report, layers=[dict(small_report["layers"][0], graph_us=None, unavailable={})])
    _, rows, _ = cli.table_cells(doctored)
    assert rows[0][keys.index("graph_us")] == "n/a (no reason given)"


# -- the schemes ---------------------------------------------------------------------------------

ALL_SCHEMES = ["--reduce", "16", "--tokens", "4", "--repeats", "1", "--no-progress", "--skip-selfcheck", "--json"]


@pytest.fixture
def no_blas_pause(monkeypatch):
    """No quiet pause before each CPU timing: its accuracy is not under test here, CI's seconds are."""
    monkeypatch.setattr(timing, "_BLAS_SPIN_PAUSE_S", 0.0)


@pytest.fixture(scope="module")
def all_schemes_report():
    """--all-schemes at Llama-3-8B / 16: every K is whole 128-wide blocks, so the block scheme runs
    where the library offers it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timing, "_BLAS_SPIN_PAUSE_S", 0.0)
        buf = io.StringIO()
        cli.run(cli._parser().parse_args(ALL_SCHEMES + ["--all-schemes"]), out=buf)
    return json.loads(buf.getvalue())


def test_all_schemes_run_every_offered_scheme(all_schemes_report):
    reason = cli.block_support_reason()
    offered = [s for s in cli.SCHEMES if s != "block" or reason is None]
    assert all_schemes_report["schemes"] == offered and "mxfp8" in offered
    assert all_schemes_report["skipped_schemes"] == ({} if reason is None else {"block": reason})
    rows = all_schemes_report["layers"]
    assert [(r["layer"], r["scheme"]) for r in rows] == [
        (name, s) for name, _, _ in cli.LLAMA3_8B_LAYERS for s in offered
    ]
    for r in rows:
        assert r["g3_ok"] and 0 <= r["g3_ratio"] <= 1 and 0.01 < r["fp8_rel_error"] < 0.1
        assert column_problems(r) == []
    assert all_schemes_report["ok"] is True
    # the schemes are different computations: per-token scales give other codes, hence another error
    errors = {(r["layer"], r["scheme"]): r["fp8_rel_error"] for r in rows}
    assert errors[("q_proj", "per_token")] != errors[("q_proj", "dynamic")]


def test_scheme_choice():
    shapes = list(cli.layer_shapes(4))
    parse = cli._parser().parse_args
    assert cli.choose_schemes(parse([]), shapes, 4) == (["dynamic"], {})
    assert cli.choose_schemes(parse(["--scheme", "per_token"]), shapes, 4) == (["per_token"], {})
    weight = cli.make_weight("static", np.ones((16, 32), np.float32), np.full((2, 32), 4.48, np.float32))
    assert weight.activation_scheme == "static" and weight.input_scale == np.float32(0.01)  # amax / 448
    weight = cli.make_weight("per_token", np.ones((16, 32), np.float32), None)
    assert weight.activation_scheme == "per_token" and weight.per_channel
    weight = cli.make_weight("mxfp8", np.ones((16, 64), np.float32), None)
    assert weight.block_size == (1, 32) and weight.scale_format == weight.activation_scale_format == "e8m0"


def test_mxfp8_scheme_runs_and_checks_its_quantizer(no_blas_pause, capsys):
    rc, out, err = run_cli(
        ["--scheme", "mxfp8", "--reduce", "32", "--tokens", "1", "4", "--repeats", "1", "--no-progress", "--json"],
        capsys,
    )
    assert rc == 0, err
    report = json.loads(out)
    assert report["schemes"] == ["mxfp8"] and report["ok"]
    assert all(r["scheme"] == "mxfp8" and r["g3_ok"] for r in report["layers"])
    checks = cli.selfcheck(cli._Device("cpu"), rows=8, cols=512, mx=True)
    assert checks[-1]["scheme"].startswith("MXFP8") and checks[-1]["mismatches"] == 0
    assert checks[-1]["nonzero_codes"] > 3000
    assert cli.mx_reason(list(cli.layer_shapes(4)), 4) is None


def test_block_support_is_a_capability_check():
    """The block scheme is offered by what the library's functions accept, not by a flag."""

    def quantize_without(x, scale=None, *, per_token=False, scale_ub=None):
        pass

    def quantize_with(x, scale=None, *, per_token=False, scale_ub=None, group_size=None):
        pass

    def from_float_without(w, input_scale=None, per_channel=False):
        pass

    def from_float_with(w, input_scale=None, per_channel=False, *, block_size=None):
        pass

    with_reference = types.SimpleNamespace(block_scaled_mm=lambda *args: None)
    assert cli.block_support_reason(quantize_with, from_float_with, with_reference) is None
    reason = cli.block_support_reason(quantize_without, from_float_with, with_reference)
    assert "group_size" in reason and "block_size" not in reason
    reason = cli.block_support_reason(quantize_with, from_float_without, types.SimpleNamespace())
    assert "from_float takes no block_size" in reason and "block_scaled_mm" in reason and "group_size" not in reason


def test_block_shapes_must_be_whole_blocks():
    assert cli.block_shape_reason(list(cli.layer_shapes(16)), 16) is None
    reason = cli.block_shape_reason(list(cli.layer_shapes(32)), 32)
    assert reason == "the block scheme needs K to be a multiple of 128; --reduce 32 gives K = 448 (down_proj)"


def test_block_scheme_is_offered_exactly_when_the_library_has_it(no_blas_pause, capsys):
    reason = cli.block_support_reason()
    rc, out, err = run_cli(ALL_SCHEMES + ["--scheme", "block"], capsys)
    if reason is not None:
        assert rc == 2 and err == f"vtnumba: error: --scheme block is not offered here: {reason}\n"
        return
    assert rc == 0, err
    report = json.loads(out)
    assert report["schemes"] == ["block"] and report["ok"]
    assert all(r["scheme"] == "block" and r["g3_ok"] for r in report["layers"])
    checks = cli.selfcheck(cli._Device("cpu"), rows=8, cols=512, block=True)
    assert checks[-1]["scheme"] == "dynamic per-group 128" and checks[-1]["mismatches"] == 0
    rc, _, err = run_cli(["--scheme", "block", "--reduce", "32", "--no-progress"], capsys)
    assert rc == 2 and "K = 448 (down_proj)" in err


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
    for word in (
        "q_proj",
        "down_proj",
        "GFLOP/s",
        "speedup",
        "N and K divided by 32",
        "all checks passed",
        "float32 activations and outputs",
        "n/a (cpu)",
        "quant us (share)",
    ):
        assert word in out
    # the footer names the baseline, and says why each n/a column has no number
    assert f"speedup = {cli.baseline_for('cpu').label} time" in out
    assert f"host us n/a (cpu): {cli.CPU_NOT_APPLICABLE['host_us'][1]}" in out
    assert f"graph us n/a (cpu): {cli.CPU_NOT_APPLICABLE['graph_us'][1]}" in out
    assert "GPU:" not in out  # the capability header is the GPU run's
    assert err == ""  # no progress bar when disabled (and never on a non-terminal)


def test_roofline_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roofline.png"
    rc, out, _ = run_cli(
        SMALL[:2] + ["--tokens", "2", "--repeats", "1", "--no-progress", "--skip-selfcheck", "--plot", str(png)], capsys
    )
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


def test_progress_is_one_line_per_step_off_a_terminal():
    pipe = io.StringIO()
    progress = cli.Progress(3, stream=pipe)
    for label in ("one", "two"):
        progress.begin(label)
        progress.end()
    progress.close()
    lines = pipe.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["[1/3]", "[2/3]"] and "\r" not in pipe.getvalue()
    assert lines[0].startswith("vtnumba: ") and lines[0].endswith(" one") and lines[1].endswith(" two")
    silent = io.StringIO()
    cli.Progress(3, stream=silent, enabled=False).begin("one")
    assert silent.getvalue() == ""


def test_progress_reaches_a_piped_stderr_as_the_run_goes():
    """The real process with stderr on a pipe: a line per step, each written as its step starts (so a
    log shows where a long run is), and nothing with --no-progress."""
    argv = [sys.executable, "-m", "vtnumba", "--reduce", "32", "--tokens", "2", "--repeats", "1", "--skip-selfcheck"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()  # arrives while the run is still going: stdout is not written yet
    assert first.startswith("vtnumba: [1/9]") and proc.poll() is None
    rest = proc.stderr.read()  # through the same buffered reader (communicate() would skip what it holds)
    out = proc.stdout.read()  # the table is a few KB: it fits the pipe while stderr is read
    assert proc.wait(timeout=600) == 0 and "all checks passed" in out
    steps = [first] + rest.splitlines()
    assert [line.split()[1] for line in steps] == [f"[{i}/9]" for i in range(1, 10)]
    quiet = subprocess.run(argv + ["--no-progress"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_help_is_plain_text():
    text = cli._parser().format_help()
    assert "`" not in text  # no reST literals in a terminal
    assert "python -m vtnumba (or vtnumba): see the FP8 W8A8 linear path work" in " ".join(text.split())
    assert "--plot PATH" in text and "--no-progress" in text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--device", "tpu"], "--device must be 'cpu' or 'cuda', got 'tpu'"),
        (["--reduce", "3"], "--reduce must divide every Llama-3-8B dimension"),
        (["--reduce", "0"], "must be a positive integer, got '0'"),
        (["--tokens", "x"], "must be a positive integer, got 'x'"),
        (["--plot", "/nonexistent-dir/roofline.png"], "--plot must name a file in an existing directory"),
        (["--plot", "roofline.txt"], ".pdf, .pgf, .png, .ps"),
        (["--plot", "roofline"], "got 'roofline': name it e.g. roofline.png"),
        (["--plot", "."], "--plot must name a file, got the directory '.'"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["--scheme", "int8"], "argument --scheme: invalid choice: 'int8'"),
        (["--scheme", "static", "--all-schemes"], "argument --all-schemes: not allowed with argument --scheme"),
    ],
)
def test_bad_input_is_one_line(argv, needle, capsys):
    rc, out, err = run_cli(argv + ["--no-progress"], capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("vtnumba: error: ") and needle in err
    assert "Traceback" not in err


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if the run starts any work (the self-check, the ceilings, a layer)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the run started work before refusing its arguments")

    monkeypatch.setattr(cli, "selfcheck", refuse)
    monkeypatch.setattr(cli, "run_layer", refuse)
    monkeypatch.setattr(cli, "gpu_unavailable_reason", refuse)


@pytest.mark.parametrize("plot", ["roofline.txt", "roofline", "/nonexistent-dir/r.png", "."])
def test_a_bad_plot_path_is_refused_before_any_work(plot, no_work, capsys):
    pytest.importorskip("matplotlib")
    rc, out, err = run_cli(["--device", "cuda", "--plot", plot], capsys)  # even the GPU check comes after
    assert rc == 2 and out == "" and err.startswith("vtnumba: error: --plot must ") and err.count("\n") == 1


def test_an_unwritable_plot_directory_is_refused_before_any_work(monkeypatch, tmp_path, no_work, capsys):
    real_access = cli.os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real_access(p, mode))
    rc, _, err = run_cli(["--plot", str(tmp_path / "r.png")], capsys)  # root writes anywhere: access is faked
    assert rc == 2 and f"({tmp_path} is not writable): pick another directory" in err


def test_missing_matplotlib_is_refused_before_any_work(monkeypatch, tmp_path, no_work, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, _, err = run_cli(["--plot", str(tmp_path / "r.png")], capsys)
    assert rc == 2 and "pip install 'vtnumba[plot]'" in err


def test_noisy_figures_are_flagged(small_report, capsys):
    report = json.loads(json.dumps(small_report))
    row = report["layers"][0]
    row.update(spread=5.0, noisy=True)
    cli._print_tables(report, sys.stdout)
    out = capsys.readouterr().out
    assert "5.0x!" in out and f"{row['speedup']:.2f}x!" in out
    assert "WARNING: noisy figures (p90 > 3x the median" in out and f"{row['layer']} M={row['m']}" in out
    clean = json.loads(json.dumps(small_report))
    for r in clean["layers"]:
        r.update(spread=1.1, noisy=False)
    cli._print_tables(clean, sys.stdout)
    assert "WARNING" not in capsys.readouterr().out


def test_cpu_header_names_the_path(small_report, capsys):
    from vtnumba.cpu import paths

    cpu = small_report["cpu"]
    assert cpu["path"] == paths.active().name and cpu["path"] in cpu["runnable_paths"]
    assert cpu["serial_below_macs"] > 0 and cpu["numba_threads"] >= 1
    cli._print_tables(small_report, sys.stdout)
    out = capsys.readouterr().out
    assert f"kernels: path {cpu['path']} (" in out and out.count("CPU: ") == 1


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
    proc = subprocess.run(
        [sys.executable, "-m", "vtnumba", "--device", "tpu"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr == "vtnumba: error: --device must be 'cpu' or 'cuda', got 'tpu'\n"
    assert proc.stdout == ""


@pytest.mark.gpu
def test_cuda_run(capsys):
    rc, out, err = run_cli(
        ["--device", "cuda", "--reduce", "4", "--tokens", "16", "--repeats", "10", "--no-progress", "--json"], capsys
    )
    assert rc == 0, err
    report = json.loads(out)
    assert report["device"] == "cuda" and all(r["g3_ok"] for r in report["layers"])
    # the baseline is half precision on tensor cores, and the FP8 layer takes the same activations
    assert report["baseline"] == dataclasses.asdict(cli.baseline_for("cuda"))
    assert report["activation_dtype"] == "float16"
    for r in report["layers"]:
        assert column_problems(r) == []
        assert r["host_us"] > 0 and r["baseline_host_us"] > 0 and 0 < r["quant_share"]
        assert r["graph_us"] is not None or r["unavailable"]["graph_us"]["label"] == "capture failed"
    # the seam's dynamic layer captures (tests/test_profile.py's graph timing): the column has numbers
    assert all(r["graph_us"] is not None for r in report["layers"])
    caps = report["gpu_capabilities"]
    assert caps["gpu"] and len(caps["cc"]) == 2 and caps["cublaslt"] and caps["cuda_runtime"]
    assert caps["paths"]["cublaslt_per_tensor"]["available"]  # FP8 on the H200
    assert any(label.startswith("cuBLAS hgemm") for label in report["ceilings"]["extra"])


@pytest.mark.gpu
def test_cuda_table_every_scheme(tmp_path, capsys):
    png = tmp_path / "roofline.png"
    argv = [
        "--device",
        "cuda",
        "--reduce",
        "4",
        "--tokens",
        "16",
        "--repeats",
        "5",
        "--no-progress",
        "--skip-selfcheck",
        "--all-schemes",
    ]
    if importlib.util.find_spec("matplotlib") is not None:
        argv += ["--plot", str(png)]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert out.startswith("GPU: ") and "cuBLASLt FP8 GEMM, per-tensor scales" in out
    for word in (
        "f16 GEMM us",
        "host us",
        "graph us",
        "quant us (share)",
        "float16 activations and outputs",
        f"speedup = {cli.baseline_for('cuda').label} time",
        "per_token, ",
        "all checks passed",
    ):
        assert word in out
    assert "n/a (cpu)" not in out
    if "--plot" in argv:
        assert png.read_bytes()[:4] == b"\x89PNG"


README = Path(__file__).resolve().parents[1] / "README.md"
GUIDE = README.parent / "docs" / "GUIDE.md"


def test_readme_describes_what_the_command_prints(small_report):
    """The guide's account of the main command names its columns, the CPU's n/a cells and the
    schemes; the README points to it."""
    text = " ".join(GUIDE.read_text().split())  # the paragraphs, their line breaks folded
    heads, _, _ = cli.table_cells(small_report)
    for word in (
        "device us",
        "host us",
        "graph us",
        "n/a (cpu)",
        "--all-schemes",
        "vtnumba.cuda.capabilities()",
        "float16 GEMM",
        "float32 sgemm",
        "|".join(cli.SCHEMES),
    ):
        assert word in text, word
    assert {"device us", "host us", "graph us"} <= set(heads)
    assert "docs/GUIDE.md" in README.read_text()


def _run_blocks(path, namespace):
    """Exec every Python block of ``path`` in ``namespace``, in order (the GPU blocks only where a
    GPU is); the number that ran."""
    ran = 0
    for block in re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S):
        needs_gpu = "import cupy" in block or 'device="cuda"' in block or ".cuda()" in block
        if needs_gpu and cli.gpu_unavailable_reason() is not None:
            continue
        # compiled from a string, not the file: hypothesis would read the prose around it as source
        exec(compile(block, f"<{path.name}>", "exec"), namespace)
        ran += 1
    return ran


def test_readme_commands_and_tour_run():
    """The README's two commands are exactly CI's, and the Python blocks of the README's tour and
    of docs/GUIDE.md run as written (the GPU blocks only where a GPU is)."""
    text = README.read_text()
    assert 'python3 -m pip install . && python3 -m vtnumba ' in text
    assert 'python3 -m pip install ".[test]" && python3 -m pytest -q ' in text
    tour = {}
    assert _run_blocks(README, tour) >= 3
    tour["test_my_quantizer"]()  # the hypothesis example is a working property test
    assert tour["y"].shape == (4, 32) and tour["out"].shape == (4, 64) and tour["logits"].shape == (1, 4, 128)
    guide = {}
    assert _run_blocks(GUIDE, guide) >= 9
    guide["test_my_quantizer"]()
    assert guide["y"].shape == (4, 32) and len(guide["res"]) == 2
    assert guide["out"].shape == (4, 64) and guide["yg"].shape[1] == 64 and guide["logits"].shape == (1, 4, 128)


def test_moe_model_runs_the_experts_layer_and_checks_it(capsys):
    """--model qwen3-moe: one MoE layer per token count, held to the seam's dense composite and to
    the float64 layer, timed against the float loop; a bad --reduce is refused in one line."""
    rc, out, err = run_cli(
        ["--model", "qwen3-moe", "--reduce", "16", "--tokens", "1", "3", "--repeats", "1", "--no-progress", "--json"],
        capsys,
    )
    assert rc == 0, err
    report = json.loads(out)
    assert report["model"] == "qwen3-moe" and report["experts"] == 128 and report["top_k"] == 8
    rows = report["layers"]
    assert [r["tokens"] for r in rows] == [1, 3] and all(r["ok"] for r in rows)
    assert rows[0]["routed_experts"] == 8 and rows[1]["routed_experts"] > 8
    assert all(0 < r["fp8_rel_error"] < 0.1 and r["fp8_us"] > 0 and r["baseline_us"] > 0 for r in rows)
    assert all(r["composite_max_diff"] <= 1e-5 * r["composite_scale"] for r in rows)
    rc, out, err = run_cli(["--model", "qwen3-moe", "--reduce", "5"], capsys)
    assert rc == 2 and "--reduce must divide" in err


# -- the timing: interleaved, fastest trial, and the noisy rules ----------------------------------


def test_fp8_and_baseline_are_timed_in_turn(monkeypatch):
    """Round after round, each side an untimed call then a timed one, FP8 first after the pause:
    load on the machine hits both sides alike, and the fastest trial of each is kept."""
    order, clock = [], [0.0]
    monkeypatch.setattr(timing.time, "sleep", lambda s: order.append("pause"))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def side(name, seconds):
        def call():
            order.append(name)
            clock[0] += seconds

        return call

    calls = [side("fp8", 1.0), side("quant", 0.25), side("base", 2.0)]
    times = timing.interleaved_cpu_samples(calls, trials=3, warmup=1)
    assert order == ["fp8", "quant", "base"] + ["pause", "fp8", "fp8", "quant", "quant", "base", "base"] * 3
    assert times == [[1.0] * 3, [0.25] * 3, [2.0] * 3]
    # the main job keeps the fastest trial of each side
    seq = iter([5e-3, 1e-3, 3e-3, 9e-3, 2e-3, 4e-3])
    monkeypatch.setattr(cli, "_spread", lambda t: 1.0)
    monkeypatch.setattr(
        timing,
        "interleaved_cpu_samples",
        lambda calls, trials, waits: (
            waits.extend([[None, None]] * len(calls)) or [[next(seq), next(seq)] for _ in calls]
        ),
    )
    sides, record = cli._time_cpu("q", None, None, None, 2, 1.0, 1.0, "1x1x1")
    assert {k: v[0] for k, v in sides.items()} == {"fp8": 1e-3, "quant": 3e-3, "base": 2e-3}
    assert record.time_s == record.min_s == 1e-3


CEILINGS = types.SimpleNamespace(peak_gflops=190.0, copy_gbytes_per_s=23.4)


def test_a_baseline_far_below_its_ceiling_is_noisy():
    """The newcomer's run: sgemm at 1.4 GFLOP/s on 16x1024x1024, slow on every call (its spread 1.1),
    read as a 29.76x speedup. The ceiling rule flags it; a quiet run's figures are not flagged."""
    m, n, k = 16, 1024, 1024
    flops, base_bytes = 2.0 * m * n * k, 4.0 * (m * k + n * k + m * n)
    assert flops / 24011.2e-6 / 1e9 == pytest.approx(1.4, abs=0.05)
    assert cli.below_ceiling(24011.2e-6, flops, base_bytes, CEILINGS)
    assert not cli.below_ceiling(490e-6, flops, base_bytes, CEILINGS)  # a quiet run, same shape
    # small shapes pay a call's fixed cost, far above their roof: the floor keeps them unflagged
    assert not cli.below_ceiling(60e-6, 2.0 * 2 * 128 * 128, 4.0 * (2 * 128 + 128 * 128 + 2 * 128), CEILINGS)
    # the quiet default job's worst case (sgemm at M = 16, real shapes: 3.2x its roof) is clear of it
    flops16 = 2.0 * 16 * 14336 * 4096
    assert not cli.below_ceiling(31.5e-3, flops16, 4.0 * 14336 * 4096, CEILINGS)


def test_rows_are_judged_by_the_best_rates_the_run_reached():
    """Ceilings measured at the start of a loaded run (copy 5.9 GB/s, sgemm 23.8 GFLOP/s) let an sgemm of
    14.5 ms at 1 x 1024 x 4096 pass as a 32x speedup; the same run's own calls reached 35 GB/s, and
    judged by that the row is noisy. Ceilings above every call's rate stay as measured."""
    import dataclasses

    from vtnumba import profile

    def row(m, n, k, fp8_us, base_us):
        flops, fp8_bytes = profile.linear_cost(m, n, k, 4, 1, 4)
        return dict(
            flops=flops,
            bytes=fp8_bytes,
            baseline_bytes=4.0 * (m * k + n * k + m * n),
            device_min_us=fp8_us,
            baseline_us=base_us,
            spread_noisy=False,
        )

    measured = profile.Ceilings("cpu", 5.9, 23.8, "numpy sgemm 1024^3")
    rows = [row(1, 4096, 4096, 1984.9, 1920.5), row(1, 1024, 4096, 454.1, 14542.5)]
    assert not cli.judge_row(dict(rows[1]), measured)["noisy"]  # the start's ceilings let it pass
    judged = cli.run_ceilings(measured, rows)
    assert judged.copy_gbytes_per_s == pytest.approx(4.0 * (4096 + 4096 * 4096 + 4096) / 1920.5e-6 / 1e9)
    assert judged.peak_gflops == measured.peak_gflops  # no call beat the measured peak
    assert cli.judge_row(rows[1], judged)["slow"] == ["baseline"] and rows[1]["noisy"]
    assert not cli.judge_row(rows[0], judged)["noisy"]  # the row that set the bandwidth
    high = dataclasses.replace(measured, copy_gbytes_per_s=1000.0, peak_gflops=1e5)
    assert cli.run_ceilings(high, rows) == high


def test_a_side_that_waited_for_a_cpu_is_noisy(monkeypatch):
    """Sustained load slows every trial and every rate a run reaches alike, past the spread and the
    ceiling rules; the kept trial's wait for a CPU names it. A call alone on its cores, or a thread
    pool's wake-up on a tiny call, is not flagged."""
    assert cli.waited_for_cpu((3e-3, 2e-3))  # 40% of its runnable time spent waiting
    assert not cli.waited_for_cpu((10e-3, 0.5e-3))  # alone on its cores
    assert not cli.waited_for_cpu((50e-6, 100e-6))  # a wake-up on a tiny call: under the floor
    assert not cli.waited_for_cpu(None)  # no schedstat: nothing to go by
    row = dict(flops=1.0, bytes=1.0, baseline_bytes=1.0, device_min_us=1.0, baseline_us=1.0, spread_noisy=False)
    assert not cli.judge_row(dict(row, waited=[]), None)["noisy"]
    assert cli.judge_row(dict(row, waited=["baseline"]), None)["noisy"]
    # the timer hands the trials' (running, waiting) seconds over, the fastest trial's picked
    waits = []
    times = timing.interleaved_cpu_samples([lambda: None, lambda: sum(range(1000))], trials=3, warmup=0, waits=waits)
    assert len(waits) == 2 and all(len(w) == 3 for w in waits) and [len(t) for t in times] == [3, 3]
    if timing.runqueue_seconds() is not None:  # Linux
        assert all(run >= 0 and wait >= 0 for w in waits for run, wait in w)
    seq = iter([5e-3, 1e-3, 3e-3, 9e-3, 2e-3, 4e-3])
    monkeypatch.setattr(cli, "_spread", lambda t: 1.0)
    trial_waits = [[(1e-3, 0.0), (1e-3, 0.0)], [(1e-3, 0.0)] * 2, [(2e-3, 3e-3), (1e-3, 0.0)]]
    monkeypatch.setattr(
        timing,
        "interleaved_cpu_samples",
        lambda calls, trials, waits: waits.extend(trial_waits) or [[next(seq), next(seq)] for _ in calls],
    )
    sides, _ = cli._time_cpu("q", None, None, None, 2, 1.0, 1.0, "1x1x1")
    assert [sides[k][3] for k in ("fp8", "quant", "base")] == [False, False, True]  # base's fastest waited


def test_a_slow_side_marks_the_row_and_names_itself(monkeypatch, capsys):
    """run_layer marks a row noisy when its baseline ran far below the ceilings, with its spread tight,
    and the table flags it and says why."""
    real = cli._time_cpu

    def slow_baseline(*args):
        sides, record = real(*args)
        best, median, spread, waited = sides["base"]
        sides["base"] = (best * 200, median * 200, spread, False)  # slow on every trial: the spread stays tight
        return sides, record

    monkeypatch.setattr(cli, "_time_cpu", slow_baseline)
    monkeypatch.setattr(timing, "_BLAS_SPIN_PAUSE_S", 0.0)
    rng = np.random.default_rng(0)
    x, w = cli.layer_data(rng, 16, 512, 512, np.float32)
    ceilings = types.SimpleNamespace(peak_gflops=100.0, copy_gbytes_per_s=20.0)
    row, _ = cli.run_layer(cli._Device("cpu"), "dynamic", "q_proj", x, w, 2, ceilings=ceilings)
    assert row["slow"] == ["baseline"] and row["noisy"] and row["speedup"] > 20
    report = dict(
        device="cpu",
        reduction="test",
        repeats=2,
        schemes=["dynamic"],
        skipped_schemes={},
        baseline=dataclasses.asdict(cli.baseline_for("cpu")),
        activation_dtype="float32",
        selfcheck=[],
        ceilings=dict(copy_gbytes_per_s=20.0, peak_gflops=100.0, peak_label="sgemm", extra={}),
        layers=[dict(row, reduce=1)],
        ok=True,
        regimes=cli.regime_summary([row], "cpu"),
    )
    cli._print_tables(report, sys.stdout)
    out = capsys.readouterr().out
    assert f"{row['speedup']:.2f}x!" in out and "q_proj M=16 (baseline slow)" in out
    assert "all 1 rows noisy" in out  # no speedup quoted for the regime


# -- the default job ------------------------------------------------------------------------------


def test_default_job_runs_decode_at_the_real_shapes():
    """Decode (M = 1 and 16) at Llama-3-8B's full N and K, where the float32 weights do not fit in
    cache, and the prefill batch at / 4 on the CPU; --reduce divides every M; the GPU runs full size."""
    assert cli.job_plan("cpu") == [(1, 1), (16, 1), (256, 4)]
    assert cli.job_plan("cpu", [1, 64]) == [(1, 1), (64, 4)]
    assert cli.job_plan("cpu", [2, 40], 32) == [(2, 32), (40, 32)]
    assert cli.job_plan("cuda") == [(1, 1), (16, 1), (256, 1)]
    assert dict(cli.job_plan("cpu"))[1] == 1 and list(cli.layer_shapes(1))[4] == ("gate_proj", 14336, 4096)
    args = cli._parser().parse_args([])
    assert args.tokens is None and args.reduce is None  # the plan above is what a bare run gets
    assert cli.describe_plan(cli.job_plan("cpu")) == (
        "M = 1, 16 at full size; M = 256 at N and K divided by 4 (hidden 1024, intermediate 3584, kv 256)"
    )
    assert cli.describe_plan([(2, 32), (40, 32)]).startswith("N and K divided by 32")


def test_mixed_plan_runs_each_m_at_its_size(no_blas_pause, capsys):
    """Without --reduce each M takes its regime's size (here a small stand-in for the real shapes)."""
    import vtnumba.__main__ as main

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(main, "job_plan", lambda device, tokens=None, reduce=None: [(1, 16), (3, 32)])
        rc, out, err = run_cli(["--repeats", "1", "--no-progress", "--skip-selfcheck", "--json"], capsys)
    assert rc == 0, err
    report = json.loads(out)
    assert [(r["m"], r["k"], r["reduce"]) for r in report["layers"]][:2] == [(1, 4096 // 16, 16), (1, 4096 // 16, 16)]
    assert {(r["m"], r["reduce"]) for r in report["layers"]} == {(1, 16), (3, 32)}
    assert report["reduce"] is None and report["plan"] == [dict(m=1, reduce=16), dict(m=3, reduce=32)]
    assert [r["m"] for r in report["layers"]] == [1] * 7 + [3] * 7  # the plan's order, layer by layer


def test_footer_says_where_fp8_wins_and_why(small_report, capsys):
    report = json.loads(json.dumps(small_report))
    for r in report["layers"]:  # a quiet machine's figures at the default job's regimes
        r.update(noisy=False, slow=[], speedup=2.0 if r["m"] == 2 else 0.8, reduce=1 if r["m"] == 2 else 4)
    report["regimes"] = cli.regime_summary(report["layers"], "cpu")
    assert [(g["regime"], g["fp8"]) for g in report["regimes"]] == [("decode", "wins"), ("prefill", "trails")]
    cli._print_tables(report, sys.stdout)
    out = " ".join(capsys.readouterr().out.split())
    assert "where FP8 wins:" in out
    assert "decode (M = 2, full size): FP8 wins, 2.00x: " in out
    assert "a quarter of float32's weight bytes" in out
    assert "prefill (M = 40, N and K / 4): FP8 trails, 0.80x: " in out
    assert "a CPU has no FP8 arithmetic" in out and "bound by the BLAS rate" in out
    # the real run's footer comes from its own rows
    assert [g["regime"] for g in small_report["regimes"]] == ["decode", "prefill"]


def test_fast_reference_is_the_oracles(monkeypatch):
    """The job's G3 reference decodes by a table of the oracle's values: bitwise the oracle's result."""
    from vtnumba.testing import reference

    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, size=(5, 96), dtype=np.uint8)
    a[a & 0x7F == 0x7F] = 0  # no NaN codes: a NaN compares unequal to itself
    b = rng.integers(0, 256, size=(24, 96), dtype=np.uint8)
    b[b & 0x7F == 0x7F] = 1
    assert np.array_equal(
        cli.decode64(np.arange(256, dtype=np.uint8)), reference.decode(np.arange(256, dtype=np.uint8)), equal_nan=True
    )
    for sa, sb in (
        (np.float32(0.01), np.float32(0.02)),
        (rng.random(5, dtype=np.float32), rng.random(24, dtype=np.float32)),
    ):
        ours, theirs = cli.scaled_mm_reference(a, b, sa, sb), reference.scaled_mm(a, b, sa, sb)
        assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])


# -- the two small fixes --------------------------------------------------------------------------


def test_fp8linear_kernels_on_a_cpu_tensor_names_the_cpu_kernels():
    torch = pytest.importorskip("torch")
    import vtnumba.torch as vtt
    from vtnumba.cpu import block, gemm

    layer = vtt.Fp8Linear.from_linear(torch.nn.Linear(256, 128), "per_token")
    assert layer.kernels(torch.randn(3, 5, 256)) == (
        "cpu quantize_per_token",
        f"cpu {gemm.choose_kernel(15, 128, 256)}",
    )
    grouped = vtt.Fp8Linear.from_linear(torch.nn.Linear(256, 128), "per_group")
    assert grouped.kernels(torch.randn(2, 256)) == ("cpu quantize_per_group", f"cpu {block.choose_kernel(2, 128, 256)}")
    with pytest.raises(ValueError, match="x must be"):
        layer.kernels(torch.randn(2, 100))  # a bad input is the forward's own error, not a KeyError


def test_roofline_labels_do_not_overlap_at_m256():
    pytest.importorskip("matplotlib")
    from vtnumba import profile

    # the default job's M = 256 rows: k/v and q/o share a shape, all seven sit near the peak
    shapes = [
        ("q_proj", 1024, 1024),
        ("k_proj", 256, 1024),
        ("v_proj", 256, 1024),
        ("o_proj", 1024, 1024),
        ("gate_proj", 3584, 1024),
        ("up_proj", 3584, 1024),
        ("down_proj", 1024, 3584),
    ]
    records = []
    for i, (name, n, k) in enumerate(shapes):
        flops, moved = profile.linear_cost(256, n, k, 4, 1, 4)
        records.append(
            profile.ProfileRecord(
                f"{name} M=256", "cpu", "t", flops / (150e9 + 1e8 * i), 1.0, 1, flops=flops, bytes=moved
            )
        )
    fig = profile.roofline_plot(records, profile.Ceilings("cpu", 24.0, 190.0, "numpy sgemm 1024^3"))
    fig.draw_without_rendering()
    boxes = [t.get_window_extent() for t in fig.axes[0].texts]
    assert len(boxes) == 9  # 7 labels, the copy roof's and the peak's
    assert not [(i, j) for i in range(len(boxes)) for j in range(i) if boxes[i].overlaps(boxes[j])]
