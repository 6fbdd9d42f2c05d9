"""Data- and context-parallel training with PyTorch's own engine (``torch.distributed`` + DDP).

Under ``torchrun`` (``WORLD_SIZE > 1`` in the environment) every process joins one group
(gloo on CPU, NCCL on GPUs), draws the same global batch and keeps its own shard of it, so
gradients averaged by ``DistributedDataParallel`` are those of the global batch; evaluation
windows are sharded over every process (rows ``rank::world``) and their sums reduced. Rank 0
alone writes outputs. A single process uses the same code with ``world == 1``.

With context parallelism of size ``N`` (``--context-parallel N``), consecutive ranks
``N*d .. N*d+N-1`` form context-parallel group ``d``: they train on the same rows (rows
``d::world/N``), each holding the head-tail shard of every training sequence
(``posenc.parallel.head_tail_layout``) and attending by ring attention
(``posenc.parallel.ring_context``) over the group. DDP's all-reduce over every process sums
the encodings' parameter shares that the ring leaves on each rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from posenc._checks import check_int

__all__ = ["Context", "init_context"]


@dataclass(frozen=True)
class Context:
    """Where this process stands: its rank, the process count and its device."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")  # noqa: RUF009 (an immutable default)
    #: context-parallel size ``N``: ranks per sequence (1: none).
    cp: int = 1
    #: this rank's context-parallel group (None when ``cp == 1``).
    cp_group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str | None:
        if self.world == 1:
            return None
        return "nccl" if self.device.type == "cuda" else "gloo"

    @property
    def dp(self) -> int:
        """The number of context-parallel groups (data-parallel replicas)."""
        return self.world // self.cp

    @property
    def cp_rank(self) -> int:
        """This rank's place in its context-parallel group."""
        return self.rank % self.cp

    def shard(self, rows: Tensor) -> Tensor:
        """This process's rows of a global batch ``[B, ...]`` (evaluation: every process)."""
        return rows[self.rank :: self.world]

    def train_rows(self, rows: Tensor) -> Tensor:
        """The rows of a global training batch ``[B, ...]`` this process's context-parallel
        group trains on (all of its ranks the same rows)."""
        return rows[self.rank // self.cp :: self.dp]

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


def init_context(device: str = "auto", *, context_parallel: int = 1) -> Context:
    """Join the process group ``torchrun`` describes in the environment, if any.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when available).
        context_parallel: ranks per sequence; divides the process count.

    Raises:
        ValueError: ``device`` is unknown, CUDA is asked for but not available, or
            ``context_parallel`` does not divide the process count.
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
    cp = check_int("context_parallel", context_parallel, minimum=1)
    if world % cp:
        raise ValueError(
            f"--context-parallel {cp} must divide the process count {world} "
            "(torchrun --nproc_per_node)"
        )
    context = Context(rank=rank, world=world, device=target, cp=cp)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend=context.backend)
    if cp > 1:  # every rank creates every group, in the same order
        groups = [dist.new_group(list(range(s, s + cp))) for s in range(0, world, cp)]
        context = replace(context, cp_group=groups[rank // cp])
    return context
