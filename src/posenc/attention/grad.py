"""Gradients of blocked attention: recomputation per block, and double backward.

Shapes: ``B`` batch, ``H`` heads, ``Tb`` queries of a block, ``Tk`` keys, ``D`` head_dim.

``recompute(fn, q, k, v, *extra)`` runs ``fn`` without keeping a graph and, in the backward
pass, runs it again and differentiates that (gradient checkpointing: Chen et al. 2016,
"Training Deep Nets with Sublinear Memory Cost"), so a block holds ``O(B * H * Tb * Tk)``
memory only while its own gradient is computed. Unlike ``torch.utils.checkpoint`` it
chooses the kernel of the recomputation: SDPA's fused kernel for an ordinary backward,
and the eager formula (``fn(..., exact=True)``) when the backward itself builds a graph
(``create_graph=True``), since the fused kernels' backward is not differentiable. That
makes the chunked backend twice differentiable (``gradgradcheck``).

Under ``torch.compile`` dynamo cannot trace the ``torch.autograd.grad`` of that backward
(with ``fullgraph=True`` it refuses it), so there ``recompute`` is
``torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False)``, which dynamo
captures as a region the backward graph recomputes: AOTAutograd derives the backward of
the block's operations and its partitioner keeps the region's activations out of the
saved ones (with dropout, the gradient is that of the forward that ran). Measured on
``MultiHeadAttention`` with ALiBi (``T = 4096``, ``H = 4``, ``C = 64``, one thread; a
``[H, T, T]`` float32 tensor is 256 MiB), the peak memory of a training step above its
start: eager 10 MiB, compiled through AOTAutograd 21 MiB (266 MiB with the block's plain
operations instead of the checkpoint), inductor 130 MiB (264 MiB).
A compiled backward is not differentiable again (AOTAutograd has no double backward).
Hooks do not cache tensors they make under compile (a checkpointed region cannot hand
them out).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

__all__ = ["forbid_double_backward", "recompute"]


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


@contextlib.contextmanager
def _replayed(state: tuple[Tensor, Tensor | None] | None, device: torch.device) -> Iterator[None]:
    """Run the body with the random state of the forward pass (dropout), then restore."""
    if state is None:
        yield
        return
    devices = [device] if state[1] is not None else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)
        yield


class _Recompute(torch.autograd.Function):
    """``fn(*inputs)`` without a graph; its backward recomputes and differentiates it."""

    @staticmethod
    def forward(ctx, fn: Callable[..., Tensor], dropout: bool, *inputs: Tensor) -> Tensor:  # type: ignore[override]
        ctx.fn = fn
        ctx.save_for_backward(*inputs)
        ctx.rng = _rng_state(inputs[0].device) if dropout else None
        return fn(*inputs)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        inputs = ctx.saved_tensors
        create = torch.is_grad_enabled()  # True inside a create_graph=True backward
        if create and ctx.rng is not None:
            raise RuntimeError(
                "double backward through attention dropout is not supported (the fused "
                "kernel's dropout cannot be replayed by the eager formula); use dropout=0"
            )
        wanted = [i for i, t in enumerate(inputs) if ctx.needs_input_grad[2 + i]]
        with torch.enable_grad(), _replayed(ctx.rng, inputs[0].device):
            out = ctx.fn(*inputs, exact=create)
        grads = torch.autograd.grad(
            out, [inputs[i] for i in wanted], grad, create_graph=create, allow_unused=True
        )
        result: list[Tensor | None] = [None] * len(inputs)
        for i, g in zip(wanted, grads, strict=True):
            result[i] = g
        return (None, None, *result)


def recompute(fn: Callable[..., Tensor], *inputs: Tensor, dropout: bool) -> Tensor:
    """``fn(*inputs)``, recomputed in the backward pass (see the module docstring).

    Args:
        fn: ``fn(*inputs, exact=False) -> Tensor``; with ``exact=True`` it must compute
            the same function with differentiable operations.
        inputs: every tensor whose gradient is wanted (the encoding's parameters too,
            even where ``fn`` reads them from the module).
        dropout: whether ``fn`` draws random numbers (the backward replays them).

    Returns:
        ``fn(*inputs)``; under ``torch.compile`` through ``torch.utils.checkpoint``.
    """
    if torch.compiler.is_compiling():
        return torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False)
    return _Recompute.apply(fn, dropout, *inputs)


class _SingleBackward(torch.autograd.Function):
    """Identity whose backward refuses to build a graph (``create_graph=True``)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        if torch.is_grad_enabled():
            raise RuntimeError(
                "backend='sdpa' is not twice differentiable (the fused attention kernels' "
                "backward has no derivative); use backend='chunked' or 'eager' for "
                "create_graph=True"
            )
        return grad


def forbid_double_backward(out: Tensor) -> Tensor:
    """``out``, raising a clear error if a double backward reaches it (SDPA backend)."""
    return _SingleBackward.apply(out) if out.requires_grad else out
