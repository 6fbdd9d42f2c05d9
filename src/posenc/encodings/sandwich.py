"""Sandwich (Chi, Fan, Rudnicky and Ramadge 2023, "Dissecting Transformer Length
Extrapolation via the Lens of Receptive Field Analysis", sec. 5).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys. Sandwich keeps only the
position-position term of the sinusoidal encoding inside ``q . k``: the inner product
of two sinusoidal embeddings of dimension ``d'``,

    p_i . p_j = sum_{k=1}^{d'/2} cos((i - j) * w_k),       w_k = 10000 ** (-2k / d'),

which depends on ``i - j`` only and decays roughly logarithmically with distance. What is
implemented, head ``h = 1..H``:

    b_h(i, j) = (p_i . p_j - d'/2) / (8h / H)
              = -(2 / (8h / H)) * sum_{k=1}^{d'/2} sin((i - j) * w_k / 2) ** 2

i.e. the inner product shifted so that ``b(i, i) = 0`` (a constant per row, which the
softmax ignores) and divided by ALiBi's head ratio ``8h / H`` so that heads see different
effective ranges (this per-head compression follows NVIDIA NeMo's implementation of
Sandwich). ``d'`` (``dim``) is a hyperparameter independent of the model width (128 by
default). The sum uses the half-angle form (no cancellation near the diagonal) with
angles in float64, rounded once to the output dtype; there are no parameters.

Negative positions: allowed; the bias depends on ``q_pos - k_pos`` only, so positions
shifted below zero give the same bias.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_even, check_int
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings._relative import (
    ScoreMod,
    check_hook_inputs,
    check_position_pair,
    offset_score_mod,
    per_head,
    toeplitz_bias,
)

__all__ = ["Sandwich", "sandwich_bias"]

#: Elements of the ``[..., d'/2]`` angle tensor evaluated at once on the general path.
_CHUNK_ELEMENTS = 1 << 22


def _sandwich_fn(num_heads: int, dim: int):
    k = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
    half_freq = 0.5 * torch.pow(10000.0, -2.0 * k / dim)  # w_k / 2
    head_scale = num_heads / (8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64))

    def fn(d: Tensor, dtype: torch.dtype) -> Tensor:
        x = d.to(torch.float64).unsqueeze(-1)  # [N0, 1, N1, N2, 1]
        per_chunk = max(1, _CHUNK_ELEMENTS // max(d.numel(), 1))
        total = torch.zeros(d.shape, dtype=torch.float64, device=d.device)
        for w in half_freq.to(d.device).split(per_chunk):
            total = total + torch.sin(x * w).square().sum(-1)
        bias = per_head(head_scale.to(d.device), torch.float64) * (-2.0 * total)
        return bias.to(dtype)  # [N0, H, N1, N2]

    return fn


def sandwich_bias(
    q_pos: Tensor,
    k_pos: Tensor,
    num_heads: int,
    *,
    dim: int = 128,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Sandwich bias for explicit positions.

    Args:
        q_pos: ``[Tq]`` or ``[B, Tq]`` positions (integer or float).
        k_pos: ``[Tk]`` or ``[B, Tk]`` positions.
        num_heads: ``H``.
        dim: ``d'``, the (even) dimension of the sinusoidal embeddings.
        dtype: output dtype.

    Returns:
        ``[B|1, H, Tq, Tk]``.

    Raises:
        ValueError: ``num_heads < 1``, or ``dim`` odd or < 2.
    """
    num_heads = check_int("num_heads", num_heads)
    dim = check_even("dim", dim)
    q_pos, k_pos = check_position_pair(q_pos, k_pos)
    return toeplitz_bias(_sandwich_fn(num_heads, dim), q_pos, k_pos, dtype)


@register(
    "sandwich",
    paper="Chi et al. 2023, Dissecting Transformer Length Extrapolation (Sandwich)",
    description="parameter-free sinusoidal inner product p_i . p_j as a per-head logits bias",
)
class Sandwich(PositionalEncoding):
    """Sandwich as a SCORE-site encoding (no parameters).

    Args:
        num_heads: ``H``.
        dim: ``d'``, the even dimension of the sinusoidal embeddings (128).

    Raises:
        ValueError: ``num_heads < 1``, or ``dim`` odd or < 2.
    """

    sites = Site.SCORE
    offset_only = True

    def __init__(self, num_heads: int, *, dim: int = 128) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        self.dim = check_even("dim", dim)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``[B|1, H, Tq, Tk]`` bias in ``q``'s dtype."""
        q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos, num_heads=self.num_heads)
        return toeplitz_bias(_sandwich_fn(self.num_heads, self.dim), q_pos, k_pos, q.dtype)

    def score_mod(self) -> ScoreMod:
        """FlexAttention ``score_mod`` adding this bias (query/key indices as positions);
        for eager ``flex_attention`` (see ``offset_score_mod``)."""
        return offset_score_mod(_sandwich_fn(self.num_heads, self.dim))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, dim={self.dim}"
