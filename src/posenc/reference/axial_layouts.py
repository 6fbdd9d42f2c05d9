"""Float64 NumPy reference for axial RoPE in the layouts of current vision towers.

Shapes: ``B`` batch, ``H`` heads, ``N`` patches, ``D`` head_dim, ``A`` axes, ``S``
features per axis, ``P = A S / 2`` pairs. Axial RoPE (Heo et al. 2024, "Rotary Position
Embedding for Vision Transformer", sec. 3.2) rotates pair ``p``, the features
``(first(p), second(p))`` read as ``a + ib``, by ``exp(i pos[axis(p)] f(p))``. Written
here pair by pair from the definition, independent of ``posenc.encodings``:

* the axis block ``b(p)`` and frequency index ``j(p)``: contiguous blocks ``p // (S/2)``,
  ``p % (S/2)``, or cyclic ``p % A``, ``p // A``; ``axis(p) = axis_order[b(p)]``;
* ``f(p) = base^(-2 j / S)`` (shared) or ``base^(-2 (A j + b) / (A S))`` (alternating);
* the features: half-split ``(p, p + P)``, interleaved ``(2p, 2p + 1)``, or per axis
  ``(S c + i, S c + S/2 + i)`` with ``c = p // (S/2)``, ``i = p % (S/2)``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["axial_layout_rotate"]


def axial_layout_rotate(
    x: np.ndarray,
    positions: np.ndarray,
    base: float,
    *,
    axis_order: tuple[int, ...] = (0, 1),
    axis_dim: int | None = None,
    cyclic: bool = False,
    pairs: str = "half",
    alternating: bool = False,
    prefix: int = 0,
) -> np.ndarray:
    """Rotate the last ``N = T - prefix`` tokens of ``x [B, H, T, D]`` at ``positions
    [N, A]`` or ``[B, N, A]``; the other features and the prefix tokens are unchanged."""
    x = np.array(x, dtype=np.float64)
    positions = np.asarray(positions, dtype=np.float64)
    axes = len(axis_order)
    size = axis_dim if axis_dim is not None else x.shape[-1] // axes
    half, count = size // 2, axes * size // 2
    out = x.copy()
    for p in range(count):
        block, j = (p % axes, p // axes) if cyclic else (p // half, p % half)
        exponent = (axes * j + block) / count if alternating else j / half
        angle = positions[..., axis_order[block]] * base**-exponent  # [(B,) N]
        if angle.ndim == 2:
            angle = angle[:, None]  # [B, 1, N]
        if pairs == "half":
            first, second = p, p + count
        elif pairs == "interleaved":
            first, second = 2 * p, 2 * p + 1
        else:
            first = size * (p // half) + p % half
            second = first + half
        z = (x[..., prefix:, first] + 1j * x[..., prefix:, second]) * np.exp(1j * angle)
        out[..., prefix:, first], out[..., prefix:, second] = z.real, z.imag
    return out
