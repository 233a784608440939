"""Mutation testing: apply each known-bad change to a scratch copy of the repo, run the gates that
should catch it, and print mutation | compiles | tests failed | killed.

Mutations are declared as data in ``tools/mutations_*.toml`` (tables, not code: forty rows of
``Mutation(...)`` calls were the tree's most repeated code shape). A mutation replaces ``old`` (which must occur exactly once
in ``path``) by ``new``. ``smoke`` is a Python snippet run first in the mutated copy: it must
exercise the mutated kernel, so a mutation that fails to compile shows as "compiles: no" and does
not count as a kill. A TOML table::

    [defaults]                      # optional: every mutation below takes these unless it says otherwise
    path = "vtnumba/cpu/gemm.py"
    tests = ["tests/test_cpu_gemm.py"]
    smoke = "import vtnumba"         # TOML multi-line strings suit longer snippets

    [[mutation]]
    name = "GEMM ignores alpha"
    old = "y = acc * (sa * sb)"
    new = "y = acc"
    # optional: path, tests, smoke; extra_edits = [["path", "old", "new"], ...];
    # env = {NUMBA_ENABLE_CUDASIM = "1"}: set for the smoke and the tests (a GPU kernel's mutation,
    # killed by its tests under the CUDA simulator)

    python3 tools/mutate.py [--only NAME_SUBSTRING] [--markdown FILE]
"""

import argparse
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple
    smoke: str = "import vtnumba"
    extra_edits: tuple = ()  # more (path, old, new) edits for a mutation that spans two places
    env: tuple = ()  # (name, value) pairs set for the smoke and the tests

    def edits(self):
        return ((self.path, self.old, self.new),) + tuple(self.extra_edits)


def mutations_from_toml(text):
    """The ``Mutation`` rows of a TOML table (the module docstring shows the form)."""
    table = tomllib.loads(text)
    defaults = table.get("defaults", {})
    unknown = set(defaults) - {"path", "tests", "smoke", "env"}
    if unknown:
        raise ValueError(f"[defaults] may set path, tests, smoke and env, got {sorted(unknown)}")
    rows = []
    for row in table.get("mutation", []):
        fields = {**defaults, **row}
        fields["tests"] = tuple(fields["tests"])
        fields["extra_edits"] = tuple(tuple(edit) for edit in fields.get("extra_edits", ()))
        fields["env"] = tuple(sorted((str(k), str(v)) for k, v in fields.get("env", {}).items()))
        rows.append(Mutation(**fields))
    return rows


def all_mutations():
    found = []
    for file in sorted((ROOT / "tools").glob("mutations_*.toml")):
        found.extend(mutations_from_toml(file.read_text()))
    return found


def _copy_repo(dest):
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def run_one(mutation, scratch):
    originals = {}
    for path, old, new in mutation.edits():
        source = scratch / path
        text = originals.setdefault(source, source.read_text()) if source not in originals else source.read_text()
        count = text.count(old)
        if count != 1:
            for src, orig in originals.items():
                src.write_text(orig)
            raise SystemExit(f"mutation {mutation.name!r}: old text must occur once in {path}, found {count}")
        source.write_text(text.replace(old, new))
    env = dict(
        os.environ, PYTHONPATH=str(scratch), VT_NUMBA_CACHE="0", PYTHONDONTWRITEBYTECODE="1", **dict(mutation.env)
    )
    try:
        smoke = subprocess.run(
            [sys.executable, "-c", mutation.smoke], cwd=scratch, env=env, capture_output=True, text=True, timeout=600
        )
        compiles = smoke.returncode == 0
        failed = 0
        if compiles:
            res = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "-p",
                    "no:cacheprovider",
                    "--hypothesis-seed=0",
                    *mutation.tests,
                ],
                cwd=scratch,
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            tail = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
            m = re.search(r"(\d+) failed", tail)
            failed = int(m.group(1)) if m else (1 if res.returncode not in (0, 5) else 0)
            if res.returncode == 5:
                raise SystemExit(f"mutation {mutation.name!r}: its tests collected nothing")
        return compiles, failed, (smoke.stderr.strip().splitlines() or [""])[-1]
    finally:
        for source, text in originals.items():
            source.write_text(text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="")
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    mutations = [m for m in all_mutations() if args.only in m.name]
    if not mutations:
        raise SystemExit("no mutations matched")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vt-mutate-") as tmp:
        scratch = pathlib.Path(tmp)
        _copy_repo(scratch)
        for mutation in mutations:
            compiles, failed, note = run_one(mutation, scratch)
            killed = compiles and failed > 0
            rows.append(
                (mutation.name, "yes" if compiles else f"no ({note[:60]})", str(failed), "yes" if killed else "NO")
            )
            print(" | ".join(rows[-1]), flush=True)
    table = ["| mutation | compiles | tests failed (-x: stops at the first) | killed |", "|---|---|---|---|"]
    table += [f"| {' | '.join(r)} |" for r in rows]
    print("\n".join(table))
    if args.markdown:
        import datetime

        header = [
            "# Mutations the gates must kill (DESIGN.md)",
            "",
            f"Written by `python3 tools/mutate.py --markdown {args.markdown}` on "
            f"{datetime.date.today().isoformat()}: each mutation is applied to a scratch copy of the repo, "
            "a smoke call must compile it, then its gate tests run. \"killed\" = compiles and a test failed.",
            "",
        ]
        path = pathlib.Path(args.markdown)
        # sections after the table (``## ...``, written by other gates) are kept as they are
        old = path.read_text() if path.exists() else ""
        later = old[old.index("\n## ") :] if "\n## " in old else ""
        path.write_text("\n".join(header + table) + "\n" + later)
    return 0 if all(r[3] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
