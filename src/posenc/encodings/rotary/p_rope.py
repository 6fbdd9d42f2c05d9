"""p-RoPE (Barbero, Vitvitskyi, Perivolaropoulos, Pascanu and Velickovic 2025, "Round and
Round We Go! What makes Rotary Positional Encodings useful?", ICLR 2025, sec. 6).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``p`` the kept fraction.
RoPE whose lowest frequencies are removed: the first ``K = int(p * D // 2)`` pairs (the
highest frequencies) rotate as in RoPE, ``theta_i = base ** (-2i / D)``, and the other
``D/2 - K`` pairs get frequency 0, so they carry content without position (the paper's
``apply_p_rope``: the denominator stays ``D``). ``p = 1`` is RoPE, ``p = 0`` is NoPE, and
for every ``p`` the score ``<R_m q, R_n k>`` depends on ``m - n`` only. The paper trains
Gemma 2B models with ``p = 0.25`` and ``0.75`` and finds 0.75 the best; it is the default.

The frequencies are ``ProportionalScaling``'s (Gemma 4's ``rope_type: "proportional"``
uses the same truncation), so the rotation is ``RotaryEmbedding``'s, kernel included.
"""

from __future__ import annotations

from posenc._checks import check_float
from posenc.base import register
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.encodings.rotary.proportional import ProportionalScaling
from posenc.encodings.rotary.scaling import DEFAULT_BASE

__all__ = ["DEFAULT_FRACTION", "PRoPE"]

#: The paper's best fraction (Table 2: 0.75-RoPE has the lowest validation perplexity).
DEFAULT_FRACTION = 0.75


@register(
    "p_rope",
    paper="Barbero et al. 2025, Round and Round We Go! What makes Rotary Positional "
    "Encodings useful? (ICLR, sec. 6)",
    description="RoPE on the highest-frequency fraction p of the pairs, the rest "
    "position-free (p=1: RoPE, p=0: NoPE)",
)
class PRoPE(RotaryEmbedding):
    """p-RoPE: RoPE with the lowest ``1 - p`` of the frequencies set to zero.

    Args:
        head_dim: ``D``, even.
        fraction: ``p`` in [0, 1], the fraction of pairs that rotate (the highest
            frequencies).
        base: the RoPE base ``theta``.
        interleaved: pair layout, as ``RotaryEmbedding``.
        max_len: cos/sin cache length built up front.

    Raises:
        ValueError: odd ``head_dim``; ``fraction`` outside [0, 1] or not finite.
        TypeError: a non-real ``fraction``.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        fraction: float = DEFAULT_FRACTION,
        base: float = DEFAULT_BASE,
        interleaved: bool = False,
        max_len: int = 2048,
    ) -> None:
        fraction = check_float("p_rope fraction", fraction, minimum=0.0)
        if fraction > 1.0:
            raise ValueError(f"p_rope fraction must be in [0, 1], got {fraction}")
        scaling = ProportionalScaling(partial_rotary_factor=fraction)
        super().__init__(
            head_dim, base=base, scaling=scaling, interleaved=interleaved, max_len=max_len
        )
        self.fraction = fraction

    @property
    def kept_pairs(self) -> int:
        """``K``, the number of pairs that rotate."""
        return int(self.fraction * self.head_dim // 2)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, fraction={self.fraction}, base={self.base}"
