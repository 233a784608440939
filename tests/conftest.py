"""Test-suite wiring: markers decide where a test runs.

- ``gpu``: needs a real CUDA GPU with cupy; skipped here otherwise (the H200 run proves them).
- ``cudasim``: runs only in the pytest process that ``tests/test_cudasim.py`` starts with
  NUMBA_ENABLE_CUDASIM=1 (the simulator must be chosen before numba.cuda is imported).
"""

import functools
import os

import pytest

UNDER_CUDASIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


@functools.cache
def gpu_unavailable_reason():
    """None when a real GPU is usable, else why not (the library's own check, so tests skip for
    exactly the reasons a user's GPU call would fail)."""
    if UNDER_CUDASIM:
        return "running under the CUDA simulator"
    from vtnumba.cuda import gpu_unavailable_reason as library_reason

    return library_reason()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "cudasim" in item.keywords and not UNDER_CUDASIM:
            item.add_marker(pytest.mark.skip(reason="cudasim tests run in their own process (tests/test_cudasim.py)"))
        elif "cudasim" not in item.keywords and UNDER_CUDASIM:
            item.add_marker(pytest.mark.skip(reason="only cudasim tests run under the CUDA simulator"))
        elif "gpu" in item.keywords and gpu_unavailable_reason():
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {gpu_unavailable_reason()}"))


@pytest.fixture(scope="session")
def cp():
    """cupy, for the tests marked ``gpu`` (they run only where a GPU is usable)."""
    return pytest.importorskip("cupy")
