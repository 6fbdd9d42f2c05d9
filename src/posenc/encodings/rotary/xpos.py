"""xPos: RoPE with an exponential decay (Sun et al. 2022, "A Length-Extrapolatable
Transformer", sec. 3.2).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary_dim. On top of
the RoPE rotation, pair ``i`` of a query at position ``n`` is scaled by
``zeta_i ** (n / scale_base)`` and that of a key by ``zeta_i ** (-n / scale_base)``, with
``zeta_i = (2i + 0.4 R) / (1.4 R)`` in ``(0, 1)``: the score of a query at ``m`` and a
key at ``n`` carries ``zeta_i ** ((m - n) / scale_base)``, a decay with distance that
depends on ``m - n`` only.

Since a per-pair scale commutes with the pair's rotation, it is folded into cos and sin
and applied by ``apply_rope``. The scales are computed in float64 and cast once to the
rotation's dtype. Keys grow as ``zeta_0 ** (-n / scale_base)`` and queries shrink as
``zeta_0 ** (n / scale_base)`` (``zeta_0 = 2/7``), so past ``xpos_position_limit``
(``scale_base * (ln(1 / tiny) - ln(1 / eps)) / ln 3.5``: 29 174 for float32 and
``scale_base`` 512) one of them loses precision, then leaves the dtype's range, and their
product becomes ``0 * inf = NaN``. Positions
past the limit raise ``ValueError`` naming it (eager calls; a compiled graph cannot read
the positions without a host sync and does not check). The scores depend on ``m - n``
only, so shifting all positions by the same amount brings them back in range.

Negative positions: allowed, as for RoPE; the scores still depend on ``m - n`` only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc._checks import check_even, check_float, check_positions, float_positions
from posenc.base import register
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.encodings.rotary.scaling import DEFAULT_BASE

__all__ = ["XPos", "xpos_position_limit", "xpos_scale"]


def xpos_position_limit(scale_base: float, dtype: torch.dtype) -> int:
    """The largest ``|position|`` whose xPos scales keep full precision in ``dtype``.

    ``zeta_0 ** (+-n / scale_base)`` with ``zeta_0 = 2/7`` (pair 0, the fastest decay)
    must lie in ``[tiny / eps, max * eps]`` of ``dtype``, so that the scale times a cos or
    sin down to ``eps`` is still a normal number: ``|n| <= scale_base * (min(ln(1 / tiny),
    ln(max)) - ln(1 / eps)) / ln(3.5)``.

    Raises:
        ValueError: non-positive ``scale_base``.
    """
    scale_base = check_float("scale_base", scale_base, positive=True)
    info = torch.finfo(dtype)
    room = min(-math.log(info.tiny), math.log(info.max)) + math.log(info.eps)
    return math.floor(scale_base * room / math.log(3.5))


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
    exponent = float_positions(positions, torch.float64).unsqueeze(-1) / scale_base  # [..., 1]
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
        if positions.numel() and not torch.compiler.is_compiling():
            limit = xpos_position_limit(self.scale_base, cos.dtype)
            far = float(positions.abs().max())
            if far > limit:
                raise ValueError(
                    f"xPos positions must lie within +-{limit} for scale_base="
                    f"{self.scale_base:g} in {str(cos.dtype).removeprefix('torch.')} (the "
                    f"scales zeta ** (+-n / scale_base) leave its range), got {far:g}; shift "
                    "every position by one amount (scores depend on m - n only) or use a "
                    "larger scale_base"
                )
        signed = positions if query else -positions
        scale = xpos_scale(signed, self.rotary_dim, scale_base=self.scale_base).to(cos.dtype)
        return cos * scale, sin * scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_base={self.scale_base}"
