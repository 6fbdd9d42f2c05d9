"""The lab's report: tables over seeds (terminal and Markdown), the held-out text's
cleanliness, the orderings and every pairwise test, and notes.

Shapes: one row per trained model and per evaluation-time variant (a rotary scaling, an
interpolated learned table, a fine-tune), one column per evaluation length; each cell the
mean over seeds with its 95 % interval over seeds and evaluation text (a bootstrap for
perplexity, Wilson's interval for accuracy; ``posenc.lab.pairwise``), or, for records
without per-segment losses, Student's t interval over seeds (``posenc.lab.stats``). Text
runs show per-byte perplexity (lower is better), synthetic tasks exact-match accuracy
(higher is better). Synthetic tasks also list the steps each run took to learn the task in
distribution (``steps_to_learn``; ``posenc.lab.runs``). The figures are drawn
by ``posenc.lab.plots``.
"""

from __future__ import annotations

import re

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from posenc.lab import stats
from posenc.lab.claims import pairwise_lines
from posenc.lab.compute import compute_lines
from posenc.lab.curves import budget_sentence, stop_sentence
from posenc.lab.pairwise import Comparison, cell_interval, compare_all, unit_rows
from posenc.lab.plots import figure_names
from posenc.lab.tokenlevel import token_lines

__all__ = [
    "conclusions",
    "contamination",
    "heldout_text",
    "markdown",
    "print_table",
    "steps_to_learn",
    "table_cells",
]

_METRIC_TITLE = {
    "ppl": "per-byte perplexity on held-out text (lower is better)",
    "accuracy": "exact-match accuracy (higher is better)",
}
SMOKE = "smoke test (--quick): a tiny model trained for seconds; its numbers carry no signal"


def _number(metric: str, value: float) -> str:
    if metric == "accuracy":
        return f"{100 * value:.1f}%"
    return f"{value:.2f}" if value < 1000 else f"{value:.3g}"


def _cell(metric: str, cell: stats.Cell, interval: tuple[float, float] | None) -> str:
    if cell.mean is None:
        return "n/a"
    text = _number(metric, cell.mean)
    if interval is not None:
        low, high = interval
        if metric == "accuracy":
            return f"{text} [{100 * low:.1f}, {100 * high:.1f}]"
        return f"{text} [{_number(metric, low)}, {_number(metric, high)}]"
    if cell.half_width is not None:
        width = 100 * cell.half_width if metric == "accuracy" else cell.half_width
        text += f" ± {width:.1f}" if metric == "accuracy" or width >= 0.1 else f" ± {width:.2f}"
    return text


def table_cells(results: dict, *, intervals: bool = True) -> list[tuple[str, list[str]]]:
    """``(label, one cell per evaluation length)``: mean and 95 % interval (over seeds and
    evaluation text where the records hold per-unit results, else ± Student's t over
    seeds; none with ``intervals=False``), and a line per run that did not finish or
    whose task was not learned."""
    lens = [str(n) for n in results["config"]["eval_lens"]]
    metric = results["metric"]
    units = unit_rows(results) if intervals else {}
    out = []
    for row in stats.rows(results):
        cells = []
        for n in lens:
            here = units.get(row.label, {}).get(n)
            cell = row.cells[n] if intervals else stats.Cell({0: row.cells[n].mean})  # no ±
            cells.append(_cell(metric, cell, cell_interval(here, metric) if here else None))
        out.append((row.label, cells))
    for run in results["runs"]:
        label = f"{run['encoding']} (seed {run['seed']})"
        if run["status"] != "ok":
            out.append((label, [run["status"]] * len(lens)))
        elif run.get("learned") is False:
            out.append((label, ["not learned"] * len(lens)))
    return out


def steps_to_learn(results: dict) -> str | None:
    """Synthetic tasks: how the models were trained and the steps each run took to learn
    the task (``None`` for text, or for runs from before training until learned)."""
    config = results["config"]
    runs = [r for r in results["runs"] if r["status"] == "ok" and "steps_to_learn" in r]
    if config["task"] == "lm" or not runs:
        return None
    train = runs[0]["train"]
    each = ", ".join(
        f"{run['encoding']} (seed {run['seed']}) "
        + (f"{run['steps_to_learn']}" if run["learned"] else f"not learned by {train['max_steps']}")
        for run in runs
    )
    return (
        f"Trained until learned: from step {config['steps']} on, exact match at the training "
        f"length on held-out examples checked every {train['check_every']} steps until it "
        f"reaches {100 * train['learned_at']:g}% or {train['max_steps']} steps. "
        f"Steps to learn: {each}."
    )


def _precision(results: dict) -> str | None:
    """The arithmetic of the runs (``posenc.lab.precision``), when every run used the
    same (the notes say where they differ)."""
    dtypes = {run.get("environment", {}).get("precision") for run in results["runs"]}
    if len(dtypes) != 1 or None in dtypes:
        return None
    if dtypes == {"float32"}:
        return "Precision: float32 throughout."
    return (
        f"Precision: {dtypes.pop()} mixed precision: the blocks' projections and MLPs "
        "multiply in bfloat16 with float32 accumulation; weights, optimizer state, layer "
        "norms, the attention core, logits and losses are float32 (`--precision float32` "
        "for float32 throughout)."
    )


def contamination(data: dict) -> str | None:
    """The warning when the held-out text still overlaps the training text above the
    threshold (``posenc.lab.heldout``), else ``None``."""
    clean = data.get("heldout")
    if not clean or not clean["contaminated"]:
        return None
    return (
        f"{100 * clean['overlap']:.1f} % of the held-out {clean['ngram']}-byte windows occur "
        f"verbatim in the training text (threshold {100 * clean['warn']:g} %): held-out "
        "perplexity partly measures memorised text; de-duplicate the corpus"
    )


def heldout_text(data: dict) -> list[str]:
    """How clean the held-out text is and where the evaluation segments come from."""
    clean, segments = data.get("heldout"), data.get("segments")
    lines = []
    if clean:
        dropped = clean["dropped"]
        names = f" ({', '.join(dropped)})" if dropped else ""
        lines.append(
            f"Held-out text: {len(dropped)} held-out file{'s' * (len(dropped) != 1)} dropped as "
            f"near-duplicates of training text ({100 * clean['duplicate']:g} % or more of their "
            f"{clean['ngram']}-byte windows in it){names}; {100 * clean['overlap']:.2f} % of the "
            f"remaining held-out {clean['ngram']}-byte windows occur verbatim in the training "
            f"text ({100 * clean['overlap_before']:.2f} % before dropping)."
        )
    if segments:
        lines.append(
            f"Evaluation text: {segments['count']} segments of {segments['length']} bytes from "
            f"{segments['files']} held-out file{'s' * (segments['files'] != 1)}, at most "
            f"{segments['cap']} from one file."
        )
    warning = contamination(data)
    if warning:
        lines.append(f"**Warning: {warning}.**")
    return lines


def _title(results: dict) -> str:
    config = results["config"]
    seeds = len(results["seeds"])
    return (
        f"posenc lab: {_METRIC_TITLE[results['metric']]}, trained at {config['train_len']}, "
        f"mean over {seeds} seed{'s' if seeds > 1 else ''} [95% interval over seeds and "
        "evaluation text]"
    )


def _short(value: float) -> str:
    """A bound of an interval in at most five characters where it can be."""
    if abs(value) < 100:
        return f"{value:.1f}"
    return f"{value:.0f}" if abs(value) < 10_000 else f"{value:.2g}"


def _compact(cell: str) -> Text:
    """A cell of ``table_cells`` on two short lines: the mean over its interval (dim)
    (``28.35 [24.38, 33.27]`` -> ``28.35`` / ``24.4-33.3``)."""
    found = re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", cell)
    if found is None:
        mean, _, width = cell.partition(" ± ")  # Student's t half-width, or a status
        return Text.assemble(mean, *(("\n", (f"±{width}", "dim")) if width else ()))
    mean, low, high = found.groups()  # accuracy: the mean's % stands for both
    low, high = (_short(float(v.rstrip("%"))) for v in (low, high))
    return Text.assemble(mean, "\n", (f"{low}-{high}", "dim"))


def print_table(results: dict, console: Console) -> None:
    """The table on the terminal (rich): each cell the mean over its 95 % interval, so
    the default five evaluation lengths fit 80 columns."""
    table = Table(
        title=_title(results),
        caption="each cell: the mean, its 95 % interval below it",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 0, 0, 1),
    )
    table.add_column("encoding", overflow="fold")
    for n in results["config"]["eval_lens"]:
        table.add_column(str(n), justify="right")
    for label, row in table_cells(results):
        table.add_row(label, *(_compact(c) for c in row))
    console.print(table)
    learning = steps_to_learn(results)
    if learning is not None:
        console.print(learning)
    warning = contamination(results["data"])
    if warning:
        console.print(f"[bold red]WARNING: {warning}[/bold red]")
    if results.get("quick"):
        console.print(f"[bold]{SMOKE}[/bold]")


def conclusions(results: dict, comparisons: list[Comparison] | None = None) -> list[str]:
    """One sentence per evaluation length: the rows best first, ``<`` (``>`` for
    accuracy) where the seed-level pairwise test separates the left row from the next
    (``posenc.lab.pairwise``; without ``comparisons``: where it is better in every
    seed), ``≈`` where it does not."""
    seeds = len(results["seeds"])
    if seeds < 2 and not comparisons:
        return ["With one seed no ordering is established; run with --seeds 3 or more."]
    higher = stats.higher_is_better(results["metric"])
    table = stats.rows(results)
    train_len = results["config"]["train_len"]
    split = {(c.length, c.first, c.second) for c in comparisons or [] if c.separated}
    sentences = []
    for n in results["config"]["eval_lens"]:
        ranked = stats.chain(table, str(n), higher=higher, train_len=train_len)
        if not ranked:
            continue
        text = ""
        for (label, holds), after in zip(ranked, [*ranked[1:], (None, False)], strict=True):
            if comparisons is not None:
                holds = (str(n), label, after[0]) in split
            text += f"{label}" + ((" > " if higher else " < ") if holds else " ≈ ")
        where = "the training length" if n == train_len else f"{n / train_len:g}x training"
        sentences.append(f"At {n} ({where}): {text[:-3]}.")
    return sentences


def markdown(results: dict, comparisons: list[Comparison] | None = None) -> str:
    """``report.md``: what was run, the table, the orderings, paired wins, figures, notes
    (``comparisons``: the pairwise tests when already computed)."""
    config, data = results["config"], results["data"]
    lens = config["eval_lens"]
    seeds = ", ".join(str(s) for s in results["seeds"])
    more = "" if config["task"] == "lm" else " or more (until learned)"
    lines = ["# posenc lab", ""]
    if results.get("quick"):
        lines += [f"**This is a {SMOKE}.**", ""]
    lines += [
        f"Task: {'text' if config['task'] == 'lm' else config['task']}. "
        f"Metric: {_METRIC_TITLE[results['metric']]}.",
        f"Each model: {config['num_layers']} layers, d_model {config['d_model']}, "
        f"{config['num_heads']} heads, {config['steps']} steps{more} of {config['batch_size']} "
        f"windows of {config['train_len']} tokens; seeds {seeds}.",
    ]
    precision = _precision(results)
    if precision is not None:
        lines.append(precision)
    for sentence in (steps_to_learn(results), budget_sentence(results), stop_sentence(results)):
        if sentence is not None:
            lines.append(sentence)
    if "sha256" in data:
        lines.append(
            f"Corpus: {data['source']} ({len(data['train_files'])} training files, "
            f"{len(data['heldout_files'])} held-out files, {data['heldout_bytes']} held-out "
            f"bytes), sha256 `{data['sha256']}`."
        )
        lines += heldout_text(data)
    finished = sum(run["status"] == "ok" for run in results["runs"])
    if results["status"] == "empty" or finished == 0:
        lines += ["", f"**No run finished** (sweep {results['status']}): nothing to report.", ""]
        return "\n".join(lines + _notes(results))
    if results["status"] != "complete":
        lines.append(
            f"**Sweep {results['status']}**: {len(results['runs'])} of "
            f"{len(config['encodings']) * len(results['seeds'])} runs finished; the tables "
            "show those."
        )
    final = results["status"] != "running"  # intervals and tests once the sweep ends
    if comparisons is None:
        comparisons = compare_all(results) if final else []
    lines += ["", "| encoding | " + " | ".join(str(n) for n in lens) + " |"]
    lines.append("|---|" + "---:|" * len(lens))
    cells = table_cells(results, intervals=final)
    lines += [f"| {label} | " + " | ".join(row) + " |" for label, row in cells]
    if not final:
        return "\n".join([*lines, "", "Intervals and tests follow when the sweep ends.", ""])
    tested = bool(comparisons)
    rule = (
        "separated across seeds by the seed-level test below" if tested else "better in every seed"
    ) + "; `≈`: not"
    lines += [
        "",
        f"Orderings by mean (`<`/`>`: the left row {rule}):",
        "",
        *(f"- {sentence}" for sentence in conclusions(results, comparisons if tested else None)),
        "",
        *pairwise_lines(results, comparisons),
        *(token_lines(results) if results["metric"] == "accuracy" else []),
        *compute_lines(results),
    ]
    lines += [f"![{name}]({name})" for name in figure_names(results)]
    return "\n".join([*lines, "", *_notes(results)])


def _notes(results: dict) -> list[str]:
    notes = list(results.get("notes", []))
    for run in results["runs"]:
        where = f"{run['encoding']} (seed {run['seed']})"
        if run["status"] != "ok":
            notes.append(f"{where}: {run['status']}: {run.get('error')}")
            continue
        if run.get("learned") is False:
            notes.append(
                f"{where}: the task was not learned at the training length "
                f"in {run['train']['steps']} steps"
            )
        for row in run["rows"]:
            if row["notes"] and run["seed"] == results["seeds"][0]:
                lengths = ", ".join(row["notes"])
                first = next(iter(row["notes"].values()))
                notes.append(f"{row['label']}: n/a at {lengths}: {first}")
    if not notes:
        return []
    return ["Notes:", "", *(f"- {note}" for note in notes), ""]
