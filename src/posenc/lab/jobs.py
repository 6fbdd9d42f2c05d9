"""Runs spread over worker processes on one machine (``posenc lab --jobs N``).

A tiny model keeps two cores busier as two single-threaded processes, each training its
own run (an encoding and a seed), than as one process with two threads: the small
matrix products, layer norms and optimizer steps of one model parallelise poorly. Each
worker (``multiprocessing``'s ``spawn``) loads the corpus once, trains the runs it is
handed with ``threads`` torch threads and writes their weights; the parent writes the run
records and the report as they come back. Ctrl-C stops the workers (they ignore SIGINT
themselves; the parent terminates them) and keeps what finished.
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
from posenc.lab.workload import make_workload

__all__ = ["run_in_processes"]

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
