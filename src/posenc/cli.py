"""The ``posenc`` command line: one subcommand per module in ``posenc.commands``.

Every failure the user can cause (unknown subcommand, encoding or file; a bad option
value) prints one line on stderr and exits with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from posenc import __version__

#: Subcommand modules in ``posenc.commands``; each defines ``add_parser(subparsers)``,
#: which registers its parser and sets ``func(args) -> int | None`` as its default.
COMMANDS = ("list", "lab", "bench", "show", "explain")


class UsageError(Exception):
    """A mistake in how posenc was called; reported in one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="posenc", description="Positional encodings for transformers.")
    parser.add_argument("--version", action="version", version=f"posenc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"posenc.commands.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``posenc`` console script; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        status = args.func(args)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
        print(f"posenc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("posenc: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    raise SystemExit(main())
