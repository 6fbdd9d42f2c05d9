"""The length-generalization literature's addition (reversed digits) and sort tasks:
each generated example against an integer reference written from the rule (Python's
``int`` sum, ``sorted``), the answer alone scored, sizes that grow with the length, an
oracle scoring 1 and a constant 0, and the shipped sweep that runs them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from posenc.lab import LabConfig, Task
from posenc.lab.config import DEFAULT_ENCODINGS
from posenc.lab.distributed import Context
from posenc.lab.evaluate import accuracy
from posenc.lab.seedlevel import seeds_needed
from posenc.lab.sweepfile import load_sweep
from posenc.lab.tasks import IGNORE, SEP

_DIGIT0, _SYMBOLS = 2, 16  # the tasks' first content token, the sort alphabet


def _number(digits: list[int]) -> int:
    """A number written least significant digit first, as tokens."""
    return sum((d - _DIGIT0) * 10**i for i, d in enumerate(digits))


def _answer(task: Task, seq: list[int]) -> list[int]:
    """The answer tokens of one unpadded example, from the rule alone (Python ints)."""
    if task.name == "addition":
        plus, equals = seq.index(task.vocab_size - 1), seq.index(SEP)
        n = plus
        total = _number(seq[:plus]) + _number(seq[plus + 1 : equals])
        return [_DIGIT0 + (total // 10**i) % 10 for i in range(n + 1)]
    sep = seq.index(SEP)
    return sorted(seq[:sep])


@pytest.mark.parametrize("name", ["addition", "sort"])
@settings(max_examples=30, deadline=None)
@given(length=st.integers(5, 48), seed=st.integers(0, 2**16))
def test_examples_follow_the_rule_and_only_the_answer_is_scored(name, length, seed):
    task = Task(name, 48)
    gen = torch.Generator().manual_seed(seed)
    inputs, targets = task.batch(4, length, gen, exact=False)
    assert inputs.shape == targets.shape == (4, length)
    for seq, target in zip(inputs.tolist(), targets.tolist(), strict=True):
        scored = [i for i, t in enumerate(target) if t != IGNORE]
        first = scored[0]  # the answer's first token is predicted at "=" / "|"
        assert seq[first] == SEP and scored == list(range(first, scored[-1] + 1))
        answer = [target[i] for i in scored]
        example = seq[: first + 1] + answer
        assert answer == _answer(task, example)
        assert seq[first + 1 : scored[-1] + 1] == answer[:-1]  # teacher forcing
        assert all(t == 0 for t in seq[scored[-1] + 1 :])  # padding after the example
        operands = first if name == "sort" else (first - 1) // 2
        assert len(answer) == operands + (name == "addition")


def test_addition_carries_through_every_digit():
    task, gen = Task("addition", 32), torch.Generator().manual_seed(0)
    seen_carry = False
    for _ in range(50):
        x, y = task.example(6, gen)
        seq = [*x.tolist(), int(y[-1])]
        total = _number(seq[:6]) + _number(seq[7:13])
        assert _number(seq[14:]) == total and len(seq) == 3 * 6 + 3
        seen_carry |= total >= 10**6
    assert seen_carry  # the (n+1)-th digit is exercised


@pytest.mark.parametrize(
    ("name", "size"), [("addition", lambda n: (n - 2) // 3), ("sort", lambda n: n // 2)]
)
def test_sizes_scale_with_the_length(name, size):
    task = Task(name, 4 * 16)
    for length in (16, 32, 48, 64):  # 1x to 4x a training length of 16
        assert task.size(length) == size(length)
        _inputs, targets = task.batch(2, length, torch.Generator(), exact=True)
        used = int((targets != IGNORE).sum(1).max())
        assert used == size(length) + (name == "addition")
    with pytest.raises(ValueError, match="room for one example"):
        Task("addition", 16).batch(1, 4, torch.Generator(), exact=True)


@pytest.mark.parametrize("name", ["addition", "sort"])
def test_an_oracle_scores_one_and_a_constant_zero(name):
    task = Task(name, 40)

    class Oracle(nn.Module):
        def forward(self, tokens: Tensor) -> Tensor:
            out = torch.zeros(*tokens.shape, dtype=torch.long)
            for row, seq in enumerate(tokens.tolist()):
                sep = seq.index(SEP)
                answer = _answer(task, seq[: sep + 1])
                out[row, sep : sep + len(answer)] = torch.tensor(answer)
            return nn.functional.one_hot(out, task.vocab_size).float()

    class Constant(nn.Module):
        def forward(self, tokens: Tensor) -> Tensor:
            return torch.zeros(*tokens.shape, task.vocab_size)

    one = accuracy(Oracle(), task, 40, examples=8, seed=0, context=Context())
    assert one["accuracy"] == 1.0 and one["token_accuracy"] == 1.0
    assert accuracy(Constant(), task, 40, examples=8, seed=0, context=Context())["accuracy"] == 0


def test_the_shipped_tasks_sweep_runs_each_task_over_the_encodings():
    _, settings = load_sweep("tasks")
    assert [name for name, _ in settings] == ["copy", "reverse", "recall", "addition", "sort"]
    _, [(_, positions)] = load_sweep("positions")
    for name, options in settings:
        assert options["task"] == name and len(options["seeds"]) >= seeds_needed()
        assert set(options["encodings"]) == {*DEFAULT_ENCODINGS, *positions["encodings"]}
        train = options["train_len"]
        assert options["eval_lens"] == [train * k for k in (1, 2, 3, 4)]
        LabConfig(
            encodings=tuple(options["encodings"]),
            task=name,
            seeds=tuple(options["seeds"]),
            train_len=train,
            eval_lens=tuple(options["eval_lens"]),
            scalings=(),
            finetune_steps=0,
        )  # raises if invalid
