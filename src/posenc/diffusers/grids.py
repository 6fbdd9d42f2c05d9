"""Positions of image and video tokens as the diffusion transformers number them.

Shapes: ``F`` frames, ``H`` rows, ``W`` columns (in patches, after patchifying), ``N = F H W``
(or ``H W``) tokens in row-major order (frame, then row, then column), ``A`` axes. Every
builder returns ``[N, A]`` positions for ``AxialRope.rotate`` (RoPE families) or
``GridSinCos.table`` (sin-cos tables): integer grids as int64, fractional ones as float64
(never in a half dtype).

* ``grid_positions(F, H, W)``: ``(t, y, x)`` indices, shifted by ``start`` (Wan,
  HunyuanVideo, Flux's image ids ``(0, y, x)`` with ``frames=1``);
* ``centred_positions(F, H, W)``: Qwen-Image's centred rows and columns, ``y`` in
  ``[-(H - H//2), H//2)``, ``x`` alike, frame ``t = index`` of the image in a multi-image
  prompt;
* ``crop_positions(H, W, crop)``: the fractional coordinates of a crop region resized to the
  grid, ``y_i = top + i (bottom (H-1)/H - top) / (H-1)`` (``torch.linspace`` with the
  endpoint dropped; Hunyuan-DiT and CogVideoX);
* ``sincos_positions(H, W, base_size=...)``: the scaled coordinates of the 2-D sin-cos
  tables of DiT / PixArt / SD3, ``y_i = (top + i) * base_size / (G * s)`` for a table of
  ``G`` rows (``G = H`` unless a larger ``max_size`` table is centre-cropped, SD3) and
  ``interpolation_scale`` ``s``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posenc._checks import check_float, check_int

__all__ = [
    "centred_positions",
    "crop_positions",
    "grid_positions",
    "sincos_positions",
    "text_positions",
]


def _mesh(*axes: Tensor) -> Tensor:
    """Row-major ``[prod(len), A]`` coordinates of a grid given its per-axis coordinates."""
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(axes))


def grid_positions(
    frames: int, height: int, width: int, *, start: Sequence[int] = (0, 0, 0)
) -> Tensor:
    """Indices ``(t, y, x)`` ``[F H W, 3]`` int64 of a video grid, plus ``start``.

    Raises:
        ValueError: a size below 1, or ``start`` not three integers.
    """
    sizes = [check_int(n, v) for n, v in (("frames", frames), ("height", height), ("width", width))]
    if isinstance(start, (str, bytes)) or not isinstance(start, Sequence) or len(start) != 3:
        raise ValueError(f"start must be three integers (t, y, x), got {start!r}")
    offsets = [check_int(f"start[{i}]", s, minimum=-(2**62)) for i, s in enumerate(start)]
    return _mesh(*(torch.arange(n) + o for n, o in zip(sizes, offsets, strict=True)))


def centred_positions(frames: int, height: int, width: int, *, index: int = 0) -> Tensor:
    """Qwen-Image's positions ``(t, y, x)`` ``[F H W, 3]`` int64: ``t = index + f``, rows
    ``-(H - H//2) .. H//2 - 1`` and columns alike (``scale_rope=True``).

    Raises:
        ValueError: a size below 1 or a negative ``index``.
    """
    sizes = [check_int(n, v) for n, v in (("frames", frames), ("height", height), ("width", width))]
    index = check_int("index", index, minimum=0)
    f, h, w = sizes
    return _mesh(
        torch.arange(f) + index, torch.arange(h) - (h - h // 2), torch.arange(w) - (w - w // 2)
    )


def text_positions(length: int, *, start: int = 0, axes: int = 3) -> Tensor:
    """Text tokens on the diagonal: ``[T, A]`` int64 with every axis ``start + i`` (Qwen-Image
    starts at ``max(H//2, W//2)`` after its centred image; Lumina 2 puts its caption on axis 0
    only: pass ``axes=1`` and pad).

    Raises:
        ValueError: ``length`` or ``axes`` below 1, negative ``start``.
    """
    length = check_int("length", length)
    start = check_int("start", start, minimum=0)
    axes = check_int("axes", axes)
    return (torch.arange(length) + start)[:, None].expand(-1, axes).contiguous()


def _linspace(size: int, first: float, last_edge: float) -> Tensor:
    """``size`` points from ``first`` towards ``last_edge`` with the endpoint dropped, float64."""
    last = last_edge * (size - 1) / size
    return torch.linspace(first, last, size, dtype=torch.float64)


def crop_positions(
    height: int, width: int, crop: Sequence[Sequence[float]], *, frames: int | None = None
) -> Tensor:
    """Fractional ``(y, x)`` ``[H W, 2]`` (or ``(t, y, x)`` ``[F H W, 3]`` with ``frames``)
    float64 of a crop region ``((top, left), (bottom, right))`` spread over the grid.

    Hunyuan-DiT (``get_2d_rotary_pos_embed``) and CogVideoX (``get_3d_rotary_pos_embed``,
    ``grid_type="linspace"``, whose frames are ``t_j = j``) build these.

    Raises:
        ValueError: a size below 1 or ``crop`` not two pairs of numbers.
    """
    h, w = check_int("height", height), check_int("width", width)
    try:
        (top, left), (bottom, right) = ((float(a), float(b)) for a, b in crop)
    except (TypeError, ValueError) as error:
        raise ValueError(f"crop must be ((top, left), (bottom, right)), got {crop!r}") from error
    axes = [_linspace(h, top, bottom), _linspace(w, left, right)]
    if frames is not None:
        f = check_int("frames", frames)
        axes.insert(0, _linspace(f, 0.0, float(f)))
    return _mesh(*axes)


def sincos_positions(
    height: int,
    width: int,
    *,
    base_size: int,
    interpolation_scale: float = 1.0,
    max_size: int | None = None,
) -> Tensor:
    """``(y, x)`` ``[H W, 2]`` float64 of DiT / PixArt / SD3's 2-D sin-cos table.

    Without ``max_size`` the table is built for the grid itself: ``y_i = i base_size /
    (H s)`` (PixArt, DiT). With ``max_size`` (SD3's ``pos_embed_max_size``) a
    ``max_size``-square table is centre-cropped: ``y_i = (top + i) base_size / (max_size s)``
    with ``top = (max_size - H) // 2``.

    Raises:
        ValueError: a size below 1, ``interpolation_scale`` not > 0, or the grid larger than
            ``max_size``.
    """
    h, w = check_int("height", height), check_int("width", width)
    base = check_int("base_size", base_size)
    scale = check_float("interpolation_scale", interpolation_scale, positive=True)
    if max_size is None:
        rows = torch.arange(h, dtype=torch.float64) / (h / base) / scale
        cols = torch.arange(w, dtype=torch.float64) / (w / base) / scale
        return _mesh(rows, cols)
    size = check_int("max_size", max_size)
    if h > size or w > size:
        raise ValueError(f"grid {(h, w)} is larger than max_size={size}")
    top, left = (size - h) // 2, (size - w) // 2
    rows = (torch.arange(h, dtype=torch.float64) + top) / (size / base) / scale
    cols = (torch.arange(w, dtype=torch.float64) + left) / (size / base) / scale
    return _mesh(rows, cols)
