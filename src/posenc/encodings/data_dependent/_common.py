"""Shared by the WEIGHTS-site encodings: input checks and the visible-key mask.

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim, ``C``
d_model, ``G`` gates per token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_tensor
from posenc.encodings._relative import check_hook_inputs

__all__ = ["check_gates", "check_input", "visible_keys"]


def check_input(x: Tensor, d_model: int) -> Tensor:
    """``x [B, T, C]`` checked (real floating point, not meta, ``C == d_model``), contiguous.

    Raises:
        TypeError: a non-float or complex ``x``.
        ValueError: another rank or width, or ``x`` on the meta device.
    """
    check_tensor("x", x, ndim=3)
    if x.shape[-1] != d_model:
        raise ValueError(f"x has last dimension {x.shape[-1]}, expected d_model={d_model}")
    return x.contiguous()


def check_gates(name: str, gates: Tensor, like: Tensor, width: int) -> None:
    """Raise unless ``gates`` is ``[B, H, T, width]`` for ``like [B, H, T, D]``."""
    check_tensor(name, gates, ndim=4)
    want = (*like.shape[:3], width)
    if tuple(gates.shape) != want:
        raise ValueError(f"{name} must have shape {list(want)}, got {list(gates.shape)}")


def visible_keys(
    q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, mask: Tensor | None, *, strict: bool
) -> Tensor:
    """Bool ``[B|1, 1, Tq, Tk]``: ``k_pos < q_pos`` (``strict``) or ``<=``, and ``mask``.

    Raises:
        ValueError, TypeError: as ``check_hook_inputs`` for ``q``, ``k`` and positions; a
            ``mask`` that is not bool or does not broadcast to ``[B, 1, Tq, Tk]``.
    """
    q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos)
    qp, kp = q_pos.unsqueeze(-1), k_pos.unsqueeze(-2)
    visible = (kp < qp) if strict else (kp <= qp)  # [Tq, Tk] or [B, Tq, Tk]
    visible = visible.unsqueeze(-3) if visible.dim() == 3 else visible[None, None]
    if mask is None:
        return visible
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = visible), got dtype {mask.dtype}")
    want = (q.shape[0], 1, q.shape[2], k.shape[2])
    if mask.dim() != 4 or any(m not in (1, w) for m, w in zip(mask.shape, want, strict=True)):
        raise ValueError(f"mask must broadcast to {list(want)}, got {list(mask.shape)}")
    return visible & mask
