"""One decode step at a large position costs what one at a small position costs.

For each encoding and each position ``p`` in 2^10, 2^16, 2^20, 2^24, a fresh process
builds the layer, warms it up with one step at position 0, then times one decode step at
position ``p`` (median and max over repeats) and reports the growth of the peak resident
memory during those steps. Cost must follow the number of positions asked for, not their
value; before the caches were bounded, one step at 2^20 built a 2^20-row table (2.3 GB,
26 s) and 2^24 failed.

    python benchmarks/bench_huge_positions.py [--repeats 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

POSITIONS = [2**10, 2**16, 2**20, 2**24]
KINDS = ["rope", "attention-rope", "sinusoidal", "learned-interpolate"]

_CHILD = r"""
import json, resource, sys, time, torch, posenc
kind, p, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
torch.manual_seed(0)
if kind == "rope":
    enc = posenc.RotaryEmbedding(128)
    q = torch.randn(1, 32, 1, 128)
    step = lambda pos: enc.rotate(q, q, pos, pos)
elif kind == "attention-rope":
    layer = posenc.MultiHeadAttention(1024, 8, position="rope").eval()
    x = torch.randn(1, 1, 1024)
    step = lambda pos: layer(x, pos)
elif kind == "sinusoidal":
    enc = posenc.SinusoidalPositionalEncoding(1024)
    x = torch.randn(1, 1, 1024)
    step = lambda pos: enc(x, pos)
else:
    enc = posenc.LearnedPositionalEncoding(1024, 2048, beyond="interpolate")
    x = torch.randn(1, 1, 1024)
    step = lambda pos: enc(x, pos)
with torch.no_grad():
    step(torch.tensor([0]))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(torch.tensor([p]))
        times.append(time.perf_counter() - start)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"times_s": times, "peak_rss_growth_kib": grown}))
"""


def measure(kind: str, position: int, repeats: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(position), str(repeats)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, metavar="N", help="steps per case")
    parser.add_argument("--json", metavar="PATH", help="also write every timing here")
    args = parser.parse_args()
    print(f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}, 1 torch thread")
    print(
        f"{'encoding':<20} {'position':>9} {'median ms':>10} {'max ms':>8} {'x 2^10':>7} "
        f"{'peak +MiB':>9}"
    )
    results = []
    for kind in KINDS:
        base = None
        for position in POSITIONS:
            r = measure(kind, position, args.repeats)
            median = statistics.median(r["times_s"]) * 1e3
            base = base or median
            results.append({"kind": kind, "position": position, **r})
            print(
                f"{kind:<20} {position:>9} "
                f"{median:>10.3f} {max(r['times_s']) * 1e3:>8.3f} {median / base:>7.2f} "
                f"{r['peak_rss_growth_kib'] / 1024:>9.1f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_average": os.getloadavg(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
