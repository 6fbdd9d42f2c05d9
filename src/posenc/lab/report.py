"""The lab's report: the table (terminal and Markdown) and the plot against length.

Shapes: one row per trained model and per evaluation-time variant (a rotary scaling, an
interpolated learned table, a fine-tune), one column per evaluation length. Text runs
show per-byte perplexity (lower is better), synthetic tasks exact-match accuracy.
matplotlib is imported only when a plot is drawn (Agg backend, no display needed).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

__all__ = ["cells", "markdown", "plot", "plot_name", "print_table"]

_METRIC_NAME = {"ppl": "perplexity", "accuracy": "accuracy"}
_METRIC_TITLE = {
    "ppl": "per-byte perplexity on held-out text (lower is better)",
    "accuracy": "exact-match accuracy (higher is better)",
}


def _format(metric: str, value: dict | None) -> str:
    if value is None:
        return "n/a"
    if metric == "accuracy":
        return f"{100 * value['accuracy']:.1f}%"
    ppl = value["ppl"]
    return f"{ppl:.2f}" if ppl < 1000 else f"{ppl:.3g}"


def cells(results: dict) -> list[tuple[str, list[str]]]:
    """``(label, one cell per evaluation length)`` for every row of ``results``."""
    lens = [str(n) for n in results["config"]["eval_lens"]]
    out = []
    for run in results["runs"]:
        if run["status"] != "ok":
            out.append((run["encoding"], [run["status"]] * len(lens)))
            continue
        for row in run["rows"]:
            out.append(
                (row["label"], [_format(results["metric"], row["results"][n]) for n in lens])
            )
    return out


def print_table(results: dict, console: Console) -> None:
    """The table on the terminal (rich)."""
    config = results["config"]
    table = Table(
        title=f"posenc lab: {_METRIC_TITLE[results['metric']]}, trained at {config['train_len']}"
    )
    table.add_column("encoding")
    for n in config["eval_lens"]:
        table.add_column(str(n), justify="right")
    for label, row in cells(results):
        table.add_row(label, *row)
    console.print(table)


def markdown(results: dict) -> str:
    """``report.md``: what was run, the table, the plot and the notes."""
    config, data = results["config"], results["data"]
    lens = config["eval_lens"]
    lines = [
        "# posenc lab",
        "",
        f"Task: {'text' if config['task'] == 'lm' else config['task']}. "
        f"Metric: {_METRIC_TITLE[results['metric']]}.",
        f"Each model: {config['num_layers']} layers, d_model {config['d_model']}, "
        f"{config['num_heads']} heads, {config['steps']} steps of {config['batch_size']} "
        f"windows of {config['train_len']} tokens (seed {config['seed']}).",
    ]
    if "sha256" in data:
        lines.append(
            f"Corpus: {data['source']} ({len(data['train_files'])} training files, "
            f"{len(data['heldout_files'])} held-out files, {data['heldout_bytes']} held-out "
            f"bytes), sha256 `{data['sha256']}`."
        )
    if results["status"] != "complete":
        lines.append(f"**Sweep {results['status']}**: the table shows the runs that finished.")
    lines += ["", "| encoding | " + " | ".join(str(n) for n in lens) + " |"]
    lines.append("|---|" + "---:|" * len(lens))
    lines += [f"| {label} | " + " | ".join(row) + " |" for label, row in cells(results)]
    lines += ["", f"![{_METRIC_NAME[results['metric']]} against length]({plot_name(results)})", ""]
    notes = _notes(results)
    if notes:
        lines += ["Notes:", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(lines)


def _notes(results: dict) -> list[str]:
    notes = []
    for run in results["runs"]:
        if run["status"] != "ok":
            notes.append(f"{run['encoding']}: {run['status']}: {run.get('error')}")
            continue
        for row in run["rows"]:
            if row["notes"]:
                lengths = ", ".join(row["notes"])
                first = next(iter(row["notes"].values()))
                notes.append(f"{row['label']}: n/a at {lengths}: {first}")
    return notes


def plot_name(results: dict) -> str:
    return "perplexity.png" if results["metric"] == "ppl" else "accuracy.png"


def plot(results: dict, out: Path) -> Path:
    """Draw the metric against evaluation length, one line per row; return the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter

    config, metric = results["config"], results["metric"]
    lens = config["eval_lens"]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    styles = {"trained": "-", "scaling": "--", "interpolate": ":", "finetune": "-."}
    for run in results["runs"]:
        for row in run["rows"] if run["status"] == "ok" else []:
            points = [(n, row["results"][str(n)]) for n in lens if row["results"][str(n)]]
            if not points:
                continue
            ys = [v["ppl"] if metric == "ppl" else v["accuracy"] for _, v in points]
            ax.plot([n for n, _ in points], ys, styles[row["kind"]], marker="o", label=row["label"])
    ax.axvline(config["train_len"], color="grey", linewidth=1)
    ax.annotate(
        "training length",
        (config["train_len"], 0.98),
        xycoords=("data", "axes fraction"),
        rotation=90,
        va="top",
        ha="right",
        color="grey",
        fontsize=8,
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(lens, [str(n) for n in lens])
    if metric == "ppl":
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.set_ylabel("per-byte perplexity (log scale)")
    else:
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("exact-match accuracy")
    ax.set_xlabel("evaluation length (tokens)")
    what = "held-out text" if config["task"] == "lm" else f"task {config['task']}"
    ax.set_title(f"posenc lab: {what}, trained at length {config['train_len']}")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="both", alpha=0.3)
    path = out / plot_name(results)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path
