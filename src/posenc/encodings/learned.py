"""Learned absolute positional embeddings (Gehring et al. 2017, "Convolutional Sequence
to Sequence Learning", section 3.1; BERT, Devlin et al. 2019; GPT-2, Radford et al. 2019).

    y[b, t] = x[b, t] + E[p(b, t)],      E in R^{max_len x C}, E ~ N(0, 0.02^2)

Shapes: ``B`` batch, ``T`` length, ``C`` d_model. ``E`` is an ``nn.Parameter``
(``module.to(torch.bfloat16)`` converts it, as for any learned weight); the addition is
done in the input's dtype with the table cast once.

Beyond the table (a position ``>= max_len``) the module raises by default. With
``beyond="interpolate"`` a sequence that needs ``N > max_len`` positions sees the table
stretched to ``N`` rows by linear interpolation (the rule of ``F.interpolate``,
``align_corners=False``, as in ViT/DeiT position-embedding resizing): position ``p`` then
reads the trained table at the fractional row ``(p + 0.5) * max_len / N - 0.5`` (clamped to
the table), so positions are rescaled relative to the longest one in the call, not
extrapolated. Only the rows asked for are interpolated (source rows in float64), so the
cost follows the number of positions, not their value.

Negative positions: rejected with a ``ValueError`` naming the position (the table has no
row before 0).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc._checks import (
    check_int,
    check_probability,
    check_tensor,
    float_positions,
    resolve_positions,
)
from posenc.base import PositionalEncoding, Site, register

__all__ = ["LearnedPositionalEncoding"]

_BEYOND = ("error", "interpolate")


@register(
    "learned",
    paper="Gehring et al. 2017, Convolutional Sequence to Sequence Learning (sec. 3.1)",
    description="a trainable table of one vector per position added to the embeddings",
)
class LearnedPositionalEncoding(PositionalEncoding):
    """Adds a trainable table ``weight [max_len, C]`` to token embeddings ``x [B, T, C]``.

    Args:
        d_model: embedding width ``C``.
        max_len: number of trained positions (rows of the table).
        dropout: dropout applied after the addition.
        beyond: what a position ``>= max_len`` does: ``"error"`` raises a ``ValueError``,
            ``"interpolate"`` stretches the table to the needed length (module docstring).

    Raises:
        ValueError: non-positive ``d_model`` or ``max_len``, a dropout outside [0, 1),
            an unknown ``beyond``.
    """

    sites = Site.INPUT

    def __init__(
        self, d_model: int, max_len: int, *, dropout: float = 0.0, beyond: str = "error"
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model)
        self.max_len = check_int("max_len", max_len)
        if beyond not in _BEYOND:
            raise ValueError(f"beyond must be one of {', '.join(_BEYOND)}; got {beyond!r}")
        self.beyond = beyond
        self.dropout = nn.Dropout(check_probability("dropout", dropout))
        self.weight = nn.Parameter(torch.empty(self.max_len, self.d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the table from N(0, 0.02^2), the GPT-2 initialisation."""
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def table(self, seq_len: int) -> Tensor:
        """The effective table ``[seq_len, C]`` for positions ``0 .. seq_len - 1``.

        The first rows of ``weight`` when ``seq_len <= max_len``; the interpolated table
        beyond it when ``beyond="interpolate"``. Differentiable with respect to ``weight``.

        Raises:
            ValueError: ``seq_len`` < 0, or ``seq_len > max_len`` with ``beyond="error"``.
        """
        seq_len = check_int("seq_len", seq_len, minimum=0)
        if seq_len <= self.max_len:
            return self.weight[:seq_len]
        if self.beyond == "error":
            raise ValueError(
                f"sequence length {seq_len} exceeds the learned table's max_len={self.max_len}; "
                "use beyond='interpolate' or a larger max_len"
            )
        return self._stretched(torch.arange(seq_len, device=self.weight.device), seq_len)

    def _stretched(self, positions: Tensor, length: int) -> Tensor:
        """Rows ``[..., C]`` at ``positions`` of the table stretched to ``length`` rows."""
        src = (float_positions(positions, torch.float64) + 0.5) * (self.max_len / length) - 0.5
        src = src.clamp_min(0.0)
        low = src.floor().long().clamp_max(self.max_len - 1)
        high = (low + 1).clamp_max(self.max_len - 1)
        dtype = torch.promote_types(self.weight.dtype, torch.float32)  # weights never in bf16
        frac = (src - low).to(dtype).unsqueeze(-1)  # [..., 1]
        weight = self.weight.to(dtype)
        return torch.lerp(weight[low], weight[high], frac)

    def encoding(self, positions: Tensor) -> Tensor:
        """Table rows ``[..., C]`` for non-negative integer ``positions [...]``.

        Raises:
            TypeError: floating-point positions.
            ValueError: negative positions, or beyond the table with ``beyond="error"``.
        """
        if positions.is_floating_point():
            raise TypeError(f"learned positions must be integers, got dtype {positions.dtype}")
        if positions.numel() == 0:
            return self.weight.new_empty((*positions.shape, self.d_model))
        low, high = int(positions.min()), int(positions.max())
        if low < 0:
            raise ValueError(f"positions must be >= 0, got a position {low}")
        if high >= self.max_len and self.beyond == "error":
            raise ValueError(
                f"position {high} is beyond the learned table of max_len={self.max_len}; "
                "use beyond='interpolate' or a larger max_len"
            )
        if high < self.max_len:
            return self.weight[positions]
        return self._stretched(positions, high + 1)

    def embed(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        check_tensor("x", x, ndim=3)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has last dimension {x.shape[-1]}, expected d_model={self.d_model}")
        if positions is None:
            pe = self.table(x.shape[1])  # [T, C]
        else:
            positions = resolve_positions(positions, x.shape[1], batch=x.shape[0])
            pe = self.encoding(positions.to(self.weight.device))  # [T, C] or [B, T, C]
        return self.dropout(torch.add(x, pe.to(x.dtype)))

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Same as ``embed``: ``x [B, T, C]`` -> ``x + E[positions]`` ``[B, T, C]``."""
        return self.embed(x, positions)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, beyond={self.beyond!r}"
