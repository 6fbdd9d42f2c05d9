"""Float64 NumPy reference for VideoRoPE (Wei et al. 2025, "VideoRoPE: What Makes for
Good Video Rotary Position Embedding?", ICML, arXiv 2502.05173, sec. 4).

Shapes: ``H`` heads, ``T`` length, ``D`` head_dim, ``P = D/2`` pairs. Pair ``i`` of a
vector, read as ``a + ib``, is multiplied by ``exp(i pos[axis(i)] theta_i)`` with
``theta_i = base^(-2i/D)``; LTA gives time the last ``s_t`` pairs (lowest frequencies) and
alternates height and width over the first ``2 s_h``. Positions (DL + ATS): text counts on,
equal on the three axes; frame ``f``, row ``r``, column ``c`` of a ``t x h x w`` grid at
start ``s`` sit at ``(s + delta f, s + delta f + r - floor((h-1)/2), s + delta f + c -
floor((w-1)/2))``, and what follows starts at ``s + delta (t - 1) + 1``. Written from the
formulas, independent of ``posenc.encodings``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["videorope_axes", "videorope_positions", "videorope_rotate"]


def videorope_axes(sections: tuple[int, int, int]) -> list[int]:
    """Axis (0 time, 1 height, 2 width) of each pair: spatial pairs first, alternating."""
    time, height, width = sections
    spatial = [1 if j % 2 == 0 else 2 for j in range(height + width)]
    return spatial + [0] * time


def videorope_positions(segments: list, merge: int, delta: float) -> np.ndarray:
    """Positions ``[3, T]`` (float64) of text lengths and ``(t, h, w)`` grids."""
    columns, start = [], 0.0
    for segment in segments:
        if isinstance(segment, int):
            columns += [(start + n,) * 3 for n in range(segment)]
            start += segment
            continue
        t, h, w = segment[0], segment[1] // merge, segment[2] // merge
        for f in range(t):
            for r in range(h):
                for c in range(w):
                    time = start + delta * f
                    columns.append((time, time + r - (h - 1) // 2, time + c - (w - 1) // 2))
        start += delta * (t - 1) + 1
    return np.array(columns, dtype=np.float64).T


def videorope_rotate(
    x: np.ndarray, positions: np.ndarray, base: float, sections: tuple[int, int, int]
) -> np.ndarray:
    """VideoRoPE of ``x [..., T, D]`` (half-split pairs) at ``positions [3, T]``."""
    x = np.asarray(x, dtype=np.float64)
    dim = x.shape[-1]
    pairs = dim // 2
    out = x.copy()
    for i, axis in enumerate(videorope_axes(sections)):
        theta = math.exp(-(2.0 * i / dim) * math.log(base))
        angle = positions[axis] * theta  # [T]
        a, b = x[..., i], x[..., i + pairs]
        out[..., i] = a * np.cos(angle) - b * np.sin(angle)
        out[..., i + pairs] = a * np.sin(angle) + b * np.cos(angle)
    return out
