"""posenc lab under torchrun: two CPU processes (gloo, DistributedDataParallel) write the
same results as one process.

Every process draws the same global batch and trains on its half, and the loss is
normalised by the global count of scored tokens, so the averaged gradients are the
one-process gradients up to the order of floating-point additions; after a short run
the losses agree far more closely than runs with another seed would.
"""

from __future__ import annotations

import json

import pytest

from _ranks import torchrun
from posenc import cli

OPTIONS = ["--quick", "--steps", "12", "--d-model", "16", "--heads", "2", "--eval-tokens", "256",
           "--threads", "1", "--no-progress", "--encodings", "rope,alibi"]  # fmt: skip
#: Relative tolerance on losses: far above float32 reordering after a dozen steps, far
#: below the spread between seeds.
RTOL = 1e-3


@pytest.mark.distributed
def test_two_processes_match_one(tmp_path):
    proc = torchrun(2, "-m", "posenc", "lab", *OPTIONS, "--out", str(tmp_path / "two"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("wrote ") == 1  # rank 0 alone reports and writes
    assert cli.main(["lab", *OPTIONS, "--out", str(tmp_path / "one")]) == 0

    two = json.loads((tmp_path / "two" / "results.json").read_text())
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    assert two["environment"]["processes"] == 2 and one["environment"]["processes"] == 1
    assert two["identity"] == one["identity"] and two["status"] == "complete"
    rows_two = [row for run in two["runs"] for row in run["rows"]]
    rows_one = [row for run in one["runs"] for row in run["rows"]]
    assert [r["label"] for r in rows_two] == [r["label"] for r in rows_one]
    for a, b in zip(rows_two, rows_one, strict=True):
        for length, value in a["results"].items():
            assert value["tokens"] == b["results"][length]["tokens"]
            assert value["loss"] == pytest.approx(b["results"][length]["loss"], rel=RTOL)
