"""A task report's second view: per-token accuracy of every run, learned or not.

The report's table and pairwise tests judge length generalisation by exact match and only
for runs that learned the task in distribution (``posenc.lab.runs``): a model that never
solved the task at the training length cannot be said to generalise. At a small budget
that can leave few rows, or none, while the runs still differ in how much of the answer
they get right at longer lengths. This section shows that, without the gate: each
row's per-token accuracy (the share of answer tokens that are the argmax) at every
length, mean over all seeds, with how many of its runs learned the task, and every pair
of rows compared at the seed level: the per-seed accuracy differences ``[S]`` tested
by ``posenc.lab.seedlevel.mixed_model_test`` (each seed draws its own examples, so the
t-test of the per-seed differences on ``S - 1`` degrees of freedom), Holm-corrected over
this section's comparisons.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from posenc.lab.pairwise import DERIVED
from posenc.lab.seedlevel import mixed_model_test
from posenc.lab.significance import holm

__all__ = ["TokenComparison", "token_comparisons", "token_lines"]


@dataclass(frozen=True)
class TokenComparison:
    """Two rows at one length; ``first`` has the higher mean per-token accuracy.

    Attributes:
        effect: mean per-seed difference in points; ``low``, ``high``: its 95 % interval.
        p_holm: the seed-level p-value, Holm-corrected over the section.
        wins, seeds: seeds in which ``first`` is higher; seeds with both.
    """

    length: str
    first: str
    second: str
    effect: float
    low: float
    high: float
    p_holm: float
    wins: int
    seeds: int

    @property
    def separated(self) -> bool:
        return self.p_holm < 0.05 and self.low > 0.0


def _values(results: dict) -> dict[tuple[str, str], dict[int, float]]:
    """``{(row label, length): {seed: per-token accuracy in points}}`` of every finished
    run's rows (a learned table's interpolated row beside its own), learned or not."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for run in results["runs"]:
        if run["status"] != "ok":
            continue
        for row in run["rows"]:
            for length, result in row["results"].items():
                if result is not None and "token_accuracy" in result:
                    cell = out.setdefault((row["label"], length), {})
                    cell[run["seed"]] = 100.0 * result["token_accuracy"]
    return out


def _labels(results: dict) -> dict[str, list[bool]]:
    """Every row label in sweep order, with whether each of its runs learned the task."""
    out: dict[str, list[bool]] = {}
    for run in results["runs"]:
        if run["status"] == "ok":
            for row in run["rows"]:
                out.setdefault(row["label"], []).append(run.get("learned") is not False)
    return out


def token_comparisons(results: dict) -> list[TokenComparison]:
    """Every pair of rows at every length with two or more common seeds; up to the
    training length, rows derived at evaluation time are left out (they are their model)."""
    values, every = _values(results), list(_labels(results))
    kinds = {row["label"]: row["kind"] for run in results["runs"] for row in run["rows"]}
    found = []
    for n in results["config"]["eval_lens"]:
        length = str(n)
        derived_too = n > results["config"]["train_len"]
        labels = [label for label in every if derived_too or kinds[label] not in DERIVED]
        for a, b in itertools.combinations(labels, 2):
            va, vb = values.get((a, length), {}), values.get((b, length), {})
            seeds = sorted(set(va) & set(vb))
            if len(seeds) < 2:
                continue
            diff = np.array([[va[s] - vb[s]] for s in seeds])  # [S, 1]
            if diff.mean() < 0:
                a, b, diff = b, a, -diff
            test = mixed_model_test(diff, crossed=False)
            wins = int(np.sum(diff > 0))
            found.append((length, a, b, test, wins, len(seeds)))
    adjusted = holm([test.p for _, _, _, test, _, _ in found])
    return [
        TokenComparison(length, a, b, test.estimate, test.low, test.high, p, wins, seeds)
        for (length, a, b, test, wins, seeds), p in zip(found, adjusted, strict=True)
    ]


def token_lines(results: dict) -> list[str]:
    """The report's section: the table and the separated pairs at each length."""
    values = _values(results)
    if not values:
        return []
    lens = [str(n) for n in results["config"]["eval_lens"]]
    comparisons = token_comparisons(results)
    lines = [
        "Per-token accuracy of every run, whether it learned the task or not (answer "
        "tokens that are the argmax, mean over seeds; 'learned': the runs that reached "
        "the exact-match threshold at the training length), and the pairs a seed-level "
        "t-test of the per-seed differences separates (Holm over this section's "
        f"{len(comparisons)} comparisons):",
        "",
        "| row | learned | " + " | ".join(lens) + " |",
        "|---|---:|" + "---:|" * len(lens),
    ]
    for name, done in _labels(results).items():
        cells = [values.get((name, n), {}) for n in lens]
        shown = [f"{np.mean(list(c.values())):.1f}" if c else "n/a" for c in cells]
        lines.append(f"| {name} | {sum(done)}/{len(done)} | " + " | ".join(shown) + " |")
    lines.append("")
    for n in lens:
        split = [c for c in comparisons if c.length == n and c.separated]
        here = sum(c.length == n for c in comparisons)
        said = "; ".join(
            f"{c.first} > {c.second} ({c.effect:+.1f} points [{c.low:+.1f}, {c.high:+.1f}], "
            f"p_Holm = {c.p_holm:.2g}, {c.wins}/{c.seeds} seeds)"
            for c in sorted(split, key=lambda c: c.p_holm)
        )
        lines.append(
            f"- At {n}: {len(split)} of {here} pairs separated" + (f": {said}." if said else ".")
        )
    return [*lines, ""]
