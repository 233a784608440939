"""The mutation gate in CI: every mutation DESIGN.md lists (tools/mutations_*.toml) must compile and be
killed by the tests it names. Runs tools/mutate.py, which works on a scratch copy of the repo."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_a_toml_table_gives_the_mutations_it_lists():
    """Mutation tables as data (tools/mutate.py's docstring): defaults, then rows that override them."""
    sys.path.insert(0, str(ROOT))
    from tools.mutate import Mutation, mutations_from_toml

    rows = mutations_from_toml('''
[defaults]
path = "vtnumba/cpu/gemm.py"
tests = ["tests/test_cpu_gemm.py"]
smoke = "import vtnumba"

[[mutation]]
name = "GEMM ignores alpha"
old = "y = acc * (sa * sb)"
new = "y = acc"

[[mutation]]
name = "bias dropped"
path = "vtnumba/cpu/block.py"
old = "y += bias[n]"
new = "y += 0"
extra_edits = [["vtnumba/_format.py", "a", "b"]]
env = {NUMBA_ENABLE_CUDASIM = "1"}
''')
    assert rows == [
        Mutation(
            "GEMM ignores alpha",
            "vtnumba/cpu/gemm.py",
            "y = acc * (sa * sb)",
            "y = acc",
            ("tests/test_cpu_gemm.py",),
            "import vtnumba",
        ),
        Mutation(
            "bias dropped",
            "vtnumba/cpu/block.py",
            "y += bias[n]",
            "y += 0",
            ("tests/test_cpu_gemm.py",),
            "import vtnumba",
            (("vtnumba/_format.py", "a", "b"),),
            (("NUMBA_ENABLE_CUDASIM", "1"),),
        ),
    ]
    with pytest.raises(ValueError, match="may set path, tests, smoke and env"):
        mutations_from_toml('[defaults]\nname = "x"\n')


@pytest.mark.full
@pytest.mark.slow
def test_every_design_mutation_is_killed():
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (tools/mutate.py copies the tracked files)")
    res = subprocess.run(
        # a guard against a hang, not a budget: 92 mutations, each a scratch copy, a compile and its tests,
        # one after another (the sm_90a ones assemble six kernels each)
        [sys.executable, str(ROOT / "tools" / "mutate.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=2700,
    )
    rows = [line for line in res.stdout.splitlines() if line.startswith("| ") and not line.startswith("| mutation")]
    from tools.mutate import all_mutations

    expected = len(all_mutations())  # every table's rows: one that stopped loading would drop its rows
    assert expected >= 39 and len(rows) == expected, (
        f"expected a row for each of the {expected} mutations, found {len(rows)}:\n{res.stdout}\n{res.stderr}"
    )
    survivors = [r for r in rows if not r.rstrip().endswith("| yes |")]
    assert not survivors, "mutations not killed:\n" + "\n".join(survivors)
    assert res.returncode == 0, res.stdout + res.stderr
