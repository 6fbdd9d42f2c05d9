"""Additive encodings speed: sinusoidal and learned ``x + PE`` against the copy floor,
and the sinusoidal table's construction (cold) against its cache. Same options as
``posenc bench``:

    python benchmarks/bench_additive.py --threads 2 --json additive.json
"""

from __future__ import annotations

import sys

from posenc.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", "--only", "additive", *sys.argv[1:]]))
