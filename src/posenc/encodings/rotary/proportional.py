"""Proportional RoPE ("p-RoPE", Gemma 4): a fraction of the pairs rotates, the rest keep a
zero frequency, and the pairs span the whole head.

Shapes: ``D`` head_dim, ``p`` the kept fraction (``partial_rotary_factor``), ``s`` the
factor. Barbero et al. 2024 ("Round and Round We Go! What makes Rotary Positional
Encodings useful?", sec. 6) keep the lowest-index (highest-frequency) pairs of RoPE and
set the others to frequency zero; as transformers defines it for Gemma 4, with
``K = int(p * D // 2)`` kept pairs:

    inv_freq_i = base ** (-2i / D) / s    for i < K     (denominator D, not 2K)
    inv_freq_i = 0                        for K <= i < D/2

The rotation is the ordinary half-split RoPE over all ``D`` features (pairs ``(i, i + D/2)``),
so a zero-frequency pair passes through unchanged (cos 1, sin 0). Unlike partial rotary
(``partial_rotary_factor`` of other rope types, which rotates the first ``p D`` features
with frequencies of denominator ``p D``), ``partial_rotary_factor`` here is a parameter of
the frequencies and the rotary dim stays ``D``. Attention scale 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from posenc._checks import check_float
from posenc.encodings.rotary.scaling import RopeScaling, base_inv_freq, register_scaling

__all__ = ["ProportionalScaling", "proportional_inv_freq"]


@dataclass(frozen=True)
class ProportionalScaling(RopeScaling):
    """Gemma 4's ``rope_type: "proportional"`` parameters.

    Attributes:
        partial_rotary_factor: the kept fraction ``p`` in [0, 1] (0: no pair rotates, NoPE).
        factor: divides every frequency (1: none).
    """

    rope_type: ClassVar[str] = "proportional"
    rotates_full_head: ClassVar[bool] = True
    partial_rotary_factor: float = 1.0
    factor: float = 1.0

    def __post_init__(self) -> None:
        fraction = check_float(
            "proportional partial_rotary_factor", self.partial_rotary_factor, minimum=0.0
        )
        if fraction > 1.0:
            raise ValueError(
                f"proportional partial_rotary_factor must be in [0, 1], got {fraction}"
            )
        object.__setattr__(self, "partial_rotary_factor", fraction)
        factor = check_float("proportional factor", self.factor, positive=True)
        object.__setattr__(self, "factor", factor)


@register_scaling(ProportionalScaling)
def proportional_inv_freq(
    dim: int, base: float, params: ProportionalScaling, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """``base ** (-2i / dim) / factor`` for the first ``int(p * dim // 2)`` pairs, 0 after."""
    kept = int(params.partial_rotary_factor * dim // 2)
    inv_freq = base_inv_freq(dim, base)
    inv_freq = torch.where(torch.arange(dim // 2) < kept, inv_freq, torch.zeros_like(inv_freq))
    return inv_freq / params.factor, 1.0
