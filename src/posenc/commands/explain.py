"""``posenc explain ENCODING``: a terminal tour of one encoding's numbers."""

from __future__ import annotations

import argparse

from posenc.base import Site, available, info
from posenc.cli import UsageError, resolve_name

#: The flag of each parameter of ``explain`` that the error messages name.
FLAGS = {"dim": "--dim", "length": "--len", "num_heads": "--heads"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="a terminal tour of one encoding's numbers")
    p.add_argument(
        "encoding", metavar="ENCODING", help="a registered encoding, any case (see `posenc list`)"
    )
    p.add_argument("--dim", type=int, metavar="N", help="d_model, or head_dim (default 16)")
    p.add_argument(
        "--len", dest="length", type=int, default=20, metavar="N",
        help="positions shown and analysed (default 20)",
    )  # fmt: skip
    p.add_argument("--heads", type=int, metavar="N", help="heads of bias encodings (default 4)")
    p.set_defaults(func=run)


def _scaling_hint(name: str) -> None:
    """Refuse a RoPE scaling's name (``yarn``) with where that scaling is shown."""
    from posenc.encodings import scaling_types

    if name.lower() in scaling_types() and name.lower() not in available():
        raise UsageError(
            f"explain: {name!r} is a RoPE scaling, not an encoding; try `posenc explain rope` "
            "or `posenc show rope-spectrum`"
        )


def run(args: argparse.Namespace) -> int:
    from posenc.explain import explain

    _scaling_hint(args.encoding)
    name = resolve_name(args.encoding, available(), what="encoding")
    entry = info(name)
    bias_only = entry.sites == Site.SCORE and (entry.cls.offset_only or entry.cls.positional_bias)
    if args.heads is not None and not entry.sites & Site.SCORE:
        raise UsageError(f"explain {name}: --heads does not apply (it has no per-head bias)")
    if args.dim is not None and bias_only:
        raise UsageError(
            f"explain {name}: --dim does not apply (its bias depends on positions only)"
        )
    dim = 16 if args.dim is None else args.dim
    heads = 4 if args.heads is None else args.heads
    explain(name, dim=dim, length=args.length, num_heads=heads)
    return 0
