"""Runs spread over worker processes on one machine (``posenc lab --jobs N``).

A tiny model keeps two cores busier as two single-threaded processes, each training its
own run (an encoding and a seed), than as one process with two threads: the small
matrix products, layer norms and optimizer steps of one model parallelise poorly. Each
worker (``multiprocessing``'s ``spawn``) loads the corpus once, trains the runs it is
handed with ``threads`` torch threads and writes their weights; the parent writes the run
records and the report as they come back. Ctrl-C stops the workers (they ignore SIGINT
themselves; the parent terminates them) and keeps what finished.

Runs differ in cost: a rotary run also evaluates its scalings and two fine-tunes (about
three times a NoPE run). ``longest_first`` orders them by ``run_cost`` (Graham 1969's
longest-processing-time rule), so the long runs start first and the short ones fill
the workers to the end instead of one long run finishing alone.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Iterator
from pathlib import Path

import torch
from rich.progress import Progress

from posenc.lab.config import LabConfig
from posenc.lab.distributed import Context
from posenc.lab.runs import Runner
from posenc.lab.variants import is_rotary, variants
from posenc.lab.workload import make_workload

__all__ = ["longest_first", "run_cost", "run_in_processes"]

_RUNNER: Runner | None = None


def _start(config: LabConfig, out: str, identity: str, threads: int, device: str) -> None:
    global _RUNNER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    torch.set_num_threads(threads)
    context = Context(device=torch.device(device))
    work = make_workload(config, context)
    _RUNNER = Runner(config, work, context, Path(out), Progress(disable=True), identity)


def _run(key: tuple[str, int]) -> dict:
    assert _RUNNER is not None
    return _RUNNER.run(*key)


def run_cost(name: str, config: LabConfig) -> int:
    """A run's work in units of one evaluation row (every length once): its training
    (about two rows at the default sizes), its rows, and per fine-tune a training
    (about one row) and a row."""
    tunes = 1 + len(config.finetune_scalings) if config.finetune_steps and is_rotary(name) else 0
    return 2 + 1 + len(variants(name, config)) + 2 * tunes


def longest_first(todo: list[tuple[str, int]], config: LabConfig) -> list[tuple[str, int]]:
    """``todo`` (encoding, seed) by decreasing ``run_cost``, in their order among equals."""
    return sorted(todo, key=lambda key: -run_cost(key[0], config))


def run_in_processes(
    config: LabConfig,
    out: Path,
    identity: str,
    todo: list[tuple[str, int]],
    *,
    jobs: int,
    threads: int,
    device: torch.device,
) -> Iterator[dict]:
    """Train and evaluate the runs ``todo`` in ``jobs`` processes; yield each record as
    it finishes (in any order).

    Raises:
        OSError: a worker could not write its weights.
    """
    spawn = multiprocessing.get_context("spawn")
    init = (config, str(out), identity, threads, str(device))
    pool = spawn.Pool(jobs, initializer=_start, initargs=init)
    try:
        yield from pool.imap_unordered(_run, todo)
        pool.close()
    finally:
        pool.terminate()
        pool.join()
