"""Float64 NumPy reference for the RoPE schemes of current checkpoints: proportional
RoPE, M-RoPE, 2-D axial RoPE, position temperature and MLA's decoupled RoPE.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim, ``P =
R/2`` pairs. Every scheme is "pair ``i`` of a vector, read as the complex number
``a + ib``, is multiplied by ``exp(i phi_i)``" (Su et al. 2021, "RoFormer", sec. 3.2)
with a per-pair angle ``phi_i`` written here from each scheme's definition:

* proportional (Barbero et al. 2024; Gemma 4): ``phi_i = m base^(-2i/D) / s`` for
  ``i < int(p D // 2)``, else 0, over all ``D`` features;
* M-RoPE (Qwen2-VL, sec. 2.1): ``phi_i = pos[axis(i)] theta_i``, the axis of pair ``i``
  given by contiguous sections, or cyclically (``i % 3``) within ``3 s_axis`` (Qwen3-VL);
* axial 2-D (Heo et al. 2024): ``phi_i = y f_y[i]`` for ``i < D/4``, ``x f_x[i - D/4]``
  after;
* MLA (DeepSeek-V2, sec. 2.1.3): RoPE of dim ``R`` on the last ``R`` features only.

Written from the formulas, independent of ``posenc.encodings``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "axial_frequencies",
    "axial_rotate",
    "mla_rotate",
    "mrope_axes",
    "mrope_rotate",
    "position_temperature",
    "proportional_frequencies",
    "rotate_by_angles",
]


def rotate_by_angles(x: np.ndarray, angles: np.ndarray, *, interleaved: bool = False) -> np.ndarray:
    """Rotate pair ``i`` of ``x [..., T, D]`` by ``angles [..., T, P]`` (broadcast).

    Pairs ``(i, i + P)`` (half-split) or ``(2i, 2i + 1)``; features ``2P..D-1`` unchanged.
    """
    x = np.asarray(x, dtype=np.float64)
    pairs = angles.shape[-1]
    if interleaved:
        first, second = np.arange(0, 2 * pairs, 2), np.arange(1, 2 * pairs, 2)
    else:
        first, second = np.arange(pairs), np.arange(pairs, 2 * pairs)
    z = (x[..., first] + 1j * x[..., second]) * np.exp(1j * angles)
    out = x.copy()
    out[..., first], out[..., second] = z.real, z.imag
    return out


def proportional_frequencies(
    head_dim: int, base: float, fraction: float, factor: float = 1.0
) -> np.ndarray:
    """``[D/2]``: ``base^(-2i/D) / factor`` for the first ``int(fraction * D // 2)`` pairs,
    0 after."""
    kept = int(fraction * head_dim // 2)
    i = np.arange(head_dim // 2, dtype=np.float64)
    return np.where(i < kept, np.exp(-(2.0 * i / head_dim) * math.log(base)), 0.0) / factor


def mrope_axes(sections: list[int], *, cyclic: bool = False) -> np.ndarray:
    """Axis (0 t, 1 h, 2 w) of each of the ``sum(sections)`` pairs."""
    pairs = sum(sections)
    if not cyclic:
        return np.concatenate([np.full(n, a) for a, n in enumerate(sections)]).astype(int)
    out = np.zeros(pairs, dtype=int)
    for i in range(pairs):
        for axis in (1, 2):
            if i % 3 == axis and i < 3 * sections[axis]:
                out[i] = axis
    return out


def mrope_rotate(
    x: np.ndarray,
    positions: np.ndarray,
    theta: np.ndarray,
    sections: list[int],
    *,
    cyclic: bool = False,
    interleaved: bool = False,
) -> np.ndarray:
    """M-RoPE of ``x [B, H, T, D]`` at ``positions [3, T] | [3, B, T]``, ``theta [P]``."""
    positions = np.asarray(positions, dtype=np.float64)
    axes = mrope_axes(sections, cyclic=cyclic)
    angles = np.stack([positions[a] for a in axes], axis=-1) * theta  # [(B,) T, P]
    if angles.ndim == 3:
        angles = angles[:, None]  # [B, 1, T, P]
    return rotate_by_angles(x, angles, interleaved=interleaved)


def axial_frequencies(head_dim: int, base: float, *, alternating: bool) -> np.ndarray:
    """``[D/2]``: row frequencies ``base^(-4i/D)``, then column ones (shifted by 2/D if
    ``alternating``), ``i < D/4``."""
    i = np.arange(head_dim // 4, dtype=np.float64)
    rows = base ** (-4.0 * i / head_dim)
    cols = base ** (-(4.0 * i + (2.0 if alternating else 0.0)) / head_dim)
    return np.concatenate([rows, cols])


def axial_rotate(
    x: np.ndarray,
    positions: np.ndarray,
    head_dim: int,
    base: float,
    *,
    alternating: bool = False,
    prefix: int = 0,
) -> np.ndarray:
    """Axial RoPE of ``x [B, H, T, D]``; ``positions [N, 2]`` for the last ``N = T - prefix``."""
    positions = np.asarray(positions, dtype=np.float64)
    freqs = axial_frequencies(head_dim, base, alternating=alternating)
    quarter = head_dim // 4
    angles = np.concatenate(
        [positions[..., :1] * freqs[:quarter], positions[..., 1:] * freqs[quarter:]], axis=-1
    )  # [(B,) N, D/2]
    if angles.ndim == 3:
        angles = angles[:, None]
    out = np.asarray(x, dtype=np.float64).copy()
    out[..., prefix:, :] = rotate_by_angles(out[..., prefix:, :], angles)
    return out


def position_temperature(
    positions: np.ndarray, beta: float, length: int, offset: int = 0
) -> np.ndarray:
    """``1 + beta * ln(1 + floor((m + offset) / length))`` per position ``m``."""
    m = np.asarray(positions, dtype=np.float64)
    return 1.0 + beta * np.log(1.0 + np.floor((m + offset) / length))


def mla_rotate(
    x: np.ndarray,
    positions: np.ndarray,
    theta: np.ndarray,
    *,
    rope_interleave: bool = False,
    attention_scale: float = 1.0,
) -> np.ndarray:
    """MLA's decoupled RoPE of ``x [B, H, T, D]``: the last ``R = 2 len(theta)`` features
    rotate (read as adjacent pairs, written ``[even | odd]`` when ``rope_interleave``),
    times ``attention_scale``; the first ``D - R`` stay."""
    x = np.asarray(x, dtype=np.float64)
    rope_dim = 2 * len(theta)
    nope, rope = x[..., :-rope_dim], x[..., -rope_dim:]
    if rope_interleave:
        z = rope[..., 0::2] + 1j * rope[..., 1::2]
    else:
        z = rope[..., : rope_dim // 2] + 1j * rope[..., rope_dim // 2 :]
    angles = np.asarray(positions, dtype=np.float64)[..., None] * theta
    if angles.ndim == 3:
        angles = angles[:, None]
    z = z * np.exp(1j * angles) * attention_scale
    return np.concatenate([nope, z.real, z.imag], axis=-1)
