"""The Triton RoPE kernel and its autograd wrapper (Su et al. 2021, "RoFormer", eq. 34).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim.

One program rotates ``BLOCK_T`` positions of one ``(batch, head)`` row: it loads the
pairs ``(a_i, b_i)`` (``(x[i], x[i + R/2])`` half-split, ``(x[2i], x[2i+1])``
interleaved, loaded as whole pairs ``[BLOCK_T, R/2, 2]`` and split, which on an H100
halved the time of two stride-2 loads) and their ``cos``/``sin``, writes
``(a cos - b sin, a sin + b cos)``, and copies features ``R..D-1`` when the output is a
new tensor. Memory traffic is one read of ``x`` and one write of the output, plus the
tables (``T x R/2`` each, or ``B x T x R/2``), read once per head from the cache.
Importing this module imports Triton; the kernel is defined at import, so
``TRITON_INTERPRET=1`` must be set before.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

from posenc._dtypes import compute_dtype
from posenc.encodings.rotary.layout import check_no_overlap, shares_memory
from posenc.encodings.rotary.rope_op import rotation_function

__all__ = ["rope"]

_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_TILE = 4096  # elements of one (position, pair) tile per program


@triton.jit
def _tile(
    x_ptr, out_ptr, cos_ptr, sin_ptr, heads, length, t_blocks, sxb, sxh, sxt, sob, soh, sot,
    scb, sct,
    HALF: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INVERSE: tl.constexpr,
):  # fmt: skip
    """This program's ``BLOCK_T`` positions of one ``(batch, head)`` row: which exist, the
    ``[BLOCK_T, BLOCK_HALF]`` mask of their pairs, the row pointers of ``x`` and the output
    ``[BLOCK_T, 1]``, and their ``cos``/``sin`` (``-sin`` when ``INVERSE``)."""
    pid = tl.program_id(0)
    row = pid // t_blocks  # b * H + h
    b = (row // heads).to(tl.int64)
    h = (row % heads).to(tl.int64)
    t = (pid % t_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    i = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    t_ok = t < length
    mask = t_ok[:, None] & (i < HALF)[None, :]
    t64 = t.to(tl.int64)[:, None]
    x_row = x_ptr + b * sxb + h * sxh + t64 * sxt  # [BLOCK_T, 1] pointers
    o_row = out_ptr + b * sob + h * soh + t64 * sot
    table = b * scb + t64 * sct + i[None, :]
    cos = tl.load(cos_ptr + table, mask=mask, other=0.0)
    sin = tl.load(sin_ptr + table, mask=mask, other=0.0)
    if INVERSE:
        sin = -sin
    return t_ok, mask, x_row, o_row, cos, sin


@triton.jit
def _copy_rest(
    x_row, o_row, t_ok, sx, so,
    START: tl.constexpr,
    COUNT: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Partial rotary, out of place: copy ``COUNT`` elements from ``START`` of each row."""
    j = START + tl.arange(0, BLOCK)
    keep = t_ok[:, None] & (j < START + COUNT)[None, :]
    tl.store(o_row + j[None, :] * so, tl.load(x_row + j[None, :] * sx, mask=keep), mask=keep)


@triton.jit
def _rope_kernel(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    heads,
    length,
    t_blocks,
    sxb,
    sxh,
    sxt,
    sxd,
    sob,
    soh,
    sot,
    sod,
    scb,
    sct,
    HALF: tl.constexpr,
    PASS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    INVERSE: tl.constexpr,
):
    t_ok, mask, x_row, o_row, cos, sin = _tile(
        x_ptr, out_ptr, cos_ptr, sin_ptr, heads, length, t_blocks, sxb, sxh, sxt, sob, soh, sot,
        scb, sct, HALF, BLOCK_T, BLOCK_HALF, INVERSE,
    )  # fmt: skip
    i = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    kind = out_ptr.dtype.element_ty
    if INTERLEAVED:  # whole pairs [BLOCK_T, BLOCK_HALF, 2]: consecutive features per load
        feature = 2 * i[:, None] + tl.arange(0, 2)[None, :]  # [BLOCK_HALF, 2]
        both = mask[:, :, None] & (feature < 2 * HALF)[None, :, :]
        pairs = tl.load(x_row[:, :, None] + feature[None, :, :] * sxd, mask=both, other=0.0)
        a, b_ = tl.split(pairs.to(cos.dtype))
        turned = tl.join(a * cos - b_ * sin, a * sin + b_ * cos).to(kind)
        tl.store(o_row[:, :, None] + feature[None, :, :] * sod, turned, mask=both)
    else:
        a = tl.load(x_row + i[None, :] * sxd, mask=mask, other=0.0).to(cos.dtype)
        b_ = tl.load(x_row + (i + HALF)[None, :] * sxd, mask=mask, other=0.0).to(cos.dtype)
        tl.store(o_row + i[None, :] * sod, (a * cos - b_ * sin).to(kind), mask=mask)
        tl.store(o_row + (i + HALF)[None, :] * sod, (a * sin + b_ * cos).to(kind), mask=mask)
    if PASS > 0:  # partial rotary, out of place: copy the features past R
        _copy_rest(x_row, o_row, t_ok, sxd, sod, 2 * HALF, PASS, BLOCK_PASS)


@triton.jit
def _rope_words_kernel(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    heads,
    length,
    t_blocks,
    sxb,
    sxh,
    sxt,
    sob,
    soh,
    sot,
    scb,
    sct,
    HALF: tl.constexpr,
    PASS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    FLOAT: tl.constexpr,
    INVERSE: tl.constexpr,
):
    """Interleaved pairs ``(x[2i], x[2i+1])`` read as one integer word each.

    ``x_ptr``/``out_ptr`` point to the rows viewed as words of two ``FLOAT`` values (int64
    for float32 pairs, int32 for 16-bit floats; little-endian: ``x[2i]`` is the low
    half), strides in words. Each pair is one contiguous load, split by shifts and
    bitcasts in registers, so the loads are as wide as a copy's.
    """
    t_ok, mask, x_row, o_row, cos, sin = _tile(
        x_ptr, out_ptr, cos_ptr, sin_ptr, heads, length, t_blocks, sxb, sxh, sxt, sob, soh, sot,
        scb, sct, HALF, BLOCK_T, BLOCK_HALF, INVERSE,
    )  # fmt: skip
    i = tl.arange(0, BLOCK_HALF)  # [BLOCK_HALF]
    BITS: tl.constexpr = FLOAT.primitive_bitwidth
    half_int: tl.constexpr = tl.int32 if BITS == 32 else tl.int16
    word = x_ptr.dtype.element_ty
    w = tl.load(x_row + i[None, :], mask=mask, other=0)
    a = w.to(half_int).to(FLOAT, bitcast=True).to(cos.dtype)
    b_ = (w >> BITS).to(half_int).to(FLOAT, bitcast=True).to(cos.dtype)
    lo = (a * cos - b_ * sin).to(FLOAT).to(half_int, bitcast=True).to(word) & ((1 << BITS) - 1)
    hi = (a * sin + b_ * cos).to(FLOAT).to(half_int, bitcast=True).to(word) << BITS
    tl.store(o_row + i[None, :], hi | lo, mask=mask)
    if PASS > 0:  # partial rotary, out of place: copy the words past R
        _copy_rest(x_row, o_row, t_ok, 1, 1, HALF, PASS, BLOCK_PASS)


def _check(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    """Validate the arguments as ``posenc.apply_rope`` does, plus the device."""
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOATS:
            raise TypeError(f"{name} must be float64/32/16 or bfloat16, got dtype {t.dtype}")
    if x.dim() != 4 or cos.dim() not in (2, 3):
        raise ValueError(
            f"x must be [B, H, T, D] and cos/sin [T, R/2] or [B, T, R/2], "
            f"got shapes {tuple(x.shape)} and {tuple(cos.shape)}"
        )
    if cos.shape != sin.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ in shape")
    if cos.device != x.device or sin.device != x.device:
        raise ValueError(f"cos/sin are on {cos.device}/{sin.device} but x is on {x.device}")
    if not x.is_cuda and not isinstance(_rope_kernel, InterpretedFunction):
        raise ValueError(f"x is on {x.device}: the Triton kernels need CUDA tensors")
    if 2 * cos.shape[-1] > x.shape[-1]:
        raise ValueError(f"cos/sin rotate {2 * cos.shape[-1]} features, x has D={x.shape[-1]}")
    if cos.shape[-2] != x.shape[-2]:
        raise ValueError(f"cos/sin cover {cos.shape[-2]} positions but x has T={x.shape[-2]}")
    if cos.dim() == 3 and cos.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"cos/sin have batch {cos.shape[0]} but x has batch {x.shape[0]}")
    if cos.requires_grad or sin.requires_grad:
        raise ValueError(
            "posenc.triton.apply_rope is differentiable in x only, but cos/sin require grad; "
            "use posenc.apply_rope for learned angles"
        )


_WORDS = {torch.float32: torch.int64, torch.bfloat16: torch.int32, torch.float16: torch.int32}
_TRITON_FLOATS = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _as_words(t: Tensor) -> Tensor | None:
    """``t`` viewed as one integer word per interleaved pair, or None where it cannot be
    (float64, a last stride other than 1, odd strides or offset)."""
    if t.dtype not in _WORDS:
        return None
    try:
        return t.view(_WORDS[t.dtype])
    except RuntimeError:
        return None


def _launch(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, inverse: bool):
    """Write the rotation of ``x`` into ``out`` (``out is x``: in place)."""
    batch, heads, length, dim = x.shape
    if x.numel() == 0:
        return
    half = cos.shape[-1]
    compute = compute_dtype(x.dtype)
    cos, sin = cos.to(compute).contiguous(), sin.to(compute).contiguous()  # small tables
    batch_stride = cos.stride(0) if cos.dim() == 3 and cos.shape[0] > 1 else 0
    block_half = triton.next_power_of_2(max(half, 1))
    block_t = max(1, min(triton.next_power_of_2(length), _TILE // block_half))
    passed = 0 if out is x else dim - 2 * half
    t_blocks = triton.cdiv(length, block_t)
    grid = (batch * heads * t_blocks,)
    x_words = _as_words(x) if interleaved else None
    out_words = x_words if out is x else _as_words(out) if x_words is not None else None
    if out_words is not None:  # interleaved pairs as whole words
        _rope_words_kernel[grid](
            x_words, out_words, cos, sin, heads, length, t_blocks,
            *x_words.stride()[:3], *out_words.stride()[:3], batch_stride, cos.stride(-2),
            HALF=half,
            PASS=passed // 2,
            BLOCK_T=block_t,
            BLOCK_HALF=block_half,
            BLOCK_PASS=triton.next_power_of_2(max(passed // 2, 1)),
            FLOAT=_TRITON_FLOATS[x.dtype],
            INVERSE=inverse,
        )  # fmt: skip
        return
    _rope_kernel[grid](
        x, out, cos, sin, heads, length, t_blocks,
        *x.stride(), *out.stride(), batch_stride, cos.stride(-2),
        HALF=half,
        PASS=passed,
        BLOCK_T=block_t,
        BLOCK_HALF=block_half,
        BLOCK_PASS=triton.next_power_of_2(max(passed, 1)),
        INTERLEAVED=interleaved,
        INVERSE=inverse,
    )  # fmt: skip


_Rope = rotation_function(_launch)


def rope(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool, inplace: bool) -> Tensor:
    """``posenc.triton.apply_rope`` once Triton is imported (see there)."""
    _check(x, cos, sin)
    if inplace:
        check_no_overlap(x, hint="rotate a copy (inplace=False) instead")
        # tables that share x's memory are read as they were before the call
        cos = cos.clone() if shares_memory(x, cos) else cos
        sin = sin.clone() if shares_memory(x, sin) else sin
    if torch.is_grad_enabled() and x.requires_grad:
        return _Rope.apply(x, cos, sin, interleaved, inplace, False)
    out = x if inplace else torch.empty_like(x)
    _launch(out, x, cos, sin, interleaved, inverse=False)
    return out
