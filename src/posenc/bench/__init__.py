"""The benchmark suite behind ``posenc bench`` and ``benchmarks/``.

Suites: ``rope`` (``apply_rope`` against the copy floor and the popular
implementations), ``additive`` (sinusoidal and learned ``x + PE``, table construction),
``bias`` (each attention-bias encoding's layer against the bias-free layer, and peak
memory against the materialized bias; blocked and materialized bias attention against
causal SDPA, ``posenc.bench.bias_attention``), ``attention`` (each bias's attention core
against causal SDPA at 2k-8k tokens, with the issue's limits), ``lab``
(``posenc.bench.lab``: the lab model's training step and evaluation forward per
encoding, in tokens per second) and ``ring`` (``posenc.bench.ring``: ring attention with a
bias on two processes against the unsplit layer, time and bytes sent per step). Every
number is a median (and a maximum) of round-robin repeats, and every comparison a ratio
within one run; see ``posenc.bench.timing``.
``load`` runs busy processes beside the benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from posenc.bench import bias_attention
from posenc.bench.additive import additive_groups
from posenc.bench.allocator import keep_freed_memory as keep_freed_memory_
from posenc.bench.bias import (
    QUICK_LENGTHS,
    attention_groups,
    bias_groups,
    bias_memory,
    bias_targets,
)
from posenc.bench.lab import lab_groups
from posenc.bench.load import busy_processes
from posenc.bench.report import Target, rope_targets
from posenc.bench.ring import ring_groups
from posenc.bench.rope import rope_groups
from posenc.bench.timing import Group, load_average, machine_info
from posenc.bench.triton_rope import triton_rope_groups
from posenc.encodings.rotary import cpu_kernel

__all__ = ["SUITES", "Results", "run_benchmarks"]

SUITES = ("rope", "additive", "bias", "attention", "lab", "ring", "triton")
_RUNNERS = {
    "rope": rope_groups,
    "additive": additive_groups,
    "bias": bias_groups,
    "attention": attention_groups,
    "lab": lab_groups,
    "ring": ring_groups,
    "triton": triton_rope_groups,  # CUDA only: no groups elsewhere
}


COMPILE_NOTE = "no torch.compile step; RoPE on CPU tensors runs posenc's own kernel (see rope_cpu)"


@dataclass
class Results:
    """Everything one run measured."""

    machine: dict[str, object]
    settings: dict[str, object]
    groups: list[Group]
    bias_memory: list[dict[str, object]]
    targets: list[Target]
    bias_attention: list[dict]

    def to_json(self) -> dict[str, object]:
        return {
            "machine": self.machine,
            "settings": self.settings,
            "compile": COMPILE_NOTE,
            "rope_cpu": cpu_kernel.status(),
            "groups": [g.to_json() for g in self.groups],
            "bias_memory": self.bias_memory,
            "bias_attention": self.bias_attention,
            "targets": [t.to_json() for t in self.targets],
        }


def run_benchmarks(
    *,
    only: Sequence[str] = SUITES,
    quick: bool = False,
    threads: int = 2,
    repeats: int | None = None,
    load: int = 0,
    keep_freed_memory: bool = False,
) -> Results:
    """Run the chosen suites on this machine.

    Args:
        only: suites to run, a subset of ``SUITES``.
        quick: tiny shapes and one or two repeats (seconds, for smoke tests).
        threads: ``torch.set_num_threads`` during the run (restored afterwards).
        repeats: timed rounds per group (default 15, or 2 when ``quick``).
        load: busy processes to run beside the benchmark (``posenc.bench.load``).
        keep_freed_memory: keep freed memory in this process from here on
            (``posenc.bench.allocator``; glibc), so that no case pays page faults for
            temporaries the allocator handed back; the record says which allocator ran.

    Returns:
        The groups measured, the bias memory and bias attention rows and the issue's
        targets; ``Results.to_json()`` gives plain data, with the machine's load
        average before and after the run.

    Raises:
        ValueError: an unknown suite name, ``threads`` or ``repeats`` below 1, a
            negative ``load``, or ``keep_freed_memory`` where the C library is not glibc.
    """
    unknown = [s for s in only if s not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; known suites: {', '.join(SUITES)}")
    limits = (("threads", threads, 1), ("repeats", repeats, 1), ("load", load, 0))
    for option, value, least in limits:
        if value is not None and value < least:
            raise ValueError(f"{option} must be >= {least}, got {value}")
    repeats = repeats or (2 if quick else 15)
    warmup = 1 if quick else 2
    allocator = keep_freed_memory_() if keep_freed_memory else "C library defaults"
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    load_before = load_average()
    try:
        with busy_processes(load):
            groups: list[Group] = []
            for suite in SUITES:
                if suite in only:
                    groups += _RUNNERS[suite](quick=quick, repeats=repeats, warmup=warmup)
            memory = bias_memory(quick=quick) if "bias" in only else []
            attention = []
            if "bias" in only:
                sizes = QUICK_LENGTHS if quick else bias_attention.FULL_SIZES
                attention = bias_attention.run(sizes, min(repeats, 5))
            machine = machine_info()
    finally:
        torch.set_num_threads(previous)
    machine["load_average_before"] = load_before
    settings = {
        "suites": list(only),
        "quick": quick,
        "threads": threads,
        "repeats": repeats,
        "busy_processes": load,
        "allocator": allocator,
    }
    targets = rope_targets(groups) + bias_targets(groups)
    return Results(machine, settings, groups, memory, targets, attention)
