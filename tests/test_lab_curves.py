"""Learning curves: the late slope against a straight line, the report's budget sentence,
and the figure."""

from __future__ import annotations

import pytest

from posenc.lab.curves import LEARNING, budget_sentence, late_slope
from posenc.lab.plots import draw_all, figure_names


def _results(slopes: dict[str, float], seeds: int = 2) -> dict:
    runs = []
    for name, slope in slopes.items():
        for seed in range(seeds):
            curve = [[step, 3.0 + slope * step / 100 + 0.001 * seed] for step in range(1, 301, 6)]
            value = {"ppl": 9.0}
            row = {"label": name, "kind": "trained", "results": {"64": value}, "notes": {}}
            runs.append({"encoding": name, "seed": seed, "status": "ok", "rows": [row],
                         "train": {"curve": curve, "steps": 300}})  # fmt: skip
    config = {"steps": 300, "task": "lm", "eval_lens": [64], "train_len": 64}
    return {"config": config, "runs": runs, "metric": "ppl", "seeds": list(range(seeds))}


def test_late_slope_of_a_line_is_its_slope_per_100_steps():
    line = [(s, 5.0 - 0.002 * s) for s in range(0, 300, 10)]
    assert late_slope(line) == pytest.approx(-0.2)
    bent = [(s, 5.0 - 0.01 * min(s, 150)) for s in range(0, 300, 10)]  # flat after step 150
    assert late_slope(bent) == pytest.approx(0.0, abs=1e-12)
    assert late_slope(line[:5]) is None  # too few points in the last third


def test_budget_sentence_says_which_encodings_were_still_learning():
    text = budget_sentence(_results({"nope": 0.0, "rope": -0.05}))
    assert text.startswith("Training: a fixed budget of 300 steps (no plateau stopping).")
    assert "nope +0.000" in text and "rope -0.050" in text
    assert "1 of 2 encodings were still falling" in text and "learning speed" in text
    assert budget_sentence({"runs": [], "config": {}}) is None


def test_the_learning_figure_is_drawn(tmp_path):
    results = _results({"nope": 0.0, "alibi": -0.05})
    assert LEARNING in figure_names(results)
    paths = draw_all(results, tmp_path)
    assert tmp_path / LEARNING in paths
    assert (tmp_path / LEARNING).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
