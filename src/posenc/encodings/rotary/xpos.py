"""xPos: RoPE with an exponential decay (Sun et al. 2022, "A Length-Extrapolatable
Transformer", sec. 3.2).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary_dim. On top of
the RoPE rotation, pair ``i`` of a query at position ``n`` is scaled by
``zeta_i ** (n / scale_base)`` and that of a key by ``zeta_i ** (-n / scale_base)``, with
``zeta_i = (2i + 0.4 R) / (1.4 R)`` in ``(0, 1)``: the score of a query at ``m`` and a
key at ``n`` carries ``zeta_i ** ((m - n) / scale_base)``, a decay with distance that
depends on ``m - n`` only.

Since a per-pair scale commutes with the pair's rotation, it is folded into cos and sin
and applied by ``apply_rope``. The scales are computed in float64 and cast once; keys
grow as ``zeta_0 ** (-n / scale_base)``, which stays finite in float32/bf16 for
``|n| <~ 70 * scale_base`` (the scores depend on ``m - n`` only, so shifting all
positions by the same amount changes nothing but this range).

Negative positions: allowed, as for RoPE; the scores still depend on ``m - n`` only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_even, check_float, check_positions
from posenc.base import register
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.encodings.rotary.scaling import DEFAULT_BASE

__all__ = ["XPos", "xpos_scale"]


def xpos_scale(positions: Tensor, rotary_dim: int, *, scale_base: float = 512.0) -> Tensor:
    """Per-pair query scales ``zeta_i ** (positions / scale_base)``, float64 ``[..., R/2]``.

    Keys use ``xpos_scale(-positions, ...)``.

    Raises:
        ValueError: odd ``rotary_dim``, non-positive ``scale_base``.
    """
    positions = check_positions(positions)
    rotary_dim = check_even("rotary_dim", rotary_dim)
    scale_base = check_float("scale_base", scale_base, positive=True)
    pair = torch.arange(rotary_dim // 2, dtype=torch.float64, device=positions.device)
    log_zeta = torch.log((2 * pair + 0.4 * rotary_dim) / (1.4 * rotary_dim))  # [R/2]
    exponent = positions.to(torch.float64).unsqueeze(-1) / scale_base  # [..., 1]
    return torch.exp(exponent * log_zeta)


@register(
    "xpos",
    paper="Sun et al. 2022, A Length-Extrapolatable Transformer (sec. 3.2)",
    description="RoPE whose query/key pairs also decay as zeta ** (distance / scale_base)",
)
class XPos(RotaryEmbedding):
    """xPos on queries and keys; everything else as ``RotaryEmbedding``.

    Args:
        head_dim: ``D``, even.
        base: the RoPE base.
        scale_base: the decay length (512 in the paper's code).
        rotary_dim: ``R``, rotated features (default ``D``).
        interleaved: pair layout, as in ``RotaryEmbedding``.
        max_len: cos/sin cache length built up front.

    Raises:
        ValueError: odd ``head_dim`` / ``rotary_dim``, ``rotary_dim > head_dim``,
            non-positive ``scale_base``.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = DEFAULT_BASE,
        scale_base: float = 512.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        max_len: int = 2048,
    ) -> None:
        super().__init__(
            head_dim, base=base, rotary_dim=rotary_dim, interleaved=interleaved, max_len=max_len
        )
        self.scale_base = check_float("scale_base", scale_base, positive=True)

    def _modulate(
        self, cos: Tensor, sin: Tensor, positions: Tensor, *, query: bool
    ) -> tuple[Tensor, Tensor]:
        signed = positions if query else -positions
        scale = xpos_scale(signed, self.rotary_dim, scale_base=self.scale_base).to(cos.dtype)
        return cos * scale, sin * scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_base={self.scale_base}"
