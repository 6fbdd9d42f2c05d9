"""``posenc show WHAT``: draw one figure (or, with ``--all``, every gallery figure)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.base import available
from posenc.cli import UsageError, resolve_name

#: The flag of each ``FigureOptions`` field.
OPTION_FLAGS = {"dim": "--dim", "length": "--len", "heads": "--heads", "table": "--table"}

#: The flag of each figure parameter that the error messages name.
FLAGS = {"d_model": "--dim", "head_dim": "--dim", "num_heads": "--heads", "length": "--len"}

#: Upper bounds of the figure sizes (a figure of 10^5 positions or dpi does not fit memory).
LIMITS = {"dim": 4096, "length": 8192, "heads": 64}
MAX_DPI = 600


def _epilog() -> str:
    from posenc.viz.gallery import GALLERY

    figures = "\n".join(f"  {item.name:<14} {item.caption}" for item in GALLERY.values())
    return (
        f"figures:\n{figures}\n\nThe figures of trained models come from `posenc lab` "
        "(its perplexity.png) and from --table."
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show",
        help="draw a figure of the gallery or of one encoding (PNG or SVG)",
        description="Draw a figure by name, or an encoding's own figure (its table, its bias\n"
        "per head, or its attention maps) by the encoding's name.",
        epilog=_epilog,  # a function: the gallery is imported when the help is shown
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "what", nargs="?", metavar="WHAT", help="a figure or an encoding, any case (or --all)"
    )
    p.add_argument(
        "--all", action="store_true",
        help="write every figure that needs no trained model into the folder --out",
    )  # fmt: skip
    p.add_argument(
        "--out", metavar="PATH",
        help="output file (.png or .svg; default WHAT's file name), or folder with --all "
        "(default figures)",
    )  # fmt: skip
    p.add_argument(
        "--dim", type=int, metavar="N", help="d_model of absolute encodings, head_dim of others"
    )
    p.add_argument("--len", dest="length", type=int, metavar="N", help="number of positions")
    p.add_argument("--heads", type=int, metavar="N", help="number of attention heads")
    p.add_argument(
        "--table", metavar="FILE",
        help="a learned table or lab model saved with torch.save (read with weights_only=True)",
    )  # fmt: skip
    p.add_argument(
        "--dpi", type=int, default=100, metavar="N",
        help=f"PNG resolution, 1 to {MAX_DPI} (default 100)",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.viz._common import figure_path, save_figure
    from posenc.viz.gallery import (
        GALLERY,
        FigureOptions,
        figure_options,
        make_figure,
        write_gallery,
    )

    if not 1 <= args.dpi <= MAX_DPI:
        raise UsageError(f"show: --dpi must be 1 to {MAX_DPI}, got {args.dpi}")
    for name, limit in LIMITS.items():
        value = getattr(args, name)
        if value is not None and not 1 <= value <= limit:
            raise UsageError(f"show: {OPTION_FLAGS[name]} must be 1 to {limit}, got {value}")
    options = FigureOptions(dim=args.dim, length=args.length, heads=args.heads, table=args.table)
    if args.all:
        if args.what:
            raise UsageError(f"show: give either WHAT ({args.what!r}) or --all, not both")
        for path in write_gallery(Path(args.out or "figures"), options, dpi=args.dpi):
            print(path)
        return 0
    if not args.what:
        raise UsageError(f"show: name a figure ({', '.join(GALLERY)}) or pass --all")
    names = list(dict.fromkeys([*GALLERY, *available()]))
    what = resolve_name(args.what, names, what="figure or encoding", listed_by="posenc show -h")
    given = [name for name in OPTION_FLAGS if getattr(options, name) is not None]
    unused = [OPTION_FLAGS[name] for name in given if name not in figure_options(what)]
    if unused:
        takes = " ".join(OPTION_FLAGS[n] for n in OPTION_FLAGS if n in figure_options(what))
        takes = takes or "none"
        raise UsageError(f"show {what}: {unused[0]} does not apply (this figure takes: {takes})")
    out = args.out or (GALLERY[what].filename if what in GALLERY else f"{what}.png")
    figure_path(out)  # a bad suffix fails before the figure is drawn
    fig = make_figure(what, options)
    print(save_figure(fig, out, dpi=args.dpi))
    return 0
