"""Training compute: the FLOPs estimate against Kaplan et al.'s formula counted by hand
from the model's layers, the loss at equal CPU-seconds read off hand-made curves, and
the report's section."""

from __future__ import annotations

import pytest
import torch

from posenc.lab import LabConfig, TinyLM
from posenc.lab.compute import SMOOTH, compute_lines, compute_rows, train_flops
from posenc.lab.variants import build_encoding


@pytest.mark.parametrize("name", ["rope", "learned", "nope"])
def test_flops_are_kaplans_formula_counted_from_the_layers(name):
    d, layers, vocab, length = 16, 2, 40, 12
    config = LabConfig(encodings=(name,), train_len=length, eval_lens=(length,), d_model=d,
                       num_heads=2, num_layers=layers)  # fmt: skip
    torch.manual_seed(0)
    model = TinyLM(build_encoding(name, config), vocab_size=vocab, d_model=d,
                   num_layers=layers, num_heads=2)  # fmt: skip
    # by hand: per block q, k, v, o (d x d, no bias), MLP d -> 4d -> d (with biases), two
    # layer norms (2d each); the output layer norm (2d) and head (d x vocab, no bias);
    # the encoding's own weights (a learned table: length x d)
    block = 4 * d * d + (d * 4 * d + 4 * d) + (4 * d * d + d) + 2 * 2 * d
    own = length * d if name == "learned" else 0
    counted = layers * block + 2 * d + d * vocab + own
    per_token = 2 * counted + 2 * layers * length * d  # forward
    want = 3 * per_token * (7 * 5 * length)  # 7 steps of 5 windows of 12 tokens
    assert train_flops(model, steps=7, batch_size=5, train_len=length) == want


def _run(name: str, seed: int, cpu: float, steps: int, curve: list) -> dict:
    train = {"steps": steps, "cpu_seconds": cpu, "flops": 1e9, "curve": curve}
    return {"encoding": name, "seed": seed, "status": "ok", "train": train, "rows": []}


def test_loss_at_equal_cpu_seconds_is_read_where_each_had_spent_the_budget():
    line = [(s, 3.0 - s / 100) for s in range(0, 101, 10)]  # loss falls 0.1 per 10 steps
    results = {
        "runs": [
            _run("rope", 0, 10.0, 100, line),
            _run("rope", 1, 10.0, 100, line),
            _run("path", 0, 40.0, 100, [(s, v - 0.5) for s, v in line]),  # 4x per step
        ]
    }
    rows = {r["encoding"]: r for r in compute_rows(results)}
    assert rows["rope"]["relative"] == 1.0 and rows["path"]["relative"] == 4.0
    assert rows["rope"]["budget"] == rows["path"]["budget"] == 10.0
    assert rows["rope"]["at_step"] == 100.0 and rows["path"]["at_step"] == 25.0
    # a running mean of SMOOTH points of a straight line lags it by (SMOOTH - 1) / 2 points
    lag = (SMOOTH - 1) / 2 * 0.1
    assert rows["rope"]["loss_at_budget"] == pytest.approx(2.0 + lag)
    assert rows["path"]["loss_at_budget"] == pytest.approx(3.0 - 0.25 - 0.5 + lag)
    text = "\n".join(compute_lines(results))
    assert "| path | 100 | 40.0 | 0.400 | 4.00 | 1.0 | 25 | 2.350 |" in text


def test_a_curve_that_does_not_reach_back_to_the_budget_is_not_read():
    results = {
        "runs": [
            _run("rope", 0, 10.0, 100, [(s, 1.0) for s in range(0, 101, 10)]),
            _run("path", 0, 400.0, 100, [(s, 1.0) for s in range(50, 101, 10)]),
        ]
    }
    rows = {r["encoding"]: r for r in compute_rows(results)}
    assert rows["path"]["at_step"] == 2.5 and rows["path"]["loss_at_budget"] is None
    assert "| n/a |" in "\n".join(compute_lines(results))
    assert compute_rows({"runs": [{"encoding": "x", "seed": 0, "status": "failed"}]}) == []
