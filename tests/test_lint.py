"""The tree stays clean under the checkers pyproject.toml configures: ruff's lint and its formatter
over the repository, mypy over the package. Each runs as the command a contributor would type, from
the repository root."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv):
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("argv", [("ruff", "check", "."), ("ruff", "format", "--check", ".")])
def test_ruff_is_clean(argv):
    pytest.importorskip("ruff")
    proc = _run(*argv)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # it looked at the tree: ruff names how many files it checked or formatted, or says all passed
    assert "All checks passed" in proc.stdout or "already formatted" in proc.stdout


def test_mypy_is_clean():
    pytest.importorskip("mypy")
    proc = _run("mypy")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    checked = [line for line in proc.stdout.splitlines() if line.startswith("Success: no issues found in")]
    assert checked and int(checked[0].split()[5]) > 50, proc.stdout  # the whole package, not a few files
