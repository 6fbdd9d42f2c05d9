"""2-D axial RoPE for vision transformers: half the pairs follow a patch's row, half its
column (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", sec. 3.2,
"RoPE-Axial"; as in Pixtral, the Qwen-VL vision towers and DINOv3).

Shapes: ``B`` batch, ``H`` heads, ``T`` tokens, ``N`` patch tokens (``N = T - prefix``),
``D`` head_dim (a multiple of 4). Positions are ``[N, 2]`` or ``[B, N, 2]`` holding
``(y, x)`` (row, column; integer indices or float coordinates). The pairs are half-split
over the whole head, ``(i, i + D/2)``; pair ``i < D/4`` rotates by ``y * f_y[i]`` and pair
``D/4 + i`` by ``x * f_x[i]``, with, for ``i < D/4``:

* ``frequencies="shared"`` (Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V vision, DINOv3):
  ``f_y[i] = f_x[i] = base ** (-4i / D)``;
* ``frequencies="alternating"`` (Pixtral): the even RoPE frequencies for rows, the odd
  ones for columns, ``f_y[i] = base ** (-4i / D)``, ``f_x[i] = base ** (-(4i + 2) / D)``.

So ``<R_p q, R_p' k>`` depends on ``p - p'`` only, per axis. ``axial_positions`` builds the
``[N, 2]`` indices of a grid (row-major, or in the ``m x m`` merge blocks of the Qwen-VL
towers); ``dinov3_positions`` builds DINOv3's patch-center coordinates, scaled by
``2 pi``. ``num_prefix_tokens`` leading tokens (DINOv3's class and register tokens) are not
rotated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from posenc._checks import check_float, check_int, check_positions
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site
from posenc.encodings.rotary._shapes import check_qk
from posenc.encodings.rotary.apply import apply_rope

__all__ = ["AxialRope", "axial_inv_freq", "axial_positions", "dinov3_positions"]

FREQUENCIES = ("shared", "alternating")


def axial_inv_freq(head_dim: int, *, base: float, frequencies: str = "shared") -> Tensor:
    """Per-pair frequencies ``[D/2]`` float64: ``f_y`` for pairs ``< D/4``, then ``f_x``.

    Raises:
        ValueError: ``head_dim`` not a positive multiple of 4; unknown ``frequencies``;
            ``base`` not > 0.
    """
    head_dim = check_int("head_dim", head_dim)
    if head_dim % 4:
        raise ValueError(f"axial RoPE needs head_dim divisible by 4, got {head_dim}")
    base = check_float("base", base, positive=True)
    if frequencies not in FREQUENCIES:
        raise ValueError(f"unknown frequencies {frequencies!r}; known: {', '.join(FREQUENCIES)}")
    exponent = torch.arange(0, head_dim, 4, dtype=torch.float64) / head_dim  # 4i / D
    rows = torch.tensor(base, dtype=torch.float64) ** -exponent
    shift = 2.0 / head_dim if frequencies == "alternating" else 0.0
    cols = torch.tensor(base, dtype=torch.float64) ** -(exponent + shift)
    return torch.cat((rows, cols))


def axial_positions(grid: Sequence[int], *, merge_size: int = 1) -> Tensor:
    """Indices ``(y, x)`` ``[h * w, 2]`` int64 of an ``h x w`` grid of patches.

    Row-major for ``merge_size = 1`` (Pixtral); otherwise ordered by ``m x m`` blocks,
    row-major inside each block (the Qwen-VL vision towers, ``spatial_merge_size``).

    Raises:
        ValueError: ``grid`` not two positive integers, or not divisible by ``merge_size``.
    """
    if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or len(grid) != 2:
        raise ValueError(f"grid must be (height, width), got {grid!r}")
    h, w = (check_int(f"grid[{i}]", v) for i, v in enumerate(grid))
    merge = check_int("merge_size", merge_size)
    if h % merge or w % merge:
        raise ValueError(f"grid {(h, w)} is not divisible by merge_size={merge}")
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    blocks = (h // merge, merge, w // merge, merge)
    ys, xs = (a.reshape(blocks).transpose(1, 2).flatten() for a in (ys, xs))
    return torch.stack((ys, xs), dim=-1)


def dinov3_positions(grid: Sequence[int]) -> Tensor:
    """DINOv3's patch positions ``[h * w, 2]`` float64: ``2 pi`` times the patch centers
    ``2 (j + 1/2) / n - 1`` in ``[-1, 1]`` per axis, row-major (no training augmentation).

    Raises:
        ValueError: ``grid`` not two positive integers.
    """
    if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or len(grid) != 2:
        raise ValueError(f"grid must be (height, width), got {grid!r}")
    h, w = (check_int(f"grid[{i}]", v) for i, v in enumerate(grid))
    cy = 2.0 * (torch.arange(h, dtype=torch.float64) + 0.5) / h - 1.0
    cx = 2.0 * (torch.arange(w, dtype=torch.float64) + 0.5) / w - 1.0
    ys, xs = torch.meshgrid(cy, cx, indexing="ij")
    return 2.0 * math.pi * torch.stack((ys, xs), dim=-1).reshape(-1, 2)


class AxialRope(PositionalEncoding):
    """2-D axial RoPE on queries and keys at patch positions ``[N, 2]`` / ``[B, N, 2]``
    (``rotate``), or at the patches of a grid shape (``forward(q, k, grid=(h, w))``).

    Args:
        head_dim: ``D``, a multiple of 4.
        base: the RoPE base (100 for DINOv3, 10000 for Pixtral and Qwen-VL).
        frequencies: ``"shared"`` or ``"alternating"`` (see the module docstring).
        num_prefix_tokens: leading tokens left unrotated (DINOv3: 1 + registers).

    Raises:
        ValueError: see ``axial_inv_freq``; negative ``num_prefix_tokens``.
    """

    sites = Site.QK

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        frequencies: str = "shared",
        num_prefix_tokens: int = 0,
    ) -> None:
        super().__init__()
        self._inv_freq = axial_inv_freq(head_dim, base=base, frequencies=frequencies)
        self.head_dim, self.base, self.frequencies = head_dim, float(base), frequencies
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)
        self._axis = (torch.arange(head_dim // 2) >= head_dim // 4).long()  # 0 row, 1 column

    @property
    def inv_freq(self) -> Tensor:
        """Per-pair frequencies ``[D/2]`` (float64)."""
        return self._inv_freq

    def grid_positions(self, positions: Tensor, tokens: int, batch: int, name: str) -> Tensor:
        """Check ``positions`` is ``[N, 2]`` or ``[B|1, N, 2]`` with ``N = tokens - prefix``.

        Raises:
            ValueError: another shape.
        """
        check_positions(positions, name)
        patches = tokens - self.num_prefix_tokens
        shape = tuple(positions.shape)
        ok = positions.dim() in (2, 3) and shape[-2:] == (patches, 2)
        if not ok or (positions.dim() == 3 and shape[0] not in (1, batch)):
            raise ValueError(
                f"axial RoPE {name} must be [N, 2] or [B, N, 2] with N = {patches} "
                f"({tokens} tokens, {self.num_prefix_tokens} prefix), B = {batch}; "
                f"got shape {shape}"
            )
        return positions

    def attention_positions(
        self, positions: Tensor, *, batch: int, length: int
    ) -> tuple[Tensor | None, Tensor | None]:
        """Split the positions given to ``MultiHeadAttention``: ``(token, rotary)``; tokens
        are ordered (masked, cached) by their index, the grid positions rotate."""
        return None, self.grid_positions(positions, length, batch, "positions")

    def cos_sin(self, positions: Tensor, *, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` ``[..., N, D/2]`` of checked positions, angles in float64.

        Integer coordinates ``0..G-1`` read a ``[G, D/2]`` table of the grid's rows and
        columns (the same float64 products, rounded once); others are computed directly.
        """
        device, out = positions.device, compute_dtype(dtype)
        inv_freq = self._inv_freq.to(device)
        if positions.is_floating_point() or not positions.numel() or int(positions.min()) < 0:
            pos = positions.to(torch.float64).index_select(-1, self._axis.to(device))
            angles = pos * inv_freq  # [..., N, D/2]
            return angles.cos().to(out), angles.sin().to(out)
        coords = torch.arange(int(positions.max()) + 1, dtype=torch.float64, device=device)
        angles = coords[:, None] * inv_freq  # [G, D/2]: row pairs, then column pairs
        quarter = self.head_dim // 4
        tables = []
        for table in (angles.cos().to(out), angles.sin().to(out)):
            rows, cols = table[positions[..., 0], :quarter], table[positions[..., 1], quarter:]
            tables.append(torch.cat((rows, cols), dim=-1))
        return tables[0], tables[1]

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate the patch tokens of ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]``.

        Raises:
            ValueError: head_dim or batch mismatch; positions not ``[N, 2]`` / ``[B, N, 2]``.
        """
        batch, out = check_qk(q, k, self.head_dim), []
        for x, pos, name in ((q, q_pos, "q_pos"), (k, k_pos, "k_pos")):
            pos = self.grid_positions(pos, x.shape[-2], batch, name).to(x.device)
            cos, sin = self.cos_sin(pos, dtype=x.dtype)
            if cos.dim() == 3 and cos.shape[0] != batch:
                cos, sin = cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)
            if not self.num_prefix_tokens:
                out.append(apply_rope(x, cos, sin))
                continue
            prefix, patches = x.split((self.num_prefix_tokens, cos.shape[-2]), dim=-2)
            out.append(torch.cat((prefix, apply_rope(patches, cos, sin)), dim=-2))
        return out[0], out[1]

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        positions: Tensor | None = None,
        *,
        grid: Sequence[int] | None = None,
        merge_size: int = 1,
    ) -> tuple[Tensor, Tensor]:
        """Rotate ``q [B, H, T, D]`` and ``k [B, Hkv, T, D]`` of the same tokens.

        Args:
            q: queries.
            k: keys.
            positions: patch positions ``[N, 2]`` or ``[B, N, 2]``; or None with ``grid``.
            grid: ``(height, width)`` in patches: ``axial_positions(grid, merge_size=...)``.
            merge_size: the block order of ``grid`` (see ``axial_positions``).

        Raises:
            ValueError: both or neither of ``positions`` and ``grid``; see ``rotate``.
        """
        if (positions is None) == (grid is None):
            raise ValueError(f"pass positions or grid, not both or neither (grid={grid!r})")
        if positions is None:
            positions = axial_positions(grid, merge_size=merge_size).to(q.device)
        return self.rotate(q, k, positions, positions)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base}, frequencies={self.frequencies!r}, "
            f"num_prefix_tokens={self.num_prefix_tokens}"
        )
