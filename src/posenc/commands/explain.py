"""``posenc explain ENCODING``: a terminal tour of one encoding's numbers."""

from __future__ import annotations

import argparse

from posenc.explain import explain


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="a terminal tour of one encoding")
    p.add_argument("encoding", help="a registered encoding (see `posenc list`)")
    p.add_argument("--dim", type=int, default=16, help="d_model, or head_dim (default 16)")
    p.add_argument("--len", dest="length", type=int, default=20, help="positions (default 20)")
    p.add_argument("--heads", type=int, default=4, help="heads of bias encodings (default 4)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    explain(args.encoding, dim=args.dim, length=args.length, num_heads=args.heads)
    return 0
