"""The backend contract (``vtnumba.ops.Backend``): both backends implement every function the op
boundary calls, with the protocol's parameters, and no backend reaches back up into ``ops``."""

import inspect
import pathlib
import re

import pytest

import vtnumba
from vtnumba import ops

ROOT = pathlib.Path(vtnumba.__file__).parent
PROTOCOL_FUNCTIONS = [
    name for name, value in vars(ops.Backend).items() if inspect.isfunction(value) and not name.startswith("_")
]


def _positional(fn, skip_self=False):
    params = list(inspect.signature(fn).parameters.values())[1 if skip_self else 0 :]
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


@pytest.mark.parametrize("module_name", ["vtnumba.cpu", "vtnumba.cuda"])
def test_each_backend_satisfies_the_protocol(module_name):
    import importlib

    module = importlib.import_module(module_name)  # importing the GPU backend needs no GPU
    assert isinstance(module, ops.Backend)
    assert len(PROTOCOL_FUNCTIONS) >= 8, PROTOCOL_FUNCTIONS
    for name in PROTOCOL_FUNCTIONS:
        want = _positional(getattr(ops.Backend, name), skip_self=True)
        assert _positional(getattr(module, name)) == want, f"{module_name}.{name}"


def test_every_backend_call_the_boundary_makes_is_in_the_protocol():
    source = (ROOT / "ops.py").read_text()
    called = set(re.findall(r"(?:impl|backend\(device\))\.(\w+)\(", source))
    assert called, "found no backend call in ops.py"
    assert called <= set(PROTOCOL_FUNCTIONS), called - set(PROTOCOL_FUNCTIONS)


@pytest.mark.parametrize("package", ["cpu", "cuda"])
def test_no_backend_imports_the_op_boundary(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    imports_ops = re.compile(
        r"^\s*(from \.\.(ops)? import .*\bops\b|from \.\.ops\b|import vtnumba\.ops\b|"
        r"from vtnumba(\.ops)? import .*\bops\b|from vtnumba\.ops\b|.*import_module\(.*ops)",
        re.M,
    )
    for path in files:
        assert not imports_ops.search(path.read_text()), path.name
