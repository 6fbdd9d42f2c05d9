"""The lab's figures: the metric against evaluation length (mean over seeds with its 95 %
interval) and, for text, perplexity against position inside the longest windows.

Every row keeps its colour and marker from ``posenc.palette`` in every run, distinct
from every other row of the figure (``palette.styles``); rows that tie (variants equal
to their model up to the training length) are drawn side by side, slightly apart on the
length axis; a row with no value at a length (a learned table past its rows) says so in
its legend entry, never in the data area; rows derived at evaluation time (scalings, an
interpolated table) start past the training length, where they differ from their model;
each seed's value is a small point under the mean; a run that never learned its task is
named in the legend. The perplexity axis runs from a labelled tick
at or below the data to one at or above it. matplotlib is imported only when a figure is
drawn (Agg backend, no display needed). Nothing is drawn without a value.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from posenc.lab import panels, stats
from posenc.lab.curves import LEARNING, curves, draw_learning
from posenc.lab.pairwise import DERIVED
from posenc.lab.results import write_bytes
from posenc.palette import style, styles

__all__ = ["draw_all", "figure_names"]

_DODGE = 0.05  # log2 units between neighbouring rows of a panel at one length


def _has_positions(results: dict) -> bool:
    longest = str(max(results["config"]["eval_lens"]))
    return any(
        (row["results"].get(longest) or {}).get("position_loss")
        for run in results["runs"]
        if run["status"] == "ok"
        for row in run["rows"]
    )


def figure_names(results: dict) -> list[str]:
    """The figures ``draw_all`` writes for ``results`` (none without a finished row)."""
    if not stats.rows(results):
        return []
    names = ["perplexity.png" if results["metric"] == "ppl" else "accuracy.png"]
    if _has_positions(results):
        names.append("position.png")
    if curves(results):
        names.append(LEARNING)  # posenc.lab.curves
    return names


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    buffer = io.BytesIO()  # rendered in memory: a full disk is an OSError naming the file
    fig.savefig(buffer, format="png", bbox_inches="tight")
    write_bytes(path, buffer.getvalue())
    return path


def _log_ticks(ax, low: float, high: float) -> None:
    """Readable ticks on a log perplexity axis that cover the data: the axis runs from the
    last tick at or below ``low`` to the first at or above ``high``; 1-1.5-2-3-4-5-7 steps
    per decade across a wide range, evenly spaced round numbers across a narrow one."""
    from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator

    if high / low > 4:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        steps = (1, 1.5, 2, 3, 4, 5, 7)
        ticks = [s * 10**d for d in range(first, last + 1) for s in steps]
    else:
        ticks = [t for t in MaxNLocator(nbins=5).tick_values(low, high) if t > 0]
    below = [t for t in ticks if t <= low] or [min(ticks)]
    above = [t for t in ticks if t >= high] or [max(ticks)]
    bottom, top = max(below), min(above)
    ticks = [t for t in ticks if bottom <= t <= top]
    ax.set_ylim(bottom, top)
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_yticklabels([f"{t:g}" for t in ticks])


def _interval_words(results: dict) -> str:
    """What the error bars are: a 95 % interval over seeds, or nothing with one seed."""
    seeds = len(results["seeds"])
    if seeds < 2:
        return "one seed, no interval"
    return f"mean and 95% interval over {seeds} seeds"


def _unlearned(results: dict) -> dict[str, list[str]]:
    """``{encoding: [seeds]}`` of the runs that never learned their task (no row)."""
    out: dict[str, list[str]] = {}
    for run in results["runs"]:
        if run["status"] == "ok" and run.get("learned") is False:
            out.setdefault(run["encoding"], []).append(str(run["seed"]))
    return out


def _drawn_at(row, n: int, config: dict) -> bool:
    """Whether ``row`` has a point at length ``n`` (a derived row equals its model up to
    the training length: drawn once there, by the model's row)."""
    derived = row.kind in DERIVED and n <= config["train_len"]
    return not derived and row.cells[str(n)].mean is not None


def _shifts(rows: list, config: dict) -> dict[str, dict[int, float]]:
    """``{label: {length: factor}}``: the rows with a point at one length spread evenly
    about it, ``_DODGE`` log2 units apart (one row alone stays on the length)."""
    out: dict[str, dict[int, float]] = {row.label: {} for row in rows}
    for n in config["eval_lens"]:
        there = [row.label for row in rows if _drawn_at(row, n, config)]
        for index, label in enumerate(there):
            out[label][n] = 2 ** (_DODGE * (index - (len(there) - 1) / 2))
    return out


def _draw_row(ax, row, look, shifts: dict[int, float], config: dict) -> list[float]:
    """One row's means with their intervals (and each seed's value, small, under the
    mean) at its ``shifts`` off each length; returns the y values the axis must show."""
    xs, ys, errs, shown = [], [], [], []
    missing = [str(n) for n in config["eval_lens"] if row.cells[str(n)].mean is None]
    for n, shift in shifts.items():
        cell = row.cells[str(n)]
        xs.append(n * shift)
        ys.append(cell.mean)
        errs.append(cell.half_width or 0.0)
        seeds = cell.present
        if len(seeds) > 1:
            ax.plot([n * shift] * len(seeds), seeds, linestyle="none", marker=look.marker,
                    markersize=2.5, color=look.color, alpha=0.45)  # fmt: skip
            shown += [v for v in seeds if v > 0]
    shown += [y - e for y, e in zip(ys, errs, strict=True) if y - e > 0]
    shown += [y + e for y, e in zip(ys, errs, strict=True)]
    label = row.label + (f" (n/a at {', '.join(missing)})" if missing else "")
    ax.errorbar(xs, ys, yerr=errs, color=look.color, marker=look.marker, fillstyle=look.fill,
                markerfacecolor="white" if look.fill == "none" else look.color,
                linestyle=look.linestyle, markersize=5, capsize=3, elinewidth=1,
                linewidth=1.3, label=label)  # fmt: skip
    return shown


def _length_axes(ax, config: dict) -> None:
    lens = config["eval_lens"]
    _mark_training_length(ax, config["train_len"])
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(lens) / 2**0.35, max(lens) * 2**0.35)
    ax.set_xticks(lens, [str(n) for n in lens])
    ax.minorticks_off()
    ax.set_xlabel("evaluation length (tokens, log2)", fontsize=8)
    ax.grid(True, which="major", alpha=0.3)


def _y_axes(axes: list, shown: dict, *, shared: bool, label: str) -> None:
    """Log ticks covering the data: one range for shared panels, each its own otherwise."""
    everything = [v for values in shown.values() for v in values]
    for ax in axes:
        ax.set_yscale("log")
        values = everything if shared else shown[ax]
        if values:
            _log_ticks(ax, min(values) / 1.03, max(values) * 1.03)
        ax.set_ylabel(label, fontsize=8)


def _length_figure(results: dict, out: Path, plt) -> Path:
    config, metric = results["config"], results["metric"]
    table = {row.label: row for row in stats.rows(results)}
    unlearned = _unlearned(results)
    groups = panels.by_panel(dict.fromkeys([*table, *unlearned]))  # a row can be both
    shown: dict = {}
    values = [c.mean for r in table.values() for c in r.cells.values() if c.mean]
    shared = metric != "ppl" or not values or panels.shares(min(values), max(values), log=True)
    fig, axes = panels.grid(plt, list(groups), sharey=shared)
    for key, labels in groups.items():
        ax, rows = axes[key], [table[label] for label in labels if label in table]
        looks, shifts = styles(row.label for row in rows), _shifts(rows, config)
        shown[ax] = []
        for row in rows:
            shown[ax] += _draw_row(ax, row, looks[row.label], shifts[row.label], config)
        for name in (label for label in labels if label in unlearned):  # legend only
            label = f"{name}: not learned (seed {', '.join(unlearned[name])})"
            ax.plot([], [], color=style(name).color, marker="x", linestyle="none", label=label)
        _length_axes(ax, config)
        panels.label_panel(ax, key)
    if metric == "ppl":
        _y_axes(list(axes.values()), shown, shared=shared, label="per-byte perplexity (log)")
    else:
        for ax in axes.values():
            ax.set_ylim(-0.02, 1.02)
            ax.set_ylabel("exact-match accuracy", fontsize=8)
    what = "held-out text" if config["task"] == "lm" else f"task {config['task']}"
    fig.suptitle(f"posenc lab: {what}, trained at {config['train_len']}; "
                 f"{_interval_words(results)}", fontsize=10)  # fmt: skip
    path = _save(fig, out / figure_names(results)[0])
    plt.close(fig)
    return path


def _mark_training_length(ax, train_len: int) -> None:
    ax.axvline(train_len, color="grey", linewidth=1)
    ax.annotate("training length", (train_len, 0.5), xycoords=("data", "axes fraction"),
                rotation=90, va="center", ha="right", color="grey", fontsize=7)  # fmt: skip


def _position_figure(results: dict, out: Path, plt) -> Path:
    config = results["config"]
    longest = str(max(config["eval_lens"]))
    curves: dict[str, list[list[float]]] = {}
    for run in results["runs"]:
        if run["status"] != "ok":
            continue
        for row in run["rows"]:
            losses = (row["results"].get(longest) or {}).get("position_loss")
            if losses:
                curves.setdefault(row["label"], []).append(losses)
    groups = panels.by_panel(curves)
    means = {label: [math.exp(sum(v) / len(v)) for v in zip(*per_seed, strict=True)]
             for label, per_seed in curves.items()}  # fmt: skip
    values = [v for ppl in means.values() for v in ppl]
    shared = panels.shares(min(values), max(values), log=True)
    fig, axes = panels.grid(plt, list(groups), sharey=shared)
    shown: dict = {}
    for key, labels in groups.items():
        ax, looks = axes[key], styles(labels)
        shown[ax] = []
        for label in labels:
            look, ppl = looks[label], means[label]
            width = int(longest) / len(ppl)
            xs = [(i + 0.5) * width for i in range(len(ppl))]
            ax.plot(xs, ppl, color=look.color, linestyle=look.linestyle, marker=look.marker,
                    fillstyle=look.fill, markevery=max(1, len(ppl) // 8), markersize=4,
                    linewidth=1.3, label=label)  # fmt: skip
            shown[ax] += ppl
        _mark_training_length(ax, config["train_len"])
        ax.set_xlabel(f"position inside windows of {longest} tokens", fontsize=8)
        ax.grid(True, which="major", alpha=0.3)
        panels.label_panel(ax, key)
    _y_axes(list(axes.values()), shown, shared=shared, label="per-byte perplexity (log)")
    seeds = len(results["seeds"])
    over = "one seed" if seeds < 2 else f"mean over {seeds} seeds"
    fig.suptitle(f"posenc lab: perplexity by position at length {longest}, trained at "
                 f"{config['train_len']} ({over})", fontsize=10)  # fmt: skip
    path = _save(fig, out / "position.png")
    plt.close(fig)
    return path


def draw_all(results: dict, out: Path) -> list[Path]:
    """Draw every figure of ``figure_names(results)`` into ``out``; return their paths."""
    names = figure_names(results)
    if not names:
        return []
    plt = _pyplot()
    paths = [_length_figure(results, out, plt)]
    if "position.png" in names:
        paths.append(_position_figure(results, out, plt))
    if LEARNING in names:
        paths.append(draw_learning(results, out, plt))
    return paths
