"""Float64 NumPy reference for the position-only attention biases.

Shapes: ``H`` heads, ``Tq`` queries, ``Tk`` keys; positions are 1-D integer (or real)
arrays ``i = q_pos``, ``j = k_pos``, and every bias is ``[H, Tq, Tk]``, added to the
scaled logits ``q . k / sqrt(D)``.

* ALiBi (Press et al. 2022, sec. 3): ``-m_h (i - j)`` (causal) or ``-m_h |i - j|``, slopes
  as the paper's released code defines them (a geometric sequence from ``2^(-8/n)``,
  completed from ``2n`` heads' sequence for head counts that are not powers of two).
* T5 (Raffel et al. 2020, sec. 2.1): a learned scalar per head and bucket of
  ``r = j - i``; exact buckets below ``M/2``, log-spaced up to ``max_distance``.
* KERPLE (Chi et al. 2022, eqs. 3-4): ``-r1 log(1 + r2 |i - j|)`` or
  ``-r1 |i - j|^r2``.
* Sandwich (Chi et al. 2023, sec. 5): ``(sum_{k=1}^{d'/2} cos((i - j) / 10000^(2k/d'))
  - d'/2) / (8h/H)``.
* FIRE (Li et al. 2024, eq. 3): ``f(log(c|i - j| + 1) / (log(c max(L, i) + 1) + eps))``
  with ``f`` a one-hidden-layer ReLU MLP given by its weights.

Plain loops and formulas, independent of ``posenc.encodings``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "fire_bias",
    "kerple_bias",
    "sandwich_bias",
    "t5_bias",
    "t5_relative_position_bucket",
]


def _pairs(q_pos: np.ndarray, k_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(i, j)`` as float64 ``[Tq, 1]`` and ``[1, Tk]`` grids."""
    i = np.asarray(q_pos, dtype=np.float64).reshape(-1, 1)
    j = np.asarray(k_pos, dtype=np.float64).reshape(1, -1)
    return i, j


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi slopes ``[H]`` by the recursive definition of the paper's code."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**h for h in range(n)]

    def slopes(n: int) -> list[float]:
        if math.log2(n).is_integer():
            return power_of_two(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_two(closest) + slopes(2 * closest)[0::2][: n - closest]

    return np.array(slopes(num_heads), dtype=np.float64)


def alibi_bias(
    q_pos: np.ndarray, k_pos: np.ndarray, slopes: np.ndarray, *, causal: bool = True
) -> np.ndarray:
    """``-m_h (i - j)`` (causal) or ``-m_h |i - j|``, ``[H, Tq, Tk]``."""
    i, j = _pairs(q_pos, k_pos)
    distance = i - j if causal else np.abs(i - j)
    return -np.asarray(slopes, dtype=np.float64)[:, None, None] * distance


def t5_relative_position_bucket(
    relative_position: np.ndarray,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> np.ndarray:
    """T5's bucket of each ``r = memory_position - query_position`` (int64 array)."""
    out = np.empty(np.shape(relative_position), dtype=np.int64)
    flat = out.reshape(-1)
    for index, r in enumerate(np.asarray(relative_position).reshape(-1).tolist()):
        buckets, offset = num_buckets, 0
        if bidirectional:
            buckets //= 2
            offset = buckets if r > 0 else 0
            n = abs(r)
        else:
            n = max(-r, 0)
        exact = buckets // 2
        if n < exact:
            bucket = n
        else:
            fraction = math.log(n / exact) / math.log(max_distance / exact)
            bucket = min(exact + math.floor(fraction * (buckets - exact)), buckets - 1)
        flat[index] = offset + bucket
    return out


def t5_bias(
    table: np.ndarray,
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
) -> np.ndarray:
    """``table[bucket(j - i), h]`` as ``[H, Tq, Tk]`` for a ``[num_buckets, H]`` table."""
    i = np.asarray(q_pos, dtype=np.int64).reshape(-1, 1)
    j = np.asarray(k_pos, dtype=np.int64).reshape(1, -1)
    buckets = t5_relative_position_bucket(
        j - i, bidirectional=bidirectional, num_buckets=table.shape[0], max_distance=max_distance
    )
    return np.moveaxis(np.asarray(table, dtype=np.float64)[buckets], -1, 0)


def kerple_bias(
    q_pos: np.ndarray, k_pos: np.ndarray, r1: np.ndarray, r2: np.ndarray, *, kernel: str = "log"
) -> np.ndarray:
    """KERPLE's log or power kernel bias, ``[H, Tq, Tk]``."""
    i, j = _pairs(q_pos, k_pos)
    distance = np.abs(i - j)[None]
    a = np.asarray(r1, dtype=np.float64)[:, None, None]
    p = np.asarray(r2, dtype=np.float64)[:, None, None]
    if kernel == "log":
        return -a * np.log(1.0 + p * distance)
    if kernel == "power":
        return -a * distance**p
    raise ValueError(f"unknown kernel {kernel!r}")


def sandwich_bias(
    q_pos: np.ndarray, k_pos: np.ndarray, num_heads: int, *, dim: int = 128
) -> np.ndarray:
    """Sandwich: the shifted sinusoidal inner product over ``8h / H``, ``[H, Tq, Tk]``."""
    i, j = _pairs(q_pos, k_pos)
    inner = np.zeros(np.broadcast_shapes(i.shape, j.shape), dtype=np.float64)
    for k in range(1, dim // 2 + 1):
        inner += np.cos((i - j) / 10000.0 ** (2.0 * k / dim))
    ratios = 8.0 * np.arange(1, num_heads + 1, dtype=np.float64) / num_heads
    return (inner - dim / 2)[None] / ratios[:, None, None]


def fire_bias(
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    *,
    c: float,
    threshold: float,
    w1: np.ndarray,
    b1: np.ndarray,
    w2: np.ndarray,
    b2: np.ndarray,
    eps: float = 1e-6,
) -> np.ndarray:
    """FIRE with the MLP ``w2 relu(w1 u + b1) + b2`` (``w1 [hidden, 1]``, ``w2 [H, hidden]``).

    Returns:
        ``[H, Tq, Tk]``.
    """
    i, j = _pairs(q_pos, k_pos)
    numerator = np.log(np.abs(c * (i - j)) + 1.0)
    normalizer = np.log(np.abs(c * np.maximum(i, threshold)) + 1.0) + eps
    u = numerator / normalizer  # [Tq, Tk]
    hidden = np.maximum(u[..., None] * np.asarray(w1, np.float64)[:, 0] + b1, 0.0)
    out = hidden @ np.asarray(w2, dtype=np.float64).T + b2  # [Tq, Tk, H]
    return np.moveaxis(out, -1, 0)
