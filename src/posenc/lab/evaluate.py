"""Evaluation at one length: perplexity on held-out text, exact-match accuracy on tasks.

Shapes: ``B`` windows, ``T`` length, ``V`` vocabulary. Text is cut into consecutive
non-overlapping windows of ``T`` scored bytes (each byte predicted once, with the window
as its only context, as in Press et al. 2022, section 4); at most ``max_tokens`` bytes
are scored per length, from the start of the held-out text, so every length costs about
the same. Windows (and task examples) are sharded across processes and their sums
reduced, so every process returns the same numbers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.lab.distributed import Context
from posenc.lab.tasks import IGNORE, Task

__all__ = ["accuracy", "perplexity", "window_count"]

#: Tokens per forward pass during evaluation (bounds memory at long lengths).
_BATCH_TOKENS = 8192


def window_count(num_bytes: int, length: int, max_tokens: int) -> int:
    """How many windows of ``length`` scored bytes evaluation uses (0 when none fits)."""
    return min(max(1, max_tokens // length), max(0, (num_bytes - 1) // length))


@torch.inference_mode()
def perplexity(
    model: nn.Module, data: Tensor, length: int, *, max_tokens: int, context: Context
) -> dict[str, float]:
    """Per-byte perplexity of ``model`` on ``data`` in windows of ``length``.

    Returns:
        ``{"loss": nats per byte, "ppl": exp(loss), "tokens": bytes scored}``.

    Raises:
        ValueError: ``data`` is too short for one window of ``length``.
    """
    count = window_count(data.numel(), length, max_tokens)
    if count == 0:
        raise ValueError(
            f"the held-out text has {data.numel()} bytes, too few for one window of {length}"
        )
    mine = torch.arange(count)[context.rank :: context.world]
    per_batch = max(1, _BATCH_TOKENS // length)
    offsets = torch.arange(length + 1)
    nll = torch.zeros((), dtype=torch.float64)
    for chunk in mine.split(per_batch):
        window = data[chunk[:, None] * length + offsets].long().to(context.device)  # [B, T+1]
        logits = model(window[:, :-1])  # [B, T, V]
        targets = window[:, 1:].flatten()
        nll += F.cross_entropy(logits.double().flatten(0, 1), targets, reduction="sum").cpu()
    total = context.sum(nll)
    tokens = count * length
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
