"""Statistics over seeds: means, 95 % intervals, paired wins and the orderings that hold.

Every row (a trained model or a variant) has one value per seed and evaluation length.
The interval is Student's t interval of the mean over seeds (``mean +- t_{0.975, n-1} *
sd / sqrt(n)``); a *paired* comparison counts the seeds in which one row beats another at
a length (same seed: same initialisation, data order and evaluation text). An ordering
``a < b`` is stated only when ``a`` beats ``b`` in every seed that has both; such
orderings chain (if a beats b and b beats c in every seed, a beats c in every seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Cell", "Row", "chain", "higher_is_better", "paired_wins", "rows", "t_quantile"]

#: Two-sided 95 % quantiles of Student's t for 1..10 degrees of freedom (more: normal-ish).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t_quantile(df: int) -> float:
    """``t_{0.975, df}`` (tabulated to 10, then the Cornish-Fisher expansion)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Cell:
    """One row at one length: the value per seed (``None``: no value) and its summary."""

    values: dict[int, float | None]

    @property
    def present(self) -> list[float]:
        return [v for v in self.values.values() if v is not None]

    @property
    def mean(self) -> float | None:
        got = self.present
        return sum(got) / len(got) if got else None

    @property
    def half_width(self) -> float | None:
        """Half the 95 % interval of the mean; ``None`` with fewer than two values."""
        got = self.present
        if len(got) < 2:
            return None
        mean = sum(got) / len(got)
        sd = math.sqrt(sum((v - mean) ** 2 for v in got) / (len(got) - 1))
        return t_quantile(len(got) - 1) * sd / math.sqrt(len(got))


@dataclass(frozen=True)
class Row:
    """A row label with its cells by length (as in ``results.json``: string keys)."""

    label: str
    cells: dict[str, Cell]
    kind: str = "trained"


def higher_is_better(metric: str) -> bool:
    return metric == "accuracy"


def value_of(metric: str, result: dict | None) -> float | None:
    """The number a cell shows: perplexity or exact-match accuracy."""
    if result is None:
        return None
    return result["accuracy"] if metric == "accuracy" else result["ppl"]


def rows(results: dict) -> list[Row]:
    """Every row label of the finished runs, in sweep order, with its cells over seeds."""
    lens = [str(n) for n in results["config"]["eval_lens"]]
    table: dict[str, dict[str, dict[int, float | None]]] = {}
    kinds: dict[str, str] = {}
    for run in results["runs"]:
        if run["status"] != "ok" or run.get("learned") is False:
            continue
        for row in run["rows"]:
            cells = table.setdefault(row["label"], {n: {} for n in lens})
            kinds[row["label"]] = row["kind"]
            for n in lens:
                cells[n][run["seed"]] = value_of(results["metric"], row["results"].get(n))
    return [
        Row(label, {n: Cell(v) for n, v in cells.items()}, kinds[label])
        for label, cells in table.items()
    ]


def paired_wins(a: Cell, b: Cell, *, higher: bool) -> tuple[int, int]:
    """``(seeds where a beats b, seeds where both have a value)``."""
    both = [(a.values[s], b.values[s]) for s in a.values if s in b.values]
    both = [(x, y) for x, y in both if x is not None and y is not None]
    wins = sum((x > y) if higher else (x < y) for x, y in both)
    return wins, len(both)


def chain(
    table: list[Row], length: str, *, higher: bool, train_len: int | None = None
) -> list[tuple[str, bool]]:
    """Rows at ``length`` sorted best first, each with whether it beats the next row in
    every seed (``False``: within noise, or a single seed). Up to ``train_len``, rows
    derived at evaluation time (scalings, interpolation) are their model and are left out."""
    derived = ("scaling", "interpolate")
    ranked = [
        r
        for r in table
        if r.cells[length].mean is not None
        and not (train_len and int(length) <= train_len and r.kind in derived)
    ]
    if not ranked:  # e.g. no run learned its task
        return []
    ranked.sort(key=lambda r: r.cells[length].mean, reverse=higher)
    out = []
    for here, after in zip(ranked, [*ranked[1:], None], strict=True):
        if after is None:
            out.append((here.label, False))
            continue
        wins, both = paired_wins(here.cells[length], after.cells[length], higher=higher)
        out.append((here.label, both >= 2 and wins == both))
    return out
