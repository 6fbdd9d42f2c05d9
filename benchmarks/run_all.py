"""Run every benchmark (RoPE, additive encodings, bias attention) on this machine.

The same as ``posenc bench`` (bias attention included). Options: ``--quick``,
``--only SUITES`` (of rope, additive, bias), ``--threads N``, ``--repeats N``,
``--load N`` (busy processes beside the benchmark), ``--json PATH``.

    python benchmarks/run_all.py --threads 2 --json bench.json
"""

from __future__ import annotations

import sys

from posenc.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
