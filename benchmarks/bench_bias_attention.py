"""Speed and memory of attention with a positional bias: posenc's blocked path and the
materialized ``[H, T, T]`` bias against causal SDPA without a bias. A thin wrapper over
``posenc.bench.bias_attention`` (see its docstring); ``posenc bench --only bias`` runs
the same measurements.

    python benchmarks/bench_bias_attention.py --sizes 2048 4096 --threads 2
"""

from __future__ import annotations

from posenc.bench.bias_attention import main

if __name__ == "__main__":
    raise SystemExit(main())
