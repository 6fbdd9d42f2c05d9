"""Dual chunk attention in float64 NumPy (An et al. 2024, "Training-Free Long-Context
Scaling of Large Language Models", ICML 2024, sec. 3), written from the index maps.

Shapes: ``H`` heads, ``T`` tokens (causal self-attention at positions ``0..T-1``), ``D``
head_dim. Chunks hold ``s = chunk_size - local_size`` tokens; key ``j`` sits at index
``j mod s``; query ``i`` (offset ``i' = i mod s``) at ``i'`` for a key of its own chunk,
``min(i' + s, chunk_size)`` for one of the previous chunk, ``min(2s - 1, chunk_size)``
for an older one. Each logit is ``q_i^T R(a)^T R(b) k_j / sqrt(D)`` with the RoPE rotation
matrices ``R`` (half-split pairs ``(m, m + D/2)``, frequencies ``base^(-2m/D)``) built
whole, then one softmax per row.
"""

from __future__ import annotations

import numpy as np

__all__ = ["dual_chunk_attention", "dual_chunk_query_index"]


def dual_chunk_query_index(i: int, j: int, *, chunk_size: int, local_size: int) -> int:
    """The index query ``i`` is rotated at when it attends to key ``j <= i``."""
    s = chunk_size - local_size
    offset = i % s
    if i // s == j // s:
        return offset
    if i // s == j // s + 1:
        return min(offset + s, chunk_size)
    return min(2 * s - 1, chunk_size)


def _rotation(position: int, dim: int, base: float) -> np.ndarray:
    """RoPE's ``[D, D]`` rotation at ``position``, half-split pairs."""
    half = dim // 2
    angles = position * base ** (-2.0 * np.arange(half) / dim)
    out = np.zeros((dim, dim))
    for m, a in enumerate(angles):
        out[m, m], out[m, m + half] = np.cos(a), -np.sin(a)
        out[m + half, m], out[m + half, m + half] = np.sin(a), np.cos(a)
    return out


def dual_chunk_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    chunk_size: int,
    local_size: int,
    base: float = 10000.0,
) -> np.ndarray:
    """Causal DCA of ``q, k, v [H, T, D]`` (unrotated) -> ``[H, T, D]``."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    heads, length, dim = q.shape
    s = chunk_size - local_size
    out = np.zeros_like(q)
    for h in range(heads):
        for i in range(length):
            logits = np.array([
                q[h, i] @ _rotation(dual_chunk_query_index(
                    i, j, chunk_size=chunk_size, local_size=local_size), dim, base).T
                @ _rotation(j % s, dim, base) @ k[h, j] / np.sqrt(dim)
                for j in range(i + 1)
            ])  # fmt: skip
            weights = np.exp(logits - logits.max())
            out[h, i] = weights @ v[h, : i + 1] / weights.sum()
    return out
