"""Shape checks shared by the rotary schemes (``B`` batch, ``H`` heads, ``D`` head_dim)."""

from __future__ import annotations

from torch import Tensor

from posenc._checks import check_tensor


def check_qk(q: Tensor, k: Tensor, head_dim: int) -> int:
    """Check ``q [B, H, Tq, D]`` and ``k [B, Hkv, Tk, D]``; return ``B``.

    Raises:
        ValueError: not 4-D, a head dim other than ``head_dim``, unequal batches.
        TypeError: non-floating tensors.
    """
    check_tensor("q", q, ndim=4)
    check_tensor("k", k, ndim=4)
    if q.shape[-1] != head_dim or k.shape[-1] != head_dim:
        raise ValueError(
            f"q and k must have head_dim={head_dim}, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q has batch {q.shape[0]} but k has batch {k.shape[0]}")
    return q.shape[0]
