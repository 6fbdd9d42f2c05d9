"""Every pair of rows compared at every evaluation length, and the table's intervals,
from the per-segment losses (text) or per-example outcomes (tasks) a run records.

Shapes: ``S`` seeds, ``J`` units per seed. The tests and intervals are those of
``posenc.lab.significance``: a paired sign-flip permutation test over (seed, unit)
pairs, Holm's correction over every comparison of the report, a bootstrap interval of
the effect over seeds and units, and Wilson's interval for accuracies. A pair is called
*separated* ("A better than B") when the corrected p is below 0.05 and the effect's
interval excludes no difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from posenc.lab.significance import (
    PERMUTATIONS,
    bootstrap,
    holm,
    sign_flip_tests,
    wilson_interval,
)

__all__ = [
    "Comparison",
    "cell_interval",
    "compare_all",
    "pairwise_lines",
    "sentence",
    "unit_rows",
]


@dataclass(frozen=True)
class Comparison:
    """Two rows at one length; ``first`` is the better one by the mean difference.

    Attributes:
        effect: text: perplexity ratio ``first / second`` (``exp`` of the mean loss
            difference, below 1); tasks: accuracy difference in points (above 0).
        low, high: the effect's 95 % bootstrap interval over seeds and units.
        p: the permutation test's two-sided p-value; ``p_holm``: Holm-corrected.
        wins, seeds: seeds in which ``first`` beats ``second``; seeds with both.
        units: paired units tested (seeds x segments or examples).
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
    p_holm: float = 1.0

    @property
    def separated(self) -> bool:
        """Holm-corrected ``p < 0.05`` and an interval that excludes no difference."""
        null = 1.0 if self.metric == "ppl" else 0.0
        return self.p_holm < 0.05 and not self.low <= null <= self.high


#: Rows derived at evaluation time; at or below the training length they are their model.
_DERIVED = ("scaling", "interpolate")


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


def compare_all(results: dict) -> list[Comparison]:
    """Every pair of rows at every evaluation length, with Holm's correction over all
    of them. Up to the training length, rows derived at evaluation time are left out."""
    text = results["metric"] == "ppl"
    kinds = {row["label"]: row["kind"] for run in results["runs"] for row in run["rows"]}
    table = unit_rows(results)
    train_len = results["config"]["train_len"]
    out = []
    for n in results["config"]["eval_lens"]:
        length = str(n)
        labels = [
            label
            for label, cells in table.items()
            if length in cells and not (n <= train_len and kinds[label] in _DERIVED)
        ]
        for i, a in enumerate(labels):
            for b in labels[i + 1 :]:
                found = _compare(length, a, b, table[a][length], table[b][length], text=text)
                if found is not None:
                    out.append(found)
    p = [0.0] * len(out)
    for size in {diff.size for _, diff in out}:  # one matrix product per unit count
        index = [i for i, (_, diff) in enumerate(out) if diff.size == size]
        tested = sign_flip_tests(np.stack([out[i][1].ravel() for i in index]))
        for i, value in zip(index, tested.tolist(), strict=True):
            p[i] = value
    adjusted = holm(p)
    return [
        Comparison(**{**c.__dict__, "p": pi, "p_holm": ph})
        for (c, _), pi, ph in zip(out, p, adjusted, strict=True)
    ]


def _compare(length: str, a: str, b: str, ua: dict, ub: dict, *, text: bool) -> Comparison | None:
    seeds = [s for s in ua if s in ub and ua[s].shape == ub[s].shape]
    if not seeds:
        return None
    diff = np.stack([ua[s] - ub[s] for s in seeds])  # [S, J]: a - b
    sign = 1.0 if text else -1.0  # lower loss / higher accuracy is better
    if sign * diff.mean() > 0:  # b is the better one: test b - a
        a, b, diff = b, a, -diff
    per_seed = diff.mean(1)
    if text:
        effect = math.exp(diff.mean())
        low, high = bootstrap(diff, lambda m: np.exp(m.mean(1)), crossed=True)
        wins = int(np.sum(per_seed < 0))
    else:
        effect = 100 * diff.mean()
        low, high = bootstrap(diff, lambda m: 100 * m.mean(1), crossed=False)
        wins = int(np.sum(per_seed > 0))
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


def _where(length: int, train_len: int) -> str:
    return "the training length" if length == train_len else f"{length / train_len:g}x training"


def sentence(c: Comparison) -> str:
    """``"A better than B (p, effect [interval], seeds)"``, or ``"A vs B: not separated
    (...)"``; ``p`` is Holm-corrected."""
    if c.metric == "ppl":
        effect = f"perplexity x{c.effect:.3f} [{c.low:.3f}, {c.high:.3f}]"
    else:
        effect = f"{c.effect:+.1f} points [{c.low:+.1f}, {c.high:+.1f}]"
    detail = f"p_Holm = {c.p_holm:.2g}, {effect}, better in {c.wins}/{c.seeds} seeds"
    if c.separated:
        return f"{c.first} better than {c.second} ({detail})"
    return f"{c.first} vs {c.second}: not separated ({detail})"


def pairwise_lines(results: dict, comparisons: list[Comparison]) -> list[str]:
    """The report's section: how the tests work, then every pair at every length,
    separated pairs first."""
    if not comparisons:
        return []
    units = "segments" if results["metric"] == "ppl" else "examples"
    effect = (
        "perplexity ratio (exp of the mean per-byte loss difference)"
        if results["metric"] == "ppl"
        else "accuracy difference"
    )
    lines = [
        "Pairwise tests, every pair at every length: a paired sign-flip permutation test of "
        f"the mean difference over (seed, {units[:-1]}) pairs (exact, or "
        f"{PERMUTATIONS:,} random flips), p-values Holm-corrected over all "
        f"{len(comparisons)} comparisons of this report; effect: {effect} with its 95 % "
        f"bootstrap interval over seeds and {units}. The test takes the trained models as "
        "given (it measures the evaluation text); the interval and the seed count also "
        "cover the training seed. 'Better than' needs p_Holm < 0.05 and an interval that "
        "excludes no difference. The table's intervals include which text was sampled, so "
        "they overlap even where the paired tests separate two rows.",
        "",
    ]
    train_len = results["config"]["train_len"]
    for n in results["config"]["eval_lens"]:
        here = [c for c in comparisons if c.length == str(n)]
        if not here:
            continue
        split = sum(c.separated for c in here)
        lines += [f"At {n} ({_where(n, train_len)}), {split} of {len(here)} pairs separated:", ""]
        here.sort(key=lambda c: (not c.separated, c.p_holm))
        lines += [f"- {sentence(c)}" for c in here]
        lines.append("")
    return lines
