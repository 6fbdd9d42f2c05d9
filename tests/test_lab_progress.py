"""What ``posenc lab`` says while it runs: a line at every run's start and end, with the
time since the sweep started and an estimate of the time left, on any output (it was
silent off a terminal until the first run ended)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from posenc import cli
from posenc.lab.progress import RunLog, clock_time

TINY = ["--quick", "--steps", "3", "--d-model", "16", "--heads", "2", "--eval-tokens", "128",
        "--scalings", "--finetune-steps", "0", "--threads", "1", "--jobs", "1"]  # fmt: skip


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _log(costs: dict, slots: int = 1) -> tuple[RunLog, Clock, io.StringIO]:
    clock, out = Clock(), io.StringIO()
    console = Console(file=out, width=40)  # narrower than a line: lines must not wrap
    return RunLog(console, costs, slots=slots, clock=clock), clock, out


def test_clock_time():
    assert [clock_time(s) for s in (0, 59.4, 61, 3725, 36000)] == [
        "0:00:00", "0:00:59", "0:01:01", "1:02:05", "10:00:00"
    ]  # fmt: skip


def test_each_run_is_announced_with_elapsed_time_and_the_time_left():
    log, clock, out = _log({("rope", 0): 3, ("nope", 0): 1})
    clock.now += 30
    log.finished({"encoding": "rope", "seed": 0, "status": "ok"})
    clock.now += 11
    log.finished({"encoding": "nope", "seed": 0, "status": "failed", "seconds": 9.6})
    assert out.getvalue().splitlines() == [
        "run 1/2 started: rope s0 (elapsed 0:00:00; time left known after the first run)",
        "run 1/2 finished: rope s0, ok in 0:00:30 (elapsed 0:00:30; about 0:00:10 left)",
        "run 2/2 started: nope s0 (elapsed 0:00:30; about 0:00:10 left)",
        "run 2/2 finished: nope s0, failed in 0:00:10 (elapsed 0:00:41; nothing left)",
    ]  # 30 s for 3 of 4 units of work: 10 s for the last one


def test_workers_start_the_next_run_as_one_ends():
    costs = {("rope", 0): 3, ("rope", 1): 3, ("nope", 0): 1, ("nope", 1): 1}
    log, clock, out = _log(costs, slots=2)
    assert out.getvalue().splitlines() == [
        "run 1/4 started: rope s0 (elapsed 0:00:00; time left known after the first run)",
        "run 2/4 started: rope s1 (elapsed 0:00:00; time left known after the first run)",
    ]
    clock.now += 60
    log.finished({"encoding": "rope", "seed": 1, "status": "ok", "seconds": 60})
    lines = out.getvalue().splitlines()[2:]
    # 60 s of wall for 3 units, 5 units left (rope s0 counted as not begun): 100 s
    assert lines == [
        "run 2/4 finished: rope s1, ok in 0:01:00 (elapsed 0:01:00; about 0:01:40 left)",
        "run 3/4 started: nope s0 (elapsed 0:01:00; about 0:01:40 left)",
    ]


def test_a_sweep_off_a_terminal_says_when_each_run_starts_and_ends(tmp_path, capsys):
    """Captured output is not a terminal: no progress bars, a line per run start and end."""
    out = tmp_path / "out"
    assert cli.main(["lab", *TINY, "--encodings", "nope,alibi", "--out", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("run ")]
    pattern = r"run (\d)/2 (started|finished): (\w+) s0.* \(elapsed \d:\d\d:\d\d; (.*)\)"
    found = [re.fullmatch(pattern, line) for line in lines]
    assert all(found), lines
    said = [m.group(1, 2, 3) for m in found]  # type: ignore[union-attr]
    assert said == [("1", "started", "nope"), ("1", "finished", "nope"),
                    ("2", "started", "alibi"), ("2", "finished", "alibi")]  # fmt: skip
    left = [m.group(4) for m in found]  # type: ignore[union-attr]
    assert left[0] == "time left known after the first run" and left[3] == "nothing left"
    assert all(re.fullmatch(r"about \d:\d\d:\d\d left", text) for text in left[1:3]), left
    capsys.readouterr()
    assert cli.main(["lab", *TINY, "--encodings", "nope,alibi", "--out", str(out)]) == 0
    assert "started" not in capsys.readouterr().out  # every run finished earlier


def test_on_a_terminal_the_lines_scroll_above_progress_bars(tmp_path):
    from posenc.lab.config import LabConfig
    from posenc.lab.runner import run_lab

    config = LabConfig(encodings=("nope",), train_len=16, eval_lens=(16,), steps=3,
                       batch_size=4, warmup=1, d_model=16, num_heads=2, eval_tokens=64,
                       finetune_steps=0, scalings=(), seeds=(0,))  # fmt: skip
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    run_lab(config, tmp_path / "out", console=console, threads=1, progress=True)
    said = screen.getvalue()
    assert "run 1/1 started: nope s0" in said and "run 1/1 finished: nope s0, ok" in said
    assert said.index("\u2501") > said.index("run 1/1 started")  # a bar while it trains
    plain = io.StringIO()
    off = Console(file=plain, width=100)  # not a terminal: the lines, no bar
    run_lab(config, tmp_path / "again", console=off, threads=1, progress=True)
    assert "run 1/1 finished: nope s0, ok" in plain.getvalue()
    assert "\u2501" not in plain.getvalue()
