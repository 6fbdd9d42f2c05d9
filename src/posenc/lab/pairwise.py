"""Every pair of rows compared at every evaluation length, and the table's intervals,
from the per-segment losses (text) or per-example outcomes (tasks) a run records.

Shapes: ``S`` seeds, ``J`` units per seed. Each pair gets two tests:

* **seed level** (``posenc.lab.seedlevel``), the one a claim states: the mixed-effects
  model's test and interval, with the training seed (and, for text, the held-out file)
  as random effects, and beside it the exact sign-flip test over the per-seed mean
  differences, which assumes nothing and cannot go below ``2 / 2**S``;
* **text sampling** (``posenc.lab.significance``): the sign-flip test over (seed, unit)
  pairs and a bootstrap over seeds and units; it takes the trained models as given and
  measures how far the evaluation text could move the comparison.

Each test's p-values are Holm-corrected over every comparison of the report, and
Wilson's interval gives the accuracy cells. A pair is *separated* ("A better than B")
when the seed-level corrected p is below 0.05 and its interval excludes no difference;
``text_separated`` says the same of the text-sampling test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from posenc.lab import seedlevel
from posenc.lab.significance import (
    EXACT_UNITS,
    PERMUTATIONS,
    bootstrap,
    holm,
    sign_flip_tests,
    wilson_interval,
)

__all__ = [
    "DERIVED",
    "Comparison",
    "cell_interval",
    "compare_all",
    "file_groups",
    "unit_rows",
]


@dataclass(frozen=True)
class Comparison:
    """Two rows at one length; ``first`` is the better one by the mean difference.

    Attributes:
        effect: text: perplexity ratio ``first / second`` (``exp`` of the mean loss
            difference, below 1); tasks: accuracy difference in points (above 0).
        low, high: the effect's 95 % bootstrap interval over seeds and units.
        p: the text-sampling test's two-sided p-value; ``p_holm``: Holm-corrected.
        wins, seeds: seeds in which ``first`` beats ``second``; seeds with both.
        units: paired units tested (seeds x segments or examples).
        p_seed, p_seed_holm: the mixed model's p-value, and Holm-corrected.
        seed_low, seed_high: the effect's 95 % interval from the mixed model.
        seed_df: the mixed model's degrees of freedom.
        p_flip: the sign-flip test over seeds (uncorrected: with few seeds its floor
            times the number of comparisons exceeds 1).
        flip_floor, text_floor: the smallest p each permutation test can give
            (``2 / 2**S``; ``2 / 2**n`` exact or ``1 / (1 + R)`` random flips).
    """

    length: str
    first: str
    second: str
    metric: str
    effect: float
    low: float
    high: float
    p: float
    wins: int
    seeds: int
    units: int
    p_seed: float = 1.0
    seed_low: float = 0.0
    seed_high: float = 0.0
    seed_df: float = 0.0
    p_flip: float = 1.0
    p_holm: float = 1.0
    p_seed_holm: float = 1.0

    @property
    def flip_floor(self) -> float:
        return seedlevel.floor(self.seeds)

    @property
    def text_floor(self) -> float:
        exact = self.units <= EXACT_UNITS
        return 2.0 / 2**self.units if exact else 1.0 / (1 + PERMUTATIONS)

    @property
    def _null(self) -> float:
        return 1.0 if self.metric == "ppl" else 0.0

    @property
    def separated(self) -> bool:
        """Seed level: the mixed model's Holm-corrected ``p < 0.05`` and an interval that
        excludes no difference."""
        return self.p_seed_holm < 0.05 and not self.seed_low <= self._null <= self.seed_high

    @property
    def text_separated(self) -> bool:
        """Text sampling: Holm-corrected ``p < 0.05`` and an interval that excludes no
        difference."""
        return self.p_holm < 0.05 and not self.low <= self._null <= self.high

    def to_dict(self) -> dict[str, object]:
        """The record ``results.json`` keeps (``separated``: seed level)."""
        return {
            **self.__dict__,
            "separated": self.separated,
            "text_separated": self.text_separated,
            "flip_floor": self.flip_floor,
            "text_floor": self.text_floor,
        }


#: Rows derived at evaluation time; at or below the training length they are their model.
DERIVED = ("scaling", "interpolate")


def unit_rows(results: dict) -> dict[str, dict[str, dict[int, np.ndarray]]]:
    """``{label: {length: {seed: units [J]}}}`` of the finished runs: per-segment losses
    (text) or per-example outcomes (tasks); records without them are left out."""
    key = "segments" if results["metric"] == "ppl" else "solved"
    table: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    for run in results["runs"]:
        if run["status"] != "ok" or run.get("learned") is False:
            continue
        for row in run["rows"]:
            for length, result in row["results"].items():
                if result is not None and key in result:
                    cells = table.setdefault(row["label"], {})
                    cells.setdefault(length, {})[run["seed"]] = np.asarray(result[key], float)
    return table


def file_groups(results: dict, units: int) -> np.ndarray | None:
    """``[J]`` the held-out file of each evaluation segment (segments are recorded file
    by file, ``data.segments.per_file``); ``None`` for tasks (each example its own
    cluster) or records that do not say."""
    per_file = ((results.get("data") or {}).get("segments") or {}).get("per_file")
    if results["metric"] != "ppl" or not per_file or sum(per_file.values()) != units:
        return None
    return np.repeat(np.arange(len(per_file)), list(per_file.values()))


def compare_all(results: dict) -> list[Comparison]:
    """Every pair of rows at every evaluation length, both tests Holm-corrected over
    all of them. Up to the training length, rows derived at evaluation time are left out."""
    kinds = {row["label"]: row["kind"] for run in results["runs"] for row in run["rows"]}
    table = unit_rows(results)
    train_len = results["config"]["train_len"]
    out = []
    for n in results["config"]["eval_lens"]:
        length = str(n)
        labels = [
            label
            for label, cells in table.items()
            if length in cells and not (n <= train_len and kinds[label] in DERIVED)
        ]
        for i, a in enumerate(labels):
            for b in labels[i + 1 :]:
                found = _compare(length, a, b, table[a][length], table[b][length], results)
                if found is not None:
                    out.append(found)
    p = _grouped(out, lambda d: d.ravel(), sign_flip_tests)
    p_flip = _grouped(out, lambda d: d.mean(1), seedlevel.seed_sign_flip_tests)
    p_seed = holm([c.p_seed for c, _ in out])
    tests = zip(out, p, holm(p), p_seed, p_flip, strict=True)
    fields = ("p", "p_holm", "p_seed_holm", "p_flip")
    return [
        Comparison(**{**c.__dict__, **dict(zip(fields, values, strict=True))})
        for (c, _), *values in tests
    ]


def _grouped(found: list, take, test) -> list[float]:
    """``test`` of ``take(diff)`` for every comparison, one call per vector size."""
    p = [1.0] * len(found)
    for size in {take(diff).size for _, diff in found}:
        index = [i for i, (_, diff) in enumerate(found) if take(diff).size == size]
        tested = test(np.stack([take(found[i][1]) for i in index]))
        for i, value in zip(index, tested.tolist(), strict=True):
            p[i] = value
    return p


def _compare(
    length: str, a: str, b: str, ua: dict, ub: dict, results: dict
) -> tuple[Comparison, np.ndarray] | None:
    text = results["metric"] == "ppl"
    seeds = [s for s in ua if s in ub and ua[s].shape == ub[s].shape]
    if not seeds or len({ua[s].size for s in seeds}) != 1:
        return None
    diff = np.stack([ua[s] - ub[s] for s in seeds])  # [S, J]: a - b
    sign = 1.0 if text else -1.0  # lower loss / higher accuracy is better
    if sign * diff.mean() > 0:  # b is the better one: test b - a
        a, b, diff = b, a, -diff
    per_seed = diff.mean(1)
    groups = file_groups(results, diff.shape[1])
    if text:
        effect, statistic = math.exp(diff.mean()), lambda m: np.exp(m.mean(1))
        low, high = bootstrap(diff, statistic, crossed=True)
        wins = int(np.sum(per_seed < 0))
    else:
        effect, statistic = 100 * diff.mean(), lambda m: 100 * m.mean(1)
        low, high = bootstrap(diff, statistic, crossed=False)
        wins = int(np.sum(per_seed > 0))
    model = seedlevel.mixed_model_test(diff, groups=groups, crossed=text)
    seed_low, seed_high = (float(statistic(np.array([[v]]))[0]) for v in (model.low, model.high))
    found = Comparison(
        length=length,
        first=a,
        second=b,
        metric="ppl" if text else "accuracy",
        effect=effect,
        low=low,
        high=high,
        p=1.0,
        wins=wins,
        seeds=len(seeds),
        units=diff.size,
        p_seed=model.p,
        seed_low=seed_low,
        seed_high=seed_high,
        seed_df=model.df,
    )
    return found, diff


def cell_interval(units: dict[int, np.ndarray], metric: str) -> tuple[float, float] | None:
    """The 95 % interval of a table cell that includes the text: perplexity, the mean
    over seeds of ``exp`` (segment mean loss), bootstrapped over seeds and segments;
    accuracy, Wilson's interval of the solved share over every seed's examples."""
    if not units:
        return None
    if metric == "accuracy":
        solved = sum(int(v.sum()) for v in units.values())
        return wilson_interval(solved, sum(v.size for v in units.values()))
    if len({v.size for v in units.values()}) != 1:
        return None
    values = np.stack(list(units.values()))  # [S, J]
    return bootstrap(values, lambda m: np.exp(m).mean(1), crossed=True)
