"""Multimodal RoPE (M-RoPE): each rotary pair follows one of three position axes, time,
height or width (Wang et al. 2024, "Qwen2-VL", sec. 2.1; Bai et al. 2025, "Qwen2.5-VL").

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary_dim,
``P = R/2`` pairs. A token has three positions ``(t, h, w)``; positions are ``[3, T]`` or
``[3, B, T]``. ``mrope_section = (s_t, s_h, s_w)``, summing to ``P``, says how many pairs
follow each axis; pair ``i`` rotates by ``pos[axis(i)] * inv_freq[i]``:

* sections in blocks (Qwen2-VL, Qwen2.5-VL, GLM-4V): pairs ``[0, s_t)`` follow time,
  ``[s_t, s_t + s_h)`` height, the rest width;
* interleaved sections (``mrope_interleaved``, Qwen3-VL and later): pair ``i`` follows
  height if ``i % 3 == 1`` and ``i < 3 s_h``, width if ``i % 3 == 2`` and ``i < 3 s_w``,
  time otherwise, so every axis keeps low and high frequencies.

The pair layout is the usual one (``interleaved``): half-split for Qwen, adjacent pairs for
GLM-4V, whose rotary dim is also partial. A text token has ``t = h = w``, so positions
``[T]`` or ``[B, T]`` (B != 3) are text positions, equal on the three axes, as
transformers broadcasts them; M-RoPE is then plain RoPE. A 2-D tensor with 3 rows is read
as ``[3, T]`` and is refused as ambiguous when the batch is also 3 (pass ``[3, B, T]``).

``mrope_position_ids`` builds the positions of a text + image + video sequence the way
these models' ``get_rope_index`` does; ``mrope_decode_positions`` continues them during
decoding with the offset ``rope_delta``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posenc._checks import check_float, check_int, check_positions
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings.rotary._shapes import check_qk
from posenc.encodings.rotary.apply import apply_rope
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.encodings.rotary.scaling import DEFAULT_BASE, ScalingSpec

__all__ = ["MRoPE", "mrope_decode_positions", "mrope_pair_axes", "mrope_position_ids"]

AXES = 3  # time, height, width


def mrope_pair_axes(mrope_section: Sequence[int], *, mrope_interleaved: bool = False) -> Tensor:
    """The axis (0 time, 1 height, 2 width) of each pair, int64 ``[P]``, ``P = sum(sections)``.

    Raises:
        ValueError: not three sections, or a negative one.
    """
    sections = _sections(mrope_section)
    pairs = sum(sections)
    if not mrope_interleaved:
        return torch.repeat_interleave(torch.arange(AXES), torch.tensor(sections))
    index = torch.arange(pairs)
    axes = torch.zeros(pairs, dtype=torch.int64)
    for axis in (1, 2):
        axes[(index % AXES == axis) & (index < AXES * sections[axis])] = axis
    return axes


def _has_axes(positions: Tensor, axes: int = AXES) -> bool:
    """Validated positions carry the axis dimension (``[A, T]`` or ``[A, B, T]``)."""
    return positions.dim() == 3 or (positions.dim() == 2 and positions.shape[0] == axes)


def _pair_axes(pair_axes: Sequence[int], num_axes: int, pairs: int) -> Tensor:
    """Validate an explicit axis per pair: ``pairs`` integers in ``[0, num_axes)``."""
    if isinstance(pair_axes, (str, bytes)) or not isinstance(pair_axes, Sequence):
        raise TypeError(f"pair_axes must be a list of integers, got {pair_axes!r}")
    axes = [check_int(f"pair_axes[{i}]", a, minimum=0) for i, a in enumerate(pair_axes)]
    if len(axes) != pairs or any(a >= num_axes for a in axes):
        raise ValueError(
            f"pair_axes must give each of the {pairs} pairs an axis in [0, {num_axes}), "
            f"got {len(axes)} entries {sorted(set(axes))}"
        )
    return torch.tensor(axes, dtype=torch.int64)


def _sections(mrope_section: Sequence[int]) -> tuple[int, int, int]:
    if isinstance(mrope_section, (str, bytes)) or not isinstance(mrope_section, Sequence):
        raise TypeError(f"mrope_section must be a list of 3 integers, got {mrope_section!r}")
    if len(mrope_section) != AXES:
        raise ValueError(f"mrope_section must have 3 entries (t, h, w), got {list(mrope_section)}")
    checked = (check_int(f"mrope_section[{i}]", n, minimum=0) for i, n in enumerate(mrope_section))
    return tuple(checked)


@register(
    "mrope",
    paper="Wang et al. 2024, Qwen2-VL (sec. 2.1, M-RoPE)",
    description="RoPE whose pairs follow time, height or width positions [3, T] (multimodal)",
)
class MRoPE(PositionalEncoding):
    """M-RoPE on queries and keys at positions ``[3, T]`` / ``[3, B, T]`` (text: ``[T]``).

    Args:
        head_dim: ``D``, even.
        mrope_section: pairs per axis ``(s_t, s_h, s_w)``, summing to ``R/2``. None: a
            quarter of the pairs for time and the rest split evenly (Qwen2-VL's
            ``[16, 24, 24]`` for ``R = 128``).
        base: the RoPE base (``rope_theta``).
        scaling: a frequency scaling (not length-dependent), as for ``RotaryEmbedding``.
        rotary_dim: ``R`` (default ``D``; GLM-4V rotates half the head).
        interleaved: pair layout: False half-split (Qwen), True adjacent (GLM-4V).
        mrope_interleaved: interleaved sections (Qwen3-VL) instead of blocks.
        pair_axes: instead of sections, the axis of each of the ``R/2`` pairs, in
            ``[0, num_axes)`` (ERNIE 4.5-VL alternates height and width pairs; NeoMME's
            two axes row and column alternate); ``mrope_section`` is then their count per axis.
        num_axes: ``A``, the position axes (positions ``[A, T]`` / ``[A, B, T]``); 3 unless
            ``pair_axes`` says otherwise.
        max_len: cos/sin cache length built up front.

    Raises:
        ValueError: sections that do not sum to ``R/2``; both sections and ``pair_axes``;
            ``pair_axes`` of another length or outside ``[0, num_axes)``; a
            length-dependent scaling; the errors of ``RotaryEmbedding``.
    """

    sites = Site.QK
    position_shape = "[A, T]"

    def __init__(
        self,
        head_dim: int,
        *,
        mrope_section: Sequence[int] | None = None,
        base: float = DEFAULT_BASE,
        scaling: ScalingSpec = None,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        mrope_interleaved: bool = False,
        pair_axes: Sequence[int] | None = None,
        num_axes: int = AXES,
        max_len: int = 2048,
    ) -> None:
        super().__init__()
        self.rope = RotaryEmbedding(
            head_dim,
            base=base,
            scaling=scaling,
            rotary_dim=rotary_dim,
            interleaved=interleaved,
            max_len=max_len,
        )
        if self.rope.scaling.length_dependent:
            raise ValueError(
                f"M-RoPE takes no length-dependent scaling, got rope_type "
                f"{self.rope.scaling.rope_type!r}"
            )
        if not isinstance(mrope_interleaved, bool):
            raise TypeError(f"mrope_interleaved must be a bool, got {mrope_interleaved!r}")
        self.head_dim, self.mrope_interleaved = head_dim, mrope_interleaved
        self.num_axes = check_int("num_axes", num_axes, minimum=2)
        if pair_axes is None:
            self.mrope_section = self._sections_of(mrope_section)
            self._axes = mrope_pair_axes(self.mrope_section, mrope_interleaved=mrope_interleaved)
        elif mrope_section is not None or mrope_interleaved:
            raise ValueError(
                "pass either pair_axes or mrope_section / mrope_interleaved, got "
                f"mrope_section={mrope_section!r}, mrope_interleaved={mrope_interleaved}"
            )
        else:
            self._axes = _pair_axes(pair_axes, self.num_axes, self.rope.rotary_dim // 2)
            self.mrope_section = tuple(torch.bincount(self._axes, minlength=num_axes).tolist())

    def _sections_of(self, mrope_section: Sequence[int] | None) -> tuple[int, ...]:
        pairs = self.rope.rotary_dim // 2
        if self.num_axes != AXES:
            raise ValueError(
                f"mrope_section places pairs on 3 axes; num_axes={self.num_axes} needs pair_axes"
            )
        if mrope_section is None:
            spatial = 3 * pairs // 8
            mrope_section = (pairs - 2 * spatial, spatial, spatial)
        sections = _sections(mrope_section)
        if sum(sections) != pairs:
            raise ValueError(
                f"mrope_section {list(sections)} sums to {sum(sections)}, but the rotary "
                f"half has {pairs} pairs (rotary_dim={self.rope.rotary_dim})"
            )
        return sections

    def axis_positions(self, positions: Tensor, length: int, batch: int, name: str) -> Tensor:
        """Validate ``positions``: ``[A, T]`` / ``[A, B|1, T]`` returned as they are; text
        positions ``[T]`` / ``[B|1, T]`` (a leading ``A`` only as ``[A, T]``) are returned too.

        Raises:
            ValueError: a shape of another rank or length; ``[A, T]`` when the batch is ``A``.
        """
        axes = self.num_axes
        check_positions(positions, name)
        shape = tuple(positions.shape)
        if not shape or shape[-1] != length or positions.dim() > 3:
            raise ValueError(
                f"M-RoPE {name} must be [{axes}, T], [{axes}, B, T], [T] or [B, T] with "
                f"T = {length}, got shape {shape}"
            )
        if positions.dim() == 3 and (shape[0] != axes or shape[1] not in (1, batch)):
            raise ValueError(
                f"M-RoPE {name} of rank 3 must be [{axes}, B, T] with B = {batch}, got shape "
                f"{shape}"
            )
        if positions.dim() == 2:
            if shape[0] == axes and batch == axes:
                raise ValueError(
                    f"M-RoPE {name} of shape {shape} is ambiguous with batch {axes}: pass "
                    f"[{axes}, B, T] (one row per axis) or [T] (text)"
                )
            if shape[0] not in (axes, 1, batch):
                raise ValueError(
                    f"M-RoPE {name} must be [{axes}, T] or [B, T] with B = {batch}, got shape "
                    f"{shape}"
                )
        return positions

    def attention_positions(
        self, positions: Tensor, *, batch: int, length: int
    ) -> tuple[Tensor | None, Tensor | None]:
        """Split the positions given to ``MultiHeadAttention``: ``(token, rotary)``.

        Axis positions ``[A, T]`` / ``[A, B, T]`` rotate, and the tokens are ordered (masked
        and cached) by their index; text positions serve both, as for any encoding.
        """
        positions = self.axis_positions(positions, length, batch, "positions")
        if _has_axes(positions, self.num_axes):
            return None, positions
        return positions, None

    def cos_sin(self, positions: Tensor, *, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` ``[T, R/2]`` or ``[B, T, R/2]`` of validated ``positions``."""
        cos, sin = self.rope.cos_sin(positions, dtype=compute_dtype(dtype))
        if not _has_axes(positions, self.num_axes):
            return cos, sin  # text: the axes agree
        axes = self._axes.to(cos.device).expand(1, *cos.shape[1:])  # [1, (B,) T, R/2]
        return cos.gather(0, axes).squeeze(0), sin.gather(0, axes).squeeze(0)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]`` at their M-RoPE positions.

        Raises:
            ValueError: head_dim or batch mismatch; positions as in ``axis_positions``.
        """
        batch = check_qk(q, k, self.head_dim)
        q_pos = self.axis_positions(q_pos, q.shape[-2], batch, "q_pos").to(q.device)
        k_pos = self.axis_positions(k_pos, k.shape[-2], batch, "k_pos").to(k.device)
        out = []
        for x, pos in ((q, q_pos), (k, k_pos)):
            cos, sin = self.cos_sin(pos, dtype=x.dtype)
            if cos.dim() == 3 and cos.shape[0] != batch:
                cos, sin = cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)
            out.append(apply_rope(x, cos, sin, interleaved=self.rope.interleaved))
        return out[0], out[1]

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, mrope_section={list(self.mrope_section)}, "
            f"mrope_interleaved={self.mrope_interleaved}"
        )


# --------------------------------------------------------------------------- position ids

Segment = int | tuple[int, int, int] | tuple[int, int, int, float]


def mrope_position_ids(
    segments: Sequence[Segment], *, spatial_merge_size: int = 1
) -> tuple[Tensor, int]:
    """M-RoPE positions of one sequence of text runs and image/video grids.

    As ``get_rope_index`` of Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V in transformers: a
    text run continues one counter on all three axes; a grid of ``(t, h, w)`` patches
    (``grid_thw``, before merging) becomes ``t x h' x w'`` tokens, ``h' = h / m``,
    ``w' = w / m``, in row-major order, at ``(start + floor(i * interval), start + y,
    start + x)``, and the counter then advances by ``max(h', w')``.

    Args:
        segments: in order, an int (that many text tokens) or a grid ``(t, h, w)`` or
            ``(t, h, w, interval)`` (Qwen2.5-VL videos: ``interval = tokens_per_second *
            second_per_grid_t``; images and the others: 1). Qwen3-VL and GLM-4V cut a
            video into one ``(1, h, w)`` grid per frame, each after its timestamp text.
        spatial_merge_size: ``m``, the vision tower's patch merge (2 in the releases).

    Returns:
        ``(positions [3, T] int64, rope_delta)`` with ``rope_delta = max + 1 - T``: decoding
        continues at ``mrope_decode_positions(T, n, rope_delta)``.

    Raises:
        ValueError: a grid with a non-positive size, ``h`` or ``w`` not divisible by ``m``,
            a segment of another form, or no tokens at all.
    """
    merge = check_int("spatial_merge_size", spatial_merge_size)
    parts, start = [], 0
    for i, segment in enumerate(segments):
        if isinstance(segment, int) and not isinstance(segment, bool):
            length = check_int(f"segments[{i}] (text length)", segment, minimum=0)
            parts.append((torch.arange(length) + start).expand(AXES, -1))
            start += length
            continue
        grid, interval = _grid(segment, merge, i)
        t, h, w = grid
        time = (torch.arange(t, dtype=torch.float64) * interval).long()
        axes = torch.meshgrid(time, torch.arange(h), torch.arange(w), indexing="ij")
        parts.append(torch.stack(axes).reshape(AXES, -1) + start)
        start += max(h, w)
    if not parts or sum(p.shape[1] for p in parts) == 0:
        raise ValueError(f"segments hold no tokens: {list(segments)!r}")
    positions = torch.cat(parts, dim=1)
    return positions, int(positions.max()) + 1 - positions.shape[1]


def _grid(segment: object, merge: int, i: int) -> tuple[tuple[int, int, int], float]:
    if not isinstance(segment, (tuple, list)) or len(segment) not in (3, 4):
        raise ValueError(
            f"segments[{i}] must be a text length or a grid (t, h, w[, interval]), got {segment!r}"
        )
    t, h, w = (check_int(f"segments[{i}][{j}]", v) for j, v in enumerate(segment[:3]))
    if h % merge or w % merge:
        raise ValueError(
            f"segments[{i}] grid {(t, h, w)} is not divisible by spatial_merge_size={merge}"
        )
    interval = 1.0
    if len(segment) == 4:
        interval = check_float(f"segments[{i}] interval", segment[3], positive=True)
    return (t, h // merge, w // merge), interval


def mrope_decode_positions(past_length: int, length: int, rope_delta: int) -> Tensor:
    """Positions ``[3, T]`` of ``length`` text tokens after ``past_length`` cached ones:
    ``past_length + arange(length) + rope_delta`` on every axis (transformers' decoding)."""
    past_length = check_int("past_length", past_length, minimum=0)
    length = check_int("length", length, minimum=0)
    if isinstance(rope_delta, bool) or not isinstance(rope_delta, int):
        raise TypeError(f"rope_delta must be an integer, got {rope_delta!r}")
    return (torch.arange(length) + past_length + rope_delta).expand(AXES, -1)
