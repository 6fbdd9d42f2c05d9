"""What every family row shares: the row type, config look-ups and the axes-RoPE builder.

Shapes: ``D`` head_dim, ``S_b`` features of axis block ``b``, ``N`` tokens, ``A`` axes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from posenc.base import PositionalEncoding
from posenc.diffusers.grids import grid_positions
from posenc.encodings.rotary.axial import AxialRope

Config = Mapping[str, Any]
Positions = Callable[[Config, int, int, int], Tensor]


@dataclass(frozen=True)
class Family:
    """One row: a family of diffusers model classes and how posenc builds their positions.

    Attributes:
        name: the family's name in the docs.
        classes: the diffusers model class names (``_class_name`` in ``config.json``).
        build: ``config -> module`` (``AxialRope``, ``MRoPE``, ``GridSinCos``, ...).
        positions: ``(config, frames, height, width) ->`` the image/video token positions
            on a grid of patches as the model's pipeline numbers them, in the module's
            position shape (``[N, A]``; ``[3, N]`` for ``MRoPE``; ``[F]`` for 1-D tables).
        reference: the diffusers code the parity suite compares with.
    """

    name: str
    classes: tuple[str, ...]
    build: Callable[[Config], PositionalEncoding]
    positions: Positions
    reference: str


def row(name: str, classes: str, build: Callable, positions: Positions, reference: str) -> Family:
    """A ``Family`` whose ``classes`` are given space-separated."""
    return Family(name, tuple(classes.split()), build, positions, reference)


def need(config: Config, key: str) -> Any:
    """``config[key]``.

    Raises:
        ValueError: the key is missing or None (the message lists the keys there are).
    """
    if config.get(key) is None:
        raise ValueError(f"the config has no {key!r} (keys: {', '.join(sorted(config))})")
    return config[key]


def head_dim(config: Config) -> int:
    """``attention_head_dim``."""
    return int(need(config, "attention_head_dim"))


def axes_rope(head_dim: int, dims: Sequence[int], base: float) -> AxialRope:
    """RoPE with a block of ``dims[b]`` features per axis, ``theta ** (-2i / S_b)`` in each,
    adjacent pairs ``(2i, 2i + 1)`` (diffusers' ``repeat_interleave_real`` or complex tables).

    Raises:
        ValueError: see ``AxialRope``.
    """
    dims = tuple(int(d) for d in dims)
    order = tuple(range(len(dims)))
    return AxialRope(
        int(head_dim), base=float(base), axis_order=order, pairs="interleaved", axis_dim=dims
    )


def rows_columns(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Image positions ``(y, x)`` ``[H W, 2]`` int64, row-major (one frame)."""
    return grid_positions(1, height, width)[:, 1:]


def resize_crop(grid: tuple[int, int], base: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """The region ``((top, left), (bottom, right))`` of a ``grid`` resized into a ``base``
    canvas with its aspect kept and centred (diffusers' ``get_resize_crop_region_for_grid``)."""
    (h, w), (th, tw) = grid, base
    if h / w > th / tw:
        rh, rw = th, round(th / h * w)
    else:
        rw, rh = tw, round(tw / w * h)
    top, left = round((th - rh) / 2.0), round((tw - rw) / 2.0)
    return (top, left), (top + rh, left + rw)
