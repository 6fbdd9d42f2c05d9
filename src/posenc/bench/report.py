"""Targets of the speed issue, checked on measured groups, and the printed tables.

A target is a ratio measured within one run: a multiple of the copy floor (``<=`` a
limit) or a speedup over the transformers-style expression (``>=`` a limit), on the
medians or on the maxima. Targets are only defined on the suite's full shapes;
``--quick`` runs skip them. Every printed table fits 80 columns: names are short, and
quartiles, minima and the long descriptions are in the JSON (``--json``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table

from posenc.bench.rope import CLONE, FLOOR, HF_STYLE, posenc_cases
from posenc.bench.timing import Group, median_ratio

__all__ = [
    "Target",
    "format_ms",
    "format_ratio",
    "print_groups",
    "print_memory",
    "print_targets",
    "rope_targets",
    "rows_table",
]

TARGET_SHAPES = ([4, 16, 2048, 64], [1, 32, 8192, 128])
_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
_PASSES = {"forward": "fwd", "forward+backward": "fwd+bwd"}


@dataclass(frozen=True)
class Target:
    """One checked target: ``value`` of ``what`` in ``group`` against ``limit``."""

    group: str
    what: str
    value: float
    limit: float
    at_most: bool
    spread: float | None = None

    @property
    def name(self) -> str:
        return f"{self.group} {self.what}"

    @property
    def met(self) -> bool:
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    @property
    def within_spread(self) -> bool | None:
        """Whether the value is within the limit widened by the baseline's A/A spread:
        a miss that the baseline timed against itself could have shown in this run
        (None without a control)."""
        if self.spread is None:
            return None
        if self.at_most:
            return self.value <= self.limit * self.spread
        return self.value >= self.limit / self.spread

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "value": self.value,
            "limit": self.limit,
            "at_most": self.at_most,
            "met": self.met,
            "baseline_spread": self.spread,
            "within_spread": self.within_spread,
        }


def _label(group: Group) -> str:
    """``[4,16,2048,64] fp32 fwd``: a group in 25 characters or fewer."""
    shape = ",".join(str(n) for n in group.info["shape"])  # type: ignore[union-attr]
    return f"[{shape}] {_DTYPES[group.info['dtype']]} {_PASSES[group.info['pass']]}"


def _never_slower(group: Group, label: str) -> list[Target]:
    """The slowest posenc case's speedup over the expression, by median and by maximum."""
    cases = posenc_cases(group)
    if HF_STYLE not in group.stats or not cases:
        return []
    slowest = min(group.speedup(c, HF_STYLE) for c in cases)  # type: ignore[type-var]
    expression_max = group.stats[HF_STYLE].max_ms
    slowest_max = min(expression_max / group.stats[c].max_ms for c in cases)
    return [
        Target(label, "slowest: × faster", slowest, 1.0, False),
        Target(label, "slowest: × faster (max)", slowest_max, 1.0, False),
    ]


def _ratio(group: Group, case: str, baseline: str, *, worst: bool) -> float | None:
    """``case`` over ``baseline``: the median of per-round ratios, or of maxima when
    ``worst``."""
    if case not in group.stats or baseline not in group.stats:
        return None
    mine, base = group.stats[case], group.stats[baseline]
    return mine.max_ms / base.max_ms if worst else median_ratio(mine, base)


def _floor_targets(group: Group, label: str) -> list[Target]:
    """The floor and speedup targets for each layout.

    Forward, float32 and bfloat16, by median and by maximum: out of place at most 1.2x
    a fresh copy of the same tensors (``clone``: both allocate and first-touch their
    output), in place at most 1.1x the copy into preallocated tensors. float32 also: 10x
    faster than the expression, and forward+backward at most twice its copy floor.
    """
    dtype, forward = group.info["dtype"], group.info["pass"] == "forward"
    out = []
    for layout in ("half", "intl"):
        fresh, in_place = f"apply_rope {layout}", f"apply_rope_ {layout} (in place)"
        if dtype == "float32":
            speedup = group.speedup(fresh, HF_STYLE)
            if speedup is not None:
                out.append(Target(label, f"{layout}: × faster", speedup, 10, False))
            ratio = group.ratio_to_floor(fresh)
            if not forward and ratio is not None:
                out.append(Target(label, f"{layout}: ÷ floor", ratio, 2.0, True))
        if forward and dtype in ("float32", "bfloat16"):
            for worst, tag in ((False, ""), (True, " (max)")):
                for case, base, what, limit in (
                    (fresh, CLONE, f"{layout}: ÷ clone{tag}", 1.2),
                    (in_place, FLOOR, f"{layout}_: ÷ floor{tag}", 1.1),
                ):
                    ratio = _ratio(group, case, base, worst=worst)
                    if ratio is not None:
                        spread = group.spread(base, worst=worst)
                        out.append(Target(label, what, ratio, limit, True, spread))
    return out


def rope_targets(groups: list[Group]) -> list[Target]:
    """The issue's RoPE targets, for the groups measured on its shapes."""
    targets = []
    for group in groups:
        if group.suite != "rope" or group.info.get("shape") not in TARGET_SHAPES:
            continue
        label = _label(group)
        targets += _never_slower(group, label) + _floor_targets(group, label)
    return targets


def format_ms(ms: float | None) -> str:
    """Milliseconds with three significant digits (``0.0123``, ``12.3``, ``1,234``)."""
    if ms is None:
        return "-"
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def format_ratio(value: float | None) -> str:
    """A ratio with two decimals (``1.05``), or one above 100."""
    if value is None:
        return "-"
    return f"{value:,.1f}" if value >= 100 else f"{value:.2f}"


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)


def print_groups(console: Console, groups: list[Group]) -> None:
    """One table per group: median and max, multiple of the floor, speedups."""
    for group in groups:
        table = _table(group.title)
        table.add_column("case", no_wrap=True)
        for column in ("median ms", "max ms", "× floor"):
            table.add_column(column, justify="right")
        for _ in group.speedup_over:
            table.add_column("× faster", justify="right")
            table.add_column("(max)", justify="right")
        for name, st in group.stats.items():
            row = [name, format_ms(st.median_ms), format_ms(st.max_ms)]
            row.append(format_ratio(group.ratio_to_floor(name)))
            for baseline in group.speedup_over:
                row.append(format_ratio(group.speedup(name, baseline)))
                base = group.stats.get(baseline)
                row.append(format_ratio(base.max_ms / st.max_ms if base else None))
            table.add_row(*row)
        console.print(table)
        if group.speedup_over:
            console.print(f"  × faster: than {', '.join(group.speedup_over)}; (max): max ÷ max")


def rows_table(title: str, rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> Table:
    """``rows`` (flat dicts) as a table of ``(key, header, format)`` columns."""
    table = _table(title)
    for key, header, _ in columns:
        table.add_column(header, justify="left" if key == "encoding" else "right")
    for row in rows:
        table.add_row(*("-" if row.get(k) is None else fmt.format(row[k]) for k, _, fmt in columns))
    return table


_MEMORY_COLUMNS = (
    ("encoding", "encoding", "{}"),
    ("T", "T", "{:,}"),
    ("blocked_mib", "blocked MiB", "{:,.1f}"),
    ("materialized_mib", "materialized MiB", "{:,.1f}"),
    ("materialized_backend", "backend", "{}"),
    ("saving", "saving", "{:.1f}×"),
)


def print_memory(console: Console, rows: list[dict[str, object]]) -> None:
    """Peak memory of blocked bias attention against the materialized bias."""
    if rows:
        console.print(rows_table("bias attention: peak tensor memory", rows, _MEMORY_COLUMNS))


def print_targets(console: Console, targets: list[Target], *, quick: bool) -> None:
    """The targets with their measured ratios, met or not."""
    if quick or not targets:
        console.print("targets: not evaluated (they are defined on the full shapes)")
        return
    table = _table("targets (ratios within this run)")
    table.add_column("group: target", no_wrap=True)
    for column in ("value", "limit", "A/A", "met"):
        table.add_column(column, justify="right")
    group = None
    for t in targets:
        if t.group != group:  # a heading row per group keeps the table within 80 columns
            group = t.group
            table.add_row(f"{group}:", style="bold")
        limit = f"{'≤' if t.at_most else '≥'} {t.limit:g}"
        row = [f"  {t.what}", format_ratio(t.value), limit, format_ratio(t.spread)]
        table.add_row(*row, "yes" if t.met else "NO")
    console.print(table)
    console.print("  half_, intl_: in place; clone: copy into a fresh tensor; floor: preallocated")
    console.print("  A/A: the baseline against itself timed again in this run (max(a/b, b/a))")
    missed = [t for t in targets if not t.met]
    close = sum(1 for t in missed if t.within_spread)
    console.print(
        f"  {len(targets) - len(missed)} of {len(targets)} met; "
        f"{close} of the {len(missed)} missed by no more than the baseline's A/A spread"
    )
