"""Hostile sweep files and output folders for ``posenc lab``: bounds named before anything
is built, every setting checked before the first trains, FIFOs never opened, a user's
folder never written into, a run record's weights kept inside its folder, the paths of
undecodable files and failed writes named."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import posenc.lab.results
from _lab_helpers import within
from posenc import cli
from posenc.commands.lab import config_from_args
from posenc.lab.config import LIMITS, TASKS, LabConfig
from posenc.lab.results import finished_runs, write_bytes
from posenc.lab.sweepfile import load_sweep

#: A sweep that trains in a second or two.
TINY = (
    'quick = true\nencodings = ["nope"]\nsteps = 3\nd_model = 16\nheads = 2\n'
    "eval_tokens = 128\nscalings = []\nfinetune_steps = 0\nno_progress = true\n"
    "threads = 1\njobs = 1\n"
)


def _sweep(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def _refused(capsys, *args: str) -> str:
    assert cli.main(["lab", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("posenc: error: "), err
    return err


@pytest.mark.parametrize(
    ("line", "bound"),
    [("seeds = 1000000000", "number of seeds must be <= 1000"),
     ("layers = 100000000", "must be <= 64 "),
     ("batch_size = 1000000000", "must be <= 65536 "),
     ("seeds = [18446744073709551616]", f"must be <= {LIMITS['seed']} "),
     ("seed = 9223372036854775807", f"must be <= {LIMITS['seed']} "),
     ("--d-model 100000000", "must be <= 8192 "),
     ("--d-model 8192 --layers 64", "block parameters must be <= ")],
)  # fmt: skip
def test_sizes_past_the_lab_bounds_are_refused_before_any_file(tmp_path, capsys, line, bound):
    flags = line.split() if line.startswith("--") else []
    sweep = _sweep(tmp_path, TINY + ("" if flags else line + "\n"))
    out = tmp_path / "out"
    with within(30):
        err = _refused(capsys, "--config", str(sweep), "--out", str(out), *flags)
    assert bound in err and "the lab's bound" in err
    assert not out.exists()


def test_a_bad_second_setting_is_refused_before_the_first_trains(tmp_path, capsys):
    for bad in ("steps = -5", 'encodings = ["zzz"]', "layers = 100000",
                f"corpus = {json.dumps(str(tmp_path / 'missing.txt'))}",
                "eval_lens = [64, 1000000]"):  # fmt: skip
        sweep = _sweep(
            tmp_path, TINY + f'[[settings]]\nname = "a"\n[[settings]]\nname = "b"\n{bad}\n'
        )
        out = tmp_path / "out"
        err = _refused(capsys, "--config", str(sweep), "--out", str(out))
        assert "setting 'b'" in err
        assert not out.exists()


def test_sweep_file_encodings_and_kinds(tmp_path, capsys):
    text, settings = load_sweep(_sweep(tmp_path, "\ufeff" + TINY))  # a byte-order mark
    assert not text.startswith("\ufeff") and settings[0][1]["steps"] == 3
    bad = _sweep(tmp_path, b"steps = 3\n# \xff\xfe\n")
    err = _refused(capsys, "--config", str(bad), "--out", str(tmp_path / "o"))
    assert str(bad) in err and "not UTF-8" in err
    deep = _sweep(tmp_path, "a = " + "[" * 5000 + "]" * 5000 + "\n")
    err = _refused(capsys, "--config", str(deep), "--out", str(tmp_path / "o"))
    assert str(deep) in err and "nests too deeply" in err
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with within(10):
        err = _refused(capsys, "--config", str(fifo), "--out", str(tmp_path / "o"))
    assert str(fifo) in err and "not a regular file" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["Thorough", "thorugh", ""])
def test_a_sweep_files_profile_must_be_a_profile(tmp_path, capsys, value):
    """It ran the default budget and recorded "default" (the command line refused it)."""
    sweep = _sweep(tmp_path, TINY + f"profile = {json.dumps(value)}\n")
    err = _refused(capsys, "--config", str(sweep), "--out", str(tmp_path / "o"))
    assert str(sweep) in err and f"got {value!r}" in err and "default, thorough" in err
    assert not (tmp_path / "o").exists()


#: A task's tiny sweep (text's ``eval_tokens`` left out: a task refuses it).
TASK = TINY.replace("eval_tokens = 128", 'task = "copy"\ntrain_len = 8\neval_lens = [8]')


@pytest.mark.parametrize(
    ("text", "words"),
    [(TINY + "passkey_key_len = 3\n", "--passkey-key-len applies to --task passkey only"),
     (TINY + "eval_examples = 8\n", "--eval-examples applies to --task copy, reverse, recall"),
     (TASK + "eval_tokens = 256\n", "--eval-tokens applies to text (task lm) only, not to task"),
     (TASK + 'corpus = "fortunes"\n', "--corpus applies to text (task lm) only"),
     (TASK + "eval_stride = 4\n", "--eval-stride applies to text"),
     (TASK + "plateau_eps = 0.1\n", "--plateau-eps applies to text"),
     (TASK.replace('"copy"', '"recall"') + "passkey_key_len = 3\n", "not to task 'recall'")],
)  # fmt: skip
def test_an_option_for_another_task_is_refused_by_name(tmp_path, capsys, text, words):
    """``passkey_key_len`` with text was ignored without a word."""
    err = _refused(capsys, "--config", str(_sweep(tmp_path, text)), "--out", str(tmp_path / "o"))
    assert words in err
    assert not (tmp_path / "o").exists()
    passkey = ["--task", "passkey", "--passkey-key-len", "3", "--eval-examples", "8"]
    config = config_from_args(cli.build_parser().parse_args(["lab", *passkey]))
    assert config.passkey_key_len == 3 and config.eval_examples == 8


def test_every_task_takes_the_options_of_its_kind():
    def parse(*options: str) -> LabConfig:
        return config_from_args(cli.build_parser().parse_args(["lab", *options]))

    for task in TASKS[1:]:
        assert parse("--task", task, "--eval-examples", "8").eval_examples == 8
    assert parse("--eval-tokens", "64", "--eval-stride", "16").eval_tokens == 64


@pytest.mark.parametrize(
    ("options", "words"),
    [(["--config", "position"], "; did you mean 'positions'?"),
     (["--config", "Positons.toml"], "and no shipped sweep of that name (shipped: "),
     (["--corpus", "fortune"], "--corpus 'fortune' does not exist; did you mean 'fortunes'?"),
     (["--corpus", "STDLIB"], "did you mean 'stdlib'?")],
)  # fmt: skip
def test_a_near_miss_of_a_shipped_sweep_or_corpus_gets_a_hint(tmp_path, capsys, options, words):
    err = _refused(capsys, *options, "--out", str(tmp_path / "o"))
    assert words in err
    assert not (tmp_path / "o").exists()


def test_an_existing_folder_without_a_run_record_is_never_written(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my own report")
    (mine / ".notes.tmp").write_text("my notes")
    sweep = _sweep(tmp_path, TINY + f"out = {json.dumps(str(mine))}\n")
    err = _refused(capsys, "--config", str(sweep))
    assert str(mine) in err and "no posenc run record" in err
    assert sorted(p.name for p in mine.iterdir()) == [".notes.tmp", "report.md"]
    assert (mine / "report.md").read_text() == "my own report"
    empty = tmp_path / "empty"  # an empty folder is a new run's folder
    empty.mkdir()
    assert cli.main(["lab", "--config", str(sweep), "--out", str(empty)]) == 0
    assert (empty / "results.json").is_file()


def _record(out: Path, weights: str) -> None:
    (out / "runs").mkdir(parents=True, exist_ok=True)
    record = {"encoding": "nope", "seed": 0, "status": "ok", "rows": [], "identity": "id",
              "weights": weights}  # fmt: skip
    (out / "runs" / "nope-s0.json").write_text(json.dumps(record))


def test_a_run_records_weights_stay_inside_its_folder_and_are_regular_files(tmp_path):
    out = tmp_path / "out"
    outside = tmp_path / "elsewhere.pt"
    outside.write_bytes(b"not read")
    for weights in (str(outside), "../elsewhere.pt", "runs/../../elsewhere.pt"):
        _record(out, weights)
        with pytest.raises(ValueError, match="weights must be a path inside"):
            finished_runs(out, "id", metric="ppl")
    os.mkfifo(out / "runs" / "nope-s0.pt")
    _record(out, "runs/nope-s0.pt")
    with within(10), pytest.raises(ValueError, match="not a regular file"):
        finished_runs(out, "id", metric="ppl")
    (out / "runs" / "nope-s0.pt").unlink()
    assert finished_runs(out, "id", metric="ppl") == {}  # missing weights: the run is done again


def test_a_failed_write_names_its_path(tmp_path, monkeypatch):
    class Full:
        def __init__(self, fd, mode):
            os.close(fd)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(posenc.lab.results.os, "fdopen", Full)
    path = tmp_path / "results.json"
    with pytest.raises(OSError) as caught:
        write_bytes(path, b"{}")
    assert caught.value.filename == str(path)
    line = cli.error_line(caught.value)
    assert str(path) in line and "disk full" in line
    assert list(tmp_path.iterdir()) == []  # no temporary file left


def test_limits_hold_for_the_config_itself():
    for name, value in (("num_layers", 65), ("num_heads", 257), ("batch_size", 1 << 17)):
        with pytest.raises(ValueError, match=f"{name} must be <= "):
            LabConfig(**{name: value})
    with pytest.raises(ValueError, match="number of seeds must be <= 1000"):
        LabConfig(seeds=tuple(range(1001)))
