"""What the lab says while it runs: a line at every run's start and end, on any output.

Each line numbers the run in the sweep and gives the time since the sweep (this
invocation) started and an estimate of the time left::

    run 2/18 started: rope s0 (elapsed 0:01:02; about 0:20:15 left)
    run 2/18 finished: rope s0, ok in 0:00:41 (elapsed 0:01:43; about 0:19:30 left)

The estimate is the wall time per unit of finished work times the work left, a run's
work being ``posenc.lab.jobs.run_cost`` (a rotary run with its scalings and fine-tunes
costs about three NoPE runs). Measured on this sweep's own runs, it follows the load of
the machine and the number of worker processes; before the first run ends there is none.
On a terminal the lines scroll above rich's progress bars (one per training, with its
loss); off one (a log file, a pipe, CI) the lines are the whole display, so a long run is
never silent from its start to its end.

Runs are taken in order, ``slots`` at a time (one process, or ``--jobs`` workers that
each take the next run when theirs ends), so a run starts when the sweep starts or when
an earlier run ends. Under ``torchrun`` with runs spread over processes, the first
process reports its own share.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console

__all__ = ["RunLog", "clock_time"]


def clock_time(seconds: float) -> str:
    """``h:mm:ss`` of a duration in seconds (rounded to the second)."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class RunLog:
    """Announces the start and end of each run with elapsed time and an
    estimate of the time left.

    Args:
        console: where the lines go.
        costs: the runs to do, ``(encoding, seed)``, in the order they are taken, each
            with its work (``posenc.lab.jobs.run_cost``).
        slots: runs in flight at once (1, or the worker processes).
        clock: seconds, monotonic (``time.monotonic``; a test's clock).
    """

    def __init__(
        self,
        console: Console,
        costs: dict[tuple[str, int], int],
        *,
        slots: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.clock = console, clock
        self.waiting = list(costs)
        self.total = len(costs)
        self.costs = dict(costs)
        self.work_left = sum(self.costs.values())
        self.work_done = 0
        self.started_at: dict[tuple[str, int], tuple[int, float]] = {}
        self.start = clock()
        for _ in range(min(slots, len(costs))):
            self._next()

    def _next(self) -> None:
        if not self.waiting:
            return
        key = self.waiting.pop(0)
        number = len(self.started_at) + 1
        self.started_at[key] = number, self.clock()
        self._say(f"run {number}/{self.total} started: {_stem(key)}")

    def finished(self, record: dict) -> None:
        """Say that the run of ``record`` ended (its status and wall time: the record's
        ``seconds``, else the time since it was announced), then start the next waiting run."""
        key = record["encoding"], record["seed"]
        number, began = self.started_at.get(key, (0, self.start))
        self.work_done += self.costs.get(key, 0)
        self.work_left -= self.costs.get(key, 0)
        seconds = record.get("seconds")  # measured where it ran (a worker, maybe)
        took = clock_time(seconds if isinstance(seconds, int | float) else self.clock() - began)
        self._say(f"run {number}/{self.total} finished: {_stem(key)}, {record['status']} in {took}")
        self._next()

    def _say(self, what: str) -> None:
        elapsed = self.clock() - self.start
        if self.work_left <= 0:
            left = "nothing left"
        elif self.work_done == 0:
            left = "time left known after the first run"
        else:
            left = f"about {clock_time(elapsed * self.work_left / self.work_done)} left"
        line = f"{what} (elapsed {clock_time(elapsed)}; {left})"
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)


def _stem(key: tuple[str, int]) -> str:
    return f"{key[0]} s{key[1]}"
