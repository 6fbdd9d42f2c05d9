"""One rank of the context-parallel check (spawned twice by test_context_parallel.py).

Usage: ``python tests/_cp_worker.py RANK WORLD PORT OUT.json``.

Shapes: ``B`` batch, ``H`` heads, ``T`` global length, ``D`` head_dim, ``C`` d_model.
Every rank draws the same global inputs (one seed), keeps the positions of its shard,
computes the encoding's output for them, and gathers the shards with
``torch.distributed.all_gather`` (gloo). Rank 0 puts the gathered rows back in position
order and compares them with the unsplit computation, writing ``{case: max error}`` (0.0
means bit-identical) to ``OUT.json``.

Splits of the ``T`` positions over ``R`` ranks: ``contiguous`` (rank ``r`` holds chunk
``r`` of ``R``) and ``balanced`` (``2R`` chunks; rank ``r`` holds ``r`` and ``2R-1-r``, the
causal load balance of ring attention). Biases: each rank computes the rows of its own
queries against every key (keys gathered from all ranks, as ring attention sees them).
Length-dependent RoPE scalings (dynamic NTK, LongRoPE) are pinned with
``observe_length(T)`` on every rank first: a shard alone would otherwise pick the
frequencies of its own largest position.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import posenc
from _build import SCALINGS, B, D, build_encoding, make_inputs, positions_for

T = 16


def shard(split: str, rank: int, world: int) -> torch.Tensor:
    """Global positions held by ``rank``."""
    if split == "contiguous":
        size = T // world
        return torch.arange(rank * size, (rank + 1) * size)
    size = T // (2 * world)
    first, second = rank, 2 * world - 1 - rank
    return torch.cat((torch.arange(first * size, (first + 1) * size),
                      torch.arange(second * size, (second + 1) * size)))  # fmt: skip


def gather(local: torch.Tensor, positions: torch.Tensor, dim: int) -> torch.Tensor:
    """All shards of ``local`` along ``dim``, reordered by global position."""
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    where = [torch.empty_like(positions) for _ in range(dist.get_world_size())]
    dist.all_gather(where, positions)
    order = torch.argsort(torch.cat(where))
    return torch.cat(parts, dim=dim).index_select(dim, order)


def cases() -> dict[str, object]:
    """Every case: RoPE under each scaling, xPos, each score and input encoding."""
    out: dict[str, object] = {f"rope-{s}": ("rope", s) for s in SCALINGS}
    for name in posenc.available():
        sites = posenc.info(name).sites
        if name != "rope" and sites & (posenc.Site.QK | posenc.Site.SCORE | posenc.Site.INPUT):
            out[name] = (name, None)
    return out


def build(name: str, scaling: str | None) -> posenc.PositionalEncoding:
    if name == "rope":
        enc = posenc.RotaryEmbedding(D, scaling=SCALINGS[scaling])
        enc.observe_length(T)
        return enc
    return build_encoding(name, max_len=T)


def compare(name: str, scaling: str | None, split: str, rank: int, world: int) -> float | None:
    x, q, k, pos = make_inputs(T)
    mine = shard(split, rank, world)
    enc, full = build(name, scaling), build(name, scaling)
    sites = enc.sites
    got, want = [], []
    if sites & posenc.Site.INPUT:
        got.append(gather(enc.embed(x[:, mine], mine), mine, dim=1))
        want.append(full.embed(x, pos))
    if sites & posenc.Site.QK:
        at_mine, at_all = positions_for(enc, mine), positions_for(full, pos)  # M-RoPE, axial
        q_mine, k_mine = enc.rotate(q[..., mine, :], k[..., mine, :], at_mine, at_mine)
        got += [gather(q_mine, mine, dim=2), gather(k_mine, mine, dim=2)]
        want += list(full.rotate(q, k, at_all, at_all))
    if sites & posenc.Site.SCORE:
        keys = gather(k[..., mine, :], mine, dim=2)  # every key, from every rank
        rows = enc.score_bias(q[..., mine, :], keys, mine, pos)  # [B|1, H, T/R, T]
        got.append(gather(rows.expand(B, -1, -1, -1), mine, dim=2))
        want.append(full.score_bias(q, k, pos, pos).expand(B, -1, -1, -1))
    if rank != 0:
        return None
    return max(float((a.double() - b.double()).abs().max()) for a, b in zip(got, want, strict=True))


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        errors = {}
        for case, (name, scaling) in cases().items():
            for split in ("contiguous", "balanced"):
                errors[f"{case}-{split}"] = compare(name, scaling, split, rank, world)
        if rank == 0:
            with open(out, "w", encoding="utf-8") as f:
                json.dump(errors, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
