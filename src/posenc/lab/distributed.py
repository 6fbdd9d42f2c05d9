"""Data-parallel training with PyTorch's own engine (``torch.distributed`` + DDP).

Under ``torchrun`` (``WORLD_SIZE > 1`` in the environment) every process joins one group
(gloo on CPU, NCCL on GPUs), draws the same global batch and keeps its own shard of it
(rows ``rank::world``), so gradients averaged by ``DistributedDataParallel`` are those of
the global batch; evaluation windows are sharded the same way and their sums reduced.
Rank 0 alone writes outputs. A single process uses the same code with ``world == 1``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["Context", "init_context"]


@dataclass(frozen=True)
class Context:
    """Where this process stands: its rank, the process count and its device."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")  # noqa: RUF009 (an immutable default)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str | None:
        if self.world == 1:
            return None
        return "nccl" if self.device.type == "cuda" else "gloo"

    def shard(self, rows: Tensor) -> Tensor:
        """This process's rows of a global batch ``[B, ...]``."""
        return rows[self.rank :: self.world]

    def sum(self, values: Tensor) -> Tensor:
        """Sum of ``values`` over processes (float64 on the host, same on every rank)."""
        values = values.detach().to(torch.float64)
        if self.world > 1:
            values = values.to(self.device)
            dist.all_reduce(values)
        return values.cpu()

    def share(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process (a picklable value)."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to train: DDP around ``model`` when there are several processes."""
        if self.world == 1:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def init_context(device: str = "auto") -> Context:
    """Join the process group ``torchrun`` describes in the environment, if any.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when available).

    Raises:
        ValueError: ``device`` is unknown, or CUDA is asked for but not available.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for, but CUDA is not available")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    target = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(target)
    context = Context(rank=rank, world=world, device=target)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend=context.backend)
    return context
