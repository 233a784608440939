"""examples/profiling.ipynb is executed here (on the CPU in CI), so it cannot rot: every cell runs
without error and shows what the notebook promises (tables, a DataFrame, a roofline)."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.full  # the full tier: a kernel start and every cell, about a minute

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "profiling.ipynb"


@pytest.fixture(scope="module")
def executed():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        "the notebook is committed without outputs (outputs are made here)"
    )
    # The kernel starts in the repository root, so it imports this checkout's vtnumba.
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()
    return nb


def _outputs(nb):
    return [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.outputs]


def test_every_cell_ran_without_error(executed):
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert len(code) >= 6 and all(c.execution_count for c in code)
    errors = [o for _, o in _outputs(executed) if o.output_type == "error"]
    assert errors == [], [f"{e.ename}: {e.evalue}" for e in errors]


def test_records_show_as_html_tables(executed):
    html = [o.data["text/html"] for _, o in _outputs(executed) if "data" in o and "text/html" in o.data]
    tables = [h for h in html if "GFLOP/s" in h and h.startswith("<table>")]
    assert len(tables) >= 2  # the single record and the comparison
    comparison = max(tables, key=len)
    for name in ("fp8 M=1", "float32 M=128", "quantize_fp8 M=16"):
        assert name in comparison
    assert any("gbytes_per_s" in h for h in html)  # the pandas DataFrame


def test_roofline_is_drawn(executed):
    pngs = [o.data["image/png"] for _, o in _outputs(executed) if "data" in o and "image/png" in o.data]
    assert len(pngs) == 1 and len(pngs[0]) > 10_000  # base64 of a real figure, not an empty axes
