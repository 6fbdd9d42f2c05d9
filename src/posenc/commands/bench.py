"""``posenc bench``: run the speed and memory benchmarks on this machine.

Prints one table per group (medians, spreads, multiples of the copy floor, speedups over
the transformers-style expression), the bias memory table and the issue's targets, and
writes everything, with the machine's description, to a JSON file when asked.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from posenc.bench import SUITES, run_benchmarks
from posenc.bench.report import print_groups, print_memory, print_rows, print_targets
from posenc.cli import UsageError


def _suites(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SUITES]
    if not names or unknown:
        raise UsageError(
            f"bench: --only takes {'|'.join(SUITES)} (comma-separated), got {text!r}"
        )
    return names


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time RoPE, additive and bias encodings on this machine")
    p.add_argument("--quick", action="store_true", help="tiny shapes, 1-2 repeats (seconds)")
    p.add_argument("--only", type=_suites, default=list(SUITES), metavar="|".join(SUITES))
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per group")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write results here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.json is not None and not args.json.parent.is_dir():
        raise NotADirectoryError(f"--json: directory {str(args.json.parent)!r} does not exist")
    results = run_benchmarks(
        only=args.only,
        quick=args.quick,
        threads=args.threads,
        repeats=args.repeats,
        roots=(Path.cwd(), Path(__file__).resolve().parents[3]),
    )
    console = Console(width=max(Console().width, 140))
    machine = results.machine
    console.print(
        f"{machine['cpu_model']}, {machine['cpu_cores']} cores, torch {machine['torch']}, "
        f"{machine['torch_threads']} threads, load {machine['load_average']}"
    )
    print_groups(console, results.groups)
    print_memory(console, results.bias_memory)
    for name, rows in results.external.items():
        print_rows(console, f"benchmarks/{name}.py", rows)
    print_targets(console, results.targets, quick=args.quick)
    if args.json is not None:
        args.json.write_text(json.dumps(results.to_json(), indent=1) + "\n", encoding="utf-8")
        console.print(f"results written to {args.json}")
    return 0
