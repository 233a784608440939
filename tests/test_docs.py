"""The documentation stands with the code: every document the code and the docs cite exists in the
repository, every section cited by name exists in its document, every relative link in the docs
resolves, the API reference builds from the docstrings, and the public API is typed.

A citation is a file name of capital letters and underscores ending in ``.md`` (``DESIGN.md``), in
a .py, .md, .ipynb or .sh file (and .ci/run), with or without a folder in front; bare names resolve
at the repository root or under docs/, names with a folder resolve from the root or from the citing
file's folder. A section cited by name (``DESIGN.md, "NaN policy"``) must be a heading of that
document, or (for the named mutations) a phrase in one of its table rows.
"""

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import vtnumba
from vtnumba import seam

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP_DIRS = {"build", "dist", "__pycache__", "node_modules"}
CITATION = re.compile(r"(?<![\w.-])((?:[\w.-]+/)*)([A-Z][A-Z_]+\.md)\b")
DOCS_PATH = re.compile(r"(?<![\w/.-])(docs/[\w./-]*\.md)\b")
SECTION = re.compile(r"\b(DESIGN|DEVICE|ANCHORS)\.md,? \"([^\"]+)\"")
API_MODULES = [
    "vtnumba",
    "vtnumba.seam",
    "vtnumba.testing",
    "vtnumba.torch",
    "vtnumba.profile",
    "vtnumba.timing",
    "vtnumba.cuda",
]


def _source_files():
    """The repository's own text files: no virtual environment, build output or hidden folder but .ci."""
    for dirpath, dirnames, filenames in os.walk(ROOT):
        here = Path(dirpath)
        dirnames[:] = [
            d
            for d in dirnames
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and (not d.startswith(".") or d == ".ci")
            and not (here / d / "pyvenv.cfg").exists()
        ]
        for name in filenames:
            if name.endswith((".py", ".md", ".ipynb", ".sh")) or (here.name == ".ci" and name == "run"):
                yield here / name


def _citations():
    found = []
    for path in _source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in CITATION.finditer(text):
            found.append((path, m.group(1) + m.group(2)))
        for m in DOCS_PATH.finditer(text):
            found.append((path, m.group(1)))
    return found


def _resolves(cited, citing_file):
    if "/" not in cited:
        return (ROOT / cited).is_file() or (DOCS / cited).is_file()
    return (ROOT / cited).is_file() or (citing_file.parent / cited).is_file()


def test_every_cited_document_exists():
    citations = _citations()
    # non-vacuous: the code cites the contract dozens of times, and the three docs are among them
    assert len(citations) > 50, citations
    assert {"DESIGN.md", "DEVICE.md", "ANCHORS.md"} <= {Path(c).name for _, c in citations}
    missing = sorted({(str(p.relative_to(ROOT)), c) for p, c in citations if not _resolves(c, p)})
    assert not missing, f"cited documents not in the repository (file, citation): {missing}"


def _headings(path):
    return [line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]


def test_every_cited_section_exists():
    cited = []
    for path in _source_files():
        for m in SECTION.finditer(path.read_text(encoding="utf-8", errors="replace")):
            cited.append((path, m.group(1), m.group(2)))
    assert len(cited) >= 8, cited  # "NaN policy", "per-group activations", ... are cited by name
    missing = []
    for path, doc, section in cited:
        section = " ".join(section.split()).lower()  # a citation may wrap across lines
        lines = (DOCS / f"{doc}.md").read_text().lower().splitlines()
        heads = [h.lower() for h in _headings(DOCS / f"{doc}.md")]
        rows = [" ".join(line.split()) for line in lines if line.startswith("|")]  # the mutations' table
        if section not in heads and not any(section in row for row in rows):
            missing.append((str(path.relative_to(ROOT)), f"{doc}.md", section))
    assert not missing, f"sections cited by name that are not headings of their document: {sorted(set(missing))}"


def _slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")


def test_relative_links_in_the_docs_resolve():
    pages = sorted(DOCS.glob("*.md")) + [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    checked = 0
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            checked += 1
            if not dest.exists():
                broken.append((page.name, target))
            elif anchor and dest.suffix == ".md" and anchor not in {_slug(h) for h in _headings(dest)}:
                broken.append((page.name, target))
    assert checked > 20, checked
    assert not broken, f"links that lead nowhere (page, link): {broken}"


@pytest.mark.full
def test_the_api_reference_builds_and_holds_the_public_api(tmp_path):
    """pdoc imports every public module and renders its docstrings; a warning (a module that fails
    to import, a docstring it cannot place) is an error here."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-m", "pdoc", *API_MODULES, "-o", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pages = {"vtnumba": vtnumba.__all__, "vtnumba/seam": seam.__all__}
    for page, names in pages.items():
        html = (tmp_path / f"{page}.html").read_text()
        missing = [n for n in names if f'id="{n}"' not in html]
        assert not missing, f"{page}: public names missing from the reference: {missing}"
    assert len(vtnumba.__all__) + len(seam.__all__) > 25
    for module in API_MODULES[2:]:
        assert (tmp_path / (module.replace(".", "/") + ".html")).is_file(), module
    # the contract's own words reach the reader: scaled_mm's docstring, and the group-size note
    html = (tmp_path / "vtnumba.html").read_text()
    assert "Raw codes and a raw" in html and "carry no group size" in html


def _public_callables():
    """(qualified name, function) for every public function and public method of a public class of
    vtnumba and vtnumba.seam."""
    for module in (vtnumba, seam):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                if issubclass(obj, Exception) or isinstance(obj, type) and issubclass(obj, str):
                    continue  # enums of strings
                for attr, value in vars(obj).items():
                    if attr.startswith("_") and attr not in ("__init__", "__new__"):
                        continue
                    if isinstance(value, (classmethod, staticmethod)):
                        value = value.__func__
                    if isinstance(value, property):
                        yield f"{name}.{attr}", value.fget
                    elif inspect.isfunction(value):
                        if attr == "__init__" and getattr(value, "__module__", "") != obj.__module__:
                            continue
                        yield f"{name}.{attr}", value
            elif callable(obj):
                yield name, obj


# Public functions whose modules this change could not edit (seam/matmul.py and _config.py belong to
# other work in flight): typed there, they leave this set, and the test then holds them too.
NOT_YET_TYPED = set()


def test_the_public_api_is_typed():
    assert (Path(vtnumba.__file__).parent / "py.typed").is_file()
    seen, untyped = 0, []
    for qualname, fn in _public_callables():
        sig = inspect.signature(fn)
        params = [
            p
            for p in sig.parameters.values()
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
        if sig.return_annotation is inspect.Signature.empty and not qualname.endswith(".__init__"):
            missing.append("return")
        if missing:
            untyped.append((qualname, missing))
        seen += 1
    assert seen > 40, seen
    untyped = [u for u in untyped if u[0] not in NOT_YET_TYPED]
    assert not untyped, f"public callables without type hints (name, what lacks one): {untyped}"


def test_pyproject_ships_the_license_and_the_type_marker():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^license = "Apache-2.0"$', text, re.M) and 'license-files = ["LICENSE"]' in text
    assert re.search(r'^vtnumba = \["py.typed"\]', text, re.M)
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text and len(license_text) > 10_000


def test_the_readme_names_every_option_of_the_main_command():
    proc = subprocess.run(
        [sys.executable, "-m", "vtnumba", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert proc.returncode == 0, proc.stderr
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", proc.stdout)) - {"--help"}
    assert {"--device", "--scheme", "--no-progress", "--skip-selfcheck"} <= options, options
    guide = (DOCS / "GUIDE.md").read_text()  # the README's tour points here for the main command's options
    missing = sorted(o for o in options if f"`{o}" not in guide)
    assert not missing, f"options of python -m vtnumba docs/GUIDE.md does not name: {missing}"
    assert "VT_NUMBA_CACHE" in guide and "docs/GUIDE.md" in (ROOT / "README.md").read_text()


def test_ci_runs_both_readme_commands():
    """The README's two commands, and CI running each in a fresh virtual environment (.ci/run)."""
    readme = (ROOT / "README.md").read_text()
    assert "python3 -m pip install . && python3 -m vtnumba " in readme
    assert 'python3 -m pip install ".[test]" && python3 -m pytest -q ' in readme
    ci = (ROOT / ".ci" / "run").read_text()
    steps = [line.strip() for line in ci.splitlines() if not line.lstrip().startswith("#")]
    assert 'python -m pip install -q "$ROOT" && python -m vtnumba' in steps
    assert 'python -m pip install -q ".[test]" && python -m pytest -q' in steps
    assert ci.count("-m venv ") == 2 and '[ "$rc" -eq 5 ]' in ci and '"$main_rc" -ne 0' in ci
    # the full tier runs too, in two processes whose exit 5 (no tests) fails the run as well
    assert "python -m pytest -q -m full" in ci and '[ "$tier_rc" -eq 5 ]' in ci
    assert "python3 -m pytest -q -m full" in readme
