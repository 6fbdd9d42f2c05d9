"""Training until the validation loss plateaus: the rule on synthetic curves, the
validation set taken out of the training text, the thorough profile, the report's stop
reasons, and the default protocol left as it was (r7's configuration identity)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import cli
from posenc.commands.lab import config_from_args
from posenc.lab import LabConfig
from posenc.lab.config import thorough_defaults
from posenc.lab.plateau import VAL_BLOCK, plateaued, split_validation, validation_loss
from posenc.lab.tasks import IGNORE

#: A tiny model for a task; text also takes ``--eval-tokens`` (a task refuses it).
TINY_MODEL = ["--quick", "--encodings", "rope", "--steps", "12", "--d-model", "16", "--heads",
              "2", "--threads", "1", "--jobs", "1", "--no-progress", "--finetune-steps", "0",
              "--scalings"]  # fmt: skip
TINY = [*TINY_MODEL, "--eval-tokens", "256"]
RECORDED = Path(__file__).resolve().parents[1] / "runs-recorded"


def _decaying(points: int, rate: float) -> list[float]:
    return [2.0 + math.exp(-rate * i) for i in range(points)]


# ----------------------------------------------------------------------------- the rule


def test_a_curve_still_falling_does_not_stop():
    # each point 2 % below the one before: always more than 0.5 % better than the past
    losses = [3.0 * 0.98**i for i in range(40)]
    assert not any(plateaued(losses[:n], 4, 0.005) for n in range(1, 41))


def test_a_flat_tail_stops_once_the_window_is_flat():
    losses = [3.0, 2.5, 2.2, 2.1, 2.1, 2.1, 2.1, 2.1]
    stops = [n for n in range(1, len(losses) + 1) if plateaued(losses[:n], 4, 0.005)]
    assert stops == [8]  # 2.1 first at index 3; four points after it bring nothing


def test_noise_without_progress_stops_and_one_better_point_resets():
    flat = [2.0, 2.01, 1.999, 2.005, 2.002]
    assert plateaued(flat, 4, 0.005)
    assert not plateaued([*flat[:-1], 1.9], 4, 0.005)  # 5 % better than the best before


@settings(max_examples=30, deadline=None)
@given(
    rate=st.floats(0.01, 2.0),
    window=st.integers(1, 6),
    eps=st.floats(0.0, 0.2),
    points=st.integers(1, 60),
)
def test_the_rule_is_its_definition(rate, window, eps, points):
    losses = _decaying(points, rate)
    want = points > window and min(losses[-window:]) >= (1 - eps) * min(losses[:-window])
    assert plateaued(losses, window, eps) == want


def test_the_rule_refuses_bad_settings():
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        plateaued([1.0, 1.0], 0, 0.01)
    with pytest.raises(ValueError, match="eps must be in"):
        plateaued([1.0, 1.0], 2, 1.0)


# ----------------------------------------------------------------------------- validation set


@pytest.mark.parametrize("length", [16, 64])
def test_validation_is_taken_out_of_the_training_text(length):
    data = torch.arange(40 * VAL_BLOCK)  # every value unique: where each byte came from
    train, windows = split_validation(data, 4 * VAL_BLOCK, length)
    assert train.numel() + 4 * VAL_BLOCK == data.numel()
    assert windows.shape[1] == length + 1
    assert set(windows.flatten().tolist()).isdisjoint(train.tolist())
    assert torch.equal(windows[:, 1:] - windows[:, :-1], torch.ones_like(windows[:, 1:]))
    assert torch.equal(train, torch.sort(train).values)  # the rest, in order
    with pytest.raises(ValueError, match="more than a quarter"):
        split_validation(data, 20 * VAL_BLOCK, length)


def test_validation_loss_is_the_mean_cross_entropy_of_the_scored_tokens():
    torch.manual_seed(0)
    table = torch.nn.Embedding(5, 5).double()
    inputs = torch.randint(0, 5, (3, 7))
    targets = torch.randint(0, 5, (3, 7))
    targets[0, :3] = IGNORE
    with torch.no_grad():
        logits = table(inputs)  # [3, 7, 5], float64
    keep = targets != IGNORE
    want = -torch.log_softmax(logits, -1)[keep].gather(1, targets[keep][:, None]).mean()
    table.train()
    got = validation_loss(table, inputs, targets)
    # the loss is taken of float32 logits (as in training), summed in float64
    assert got == pytest.approx(float(want), rel=64 * torch.finfo(torch.float32).eps)
    assert table.training  # left as it was


# ----------------------------------------------------------------------------- configuration


def _parse(*options: str) -> LabConfig:
    parser = cli.build_parser()
    return config_from_args(parser.parse_args(["lab", *options]))


def test_thorough_profile_sets_plateau_stopping_and_options_win():
    config = _parse("--profile", "thorough")
    preset = thorough_defaults("lm")
    assert config.profile == "thorough"
    assert {k: getattr(config, k) for k in preset} == preset
    assert config.step_cap == preset["max_steps"] > config.steps
    assert _parse("--profile", "thorough", "--max-steps", "1200").step_cap == 1200
    task = _parse("--profile", "thorough", "--task", "passkey")
    assert task.plateau is None and task.val_every == thorough_defaults("passkey")["val_every"]
    assert _parse().step_cap is None and _parse().val_every is None  # the default: fixed
    with pytest.raises(cli.UsageError, match="exclude each other"):
        _parse("--profile", "thorough", "--quick")


def test_plateau_settings_are_checked():
    with pytest.raises(ValueError, match="plateau needs val_every dividing steps"):
        LabConfig(plateau=3)
    with pytest.raises(ValueError, match="plateau needs val_every dividing steps"):
        LabConfig(plateau=3, val_every=7)
    with pytest.raises(ValueError, match="text only"):
        LabConfig(task="copy", train_len=16, eval_lens=(16,), plateau=3, val_every=10)
    with pytest.raises(ValueError, match="max_steps applies to synthetic tasks and to text"):
        LabConfig(max_steps=600)
    with pytest.raises(ValueError, match="profile must be one of"):
        LabConfig(profile="fast")
    assert LabConfig(plateau=3, val_every=50, max_steps=900).step_cap == 900


def test_the_default_protocol_keeps_the_recorded_identity():
    """A default sweep has the configuration identity of the recorded r7 runs, so the
    r7 tables stay the default protocol's."""
    recorded = json.loads((RECORDED / "r7-stdlib" / "config.json").read_text())
    assert LabConfig().identity(recorded["corpus_sha256"]) == recorded
    assert "plateau" in LabConfig(val_every=10).identity(None)


# ----------------------------------------------------------------------------- end to end


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def test_measuring_validation_leaves_training_alone(tmp_path):
    """A task's validation examples are a stream of their own: with or without them the
    training curve and every reported number are the same."""
    task = ["--task", "copy", "--train-len", "8", "--max-steps", "12"]
    assert cli.main(["lab", *TINY_MODEL, *task, "--out", str(tmp_path / "a")]) == 0
    measured = [*task, "--val-every", "4", "--out", str(tmp_path / "b")]
    assert cli.main(["lab", *TINY_MODEL, *measured]) == 0
    plain, measured = _results(tmp_path / "a")["runs"][0], _results(tmp_path / "b")["runs"][0]
    assert plain["train"]["curve"] == measured["train"]["curve"]
    assert plain["rows"] == measured["rows"]
    assert plain["train"]["stop"] == measured["train"]["stop"]
    assert "validation" not in plain["train"]
    curve = measured["train"]["validation"]["curve"]
    assert [step for step, _ in curve] == list(range(4, measured["train"]["steps"] + 1, 4))
    assert all(math.isfinite(loss) for _, loss in curve)


def _corpus(folder: Path) -> Path:
    """Three small files of pseudo-random words (the last held out)."""
    gen = torch.Generator().manual_seed(0)
    words = ["alpha", "beta", "gamma", "delta", "pos", "enc", "rope", "bias", "\n"]
    folder.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        picks = torch.randint(0, len(words), (4000,), generator=gen).tolist()
        (folder / name).write_text(" ".join(words[i] for i in picks))
    return folder


def test_the_report_says_why_each_run_stopped(tmp_path):
    corpus = ["--corpus", str(_corpus(tmp_path / "text")), "--val-tokens", "2048"]
    stopped = [*corpus, "--val-every", "4", "--plateau", "1", "--plateau-eps", "0.5",
               "--max-steps", "24"]  # fmt: skip
    assert cli.main(["lab", *TINY, *stopped, "--out", str(tmp_path / "c")]) == 0
    res = _results(tmp_path / "c")
    run = res["runs"][0]
    assert run["train"]["stop"] == "plateau" and run["train"]["steps"] == 12  # first check
    assert res["data"]["validation"]["tokens"] == run["train"]["validation"]["tokens"] > 0
    report = (tmp_path / "c" / "report.md").read_text()
    assert "Stopped (per run): rope s0 plateau at 12." in report
    assert "Plateau rule" in report and "never the evaluation text" in report
    never = [*corpus, "--val-every", "4", "--plateau", "2", "--plateau-eps", "0",
             "--max-steps", "16"]  # fmt: skip
    assert cli.main(["lab", *TINY, *never, "--out", str(tmp_path / "d")]) == 0
    train = _results(tmp_path / "d")["runs"][0]["train"]
    losses = [loss for _, loss in train["validation"]["curve"]]
    if train["stop"] == "budget":  # the cap came first: no check found a plateau
        assert train["steps"] == 16 and not plateaued(losses, 2, 0.0)
    else:
        assert train["stop"] == "plateau" and plateaued(losses, 2, 0.0)
    report = (tmp_path / "d" / "report.md").read_text()
    assert f"rope s0 {train['stop']} at {train['steps']}" in report
