"""``posenc list``: every registered encoding with its site, paper and description.

The table has the columns of the README's encodings table, which is generated from the
same rows (``encoding_rows``; ``posenc list --markdown`` prints it, and a test checks the
README holds exactly that). It wraps inside the terminal (80 columns when there is no
terminal); ``--json`` gives every field in full, the papers' titles and the shape of the
positions the encoding takes (``position_shape``) included.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from posenc.base import available, info

if TYPE_CHECKING:
    from rich.table import Table

#: The columns of ``posenc list`` and of the README's encodings table.
COLUMNS = ("name", "site", "paper", "what it does")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the registered encodings (site, paper, what it does)")
    form = p.add_mutually_exclusive_group()
    form.add_argument(
        "--markdown", action="store_true", help="print the table as Markdown (the README's)"
    )
    form.add_argument(
        "--json", action="store_true", help="print every field in full as JSON, one object each"
    )
    form.add_argument(
        "--models",
        action="store_true",
        help="list the transformers model families (model_type) from_hf_config reads",
    )
    p.set_defaults(func=run)


def encoding_rows() -> list[tuple[str, str, str, str]]:
    """One ``(name, site, paper, what it does)`` row per registered encoding, by name.

    ``paper`` is the citation's first part (authors and year), ``site`` the sites joined
    with ``" + "`` (``"none"`` for an encoding without any).
    """
    rows = []
    for name in available():
        entry = info(name)
        site = " + ".join(entry.sites.names()) or "none"
        rows.append((name, site, entry.paper.split(",")[0], entry.description))
    return rows


def markdown_table() -> str:
    """The rows of ``encoding_rows`` as the README's Markdown table (no trailing newline)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("*", "\\*")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    for name, *rest in encoding_rows():
        lines.append("| " + " | ".join([f"`{name}`", *map(cell, rest)]) + " |")
    return "\n".join(lines)


def model_table() -> Table:
    """The family table of ``posenc.hf`` (``model_type`` and its positions), for ``--models``."""
    from rich import box
    from rich.table import Table

    from posenc.hf.absolute import ABSOLUTE_FAMILIES, STACKS
    from posenc.hf.biases import ALIBI_FAMILIES, T5_FAMILIES
    from posenc.hf.composite import TEXT_TOWERS
    from posenc.hf.deberta import DEBERTA_FAMILIES
    from posenc.hf.families import FAMILIES

    table = Table(
        title="transformers model families (posenc.from_hf_config)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("model_type", no_wrap=True, style="bold")
    table.add_column("scheme, or pair layout and rules", ratio=1)
    rows = {model_type: entry.summary for model_type, entry in FAMILIES.items()}
    for model_type, spec in ABSOLUTE_FAMILIES.items():
        notes = [spec.layout] if spec.kind == "sinusoidal" else []
        notes += [f"offset {spec.offset}"] if spec.offset else []
        absolute = f"absolute {spec.kind}" + (f" ({', '.join(notes)})" if notes else "")
        rows[model_type] = f"{absolute}, or {rows[model_type]}" if model_type in rows else absolute
    for model_type, stacks in STACKS.items():
        rows[model_type] = "; ".join(f"{name}: absolute {s.kind}" for name, s in stacks.items())
    rows["mpnet"] += " and t5 buckets"
    rows["roformer"] = "rotary, interleaved pairs (its sinusoidal table)"
    rows.update({model_type: "alibi" for model_type in ALIBI_FAMILIES if model_type != "falcon"})
    rows["falcon"] = f"{rows['falcon']}, or alibi"
    rows.update({model_type: "t5 buckets" for model_type in T5_FAMILIES})
    rows["udop"] += " (the encoder's 1-D ones)"
    for model_type, v2 in DEBERTA_FAMILIES.items():
        extra = " (log buckets, shared keys)" if v2 else ""
        rows[model_type] = f"absolute learned and/or disentangled attention{extra}"
    for model_type, towers in TEXT_TOWERS.items():  # multimodal: their text positions only
        where = ", ".join(towers)
        own = rows.get(model_type)
        rows[model_type] = f"{own} ({where})" if own else f"text tower: {where}"
    for model_type, summary in sorted(rows.items()):
        table.add_row(model_type, summary)
    return table


def run(args: argparse.Namespace) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    if args.models:
        Console().print(model_table())
        return 0
    if args.markdown:
        print(markdown_table())
        return 0
    if args.json:
        entries = [
            {"name": n, "sites": info(n).sites.names(), "paper": info(n).paper,
             "description": info(n).description, "class": info(n).cls.__qualname__,
             "positions": info(n).position_shape}
            for n in available()
        ]  # fmt: skip
        print(json.dumps(entries, indent=1, ensure_ascii=False))
        return 0
    table = Table(
        title="posenc encodings", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column(COLUMNS[0], no_wrap=True, style="bold")
    table.add_column(COLUMNS[1], no_wrap=True)
    table.add_column(COLUMNS[2])
    table.add_column(COLUMNS[3], ratio=1)
    for row in encoding_rows():
        table.add_row(*row)
    Console().print(table)
    return 0
