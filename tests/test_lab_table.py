"""The lab's terminal table fits 80 columns: each cell the mean over its 95 % interval."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from posenc.lab import report

LENS = [64, 128, 256, 512, 1024]
LABELS = ["nope", "rope +dynamic +decoded", "learned +interpolate", "rope +linear +ft"]
CELLS = {  # what table_cells writes -> the two lines the terminal shows
    "28.35 [24.38, 33.27]": ("28.35", "24.4-33.3"),
    "312.07 [287.55, 351.12]": ("312.07", "288-351"),
    "1.23e+03 [1101.0, 1402.2]": ("1.23e+03", "1101-1402"),
    "97.5% [95.1, 99.0]": ("97.5%", "95.1-99.0"),
    "99.8% [98.2, 100.0]": ("99.8%", "98.2-100"),
    "28.35 ± 1.2": ("28.35", "±1.2"),
    "n/a": ("n/a",),
}


def _results(metric: str = "ppl") -> dict:
    config = {"eval_lens": LENS, "train_len": 64, "task": "lm"}
    return {"config": config, "metric": metric, "seeds": [0, 1, 2], "runs": [], "data": {}}


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_every_cell_fits_80_columns_unbroken(monkeypatch, cell):
    rows = [(label, [cell] * len(LENS)) for label in LABELS]
    monkeypatch.setattr(report, "table_cells", lambda results: rows)
    out = io.StringIO()
    report.print_table(_results(), Console(file=out, width=80, color_system=None))
    lines = out.getvalue().splitlines()
    assert max(map(len, lines)) <= 80, out.getvalue()
    for label in LABELS:  # row names are never cut
        assert any(label in line for line in lines), (label, out.getvalue())
    for part in CELLS[cell]:  # the mean and the interval each on one line, whole
        assert sum(line.count(part) for line in lines) == len(LABELS) * len(LENS), part
