"""Speed and memory of attention with a positional bias (SCORE-site encodings).

Shapes: ``B = 1`` batch, ``H`` heads, ``T`` length, ``D`` head_dim; causal, float32.

For every registered SCORE-site encoding (ALiBi, T5, KERPLE, FIRE, ...) and each length,
three ways to compute the same causal attention are timed (median over repeats, bias
computation included, no gradients):

* ``blocked``: posenc's query-block path (bias per block, SDPA per block, key blocks
  that no query can see skipped);
* ``materialized``: the whole ``[1, H, T, T]`` bias built, then one SDPA call with it
  as a float mask (the eager formula for encodings with a VALUE term);
* ``SDPA causal``: ``scaled_dot_product_attention(is_causal=True)`` without any bias,
  the floor a bias can only add to.

Peak memory is what the tensors allocated by aten ops add up to at their highest
(``posenc.attention.backends.peak_tensor_bytes``), next to the size of one ``[H, T, T]``
float32 tensor. ``posenc bench --only bias`` runs it; so does
``benchmarks/bench_bias_attention.py`` (``main``), with more options.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from posenc.attention.backends import DEFAULT_BLOCK_SIZE, Masking, attend, peak_tensor_bytes
from posenc.base import PositionalEncoding, Site, available, build, info

__all__ = ["COLUMNS", "causal_encoding", "main", "run", "score_encodings"]

MIB = 2**20
FULL_SIZES = (512, 1024, 2048, 4096, 8192)

#: (key, header, format) of the printed table; every key is in the JSON rows.
COLUMNS = (
    ("encoding", "encoding", "{}"),
    ("T", "T", "{:,}"),
    ("sdpa_causal_ms", "SDPA ms", "{:,.1f}"),
    ("chunked_vs_sdpa", "blocked", "{:.2f}×"),
    ("materialized_vs_sdpa", "[H,T,T]", "{:.2f}×"),
    ("chunked_peak_mib", "blocked MiB", "{:,.0f}"),
    ("materialized_peak_mib", "[H,T,T] MiB", "{:,.0f}"),
)


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: caches (bias tables, kernels) are not what is measured
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def score_encodings() -> list[str]:
    """Registered encodings with a SCORE site."""
    return [n for n in available() if info(n).sites & Site.SCORE]


def causal_encoding(name: str, num_heads: int, head_dim: int, max_len: int) -> PositionalEncoding:
    """Encoding ``name`` built for causal attention with ``num_heads`` heads of
    ``head_dim`` up to ``max_len`` tokens, in eval mode."""
    return build(
        name,
        d_model=num_heads * head_dim,
        num_heads=num_heads,
        head_dim=head_dim,
        max_len=max_len,
        causal=True,
    ).eval()


def run(
    sizes: Sequence[int] = FULL_SIZES,
    repeats: int = 5,
    *,
    encodings: Sequence[str] | None = None,
    num_heads: int = 8,
    head_dim: int = 64,
    block_size: int = DEFAULT_BLOCK_SIZE,
    materialize_up_to: int = 8192,
    seed: int = 0,
) -> list[dict]:
    """Time and measure blocked vs materialized bias attention vs plain causal SDPA.

    Args:
        sizes: sequence lengths ``T``.
        repeats: timed runs per measurement (the median is reported).
        encodings: registered names; None: every SCORE-site encoding.
        num_heads: ``H``.
        head_dim: ``D``.
        block_size: queries per block of the blocked path.
        materialize_up_to: longest ``T`` for which the ``[H, T, T]`` path is run.
        seed: seed of the random queries, keys and values.

    Returns:
        One dict per (encoding, T): times in ms, ratios to plain causal SDPA, and peak
        memory in MiB (``None`` where the materialized path was not run).
    """
    names = score_encodings() if encodings is None else list(encodings)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for name in names:
        position = causal_encoding(name, num_heads, head_dim, max(sizes))
        for length in sizes:
            qkv = [torch.randn(1, num_heads, length, head_dim, generator=gen) for _ in range(3)]
            with torch.no_grad():
                row = _measure(position, qkv, repeats, block_size, length <= materialize_up_to)
            rows.append({"encoding": name, "T": length, "H": num_heads, "D": head_dim} | row)
    return rows


def _measure(position, qkv: list, repeats: int, block_size: int, run_full: bool) -> dict:
    """Times and peaks of one (encoding, length) cell."""
    heads, length = qkv[0].shape[1], qkv[0].shape[2]
    pos = torch.arange(length)
    common = {"position": position, "masking": Masking(True, pos, pos, aligned=True)}
    full = "eager" if position.sites & Site.VALUE else "sdpa"
    chunked = functools.partial(attend, *qkv, backend="chunked", block_size=block_size, **common)
    materialized = functools.partial(attend, *qkv, backend=full, **common)
    plain = functools.partial(F.scaled_dot_product_attention, *qkv, is_causal=True)
    row = {"sdpa_causal_ms": _median_ms(plain, repeats), "chunked_ms": _median_ms(chunked, repeats)}
    row["chunked_peak_mib"] = peak_tensor_bytes(chunked)[0] / MIB
    row["materialized_ms"] = _median_ms(materialized, repeats) if run_full else None
    row["materialized_peak_mib"] = peak_tensor_bytes(materialized)[0] / MIB if run_full else None
    row["score_matrix_mib"] = heads * length * length * 4 / MIB
    row["chunked_vs_sdpa"] = row["chunked_ms"] / row["sdpa_causal_ms"]
    row["materialized_vs_sdpa"] = (
        row["materialized_ms"] / row["sdpa_causal_ms"] if run_full else None
    )
    return row


def main(argv: Sequence[str] | None = None) -> int:
    """Command line of ``benchmarks/bench_bias_attention.py``: run, print, write JSON."""
    from rich.console import Console

    from posenc.bench.report import rows_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(FULL_SIZES), metavar="T")
    parser.add_argument("--repeats", type=int, default=5, metavar="N", help="timed runs")
    parser.add_argument("--encodings", nargs="+", default=None, metavar="NAME")
    parser.add_argument("--heads", type=int, default=8, metavar="H")
    parser.add_argument("--head-dim", type=int, default=64, metavar="D")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, metavar="N")
    parser.add_argument("--materialize-up-to", type=int, default=8192, metavar="T")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="torch threads")
    parser.add_argument("--json", default="bench_bias_attention.json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(
        args.sizes,
        args.repeats,
        encodings=args.encodings,
        num_heads=args.heads,
        head_dim=args.head_dim,
        block_size=args.block_size,
        materialize_up_to=args.materialize_up_to,
    )
    threads = torch.get_num_threads()
    title = f"bias attention, H={args.heads}, D={args.head_dim}, fp32, {threads} threads"
    Console().print(rows_table(title, rows, COLUMNS))
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"threads": threads, "torch": torch.__version__, "rows": rows}, f, indent=2)
    print(f"wrote {args.json}")
    return 0
