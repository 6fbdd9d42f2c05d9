"""Functional RoPE helpers: cos/sin of positions, re-rotation of cached keys, and the
permutation of q/k projection weights between the two pair layouts.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary_dim, ``C``
d_model. RoPE (Su et al. 2021, "RoFormer", sec. 3.2) rotates pair ``i`` at position
``m`` by ``m * inv_freq[i]``; the pairs are ``(i, i + R/2)`` in the half-split layout
and ``(2i, 2i + 1)`` in the interleaved one. Angles are formed in float64 (float32 on
devices without float64) and rounded once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import (
    check_bool,
    check_even,
    check_float,
    check_float_dtype,
    check_int,
    check_positions,
    check_tensor,
    float_positions,
    resolve_positions,
)
from posenc._dtypes import compute_dtype
from posenc.encodings.rotary.apply import apply_rope

__all__ = [
    "Frequencies",
    "rerotate_keys",
    "rope_cos_sin",
    "rope_weight_to_half_split",
    "rope_weight_to_interleaved",
]

Frequencies = tuple[Tensor, float]  # (inv_freq [R/2], attention_scale)


def _angle_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


def rope_cos_sin(
    positions: Tensor,
    inv_freq: Tensor,
    *,
    attention_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` of the angles ``positions[..., None] * inv_freq``, times ``attention_scale``.

    Args:
        positions: integer or float positions ``[...]`` (``[T]`` or ``[B, T]`` for
            ``apply_rope``), never float16/bfloat16.
        inv_freq: ``[R/2]`` inverse frequencies.
        attention_scale: multiplies cos and sin (YaRN / LongRoPE attention factor).
        dtype: dtype of the result; the angles are computed in float64 first.

    Returns:
        ``cos``, ``sin`` of shape ``[..., R/2]``.

    Raises:
        TypeError: non-tensor or half-precision / bool / complex positions, a
            non-floating ``dtype``.
        ValueError: a non-finite ``attention_scale``; an integer position beyond +-2**53
            (+-2**24 where the angles are float32, on MPS), which the angles would round.
    """
    positions = check_positions(positions)
    dtype = check_float_dtype("dtype", dtype)
    check_tensor("inv_freq", inv_freq, ndim=1)
    attention_scale = check_float("attention_scale", attention_scale)
    angle_dtype = _angle_dtype(positions.device)
    freqs = inv_freq.to(device=positions.device, dtype=angle_dtype)
    angles = float_positions(positions, angle_dtype).unsqueeze(-1) * freqs  # [..., R/2]
    cos, sin = angles.cos(), angles.sin()
    if attention_scale != 1.0:
        cos, sin = cos * attention_scale, sin * attention_scale
    return cos.to(dtype), sin.to(dtype)


def rerotate_keys(
    k: Tensor,
    positions: Tensor,
    *,
    old: Frequencies,
    new: Frequencies,
    interleaved: bool = False,
) -> Tensor:
    """Turn keys rotated with frequencies ``old`` into keys rotated with ``new``.

    Rotations about the same planes compose, so ``R_new R_old^-1`` is one rotation by
    ``positions * (inv_freq_new - inv_freq_old)``, scaled by ``scale_new / scale_old``.

    Args:
        k: cached keys ``[B, Hkv, T, D]`` rotated with ``old``.
        positions: their positions ``[T]`` or ``[B, T]``.
        old: ``(inv_freq, attention_scale)`` they were rotated with.
        new: ``(inv_freq, attention_scale)`` wanted (e.g. a ``FrequencyChange``'s ``new``).
        interleaved: the pair layout of ``k``.

    Returns:
        New keys of ``k``'s shape and dtype; ``k`` is not modified.

    Raises:
        ValueError: ``positions`` not of length ``T``; frequency lists of unequal lengths;
            a zero ``old`` attention scale.
        TypeError: ``k`` not a tensor; ``old`` or ``new`` not a pair (the name says which).
    """
    check_tensor("k", k, ndim=4)
    interleaved = check_bool("interleaved", interleaved)
    for name, pair in (("old", old), ("new", new)):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"{name} must be a pair (inv_freq, attention_scale), got {type(pair).__name__}"
            )
    (old_freq, old_scale), (new_freq, new_scale) = old, new
    check_tensor("old inv_freq", old_freq, ndim=1)
    check_tensor("new inv_freq", new_freq, ndim=1)
    old_scale = check_float("old attention_scale", old_scale)
    if old_scale == 0.0:
        raise ValueError("old attention_scale must be nonzero: keys scaled by 0 cannot be restored")
    if old_freq.shape != new_freq.shape:
        raise ValueError(
            f"old and new inv_freq differ in shape: {tuple(old_freq.shape)} "
            f"vs {tuple(new_freq.shape)}"
        )
    positions = resolve_positions(positions, k.shape[-2], batch=k.shape[0]).to(k.device)
    delta = new_freq.to(torch.float64) - old_freq.to(torch.float64)
    cos, sin = rope_cos_sin(
        positions, delta, attention_scale=new_scale / old_scale, dtype=compute_dtype(k.dtype)
    )
    return apply_rope(k, cos, sin, interleaved=interleaved)


def _permute_heads(
    weight: Tensor, num_heads: int, rotary_dim: int | None, *, to_interleaved: bool
) -> Tensor:
    check_tensor("weight", weight, ndim=(1, 2))
    num_heads = check_int("num_heads", num_heads)
    if weight.shape[0] % num_heads:
        raise ValueError(
            f"weight has {weight.shape[0]} output features, not a multiple of num_heads={num_heads}"
        )
    head_dim = check_even("head_dim", weight.shape[0] // num_heads)
    rotary_dim = head_dim if rotary_dim is None else check_even("rotary_dim", rotary_dim)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim={rotary_dim} exceeds head_dim={head_dim}")
    half = rotary_dim // 2
    pair = torch.arange(half)
    # interleaved feature 2i + t is half-split feature i + t * R/2
    from_half_split = torch.stack((pair, pair + half), dim=-1).flatten()
    order = torch.arange(head_dim)
    order[:rotary_dim] = from_half_split if to_interleaved else torch.argsort(from_half_split)
    rows = (torch.arange(num_heads).unsqueeze(-1) * head_dim + order).flatten()  # [H * D]
    return weight[rows.to(weight.device)]


def rope_weight_to_interleaved(
    weight: Tensor, num_heads: int, *, rotary_dim: int | None = None
) -> Tensor:
    """Reorder q/k projection rows from the half-split layout to the interleaved one.

    Interleaved RoPE on ``x @ W'.T`` equals half-split RoPE on ``x @ W.T`` with the
    features of each head reordered the same way, so attention scores are unchanged.

    Args:
        weight: ``[H * D, C]`` projection weight (``nn.Linear.weight``) or ``[H * D]`` bias.
        num_heads: heads in this projection (key/value heads for ``k_proj``).
        rotary_dim: rotated features per head (default ``D``); the rest stay in place.

    Returns:
        A new tensor of ``weight``'s shape.

    Raises:
        ValueError: rows not a multiple of ``num_heads``; odd ``D`` or ``rotary_dim``;
            ``rotary_dim > D``.
    """
    return _permute_heads(weight, num_heads, rotary_dim, to_interleaved=True)


def rope_weight_to_half_split(
    weight: Tensor, num_heads: int, *, rotary_dim: int | None = None
) -> Tensor:
    """Inverse of ``rope_weight_to_interleaved``: the permutation Hugging Face's Llama
    conversion applies to Meta's (interleaved) ``wq``/``wk`` checkpoints.

    Args, Returns and Raises as ``rope_weight_to_interleaved``.
    """
    return _permute_heads(weight, num_heads, rotary_dim, to_interleaved=False)
