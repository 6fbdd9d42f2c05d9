"""2-D axial RoPE for vision transformers: half the pairs follow a patch's row, half its
column (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer", sec. 3.2,
"RoPE-Axial"; as in Pixtral, the Qwen-VL vision towers and DINOv3), and the variants of
current vision towers (more axes, partial rotation, other pair layouts).

Shapes: ``B`` batch, ``H`` heads, ``T`` tokens, ``N`` patch tokens (``N = T - prefix``),
``D`` head_dim, ``A`` axes (coordinates per position, 2 unless told), ``S`` features per
axis (``axis_dim``, even; default ``D / A``), ``R = A S <= D`` rotated features, ``P = R/2``
pairs. Positions are ``[N, A]`` or ``[B, N, A]``: for two axes ``(y, x)`` (row, column;
integer indices or float coordinates), for three ``(t, y, x)``. Pair ``p`` rotates by
``pos[axis(p)] * f(p)``. By default (``axis_order=(0, 1)``, blocks, ``pairs="half"``) the
pairs are half-split over the whole head, ``(i, i + D/2)``; pair ``i < D/4`` follows ``y``
and pair ``D/4 + i`` follows ``x``, with for ``i < S/2``:

* ``frequencies="shared"`` (Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V vision, DINOv3):
  ``f = base ** (-2i / S)`` on every axis (``base ** (-4i / D)`` for ``S = D/2``);
* ``frequencies="alternating"`` (Pixtral): the RoPE frequencies of ``R`` dealt in turn to
  the axes, axis block ``b`` gets ``base ** (-2 (A i + b) / R)``: the even ones for rows,
  the odd ones for columns.

The variants (``AxialRope`` arguments; the families in ``posenc.hf.schemes``):

* ``axis_order``: which coordinate drives each axis block (``(1, 0)``: the first
  ``P/2`` pairs follow the column; Llama 4, Gemma 4, Step3.5, Inkling2 and SAM3 vision);
* ``cyclic=True``: pair ``p`` belongs to axis block ``p % A`` with frequency index
  ``p // A`` instead of contiguous blocks (Kimi K2.5 vision);
* ``pairs``: ``"half"`` ``(i, i + R/2)``, ``"interleaved"`` ``(2i, 2i + 1)`` (Llama 4's
  complex ``freqs_ci``, SAM3, Inkling2), or ``"per_axis"``: each axis its own half-split
  block of ``S`` features, ``(bS + i, bS + S/2 + i)`` (Gemma 4's multidimensional RoPE);
* ``axis_dim``: ``S`` smaller than ``D / A`` leaves features ``R..D-1`` unrotated
  (MiniMax-M3-VL's ``(t, y, x)`` RoPE on ``3 * 2 floor(D / 6)`` features); one size per
  axis, ``(S_0, .., S_{A-1})``, gives axis ``b`` a block of ``S_b`` features with
  ``f = base ** (-2i / S_b)`` (the diffusion transformers' axes RoPE: Flux's ``(16, 56,
  56)``, Wan's ``(D - 4 floor(D/6), 2 floor(D/6), 2 floor(D/6))``; ``posenc.diffusers``).

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

from posenc._checks import check_bool, check_float, check_int, check_positions, float_positions
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings.rotary._shapes import check_qk
from posenc.encodings.rotary.apply import apply_rope

__all__ = ["AxialRope", "axial_inv_freq", "axial_pairs", "axial_positions", "dinov3_positions"]

FREQUENCIES = ("shared", "alternating")
PAIRS = ("half", "interleaved", "per_axis")


def _axis_dim(head_dim: int, axes: int, axis_dim: int | None) -> int:
    """``S``: ``axis_dim``, or ``D / A``; checked even, ``A S <= D``."""
    head_dim = check_int("head_dim", head_dim)
    axes = check_int("axes", axes)
    if axis_dim is None:
        if head_dim % (2 * axes):
            raise ValueError(
                f"axial RoPE needs head_dim divisible by {2 * axes} ({axes} axes), got {head_dim}"
            )
        return head_dim // axes
    axis_dim = check_int("axis_dim", axis_dim)
    if axis_dim % 2 or axes * axis_dim > head_dim:
        raise ValueError(
            f"axis_dim must be even with {axes} * axis_dim <= head_dim={head_dim}, got {axis_dim}"
        )
    return axis_dim


def _axis_dims(head_dim: int, axes: int, axis_dim: int | Sequence[int] | None) -> tuple[int, ...]:
    """``(S_0, .., S_{A-1})``: ``axis_dim`` per axis (one int for all, or one per axis, each
    even, summing to at most ``D``)."""
    if axis_dim is None or not isinstance(axis_dim, Sequence) or isinstance(axis_dim, str):
        return (_axis_dim(head_dim, axes, axis_dim),) * check_int("axes", axes)
    head_dim = check_int("head_dim", head_dim)
    dims = tuple(check_int(f"axis_dim[{i}]", s) for i, s in enumerate(axis_dim))
    if len(dims) != axes or any(s % 2 for s in dims) or sum(dims) > head_dim:
        raise ValueError(
            f"axis_dim must be {axes} even sizes summing to at most head_dim={head_dim}, "
            f"got {list(axis_dim)}"
        )
    return dims


def axial_pairs(
    head_dim: int,
    *,
    axes: int = 2,
    axis_dim: int | Sequence[int] | None = None,
    cyclic: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(block, index)`` ``[P]`` int64: the axis block of each pair and its frequency index
    (contiguous blocks of ``S_b/2`` pairs, or ``p % A`` and ``p // A`` when ``cyclic``).

    Raises:
        ValueError: see ``axial_inv_freq``; ``cyclic`` with unequal axis sizes.
    """
    dims = _axis_dims(head_dim, axes, axis_dim)
    if cyclic:
        if len(set(dims)) != 1:
            raise ValueError(f"cyclic pairs need equal axis sizes, got axis_dim={list(dims)}")
        pair = torch.arange(axes * (dims[0] // 2))
        return pair % axes, pair // axes
    halves = torch.tensor(dims) // 2
    block = torch.repeat_interleave(torch.arange(axes), halves)
    starts = torch.cumsum(halves, 0) - halves
    return block, torch.arange(len(block)) - starts[block]


def axial_inv_freq(
    head_dim: int,
    *,
    base: float,
    frequencies: str = "shared",
    axes: int = 2,
    axis_dim: int | Sequence[int] | None = None,
    cyclic: bool = False,
) -> Tensor:
    """Per-pair frequencies ``[P]`` float64 (for the defaults: ``f_y`` for pairs ``< D/4``,
    then ``f_x``).

    Raises:
        ValueError: ``head_dim`` not a positive multiple of ``2 A`` (without ``axis_dim``);
            ``axis_dim`` odd or ``A S > D``; unknown ``frequencies``; ``base`` not > 0.
    """
    base = check_float("base", base, positive=True)
    if frequencies not in FREQUENCIES:
        raise ValueError(f"unknown frequencies {frequencies!r}; known: {', '.join(FREQUENCIES)}")
    block, index = axial_pairs(head_dim, axes=axes, axis_dim=axis_dim, cyclic=cyclic)
    dims = torch.tensor(_axis_dims(head_dim, axes, axis_dim), dtype=torch.float64)
    if frequencies == "shared":
        exponent = 2.0 * index.double() / dims[block]
    elif len(set(dims.tolist())) != 1:
        raise ValueError(f"alternating frequencies need equal axis sizes, got {dims.tolist()}")
    else:  # the RoPE frequencies of R dealt to the axes in turn
        exponent = 2.0 * (axes * index + block).double() / (axes * dims[0])
    return torch.tensor(base, dtype=torch.float64) ** -exponent


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


@register(
    "axial_rope",
    paper="Heo et al. 2024, Rotary Position Embedding for Vision Transformer (sec. 3.2)",
    description="2-D RoPE for image patches: half the pairs follow the row, half the column [N, 2]",
)
class AxialRope(PositionalEncoding):
    """Axial RoPE on queries and keys at patch positions ``[N, A]`` / ``[B, N, A]``
    (``rotate``), or at the patches of a grid shape (``forward(q, k, grid=(h, w))``).

    Args:
        head_dim: ``D``, a multiple of ``2 A`` unless ``axis_dim`` is given.
        base: the RoPE base (100 for DINOv3, 10000 for Pixtral and Qwen-VL).
        frequencies: ``"shared"`` or ``"alternating"`` (see the module docstring).
        num_prefix_tokens: leading tokens left unrotated (DINOv3: 1 + registers).
        axis_order: the coordinate that drives each axis block, a permutation of
            ``range(A)``; its length is ``A`` (default ``(0, 1)``).
        cyclic: pairs cycle through the axis blocks instead of contiguous blocks.
        pairs: ``"half"``, ``"interleaved"`` or ``"per_axis"`` (see the module docstring).
        axis_dim: ``S``, features per axis (default ``D / A``); ``A S < D`` is partial; or
            one size per axis (blocks only: not with ``cyclic`` or ``"alternating"``).

    Raises:
        ValueError: see ``axial_inv_freq``; negative ``num_prefix_tokens``; ``axis_order``
            not a permutation; unknown ``pairs``.
    """

    sites = Site.QK
    position_shape = "[N, A]"

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        frequencies: str = "shared",
        num_prefix_tokens: int = 0,
        axis_order: Sequence[int] = (0, 1),
        cyclic: bool = False,
        pairs: str = "half",
        axis_dim: int | Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        order = tuple(axis_order) if isinstance(axis_order, Sequence) else ()
        if sorted(order) != list(range(len(order))) or not order:
            raise ValueError(f"axis_order must be a permutation of 0..A-1, got {axis_order!r}")
        if pairs not in PAIRS:
            raise ValueError(f"unknown pairs {pairs!r}; known: {', '.join(PAIRS)}")
        axes, cyclic = len(order), check_bool("cyclic", cyclic)
        self._inv_freq = axial_inv_freq(
            head_dim, base=base, frequencies=frequencies, axes=axes, axis_dim=axis_dim,
            cyclic=cyclic,
        )  # fmt: skip
        block, _ = axial_pairs(head_dim, axes=axes, axis_dim=axis_dim, cyclic=cyclic)
        self._axis = torch.tensor(order)[block]  # the coordinate of each pair
        self.head_dim, self.base, self.frequencies = head_dim, float(base), frequencies
        self.axis_order, self.cyclic, self.pairs = order, cyclic, pairs
        self.axis_dims = _axis_dims(head_dim, axes, axis_dim)
        equal = len(set(self.axis_dims)) == 1
        self.axis_dim = self.axis_dims[0] if equal else self.axis_dims
        self.rotary_dim = sum(self.axis_dims)
        self.num_prefix_tokens = check_int("num_prefix_tokens", num_prefix_tokens, minimum=0)

    @property
    def axes(self) -> int:
        """``A``, the coordinates per position."""
        return len(self.axis_order)

    @property
    def inv_freq(self) -> Tensor:
        """Per-pair frequencies ``[P]`` (float64)."""
        return self._inv_freq

    def grid_positions(self, positions: Tensor, tokens: int, batch: int, name: str) -> Tensor:
        """Check ``positions`` is ``[N, A]`` or ``[B|1, N, A]`` with ``N = tokens - prefix``.

        Raises:
            ValueError: another shape.
        """
        check_positions(positions, name)
        patches = tokens - self.num_prefix_tokens
        shape = tuple(positions.shape)
        ok = positions.dim() in (2, 3) and shape[-2:] == (patches, self.axes)
        if not ok or (positions.dim() == 3 and shape[0] not in (1, batch)):
            raise ValueError(
                f"axial RoPE {name} must be [N, {self.axes}] or [B, N, {self.axes}] with "
                f"N = {patches} ({tokens} tokens, {self.num_prefix_tokens} prefix), "
                f"B = {batch}; got shape {shape}"
            )
        return positions

    def attention_positions(
        self, positions: Tensor, *, batch: int, length: int
    ) -> tuple[Tensor | None, Tensor | None]:
        """Split the positions given to ``MultiHeadAttention``: ``(token, rotary)``; tokens
        are ordered (masked, cached) by their index, the grid positions rotate."""
        return None, self.grid_positions(positions, length, batch, "positions")

    def cos_sin(self, positions: Tensor, *, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` ``[..., N, P]`` of checked positions, angles in float64, pair ``p``
        in the order of the module docstring (before the ``pairs`` layout places it).

        Integer coordinates ``0..G-1`` read a ``[G, P]`` table of the grid's coordinates
        (the same float64 products, rounded once) when ``G`` is at most the number of
        coordinates given; others (far positions), and all under ``torch.compile`` (no host
        sync), are computed directly.
        """
        device, out = positions.device, compute_dtype(dtype)
        inv_freq, axis = self._inv_freq.to(device), self._axis.to(device)
        direct = positions.is_floating_point() or torch.compiler.is_compiling()  # no host sync
        low, high = (0, 0) if direct or not positions.numel() else map(int, positions.aminmax())
        if direct or not positions.numel() or low < 0 or high >= positions.numel():
            angles = float_positions(positions, torch.float64).index_select(-1, axis) * inv_freq
            return angles.cos().to(out), angles.sin().to(out)
        coords = torch.arange(high + 1, dtype=torch.float64, device=device)
        angles = coords[:, None] * inv_freq  # [G, P]
        index = positions.index_select(-1, axis)  # [..., N, P]: the coordinate of each pair
        flat = index.reshape(-1, index.shape[-1])
        cos, sin = (
            t.to(out).gather(0, flat).reshape(index.shape) for t in (angles.cos(), angles.sin())
        )
        return cos, sin

    def _rotate_pairs(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotate ``x [B, H, N, D]`` by ``cos``/``sin`` ``[B|., N, P]`` in the pair layout."""
        if self.pairs != "per_axis":
            return apply_rope(x, cos, sin, interleaved=self.pairs == "interleaved")
        start, parts = 0, []
        for size in self.axis_dims:
            pairs = slice(start // 2, (start + size) // 2)
            features = x[..., start : start + size]
            parts.append(apply_rope(features, cos[..., pairs], sin[..., pairs]))
            start += size
        return torch.cat((*parts, x[..., self.rotary_dim :]), dim=-1)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate the patch tokens of ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]``.

        Raises:
            ValueError: head_dim or batch mismatch; positions not ``[N, A]`` / ``[B, N, A]``.
        """
        batch, out = check_qk(q, k, self.head_dim), []
        for x, pos, name in ((q, q_pos, "q_pos"), (k, k_pos, "k_pos")):
            pos = self.grid_positions(pos, x.shape[-2], batch, name).to(x.device)
            cos, sin = self.cos_sin(pos, dtype=x.dtype)
            if cos.dim() == 3 and cos.shape[0] != batch:
                cos, sin = cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)
            if not self.num_prefix_tokens:
                out.append(self._rotate_pairs(x, cos, sin))
                continue
            prefix, patches = x.split((self.num_prefix_tokens, cos.shape[-2]), dim=-2)
            out.append(torch.cat((prefix, self._rotate_pairs(patches, cos, sin)), dim=-2))
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
            positions: patch positions ``[N, A]`` or ``[B, N, A]``; or None with ``grid``.
            grid: ``(height, width)`` in patches: ``axial_positions(grid, merge_size=...)``
                (two axes only).
            merge_size: the block order of ``grid`` (see ``axial_positions``).

        Raises:
            ValueError: both or neither of ``positions`` and ``grid``; ``grid`` with
                ``A != 2``; see ``rotate``.
        """
        if (positions is None) == (grid is None):
            raise ValueError(f"pass positions or grid, not both or neither (grid={grid!r})")
        if positions is None:
            if self.axes != 2:
                raise ValueError(f"grid= builds 2-D positions; this RoPE has {self.axes} axes")
            positions = axial_positions(grid, merge_size=merge_size).to(q.device)
        return self.rotate(q, k, positions, positions)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base}, frequencies={self.frequencies!r}, "
            f"num_prefix_tokens={self.num_prefix_tokens}, axis_order={self.axis_order}, "
            f"cyclic={self.cyclic}, pairs={self.pairs!r}, axis_dim={self.axis_dim}"
        )
