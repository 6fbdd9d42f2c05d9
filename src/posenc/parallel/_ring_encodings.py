"""What ring attention asks of an encoding: that its (query block, key block) pairs be
independent of each other (``check_splittable``), its rotation pinned to the whole
sequence's length (``observe_length``), and which parameters its bias and value term read
(``kernel_parameters``).

Shapes: ``T`` tokens. The logit of a pair ``(i, j)`` may depend on the two tokens, their
global positions and the encoding's parameters, not on the keys between them: CoPE's
contextual positions (Golovneva et al. 2024, eq. (3)) and the WEIGHTS-site encodings'
weights (forget gates, stick-breaking, PaTH's Householder products, dual-chunk's chunks) do,
and are refused by name.
"""

from __future__ import annotations

from torch import Tensor

from posenc.base import Compose, PositionalEncoding, Site

__all__ = [
    "REFUSED",
    "check_splittable",
    "kernel_parameters",
    "observe_length",
    "position_only_bias",
]

#: Why an encoding cannot be split into (query block, key block) pairs, by class name.
REFUSED = {
    "CoPE": "its contextual position p_ij sums the gates of every key between key j and "
    "query i, keys that other ranks hold",
    "ForgettingAttention": "its forget gates are a cumulative product along the sequence",
    "StickBreakingAttention": "each weight is a product over every later key up to the query",
    "PaTH": "its Householder products run over every key between the key and the query",
    "DualChunkAttention": "its chunked position rules read the whole sequence's chunks",
}


def check_splittable(position: PositionalEncoding, *, causal: bool) -> PositionalEncoding:
    """Return ``position`` if ring attention can split it into blocks (with ``causal``).

    Raises:
        ValueError: an encoding that needs state carried across blocks or computes its
            weights itself (named, with the reason); a causal-only encoding without ``causal``.
        TypeError: ``position`` is not a ``PositionalEncoding``.
    """
    if not isinstance(position, PositionalEncoding):
        raise TypeError(
            f"position must be a PositionalEncoding or None, got {type(position).__name__}"
        )
    parts = position.encodings if isinstance(position, Compose) else [position]
    for part in parts:
        name = type(part).__name__
        if name in REFUSED or part.sites & Site.WEIGHTS:
            why = REFUSED.get(name, "it computes the attention weights itself (WEIGHTS site)")
            raise ValueError(
                f"ring attention cannot split {name} into blocks: {why}; run it unsplit"
            )
    if position.causal_only and not causal:
        raise ValueError(f"{type(position).__name__} is only defined for causal attention")
    return position


def observe_length(position: PositionalEncoding, length: int) -> None:
    """Pin length-dependent rotations (dynamic NTK, LongRoPE) to the whole sequence's
    length, which a shard alone would not reach."""
    parts = position.encodings if isinstance(position, Compose) else [position]
    for part in parts:
        observe = getattr(part, "observe_length", None)
        if callable(observe):
            observe(length)


def kernel_parameters(position: PositionalEncoding) -> list[Tensor]:
    """The parameters of the SCORE and VALUE hooks (the rotation's are differentiated by
    autograd outside the ring)."""
    parts = position.encodings if isinstance(position, Compose) else [position]
    kernel = [part for part in parts if part.sites & (Site.SCORE | Site.VALUE)]
    return [p for part in kernel for p in part.parameters()]


def position_only_bias(position: PositionalEncoding) -> bool:
    """Whether every SCORE part's bias depends on positions only, not on the queries and keys
    (``offset_only`` or ``positional_bias``: ALiBi, T5, KERPLE, Sandwich, FIRE), so that its
    gradient reaches no input."""
    parts = position.encodings if isinstance(position, Compose) else [position]
    return all(p.offset_only or p.positional_bias for p in parts if p.sites & Site.SCORE)
