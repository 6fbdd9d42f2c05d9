"""Float64 reference of applying a rotary embedding from given cosines and sines, and of
its gradient (Su et al. 2021, "RoFormer", eq. 34: ``f(x, m) = R_m x`` with block-diagonal
``R_m``).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim.
``x [B, H, T, D]``; ``cos``, ``sin`` ``[T, R/2]`` or ``[B, T, R/2]``. Each pair ``i`` of
features, ``(i, i + R/2)`` (half-split) or ``(2i, 2i + 1)`` (interleaved), is multiplied
by its own 2x2 matrix ``M = [[cos, -sin], [sin, cos]]``; features ``R..D-1`` are copied.
The backward pass of ``y = M x`` is ``dx = M^T dy``, computed here with the transposed
matrices (no appeal to ``M^T`` being a rotation by the opposite angle).
"""

from __future__ import annotations

import numpy as np

__all__ = ["rope_apply_backward_ref", "rope_apply_ref"]


def _pair_indices(rotary_dim: int, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    if interleaved:
        return np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2)
    return np.arange(rotary_dim // 2), np.arange(rotary_dim // 2, rotary_dim)


def _matrices(cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """``[..., T, R/2, 2, 2]`` matrices, broadcast to ``[B|1, 1|H, T, R/2, 2, 2]``."""
    cos, sin = np.asarray(cos, dtype=np.float64), np.asarray(sin, dtype=np.float64)
    mats = np.stack((np.stack((cos, -sin), -1), np.stack((sin, cos), -1)), -2)
    return mats[:, None] if mats.ndim == 5 else mats  # [B, T, ...] -> [B, 1, T, ...]


def _apply(x: np.ndarray, mats: np.ndarray, interleaved: bool, transpose: bool) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    first, second = _pair_indices(2 * mats.shape[-3], interleaved)
    pairs = np.stack((x[..., first], x[..., second]), -1)  # [B, H, T, R/2, 2]
    spec = "...ji,...j->...i" if transpose else "...ij,...j->...i"
    turned = np.einsum(spec, mats, pairs)
    out = x.copy()
    out[..., first], out[..., second] = turned[..., 0], turned[..., 1]
    return out


def rope_apply_ref(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool = False
) -> np.ndarray:
    """``y = M x`` for every pair; a new float64 array of ``x``'s shape."""
    return _apply(x, _matrices(cos, sin), interleaved, transpose=False)


def rope_apply_backward_ref(
    grad: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, interleaved: bool = False
) -> np.ndarray:
    """Gradient with respect to ``x`` of ``sum(grad * rope_apply_ref(x, ...))``: ``M^T grad``."""
    return _apply(grad, _matrices(cos, sin), interleaved, transpose=True)
