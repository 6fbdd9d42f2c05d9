"""``posenc extend``'s report: perplexity and passkey accuracy per setting and length, the
ranking of the settings at each length, and the figure.

Shapes: one row per setting, one column per evaluation length; a perplexity cell is
``exp`` of the mean token NLL over the windows of that length, a passkey cell the share
of depths where greedy decoding wrote the key. A ranking sentence lists the settings best
first, joined by ``<`` where the left one has the lower perplexity in every window and by
``≈`` where it does not (the windows disagree), and by ``=`` where every window's NLL
agrees within ``_SAME`` (relative).
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from posenc.lab.results import write_bytes
from posenc.viz._common import series_styles

__all__ = ["FIGURE", "draw", "markdown", "print_table", "ranking"]

FIGURE = "extend.png"

_DODGE = 0.02  # log2 units between neighbouring settings at one length
#: Relative NLL difference below which two settings count as equal: float32 logits agree
#: to about this much when only the angles' rounding differs (posenc float64, transformers
#: float32), e.g. dynamic NTK below the trained length against the original.
_SAME = 1e-5


def _cell(results: dict, label: str, length: int) -> dict | None:
    return results["cells"].get(label, {}).get(str(length))


def _ppl(cell: dict | None) -> float | None:
    return None if cell is None else math.exp(cell["mean_nll"])


def _text(cell: dict | None) -> str:
    if cell is None:
        return "-"
    ppl = f"{math.exp(cell['mean_nll']):.3g}"
    trials = cell["passkey"]
    return f"{ppl} / {sum(t['ok'] for t in trials)}/{len(trials)}" if trials else ppl


def ranking(results: dict, length: int) -> str:
    """The settings at ``length`` best first (see the module docstring), or ``""``."""
    cells = [(s, _cell(results, s, length)) for s in results["settings"]]
    cells = sorted(((s, c) for s, c in cells if c is not None), key=lambda sc: sc[1]["mean_nll"])
    text = ""
    for index, (label, cell) in enumerate(cells):
        text += f"{label} ({math.exp(cell['mean_nll']):.3g})"
        if index + 1 < len(cells):
            pairs = list(zip(cell["window_nll"], cells[index + 1][1]["window_nll"], strict=True))
            if all(abs(a - b) <= _SAME * max(abs(a), abs(b)) for a, b in pairs):
                text += " = "
            else:
                text += " < " if all(a < b for a, b in pairs) else " ≈ "
    return text


def print_table(results: dict, console: Console) -> None:
    """The table on the terminal (rich): perplexity / passkey hits per length."""
    table = Table(title=f"posenc extend: {results['model']['name']} (perplexity / passkey)")
    table.add_column("setting")
    for n in results["config"]["eval_lens"]:
        table.add_column(str(n), justify="right")
    for label in results["settings"]:
        table.add_row(
            label, *(_text(_cell(results, label, n)) for n in results["config"]["eval_lens"])
        )
    console.print(table)


def markdown(results: dict) -> str:
    """``report.md``: what was run, the table, the rankings per length, the notes."""
    model, config = results["model"], results["config"]
    lens = config["eval_lens"]
    lines = [
        f"# posenc extend: {model['name']}",
        "",
        f"Checkpoint: model_type `{model['model_type']}`, {model['parameters']:,} parameters, "
        f"trained length {model['trained_length']}, config sha256 `{model['config_sha256']}`; "
        f"attention `{model['attention']}`, {config['dtype']} on {config['device']}.",
        f"Text: {results['data']['source']} (held out, {results['data']['tokens']:,} tokens, "
        f"sha256 `{results['data']['sha256']}`), {config['windows']} window(s) per length, "
        f"read in chunks of {config['chunk']} tokens with the KV cache. Passkey: depths "
        f"{', '.join(f'{d:g}' for d in config['passkey_depths'])}.",
        "",
    ]
    if results["status"] != "complete":
        lines += [f"**Run {results['status']}**: the table shows the cells that finished.", ""]
    lines += ["Perplexity (lower is better) / passkey retrievals:", ""]
    lines += [
        "| setting | " + " | ".join(str(n) for n in lens) + " |",
        "|---|" + "---:|" * len(lens),
    ]
    for label in results["settings"]:
        lines.append(
            f"| {label} | " + " | ".join(_text(_cell(results, label, n)) for n in lens) + " |"
        )
    lines += [
        "",
        "Ranking by perplexity (`<`: lower in every window; `≈`: not in every window; "
        "`=`: equal within 1e-5 in every window):",
        "",
    ]
    lines += [f"- At {n}: {ranking(results, n)}." for n in lens if ranking(results, n)]
    lines += ["", f"![perplexity and passkey by length]({FIGURE})", ""]
    if results.get("notes"):
        lines += ["Notes:", "", *(f"- {note}" for note in results["notes"]), ""]
    return "\n".join(lines)


def draw(results: dict, out: Path) -> Path | None:
    """``extend.png``: perplexity (log) and passkey accuracy against length, per setting."""
    lens = results["config"]["eval_lens"]
    if not any(_cell(results, s, n) for s in results["settings"] for n in lens):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=120, sharex=True)
    settings = results["settings"]
    looks = series_styles(len(settings))
    for index, (label, look) in enumerate(zip(settings, looks, strict=True)):
        cells = [(n, _cell(results, label, n)) for n in lens]
        cells = [(n, c) for n, c in cells if c is not None]
        # settings equal to the original below its trained length: side by side, not hidden
        shift = 2 ** (_DODGE * (index - (len(settings) - 1) / 2))
        style = {"linestyle": "-" if label == "original" else "--", "markersize": 4, **look}
        top.plot([n * shift for n, _ in cells], [_ppl(c) for _, c in cells], label=label,
                 **style)  # fmt: skip
        hits = [
            (n, sum(t["ok"] for t in c["passkey"]) / len(c["passkey"]))
            for n, c in cells
            if c["passkey"]
        ]
        bottom.plot([n * shift for n, _ in hits], [h for _, h in hits], **style)
    trained = results["model"]["trained_length"]
    inside = min(lens) <= trained <= max(lens)
    for ax in (top, bottom):
        if inside:  # a line beyond the lengths drawn would stretch the axis to empty space
            ax.axvline(trained, color="grey", linewidth=1)
        ax.grid(True, alpha=0.3)
    top.set_xscale("log", base=2)
    top.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:.4g}")
    top.yaxis.set_major_formatter(plain)
    top.yaxis.set_minor_formatter(plain)
    top.set_ylabel("perplexity (log)")
    bottom.set_ylabel("passkey accuracy")
    bottom.set_ylim(-0.05, 1.05)
    where = "grey line" if inside else "beyond the lengths shown"
    bottom.set_xlabel(f"evaluation length (tokens); trained length {trained}: {where}")
    bottom.set_xlim(min(lens) / 2**0.25, max(lens) * 2**0.25)
    bottom.set_xticks(lens, [str(n) for n in lens])
    top.set_title(f"posenc extend: {results['model']['name']}", fontsize=9)
    top.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    write_bytes(out / FIGURE, buffer.getvalue())
    return out / FIGURE
