"""The PyTorch path of ``apply_rope``: the rotation as a few elementwise passes per
cache-sized chunk of positions (Su et al. 2021, "RoFormer", eq. 34).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim.

Runs where the compiled CPU kernel does not (no compiler, other devices without Triton,
``POSENC_CPU_KERNEL=0``) and gives its bits: each pair ``(a, b)`` becomes
``(a cos - b sin, a sin + b cos)`` with every product and sum a separate PyTorch op,
rounded in the compute dtype (float32, float64 for float64 inputs), then rounded once to
``x``'s dtype. Separate ops are correctly rounded whatever the memory layout or
vectorization (a complex multiply or ``addcmul`` may fuse a multiply-add in one code
path and not another), so strided inputs give exactly the result of their contiguous
copy. Every partial result goes into a chunk-sized buffer or the output (``out=``),
never into a full-size temporary (``posenc.fastpath.chunks``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc import fastpath

__all__ = ["rotate_torch"]


def _pairs(x: Tensor, rotary_dim: int, interleaved: bool) -> tuple[Tensor, Tensor]:
    """Views ``(a, b)`` ``[..., R/2]`` of the two members of every rotated pair."""
    if interleaved:
        return x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    half = rotary_dim // 2
    return x[..., :half], x[..., half:rotary_dim]


def rotate_torch(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool) -> None:
    """Write the rotation of ``x [B, H, T, D]`` into ``out`` (``out is x``: in place).

    Args:
        out: ``x`` itself, or a tensor of its shape and dtype that does not overlap it.
        x: the input, any strides.
        cos: ``[T, R/2]`` or ``[B|1, 1, T, R/2]`` in the compute dtype.
        sin: the same shape as ``cos``.
        interleaved: pair layout.

    An in-place rotation, and half precision, first copy each chunk's pairs into buffers
    of the compute dtype (the passes need the unrotated values; half precision is
    rotated in float32); half precision results are rounded into ``out`` once.
    """
    batch, heads, length, dim = x.shape
    half, compute = cos.shape[-1], cos.dtype
    rotary_dim = 2 * half
    if out is not x and rotary_dim < dim:
        out[..., rotary_dim:].copy_(x[..., rotary_dim:])  # pass-through features
    if x.numel() == 0 or half == 0:
        return
    staged = out is x or x.dtype != compute
    widened = x.dtype != compute
    buffers = 1 + 2 * staged + 2 * widened  # b*sin scratch, staged a/b, widened results
    per_position = batch * heads * half * (2 * x.element_size() + buffers * compute.itemsize)
    spans = fastpath.chunks(length, per_position)
    size = batch * heads * (spans[0].stop - spans[0].start) * half
    scratch = x.new_empty((buffers, size), dtype=compute)
    for span in spans:
        shape = (batch, heads, span.stop - span.start, half)
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        views = iter(scratch[:, :numel].view(buffers, *shape))
        c, s = cos[..., span, :], sin[..., span, :]
        a, b = _pairs(x[..., span, :], rotary_dim, interleaved)
        new_a, new_b = _pairs(out[..., span, :], rotary_dim, interleaved)
        if staged:
            a, b = next(views).copy_(a), next(views).copy_(b)
        into_a, into_b = (next(views), next(views)) if widened else (new_a, new_b)
        product = next(views)
        torch.mul(a, c, out=into_a)
        torch.mul(b, s, out=product)
        into_a.sub_(product)  # a cos - b sin
        torch.mul(b, c, out=into_b)
        torch.mul(a, s, out=product)
        into_b.add_(product)  # b cos + a sin (IEEE addition commutes: a sin + b cos)
        if widened:
            new_a.copy_(into_a)  # the one rounding to x's dtype
            new_b.copy_(into_b)
