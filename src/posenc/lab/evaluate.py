"""Evaluation at one length: perplexity on held-out text, accuracy on tasks (exact match,
per token, and per key depth for passkey).

Shapes: ``B`` windows, ``T`` length, ``V`` vocabulary. Each byte is predicted once, with
its window as its only context (non-overlapping windows, as in Press et al. 2022,
section 4). At most ``max_tokens`` bytes are scored per length: *segments* of the
longest evaluation length are each cut into windows of ``T``, so every length scores the
same bytes (when ``T`` divides the longest length) and costs about the same. Segments
lie inside one held-out file each (``bounds``), spread over the files by water-filling
(``posenc.lab.heldout.allocate_segments``: no file supplies more than one segment beyond
another that has room) and evenly inside each file. Each segment's mean loss is returned
too (``"segments"``), the unit of the paired tests and bootstrap intervals of
``posenc.lab.significance``; each task example's outcome likewise (``"solved"``).
Windows (and task examples) are sharded across processes and their sums reduced, so
every process returns the same numbers.

With ``stride`` (sliding windows, Press et al. 2022, section 4.1) each window of ``T``
scores only its last ``stride`` bytes, the rest being context, so every scored byte but
the first few sees ``T - stride`` or more bytes before it. ``by_position`` also returns
the loss by position inside the window (Kazemnejad et al. 2023 plot the same), in bins.

With ``dtype=torch.bfloat16`` the model runs under the lab's bfloat16 autocast
(``posenc.lab.precision``): the logits are float32 and the losses are summed in float64
as always; tests bound the change of the mean loss by the bfloat16 epsilon, and the
default sweeps' cells against float32 are in ``docs/choosing.md`` ("Arithmetic").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.lab.distributed import Context
from posenc.lab.heldout import allocate_segments
from posenc.lab.precision import autocast
from posenc.lab.tasks import DEPTHS, IGNORE, Task

__all__ = [
    "POSITION_BINS",
    "accuracy",
    "perplexity",
    "segment_count",
    "segment_starts",
    "window_starts",
]

Bounds = Sequence[tuple[int, int]]

#: Tokens per forward pass during evaluation (bounds memory at long lengths).
_BATCH_TOKENS = 16384
#: Bins of the loss-by-position curve.
POSITION_BINS = 64


def segment_count(num_bytes: int, longest: int, max_tokens: int) -> int:
    """How many segments of ``longest`` scored bytes evaluation uses in one file of
    ``num_bytes`` (0 when none fits)."""
    return min(max(1, max_tokens // longest), max(0, (num_bytes - 1) // longest))


def segment_starts(bounds: Bounds, longest: int, max_tokens: int, *, pad: int = 0) -> Tensor:
    """Start offsets ``[S]`` of the segments: up to ``max_tokens // longest`` (at least
    one), spread over the files ``bounds`` (``(start, end)`` each) by water-filling and
    evenly inside each file after ``pad`` bytes of context (empty when none fits)."""
    room = [max(0, (end - start - pad - 1) // longest) for start, end in bounds]
    given = allocate_segments(room, max(1, max_tokens // longest))
    starts = []
    for (start, end), count in zip(bounds, given, strict=True):
        if count:
            spacing = (end - start - pad - 1) // count  # >= longest: segments never overlap
            starts += [start + pad + j * spacing for j in range(count)]
    return torch.tensor(starts, dtype=torch.long)


def window_starts(
    num_bytes: int,
    length: int,
    *,
    longest: int,
    max_tokens: int,
    stride: int | None = None,
    bounds: Bounds | None = None,
) -> Tensor:
    """Start offsets ``[N]`` of the evaluation windows of ``length`` (each reads
    ``length + 1`` bytes: inputs and next-byte targets; it scores its last ``stride``
    bytes, all of them when ``stride`` is ``None``), segment by segment.

    With a stride the first ``longest`` bytes of each file are kept as context only, so
    the scored bytes are the same with and without sliding. ``bounds``: the files'
    ``(start, end)`` (``None``: one file of ``num_bytes``).

    Raises:
        ValueError: too few bytes for one segment, ``length > longest``, or a ``stride``
            that does not divide ``length``.
    """
    if length > longest:
        raise ValueError(f"length {length} exceeds the longest evaluation length {longest}")
    scored = stride or length
    if length % scored or longest % scored:
        raise ValueError(f"stride {scored} must divide lengths {length} and {longest}")
    pad = 0 if stride is None else longest
    segments = segment_starts(bounds or ((0, num_bytes),), longest, max_tokens, pad=pad)  # [S]
    if segments.numel() == 0:
        raise ValueError(
            f"the held-out text has {num_bytes} bytes, too few for one window of {longest}"
        )
    inner = (torch.arange(longest // scored) + 1) * scored - length  # [W]
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
    stride: int | None = None,
    by_position: bool = False,
    dtype: torch.dtype = torch.float32,
    bounds: Bounds | None = None,
) -> dict[str, object]:
    """Per-byte perplexity of ``model`` on ``data`` in windows of ``length``.

    Args:
        stride: score only the last ``stride`` bytes of each window (sliding windows).
        bounds: the held-out files' ``(start, end)`` in ``data`` (``None``: one file).
        by_position: also return ``"position_loss"``, the mean loss of the window's
            positions in ``POSITION_BINS`` equal bins (fewer when ``length`` is smaller),
            from the scored positions.
        dtype: the matrix products' dtype (``posenc.lab.precision``).

    Returns:
        ``{"loss": nats per byte, "ppl": exp(loss), "tokens": bytes scored, "segments":
        mean loss per segment}``, with ``"position_loss"`` (a list) when asked.

    Raises:
        ValueError: see ``window_starts``.
    """
    starts = window_starts(
        data.numel(), length, longest=longest, max_tokens=max_tokens, stride=stride, bounds=bounds
    )
    scored = stride or length
    per_segment = longest // scored  # windows per segment
    owner = torch.arange(starts.numel()) // per_segment  # [N] the segment of each window
    mine = starts[context.rank :: context.world]
    per_batch = max(1, _BATCH_TOKENS // length)
    offsets = torch.arange(length + 1)
    nll = torch.zeros(scored, dtype=torch.float64)  # summed over windows, per position
    by_segment = torch.zeros(starts.numel() // per_segment, dtype=torch.float64)
    for chunk, seg in zip(
        mine.split(per_batch), owner[context.rank :: context.world].split(per_batch), strict=True
    ):
        window = data[chunk[:, None] + offsets].long().to(context.device)  # [B, T+1]
        with autocast(dtype, context.device):
            logits = model(window[:, :-1])[:, length - scored :]  # [B, S, V]
        targets = window[:, 1 + length - scored :]  # [B, S]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
        loss = loss.view(targets.shape).double().cpu()  # float32 per byte, summed in float64
        nll += loss.sum(0)
        by_segment.index_add_(0, seg, loss.sum(1))
    per_position = context.sum(nll) / starts.numel()  # [S]
    segments = context.sum(by_segment) / (per_segment * scored)  # [segments]
    tokens = starts.numel() * scored
    loss = float(per_position.mean())
    out: dict[str, object] = {
        "loss": loss,
        "ppl": math.exp(loss),
        "tokens": tokens,
        "segments": [round(v, 6) for v in segments.tolist()],
    }
    if by_position:
        bins = math.gcd(POSITION_BINS, scored)
        out["position_loss"] = per_position.view(bins, -1).mean(1).tolist()
    return out


@torch.inference_mode()
def accuracy(
    model: nn.Module,
    task: Task,
    length: int,
    *,
    examples: int,
    seed: int,
    context: Context,
    dtype: torch.dtype = torch.float32,
) -> dict[str, object]:
    """Exact-match and per-token accuracy on ``examples`` task examples of ``length``.

    The examples depend only on ``seed`` and ``length`` (the same for every model);
    ``dtype`` as in ``perplexity``.

    Returns:
        ``{"accuracy": solved fraction, "token_accuracy": ..., "examples": count, "solved":
        1 or 0 per example}``; for ``passkey`` also ``"depths"``: ``{depth: solved
        fraction}`` per key depth.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + length)
    inputs, targets = task.batch(examples, length, gen, exact=True)
    index = torch.arange(examples)
    group = index % len(DEPTHS)  # the key's depth (passkey)
    inputs, targets, group, index = (context.shard(t) for t in (inputs, targets, group, index))
    per_batch = max(1, _BATCH_TOKENS // length)
    sums = torch.zeros(3 + len(DEPTHS), dtype=torch.float64)  # solved, right, scored, per depth
    each = torch.zeros(examples, dtype=torch.float64)  # 1 where the example is solved
    parts = (inputs, targets, group, index)
    for x, y, g, i in zip(*(t.split(per_batch) for t in parts), strict=True):
        x, y = x.to(context.device), y.to(context.device)
        scored = y != IGNORE
        with autocast(dtype, context.device):
            logits = model(x)  # [B, T, V] float32
        right = (logits.argmax(-1) == y) & scored  # [B, T]
        solved = (right.sum(-1) == scored.sum(-1)).cpu()  # [B]
        each.index_add_(0, i, solved.double())
        by_depth = torch.zeros(len(DEPTHS), dtype=torch.float64).index_add_(0, g, solved.double())
        head = torch.stack((solved.sum(), right.sum().cpu(), scored.sum().cpu())).double()
        sums += torch.cat((head, by_depth))
    totals = context.sum(sums).tolist()
    solved, right, scored = totals[:3]
    out: dict[str, object] = {
        "accuracy": solved / examples,
        "token_accuracy": right / scored,
        "examples": examples,
        "solved": [int(v) for v in context.sum(each).tolist()],
    }
    if task.name == "passkey":
        counts = torch.bincount(torch.arange(examples) % len(DEPTHS), minlength=len(DEPTHS))
        out["depths"] = {
            str(d): totals[3 + i] / max(1, int(counts[i])) for i, d in enumerate(DEPTHS)
        }
    return out
