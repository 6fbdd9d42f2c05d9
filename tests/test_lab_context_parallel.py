"""posenc lab --context-parallel: each training sequence split across two CPU processes
(head-tail shards, ring attention over gloo) trains as the unsplit sequence does.

Both processes draw the same global batch and hold the head-tail shard of every sequence at
its global positions; ring attention gives each shard the unsplit attention's rows and the
loss is normalised by the global token count, so the gradients are the one-process gradients
up to the order of floating-point additions. In float32, after a dozen AdamW steps the losses
agree to ``RTOL``: far above float32 reordering (~1e-6 here), far below the spread between
seeds (~1e-2).
"""

from __future__ import annotations

import json

import pytest
import torch

from _ranks import torchrun
from posenc import cli
from posenc.lab.config import LabConfig
from posenc.lab.distributed import Context
from posenc.lab.runner import _check_context_parallel

ENCODINGS = "rope,alibi,t5"  # a rotation, a fixed bias, a learned bias table
OPTIONS = ["--quick", "--steps", "12", "--d-model", "16", "--heads", "2", "--eval-tokens", "256",
           "--threads", "1", "--no-progress", "--precision", "float32",
           "--encodings", ENCODINGS]  # fmt: skip
RTOL = 1e-4


@pytest.mark.distributed
def test_split_sequences_train_as_unsplit(tmp_path):
    proc = torchrun(2, "-m", "posenc", "lab", *OPTIONS, "--context-parallel", "2",
                    "--out", str(tmp_path / "split"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert cli.main(["lab", *OPTIONS, "--out", str(tmp_path / "one")]) == 0

    split = json.loads((tmp_path / "split" / "results.json").read_text())
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    assert split["identity"] == one["identity"] and split["status"] == "complete"
    assert [r["encoding"] for r in split["runs"]] == ENCODINGS.split(",")
    for a, b in zip(split["runs"], one["runs"], strict=True):
        assert a["status"] == b["status"] == "ok", (a.get("error"), b.get("error"))
        assert a["environment"]["context_parallel"] == 2
        assert b["environment"]["context_parallel"] == 1
        curve_a, curve_b = a["train"]["curve"], b["train"]["curve"]
        assert [s for s, _ in curve_a] == [s for s, _ in curve_b]
        for (_, la), (_, lb) in zip(curve_a, curve_b, strict=True):
            assert la == pytest.approx(lb, rel=RTOL), a["encoding"]
        for row_a, row_b in zip(a["rows"], b["rows"], strict=True):
            assert row_a["label"] == row_b["label"]
            for length, value in row_a["results"].items():
                expected = row_b["results"][length]["loss"]
                assert value["loss"] == pytest.approx(expected, rel=RTOL), (row_a["label"], length)


def test_context_parallel_needs_torchrun(capsys):
    assert cli.main(["lab", "--quick", "--context-parallel", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torchrun --nproc_per_node=2" in err[0]


def test_context_parallel_must_be_positive(capsys):
    assert cli.main(["lab", "--quick", "--context-parallel", "0"]) == 2
    assert "--context-parallel must be >= 1, got 0" in capsys.readouterr().err


SPLIT = Context(rank=0, world=2, device=torch.device("cpu"), cp=2)


@pytest.mark.parametrize("name", ["cope", "fox", "stick_breaking", "path"])
def test_unsplittable_encodings_refused_before_any_run(name):
    config = LabConfig(encodings=(name,), train_len=64)
    with pytest.raises(ValueError, match=f"--context-parallel cannot train {name}: .*blocks"):
        _check_context_parallel(config, SPLIT)


def test_training_length_must_split_into_head_tail_chunks():
    four = Context(rank=0, world=4, device=torch.device("cpu"), cp=4)
    with pytest.raises(ValueError, match="train_len 60 is not a multiple of 8"):
        _check_context_parallel(LabConfig(encodings=("rope",), train_len=60), four)


def test_rows_and_shards_of_each_process():
    rows = torch.arange(8)
    # 4 processes, 2 per sequence: ranks 0, 1 share rows 0::2; ranks 2, 3 rows 1::2
    held = [Context(rank=r, world=4, cp=2).train_rows(rows).tolist() for r in range(4)]
    assert held == [[0, 2, 4, 6], [0, 2, 4, 6], [1, 3, 5, 7], [1, 3, 5, 7]]
    # evaluation stays sharded over every process
    assert [Context(rank=r, world=4, cp=2).shard(rows).tolist() for r in range(4)] == [
        [0, 4], [1, 5], [2, 6], [3, 7]
    ]  # fmt: skip
