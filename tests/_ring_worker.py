"""One rank of the ring attention check (spawned ``WORLD`` times by test_ring_attention.py).

Usage: ``python tests/_ring_worker.py RANK WORLD PORT OUT.json MODE`` with ``MODE`` one of
``grid`` (every encoding x layout x mask), ``errors`` (bad shards) or ``module``
(``ring_context`` around ``MultiHeadAttention``, and the skipped causal blocks).

Shapes as in ``_ring_cases``. Every rank computes the one-process attention itself
(``posenc.attention.attend``, eager, over the whole sequence, with autograd), then runs
``ring_attention`` on its shard and compares its rows of the output and of the inputs'
gradients, and the parameters' gradients summed over the ranks (``all_reduce``). Rank 0
writes ``{case: error}`` (the largest absolute difference over the reference's scale) to
``OUT.json``.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import posenc
from _build import positions_for
from _ring_cases import (
    BATCHED,
    EXTRA,
    HKV,
    LAYER_ENCODINGS,
    LAYOUTS,
    TIMEOUT,
    B,
    D,
    H,
    build,
    encodings,
    error,
    expect_error,
    global_positions,
    inputs,
    layout,
    leaves,
    length,
    unsplit,
)  # fmt: skip
from posenc.attention import DEFAULT_BLOCK_SIZE
from posenc.parallel.ring import ring_attention
from posenc.parallel.ring_module import ring_context


def compare(
    name: str,
    where: str,
    causal: bool,
    dtype: torch.dtype,
    world: int,
    rank: int,
    *,
    shift: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> float:
    """The largest error of one case; ``shift``: positions ``[B, T]``, row ``b`` shifted by
    ``shift * b``; ``block_size``: queries per block within a pair."""
    t = length(world)
    lay, seg = layout(where, world, rank)
    mine = lay.indices
    full_pos = global_positions(where, world)
    if shift:
        full_pos = full_pos + shift * torch.arange(B)[:, None]  # [B, T]
    pos = full_pos[..., mine]
    q, k, v, grad, sinks = inputs(t, torch.float64)
    use_sinks = not causal
    ref_enc, enc = build(name, causal, torch.float64), build(name, causal, dtype)
    rot_full = positions_for(ref_enc, full_pos)
    leaf = leaves(q, k, v, sinks)
    out = unsplit(ref_enc, *leaf[:3], leaf[3] if use_sinks else None, full_pos, rot_full,
                  seg, causal)  # fmt: skip
    out.backward(grad)
    want = [out[:, :, mine], *(x.grad[:, :, mine] for x in leaf[:3])]
    want_params = [leaf[3].grad if use_sinks else None] + [p.grad for p in ref_enc.parameters()]

    local = leaves(*(x[:, :, mine].to(dtype) for x in (q, k, v)), sinks.to(dtype))
    seg_mine = None if seg is None else seg[:, mine]
    got_out = ring_attention(
        *local[:3], positions=pos, position=enc, rotary_positions=positions_for(enc, pos),
        segment_ids=seg_mine, causal=causal, sinks=local[3] if use_sinks else None,
        block_size=block_size, timeout=TIMEOUT,
    )  # fmt: skip
    got_out.backward(grad[:, :, mine].to(dtype))
    got = [got_out, *(x.grad for x in local[:3])]
    got_params = [local[3].grad if use_sinks else None] + [p.grad for p in enc.parameters()]
    for g in got_params:
        if g is not None:
            dist.all_reduce(g)  # each rank's share of the parameters' gradients
    errs = [error(a, b) for a, b in zip(got + got_params, want + want_params, strict=True)]
    worst = torch.tensor(max(errs), dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def grid(world: int, rank: int) -> dict[str, float]:
    out = {}
    for name in [*encodings(), *EXTRA]:
        for where in LAYOUTS:
            for causal in (True, False):
                case = f"{name}-{where}-{'causal' if causal else 'bidirectional'}"
                out[case] = compare(name, where, causal, torch.float64, world, rank, block_size=3)
    for name in ("alibi", "t5", "shaw", "fire"):
        out[f"{name}-float32"] = compare(name, "head_tail", True, torch.float32, world, rank)
    for name in BATCHED:
        for causal in (True, False):
            mask = "causal" if causal else "bidirectional"
            case = f"{name}-batched-{mask}"
            out[case] = compare(name, "head_tail", causal, torch.float64, world, rank, shift=3)
            out[f"{name}-shuffled-{mask}"] = compare(
                name, "shuffled", causal, torch.float64, world, rank, block_size=3
            )
    return out


def errors(world: int, rank: int) -> dict[str, list[str]]:
    """Bad shards on one rank (rank 1) or all: every rank's message, per case."""
    s = length(world) // world
    q, k, v, _, _ = inputs(s + 1, torch.float64)
    pos = torch.arange(rank * s, rank * s + s)
    odd = rank == 1

    def run(q=q[:, :, :s], k=k[:, :, :s], v=v[:, :, :s], positions=pos, **kw):
        return ring_attention(q, k, v, positions=positions, timeout=TIMEOUT, **kw)

    cases = {
        "shorter shard": lambda: run(*(x[:, :, : s - 1 if odd else s] for x in (q, k, v)),
                                     positions=pos[: s - 1 if odd else s]),
        "positions longer than the shard": lambda: run(
            positions=torch.arange(rank * s, rank * s + s + odd)
        ),
        "keys shorter than the queries": lambda: run(k=k[:, :, : s - odd], v=v[:, :, : s - odd]),
        "local arange": lambda: run(positions=torch.arange(s)),
        "a position twice on one rank": lambda: run(
            positions=torch.cat((pos[:1], pos[:-1])) if odd else pos
        ),
        "heads": lambda: run(q=q[:, : H // 2 if odd else H, :s]),
        "dtype": lambda: run(*(x[:, :, :s].to(torch.float32 if odd else torch.float64)
                               for x in (q, k, v))),
        "segment ids": lambda: run(segment_ids=torch.zeros(B, s + odd, dtype=torch.int64)),
    }  # fmt: skip
    solo = dist.new_group([0])  # every rank takes part in creating it; rank 1 is not in it
    cases["not in the group"] = lambda: run(group=solo)
    out = {}
    for case, call in cases.items():
        messages = [None] * world
        dist.all_gather_object(messages, expect_error(call))
        out[case] = messages
    # last: rank 1 never calls, so the others time out (and the group is not used again)
    short = timedelta(seconds=3)
    call = lambda: ring_attention(q, k, v, positions=pos, timeout=short)  # noqa: E731
    message = expect_error(call) if rank != 1 else time.sleep(2 * short.total_seconds())
    out["a rank that never calls"] = [message]
    return out


class CountingALiBi(posenc.ALiBi):
    """ALiBi that counts its ``score_bias`` calls: one per computed (queries, keys) pair."""

    calls = 0

    def score_bias(self, q, k, q_pos, k_pos):
        CountingALiBi.calls += 1
        return super().score_bias(q, k, q_pos, k_pos)


def layer_case(name: str, where: str, world: int, rank: int) -> float:
    """``MultiHeadAttention`` (grouped heads, sinks) run under ``ring_context`` on the shard
    against the same layer on the whole sequence: output rows, input and parameter grads."""
    t = length(world)
    lay, seg = layout(where, world, rank)
    torch.manual_seed(0)
    layer = posenc.MultiHeadAttention(H * D, H, position=name, num_kv_heads=HKV, sinks=True)
    layer = layer.double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    g = torch.Generator().manual_seed(2)
    x, grad = (torch.randn(B, t, H * D, generator=g, dtype=torch.float64) for _ in range(2))
    full_pos = global_positions(where, world)
    (x_full,) = leaves(x)
    rotary = positions_for(layer.position, full_pos)  # structured for M-RoPE
    out = layer(x_full, rotary, segment_ids=seg)
    out.backward(grad)
    mine = lay.indices
    want = [out[:, mine], x_full.grad[:, mine], *(p.grad.clone() for p in layer.parameters())]
    layer.zero_grad()
    (x_mine,) = leaves(x[:, mine])
    structured = layer.position.position_shape != "[T]"
    tokens = mine if structured else None  # M-RoPE layers order their tokens by index
    with ring_context(layer, timeout=TIMEOUT, token_positions=tokens):
        got_out = layer(
            x_mine, rotary[..., mine], segment_ids=None if seg is None else seg[:, mine]
        )
    got_out.backward(grad[:, mine])
    got = [got_out, x_mine.grad, *(p.grad for p in layer.parameters())]
    for p in got[2:]:
        dist.all_reduce(p)
    worst = torch.tensor(max(error(a, b) for a, b in zip(got, want, strict=True)))
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    restored = "_core" not in layer.__dict__
    return float(worst) if restored else float("inf")


def module(world: int, rank: int) -> dict[str, object]:
    """``ring_context`` around ``MultiHeadAttention``, and the causal pairs computed."""
    out: dict[str, object] = {}
    for name in LAYER_ENCODINGS:
        for where in LAYOUTS:
            out[f"{name}-{where}"] = layer_case(name, where, world, rank)
    s = length(world) // world
    layer = posenc.MultiHeadAttention(H * D, H, position="alibi").double()
    x = torch.randn(B, s, H * D, dtype=torch.float64)
    with ring_context(layer, timeout=TIMEOUT):
        message = expect_error(lambda: layer(x))  # no positions: arange of the shard
    out["no positions"] = message
    for where in ("contiguous", "head_tail"):
        lay, _ = layout(where, world, rank)
        q, k, v, grad, _ = inputs(length(world), torch.float64)
        local = leaves(*(x[:, :, lay.indices] for x in (q, k, v)))
        CountingALiBi.calls = 0
        got = ring_attention(*local, positions=lay.positions, position=CountingALiBi(H),
                             timeout=TIMEOUT)  # fmt: skip
        forward = CountingALiBi.calls
        got.backward(grad[:, :, lay.indices])
        counts = [None] * world
        dist.all_gather_object(counts, [forward, CountingALiBi.calls - forward])
        out[f"pairs-{where}"] = counts
    return out


def main() -> None:
    rank, world, port, path, mode = sys.argv[1:6]
    rank, world = int(rank), int(world)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=TIMEOUT)  # fmt: skip
    try:
        result = {"grid": grid, "errors": errors, "module": module}[mode](world, rank)
        if rank == 0:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
