"""VideoRoPE: M-RoPE for video with the temporal axis on the lowest frequencies, visual
tokens laid along the text diagonal, and an adjustable temporal spacing (Wei et al. 2025,
"VideoRoPE: What Makes for Good Video Rotary Position Embedding?", ICML, arXiv
2502.05173, sec. 4).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``P = D/2`` pairs;
positions ``[3, T]`` or ``[3, B, T]`` on the axes (0 time, 1 height, 2 width), text
positions ``[T]`` / ``[B, T]`` equal on the three. ``mrope_section = (s_t, s_h, s_w)``,
``s_h == s_w``, summing to ``P``.

* Low-frequency Temporal Allocation (LTA): the last ``s_t`` pairs, the lowest
  frequencies, follow time; the first ``2 s_h`` pairs alternate height and width
  (height first), so both spatial axes keep high and middle frequencies. M-RoPE
  (Qwen2-VL) gives time the highest frequencies instead.
* Diagonal Layout (DL): in a ``t x h x w`` grid starting at position ``s`` (one past the
  text before it), the token of frame ``f``, row ``r``, column ``c`` sits at
  ``(s + delta f, s + delta f + r - floor((h - 1) / 2), s + delta f + c - floor((w - 1) / 2))``:
  each frame is centred on the diagonal ``t = h = w`` that text tokens follow.
* Adjustable Temporal Spacing (ATS): frames are ``delta`` positions apart (the paper's
  experiments: 2); the text after a grid continues one past its last frame's time.

The frequency allocation and the positions follow the authors' released code (its
``apply_m_modify_multimodal_rotary_pos_emb`` and ``get_t_scale_rope_index`` for Qwen2-VL).
Text-only sequences are plain RoPE. ``videorope_position_ids`` builds the positions of a
text + video sequence; decoding continues at ``mrope_decode_positions(T, n, rope_delta)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posenc._checks import check_even, check_float, check_int
from posenc.base import register
from posenc.encodings.rotary.mrope import AXES, MRoPE, _sections
from posenc.encodings.rotary.scaling import DEFAULT_BASE, ScalingSpec

__all__ = ["VideoRoPE", "videorope_pair_axes", "videorope_position_ids"]

DEFAULT_TEMPORAL_STRIDE = 2.0  # delta in the paper's experiments


def videorope_pair_axes(mrope_section: Sequence[int]) -> list[int]:
    """The axis of each pair under LTA: ``[1, 2] * s_h + [0] * s_t``.

    Raises:
        ValueError: not three sections, a negative one, or ``s_h != s_w``.
    """
    time, height, width = _sections(mrope_section)
    if height != width:
        raise ValueError(
            f"VideoRoPE alternates height and width pairs, so mrope_section needs s_h == s_w, "
            f"got {[time, height, width]}"
        )
    return [1, 2] * height + [0] * time


def _default_sections(pairs: int) -> tuple[int, int, int]:
    """A quarter of the pairs for time (rounded so the rest splits evenly): Qwen2-VL's
    ``(16, 24, 24)`` for ``P = 64``."""
    time = pairs // 4 + (pairs - pairs // 4) % 2
    return time, (pairs - time) // 2, (pairs - time) // 2


@register(
    "video_rope",
    paper="Wei et al. 2025, VideoRoPE (ICML, arXiv 2502.05173, sec. 4)",
    description="M-RoPE with time on the lowest frequencies and height/width alternating [3, T]",
)
class VideoRoPE(MRoPE):
    """VideoRoPE on queries and keys at positions ``[3, T]`` / ``[3, B, T]`` (text: ``[T]``).

    Args:
        head_dim: ``D``, even; the whole head rotates (half-split pairs, as Qwen2-VL).
        mrope_section: ``(s_t, s_h, s_w)`` with ``s_h == s_w``, summing to ``D/2``; None:
            a quarter of the pairs for time, e.g. ``(16, 24, 24)`` for ``D = 128``.
        base: the RoPE base.
        scaling: a frequency scaling (not length-dependent), as for ``RotaryEmbedding``.
        max_len: cos/sin cache length built up front.

    Raises:
        ValueError: sections not summing to ``D/2`` or with ``s_h != s_w``; the errors of
            ``MRoPE``.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        mrope_section: Sequence[int] | None = None,
        base: float = DEFAULT_BASE,
        scaling: ScalingSpec = None,
        max_len: int = 2048,
    ) -> None:
        pairs = check_even("head_dim", head_dim) // 2
        sections = _default_sections(pairs) if mrope_section is None else mrope_section
        axes = videorope_pair_axes(sections)
        if len(axes) != pairs:
            raise ValueError(
                f"mrope_section {list(sections)} sums to {len(axes)}, but the head has "
                f"{pairs} pairs (head_dim={head_dim})"
            )
        super().__init__(head_dim, base=base, scaling=scaling, pair_axes=axes, max_len=max_len)


def videorope_position_ids(
    segments: Sequence[int | tuple[int, int, int]],
    *,
    spatial_merge_size: int = 1,
    temporal_stride: float = DEFAULT_TEMPORAL_STRIDE,
) -> tuple[Tensor, float]:
    """VideoRoPE positions ``[3, T]`` of one sequence of text runs and video/image grids.

    A text run of ``n`` tokens takes ``s .. s + n - 1`` on every axis; a grid ``(t, h, w)``
    (before merging) becomes ``t x h' x w'`` tokens (``h' = h / m``, ``w' = w / m``) in
    row-major order at the diagonal layout of the module docstring with ``delta =
    temporal_stride``; the next segment starts one past the previous one's largest time.

    Args:
        segments: in order, an int (text tokens) or a grid ``(t, h, w)`` (an image: ``t = 1``).
        spatial_merge_size: ``m``, the vision tower's patch merge (2 in Qwen2-VL).
        temporal_stride: ``delta > 0``, the positions between frames.

    Returns:
        ``(positions, rope_delta)``: int64 positions when ``delta`` is a whole number,
        float64 otherwise; ``rope_delta = max time + 1 - T`` (an int when whole), so
        decoding continues at ``past + arange(n) + rope_delta`` on every axis.

    Raises:
        ValueError: a grid with a non-positive size or not divisible by ``m``, a segment of
            another form, ``delta <= 0``, or no tokens at all.
    """
    merge = check_int("spatial_merge_size", spatial_merge_size)
    delta = check_float("temporal_stride", temporal_stride, positive=True)
    parts, start = [], 0.0
    for i, segment in enumerate(segments):
        if isinstance(segment, int) and not isinstance(segment, bool):
            length = check_int(f"segments[{i}] (text length)", segment, minimum=0)
            parts.append((torch.arange(length, dtype=torch.float64) + start).expand(AXES, -1))
            start += length
            continue
        t, h, w = _grid(segment, merge, i)
        frame, row, col = torch.meshgrid(
            *(torch.arange(n, dtype=torch.float64) for n in (t, h, w)), indexing="ij"
        )
        time = start + delta * frame
        grid = (time, time + row - (h - 1) // 2, time + col - (w - 1) // 2)
        parts.append(torch.stack(grid).reshape(AXES, -1))
        start = start + delta * (t - 1) + 1
    if not parts or sum(p.shape[1] for p in parts) == 0:
        raise ValueError(f"segments hold no tokens: {list(segments)!r}")
    positions = torch.cat(parts, dim=1)
    rope_delta = float(positions[0].max()) + 1 - positions.shape[1]
    if delta.is_integer():
        return positions.long(), int(rope_delta)
    return positions, rope_delta


def _grid(segment: object, merge: int, i: int) -> tuple[int, int, int]:
    if not isinstance(segment, (tuple, list)) or len(segment) != AXES:
        raise ValueError(
            f"segments[{i}] must be a text length or a grid (t, h, w), got {segment!r}"
        )
    t, h, w = (check_int(f"segments[{i}][{j}]", v) for j, v in enumerate(segment))
    if h % merge or w % merge:
        raise ValueError(
            f"segments[{i}] grid {(t, h, w)} is not divisible by spatial_merge_size={merge}"
        )
    return t, h // merge, w // merge
