"""Relative position representations (Shaw, Uszkoreit and Vaswani 2018, "Self-Attention
with Relative Position Representations", eqs. 3-5).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim, ``K``
max_relative_position. Two learned tables ``w^K, w^V [2K + 1, D]``, shared by all heads
(sec. 3.3), hold one vector per clipped offset ``clip(j - i, -K, K)``:

    e_ij = q_i . (k_j + a^K_ij) / sqrt(D),     a^K_ij = w^K[clip(j - i, -K, K) + K]
    z_i  = sum_j alpha_ij (v_j + a^V_ij),      a^V_ij = w^V[clip(j - i, -K, K) + K]

(eq. 5 and eq. 3), with ``i``/``j`` the query/key positions. The attention module scales
``q . k`` by ``1 / sqrt(D)`` and adds ``score_bias`` after that scaling, so ``score_bias``
returns ``q_i . a^K_ij / sqrt(D)`` (scaled here); ``value_term`` returns
``sum_j alpha_ij a^V_ij``.

Neither term materializes ``[B, H, Tq, Tk, D]``: the score term computes ``q . w^K`` for the
``2K + 1`` distinct vectors (``[B, H, Tq, 2K + 1]``) and gathers it by clipped offset; the
value term scatter-adds the probabilities into the ``2K + 1`` offset buckets (accumulated
in float32) and multiplies by ``w^V``.

Negative positions: allowed; the bias depends on ``q_pos - k_pos`` only, so positions
shifted below zero give the same bias.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc._checks import check_int, check_tensor
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings._relative import (
    check_hook_inputs,
    check_position_pair,
    offsets,
    require_integer,
)

__all__ = [
    "ShawRelativePosition",
    "shaw_band_value",
    "shaw_relative_index",
    "shaw_score_bias",
    "shaw_value_term",
]


def shaw_relative_index(q_pos: Tensor, k_pos: Tensor, max_relative_position: int) -> Tensor:
    """Row of ``w`` used by each query/key pair: ``clip(j - i, -K, K) + K``.

    Args:
        q_pos: ``[Tq]`` or ``[B, Tq]`` integer positions ``i``.
        k_pos: ``[Tk]`` or ``[B, Tk]`` integer positions ``j``.
        max_relative_position: ``K >= 1``.

    Returns:
        int64 ``[B|1, 1, Tq, Tk]`` in ``[0, 2K]``.

    Raises:
        TypeError: float positions. ValueError: bad ranks or ``K < 1``.
    """
    clip = check_int("max_relative_position", max_relative_position)
    q_pos, k_pos = check_position_pair(q_pos, k_pos)
    require_integer("Shaw relative positions", q_pos, k_pos)
    return (-offsets(q_pos, k_pos)).clamp(-clip, clip) + clip


def _check_table(name: str, table: Tensor, head_dim: int | None = None) -> int:
    check_tensor(name, table, ndim=2)
    rows = table.shape[0]
    if rows % 2 == 0 or (head_dim is not None and table.shape[1] != head_dim):
        raise ValueError(
            f"{name} must be [2K + 1, head_dim]"
            f"{'' if head_dim is None else f' with head_dim={head_dim}'}, "
            f"got {tuple(table.shape)}"
        )
    return (rows - 1) // 2


def _expand_index(index: Tensor, shape: torch.Size, num_keys: int | None = None) -> Tensor:
    """``index [B|1, 1, Tq, Tk]`` expanded to ``[B, H, Tq, Tk]`` for a ``shape [B, H, Tq, *]``."""
    batch, heads, tq = shape[:3]
    tk = index.shape[-1] if num_keys is None else num_keys
    if index.shape[0] not in (1, batch) or index.shape[2] != tq or index.shape[3] != tk:
        raise ValueError(
            f"positions give {index.shape[0]} x {index.shape[2]} x {index.shape[3]} "
            f"(batch x queries x keys) offsets, expected batch {batch} (or 1), {tq} queries "
            f"and {tk} keys"
        )
    return index.expand(batch, heads, tq, tk)


def shaw_score_bias(q: Tensor, q_pos: Tensor, k_pos: Tensor, key_table: Tensor) -> Tensor:
    """Shaw's key term ``q_i . a^K_ij / sqrt(D)``, in logits units.

    Args:
        q: ``[B, H, Tq, D]`` queries.
        q_pos: ``[Tq]`` or ``[B, Tq]`` integer positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` integer positions.
        key_table: ``w^K [2K + 1, D]``.

    Returns:
        ``[B, H, Tq, Tk]`` in ``q``'s dtype.

    Raises:
        ValueError: wrong ranks, an even number of table rows, or mismatched ``D``.
    """
    check_tensor("q", q, ndim=4)
    clip = _check_table("key_table", key_table, q.shape[-1])
    index = _expand_index(shaw_relative_index(q_pos, k_pos, clip), q.shape)
    per_offset = torch.matmul(q, key_table.to(q.dtype).T) * q.shape[-1] ** -0.5
    return per_offset.gather(-1, index)  # [B, H, Tq, 2K + 1] -> [B, H, Tq, Tk]


def shaw_value_term(probs: Tensor, q_pos: Tensor, k_pos: Tensor, value_table: Tensor) -> Tensor:
    """Shaw's value term ``sum_j alpha_ij a^V_ij``.

    Args:
        probs: ``[B, H, Tq, Tk]`` attention probabilities ``alpha``.
        q_pos: ``[Tq]`` or ``[B, Tq]`` integer positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` integer positions.
        value_table: ``w^V [2K + 1, D]``.

    Returns:
        ``[B, H, Tq, D]`` in ``probs``' dtype (accumulated in float32 at least).

    Raises:
        ValueError: wrong ranks or an even number of table rows.
    """
    check_tensor("probs", probs, ndim=4)
    clip = _check_table("value_table", value_table)
    index = _expand_index(shaw_relative_index(q_pos, k_pos, clip), probs.shape, probs.shape[-1])
    work = compute_dtype(probs.dtype)
    buckets = probs.new_zeros((*probs.shape[:-1], 2 * clip + 1), dtype=work)
    buckets = buckets.scatter_add(-1, index, probs.to(work))  # [B, H, Tq, 2K + 1]
    return torch.matmul(buckets, value_table.to(work)).to(probs.dtype)


def shaw_band_value(band: Tensor, value_table: Tensor) -> Tensor:
    """Shaw's value term under a causal mask at consecutive positions, from the
    probabilities of the ``K`` keys nearest the diagonal: ``band [..., T, K]`` holds
    ``p_(i, i-d)`` at ``d`` (0 for ``d > i``). Row ``K - d`` of ``w^V`` is offset ``-d`` and
    every farther key shares row 0 (offset ``-K``), so, the probabilities summing to 1,
    ``sum_j p_ij w^V[clip(j - i)] = w^V[0] + sum_d p_(i, i-d) (w^V[K - d] - w^V[0])``.

    Args:
        band: ``[..., T, K]`` probabilities.
        value_table: ``w^V [2K + 1, D]``.

    Returns:
        ``[..., T, D]``.
    """
    clip = band.shape[-1]
    near = clip - torch.arange(clip, device=band.device)  # rows K - d
    return value_table[0] + torch.matmul(band, value_table[near] - value_table[0])


@register(
    "shaw",
    paper="Shaw et al. 2018, Self-Attention with Relative Position Representations",
    description="learned clipped relative vectors added to keys (scores) and values",
)
class ShawRelativePosition(PositionalEncoding):
    """Shaw et al.'s key and value relative representations (SCORE and VALUE sites).

    Args:
        head_dim: ``D``.
        max_relative_position: clip distance ``K`` (16 by default; the paper found
            ``K >= 2`` enough for translation).

    Raises:
        ValueError: ``head_dim < 1`` or ``max_relative_position < 1``.
    """

    sites = Site.SCORE | Site.VALUE

    def __init__(self, head_dim: int, *, max_relative_position: int = 16) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.max_relative_position = check_int("max_relative_position", max_relative_position)
        rows = 2 * self.max_relative_position + 1
        self.key_table = nn.Parameter(torch.randn(rows, self.head_dim) * 0.02)
        self.value_table = nn.Parameter(torch.randn(rows, self.head_dim) * 0.02)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``q . a^K / sqrt(D)``, ``[B, H, Tq, Tk]`` in ``q``'s dtype."""
        q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos, module=self)
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head_dim {q.shape[-1]}, expected {self.head_dim}")
        return shaw_score_bias(q, q_pos, k_pos, self.key_table)

    def value_term(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``sum_j alpha_ij a^V_ij``, ``[B, H, Tq, D]`` in ``probs``' dtype."""
        return shaw_value_term(probs, q_pos, k_pos, self.value_table)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_relative_position={self.max_relative_position}"
