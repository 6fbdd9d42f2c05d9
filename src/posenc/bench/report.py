"""Targets of the speed issue, checked on measured groups, and the printed tables.

A target is a ratio measured within one run: a multiple of the copy floor (``<=`` a
limit) or a speedup over the transformers-style expression (``>=`` a limit). Targets
are only defined on the suite's full shapes; ``--quick`` runs skip them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from posenc.bench.rope import HF_STYLE
from posenc.bench.timing import Group

__all__ = [
    "Target",
    "print_groups",
    "print_memory",
    "print_rows",
    "print_targets",
    "rope_targets",
]

TARGET_SHAPES = ([4, 16, 2048, 64], [1, 32, 8192, 128])


@dataclass(frozen=True)
class Target:
    """One checked target: ``value`` against ``limit`` (``at_most`` or at least)."""

    name: str
    value: float
    limit: float
    at_most: bool

    @property
    def met(self) -> bool:
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "value": self.value,
            "limit": self.limit,
            "at_most": self.at_most,
            "met": self.met,
        }


def _case_targets(group: Group, label: str) -> list[Target]:
    dtype, kind = group.info["dtype"], group.info["pass"]
    out = []
    for layout in ("half", "interleaved"):
        fresh = f"posenc apply_rope {layout}"
        in_place = f"posenc apply_rope_ {layout} (in place)"
        copy = group.ratio_to_floor(fresh)
        if dtype == "float32":
            speedup = group.speedup(fresh, HF_STYLE)
            if speedup is not None:
                out.append(
                    Target(f"{label} {layout}: x faster than {HF_STYLE}", speedup, 10, False)
                )
            out.append(Target(f"{label} {layout}: apply_rope / copy floor", copy, 2.0, True))
            if kind == "forward":
                ratio = group.ratio_to_floor(in_place)
                out.append(Target(f"{label} {layout}: apply_rope_ / copy floor", ratio, 1.3, True))
        elif kind == "forward":
            out.append(Target(f"{label} {layout}: apply_rope / copy floor", copy, 3.0, True))
            ratio = group.ratio_to_floor(in_place)
            out.append(Target(f"{label} {layout}: apply_rope_ / copy floor", ratio, 3.0, True))
    return out


def rope_targets(groups: list[Group]) -> list[Target]:
    """The issue's RoPE targets, for the groups measured on its shapes."""
    targets = []
    for group in groups:
        if group.suite != "rope" or group.info.get("shape") not in TARGET_SHAPES:
            continue
        label = f"{group.info['shape']} {group.info['dtype']} {group.info['pass']}"
        targets.extend(_case_targets(group, label))
    return targets


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def print_groups(console: Console, groups: list[Group]) -> None:
    """One table per group: median, IQR, min-max, multiple of the floor, speedups."""
    for group in groups:
        table = Table(title=group.title, title_justify="left")
        for column in ("case", "median ms", "IQR ms", "min-max ms", "x floor"):
            table.add_column(column, justify="left" if column == "case" else "right")
        for baseline in group.speedup_over:
            table.add_column(f"x faster than {baseline}", justify="right")
        for name, st in group.stats.items():
            row = [
                name,
                f"{st.median_ms:.3f}",
                f"{st.q1_ms:.3f}-{st.q3_ms:.3f}",
                f"{st.min_ms:.3f}-{st.max_ms:.3f}",
                _ratio(group.ratio_to_floor(name)),
            ]
            row += [_ratio(group.speedup(name, b)) for b in group.speedup_over]
            table.add_row(*row)
        console.print(table)


def print_memory(console: Console, rows: list[dict[str, object]]) -> None:
    """Peak memory of blocked bias attention against the materialized bias."""
    if not rows:
        return
    table = Table(title="bias attention peak tensor memory (MiB)", title_justify="left")
    for column in ("encoding", "T", "blocked", "materialized", "backend", "saving"):
        table.add_column(column, justify="left" if column == "encoding" else "right")
    for row in rows:
        table.add_row(
            str(row["encoding"]),
            str(row["T"]),
            f"{row['blocked_mib']:.1f}",
            f"{row['materialized_mib']:.1f}",
            str(row["materialized_backend"]),
            _ratio(row["saving"]),  # type: ignore[arg-type]
        )
    console.print(table)


def print_rows(console: Console, title: str, rows: object) -> None:
    """A list of flat dicts (an external benchmark's result) as a table."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return
    table = Table(title=title, title_justify="left")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        cells = (row.get(c) for c in columns)
        table.add_row(
            *("-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v) for v in cells)
        )
    console.print(table)


def print_targets(console: Console, targets: list[Target], *, quick: bool) -> None:
    """The targets with their measured ratios, met or not."""
    if quick or not targets:
        console.print("targets: not evaluated (they are defined on the full shapes)")
        return
    table = Table(title="targets (ratios within this run)", title_justify="left")
    for column in ("target", "measured", "limit", "met"):
        table.add_column(column, justify="left" if column == "target" else "right")
    for t in targets:
        limit = f"{'<=' if t.at_most else '>='} {t.limit:g}"
        table.add_row(t.name, f"{t.value:.2f}", limit, "yes" if t.met else "NO")
    console.print(table)
