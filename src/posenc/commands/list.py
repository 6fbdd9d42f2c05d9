"""``posenc list``: every registered encoding with its sites, paper and description."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from posenc.base import available, info


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="list the registered encodings")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    table = Table(title="posenc encodings")
    for column in ("name", "sites", "paper", "description"):
        table.add_column(column, overflow="fold")
    for name in available():
        entry = info(name)
        table.add_row(
            name, " + ".join(entry.sites.names()) or "none", entry.paper, entry.description
        )
    Console(width=max(Console().width, 120)).print(table)
    return 0
