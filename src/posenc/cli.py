"""The ``posenc`` command line: one subcommand per module in ``posenc.commands``.

Every failure the user can cause (unknown subcommand, encoding, figure or file; a bad
option value; a file the system refuses to read or write) prints one line on stderr,
``posenc: error: ...``, and exits with status 2, never a traceback. ``error_line`` is the
one place that turns an exception into that line; ``resolve_name`` is the one place that
matches a name case-insensitively and suggests the closest known one.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import re
import sys
from collections.abc import Iterable, Sequence

from posenc import __version__

#: Subcommand modules in ``posenc.commands``; each defines ``add_parser(subparsers)``,
#: which registers its parser and sets ``func(args) -> int | None`` as its default.
COMMANDS = ("list", "show", "explain", "lab", "bench", "extend", "audit")

#: The prefix of every error line the command line prints.
PREFIX = "posenc: error: "

#: The longest error line (prefix included) that lists the known names in full.
LINE_LIMIT = 100

#: What a file-system ``errno`` means to a user (anything else: ``os.strerror``).
_OS_REASONS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENOENT: "no such file or directory",
    errno.ENOTDIR: "not a directory",
    errno.EISDIR: "is a directory",
    errno.EEXIST: "already exists",
    errno.ENAMETOOLONG: "file name too long",
}


class UsageError(Exception):
    """A mistake in how posenc was called; reported in one line with exit status 2.

    The message carries no prefix: ``main`` adds ``posenc: error:``.
    """


class _Parser(argparse.ArgumentParser):
    def format_help(self) -> str:
        """The help; an ``epilog`` or an option's ``help`` given as a function is called
        here, so that what it lists (the gallery's figures, the benchmark suites) is
        imported only when the help is shown."""
        if callable(self.epilog):
            self.epilog = self.epilog()
        for action in self._actions:
            if callable(action.help):
                action.help = action.help()
        return super().format_help()

    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        command = self.prog.removeprefix("posenc").strip()
        message = _short_argparse(message)
        raise UsageError(f"{command}: {message}" if command else message)


def _short_argparse(message: str) -> str:
    """argparse's message in fewer words: ``argument --task: invalid choice: 'x' (choose
    from 'a', 'b')`` -> ``--task: unknown 'x'; did you mean 'a'?``, or ``(a, b)`` when no
    choice is close (one line within the limit however many choices there are)."""
    message = re.sub(r"^argument (\S+): ", r"\1: ", message)
    found = re.fullmatch(r"(\S+): invalid choice: '(.*)' \(choose from (.*)\)", message)
    if found is None:
        return message
    flag, value, listed = found.groups()
    choices = [c.strip().strip("'") for c in listed.split(",")]
    hint = suggest(value, choices)  # the closest choice, else every choice
    return f"{flag}: unknown {value!r}" + (hint or f" ({', '.join(choices)})")


class _TopParser(_Parser):
    def format_help(self) -> str:
        """The overview: one line per command (argparse would wrap long ones)."""
        sub = next(a for a in self._actions if isinstance(a, argparse._SubParsersAction))
        width = max(len(choice.dest) for choice in sub._choices_actions) + 2
        lines = [
            "usage: posenc COMMAND [options]",
            "",
            str(self.description),
            "",
            "commands:",
            *(f"  {choice.dest:<{width}}{choice.help}" for choice in sub._choices_actions),
            "",
            "options:",
            "  -h, --help  this list",
            "  --version   the version, and the RoPE path used on CPU",
            "",
            str(self.epilog),
        ]
        return "\n".join(lines) + "\n"


def suggest(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` to ``name``, else ``""``."""
    close = difflib.get_close_matches(name.lower(), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def resolve_name(
    name: str, choices: Sequence[str], *, what: str, listed_by: str = "posenc list"
) -> str:
    """``name`` as spelled in ``choices``: exact, else case-insensitive when unambiguous.

    Args:
        name: what the user typed (``"ALiBi"``).
        choices: the known names.
        what: the kind of name, for the message (``"encoding"``).
        listed_by: the command that lists the known names, named when they do not fit
            on the error line.

    Raises:
        UsageError: no (unambiguous) match; the message names ``name``, suggests the
            closest known name and lists the known ones where the line stays under
            ``LINE_LIMIT`` characters.
    """
    if name in choices:
        return name
    folded = [c for c in choices if c.lower() == name.lower()]
    if len(folded) == 1:
        return folded[0]
    message = f"unknown {what} {name!r}{suggest(name, choices)}"
    known = f"{message} (known: {', '.join(choices)})"
    if len(PREFIX) + len(known) < LINE_LIMIT:
        raise UsageError(known)
    raise UsageError(f"{message} (`{listed_by}` shows them)")


def unknown_option(command: str, option: str, known: Iterable[str]) -> str:
    """The error for an option ``command`` does not take, with the closest known flag."""
    flags = [f for f in known if f.startswith("--")]
    close = difflib.get_close_matches(option.split("=")[0], flags, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; see `posenc help {command}`"
    return f"{command}: unknown option {option!r}{hint}"


def name_flags(message: str, flags: dict[str, str]) -> str:
    """``message`` with the parameter names of ``flags`` (``train_len``) replaced by
    their flags (``--train-len``); ``name=value`` becomes ``--flag value``. Quoted names
    (``'max_steps'``, a sweep file's key) are left as they are."""
    for name, flag in flags.items():
        message = re.sub(rf"(?<![\w'-]){re.escape(name)}=(?=\S)", f"{flag} ", message)
        message = re.sub(rf"(?<![\w'-]){re.escape(name)}(?![\w'-])", flag, message)
    return message


def error_line(exc: BaseException) -> str:
    """The one line (without newline) that reports ``exc`` to a command-line user.

    ``OSError`` with an ``errno`` names the path and says what went wrong in words
    (``disk full``, ``permission denied``, ``read-only file system``).
    """
    if isinstance(exc, OSError) and exc.errno is not None:
        reason = _OS_REASONS.get(exc.errno) or (exc.strerror or str(exc)).lower()
        paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
        where = " -> ".join(repr(p) for p in paths)
        message = f"{where}: {reason}" if where else reason
    else:
        message = str(exc) or type(exc).__name__
    return PREFIX + " ".join(message.split())


class _Version(argparse.Action):
    """``--version``: the version and the RoPE path on CPU, looked up only when asked for
    (finding the path loads the compiled kernel)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from posenc.encodings.rotary.cpu_kernel import status

        print(f"posenc {__version__} (RoPE on CPU: {status()})")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``posenc`` parser: with ``command``, only that command's options are built
    (each command imports what its options need), else every command's."""
    parser = _TopParser(
        prog="posenc",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # --version on one line
        description="Positional encodings for transformers: tables, figures, tours, the lab.",
        epilog="`posenc help COMMAND` (or `posenc COMMAND --help`) shows a command's options.",
    )
    parser.add_argument("--version", action=_Version, help="the version and the RoPE path")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", title="commands", parser_class=_Parser
    )
    for name in COMMANDS if command is None else (command,):
        importlib.import_module(f"posenc.commands.{name}").add_parser(sub)
    sub.add_parser("help", help="this list, or a command's options: posenc help COMMAND")
    return parser


def _command_name(argv: list[str]) -> list[str]:
    """``argv`` with its command resolved case-insensitively (``LIST`` -> ``list``).

    Raises:
        UsageError: an unknown command, with the closest known one.
    """
    for i, arg in enumerate(argv):
        if arg.startswith("-"):
            continue
        known = [*COMMANDS, "help"]
        return [*argv[:i], resolve_name(arg, known, what="command"), *argv[i + 1 :]]
    return argv


def _help(topics: list[str]) -> int:
    """Print the overview (no topic) or one command's options."""
    name = resolve_name(topics[0], COMMANDS, what="command") if topics else None
    parser = build_parser(name)
    if name is None:
        parser.print_help()
    else:
        parser.parse_args([name, "--help"])  # prints, then exits 0
    return 0


def _refuse_extra(parser: argparse.ArgumentParser, command: str, extra: list[str]) -> None:
    """Raise the error for arguments ``command`` does not take (options: did-you-mean)."""
    option = next((a for a in extra if a.startswith("-")), None)
    if option is None:
        raise UsageError(f"{command}: unrecognized arguments: {' '.join(extra)}")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    raise UsageError(unknown_option(command, option, sub.choices[command]._option_string_actions))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``posenc`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = None
    try:
        argv = _command_name(argv)
        if not argv or argv[0] == "help":
            return _help(argv[1:])
        parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
        args, extra = parser.parse_known_args(argv)
        if extra:
            _refuse_extra(parser, args.command, extra)
        status = args.func(args)
    except UsageError as exc:
        print(PREFIX + str(exc), file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError) as exc:
        line = error_line(exc)
        if args is not None:
            module = importlib.import_module(f"posenc.commands.{args.command}")
            line = name_flags(line, getattr(module, "FLAGS", {}))
        print(line, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("posenc: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    raise SystemExit(main())
