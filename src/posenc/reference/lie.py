"""Rotations from skew-symmetric generators in float64 NumPy: LieRE (Ostmeier et al. 2024,
"LieRE: Generalizing Rotary Position Encodings", sec. 3) and ComRoPE (Yu et al. 2025,
CVPR, sec. 3-4), written from ``R(p) = exp(sum_a p_a A_a)``.

Shapes: ``N`` tokens, ``D`` head_dim, ``A`` axes, ``K`` blocks of ``b`` features.

The exponential is computed from the spectral theorem, not a Pade approximant (the torch
code's ``matrix_exp``): a real skew-symmetric ``G`` makes ``iG`` Hermitian, so
``iG = U diag(w) U^H`` with real ``w`` and ``exp(G) = U diag(exp(-i w)) U^H``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lie_rotate", "skew_expm"]


def skew_expm(generator: np.ndarray) -> np.ndarray:
    """``exp(G)`` of skew-symmetric ``G [..., b, b]`` (float64, orthogonal)."""
    g = np.asarray(generator, dtype=np.float64)
    w, u = np.linalg.eigh(1j * g)
    return np.real((u * np.exp(-1j * w)[..., None, :]) @ np.conj(np.swapaxes(u, -1, -2)))


def lie_rotate(x: np.ndarray, generators: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``R(p_n) x_n`` per token: ``x [N, D]``, ``generators [A, K, b, b]``, ``positions
    [N, A]`` -> ``[N, D]``; block ``k`` of ``x_n`` is rotated by
    ``exp(sum_a p_{n,a} A_{a,k})``."""
    x, gens, pos = (np.asarray(a, dtype=np.float64) for a in (x, generators, positions))
    axes, blocks, size, _ = gens.shape
    out = np.empty_like(x)
    for n in range(x.shape[0]):
        for k in range(blocks):
            g = sum(pos[n, a] * gens[a, k] for a in range(axes))
            part = slice(k * size, (k + 1) * size)
            out[n, part] = skew_expm(g) @ x[n, part]
    return out
