"""Bias attention layers against the bias-free layer at T = 2048, 4096, 8192, in one process.

Shapes: ``B = 1`` batch, ``T`` length, ``C = 256`` d_model, ``H = 4`` heads; causal, fp32,
no gradients. Each case is ``posenc.bench.bias``'s layer (``MultiHeadAttention`` with the
encoding and its default backend, bias computation included) timed round-robin with the
same layer without a position (one SDPA causal call); the ratios are medians (and maxima)
of that one run. At 8192 only the offset-only biases (ALiBi, T5, KERPLE, Sandwich) run.
Usage: ``python benchmarks/bench_bias_layers.py OUT.json``.
"""

from __future__ import annotations

import json
import sys

import torch

from posenc.attention.backends import peak_tensor_bytes
from posenc.bench import bias
from posenc.bench.timing import load_average, machine_info, measure

PLAN = {2048: None, 4096: None, 8192: ["alibi", "t5", "kerple", "sandwich"]}


def run(repeats: int = 3) -> dict:
    """Time every bias encoding's layer at each length of ``PLAN`` against the plain layer."""
    torch.set_num_threads(2)
    rows, before = [], load_average()
    for length, names in PLAN.items():
        names = names or bias.bias_encodings()
        x = bias._input(length)
        cases = {bias.BASELINE: bias._forward(bias._layer(None), x)}
        cases.update({n: bias._forward(bias._layer(n), x) for n in names})
        stats = measure(cases, repeats=repeats, warmup=1)
        base = stats[bias.BASELINE]
        for n in names:
            s = stats[n]
            wanted = length == 8192 or n in ("fire", "cope")
            peak = peak_tensor_bytes(cases[n])[0] / 2**20 if wanted else None
            rows.append(
                {
                    "encoding": n,
                    "T": length,
                    "median_ms": s.median_ms,
                    "max_ms": s.max_ms,
                    "sdpa_median_ms": base.median_ms,
                    "sdpa_max_ms": base.max_ms,
                    "x_median": s.median_ms / base.median_ms,
                    "x_max": s.max_ms / base.max_ms,
                    "peak_mib": peak,
                    "load_now": load_average(),
                }
            )
            print(rows[-1], flush=True)
    settings = {"d_model": bias.D_MODEL, "heads": bias.HEADS, "batch": 1, "dtype": "float32"}
    settings |= {"threads": 2, "repeats": repeats, "warmup": 1, "grad": False, "causal": True}
    return {
        "machine": machine_info(),
        "load_average_before": before,
        "load_average_after": load_average(),
        "settings": settings,
        "rows": rows,
    }


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        json.dump(run(), f, indent=1)
