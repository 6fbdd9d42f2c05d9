"""PyTorch's fused CPU attention kernels for one block of ring attention: the forward that
returns its log-sum-exp, and the backward that takes the *global* output and log-sum-exp
(Dao 2023, "FlashAttention-2", Algorithms 1 and 2: the backward recomputes
``P = exp(S - lse)`` and ``D = rowsum(dO * O)`` from what it is given, so a block's share of
the gradient needs only the merged ``O`` and ``lse`` of its rows).

Shapes: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``Tb`` the block's
queries, ``Tk`` the block's keys, ``D`` head_dim.

The kernels (``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward) take
the bias and the mask as one additive float mask and give no gradient for it, so the ring
runs its forward here when the encoding has no value term, and its backward when, besides,
the bias depends on positions only and has no parameter to train (RoPE, NoPE, ALiBi, a
frozen T5); the eager formula serves the rest. A query without a visible key gets the
kernel's zeros, and ``-inf`` as its log-sum-exp here (the kernel reports 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["fold_heads", "fused_backward", "fused_forward"]

_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def fused_forward(
    q: Tensor, k: Tensor, v: Tensor, additive: Tensor | None, mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``(m, l_sum, acc)`` of ``q [B, H, Tb, D]`` over ``k, v [B, H, Tk, D]`` with the float
    mask ``additive`` (bias and ``-inf``; None: none) and the bool ``mask [B|1, 1, Tb, Tk]``
    it was made with (None: every key visible), as the online softmax merges them:
    ``m = lse``, ``l_sum = 1`` and ``acc = out`` for a row that sees a key."""
    out, lse = _FORWARD(q, k, v, attn_mask=additive, scale=scale)  # [B, H, Tb, D], [B, H, Tb]
    if mask is None:
        return lse, torch.ones_like(lse), out
    seen = mask.any(-1).expand_as(lse)  # [B, H, Tb]
    hidden = torch.full_like(lse, float("-inf"))
    return torch.where(seen, lse, hidden), seen.to(lse.dtype), out


def fused_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    additive: Tensor | None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of one block (``[B, H, *, D]``) given the rows' merged output ``out``
    and log-sum-exp ``lse`` over every key of the ring."""
    return _BACKWARD(grad_out, q, k, v, out, lse, 0.0, False, attn_mask=additive, scale=scale)


def fold_heads(grad: Tensor, kv_heads: int) -> Tensor:
    """Sum the gradient ``[B, H, T, D]`` of keys expanded to ``H`` heads (``repeat_kv``)
    back onto their ``Hkv`` heads: ``[B, Hkv, T, D]``."""
    batch, heads, length, dim = grad.shape
    if heads == kv_heads:
        return grad
    return grad.view(batch, kv_heads, heads // kv_heads, length, dim).sum(2)
