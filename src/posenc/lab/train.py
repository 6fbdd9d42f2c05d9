"""Training loop of the lab: AdamW, linear warmup then cosine decay, NaN detection.

Shapes: ``B`` batch, ``T`` length, ``V`` vocabulary. Batches come from a sampler that
returns the *global* batch ``(inputs [B, T], targets [B, T])`` (targets ``-100`` are not
scored); each process trains on its shard: its group's rows and, under context
parallelism, its head-tail share of each sequence's tokens (``posenc.lab.distributed``).
The loss is the sum over the shard divided by the global count of scored tokens (times the
process count, which DDP's gradient averaging divides out), so one process and several
follow the same gradients.

With ``until`` (synthetic tasks) training goes on past ``steps`` in rounds: at step
``steps`` and every ``until.every`` steps after it (and at ``until.max_steps``) the model
is scored by ``until.done`` in eval mode, and training stops once that returns true.
Past ``steps`` the learning rate stays at the schedule's floor, ``lr / 10``, with the same
optimizer state, so the first ``steps`` are exactly those of a run without ``until``.
After each check that does not stop, ``until.save`` gets a snapshot (step, model,
optimizer, the sampler's generator, loss curve); training started with ``until.resume``
set to one goes on from it, bit for bit as if it had never stopped.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.lab.distributed import Context
from posenc.lab.precision import autocast
from posenc.lab.tasks import IGNORE, Task
from posenc.parallel import head_tail_layout, ring_context

__all__ = [
    "NonFiniteLoss",
    "TaskStream",
    "TextWindows",
    "TrainResult",
    "Until",
    "adamw",
    "lr_at",
    "train",
]

#: At most this many (step, loss) points are kept for the results file.
_CURVE_POINTS = 50
_CLIP = 1.0


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite; the run is reported as failed."""


@dataclass(frozen=True)
class TrainResult:
    steps: int
    seconds: float
    final_loss: float
    curve: list[tuple[int, float]]


@dataclass(frozen=True)
class Until:
    """When training past ``steps`` stops: ``done(step)`` (the model in eval mode) is asked
    at ``steps``, every ``every`` steps after it and at ``max_steps`` (the cap); ``save``
    receives a snapshot after each check that does not stop, ``resume`` is one to go on
    from (the sampler must keep its random state in ``sampler.gen``)."""

    done: Callable[[int], bool]
    max_steps: int
    every: int
    save: Callable[[dict], None] | None = None
    resume: dict | None = None

    def due(self, step: int, steps: int) -> bool:
        """Whether ``done`` is asked after 1-based ``step`` of a ``steps``-step schedule."""
        return step >= steps and ((step - steps) % self.every == 0 or step == self.max_steps)


class TextWindows:
    """Random windows of ``length + 1`` bytes from ``data`` (inputs and next-byte targets).

    The draw order depends only on ``seed``, so every encoding sees the same batches.
    """

    def __init__(self, data: Tensor, length: int, seed: int) -> None:
        if data.numel() <= length + 1:
            raise ValueError(
                f"the training text has {data.numel()} bytes; windows of {length} need more"
            )
        self.data, self.length = data, length
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, batch_size: int) -> tuple[Tensor, Tensor]:
        high = self.data.numel() - self.length - 1
        starts = torch.randint(0, high + 1, (batch_size,), generator=self.gen)
        window = self.data[starts[:, None] + torch.arange(self.length + 1)].long()  # [B, T+1]
        return window[:, :-1], window[:, 1:]


class TaskStream:
    """Synthetic examples of every size up to ``length`` (see ``posenc.lab.tasks``)."""

    def __init__(self, task: Task, length: int, seed: int) -> None:
        self.task, self.length = task, length
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, batch_size: int) -> tuple[Tensor, Tensor]:
        return self.task.batch(batch_size, self.length, self.gen, exact=False)


def lr_at(step: int, *, steps: int, warmup: int, peak: float) -> float:
    """Learning rate at 0-based ``step``: linear warmup, cosine decay to ``peak / 10``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def adamw(model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """The lab's AdamW (betas 0.9, 0.95; no decay on biases and norms), in one fused
    kernel per parameter rather than a dozen small ops each (the same update up to
    float rounding; about 3-9 % of a training step of the tiny model on a CPU)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0}],
        lr=lr,
        betas=(0.9, 0.95),
        fused=True,
    )


@contextlib.contextmanager
def _sequence_split(model: nn.Module, context: Context, inputs: Tensor) -> Iterator[Tensor | None]:
    """Under context parallelism, the attention of ``model`` by ring attention over the
    context-parallel group, yielding the global indices (= positions) of the rank's
    head-tail shard of the sequences ``inputs [B, T]``; else it changes nothing and yields
    None."""
    if context.cp == 1:
        yield None
        return
    layout = head_tail_layout(inputs.shape[1], context.cp, context.cp_rank)
    with ring_context(model, group=context.cp_group):
        yield layout.indices.to(inputs.device)


def train(
    model: nn.Module,
    sampler: Callable[[int], tuple[Tensor, Tensor]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup: int,
    weight_decay: float,
    context: Context,
    on_step: Callable[[int, float], None] | None = None,
    until: Until | None = None,
    dtype: torch.dtype = torch.float32,
) -> TrainResult:
    """Train ``model`` in place for ``steps`` optimizer steps (with ``until``: on in
    rounds until ``until.done`` or ``until.max_steps``; ``TrainResult.steps`` says how many).
    ``dtype`` is the forward's matrix products (bfloat16: mixed precision, the weights,
    gradients and optimizer state stay float32; ``posenc.lab.precision``).

    Raises:
        NonFiniteLoss: the loss (summed over processes) is NaN or infinite.
    """
    net = context.wrap(model)
    net.train()
    optimizer = adamw(model, lr=lr, weight_decay=weight_decay)
    limit = steps if until is None else until.max_steps
    every = max(1, limit // _CURVE_POINTS)
    curve: list[tuple[int, float]] = []
    start = time.perf_counter()
    loss_value = float("nan")
    taken = 0
    if until is not None and until.resume is not None:
        snapshot = until.resume
        model.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        sampler.gen.set_state(snapshot["sampler"])
        curve = [(int(s), float(v)) for s, v in snapshot["curve"]]
        taken, loss_value = snapshot["step"], snapshot["loss"]
    for step in range(taken, limit):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps=steps, warmup=warmup, peak=lr)
        inputs, targets = (context.train_rows(t).to(context.device) for t in sampler(batch_size))
        with autocast(dtype, context.device), _sequence_split(model, context, inputs) as held:
            if held is None:
                logits = net(inputs)  # [B, T, V], float32
            else:  # this rank's shard of every sequence [B, T/N], at its global positions
                inputs, targets = inputs[:, held], targets[:, held]
                logits = net(inputs, held)
        local = F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum"
        )
        count = (targets != IGNORE).sum()
        total, scored = context.sum(torch.stack((local.detach().double(), count.double()))).tolist()
        loss_value = total / max(scored, 1.0)
        if not math.isfinite(loss_value):
            raise NonFiniteLoss(f"loss became {loss_value} at step {step + 1}")
        optimizer.zero_grad(set_to_none=True)
        (local * (context.world / max(scored, 1.0))).backward()
        nn.utils.clip_grad_norm_(model.parameters(), _CLIP)
        optimizer.step()
        taken = step + 1
        if step % every == 0:
            curve.append((taken, loss_value))
        if on_step is not None:
            on_step(taken, loss_value)
        if until is not None and until.due(taken, steps):
            model.eval()
            if until.done(taken):
                break
            if until.save is not None:
                until.save(
                    {
                        "step": taken,
                        "loss": loss_value,
                        "curve": curve,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "sampler": sampler.gen.get_state(),
                    }
                )
            net.train()
    if curve[-1][0] != taken:
        curve.append((taken, loss_value))
    model.eval()
    return TrainResult(taken, time.perf_counter() - start, loss_value, curve)
