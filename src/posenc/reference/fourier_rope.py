"""Float64 NumPy reference for FoPE, the Fourier position embedding (Hua et al. 2025,
"Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length
Generalization", ICML, arXiv 2412.17739, sec. 5).

Shapes: ``H`` heads, ``Hc`` coefficient heads, ``T`` length, ``D`` head_dim, ``P = D/2``
pairs, ``F`` kept frequencies. Pair ``j`` of head ``h`` at position ``m`` is read as the
complex number ``a + ib`` and multiplied by ``c_j(m) + i s_j(m)`` where, for ``j < F``,
``c_j(m) = sum_i Ccos[g, i, j] cos(m theta_i)`` and ``s_j(m) = sum_i Csin[g, i, j]
sin(m theta_i)`` (``g = h // (H / Hc)``), and ``c = 1, s = 0`` for the clipped pairs
``j >= F`` (zero frequency). The kept frequencies are ``theta_i = base^(-2i/D)`` above the
floor ``2 pi / L``. Written from the formulas, independent of ``posenc.encodings``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fope_kept_frequencies", "fope_transform"]


def fope_kept_frequencies(head_dim: int, base: float, train_len: int | None) -> np.ndarray:
    """``theta_i = base^(-2i/D)`` for ``i < D/2`` with ``theta_i > 2 pi / L`` (all when
    ``train_len`` is None), float64 ``[F]``."""
    theta = np.array([base ** (-2.0 * i / head_dim) for i in range(head_dim // 2)])
    if train_len is None:
        return theta
    return theta[theta > 2.0 * math.pi / train_len]


def fope_transform(
    x: np.ndarray,
    positions: np.ndarray,
    theta: np.ndarray,
    cos_coef: np.ndarray,
    sin_coef: np.ndarray,
    *,
    clipped_sin: float = 0.0,
    interleaved: bool = False,
) -> np.ndarray:
    """FoPE of ``x [H, T, D]`` at ``positions [T]`` with kept frequencies ``theta [F]`` and
    coefficients ``[Hc, F, F]``; float64 ``[H, T, D]``. A clipped pair multiplies by
    ``1 + i clipped_sin`` (0: zero frequency, the paper; 1: the released code)."""
    x = np.asarray(x, dtype=np.float64)
    heads, length, dim = x.shape
    pairs, kept = dim // 2, len(theta)
    group = heads // cos_coef.shape[0]
    out = x.copy()
    for h in range(heads):
        g = h // group
        for t in range(length):
            m = float(positions[t])
            for j in range(pairs):
                if j < kept:
                    c = sum(cos_coef[g, i, j] * math.cos(m * theta[i]) for i in range(kept))
                    s = sum(sin_coef[g, i, j] * math.sin(m * theta[i]) for i in range(kept))
                else:
                    c, s = 1.0, clipped_sin
                ia, ib = (2 * j, 2 * j + 1) if interleaved else (j, j + pairs)
                a, b = x[h, t, ia], x[h, t, ib]
                out[h, t, ia] = a * c - b * s
                out[h, t, ib] = a * s + b * c
    return out
