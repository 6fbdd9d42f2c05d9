"""Cost of attention sinks, dual chunk attention and LieRE / ComRoPE beside RoPE on the CPU.

Round-robin timing in one process (``posenc.bench``-style ratios; absolute times depend on
the machine's load): each case runs once per round, the median over rounds is reported
with its ratio to the first case of its group.

    python benchmarks/bench_positions_2024.py [--length 1024] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import posenc
from posenc.encodings import ComRoPE, DualChunkAttention, LieRE


def _groups(length: int) -> dict[str, dict[str, object]]:
    d_model, heads, dim = 512, 8, 64
    x = torch.randn(1, length, d_model)
    grid = torch.stack(
        torch.meshgrid(torch.arange(32), torch.arange(length // 32), indexing="ij"), -1
    )
    grid = grid.reshape(-1, 2)

    def layer(position, **kw):
        return posenc.MultiHeadAttention(d_model, heads, position=position, **kw).eval()

    rope = layer("rope")
    sinks = {b: layer("rope", sinks=True, backend=b) for b in ("sdpa", "chunked", "eager")}
    dca = layer(DualChunkAttention(dim, heads, chunk_size=length // 4, local_size=length // 32))
    rope_eager = layer("rope", backend="eager")
    q = torch.randn(1, heads, length, dim)
    rotary = posenc.RotaryEmbedding(dim)
    encs = {
        "liere": LieRE(dim, axes=2, block_size=8),
        "comrope-ap": ComRoPE(dim, axes=2, block_size=8, variant="ap"),
        "comrope-ld": ComRoPE(dim, axes=2, block_size=8, variant="ld"),
    }
    return {
        f"attention forward, rope, [1, {length}, 512]": {
            "sdpa, no sinks": lambda: rope(x),
            **{f"{b}, sinks": (lambda m=m: m(x)) for b, m in sinks.items()},
        },
        "attention forward, eager": {
            "rope": lambda: rope_eager(x),
            "dual_chunk": lambda: dca(x),
        },
        "rotate q and k [1, 8, T, 64]": {
            "rope": lambda: rotary(q, q),
            **{n: (lambda e=e: e.rotate(q, q, grid, grid)) for n, e in encs.items()},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.no_grad():
        for group, cases in _groups(args.length).items():
            times: dict[str, list[float]] = {name: [] for name in cases}
            for fn in cases.values():
                fn()  # warm-up
            for _ in range(args.rounds):
                for name, fn in cases.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            first = statistics.median(next(iter(times.values())))
            print(group)
            for name, values in times.items():
                med = statistics.median(values)
                print(f"  {name:16s} {med * 1e3:9.2f} ms  x{med / first:.2f}")


if __name__ == "__main__":
    main()
