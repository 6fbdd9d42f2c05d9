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

from posenc.lab import stats
from posenc.lab.curves import LEARNING, curves, draw_learning
from posenc.lab.results import write_bytes
from posenc.palette import style, styles

__all__ = ["draw_all", "figure_names"]

_DODGE = 0.012  # log2 units between neighbouring rows at one length
_DERIVED = ("scaling", "interpolate")  # rows evaluated from a trained model, not trained


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
    last tick at or below ``low`` to the first at or above ``high``; 1-1.5-2-3-5-7 steps
    per decade across a wide range, evenly spaced round numbers across a narrow one."""
    from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator

    if high / low > 4:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        steps = (1, 1.5, 2, 3, 5, 7)
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


def _length_figure(results: dict, out: Path, plt) -> Path:
    config, metric = results["config"], results["metric"]
    lens = config["eval_lens"]
    table = stats.rows(results)
    fig, ax = plt.subplots(figsize=(8.5, 5), dpi=120)
    looks = styles(row.label for row in table)
    means = []
    for index, row in enumerate(table):
        look = looks[row.label]
        shift = 2 ** (_DODGE * (index - (len(table) - 1) / 2))
        xs, ys, errs, missing = [], [], [], []
        for n in lens:
            if row.kind in _DERIVED and n <= config["train_len"]:
                continue  # equal to its model there: drawn once, by the model's row
            cell = row.cells[str(n)]
            if cell.mean is None:
                missing.append(str(n))
                continue
            xs.append(n * shift)
            ys.append(cell.mean)
            errs.append(cell.half_width or 0.0)
            seeds = cell.present
            if len(seeds) > 1:  # each seed's value, small and unlabelled, under the mean
                ax.plot([n * shift] * len(seeds), seeds, linestyle="none", marker=look.marker,
                        markersize=2.5, color=look.color, alpha=0.6)  # fmt: skip
                means += [v for v in seeds if v > 0]
        means += [y - e for y, e in zip(ys, errs, strict=True) if y - e > 0]
        means += [y + e for y, e in zip(ys, errs, strict=True)]
        label = row.label + (f" (n/a at {', '.join(missing)})" if missing else "")
        ax.errorbar(xs, ys, yerr=errs, color=look.color, marker=look.marker,
                    linestyle=look.linestyle, markersize=4, capsize=2, linewidth=1.2,
                    label=label)  # fmt: skip
    unlearned: dict[str, list[str]] = {}  # runs that never learned their task have no row
    for run in results["runs"]:
        if run["status"] == "ok" and run.get("learned") is False:
            unlearned.setdefault(run["encoding"], []).append(str(run["seed"]))
    for name, seeds in unlearned.items():  # named in the legend, drawn nowhere
        label = f"{name}: not learned (seed {', '.join(seeds)})"
        ax.plot([], [], color=style(name).color, marker="x", linestyle="none", label=label)
    _mark_training_length(ax, config["train_len"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(lens, [str(n) for n in lens])
    ax.minorticks_off()
    if metric == "ppl":
        ax.set_yscale("log")
        if means:
            _log_ticks(ax, min(means) / 1.03, max(means) * 1.03)
        ax.set_ylabel("per-byte perplexity (log scale)")
    else:
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("exact-match accuracy")
    ax.set_xlabel("evaluation length (tokens)")
    what = "held-out text" if config["task"] == "lm" else f"task {config['task']}"
    ax.set_title(f"posenc lab: {what}, trained at {config['train_len']}; "
                 f"{_interval_words(results)}", fontsize=9)  # fmt: skip
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="major", alpha=0.3)
    path = _save(fig, out / figure_names(results)[0])
    plt.close(fig)
    return path


def _mark_training_length(ax, train_len: int) -> None:
    ax.axvline(train_len, color="grey", linewidth=1)
    ax.annotate("training length", (train_len, 0.5), xycoords=("data", "axes fraction"),
                rotation=90, va="center", ha="right", color="grey", fontsize=8)  # fmt: skip


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
    fig, ax = plt.subplots(figsize=(8.5, 5), dpi=120)
    everything = []
    looks = styles(curves)
    for label, per_seed in curves.items():
        look = looks[label]
        bins = len(per_seed[0])
        width = int(longest) / bins
        mean = [sum(s[i] for s in per_seed) / len(per_seed) for i in range(bins)]
        ppl = [math.exp(v) for v in mean]
        everything += ppl
        xs = [(i + 0.5) * width for i in range(bins)]
        ax.plot(xs, ppl, color=look.color, linestyle=look.linestyle, marker=look.marker,
                markevery=max(1, bins // 8), markersize=4, linewidth=1.2, label=label)  # fmt: skip
    _mark_training_length(ax, config["train_len"])
    ax.set_yscale("log")
    _log_ticks(ax, min(everything) / 1.03, max(everything) * 1.03)
    ax.set_xlabel(f"position inside windows of {longest} tokens")
    ax.set_ylabel("per-byte perplexity (log scale)")
    seeds = len(results["seeds"])
    over = "one seed" if seeds < 2 else f"mean over {seeds} seeds"
    ax.set_title(f"posenc lab: perplexity by position at length {longest}, trained at "
                 f"{config['train_len']} ({over})", fontsize=9)  # fmt: skip
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="major", alpha=0.3)
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
