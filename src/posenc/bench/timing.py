"""Timing primitives of the benchmark suite: round-robin medians, spreads, machine info.

Every comparison is measured in one run, with the cases of a group interleaved (one call
of each per round, in a random order), so that a busy machine slows them alike, and is
the median over the rounds of the ratio within each round (``median_ratio``).

There is no up-front memory warm-up: each group's untimed rounds touch what it uses. On a
virtual machine that reports free memory to its host (free page reporting: free 2 MiB
blocks are handed back about 2 s after they are freed), touching and freeing a large
buffer up front is undone within seconds, and handing it back stalls the guest: on a
2-core EPYC VM, a loop of 32 MiB copies saw 3-9 stalls of 32-80 ms in each 3 s window
for 15 s after 4 GiB of huge pages were touched and freed, against at most one of 7 ms
in 6 s before (``benchmarks/bench_noise.py``), and a first group timed in those seconds
missed a maximum in each of three quiet runs that had the warm-up.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import torch

__all__ = [
    "Group",
    "Stats",
    "load_average",
    "machine_info",
    "measure",
    "median_ratio",
    "with_control",
]


@dataclass(frozen=True)
class Stats:
    """Wall-clock statistics of one case, in milliseconds; ``rounds_ms``: every timing in
    the order of the rounds (``measure``), from which per-round ratios are taken."""

    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    max_ms: float
    repeats: int
    rounds_ms: tuple[float, ...] = ()

    @classmethod
    def of(cls, seconds: list[float]) -> Stats:
        """The statistics of ``seconds``, given in round order."""
        rounds = tuple(1e3 * s for s in seconds)
        ms = sorted(rounds)
        if len(ms) >= 2:
            q1, _, q3 = statistics.quantiles(ms, n=4, method="inclusive")
        else:
            q1 = q3 = ms[0]
        return cls(statistics.median(ms), q1, q3, ms[0], ms[-1], len(ms), rounds)


def median_ratio(case: Stats, baseline: Stats) -> float:
    """``case`` over ``baseline``: the median over rounds of their ratio in each round when
    both were timed in the same rounds (a slow stretch of the machine then slows both
    sides of a ratio), else the ratio of their medians."""
    a, b = case.rounds_ms, baseline.rounds_ms
    if a and len(a) == len(b):
        return statistics.median(x / y for x, y in zip(a, b, strict=True))
    return case.median_ms / baseline.median_ms


def measure(
    cases: Mapping[str, Callable[[], object]], *, repeats: int, warmup: int = 1, seed: int = 0
) -> dict[str, Stats]:
    """Time each callable ``repeats`` times, round-robin, after ``warmup`` untimed rounds.

    Each round runs the cases in a new random order (seeded): a case that frees a lot of
    memory leaves the kernel work of returning it (and, on a virtual machine, of the
    host reclaiming it) to whichever case runs next, so no case may always follow the
    same neighbour.
    """
    names = list(cases)
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    order = random.Random(seed)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        for name in order.sample(names, len(names)):
            start = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - start)
    return {name: Stats.of(times[name]) for name in names}


def with_control(
    cases: Mapping[str, Callable[[], object]], controls: Mapping[str, str]
) -> dict[str, Callable[[], object]]:
    """``cases`` with an A/A control of each baseline in ``controls`` (baseline name ->
    control name): the same callable once more, listed right after the baseline and
    timed in the same rounds as a case of its own.

    Two timings of one call differ only by the machine's noise, so their ratio in a run
    (``Group.spread``) is how far a case identical to the baseline would have landed
    from it in that run: the resolution of every ratio to that baseline.
    """
    unknown = [name for name in controls if name not in cases]
    if unknown:
        raise ValueError(f"no case named {unknown[0]!r} to control; cases: {list(cases)}")
    out: dict[str, Callable[[], object]] = {}
    for name, fn in cases.items():
        out[name] = fn
        if name in controls:
            out[controls[name]] = fn
    return out


@dataclass
class Group:
    """Cases measured together, with ratios against the group's baselines.

    ``ratios[case]`` maps a baseline name to ``median(case) / median(baseline)`` (the
    multiple of the copy floor) or, for ``speedup_over`` baselines, the inverse
    ``median(baseline) / median(case)`` (how many times faster the case is).
    ``controls`` maps a baseline to its A/A control, the same call timed again.
    """

    suite: str
    title: str
    stats: dict[str, Stats]
    floor: str | None = None
    speedup_over: tuple[str, ...] = ()
    info: dict[str, object] = field(default_factory=dict)
    controls: dict[str, str] = field(default_factory=dict)

    def ratio_to_floor(self, case: str) -> float | None:
        """``case`` over the floor (``median_ratio``)."""
        if self.floor is None or self.floor not in self.stats:
            return None
        return median_ratio(self.stats[case], self.stats[self.floor])

    def speedup(self, case: str, baseline: str) -> float | None:
        """How many times faster ``case`` is than ``baseline`` (``median_ratio``)."""
        if baseline not in self.stats:
            return None
        return median_ratio(self.stats[baseline], self.stats[case])

    def spread(self, baseline: str, *, worst: bool = False) -> float | None:
        """How far ``baseline`` and its A/A control (``controls``, see ``with_control``)
        landed apart in this run: ``max(r, 1 / r) >= 1`` of their ratio (``median_ratio``),
        or of their maxima when ``worst``; None without a control."""
        control = self.stats.get(self.controls.get(baseline, ""))
        if control is None or baseline not in self.stats:
            return None
        if worst:
            ratio = self.stats[baseline].max_ms / control.max_ms
        else:
            ratio = median_ratio(self.stats[baseline], control)
        return max(ratio, 1 / ratio)

    def to_json(self) -> dict[str, object]:
        cases = []
        for name, st in self.stats.items():
            entry: dict[str, object] = {"case": name, **asdict(st)}
            entry["x_floor"] = self.ratio_to_floor(name)
            entry["speedup"] = {b: self.speedup(name, b) for b in self.speedup_over}
            cases.append(entry)
        return {
            "suite": self.suite,
            "title": self.title,
            "info": self.info,
            "cases": cases,
            "controls": self.controls,
        }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, rounded to two decimals (None: unknown)."""
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine_info() -> dict[str, object]:
    """CPU model, cores, torch version and threads of the machine the suite runs on."""
    return {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": load_average(),
    }
