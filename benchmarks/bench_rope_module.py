"""``RotaryEmbedding()(q, k)`` against ``apply_rope`` on the same tensors, per round.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim; q and k ``[B, H, T, D]``.
The module builds (or slices) its cos/sin for positions ``0..T-1`` and rotates; the
kernel call gets the cos/sin precomputed. Each round times the three cases once in a new
order (``posenc.bench.timing.measure`` with one repeat and the round's seed); the ratio
is taken per round and its median printed, beside the A/A spread of the baseline (the same
``apply_rope`` call timed twice in each round). Also: the kernel on 2 threads against 1
for small tensors (a thread split that costs more than it saves). With ``--json PATH``
the medians, maxima and A/A spreads are written as targets (``posenc.bench.report.Target``:
the module at most 1.1x the kernel, 2 threads at most 1x one) beside the machine and its
load before and after, as ``benchmarks/results/rope-module-*.json`` records them.

    python benchmarks/bench_rope_module.py [--rounds 40] [--threads 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch

from posenc import RotaryEmbedding, apply_rope
from posenc.bench.report import Target
from posenc.bench.timing import load_average, machine_info, measure

SHAPES = (
    ((1, 8, 128, 64), torch.float32),
    ((1, 32, 512, 128), torch.float32),
    ((4, 16, 2048, 64), torch.float32),
    ((4, 16, 2048, 64), torch.bfloat16),
)
SMALL = ((1, 2, 256, 64), (1, 8, 128, 64), (1, 8, 1, 128))
MODULE_LIMIT = 1.1  # the module call at most this many times apply_rope (issue 36)


def _per_round(cases: dict, rounds: int) -> dict[str, list[float]]:
    """Milliseconds of each case in each round (one ``measure`` repeat per round)."""
    for fn in cases.values():  # warm-up: tables built, kernel loaded
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for seed in range(rounds):
        for name, stats in measure(cases, repeats=1, warmup=0, seed=seed).items():
            times[name].append(stats.median_ms)
    return times


def _median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def _label(shape: tuple[int, ...], dtype: torch.dtype | None = None) -> str:
    name = f"[{','.join(str(n) for n in shape)}]"
    return name if dtype is None else f"{name} {str(dtype)[6:]}"


def module_against_kernel(rounds: int) -> list[Target]:
    """Per shape: the module / ``apply_rope`` median and maximum of per-round ratios."""
    print("shape dtype: module / apply_rope, median of per-round ratios (max), A/A spread")
    targets = []
    for shape, dtype in SHAPES:
        gen = torch.Generator().manual_seed(0)
        q, k = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
        rope = RotaryEmbedding(shape[-1])
        cos, sin = rope.cos_sin(torch.arange(shape[2]))

        def kernel(q=q, k=k, cos=cos, sin=sin):
            return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        cases = {"apply_rope": kernel, "apply_rope again": kernel}
        cases["RotaryEmbedding"] = lambda rope=rope, q=q, k=k: rope(q, k)
        t = _per_round(cases, rounds)
        ratios = [m / a for m, a in zip(t["RotaryEmbedding"], t["apply_rope"], strict=True)]
        spread = _median_ratio(t["apply_rope again"], t["apply_rope"])
        label, what = _label(shape, dtype), "RotaryEmbedding: ÷ apply_rope"
        targets.append(Target(label, what, statistics.median(ratios), MODULE_LIMIT, True, spread))
        targets.append(Target(label, f"{what} (max)", max(ratios), MODULE_LIMIT, True))
        print(
            f"{list(shape)} {str(dtype)[6:]}: {statistics.median(ratios):.3f} "
            f"({max(ratios):.2f}), A/A {spread:.3f}; apply_rope "
            f"{statistics.median(t['apply_rope']):.3f} ms"
        )
    return targets


def threads_against_one(rounds: int, threads: int) -> list[Target]:
    """Per small shape: ``apply_rope`` on ``threads`` threads / on 1, median per round."""
    print(f"small tensors: apply_rope on {threads} threads / on 1, median of per-round ratios")
    targets = []
    for shape in SMALL:
        x = torch.randn(shape)
        cos, sin = RotaryEmbedding(shape[-1]).cos_sin(torch.arange(shape[2]))

        def on(n: int, x=x, cos=cos, sin=sin):
            def call():
                torch.set_num_threads(n)
                return apply_rope(x, cos, sin)

            return call

        t = _per_round({"1": on(1), "n": on(threads), "1 again": on(1)}, rounds)
        ratio, spread = _median_ratio(t["n"], t["1"]), _median_ratio(t["1 again"], t["1"])
        what = f"apply_rope {threads} threads: ÷ 1 thread"
        targets.append(Target(_label(shape, torch.float32), what, ratio, 1.0, True, spread))
        print(
            f"{list(shape)}: {ratio:.2f} (A/A {spread:.2f}; 1 thread "
            f"{statistics.median(t['1']):.3f} ms)"
        )
    torch.set_num_threads(threads)
    return targets


def write_json(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` atomically (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    os.replace(f.name, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the record here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    before = load_average()
    print(f"load average {before[0]:.1f}, {args.threads} threads, {args.rounds} rounds")
    targets = module_against_kernel(args.rounds) + threads_against_one(args.rounds, args.threads)
    machine = {**machine_info(), "load_average_before": before}
    print(f"load average {machine['load_average'][0]:.1f} at the end")
    if args.json is not None:
        settings = {"rounds": args.rounds, "threads": args.threads}
        record = {"machine": machine, "settings": settings}
        write_json(args.json, {**record, "targets": [t.to_json() for t in targets]})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
