"""``posenc explain ENCODING``: a terminal tour of one encoding's numbers."""

from __future__ import annotations

import argparse

from posenc.base import available
from posenc.cli import resolve_name
from posenc.explain import explain

#: The flag of each parameter of ``explain`` that the error messages name.
FLAGS = {"dim": "--dim", "length": "--len", "num_heads": "--heads"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="a terminal tour of one encoding's numbers")
    p.add_argument(
        "encoding", metavar="ENCODING", help="a registered encoding, any case (see `posenc list`)"
    )
    p.add_argument(
        "--dim", type=int, default=16, metavar="N", help="d_model, or head_dim (default 16)"
    )
    p.add_argument(
        "--len", dest="length", type=int, default=20, metavar="N",
        help="positions shown and analysed (default 20)",
    )  # fmt: skip
    p.add_argument(
        "--heads", type=int, default=4, metavar="N", help="heads of bias encodings (default 4)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    name = resolve_name(args.encoding, available(), what="encoding")
    explain(name, dim=args.dim, length=args.length, num_heads=args.heads)
    return 0
