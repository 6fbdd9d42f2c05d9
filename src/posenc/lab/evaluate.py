"""Evaluation at one length: perplexity on held-out text, exact-match accuracy on tasks.

Shapes: ``B`` windows, ``T`` length, ``V`` vocabulary. Each byte is predicted once, with
its window as its only context (non-overlapping windows, as in Press et al. 2022,
section 4). At most ``max_tokens`` bytes are scored per length: *segments* of the
longest evaluation length, spread evenly over the held-out text, are each cut into
windows of ``T``, so every length scores the same bytes (when ``T`` divides the
longest length) and costs about the same. Windows (and task examples) are sharded
across processes and their sums reduced, so every process returns the same numbers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.lab.distributed import Context
from posenc.lab.tasks import IGNORE, Task

__all__ = ["accuracy", "perplexity", "segment_count", "window_starts"]

#: Tokens per forward pass during evaluation (bounds memory at long lengths).
_BATCH_TOKENS = 8192


def segment_count(num_bytes: int, longest: int, max_tokens: int) -> int:
    """How many segments of ``longest`` scored bytes evaluation uses (0 when none fits)."""
    return min(max(1, max_tokens // longest), max(0, (num_bytes - 1) // longest))


def window_starts(num_bytes: int, length: int, *, longest: int, max_tokens: int) -> Tensor:
    """Start offsets ``[N]`` of the evaluation windows of ``length`` (each reads
    ``length + 1`` bytes: inputs and next-byte targets).

    Raises:
        ValueError: fewer than ``longest + 1`` bytes, or ``length > longest``.
    """
    if length > longest:
        raise ValueError(f"length {length} exceeds the longest evaluation length {longest}")
    count = segment_count(num_bytes, longest, max_tokens)
    if count == 0:
        raise ValueError(
            f"the held-out text has {num_bytes} bytes, too few for one window of {longest}"
        )
    stride = (num_bytes - 1) // count  # >= longest: segments never overlap
    segments = torch.arange(count) * stride  # [S]
    inner = torch.arange(longest // length) * length  # [W]
    return (segments[:, None] + inner).flatten()  # [S * W]


@torch.inference_mode()
def perplexity(
    model: nn.Module,
    data: Tensor,
    length: int,
    *,
    longest: int,
    max_tokens: int,
    context: Context,
) -> dict[str, float]:
    """Per-byte perplexity of ``model`` on ``data`` in windows of ``length``.

    Returns:
        ``{"loss": nats per byte, "ppl": exp(loss), "tokens": bytes scored}``.

    Raises:
        ValueError: see ``window_starts``.
    """
    starts = window_starts(data.numel(), length, longest=longest, max_tokens=max_tokens)
    mine = starts[context.rank :: context.world]
    per_batch = max(1, _BATCH_TOKENS // length)
    offsets = torch.arange(length + 1)
    nll = torch.zeros((), dtype=torch.float64)
    for chunk in mine.split(per_batch):
        window = data[chunk[:, None] + offsets].long().to(context.device)  # [B, T+1]
        logits = model(window[:, :-1])  # [B, T, V]
        targets = window[:, 1:].flatten()
        nll += F.cross_entropy(logits.double().flatten(0, 1), targets, reduction="sum").cpu()
    total = context.sum(nll)
    tokens = starts.numel() * length
    loss = float(total) / tokens
    return {"loss": loss, "ppl": math.exp(loss), "tokens": tokens}


@torch.inference_mode()
def accuracy(
    model: nn.Module, task: Task, length: int, *, examples: int, seed: int, context: Context
) -> dict[str, float]:
    """Exact-match and per-token accuracy on ``examples`` task examples of ``length``.

    The examples depend only on ``seed`` and ``length`` (the same for every model).

    Returns:
        ``{"accuracy": solved fraction, "token_accuracy": ..., "examples": count}``.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + length)
    inputs, targets = task.batch(examples, length, gen, exact=True)
    inputs, targets = context.shard(inputs), context.shard(targets)
    per_batch = max(1, _BATCH_TOKENS // length)
    sums = torch.zeros(3, dtype=torch.float64)  # solved, right tokens, scored tokens
    for x, y in zip(inputs.split(per_batch), targets.split(per_batch), strict=True):
        x, y = x.to(context.device), y.to(context.device)
        scored = y != IGNORE
        right = (model(x).argmax(-1) == y) & scored  # [B, T]
        solved = (right.sum(-1) == scored.sum(-1)).sum()
        sums += torch.stack((solved, right.sum(), scored.sum())).double().cpu()
    solved, right, scored = context.sum(sums).tolist()
    return {"accuracy": solved / examples, "token_accuracy": right / scored, "examples": examples}
