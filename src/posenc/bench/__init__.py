"""The benchmark suite behind ``posenc bench`` and ``benchmarks/``.

Suites: ``rope`` (``apply_rope`` against the copy floor and the popular
implementations), ``additive`` (sinusoidal and learned ``x + PE``, table construction)
and ``bias`` (each attention-bias encoding against bias-free SDPA, and peak memory
against the materialized bias). Every number is a median of round-robin repeats, and
every comparison a ratio within one run; see ``posenc.bench.timing``.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from posenc.bench.additive import additive_groups
from posenc.bench.bias import QUICK_LENGTHS, bias_groups, bias_memory
from posenc.bench.report import Target, rope_targets
from posenc.bench.rope import rope_groups
from posenc.bench.timing import Group, machine_info, warm_memory

__all__ = ["SUITES", "Results", "external_benchmark", "run_benchmarks"]

SUITES = ("rope", "additive", "bias")
_RUNNERS = {"rope": rope_groups, "additive": additive_groups, "bias": bias_groups}


COMPILE_NOTE = "none: every posenc path is eager, no torch.compile step"


@dataclass
class Results:
    """Everything one run measured."""

    machine: dict[str, object]
    settings: dict[str, object]
    groups: list[Group]
    bias_memory: list[dict[str, object]]
    targets: list[Target]
    external: dict[str, object]

    def to_json(self) -> dict[str, object]:
        return {
            "machine": self.machine,
            "settings": self.settings,
            "compile": COMPILE_NOTE,
            "groups": [g.to_json() for g in self.groups],
            "bias_memory": self.bias_memory,
            "targets": [t.to_json() for t in self.targets],
            "external": self.external,
        }


def external_benchmark(name: str, roots: Sequence[Path]) -> Path | None:
    """The first ``benchmarks/<name>.py`` under ``roots`` (a source checkout), if any."""
    for root in roots:
        path = root / "benchmarks" / f"{name}.py"
        if path.is_file():
            return path
    return None


def _run_external(path: Path, *, quick: bool, repeats: int) -> object:
    """Import ``path`` and call its ``run(...)`` with the options it accepts."""
    spec = importlib.util.spec_from_file_location(f"posenc_bench_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import benchmark {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = getattr(module, "run", None)
    if run is None:
        return None
    offered = {"quick": quick, "repeats": repeats, "sizes": QUICK_LENGTHS if quick else None}
    offered = {k: v for k, v in offered.items() if v is not None}
    accepted = inspect.signature(run).parameters
    result = run(**{k: v for k, v in offered.items() if k in accepted})
    return json.loads(json.dumps(result, default=str))


def run_benchmarks(
    *,
    only: Sequence[str] = SUITES,
    quick: bool = False,
    threads: int = 2,
    repeats: int | None = None,
    roots: Sequence[Path] = (),
) -> Results:
    """Run the chosen suites on this machine.

    Args:
        only: suites to run, a subset of ``SUITES``.
        quick: tiny shapes and one or two repeats (seconds, for smoke tests).
        threads: ``torch.set_num_threads`` during the run (restored afterwards).
        repeats: timed rounds per group (default 15, or 2 when ``quick``).
        roots: source checkouts whose ``benchmarks/bench_bias_attention.py``, if
            present, also runs with the bias suite (its ``run(sizes=, repeats=)``).

    Returns:
        The groups measured, the bias memory rows, the issue's targets and the
        external benchmark's result; ``Results.to_json()`` gives plain data.

    Raises:
        ValueError: an unknown suite name or a non-positive ``threads``/``repeats``.
    """
    unknown = [s for s in only if s not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; known suites: {', '.join(SUITES)}")
    if threads < 1 or (repeats is not None and repeats < 1):
        raise ValueError(f"threads and repeats must be >= 1, got {threads} and {repeats}")
    repeats = repeats or (2 if quick else 15)
    warmup = 1 if quick else 2
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        warmed = 0 if quick else warm_memory(4 << 30)
        groups: list[Group] = []
        for suite in SUITES:
            if suite in only:
                groups += _RUNNERS[suite](quick=quick, repeats=repeats, warmup=warmup)
        memory = bias_memory(quick=quick) if "bias" in only else []
        external = {}
        path = external_benchmark("bench_bias_attention", roots) if "bias" in only else None
        if path is not None:
            external[path.stem] = _run_external(path, quick=quick, repeats=min(repeats, 5))
        machine = machine_info()
    finally:
        torch.set_num_threads(previous)
    settings = {
        "suites": list(only),
        "quick": quick,
        "threads": threads,
        "repeats": repeats,
        "memory_warmed_bytes": warmed,
    }
    return Results(machine, settings, groups, memory, rope_targets(groups), external)
