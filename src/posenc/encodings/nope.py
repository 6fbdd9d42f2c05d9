"""NoPE: no positional encoding at all (Kazemnejad et al. 2023, "The Impact of
Positional Encoding on Length Generalization in Transformers").

A causal decoder can still infer position from the mask alone; NoPE is the baseline every
other encoding is compared against. Shapes: ``B`` batch, ``T`` length, ``C`` d_model.
"""

from __future__ import annotations

from torch import Tensor

from posenc.base import PositionalEncoding, Site, register

__all__ = ["NoPE"]


@register(
    "nope",
    paper="Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization",
    description="no positional signal; a causal mask alone lets the model infer order",
)
class NoPE(PositionalEncoding):
    """The identity encoding: every hook leaves its input unchanged."""

    sites = Site.NONE

    def __init__(self) -> None:  # explicit: ``build`` passes only the keywords it takes
        super().__init__()

    def forward(
        self, x: Tensor, k: Tensor | None = None, positions: Tensor | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The identity under both calls: ``nope(x [B, T, C], positions)`` returns ``x``
        (the INPUT call of sinusoidal and learned); ``nope(q, k, positions=...)`` returns
        ``(q, k)`` (the call of the rotating encodings, for a NoPE layer of a model).
        Positions are accepted and ignored."""
        if isinstance(k, Tensor) and k.dim() == 4 and x.dim() == 4:
            return x, k
        return x
