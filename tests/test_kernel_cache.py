"""The on-disk kernel cache goes stale with any module of the package (vtnumba/_kernel_cache.py)."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from vtnumba import _config, _kernel_cache  # noqa: F401  (_config installs the locators)

CALLEE = """
from numba import njit
from ._config import CPU_SERIAL_KERNEL


@njit(**CPU_SERIAL_KERNEL)
def callee(x):
    return x + {step}
"""

CALLER = """
from numba import njit
from ._config import CPU_SERIAL_KERNEL
from ._probe_callee import callee


@njit(**CPU_SERIAL_KERNEL)
def caller(x):
    return callee(x) * 10
"""

RUN = "import vtnumba._probe_caller as m; print(m.caller(1), sum(m.caller.stats.cache_hits.values()))"


def _run(root):
    env = dict(os.environ, PYTHONPATH=str(root), VT_NUMBA_CACHE="1")
    env.pop("NUMBA_CACHE_DIR", None)  # the copy's own __pycache__ (Numba's in-tree locator)
    out = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, check=True, cwd=root)
    value, hits = out.stdout.split()
    return int(value), int(hits)


@pytest.mark.skipif(not _config._CACHE, reason="VT_NUMBA_CACHE=0: no disk cache to go stale")
def test_a_cached_caller_recompiles_when_only_its_callees_module_changed(tmp_path):
    """Numba links a callee's code into its caller's cache entry and keys the entry by the caller's
    own file: a copy of the package with a caller and a callee in two modules, run, then the
    callee's module edited, must give the new callee's answer (the stale entry gave the old one)."""
    package = tmp_path / "vtnumba"
    shutil.copytree(_kernel_cache.PACKAGE_ROOT, package, ignore=shutil.ignore_patterns("__pycache__", "*.nb*"))
    (package / "_probe_callee.py").write_text(textwrap.dedent(CALLEE.format(step=1)))
    (package / "_probe_caller.py").write_text(textwrap.dedent(CALLER))
    assert _run(tmp_path) == (20, 0)  # compiled, and written to the cache
    assert _run(tmp_path) == (20, 1)  # read back from the cache: the test would be vacuous otherwise
    (package / "_probe_callee.py").write_text(textwrap.dedent(CALLEE.format(step=2)))
    assert _run(tmp_path) == (30, 0)  # compiled afresh with the new callee


def test_the_stamp_covers_every_module_and_only_this_package(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    before = _kernel_cache.package_stamp(package)
    (package / "sub" / "b.py").write_text("y = 3\n")
    _kernel_cache.package_stamp.cache_clear()
    assert _kernel_cache.package_stamp(package) != before
    from numba.core import caching

    from vtnumba.cpu import experts

    locator = caching.CompileResultCacheImpl(experts._block_driver).locator
    assert type(locator).__name__.startswith("PackageStamped")
    assert locator.get_source_stamp() == _kernel_cache.package_stamp()
    outside = caching.CompileResultCacheImpl(shutil.copytree).locator  # a function of the standard library
    assert not type(outside).__name__.startswith("PackageStamped")
