"""examples/tour.ipynb: committed with its outputs stripped, and it runs end to end.

The end-to-end run is slow-marked (3 minutes at the small budget set here on a 2-core AVX2 machine
with one thread and another job on the other core; 4-22 minutes at the notebook's own budget) and
needs `nbclient` (with `nbformat` and `ipykernel`), which is not a dependency of rltok: without them
the test is skipped.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import C4

REPO = Path(__file__).resolve().parents[1]
TOUR = REPO / "examples" / "tour.ipynb"

# small enough for a test, large enough for every cell to have something to show: 4 optimizer
# steps of the tiny preset (16 sequences x 512 bytes each) per method
SMALL = {"BYTES": 4 * 16 * 512, "EVAL_DOCS": 8}


def _cells() -> list[dict]:
    return json.loads(TOUR.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    s = cell["source"]
    return s if isinstance(s, str) else "".join(s)


def test_tour_is_committed_with_outputs_stripped():
    nb = json.loads(TOUR.read_text(encoding="utf-8"))  # valid JSON
    assert nb["nbformat"] == 4
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, "the tour has no code cells"
    for c in code:
        assert c.get("outputs") == [], f"outputs left in cell: {_source(c)[:60]!r}"
        assert c.get("execution_count") is None, f"execution count left in cell: {_source(c)[:60]!r}"


def test_tour_budget_is_a_parameter_at_the_top():
    """The first code cell, tagged `parameters`, holds the budget the slow test overrides."""
    first = next(c for c in _cells() if c["cell_type"] == "code")
    assert "parameters" in first.get("metadata", {}).get("tags", [])
    src = _source(first)
    for name in ("BYTES", "EVAL_DOCS", "DATA", "OUT"):
        assert re.search(rf"^{name} = ", src, re.M), name


@pytest.mark.slow
def test_tour_runs_end_to_end(tmp_path, c4_or_stdlib):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(TOUR, as_version=4)
    params = next(c for c in nb.cells if c.cell_type == "code")
    # the notebook's own assignments stay; these come after them and win
    params.source += "\n" + "\n".join([*(f"{k} = {v!r}" for k, v in SMALL.items()),
                                       f"DATA = {c4_or_stdlib!r}", f"OUT = {str(tmp_path / 'runs')!r}"])
    t = time.time()
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO / "examples")}}).execute()
    took = time.time() - t
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                     if o.get("output_type") == "stream")
    html = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "text/html" in o.get("data", {})]
    assert (tmp_path / "runs" / "rl" / "summary.json").is_file()
    assert (tmp_path / "runs" / "uniform" / "summary.json").is_file()
    assert len(html) >= 3 and "iframe" in html[0]["data"]["text/html"], "boundary pictures missing"
    assert re.search(r"rl - uniform: [+-]\d\.\d{4} ± \d\.\d{4} bits/byte", text), text[-2000:]
    assert "cached decoding:" in text and "same bytes: True" in text, text[-2000:]
    print(f"tour notebook: {took:.0f} s at BYTES={SMALL['BYTES']}")


@pytest.fixture
def c4_or_stdlib() -> str:
    """The C4 sample where ../shared has it (the notebook's own first choice), else the built-in
    `stdlib` corpus, which needs no network."""
    return str(C4) if C4.is_file() else "stdlib"
