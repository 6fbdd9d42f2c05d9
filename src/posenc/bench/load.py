"""Background load for the benchmarks: ``N`` busy processes beside the measured one.

``posenc bench --load N`` measures how the kernels degrade when other work competes for
the cores (a shared machine, a data loader, a second job). Each busy process spins in a
pure-Python loop; all of them are stopped when the benchmark ends, fails or is
interrupted (Ctrl-C), and each also exits by itself as soon as its parent is gone, so a
killed benchmark cannot leave spinning orphans behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["busy_processes"]

# Spin; every few million iterations check that the parent (the benchmark) still exists.
_SPIN = (
    "import os, sys\n"
    "parent = int(sys.argv[1])\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(2_000_000):\n"
    "        pass\n"
)


@contextmanager
def busy_processes(count: int) -> Iterator[list[int]]:
    """Run ``count`` spinning processes for the duration of the ``with`` block.

    Args:
        count: how many (0: none).

    Yields:
        Their process ids.

    Raises:
        ValueError: a negative ``count``.
    """
    if count < 0:
        raise ValueError(f"the number of busy processes must be >= 0, got {count}")
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _SPIN, str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
