"""Shared by the WEIGHTS-site encodings: input checks, the visible-key mask and key order.

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim, ``C``
d_model, ``G`` gates per token.

FoX, stick-breaking and PaTH run over the keys in the order they are stored (a sum or a
product over the keys between a key and its query); positions only decide which keys a
query sees. The two orders must agree: the keys a query sees must be stored in strictly
increasing position order (``ordered_keys``). Packed sequences whose positions restart
are allowed when ``segment_ids`` (the mask) keep each query inside its segment; so are
masked padding tokens anywhere, and a KV cache whose new tokens come after the cached ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc._checks import check_tensor
from posenc.encodings._relative import check_hook_inputs

__all__ = ["check_gates", "check_input", "ordered_keys", "visible_keys"]


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
    return _visible(q, k, q_pos, k_pos, mask, strict=strict)


def ordered_keys(
    encoding: str,
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    mask: Tensor | None,
    *,
    strict: bool,
) -> tuple[Tensor, Tensor]:
    """``visible_keys`` and the query rows whose keys are out of order.

    A query row is out of order when the keys stored from its first visible key to its
    last (hidden ones between included: FoX and PaTH sum over every token stored between
    a key and its query) do not have strictly increasing positions.

    Returns:
        ``(visible, disordered)``: bool ``[B|1, 1, Tq, Tk]`` and bool ``[B|1, 1, Tq, 1]``.
        The caller gives the ``disordered`` rows NaN; that needs no host sync, which is
        why it is what happens on an accelerator and under ``torch.compile``.

    Raises:
        ValueError: on the CPU (eager), any row out of order; the message names the batch
            row, the query and the first key out of order, with their positions.
        TypeError: as ``visible_keys``.
    """
    q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos)
    visible = _visible(q, k, q_pos, k_pos, mask, strict=strict)
    kp = k_pos if k_pos.dim() == 2 else k_pos[None]  # [B|1, Tk]
    descent = torch.cat((kp[:, :1] < kp[:, :1], kp[:, 1:] <= kp[:, :-1]), -1)  # k_j <= k_j-1
    seen = visible.to(torch.uint8)
    earlier = F.pad(seen[..., :-1], (1, 0)).cummax(-1).values.bool()  # a visible key < j
    later = seen.flip(-1).cummax(-1).values.flip(-1).bool()  # a visible key >= j
    late = earlier & later & descent[:, None, None, :]  # [B|1, 1, Tq, Tk]
    disordered = late.any(-1, keepdim=True)
    if visible.device.type == "cpu" and not torch.compiler.is_compiling() and bool(late.any()):
        row, _, query, key = (int(i) for i in late.nonzero()[0])
        query_at = q_pos[query] if q_pos.dim() == 1 else q_pos[min(row, q_pos.shape[0] - 1), query]
        key_row = kp[min(row, kp.shape[0] - 1)]
        raise ValueError(
            f"{encoding} needs the keys a query sees stored in strictly increasing position "
            f"order, but for query {query} (position {query_at.item()}) of batch row {row}, "
            f"key {key} (position {key_row[key].item()}) comes after a key at position "
            f"{key_row[key - 1].item()}; store the tokens in position order (as a KV cache "
            "does) and separate packed sequences whose positions restart by segment_ids"
        )
    return visible, disordered


def _visible(
    q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, mask: Tensor | None, *, strict: bool
) -> Tensor:
    """``visible_keys`` after its checks of the positions."""
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
