"""``posenc show WHAT``: draw one figure (or, with ``--all``, the whole gallery)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.cli import UsageError
from posenc.viz.gallery import GALLERY, FigureOptions, make_figure, write_gallery


def add_parser(sub: argparse._SubParsersAction) -> None:
    figures = "\n".join(f"  {item.name:<14} {item.caption}" for item in GALLERY.values())
    p = sub.add_parser(
        "show",
        help="draw a figure (PNG or SVG)",
        description="Draw a figure by name, or an encoding's own figure (its table, its bias "
        "per head, or its attention maps) by the encoding's name.",
        epilog=f"figures:\n{figures}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("what", nargs="?", help="a figure or an encoding (omit with --all)")
    p.add_argument("--all", action="store_true", help="write every figure into --out (a folder)")
    p.add_argument("--out", help="output file (.png or .svg), or folder with --all")
    p.add_argument("--dim", type=int, help="d_model of absolute encodings, head_dim of others")
    p.add_argument("--len", dest="length", type=int, help="number of positions")
    p.add_argument("--heads", type=int, help="number of attention heads")
    p.add_argument("--table", help="a saved learned table or lab checkpoint (torch.save)")
    p.add_argument("--dpi", type=int, default=100, help="PNG resolution (default 100)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.viz._common import figure_path, save_figure

    options = FigureOptions(dim=args.dim, length=args.length, heads=args.heads, table=args.table)
    if args.all:
        if args.what:
            raise UsageError(f"posenc show: give either WHAT ({args.what!r}) or --all, not both")
        for path in write_gallery(Path(args.out or "figures"), options, dpi=args.dpi):
            print(path)
        return 0
    if not args.what:
        raise UsageError(f"posenc show: name a figure ({', '.join(GALLERY)}) or pass --all")
    out = args.out or (GALLERY[args.what].filename if args.what in GALLERY else f"{args.what}.png")
    figure_path(out)  # a bad suffix fails before the figure is drawn
    fig = make_figure(args.what, options)
    print(save_figure(fig, out, dpi=args.dpi))
    return 0
