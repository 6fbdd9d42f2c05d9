"""What a resumed ``posenc lab`` reads back from its folder: every file is read only when
it is a regular file (a FIFO never blocks the sweep), and a damaged run record is named
in one line, file and field, before the statistics read it."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import posenc.lab.results
from _lab_helpers import one_line
from posenc import cli
from posenc.lab.records import check_header, check_run
from posenc.lab.results import finished_runs, read_regular
from posenc.lab.runs import _read_round

RECORDED = Path(__file__).resolve().parents[1] / "runs-recorded"
#: A text sweep that trains in a second or two (with sliding windows: every field).
TEXT = ["--quick", "--encodings", "nope", "--steps", "3", "--d-model", "16", "--heads", "2",
        "--eval-tokens", "128", "--eval-stride", "16", "--scalings", "--finetune-steps", "0",
        "--threads", "1", "--jobs", "1", "--no-progress"]  # fmt: skip
#: A task that trains in rounds (so it keeps a round snapshot while it runs).
TASK = ["--quick", "--task", "copy", "--encodings", "alibi", "--train-len", "8", "--eval-lens",
        "8", "--steps", "4", "--max-steps", "8", "--d-model", "16", "--heads", "2",
        "--eval-examples", "8", "--threads", "1", "--jobs", "1", "--no-progress"]  # fmt: skip


# ----------------------------------------------------------------------------- regular files


def _soon(call: Callable[[], object], seconds: float = 60) -> object:
    """``call()``'s value (or its exception), failing instead of hanging when it has not
    returned within ``seconds``: a FIFO opened for reading waits for a writer forever,
    and an alarm signal does not interrupt every such wait."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def test_read_regular_reads_files_and_refuses_everything_else(tmp_path):
    text = tmp_path / "a.json"
    text.write_bytes(b"{}")
    link = tmp_path / "link.json"
    link.symlink_to(text)
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    fifo_link = tmp_path / "fifo-link.pt"
    fifo_link.symlink_to(fifo)
    assert read_regular(text) == b"{}" == read_regular(link)
    for path in (fifo, fifo_link, tmp_path, Path(os.devnull)):
        with pytest.raises(ValueError, match="is not a regular file"):
            _soon(lambda path=path: read_regular(path), 10)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing")


def test_a_fifo_swapped_in_after_the_check_is_not_waited_on(tmp_path, monkeypatch):
    """Between ``stat`` and ``open`` a file can become a FIFO: the open does not block
    and the descriptor's own type refuses it."""
    fifo = tmp_path / "swapped.pt"
    os.mkfifo(fifo)
    real = os.stat

    def says_regular(path, *args, **kwargs):
        found = real(path, *args, **kwargs)
        if Path(path) == fifo:
            return os.stat_result((0o100644, *tuple(found)[1:]))
        return found

    monkeypatch.setattr(posenc.lab.results.os, "stat", says_regular)
    with pytest.raises(ValueError, match="is not a regular file"):
        _soon(lambda: read_regular(fifo), 10)


def test_a_round_snapshot_that_is_a_fifo_never_blocks(tmp_path, capsys):
    """An interrupted task run left ``runs/<stem>.round.pt``; a FIFO put there is named
    when the sweep resumes (it was opened by ``torch.load`` and waited forever), and
    the reader itself never waits on one."""
    out = tmp_path / "out"
    assert cli.main(["lab", *TASK, "--out", str(out)]) == 0
    for name in ("alibi-s0.json", "alibi-s0.pt"):
        (out / "runs" / name).unlink()
    rounds = out / "runs" / "alibi-s0.round.pt"
    os.mkfifo(rounds)
    capsys.readouterr()
    assert _soon(lambda: _read_round(rounds, "any")) is None
    assert _soon(lambda: cli.main(["lab", *TASK, "--out", str(out)])) == 2
    one_line(capsys, str(rounds), "not a regular file")
    rounds.unlink()
    rounds.write_bytes(b"truncated")  # garbled (an IndexError in the unpickler): starts over
    assert cli.main(["lab", *TASK, "--out", str(out)]) == 0
    assert not rounds.exists()


# ----------------------------------------------------------------------------- run records


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A folder holding one finished text run."""
    out = tmp_path_factory.mktemp("finished")
    assert cli.main(["lab", *TEXT, "--out", str(out)]) == 0
    return out


def test_the_records_the_lab_writes_pass(finished):
    record = json.loads((finished / "runs" / "nope-s0.json").read_text())
    assert "segments" in record["rows"][0]["results"]["64"]["sliding"]
    runs = finished_runs(finished, record["identity"], metric="ppl")
    assert list(runs) == [("nope", 0)]


def _set(*where: object, value: object) -> Callable[[dict], None]:
    def damage(record: dict) -> None:
        inner = record
        for key in where[:-1]:
            inner = inner[key]
        inner[where[-1]] = value

    return damage


def _drop(*where: object) -> Callable[[dict], None]:
    def damage(record: dict) -> None:
        inner = record
        for key in where[:-1]:
            inner = inner[key]
        del inner[where[-1]]

    return damage


DAMAGES = [
    (_drop("rows", 0, "label"), "rows[0].label is missing"),
    (_set("rows", 0, "results", "32", value={"loss": math.nan}), "results['32'].ppl is missing"),
    (_set("environment", value="x"), "environment must be an object, got 'x'"),
    (_set("rows", value=[1]), "rows[0] must be an object, got 1"),
    (_set("rows", 0, "kind", value=None), "rows[0].kind must be a string, got None"),
    (_set("rows", 0, "results", "32", "segments", value=["a"]), ".segments[0] must be a number"),
    (_set("rows", 0, "notes", value={"64": 3}), "rows[0].notes['64'] must be a string"),
    (_set("train", "curve", value=[[1]]), "train.curve[0] must be a [step, value] pair"),
    (_set("environment", "precision", value=[1]), "environment['precision'] must be a string"),
    (_set("seed", value="0"), "seed must be an integer, got '0'"),
    (_set("weights", value=3), "weights must be a string, got 3"),
]  # fmt: skip


@pytest.mark.parametrize(("damage", "words"), DAMAGES)
def test_a_damaged_run_record_is_named_by_file_and_field(finished, tmp_path, damage, words):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    path = out / "runs" / "nope-s0.json"
    record = json.loads(path.read_text())
    damage(record)
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError) as caught:
        finished_runs(out, record.get("identity"), metric="ppl")
    message = str(caught.value)
    assert repr(str(path)) in message and words in message, message
    assert "\n" not in message


def test_a_damaged_run_record_ends_the_command_inone_line(finished, tmp_path, capsys):
    """The record of the report's statistics (``KeyError: 'label'`` in pairwise.py, a
    traceback, before): one line naming the file and the field, exit 2."""
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    path = out / "runs" / "nope-s0.json"
    record = json.loads(path.read_text())
    del record["rows"][0]["label"]
    path.write_text(json.dumps(record))
    capsys.readouterr()
    assert cli.main(["lab", *TEXT, "--out", str(out)]) == 2
    one_line(capsys, str(path), "rows[0].label is missing")
    path.write_text(path.read_text()[:-40])  # truncated
    assert cli.main(["lab", *TEXT, "--out", str(out)]) == 2
    one_line(capsys, str(path), "not valid JSON")


def test_a_task_record_says_how_it_was_trained():
    record = {"encoding": "rope", "seed": 0, "status": "ok", "rows": [], "learned": True,
              "steps_to_learn": 40, "train": {"steps": 40, "max_steps": 80, "check_every": 10,
                                              "learned_at": 0.9}}  # fmt: skip
    check_run(record, Path("r.json"), "accuracy")
    for key in ("max_steps", "check_every", "learned_at", "steps"):
        damaged = copy.deepcopy(record)
        del damaged["train"][key]
        with pytest.raises(ValueError, match=rf"train\.{key} is missing"):
            check_run(damaged, Path("r.json"), "accuracy")
    with pytest.raises(ValueError, match="learned is missing"):
        check_run(_without(record, "learned"), Path("r.json"), "accuracy")
    row = {"label": "rope", "kind": "trained", "results": {"16": {"ppl": 3.0}}, "notes": {}}
    with pytest.raises(ValueError, match=r"rows\[0\]\.results\['16'\]\.accuracy is missing"):
        check_run({**record, "rows": [row]}, Path("r.json"), "accuracy")


def _without(record: dict, key: str) -> dict:
    return {k: v for k, v in record.items() if k != key}


def test_every_recorded_run_is_a_valid_record():
    """The records the lab wrote (every recorded sweep) pass the check: it refuses damage,
    not a field the lab writes."""
    checked = 0
    for path in sorted(RECORDED.glob("*/results.json")):
        results = json.loads(path.read_text())
        for record in results["runs"]:
            check_header(record, path)
            if record["status"] in posenc.lab.results.FINISHED:
                check_run(record, path, results["metric"])
                checked += 1
    assert checked >= 100
