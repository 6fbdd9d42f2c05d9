"""Bias attention on a CUDA GPU: posenc's backends against SDPA and FlexAttention.

Shapes: ``B = 1`` batch, ``H`` heads, ``T`` length, ``D`` head_dim; causal, forward only.

For every registered SCORE-site encoding and each length, on the current CUDA device:

* ``SDPA causal``: ``scaled_dot_product_attention(is_causal=True)`` without a bias (the
  flash kernel), the floor that a bias can only add to;
* ``posenc chunked`` and ``posenc sdpa`` (the whole ``[1, H, T, T]`` bias as a float mask;
  ``eager`` for encodings with a VALUE term), through ``posenc.attention.backends.attend``;
* ``flex ALiBi``: ``torch.nn.attention.flex_attention`` compiled, with ALiBi's
  ``score_mod`` and a causal block mask: what a compiled offset bias costs on this card.

Times come from CUDA events around ``CALLS`` back-to-back calls, round-robin over the
cases of one (encoding, T), median and maximum of ``--repeats`` rounds. Prints each row
as it is measured and writes them all (ms and ratios to SDPA causal) with ``--json``.
Without a CUDA device it says so and exits 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import torch
import torch.nn.functional as F

from posenc.attention.backends import attend
from posenc.attention.masking import Masking
from posenc.base import Site, info
from posenc.bench.bias_attention import causal_encoding, score_encodings
from posenc.bench.triton_rope import time_cuda

CALLS = 5
FLOOR = "SDPA causal"


def _flex_alibi(heads: int):
    """A compiled FlexAttention with ALiBi's slopes (Press et al. 2022) and a causal mask.

    One compiled function and one ``score_mod`` for every length, so each length compiles
    once (a new function per length hits dynamo's recompile limit and falls back to the
    slow uncompiled path)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device="cuda")
    compiled = torch.compile(flex_attention)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def call(q, k, v):
        length = q.shape[-2]
        if length not in masks:
            masks[length] = create_block_mask(causal, None, None, length, length, device="cuda")
        return compiled(q, k, v, score_mod=alibi, block_mask=masks[length])

    masks: dict[int, object] = {}
    return call


def run(sizes, repeats: int, heads: int, head_dim: int, encodings) -> list[dict]:
    """One row per (encoding, T, case): median/max ms and the ratios to SDPA causal."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    flex = _flex_alibi(heads)
    for length in sizes:
        q, k, v = (
            torch.randn(1, heads, length, head_dim, device="cuda", generator=gen) for _ in range(3)
        )
        pos = torch.arange(length, device="cuda")
        masking = Masking(True, pos, pos, aligned=True)
        for name in encodings:
            position = causal_encoding(name, heads, head_dim, max(sizes)).to("cuda")
            full = "eager" if info(name).sites & Site.VALUE else "sdpa"
            bias = functools.partial(attend, q, k, v, position=position, masking=masking)
            cases = {
                FLOOR: functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True),
                "flex ALiBi": functools.partial(flex, q, k, v),
                "posenc chunked": functools.partial(bias, backend="chunked"),
                f"posenc {full}": functools.partial(bias, backend=full),
            }
            with torch.no_grad():
                stats = time_cuda(cases, repeats, warmup=1, calls=CALLS)
            floor = stats[FLOOR].median_ms
            for case, times in stats.items():
                median, worst = times.median_ms, times.max_ms
                row = {"encoding": name, "T": length, "case": case, "median_ms": median}
                row |= {"max_ms": worst, "median_vs_sdpa": median / floor}
                row["max_vs_sdpa"] = worst / floor
                print(
                    f"{name:>12} T={length:>6} {case:>16}: {median:8.3f} ms "
                    f"{median / floor:6.2f}x (max {worst / floor:.2f}x)",
                    flush=True,
                )
                rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--encodings", nargs="+", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_bias_attention_cuda: no CUDA device (GPU speed not measured)")
        return 2
    names = args.encodings or score_encodings()
    rows = run(args.sizes, args.repeats, args.heads, args.head_dim, names)
    doc = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": f"[1, {args.heads}, T, {args.head_dim}] fp32, causal, forward",
        "floor": FLOOR,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
