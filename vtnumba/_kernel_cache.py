"""What makes a kernel cached on disk stale: any module of vtnumba, not only the kernel's own file.

Numba's disk cache keys an entry by the hash of the file that defines the function. A kernel that
calls another dispatcher holds the callee's machine code too (Numba links it into the caller's
library), so when only the callee's file changed, the caller's entry still matched and ran the old
callee: the grouped MoE drivers (``cpu/experts.py``) kept running ``cpu/block.py``'s block-scaled
kernel of before an edit, about 1.7x slower, until their own file changed. The same would happen to a
user whose upgrade changed a kernel's module and not its callers'.

``install()`` puts, ahead of Numba's own locators, copies of them whose stamp for a function of this
package is one hash of every ``.py`` file in it (read once a process, at the first cached compile or
load, about 4 ms): any change to the package recompiles every cached kernel once. Functions outside
the package keep Numba's locators untouched."""

import functools
import hashlib
import pathlib

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent


@functools.cache
def package_stamp(root=PACKAGE_ROOT):
    """One hash of every ``.py`` file under ``root``: their paths relative to it and their bytes."""
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(root).rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _inside_package(py_file):
    try:
        pathlib.Path(py_file).resolve().relative_to(PACKAGE_ROOT)
    except (OSError, ValueError):
        return False
    return True


def _stamped(locator):
    """``locator`` (one of Numba's source-file locators) for this package's functions only, stamped
    with ``package_stamp()``."""

    class PackageStamped(locator):
        @classmethod
        def from_function(cls, py_func, py_file):
            if not _inside_package(py_file):
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return package_stamp()

    PackageStamped.__name__ = PackageStamped.__qualname__ = "PackageStamped" + locator.__name__
    return PackageStamped


def install():
    """Prepend the stamped locators to Numba's list (once; a Numba whose cache has no such list is
    left as it is)."""
    try:
        from numba.core import caching
    except ImportError:  # pragma: no cover - numba is a dependency
        return
    classes = getattr(caching.CacheImpl, "_locator_classes", None)
    mixin = getattr(caching, "_SourceFileBackedLocatorMixin", None)
    if not isinstance(classes, list) or mixin is None:
        return
    if any(getattr(cls, "__name__", "").startswith("PackageStamped") for cls in classes):
        return
    ours = [_stamped(cls) for cls in classes if isinstance(cls, type) and issubclass(cls, mixin)]
    classes[:0] = ours
