"""How far this machine moves a timing by itself: what a ratio of maxima can resolve.

Two measurements, on the first RoPE group of ``posenc bench`` (q and k
``[4, 16, 2048, 64]`` float32, 2 threads):

* ``aa``: the group's forward cases, round-robin, ``--runs`` times; each run reports how
  far each copy floor landed from itself timed again as a separate case (the A/A
  controls of ``posenc.bench.rope.CONTROLS``), for the medians and for the maxima, next
  to ``apply_rope``'s ratios to them.
* ``stalls``: a loop of copies into preallocated tensors (no allocation at all) for
  ``--seconds``, counting the calls slower than three times the median plus 5 ms;
  then ``--free-gib`` GiB are touched and freed (what a memory warm-up does), on 4 KiB
  pages and then on huge pages, and the loop runs again, in windows of 3 s. On a virtual
  machine that reports free memory to its host, the loops after show the cost of handing
  that memory back.

Usage: ``python benchmarks/bench_noise.py OUT.json [--runs N] [--seconds S] [--free-gib G]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from posenc.bench.rope import CLONE, CONTROLS, FLOOR, _forward_cases, _inputs
from posenc.bench.timing import load_average, machine_info, measure
from posenc.fastpath import empty_like

SHAPE = (4, 16, 2048, 64)


def _spread(a: float, b: float) -> float:
    return max(a / b, b / a)


def aa_runs(runs: int, repeats: int = 15) -> list[dict]:
    """Each run: the A/A spreads of both floors and ``apply_rope``'s ratios to them."""
    cases = _forward_cases(_inputs(SHAPE, torch.float32))
    rows = []
    for run in range(runs):
        stats = measure(cases, repeats=repeats, warmup=2, seed=run)
        row: dict[str, float | int] = {"run": run}
        for base, case in ((FLOOR, "apply_rope_ half (in place)"), (CLONE, "apply_rope half")):
            again, tag = stats[CONTROLS[base]], "floor" if base == FLOOR else "clone"
            for stat in ("median_ms", "max_ms"):
                key = stat.removesuffix("_ms")
                base_value, again_value = getattr(stats[base], stat), getattr(again, stat)
                row[f"{tag}_aa_{key}"] = _spread(base_value, again_value)
                row[f"{case}_over_{tag}_{key}"] = getattr(stats[case], stat) / base_value
        rows.append(row)
        print(row, flush=True)
    return rows


def _copy_loop(seconds: float, q: torch.Tensor, out: torch.Tensor) -> dict:
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        out.copy_(q)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    slow = [t for t in times if t > 3 * median + 0.005]
    return {
        "calls": len(times),
        "median_ms": 1e3 * median,
        "max_ms": 1e3 * max(times),
        "stalls": len(slow),
    }


def _touch_and_free(gib: float, huge_pages: bool) -> int:
    """Touch ``gib`` GiB in blocks of 256 MiB, then free them; returns the bytes touched."""
    template = torch.empty(256 << 20, dtype=torch.uint8)  # never touched: costs nothing
    new = empty_like if huge_pages else torch.empty_like
    blocks = [new(template).fill_(1) for _ in range(int(gib * 4))]
    return sum(b.numel() for b in blocks)


def stalls(seconds: float, free_gib: float, windows: int = 5) -> list[dict]:
    """Stalls of a copy loop before, and in windows of 3 s after, touching and freeing
    ``free_gib`` GiB on 4 KiB pages, then on huge pages (``fastpath.empty_like``, as the
    benchmark's memory warm-up did)."""
    q = torch.randn(SHAPE)
    out = torch.empty_like(q)
    rows = []
    for huge_pages in (False, True):
        before = _copy_loop(seconds, q, out)
        start = time.perf_counter()
        touched = _touch_and_free(free_gib, huge_pages)
        touch_s = time.perf_counter() - start
        after = [_copy_loop(3.0, q, out) for _ in range(windows)]
        rows.append(
            {"huge_pages": huge_pages, "before": before, "touched_bytes": touched}
            | {"touch_s": touch_s, "after_3s": after}
        )
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", metavar="OUT.json")
    parser.add_argument("--runs", type=int, default=12, metavar="N")
    parser.add_argument("--seconds", type=float, default=6.0, metavar="S")
    parser.add_argument("--free-gib", type=float, default=4.0, metavar="G")
    args = parser.parse_args()
    torch.set_num_threads(2)
    load_before = load_average()
    result = {"aa": aa_runs(args.runs), "stalls": stalls(args.seconds, args.free_gib)}
    result |= {"machine": machine_info(), "load_average_before": load_before}
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
