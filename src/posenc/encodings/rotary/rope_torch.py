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

A NaN result is written as the canonical quiet NaN of ``x``'s dtype on CPU (positive, no
payload: ``0x7FC0`` in bfloat16, ``0x7E00`` in float16), as the kernel writes it. PyTorch's
own operations give a NaN's sign and payload by code path: its vectorized bfloat16
narrowing writes ``0xFFFF``, its scalar one ``0x7FC0``, and ``a - b`` of two NaNs passes on
either one's payload. A chunk whose sum is NaN has its NaNs refilled (one read of a chunk
in the cache, and a fill only where a NaN or ``inf - inf`` is).
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


def _doubled(table: Tensor, interleaved: bool) -> Tensor:
    """``[..., R/2]`` -> ``[..., R]``, one value per feature of its pair's layout."""
    if interleaved:
        return torch.stack((table, table), dim=-1).flatten(-2)
    return torch.cat((table, table), dim=-1)


def rotate_torch(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool) -> None:
    """Write the rotation of ``x [B, H, T, D]`` into ``out`` (``out is x``: in place).

    Args:
        out: ``x`` itself, or a tensor of its shape and dtype that does not overlap it.
        x: the input, any strides.
        cos: ``[T, R/2]`` or ``[B|1, 1, T, R/2]`` in the compute dtype.
        sin: the same shape as ``cos``.
        interleaved: pair layout.

    Four passes per chunk: ``(a cos, b cos)`` and ``(a sin, b sin)`` over whole rows
    (the tables doubled to one value per feature), then ``a cos - b sin`` and
    ``b cos + a sin`` on the pairs. An in-place rotation, and half precision, first copy
    each chunk into a buffer of the compute dtype (the passes need the unrotated values;
    half precision is rotated there in float32 and rounded into ``out`` once).
    """
    batch, heads, length, dim = x.shape
    rotary_dim, compute = 2 * cos.shape[-1], cos.dtype
    if out is not x and rotary_dim < dim:
        out[..., rotary_dim:].copy_(x[..., rotary_dim:])  # pass-through features
    if x.numel() == 0 or rotary_dim == 0:
        return
    staged = out is x or x.dtype != compute
    buffers = 1 + staged  # the sin products, the staged chunk
    per_position = batch * heads * rotary_dim * (2 * x.element_size() + buffers * compute.itemsize)
    spans = fastpath.chunks(length, per_position)
    size = batch * heads * (spans[0].stop - spans[0].start) * rotary_dim
    scratch = x.new_empty((buffers, size), dtype=compute)
    cos2, sin2 = _doubled(cos, interleaved), _doubled(sin, interleaved)  # [..., T, R]
    for span in spans:
        shape = (batch, heads, span.stop - span.start, rotary_dim)
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        products, *rest = scratch[:, :numel].view(buffers, *shape)
        src, dst = x[..., span, :rotary_dim], out[..., span, :rotary_dim]
        if staged:
            src = rest[0].copy_(src)
        torch.mul(src, sin2[..., span, :], out=products)  # (a sin, b sin)
        rotated = src if x.dtype != compute else dst  # half precision: rotate in the buffer
        torch.mul(src, cos2[..., span, :], out=rotated)  # (a cos, b cos)
        new_a, new_b = _pairs(rotated, rotary_dim, interleaved)
        a_sin, b_sin = _pairs(products, rotary_dim, interleaved)
        new_a.sub_(b_sin)  # a cos - b sin
        new_b.add_(a_sin)  # b cos + a sin (IEEE addition commutes: a sin + b cos)
        if rotated is not dst:
            dst.copy_(rotated)  # the one rounding to x's dtype
        if dst.device.type == "cpu" and rotated.sum().isnan():  # one read of a cached chunk
            dst.masked_fill_(dst.isnan(), float("nan"))  # the canonical NaN (module docstring)
