"""The ring attention script of docs/context-parallelism.md runs as written under torchrun on
two CPU processes (its own assertions compare the ring with the unsplit layer)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _ranks import torchrun

PAGE = Path(__file__).resolve().parents[1] / "docs" / "context-parallelism.md"


def _script() -> str:
    found = re.findall(r'```py title="ring_example.py"\n(.*?)```', PAGE.read_text("utf-8"), re.S)
    assert len(found) == 1, "the page has one ring_example.py"
    return found[0]


@pytest.mark.distributed
def test_ring_example_runs_on_two_processes(tmp_path):
    script = tmp_path / "ring_example.py"
    script.write_text(_script(), encoding="utf-8")
    done = torchrun(2, str(script), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = "the ring's outputs and gradients are the unsplit layer's"
    assert all(f"rank {rank}: {said}" in done.stdout for rank in range(2)), done.stdout
