"""A task report's per-token view of every run, learned or not: its cells are the mean
over seeds, its pairs the seed-level t-test of the per-seed differences (scipy's one-sample
t-test here, Holm over the section), runs below the exact-match gate included, and rows
derived at evaluation time left out up to the training length."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from posenc.lab.report import markdown
from posenc.lab.significance import holm
from posenc.lab.tokenlevel import token_comparisons, token_lines

SEEDS = 6


def _run(encoding: str, seed: int, tokens: dict[str, float], learned: bool) -> dict:
    results = {
        n: {"accuracy": 0.0, "token_accuracy": v, "solved": [0] * 4} for n, v in tokens.items()
    }
    rows = [{"label": encoding, "kind": "trained", "results": results, "notes": {}}]
    if encoding == "learned":
        rows.append(
            {
                "label": "learned +interpolate",
                "kind": "interpolate",
                "results": results,
                "notes": {},
            }
        )
    run = {"encoding": encoding, "seed": seed, "status": "ok", "learned": learned, "rows": rows}
    return {**run, "train": {"steps": 4}}


def _results() -> dict:
    rng = np.random.default_rng(21)
    runs = []
    for seed in range(SEEDS):
        base = rng.normal(0.5, 0.05)
        runs.append(_run("alibi", seed, {"8": 0.95, "16": base + 0.3 + rng.normal(0, 0.01)}, False))
        runs.append(_run("rope", seed, {"8": 0.97, "16": base + rng.normal(0, 0.01)}, True))
        runs.append(_run("learned", seed, {"8": 0.9, "16": base + rng.normal(0, 0.2)}, False))
    return {
        "status": "complete",
        "metric": "accuracy",
        "seeds": list(range(SEEDS)),
        "config": {"eval_lens": [8, 16], "train_len": 8, "encodings": ["alibi", "rope", "learned"]},
        "runs": runs,
    }


def _per_seed(results: dict, label: str, length: str) -> np.ndarray:
    return np.array(
        [
            100 * row["results"][length]["token_accuracy"]
            for run in results["runs"]
            for row in run["rows"]
            if row["label"] == label
        ]
    )


def test_pairs_are_the_t_test_of_the_per_seed_differences_with_holm():
    results = _results()
    found = token_comparisons(results)
    at_train = {(c.first, c.second) for c in found if c.length == "8"}
    assert not any("+interpolate" in pair for pair in map(" ".join, at_train))  # it is its model
    assert len(found) == 3 + 6  # 3 pairs at 8, 4 rows' 6 pairs at 16
    raw = []
    for c in found:
        d = _per_seed(results, c.first, c.length) - _per_seed(results, c.second, c.length)
        assert c.effect == pytest.approx(d.mean()) and c.effect >= 0
        raw.append(stats.ttest_1samp(d, 0.0).pvalue if d.std() > 0 else (0.0 if d.any() else 1.0))
        assert c.wins == int(np.sum(d > 0)) and c.seeds == SEEDS
    assert [c.p_holm for c in found] == pytest.approx(holm(raw))
    (ar,) = [c for c in found if c.length == "16" and {c.first, c.second} == {"alibi", "rope"}]
    assert ar.first == "alibi" and ar.separated and ar.effect == pytest.approx(30, abs=2)
    (lr,) = [c for c in found if c.length == "16" and {c.first, c.second} == {"learned", "rope"}]
    assert not lr.separated  # the learned table's accuracy varies too much across seeds


def test_the_section_shows_runs_that_did_not_learn():
    results = _results()
    text = "\n".join(token_lines(results))
    mean = np.mean(_per_seed(results, "alibi", "16"))
    assert f"| alibi | 0/{SEEDS} | 95.0 | {mean:.1f} |" in text  # below the gate, still shown
    assert f"| rope | {SEEDS}/{SEEDS} | 97.0 |" in text
    assert "- At 16:" in text and "alibi > rope" in text
    shape = {
        "task": "copy",
        "num_layers": 2,
        "d_model": 8,
        "num_heads": 2,
        "steps": 4,
        "batch_size": 2,
    }
    report = {**results, "data": {}, "config": {**results["config"], **shape}}
    assert "Per-token accuracy of every run" in markdown(report)
    lm = {**results, "metric": "ppl"}
    assert token_lines({**lm, "runs": []}) == []
