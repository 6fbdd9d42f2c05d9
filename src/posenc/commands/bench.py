"""``posenc bench``: run the speed and memory benchmarks on this machine.

Prints the machine and its load, one table per group (median and maximum, multiples of
the copy floor, speedups over the transformers-style expression), the bias memory and
bias attention tables and the issue's targets, each within 80 columns, and writes
everything, with the machine's description, to a JSON file when asked.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from posenc.cli import UsageError, suggest

#: Printed first under ``--quick``: its shapes and repeats are too small for the ratios.
QUICK_NOTE = "--quick: a smoke test (tiny shapes, 2 repeats); its ratios are not meaningful"


def _suites(text: str) -> list[str]:
    from posenc.bench import SUITES

    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SUITES]
    if not names or unknown:
        hint = suggest(unknown[0], SUITES) if unknown else ""
        raise argparse.ArgumentTypeError(
            f"unknown suite {(unknown or [text])[0]!r}" + (hint or f"; known: {', '.join(SUITES)}")
        )
    return names


def _count(least: int):
    """An argparse type: an integer of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return parse


def _only_help() -> str:
    from posenc.bench import SUITES

    return f"comma-separated suites to run, of {', '.join(SUITES)} (default: all)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="time RoPE, additive and bias encodings on this machine",
        description="Time posenc's RoPE, additive and bias encodings against the copy "
        "floor and the popular implementations; ratios are measured within one run.",
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes, 2 repeats (seconds)")
    p.add_argument(
        "--only",
        type=_suites,
        default=None,
        metavar="SUITES",
        help=_only_help,  # a function: posenc.bench is imported when the help is shown
    )
    p.add_argument(
        "--threads", type=_count(1), default=2, metavar="N", help="torch threads (default 2)"
    )
    p.add_argument(
        "--repeats",
        type=_count(1),
        default=None,
        metavar="N",
        help="timed rounds per group (default 15, or 2 with --quick)",
    )
    p.add_argument(
        "--load",
        type=_count(0),
        default=0,
        metavar="N",
        help="run N busy processes beside the benchmark, to measure under load (default 0)",
    )
    p.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="keep freed memory in the process (glibc malloc thresholds, as jemalloc or "
        "tcmalloc would): times without the page faults of returned temporaries",
    )
    p.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="also write all results here"
    )
    p.set_defaults(func=run)


def _write_json(path: Path, data: object) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file renamed into place)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=1) + "\n")
        os.chmod(tmp, 0o644)  # the usual mode of a new file, not mkstemp's 0o600
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _load_line(machine: dict, busy: int) -> str:
    averages = machine.get("load_average")
    if not averages:
        return f"load: unknown; {busy} busy processes added"
    before = machine.get("load_average_before") or averages
    return (
        f"load average: {before[0]:.1f} before, {averages[0]:.1f} at the end "
        f"(1 min); --load {busy} busy process{'es' if busy != 1 else ''}"
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from posenc.bench import SUITES, run_benchmarks
    from posenc.bench.bias_attention import COLUMNS as BIAS_ATTENTION_COLUMNS
    from posenc.bench.report import print_groups, print_memory, print_targets, rows_table
    from posenc.encodings.rotary import cpu_kernel

    if args.json is not None and not args.json.parent.is_dir():
        raise UsageError(f"bench: --json: directory {str(args.json.parent)!r} does not exist")
    results = run_benchmarks(
        only=args.only or list(SUITES),
        quick=args.quick,
        threads=args.threads,
        repeats=args.repeats,
        load=args.load,
        keep_freed_memory=args.keep_freed_memory,
    )
    console = Console()
    if args.quick:
        console.print(QUICK_NOTE, highlight=False)
    machine = results.machine
    console.print(
        f"{machine['cpu_model']}, {machine['cpu_cores']} cores; torch {machine['torch']}, "
        f"{args.threads} thread{'s' if args.threads != 1 else ''}",
        highlight=False,
    )
    console.print(_load_line(machine, args.load), highlight=False)
    console.print(f"allocator: {results.settings['allocator']}", highlight=False)
    console.print(f"RoPE on CPU: {cpu_kernel.status()}", highlight=False)
    print_groups(console, results.groups)
    print_memory(console, results.bias_memory)
    if results.bias_attention:
        title = "bias attention, time ÷ SDPA causal without a bias"
        console.print(rows_table(title, results.bias_attention, BIAS_ATTENTION_COLUMNS))
    print_targets(console, results.targets, quick=args.quick)
    if args.json is not None:
        _write_json(args.json, results.to_json())
        console.print(f"results written to {args.json}", highlight=False)
    return 0
