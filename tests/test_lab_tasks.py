"""posenc lab's synthetic tasks are trained until learned in distribution: training goes
on past --steps in rounds until exact match at the training length (on held-out
examples) reaches LEARNED, up to --max-steps; the steps it took are recorded and
reported, and text (``lm``) trains for exactly --steps as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import posenc.lab.runs
from posenc import cli
from posenc.lab import LabConfig, Task, TinyLM
from posenc.lab.distributed import Context
from posenc.lab.train import TaskStream, Until, train
from posenc.lab.variants import build_encoding

# passkey at length 16 is the task a tiny model starts to solve within a few hundred steps
BASE = ["--quick", "--task", "passkey", "--encodings", "rope", "--train-len", "16",
        "--eval-lens", "16", "32", "--steps", "60", "--batch-size", "32", "--warmup", "6",
        "--eval-examples", "32", "--scalings", "--threads", "1", "--no-progress",
        "--passkey-key-len", "5"]  # fmt: skip
TASK = [*BASE, "--max-steps", "240"]
NEVER = 2.0  # an exact match no model reaches: every run goes to the cap


def lab(out: Path, *options: str) -> int:
    return cli.main(["lab", *TASK, "--out", str(out), *options])


def run_of(out: Path) -> dict:
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    return run


def _model(seed: int = 0) -> TinyLM:
    config = LabConfig(encodings=("rope",), task="copy", train_len=8, eval_lens=(8,),
                       d_model=16, num_heads=2)  # fmt: skip
    torch.manual_seed(seed)
    return TinyLM(build_encoding("rope", config), vocab_size=Task("copy", 8).vocab_size,
                  d_model=16, num_layers=1, num_heads=2)  # fmt: skip


def _train(model: TinyLM, steps: int, until: Until | None = None):
    stream = TaskStream(Task("copy", 8), 8, seed=0)
    return train(model, stream, steps=steps, batch_size=4, lr=1e-3, warmup=2,
                 weight_decay=0.01, context=Context(), until=until)  # fmt: skip


# ----------------------------------------------------------------------------- the loop


def test_training_stops_at_the_first_check_that_passes():
    asked = []
    until = Until(lambda step: asked.append(step) or step >= 8, max_steps=20, every=2)
    result = _train(_model(), 6, until)
    assert asked == [6, 8] and result.steps == 8 and result.curve[-1][0] == 8


def test_the_cap_is_checked_even_off_the_rounds():
    asked = []
    result = _train(_model(), 6, Until(lambda step: asked.append(step) and False, 11, 2))
    assert asked == [6, 8, 10, 11] and result.steps == 11


def test_the_first_steps_are_those_of_a_fixed_budget_and_rounds_repeat_bit_for_bit():
    fixed, early = _model(), _model()
    _train(fixed, 6)
    _train(early, 6, Until(lambda step: True, 12, 2))  # learned at the first check
    for a, b in zip(fixed.state_dict().values(), early.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    states = []
    for _ in range(2):
        model = _model()
        _train(model, 6, Until(lambda step: step >= 10, 12, 2))
        states.append(model.state_dict())
    for a, b in zip(*(s.values() for s in states), strict=True):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------- the lab


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> tuple[Path, dict]:
    """A run that never counts as learned: trained to the cap, every round checked."""
    out = tmp_path_factory.mktemp("capped")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(posenc.lab.runs, "LEARNED", NEVER)
        assert lab(out) == 0
    return out, run_of(out)


def test_a_task_not_learned_by_the_cap_is_reported_not_learned(capped):
    out, run = capped
    assert run["learned"] is False and run["steps_to_learn"] is None
    assert run["train"]["steps"] == run["train"]["max_steps"] == 240
    steps = [step for step, _ in run["train"]["checks"]]
    assert steps == list(range(60, 241, 15))  # from --steps, every steps // ROUNDS
    report = (out / "report.md").read_text()
    assert "rope (seed 0) not learned by 240" in report
    assert "60 steps or more (until learned) of 32 windows" in report
    assert "not learned at the training length in 240 steps" in report
    assert "| rope (seed 0) | not learned | not learned |" in report
    assert not list(out.rglob("*.round.pt"))  # the round state goes when the run ends


def test_a_task_learned_in_a_later_round_stops_there(capped, tmp_path, monkeypatch):
    """The threshold set to the first exact match above all earlier ones: the same run,
    bit for bit, stops at that check and reports it as its steps to learn."""
    checks = capped[1]["train"]["checks"]
    k = next(i for i in range(1, len(checks)) if checks[i][1] > max(a for _, a in checks[:i]))
    step, score = checks[k]
    monkeypatch.setattr(posenc.lab.runs, "LEARNED", score)
    assert lab(tmp_path) == 0
    run = run_of(tmp_path)
    assert run["learned"] is True and run["steps_to_learn"] == run["train"]["steps"] == step
    assert run["train"]["checks"] == checks[: k + 1] and step < 240
    assert f"Steps to learn: rope (seed 0) {step}." in (tmp_path / "report.md").read_text()


def test_a_finished_task_run_resumes_and_another_cap_is_another_sweep(capped, capsys):
    out, _ = capped
    before = (out / "runs" / "rope-s0.json").read_text()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(posenc.lab.runs, "LEARNED", NEVER)
        assert lab(out) == 0
    assert "skipped: rope-s0" in capsys.readouterr().out
    assert (out / "runs" / "rope-s0.json").read_text() == before
    assert lab(out, "--max-steps", "300") == 2
    err = capsys.readouterr().err.strip()
    assert "differs in --max-steps" in err and len(err.splitlines()) == 1


def test_an_interrupted_task_run_resumes_from_its_last_round_bit_for_bit(
    capped, tmp_path, monkeypatch
):
    saves = []

    def save_then_stop(path, snapshot):
        write_round(path, snapshot)
        saves.append(snapshot["step"])
        if len(saves) == 3:
            raise KeyboardInterrupt

    write_round = posenc.lab.runs._write_round
    monkeypatch.setattr(posenc.lab.runs, "LEARNED", NEVER)
    monkeypatch.setattr(posenc.lab.runs, "_write_round", save_then_stop)
    assert lab(tmp_path) == 130
    assert saves == [60, 75, 90] and (tmp_path / "runs" / "rope-s0.round.pt").exists()
    monkeypatch.setattr(posenc.lab.runs, "_write_round", write_round)
    assert lab(tmp_path) == 0
    run, whole = run_of(tmp_path), capped[1]
    assert run["train"]["resumed_from"] == 90 and "resumed_from" not in whole["train"]
    for key in ("checks", "curve", "steps", "final_loss"):
        assert run["train"][key] == whole["train"][key]
    assert run["rows"] == whole["rows"]
    assert not (tmp_path / "runs" / "rope-s0.round.pt").exists()


def test_the_default_cap_is_four_times_the_steps_and_the_same_sweep():
    config = LabConfig(task="copy", steps=10)
    assert config.step_cap == 40
    assert config.identity(None) == config.replace(max_steps=40).identity(None)
    assert config.identity(None) != config.replace(max_steps=41).identity(None)


def test_text_trains_for_exactly_its_steps(tmp_path):
    lm = LabConfig()
    assert lm.step_cap is None and "max_steps" not in lm.identity(None)
    options = ["--quick", "--encodings", "nope", "--steps", "7", "--d-model", "16", "--heads",
               "2", "--eval-tokens", "128", "--threads", "1", "--no-progress"]  # fmt: skip
    assert cli.main(["lab", *options, "--out", str(tmp_path)]) == 0
    run = run_of(tmp_path)
    assert run["train"]["steps"] == 7 and run["train"]["curve"][-1][0] == 7
    assert "steps_to_learn" not in run and "checks" not in run["train"]
    report = (tmp_path / "report.md").read_text()
    assert "Trained until learned" not in report and "7 steps of 16 windows" in report


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-steps", "59"], "--max-steps must be >= 60, got 59"),
        (["--max-steps", "many"], "invalid int value: 'many'"),
        (["--max-steps", "1.5e3"], "invalid int value: '1.5e3'"),
    ],
)
def test_bad_max_steps_is_one_line_and_exit_2(tmp_path, capsys, options, message):
    assert lab(tmp_path / "out", *options) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc: error:") and message in err and len(err.splitlines()) == 1


def test_max_steps_with_text_is_refused(tmp_path, capsys):
    assert cli.main(["lab", "--max-steps", "600", "--out", str(tmp_path)]) == 2
    message = "--max-steps applies to synthetic tasks and to text with --plateau"
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc: error:") and message in err and len(err.splitlines()) == 1


def test_sweep_file_sets_max_steps_and_checks_its_type(tmp_path, capsys):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('"max-steps" = 90\n')
    assert cli.main(["lab", *BASE, "--config", str(sweep), "--out", str(tmp_path / "a")]) == 0
    assert run_of(tmp_path / "a")["train"]["max_steps"] == 90
    sweep.write_text('max_steps = "lots"\n')
    assert cli.main(["lab", "--config", str(sweep), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "option 'max_steps' must be int" in err and len(err.splitlines()) == 1
