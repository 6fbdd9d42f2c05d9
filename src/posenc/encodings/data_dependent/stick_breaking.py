"""Stick-breaking attention (Tan, Shen, Yang, Courville and Panda 2025, "Scaling
Stick-Breaking Attention: An Efficient Implementation and In-depth Study", ICLR 2025,
eqs. (1)-(2)).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim. No softmax
and no position encoding: query ``i`` breaks a stick of length 1, the nearest key first,

    beta_ij = sigmoid(z_ij),   z_ij = q_i . k_j / sqrt(D)
    A_ij = beta_ij * prod_{j < l < i} (1 - beta_il)

over the keys ``j < i`` (the paper's convention: a token does not attend to itself;
``attend_current=True`` lets it, ``j <= i`` and ``j < l <= i``). The weights of a row sum
to at most 1; the stick left over is dropped, and the first token of a sequence outputs 0.
Computed in log space, as in the paper's kernel: ``log A_ij = log sigmoid(z_ij) +
sum_l log sigmoid(-z_il)``, the sum running over the visible keys after ``j`` in storage
order (the keys a query sees must be strictly increasing in position, as in a KV cache:
``posenc.encodings.data_dependent._common.ordered_keys``), in float32 (float64 for
float64 inputs). Positions decide visibility only: ``k_pos < q_pos`` (``<=`` with
``attend_current``), and masked keys leave the stick unchanged.

Reference: ``fla.ops.stickbreaking_attn`` (flash-linear-attention) with the same
``attend_current`` switch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc._checks import check_bool, check_tensor
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings.data_dependent._common import ordered_keys

__all__ = ["StickBreakingAttention", "stick_breaking_weights"]


def stick_breaking_weights(
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    mask: Tensor | None = None,
    *,
    attend_current: bool = False,
) -> Tensor:
    """Stick-breaking weights ``A_ij``.

    Args:
        q: ``[B, H, Tq, D]`` queries.
        k: ``[B, H, Tk, D]`` keys; those a query sees in strictly increasing position order.
        q_pos: ``[Tq]`` or ``[B, Tq]`` positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` positions.
        mask: bool ``[B|1, 1, Tq, Tk]``, True = visible (padding, segments), or None.
        attend_current: also attend to keys at the query's own position.

    Returns:
        ``[B, H, Tq, Tk]`` in ``q``'s dtype, zero where not visible; NaN rows where a
        visible logit is not finite.

    Raises:
        ValueError: wrong ranks or shapes.
        TypeError: non-float inputs, bf16/fp16 positions, a non-bool mask.
    """
    check_bool("attend_current", attend_current)
    visible, disordered = ordered_keys(
        "stick-breaking attention", q, k, q_pos, k_pos, mask, strict=not attend_current
    )
    work = compute_dtype(q.dtype)
    z = torch.matmul(q, k.to(q.dtype).transpose(-2, -1)).to(work) * q.shape[-1] ** -0.5
    log_keep = F.logsigmoid(-z).masked_fill(~visible, 0.0)  # log(1 - beta); 0: no break
    suffix = log_keep.flip(-1).cumsum(-1).flip(-1)  # sum over visible l >= j
    after = F.pad(suffix[..., 1:], (0, 1))  # l > j: shifted, not suffix - log_keep (no cancelling)
    log_weights = (F.logsigmoid(z) + after).masked_fill(~visible, float("-inf"))
    # an infinite logit saturates sigmoid to 0 or 1; its row says NaN instead
    broken = (~torch.isfinite(z) & visible).any(-1, keepdim=True) | disordered  # [B, H, Tq, 1]
    return torch.where(broken, float("nan"), log_weights.exp()).to(q.dtype)


@register(
    "stick_breaking",
    paper="Tan et al. 2025, Scaling Stick-Breaking Attention (ICLR)",
    description="weights sigmoid(q.k) times the stick the nearer keys left; no softmax, "
    "no position encoding",
)
class StickBreakingAttention(PositionalEncoding):
    """Stick-breaking attention as a WEIGHTS-site encoding (causal attention only).

    Args:
        attend_current: a token also attends to itself (default False, the paper's).
        causal: must be True.

    Raises:
        ValueError: ``causal=False``.
        TypeError: a non-bool ``attend_current``.
    """

    sites = Site.WEIGHTS
    causal_only = True

    def __init__(self, *, attend_current: bool = False, causal: bool = True) -> None:
        super().__init__()
        if not check_bool("causal", causal):
            raise ValueError(
                "stick-breaking attention is only defined for causal attention, got causal=False"
            )
        self.attend_current = check_bool("attend_current", attend_current)

    def gates(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """No gates: ``[B, 1, T, 0]`` for ``x [B, T, C]`` (checked)."""
        check_tensor("x", x, ndim=3)
        return x.new_zeros(x.shape[0], 1, x.shape[1], 0)

    def weights(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        q_gates: Tensor,
        k_gates: Tensor,
        mask: Tensor | None = None,
    ) -> Tensor:
        """``[B, H, Tq, Tk]`` weights (``stick_breaking_weights``); the gates are unused."""
        del q_gates, k_gates
        return stick_breaking_weights(q, k, q_pos, k_pos, mask, attend_current=self.attend_current)

    def extra_repr(self) -> str:
        return f"attend_current={self.attend_current}"
