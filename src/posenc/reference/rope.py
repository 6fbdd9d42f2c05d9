"""Float64 NumPy reference for rotary encodings: RoPE, its frequency scalings, and xPos.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim (even);
``theta [R/2]`` are the inverse frequencies.

RoPE (Su et al. 2021, "RoFormer", sec. 3.2): pair ``i`` of a vector, ``(a, b)``, read as
the complex number ``a + ib``, is multiplied by ``exp(i m theta_i)`` at position ``m``.
Pairs are ``(i, i + R/2)`` (half-split) or ``(2i, 2i + 1)`` (interleaved); features
beyond ``R`` are unchanged. Frequencies, with ``s`` the factor and ``L0`` the original
length (each from its paper or, where the paper leaves a choice, from the reference code
that checkpoints were trained with):

* RoFormer: ``theta_i = base ** (-2i / R)``;
* linear / position interpolation (Chen et al. 2023): ``theta_i / s``;
* NTK-aware (bloc97 2023): ``theta_i`` of the base ``base * s ** (R / (R - 2))``;
* dynamic NTK (emozilla 2023): NTK with ``s' = s n / L0 - (s - 1)``, ``n = max(len, L0)``;
* YaRN (Peng et al. 2023, sec. 3): pair ``i`` turns ``L0 theta_i / (2 pi)`` times over
  ``L0``; between the pair indices where it turns ``beta_fast`` and ``beta_slow`` times
  a linear ramp blends ``theta_i`` into ``theta_i / s``; attention factor ``0.1 ln s + 1``;
* Llama 3.1 (Meta 2024): wavelengths ``2 pi / theta_i`` below ``L0 / high`` keep
  ``theta_i``, above ``L0 / low`` become ``theta_i / s``, and are blended between;
* LongRoPE (Ding et al. 2024): ``theta_i / f_i``, ``f`` the short list up to ``L0`` and
  the long list beyond; attention factor ``sqrt(1 + ln s / ln L0)``;
* xPos (Sun et al. 2022, sec. 3.2): the RoPE rotation times ``zeta_i ** (+-m / scale_base)``
  (``+`` for queries, ``-`` for keys), ``zeta_i = (2i + 0.4 R) / (1.4 R)``.

Plain NumPy written from the formulas, independent of ``posenc.encodings``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "dynamic_ntk_frequencies",
    "linear_frequencies",
    "llama3_frequencies",
    "longrope_attention_factor",
    "longrope_frequencies",
    "ntk_frequencies",
    "rope_frequencies",
    "rope_rotate",
    "rope_rotation_matrix",
    "xpos_rotate",
    "yarn_attention_factor",
    "yarn_frequencies",
]


def rope_frequencies(dim: int, base: float = 10000.0) -> np.ndarray:
    """RoFormer ``theta_i = exp(-(2i / dim) ln base)``, ``i < dim/2``."""
    i = np.arange(dim // 2, dtype=np.float64)
    return np.exp(-(2.0 * i / dim) * math.log(base))


def linear_frequencies(dim: int, base: float, factor: float) -> np.ndarray:
    """Position interpolation: every frequency divided by ``factor``."""
    return rope_frequencies(dim, base) / factor


def ntk_frequencies(dim: int, base: float, factor: float) -> np.ndarray:
    """NTK-aware: the RoFormer frequencies of the enlarged base."""
    return rope_frequencies(dim, base * factor ** (dim / (dim - 2)))


def dynamic_ntk_frequencies(
    dim: int, base: float, factor: float, original_len: int, seq_len: int
) -> np.ndarray:
    """Dynamic NTK at length ``seq_len``."""
    n = max(seq_len, original_len)
    return ntk_frequencies(dim, base, factor * n / original_len - (factor - 1.0))


def yarn_frequencies(
    dim: int,
    base: float,
    factor: float,
    original_len: int,
    *,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> np.ndarray:
    """YaRN ("NTK-by-parts") frequencies, pair by pair."""
    theta = rope_frequencies(dim, base)

    def pair_turning(turns: float) -> float:  # solve L0 * base**(-2i/dim) / (2 pi) = turns
        return math.log(original_len / (2.0 * math.pi * turns)) / math.log(base) * dim / 2.0

    lo, hi = pair_turning(beta_fast), pair_turning(beta_slow)
    if truncate:
        lo, hi = float(math.floor(lo)), float(math.ceil(hi))
    lo, hi = max(lo, 0.0), min(hi, dim - 1.0)
    if hi == lo:
        hi = lo + 0.001
    out = np.empty_like(theta)
    for i, t in enumerate(theta):
        blend = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: keep, 1: interpolate
        out[i] = (1.0 - blend) * t + blend * (t / factor)
    return out


def yarn_attention_factor(
    factor: float, *, mscale: float | None = None, mscale_all_dim: float | None = None
) -> float:
    """``0.1 ln s + 1`` (1 for ``s <= 1``), or the ratio of two such terms (DeepSeek-V2)."""

    def temperature(coefficient: float) -> float:
        return 1.0 if factor <= 1.0 else 1.0 + 0.1 * coefficient * math.log(factor)

    if mscale and mscale_all_dim:
        return temperature(mscale) / temperature(mscale_all_dim)
    return temperature(1.0)


def llama3_frequencies(
    dim: int,
    base: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_len: int,
) -> np.ndarray:
    """Llama 3.1 frequencies, pair by pair."""
    out = []
    for t in rope_frequencies(dim, base):
        wavelength = 2.0 * math.pi / t
        if wavelength < original_len / high_freq_factor:
            out.append(t)
        elif wavelength > original_len / low_freq_factor:
            out.append(t / factor)
        else:
            a = (original_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(a * t + (1.0 - a) * t / factor)
    return np.array(out)


def longrope_frequencies(
    dim: int,
    base: float,
    short_factor: list[float],
    long_factor: list[float],
    original_len: int,
    seq_len: int | None,
) -> np.ndarray:
    """LongRoPE frequencies at length ``seq_len`` (None: short)."""
    factors = long_factor if seq_len is not None and seq_len > original_len else short_factor
    return rope_frequencies(dim, base) / np.asarray(factors, dtype=np.float64)


def longrope_attention_factor(factor: float, original_len: int) -> float:
    """``sqrt(1 + ln s / ln L0)``, 1 for ``s <= 1``."""
    return 1.0 if factor <= 1.0 else math.sqrt(1.0 + math.log(factor) / math.log(original_len))


def _pairs(rotary_dim: int, interleaved: bool) -> tuple[list[int], list[int]]:
    if interleaved:
        return list(range(0, rotary_dim, 2)), list(range(1, rotary_dim, 2))
    return list(range(rotary_dim // 2)), list(range(rotary_dim // 2, rotary_dim))


def rope_rotate(
    x: np.ndarray,
    positions: np.ndarray,
    theta: np.ndarray,
    *,
    interleaved: bool = False,
    attention_scale: float = 1.0,
    pair_scale: np.ndarray | None = None,
) -> np.ndarray:
    """Rotate ``x [B, H, T, D]`` (or ``[T, D]``) at ``positions [T] | [B, T]``.

    ``pair_scale [T, R/2] | [B, T, R/2]`` optionally multiplies each rotated pair (xPos).
    Returns a new float64 array.
    """
    x = np.asarray(x, dtype=np.float64)
    first, second = _pairs(2 * len(theta), interleaved)
    z = x[..., first] + 1j * x[..., second]  # [..., T, R/2]
    angles = np.asarray(positions, dtype=np.float64)[..., None] * np.asarray(theta)
    factor = np.exp(1j * angles) * attention_scale
    if pair_scale is not None:
        factor = factor * pair_scale
    if factor.ndim == 3 and x.ndim == 4:  # per-sequence positions: [B, 1, T, R/2]
        factor = factor[:, None]
    z = z * factor
    out = x.copy()
    out[..., first], out[..., second] = z.real, z.imag
    return out


def rope_rotation_matrix(
    position: float, theta: np.ndarray, head_dim: int, *, interleaved: bool = False
) -> np.ndarray:
    """The ``[D, D]`` matrix ``R_m`` with ``rope_rotate(x) = R_m x`` (block rotations)."""
    first, second = _pairs(2 * len(theta), interleaved)
    rot = np.eye(head_dim)
    for a, b, t in zip(first, second, theta, strict=True):
        c, s = math.cos(position * t), math.sin(position * t)
        rot[a, a], rot[a, b], rot[b, a], rot[b, b] = c, -s, s, c
    return rot


def xpos_rotate(
    x: np.ndarray,
    positions: np.ndarray,
    theta: np.ndarray,
    *,
    scale_base: float = 512.0,
    key: bool = False,
    interleaved: bool = False,
) -> np.ndarray:
    """xPos of queries (``key=False``) or keys at ``positions``."""
    rotary_dim = 2 * len(theta)
    zeta = (2.0 * np.arange(rotary_dim // 2) + 0.4 * rotary_dim) / (1.4 * rotary_dim)
    power = np.asarray(positions, dtype=np.float64)[..., None] / scale_base
    decay = zeta ** (-power if key else power)
    return rope_rotate(x, positions, theta, interleaved=interleaved, pair_scale=decay)
