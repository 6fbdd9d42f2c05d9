"""Applying a rotary embedding: rotate feature pairs of ``x`` by precomputed angles
(Su et al. 2021, "RoFormer", eq. 34).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary_dim (even,
``R <= D``). ``x`` is ``[B, H, T, D]``; ``cos`` and ``sin`` hold one value per rotated
pair, ``[T, R/2]`` (shared by the batch) or ``[B, T, R/2]`` (per-sequence positions).
The rotary dim is implied by them: ``R = 2 * cos.shape[-1]``, and features ``R..D-1``
pass through unchanged (partial rotary).

Layouts of the pairs ``(a_i, b_i)``, ``i < R/2``, that rotate by angle ``theta_i``:

* half-split (``interleaved=False``; GPT-NeoX, Llama in Hugging Face):
  ``a_i = x[i]``, ``b_i = x[i + R/2]``;
* interleaved (``interleaved=True``; GPT-J, Meta's Llama): ``a_i = x[2i]``, ``b_i = x[2i+1]``.

Each pair maps to ``(a cos - b sin, a sin + b cos)``.

Speed: the rotation is pure memory traffic. On CPU tensors (any strides) it runs in
the compiled kernel of ``posenc.encodings.rotary.cpu_kernel`` (one pass, each
row read once and written once, rows shared among threads in small blocks, so a busy
core delays it by one block). Elsewhere, or where the kernel is not built, the PyTorch
path writes every partial result into the output (``out=``) and never allocates a
full-size temporary: interleaved float32/float64 pairs are one complex multiply (``x``
viewed as complex); the other cases run a few passes per cache-sized chunk of positions
(``posenc.fastpath.chunks``). Precision, on both paths: float32/float64 inputs are
rotated in their own dtype; float16/bfloat16 inputs are rotated in float32 and rounded
once (the float32 result rounded to ``x``'s dtype). The backward pass is the rotation
by ``-theta``, through the same kernels, and is itself differentiable (second
derivatives, ``create_graph=True``). Under ``torch.compile`` the plain expression is
traced instead (the compiler fuses it into one kernel).

Fresh outputs are plain ``torch.empty_like`` (4 KiB pages). Huge pages
(``posenc.fastpath.empty_like``) halve the median cost of first touching them, but on
virtual machines that hand free 2 MiB blocks back to the host (free page reporting)
their faults stall now and then for tens of times a copy; ``posenc bench`` shows both.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posenc import triton as posenc_triton
from posenc._checks import check_bool, check_tensor
from posenc.encodings.rotary import cpu_kernel
from posenc.fastpath import chunks

__all__ = ["apply_rope", "apply_rope_"]

_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def _check(x: Tensor, cos: Tensor, sin: Tensor) -> int:
    """Validate shapes; return the rotary dim ``R``."""
    check_tensor("x", x, ndim=4)
    check_tensor("cos", cos, ndim=(2, 3))
    check_tensor("sin", sin, ndim=(2, 3))
    if x.is_complex() or cos.is_complex() or sin.is_complex():
        raise TypeError(
            f"x, cos and sin must be real, got dtypes {x.dtype}, {cos.dtype}, {sin.dtype}"
        )
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if cos.device != x.device or sin.device != x.device:
        raise ValueError(f"cos/sin are on {cos.device}/{sin.device} but x is on {x.device}")
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"cos/sin rotate {rotary_dim} features but x has head_dim {x.shape[-1]}")
    if cos.shape[-2] != x.shape[-2]:
        raise ValueError(f"cos/sin cover {cos.shape[-2]} positions but x has T={x.shape[-2]}")
    if cos.dim() == 3 and cos.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"cos/sin have batch {cos.shape[0]} but x has batch {x.shape[0]}")
    return rotary_dim


def _pairs(x: Tensor, rotary_dim: int, interleaved: bool) -> tuple[Tensor, Tensor]:
    """Views ``(a, b)`` ``[..., R/2]`` of the two members of every rotated pair."""
    if interleaved:
        return x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    half = rotary_dim // 2
    return x[..., :half], x[..., half:rotary_dim]


def _complex_view(x: Tensor, rotary_dim: int) -> Tensor | None:
    """``x[..., :R]`` as ``[..., R/2]`` complex numbers (interleaved pairs), if it can be."""
    if x.dtype not in _COMPLEX or x.stride(-1) != 1:
        return None
    part = x[..., :rotary_dim].unflatten(-1, (rotary_dim // 2, 2))
    if part.storage_offset() % 2 or any(s % 2 for s in part.stride()[:-2]):
        return None
    return torch.view_as_complex(part)


def _tables(cos: Tensor, sin: Tensor, dtype: torch.dtype, inverse: bool) -> tuple[Tensor, Tensor]:
    """``cos``/``sin`` (``-sin`` for the inverse) in ``dtype``, broadcastable to ``[B,H,T,R/2]``."""
    if cos.dim() == 3:  # [B, T, R/2] -> [B, 1, T, R/2]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    cos, sin = cos.to(dtype), sin.to(dtype)
    return cos, (-sin if inverse else sin)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32/float64 rotate in their own dtype; half precision goes through float32."""
    return dtype if dtype in _COMPLEX else torch.float32


def _half_split(out: Tensor, x: Tensor, cos2: Tensor, cos: Tensor, sin: Tensor) -> None:
    """``out = rotate(x)`` on ``[..., R]`` half-split pairs in three passes (``out`` is not ``x``).

    ``cos2 = [cos, cos]`` turns the first pass into one multiply over whole rows; the two
    ``addcmul`` passes add ``-b sin`` to the first half and ``a sin`` to the second.
    """
    half = x.shape[-1] // 2
    torch.mul(x, cos2, out=out)
    out[..., :half].addcmul_(x[..., half:], sin, value=-1.0)
    out[..., half:].addcmul_(x[..., :half], sin)


def _rotate_chunked(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> None:
    """Rotate ``x[..., :R]`` into ``out[..., :R]`` in cache-sized chunks of positions.

    Each chunk is read from memory once and its passes then hit the cache. A chunk is
    first copied into a contiguous buffer of the compute dtype when the rotation is in
    place (the passes need the unrotated values) and for interleaved pairs that cannot
    be viewed as complex numbers where they lie (half precision, odd strides), which
    are multiplied as complex numbers in the buffer and copied (rounded) out. Half-split
    half-precision pairs are rotated into a float32 buffer, then rounded into ``out``.
    """
    batch, heads, length, _ = x.shape
    rotary_dim, compute = 2 * cos.shape[-1], cos.dtype
    widened = compute != x.dtype and not interleaved  # half-split half precision
    staged = out is x or interleaved or widened
    buffers = staged + widened
    per_position = batch * heads * rotary_dim * (x.element_size() + buffers * compute.itemsize)
    spans = chunks(length, per_position)
    size = batch * heads * spans[0].stop * rotary_dim
    work = x.new_empty(size, dtype=compute) if staged else None
    result = x.new_empty(size, dtype=compute) if widened else None
    if interleaved:
        freqs = torch.complex(cos, sin)  # [..., T, R/2]
    else:
        cos2 = torch.cat((cos, cos), dim=-1)  # [..., T, R]
    for span in spans:
        shape = (batch, heads, span.stop - span.start, rotary_dim)
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        src, dst = x[..., span, :rotary_dim], out[..., span, :rotary_dim]
        if work is not None:
            src = work[:numel].view(shape).copy_(src)
        if interleaved:
            torch.view_as_complex(src.unflatten(-1, (rotary_dim // 2, 2))).mul_(freqs[..., span, :])
            dst.copy_(src)
        elif result is not None:
            rotated = result[:numel].view(shape)
            _half_split(rotated, src, cos2[..., span, :], cos[..., span, :], sin[..., span, :])
            dst.copy_(rotated)  # the one rounding to x's dtype
        else:
            _half_split(dst, src, cos2[..., span, :], cos[..., span, :], sin[..., span, :])


def _rotate_into(
    out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool, inverse: bool
) -> None:
    """Write the rotated ``x`` into ``out`` (``out is x``: in place)."""
    rotary_dim = 2 * cos.shape[-1]
    if x.numel() == 0:
        return
    if out is not x and rotary_dim < x.shape[-1]:
        out[..., rotary_dim:].copy_(x[..., rotary_dim:])  # pass-through features
    cos, sin = _tables(cos, sin, _compute_dtype(x.dtype), inverse)
    if cpu_kernel.rotate(out, x, cos, sin, interleaved=interleaved):
        return
    x_c, out_c = _complex_view(x, rotary_dim), _complex_view(out, rotary_dim)
    if interleaved and x_c is not None and out_c is not None:
        torch.mul(x_c, torch.complex(cos, sin), out=out_c)  # one pass: read x, write out
    else:
        _rotate_chunked(out, x, cos, sin, interleaved)


def rotation_function(
    rotate_into: Callable[[Tensor, Tensor, Tensor, Tensor, bool, bool], None],
) -> type[torch.autograd.Function]:
    """An autograd Function rotating with ``rotate_into(out, x, cos, sin, interleaved,
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
            rotate_into(out, x, cos, sin, interleaved, inverse)
            if inplace:
                ctx.mark_dirty(x)
            return out

        @staticmethod
        def backward(ctx, grad: Tensor):  # type: ignore[override]
            cos, sin = ctx.saved_tensors
            grad_x = Rope.apply(grad, cos, sin, ctx.interleaved, False, not ctx.inverse)
            return grad_x, None, None, None, None, None

    return Rope


_Rope = rotation_function(
    lambda out, x, cos, sin, interleaved, inverse: _rotate_into(
        out, x, cos, sin, interleaved=interleaved, inverse=inverse
    )
)


def _rotate_differentiable(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """The plain expression, differentiable in ``cos`` and ``sin`` too (learned angles).

    Computed in ``_compute_dtype(x.dtype)`` and rounded once, like the fast kernels.
    """
    rotary_dim = 2 * cos.shape[-1]
    cos, sin = _tables(cos, sin, _compute_dtype(x.dtype), inverse=False)
    a, b = _pairs(x, rotary_dim, interleaved)
    a, b = a.to(cos.dtype), b.to(cos.dtype)
    new_a, new_b = (a * cos - b * sin).to(x.dtype), (a * sin + b * cos).to(x.dtype)
    if interleaved:
        rotated = torch.stack((new_a, new_b), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((new_a, new_b), dim=-1)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _plain(*tensors: Tensor) -> bool:
    """Use the plain expression: learned angles, or a graph being compiled or exported."""
    return torch.compiler.is_compiling() or _needs_grad(*tensors[1:])


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate ``x [B, H, T, D]`` by ``cos``/``sin`` ``[T, R/2] | [B, T, R/2]``.

    Args:
        x: queries or keys, any strides (e.g. a transposed ``[B, T, H, D]`` projection).
        cos: cosines of the angles, one per rotated pair (float32-or-better from
            ``RotaryEmbedding``); ``R = 2 * cos.shape[-1]`` features rotate.
        sin: sines of the same angles, same shape as ``cos``.
        interleaved: pair layout, ``(x[2i], x[2i+1])`` instead of ``(x[i], x[i+R/2])``.

    Returns:
        A new tensor of ``x``'s shape and dtype (and strides, when ``x`` is dense);
        ``x`` is not modified. Computed in ``x``'s dtype with ``cos``/``sin`` cast to it;
        float16/bfloat16 inputs in float32, rounded once.
        Differentiable in ``x`` (backward: the inverse rotation), and in ``cos``/``sin``
        when they require grad.

    Raises:
        ValueError: mismatched shapes or devices, or ``R > D``.
        TypeError: non-tensor, non-floating or complex inputs.
    """
    _check(x, cos, sin)
    interleaved = check_bool("interleaved", interleaved)
    if _plain(x, cos, sin):
        return _rotate_differentiable(x, cos, sin, interleaved)
    if x.is_cuda and posenc_triton.available():  # one Triton kernel (posenc.triton)
        return posenc_triton.apply_rope(x, cos, sin, interleaved=interleaved)
    if _needs_grad(x):
        return _Rope.apply(x, cos, sin, interleaved, False, False)
    out = torch.empty_like(x)
    _rotate_into(out, x, cos, sin, interleaved=interleaved, inverse=False)
    return out


def apply_rope_(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """In-place ``apply_rope``: rotate ``x`` where it lies and return it.

    Same arguments, shapes and numerics as ``apply_rope``. Autograd follows the usual
    in-place rules (``x`` must not be a leaf that requires grad).

    Raises:
        ValueError: mismatched shapes or devices, ``R > D``, or an ``x`` whose elements
            overlap in memory (an expanded tensor).
        TypeError: non-tensor, non-floating or complex inputs.
    """
    _check(x, cos, sin)
    interleaved = check_bool("interleaved", interleaved)
    if any(stride == 0 and size > 1 for stride, size in zip(x.stride(), x.shape, strict=True)):
        raise ValueError(
            f"x (shape {tuple(x.shape)}, strides {x.stride()}) has overlapping elements; "
            "rotate a copy with apply_rope instead"
        )
    if _plain(x, cos, sin):
        # the rotation reads a copy: x itself is overwritten, and autograd needs its values
        return x.copy_(_rotate_differentiable(x.clone(), cos, sin, interleaved))
    if x.is_cuda and posenc_triton.available():
        return posenc_triton.apply_rope(x, cos, sin, interleaved=interleaved, inplace=True)
    if _needs_grad(x):
        return _Rope.apply(x, cos, sin, interleaved, True, False)
    _rotate_into(x, x, cos, sin, interleaved=interleaved, inverse=False)
    return x
