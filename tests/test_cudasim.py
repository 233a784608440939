"""Runs the ``cudasim`` tests in their own pytest process under NUMBA_ENABLE_CUDASIM=1.

The simulator must be chosen before numba.cuda is imported, so it cannot run inside this process.
The child's summary line must report passed tests: a run that collected nothing (or skipped
everything) fails here instead of passing vacuously.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.full
def test_cudasim_suite_passes():
    env = dict(
        os.environ,
        NUMBA_ENABLE_CUDASIM="1",
        PYTHONPATH=os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
    )
    # The child runs every simulator test on one core (about 25 minutes on the 2-core CI machine);
    # the limit only catches a hang, and leaves the whole CI run inside its 90 minutes.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "cudasim", "-p", "no:cacheprovider", "tests/"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, f"simulator tests failed (exit {proc.returncode}):\n{tail}"
    summary = re.search(r"(\d+) passed", proc.stdout.splitlines()[-1] if proc.stdout else "")
    assert summary and int(summary.group(1)) > 0, f"the simulator run passed no test:\n{tail}"
    assert " failed" not in proc.stdout.splitlines()[-1]
