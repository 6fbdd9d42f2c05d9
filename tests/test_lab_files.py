"""posenc lab's output folder and command line: sweep files, resume checks, bad files,
file-system errors, partial and empty sweeps, and the option help."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import posenc.lab.results
from _lab_helpers import Interrupt, NaNInput, one_line, registered
from posenc import cli

TINY = ["--quick", "--steps", "6", "--d-model", "16", "--heads", "2", "--eval-tokens", "128",
        "--threads", "1", "--no-progress"]  # fmt: skip


def lab(out: Path, *options: str) -> int:
    return cli.main(["lab", *TINY, "--out", str(out), *options])


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


# ----------------------------------------------------------------------------- sweep files


def test_sweep_file_reruns_bit_for_bit_and_settings_get_folders(tmp_path, capsys):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('encodings = ["rope"]\nseeds = [3, 4]\nsteps = 5\n"eval-tokens" = 128\n')
    base = ["lab", "--quick", "--d-model", "16", "--heads", "2", "--threads", "1",
            "--no-progress"]  # fmt: skip
    assert cli.main([*base, "--config", str(sweep), "--out", str(tmp_path / "a")]) == 0
    saved = tmp_path / "a" / "sweep.toml"
    assert saved.read_text() == sweep.read_text()
    assert cli.main([*base, "--config", str(saved), "--out", str(tmp_path / "b")]) == 0
    first, second = results(tmp_path / "a"), results(tmp_path / "b")
    assert first["seeds"] == [3, 4] and first["config"]["steps"] == 5
    for one, two in zip(first["runs"], second["runs"], strict=True):  # all but wall times
        assert one["rows"] == two["rows"] and one["weights"] == two["weights"]
        assert one["train"]["curve"] == two["train"]["curve"]

    sweep.write_text(
        'encodings = ["t5"]\nsteps = 4\n"eval-tokens" = 128\n'
        '[[settings]]\nname = "near"\nt5-max-distance = 32\n'
        '[[settings]]\nname = "far"\nt5_max_distance = 128\n'
    )
    assert cli.main([*base, "--config", str(sweep), "--out", str(tmp_path / "c")]) == 0
    near, far = results(tmp_path / "c" / "near"), results(tmp_path / "c" / "far")
    assert near["config"]["t5_max_distance"] == 32 and far["config"]["t5_max_distance"] == 128
    capsys.readouterr()
    sweep.write_text("stepz = 4\n")
    assert cli.main([*base, "--config", str(sweep), "--out", str(tmp_path / "d")]) == 2
    one_line(capsys, "unknown option 'stepz'", str(sweep))
    sweep.write_text("steps = 'many'\n")
    assert cli.main([*base, "--config", str(sweep), "--out", str(tmp_path / "d")]) == 2
    one_line(capsys, "must be int")


# ----------------------------------------------------------------------------- resume


def test_resume_checks_files_and_reports_only_what_was_asked(tmp_path, capsys):
    assert lab(tmp_path, "--encodings", "nope,alibi") == 0
    runs = tmp_path / "runs"
    stale = runs / ".nope-s0.json.abc.tmp"
    stale.write_text("{")
    (runs / "alibi-s0.pt").write_bytes((runs / "alibi-s0.pt").read_bytes()[:100])  # truncated
    (runs / "nope-s0.pt").unlink()
    before = json.loads((runs / "nope-s0.json").read_text())
    capsys.readouterr()
    assert lab(tmp_path, "--encodings", "nope") == 0
    out = capsys.readouterr().out
    assert not stale.exists()
    assert "skipped" not in out  # nope's weights were missing: it ran again
    assert "also holds finished runs not in this sweep" not in out  # alibi must run again
    assert (runs / "nope-s0.pt").exists()
    assert json.loads((runs / "nope-s0.json").read_text())["rows"] == before["rows"]
    res = results(tmp_path)
    assert [r["encoding"] for r in res["runs"]] == ["nope"]
    assert "| alibi |" not in (tmp_path / "report.md").read_text()
    assert lab(tmp_path, "--encodings", "alibi") == 0  # truncated weights: redone
    assert lab(tmp_path, "--encodings", "nope") == 0
    assert "not in this sweep: alibi-s0" in capsys.readouterr().out


def test_runs_record_their_environment_and_a_mismatch_is_noted(tmp_path):
    assert lab(tmp_path, "--encodings", "nope") == 0
    path = tmp_path / "runs" / "nope-s0.json"
    record = json.loads(path.read_text())
    assert {"torch_threads", "device", "torch"} <= set(record["environment"])
    record["environment"]["torch_threads"] = 7
    path.write_text(json.dumps(record))
    assert lab(tmp_path, "--encodings", "nope,alibi") == 0
    notes = results(tmp_path)["notes"]
    assert any("torch_threads" in note and "7" in note for note in notes)
    assert "torch_threads" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("name", "content"),
    [("runs/nope-s0.json", "[1, 2]"), ("runs/nope-s0.json", '{"encoding": 3}'),
     ("config.json", '"steps"'), ("runs/x.json", "{not json")],
)  # fmt: skip
def test_a_wrong_file_in_the_folder_is_named(tmp_path, capsys, name, content):
    assert lab(tmp_path, "--encodings", "nope") == 0
    (tmp_path / name).write_text(content)
    capsys.readouterr()
    assert lab(tmp_path, "--encodings", "nope") == 2
    one_line(capsys, str(tmp_path / name))


# ----------------------------------------------------------------------------- failures


def test_every_run_failed_exits_non_zero(tmp_path, capsys):
    with registered("nan_only", NaNInput):
        assert lab(tmp_path, "--encodings", "nan_only") == 1
        assert "every run failed" in capsys.readouterr().err
        assert not (tmp_path / "perplexity.png").exists()
        assert "No run finished" in (tmp_path / "report.md").read_text()


def test_interrupt_before_the_first_model_writes_an_empty_report(tmp_path, capsys):
    with registered("stop_first", Interrupt):
        assert lab(tmp_path, "--encodings", "stop_first,nope") == 130
        assert results(tmp_path)["status"] == "interrupted"
        report = (tmp_path / "report.md").read_text()
        assert "No run finished" in report and "| encoding |" not in report
        assert not (tmp_path / "perplexity.png").exists()
        assert capsys.readouterr().err.strip() == "posenc: interrupted"  # no matplotlib warning


@pytest.mark.parametrize(
    ("code", "words"),
    [(errno.ENOSPC, "disk full"), (errno.EACCES, "permission denied"),
     (errno.EROFS, "read-only")],
)  # fmt: skip
def test_file_system_errors_areone_line(tmp_path, capsys, monkeypatch, code, words):
    def refuse(*args, dir=None, **kwargs):
        raise OSError(code, "refused", str(dir))

    monkeypatch.setattr(posenc.lab.results.tempfile, "mkstemp", refuse)
    assert lab(tmp_path / "out", "--encodings", "nope") == 2
    one_line(capsys, words, str(tmp_path / "out"))


def _rows(out: Path) -> list:
    return sorted((r["encoding"], r["seed"], json.dumps(r["rows"])) for r in results(out)["runs"])


@pytest.mark.slow
def test_a_run_killed_at_any_moment_resumes_to_the_uninterrupted_numbers(tmp_path):
    """``kill -9`` (no clean-up runs) at moments spread over a sweep: every file left is
    whole (JSON parses, weights load), and the resumed sweep has the uninterrupted
    sweep's rows, with no writer's temporary file left behind."""
    import signal
    import subprocess
    import sys
    import time

    import torch

    command = [sys.executable, "-m", "posenc", "lab", *TINY, "--encodings", "alibi", "rope",
               "--scalings", "--finetune-steps", "0"]  # fmt: skip
    start = time.monotonic()
    subprocess.run([*command, "--out", str(tmp_path / "whole")], check=True, capture_output=True)
    duration = time.monotonic() - start
    for i, fraction in enumerate((0.3, 0.6, 0.9)):
        out = tmp_path / f"killed{i}"
        child = subprocess.Popen(
            [*command, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(fraction * duration)
        child.send_signal(signal.SIGKILL)
        child.wait()
        for path in out.rglob("*"):
            if path.name.startswith(".") and ".tmp" in path.name:
                continue  # a writer's temporary: never read, removed on resume
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".pt":
                torch.load(path, weights_only=True)
        subprocess.run([*command, "--out", str(out)], check=True, capture_output=True)
        assert _rows(out) == _rows(tmp_path / "whole")
        assert not list(out.rglob(".*.tmp*"))


# ----------------------------------------------------------------------------- options


def test_every_option_has_help_and_a_meaningful_metavar():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for action in sub.choices["lab"]._actions:
        if action.dest == "help":
            continue
        assert action.help, action.option_strings
        takes_value = action.nargs != 0 and action.choices is None
        if takes_value:
            assert action.metavar and action.metavar != action.dest.upper(), action.dest
    lr = next(a for a in sub.choices["lab"]._actions if a.dest == "lr")
    assert lr.metavar == "RATE"


def test_worker_processes_give_the_numbers_of_one_process(tmp_path, capsys):
    """--jobs 2 trains the runs in two spawned processes; with one thread each, every
    number equals the one-process sweep's."""
    options = ["--encodings", "alibi", "--seeds", "2"]
    assert lab(tmp_path / "one", *options, "--jobs", "1") == 0
    capsys.readouterr()
    assert lab(tmp_path / "two", *options, "--jobs", "2") == 0
    said = capsys.readouterr().out
    assert said.index("run 2/2 started") < said.index("run 1/2 finished")  # both at once
    assert said.index("run 2/2 started") < said.index("run 2/2 finished")
    one, two = results(tmp_path / "one")["runs"], results(tmp_path / "two")["runs"]
    assert [r["seed"] for r in two] == [0, 1]
    assert [r["rows"] for r in one] == [r["rows"] for r in two]
    assert (tmp_path / "two" / "runs" / "alibi-s1.pt").exists()
