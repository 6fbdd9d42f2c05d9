"""The rotation ``apply_rope`` runs eagerly, its autograd Function, and the operator
``torch.ops.posenc.rope`` that compiled and exported graphs call (Su et al. 2021,
"RoFormer", eq. 34).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim;
``cos``/``sin`` are ``[T, R/2]`` or ``[B|1, T, R/2]``.

``rotate_into`` picks the compiled CPU kernel (``cpu_kernel``) or the PyTorch path
(``rope_torch``), which give the same bits. Before either touches memory it resolves
what they cannot see: torch's lazy negation bit (``x.neg()`` may be a view that only
flags its values as negated) and efficient zero tensors (no memory at all), on ``x``
and on the tables.

``posenc::rope(x, cos, sin, interleaved, inverse) -> Tensor`` is a ``torch.library``
custom op: an opaque node for ``torch.compile(fullgraph=True)`` and ``torch.export``,
with a fake implementation (shapes and strides of ``torch.empty_like(x)``) and its
autograd formula (the rotation by ``-theta``, itself this op, so differentiable any
number of times; differentiable in ``x`` only) and a vmap rule (``torch.func.vmap`` folds
the vmapped dimension into ``B``: one call, each row rotated as it would be alone). It
exists with or without a compiler; its implementation is ``rotate_into``. torch.library
has no forward-mode formula for custom ops, so the op refuses to run while a forward-AD
level is open (``torch.func.jvp``, ``forward_ad.dual_level``) rather than drop the
tangent; ``apply_rope`` routes those, and ``torch.func.grad``, to the plain expression.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.autograd.forward_ad as forward_ad
from torch import Tensor

from posenc.encodings.rotary import cpu_kernel
from posenc.encodings.rotary.rope_torch import rotate_torch

__all__ = ["compute_dtype", "materialize", "rope", "rotate_into", "rotation_function"]

_WIDE = (torch.float32, torch.float64)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32/float64 rotate in their own dtype; half precision goes through float32."""
    return dtype if dtype in _WIDE else torch.float32


def materialize(t: Tensor) -> Tensor:
    """``t`` with plain memory: a lazy negation resolved, an efficient zero tensor filled."""
    if t._is_zerotensor():
        return torch.zeros_like(t)
    return t.resolve_neg()


def tables(cos: Tensor, sin: Tensor, dtype: torch.dtype, inverse: bool) -> tuple[Tensor, Tensor]:
    """``cos``/``sin`` (``-sin`` for the inverse) in ``dtype``, broadcastable to ``[B,H,T,R/2]``."""
    if cos.dim() == 3:  # [B, T, R/2] -> [B, 1, T, R/2]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    cos, sin = materialize(cos).to(dtype), materialize(sin).to(dtype)
    return cos, (-sin if inverse else sin)


def rotate_into(
    out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool, inverse: bool
) -> None:
    """Write the rotation of ``x`` (by ``-theta`` when ``inverse``) into ``out``.

    ``out is x``: in place; the caller has checked that ``x``'s elements do not overlap
    and that the tables do not share its memory. Otherwise ``out`` is a fresh tensor.
    """
    if x.numel() == 0:
        return
    if out is x and x.is_neg():  # rotate the values, write back through the bit
        resolved = x.resolve_neg()
        rotate_into(resolved, resolved, cos, sin, interleaved=interleaved, inverse=inverse)
        x.copy_(resolved)
        return
    if out is not x:
        x = materialize(x)
    cos, sin = tables(cos, sin, compute_dtype(x.dtype), inverse)
    if cos.shape[-1] == 0:  # rotary dim 0: nothing turns
        if out is not x:
            out.copy_(x)
        return
    if not cpu_kernel.rotate(out, x, cos, sin, interleaved=interleaved):
        rotate_torch(out, x, cos, sin, interleaved=interleaved)


def rotation_function(
    rotate: Callable[[Tensor, Tensor, Tensor, Tensor, bool, bool], None],
) -> type[torch.autograd.Function]:
    """An autograd Function rotating with ``rotate(out, x, cos, sin, interleaved,
    inverse)`` (``out is x``: in place; ``inverse``: by ``-theta``).

    Its backward is the rotation by the opposite angle, itself this Function, so it is
    differentiable any number of times. Shared by the CPU path and the Triton kernel.
    """

    class Rope(torch.autograd.Function):
        @staticmethod
        def forward(  # type: ignore[override]
            ctx,
            x: Tensor,
            cos: Tensor,
            sin: Tensor,
            interleaved: bool,
            inplace: bool,
            inverse: bool,
        ) -> Tensor:
            ctx.save_for_backward(cos, sin)
            ctx.interleaved, ctx.inverse = interleaved, inverse
            out = x if inplace else torch.empty_like(x)
            rotate(out, x, cos, sin, interleaved, inverse)
            if inplace:
                ctx.mark_dirty(x)
            return out

        @staticmethod
        def backward(ctx, grad: Tensor):  # type: ignore[override]
            cos, sin = ctx.saved_tensors
            grad_x = Rope.apply(grad, cos, sin, ctx.interleaved, False, not ctx.inverse)
            return grad_x, None, None, None, None, None

    return Rope


@torch.library.custom_op("posenc::rope", mutates_args=())
def rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, inverse: bool) -> Tensor:
    """``x [B, H, T, D]`` rotated by ``cos``/``sin`` (by ``-theta`` when ``inverse``)."""
    if forward_ad._current_level >= 0:  # the tangent would be dropped: refuse instead
        raise RuntimeError(
            "posenc::rope has no forward-mode AD formula; call posenc.apply_rope, "
            "which rotates dual tensors with differentiable PyTorch operations"
        )
    out = torch.empty_like(x)
    rotate_into(out, x, cos, sin, interleaved=interleaved, inverse=inverse)
    return out


@rope.register_fake
def _rope_fake(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, inverse: bool) -> Tensor:
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output) -> None:
    _, cos, sin, interleaved, inverse = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved, ctx.inverse = interleaved, inverse


def _backward(ctx, grad: Tensor):
    cos, sin = ctx.saved_tensors
    return rope(grad, cos, sin, ctx.interleaved, not ctx.inverse), None, None, None, None


rope.register_autograd(_backward, setup_context=_setup_context)


def _batch_first(t: Tensor, dim: int | None) -> Tensor:
    """``t`` with its vmapped dimension first (a new size-1 one when it has none)."""
    return t.unsqueeze(0) if dim is None else t.movedim(dim, 0)


@rope.register_vmap
def _rope_vmap(info, in_dims, x, cos, sin, interleaved, inverse):
    """``rope`` over ``N`` stacked inputs in one call: ``x [N, B, H, T, D]`` becomes
    ``[N*B, H, T, D]`` and the tables ``[N*B | 1, T, R/2]``."""
    n = info.batch_size
    x = _batch_first(x, in_dims[0])
    x = x.expand(n, *x.shape[1:])  # [N, B, H, T, D]
    batch = x.shape[1]
    cos, sin = _batch_first(cos, in_dims[1]), _batch_first(sin, in_dims[2])
    if cos.dim() == 3:  # [N|1, T, R/2] -> [N|1, 1, T, R/2]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    cos, sin = torch.broadcast_tensors(cos, sin)  # [N|1, B|1, T, R/2]
    if cos.shape[:2] == (1, 1):  # one table for every row
        cos, sin = cos[0], sin[0]
    else:
        shape = (n * batch, *cos.shape[2:])
        cos = cos.expand(n, batch, *cos.shape[2:]).reshape(shape)
        sin = sin.expand(n, batch, *sin.shape[2:]).reshape(shape)
    out = rope(x.reshape(n * batch, *x.shape[2:]), cos, sin, interleaved, inverse)
    return out.reshape(x.shape), 0
