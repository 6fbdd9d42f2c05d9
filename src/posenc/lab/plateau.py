"""Validation loss during training, and the plateau rule that ends training on it.

Shapes: ``N`` validation sequences, ``T`` the training length, ``V`` vocabulary.

The validation set is never the evaluation text (the held-out files) nor the stopping
check of a task: for text, ``split_validation`` takes ``tokens`` bytes out of the
*training* text before training, in blocks of ``VAL_BLOCK`` bytes spread evenly over it
(so every part of the training files is represented), and the models never train on
them; the loss is scored on non-overlapping windows of ``T + 1`` bytes inside each
block. A task draws ``tokens // T`` examples of its own stream (``VAL_STREAM + seed``).

The plateau rule (``plateaued``) is the early-stopping meta-algorithm with patience of
Goodfellow, Bengio & Courville 2016 ("Deep Learning", section 7.8, algorithm 7.1; also
Prechelt 1998, "Early Stopping - But When?"): training has plateaued when the best
validation loss of the last ``window`` points is not below ``(1 - eps)`` times the best
loss before them, i.e. ``window`` validations in a row brought no relative improvement
above ``eps``. The values of ``window`` and ``eps`` are the lab's choice
(``posenc.lab.config.thorough_defaults``), not taken from a paper.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.lab.precision import autocast
from posenc.lab.tasks import IGNORE

__all__ = ["VAL_BLOCK", "VAL_STREAM", "plateaued", "split_validation", "validation_loss"]

#: Bytes per block of validation text taken out of the training text.
VAL_BLOCK = 1024
#: A task's validation examples come from the stream of seed ``VAL_STREAM + seed``.
VAL_STREAM = 1 << 21
_BATCH_TOKENS = 16384


def plateaued(losses: Sequence[float], window: int, eps: float) -> bool:
    """Whether the validation ``losses`` (in order) have plateaued: the best of the last
    ``window`` is not below ``(1 - eps)`` times the best before them (``False`` with
    ``window`` points or fewer: nothing to compare with).

    Raises:
        ValueError: ``window < 1`` or ``eps`` outside ``[0, 1)``.
    """
    if window < 1:
        raise ValueError(f"plateau window must be >= 1, got {window}")
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"plateau eps must be in [0, 1), got {eps}")
    if len(losses) <= window:
        return False
    return min(losses[-window:]) >= (1.0 - eps) * min(losses[:-window])


def split_validation(data: Tensor, tokens: int, length: int) -> tuple[Tensor, Tensor]:
    """Take about ``tokens`` bytes of validation text out of training bytes ``data`` [M].

    Blocks of ``max(VAL_BLOCK, length + 1)`` bytes, ``max(1, tokens // block)`` of them,
    are centred on evenly spaced points of ``data``. Returns ``(train [M - n], windows
    [N, length + 1])``: the rest of the text joined in order, and the non-overlapping
    windows of ``length + 1`` bytes inside the blocks.

    Raises:
        ValueError: the blocks would take more than a quarter of the training text.
    """
    block = max(VAL_BLOCK, length + 1)
    count = max(1, tokens // block)
    if 4 * count * block > data.numel():
        raise ValueError(
            f"a validation set of {count * block} bytes is more than a quarter of the "
            f"{data.numel()} training bytes; lower --val-tokens"
        )
    spacing = data.numel() // count
    starts = [i * spacing + (spacing - block) // 2 for i in range(count)]
    keep = torch.ones(data.numel(), dtype=torch.bool)
    windows = []
    for start in starts:
        keep[start : start + block] = False
        chunk = data[start : start + block]
        usable = (block - 1) // length * length  # windows of length + 1 overlap by one byte
        windows.append(chunk[: usable + 1].unfold(0, length + 1, length))  # [w, length + 1]
    return data[keep], torch.cat(windows).long()


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    *,
    dtype: torch.dtype = torch.float32,
) -> float:
    """Mean cross-entropy (nats per scored token) of ``model`` on ``inputs`` [N, T] and
    ``targets`` [N, T] (``IGNORE`` not scored), summed in float64; the model is scored in
    eval mode and left in the mode it was in."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    rows = max(1, _BATCH_TOKENS // inputs.shape[1])
    for start in range(0, inputs.shape[0], rows):
        x = inputs[start : start + rows].to(device)
        y = targets[start : start + rows].to(device)
        with autocast(dtype, device):
            logits = model(x)  # [n, T, V]
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum"
        )
        total += float(loss.double())
        count += int((y != IGNORE).sum())
    model.train(was)
    return total / max(count, 1)
