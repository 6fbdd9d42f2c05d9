"""N-D sin-cos tables added to patch embeddings: each axis gets a block of features holding a
1-D sinusoidal encoding of its coordinate (Dosovitskiy et al. 2021, ViT, appendix D.4;
the 2-D form of MAE, He et al. 2022, used by DiT, Peebles & Xie 2023, sec. 3.1, PixArt-α
and Stable Diffusion 3).

Shapes: ``B`` batch, ``N`` patch tokens, ``C`` d_model, ``A`` axes. Positions are ``[N, A]``
(``(y, x)`` or ``(t, y, x)``, integer or fractional). Block ``b`` has ``C_b`` features
(``sum C_b = C``) and encodes coordinate ``axis_order[b]`` as
``[sin(p w_0) .. sin(p w_{h-1}) | cos(p w_0) .. cos(p w_{h-1})]``, ``h = C_b / 2``,
``w_i = 10000 ** (-i / h)`` (``sinusoidal_layout_table``, layout ``"sin|cos"``).
diffusers' ``get_2d_sincos_pos_embed`` puts the column first (``axis_order=(1, 0)``,
``C/2`` each); its ``get_3d_sincos_pos_embed`` (CogVideoX 2B, ``C/4`` for time, ``3C/8``
per spatial axis) is ``axis_order=(0, 2, 1)`` with ``axis_dims=(C/4, 3C/8, 3C/8)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posenc._checks import check_float, check_int, check_positions, check_tensor
from posenc.base import PositionalEncoding, Site
from posenc.encodings.sinusoidal_layouts import sinusoidal_layout_table

__all__ = ["GridSinCos"]


class GridSinCos(PositionalEncoding):
    """Adds an N-D sin-cos table to patch tokens ``x [B, N, C]`` at positions ``[N, A]``.

    Args:
        d_model: ``C``.
        axis_dims: features per block, even, summing to ``C`` (default: ``C/2`` twice).
        axis_order: the position coordinate of each block, a permutation of ``0..A-1``
            (default ``(1, 0)``: the column first, as diffusers).
        base: the frequency base (10000).

    Raises:
        ValueError: block sizes that are odd or do not sum to ``C``; ``axis_order`` not a
            permutation of the same length; ``base`` not > 0.
    """

    sites = Site.INPUT
    position_shape = "[N, A]"

    def __init__(
        self,
        d_model: int,
        *,
        axis_dims: Sequence[int] | None = None,
        axis_order: Sequence[int] = (1, 0),
        base: float = 10000.0,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model)
        if axis_dims is None:
            axis_dims = (self.d_model // 2, self.d_model // 2)
        dims = tuple(check_int(f"axis_dims[{i}]", s) for i, s in enumerate(axis_dims))
        if any(s % 2 for s in dims) or sum(dims) != self.d_model:
            raise ValueError(
                f"axis_dims must be even and sum to d_model={self.d_model}, got {list(dims)}"
            )
        order = tuple(axis_order)
        if sorted(order) != list(range(len(dims))):
            raise ValueError(
                f"axis_order must be a permutation of 0..{len(dims) - 1}, got {axis_order!r}"
            )
        self.axis_dims, self.axis_order = dims, order
        self.base = check_float("base", base, positive=True)

    @property
    def axes(self) -> int:
        """``A``, coordinates per position."""
        return len(self.axis_dims)

    def table(self, positions: Tensor, *, dtype: torch.dtype = torch.float32) -> Tensor:
        """The encodings ``[N, C]`` of ``positions [N, A]`` (angles in float64, rounded once).

        Raises:
            ValueError: positions not ``[N, A]``.
        """
        positions = check_positions(positions, "positions")
        if positions.dim() != 2 or positions.shape[-1] != self.axes:
            raise ValueError(
                f"positions must be [N, {self.axes}], got shape {tuple(positions.shape)}"
            )
        blocks = [
            sinusoidal_layout_table(
                positions[:, axis], size, base=self.base, layout="sin|cos", dtype=torch.float64
            )
            for size, axis in zip(self.axis_dims, self.axis_order, strict=True)
        ]
        return torch.cat(blocks, dim=-1).to(dtype)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x + table(positions)`` for ``x [B, N, C]``.

        Raises:
            ValueError: ``x`` not ``[B, N, C]`` with this ``C`` and ``N`` positions.
        """
        check_tensor("x", x, ndim=3)
        if x.shape[-1] != self.d_model or x.shape[1] != positions.shape[0]:
            raise ValueError(
                f"x must be [B, {positions.shape[0]}, {self.d_model}], got {tuple(x.shape)}"
            )
        return x + self.table(positions.to(x.device), dtype=x.dtype)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """``embed(x, positions)``."""
        return self.embed(x, positions)

    def extra_repr(self) -> str:
        dims, order = list(self.axis_dims), self.axis_order
        return f"d_model={self.d_model}, axis_dims={dims}, axis_order={order}"
