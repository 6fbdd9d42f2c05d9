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
"""

from __future__ import annotations

from torch import Tensor

from posenc._checks import check_tensor

__all__ = ["apply_rope"]


def _check(x: Tensor, cos: Tensor, sin: Tensor) -> int:
    """Validate shapes; return the rotary dim ``R``."""
    check_tensor("x", x, ndim=4)
    check_tensor("cos", cos, ndim=(2, 3))
    check_tensor("sin", sin, ndim=(2, 3))
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"cos/sin rotate {rotary_dim} features but x has head_dim {x.shape[-1]}")
    if cos.shape[-2] != x.shape[-2]:
        raise ValueError(f"cos/sin cover {cos.shape[-2]} positions but x has T={x.shape[-2]}")
    if cos.dim() == 3 and cos.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"cos/sin have batch {cos.shape[0]} but x has batch {x.shape[0]}")
    return rotary_dim


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False) -> Tensor:
    """Rotate ``x [B, H, T, D]`` by ``cos``/``sin`` ``[T, R/2] | [B, T, R/2]``.

    Returns a new tensor of ``x``'s shape and dtype; ``x`` is not modified. The product
    is formed in ``x``'s dtype, with ``cos``/``sin`` cast to it (they are computed from
    float32-or-better angles by ``RotaryEmbedding``).

    Raises:
        ValueError: mismatched shapes, or ``R > D``.
        TypeError: non-floating inputs.
    """
    rotary_dim = _check(x, cos, sin)
    half = rotary_dim // 2
    if cos.dim() == 3:  # [B, T, R/2] -> [B, 1, T, R/2]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    out = x.clone()
    if interleaved:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        out[..., 0:rotary_dim:2] = a * cos - b * sin
        out[..., 1:rotary_dim:2] = a * sin + b * cos
    else:
        a, b = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rotary_dim] = a * sin + b * cos
    return out
