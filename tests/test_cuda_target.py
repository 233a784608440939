"""The CUDA target switch of ``vtnumba/cuda/ptx/target.py`` (VTNUMBA_CUDA_TARGET): numba-cuda unless
numba-cuda-mlir is asked for by name, and a value it does not know refused with the variable and the
value in the error. The variable is read when target.py is imported, so each case runs in a fresh
interpreter; none needs a GPU."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROBE = (
    "import json; from vtnumba.cuda.ptx import target; "
    "print(json.dumps([target.TARGET, getattr(target.cuda, '__name__', None), target.gpu_unavailable_reason()]))"
)


def _run(value, code=PROBE, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("VTNUMBA_CUDA_TARGET", "NUMBA_ENABLE_CUDASIM")}
    if value is not None:
        env["VTNUMBA_CUDA_TARGET"] = value
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value", [None, "", "numba-cuda"], ids=["unset", "empty", "named"])
def test_the_default_is_numba_cuda(value):
    done = _run(value)
    assert done.returncode == 0, done.stderr
    target, module, _ = json.loads(done.stdout.splitlines()[-1])
    assert target == "numba-cuda"
    # numba-cuda's module where it imports here (it need not: the GPU path then says why not)
    assert module in (None, "numba.cuda")


@pytest.mark.parametrize("value", ["numba-cuda-mlr", "mlir", "NUMBA-CUDA-MLIR"])
def test_an_unknown_target_is_refused_by_name(value):
    done = _run(value, "import vtnumba.cuda")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: VTNUMBA_CUDA_TARGET must be one of numba-cuda, numba-cuda-mlir"), last
    assert last.endswith(f"got {value!r}"), last


def test_numba_cuda_mlir_under_the_simulator_says_why_not():
    """numba-cuda-mlir has no simulator: the GPU path's one reason names both, and vtnumba.cuda
    still imports (nothing is compiled)."""
    done = _run("numba-cuda-mlir", NUMBA_ENABLE_CUDASIM="1")
    assert done.returncode == 0, done.stderr
    target, module, reason = json.loads(done.stdout.splitlines()[-1])
    assert (target, module) == ("numba-cuda-mlir", None)
    assert "numba-cuda-mlir (VTNUMBA_CUDA_TARGET) could not be imported" in reason
    assert "no CUDA simulator" in reason


def test_numba_cuda_mlir_where_it_is_not_installed_says_why_not():
    done = _run("numba-cuda-mlir", "import importlib.util; print(importlib.util.find_spec('numba_cuda_mlir') is None)")
    if done.stdout.strip() != "True":
        pytest.skip("numba-cuda-mlir is installed here")
    done = _run("numba-cuda-mlir")
    assert done.returncode == 0, done.stderr
    target, module, reason = json.loads(done.stdout.splitlines()[-1])
    assert (target, module) == ("numba-cuda-mlir", None)
    assert reason.startswith("numba-cuda-mlir (VTNUMBA_CUDA_TARGET) could not be imported (ModuleNotFoundError"), reason
