"""PaTH attention: position encoding by accumulated Householder transformations (Yang,
Shen, Wen, Tan, Mishra, Ren, Panda and Kim 2025, "PaTH Attention: Position Encoding via
Accumulating Householder Transformations", eqs. (2)-(4)).

Shapes: ``B`` batch, ``H`` heads, ``T`` new tokens, ``Tq`` queries, ``Tk`` keys, ``D``
head_dim, ``C`` d_model. Every token ``t`` defines, per head, a Householder-like matrix from
the layer's input ``x_t``

    H_t = I - beta_t w_t w_t^T,   w_t = normalize(W_w x_t),   beta_t = 2 sigmoid(u . x_t + b)

(``beta in (0, 2)``: ``H_t`` is a reflection at ``beta = 2``, the identity at 0), and the
logits of query ``i`` and key ``j <= i`` read the product of those between them:

    s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(D),   a_ij = softmax_j(s_ij)

(``s_ii = q_i . k_i / sqrt(D)``). The paper's layer also passes ``W_w x`` through a short
causal convolution and factors ``W_w`` at low rank; both are feature choices left out here,
so that a token's transform depends on that token alone (the KV cache then needs no past
inputs). The gates handed to ``MultiHeadAttention`` are ``[w, beta, index]`` per token
(``[B, H, T, D + 2]``; ``index`` the token's place in the key sequence, cache included),
so ``weights`` finds the transforms between any query and key. It sweeps the keys from the
last to the first, carrying ``H_{j+1} ... H_{i} q_i`` for every query (``Tk`` steps of
``O(B H Tq D)``, the paper's formula without its blocked UT transform: exact, not fast).
Keys are taken in storage order (non-decreasing positions, as in a cache); positions only
decide visibility (``k_pos <= q_pos``).

Reference: ``fla.ops.path_attn`` (flash-linear-attention), whose ``w`` and ``beta`` are
the ones above (and ``g = 0``: no forget gate).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc._checks import check_bool, check_int
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings.data_dependent._common import check_gates, check_input, visible_keys

__all__ = ["PaTH", "path_weights"]


def path_weights(
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    q_gates: Tensor,
    k_gates: Tensor,
    mask: Tensor | None = None,
) -> Tensor:
    """PaTH's attention weights ``softmax_j(q_i^T H_i ... H_{j+1} k_j / sqrt(D))``.

    Args:
        q: ``[B, H, Tq, D]`` queries.
        k: ``[B, H, Tk, D]`` keys, in storage order.
        q_pos: ``[Tq]`` or ``[B, Tq]`` positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` positions; key ``j`` is visible iff
            ``k_pos[j] <= q_pos[i]``.
        q_gates: ``[B, H, Tq, D + 2]``: the queries' ``[w, beta, index]`` (index read).
        k_gates: ``[B, H, Tk, D + 2]``: the keys' ``[w, beta, index]`` (index ``0..Tk-1``).
        mask: bool ``[B|1, 1, Tq, Tk]``, True = visible (padding, segments), or None.

    Returns:
        ``[B, H, Tq, Tk]`` in ``q``'s dtype; rows sum to 1, or are 0 without a visible key.

    Raises:
        ValueError: wrong ranks or shapes.
        TypeError: non-float inputs, bf16/fp16 positions, a non-bool mask.
    """
    visible = visible_keys(q, k, q_pos, k_pos, mask, strict=False)
    dim = q.shape[-1]
    check_gates("q_gates", q_gates, q, dim + 2)
    check_gates("k_gates", k_gates, k, dim + 2)
    work = compute_dtype(q.dtype)
    u, k = q.to(work), k.to(work)
    w, beta = k_gates[..., :dim].to(work), k_gates[..., dim].to(work)
    q_index = q_gates[..., dim + 1]  # [B, H, Tq]
    columns = []
    for j in range(k.shape[-2] - 1, -1, -1):  # u = H_{j+1} ... H_i q_i for key j
        columns.append((u * k[..., j, None, :]).sum(-1))  # [B, H, Tq]
        w_j = w[..., j, None, :]  # [B, H, 1, D]
        reflected = u - (beta[..., j, None, None] * (u * w_j).sum(-1, keepdim=True)) * w_j
        u = torch.where((q_index >= j).unsqueeze(-1), reflected, u)  # H_j lies between
    if not columns:
        return q.new_zeros(*q.shape[:-1], 0)
    logits = torch.stack(columns[::-1], dim=-1) * dim**-0.5  # [B, H, Tq, Tk]
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.where(visible, probs, 0.0).to(q.dtype)


@register(
    "path",
    paper="Yang et al. 2025, PaTH Attention: Position Encoding via Accumulating "
    "Householder Transformations",
    description="logits q_i H_i ... H_(j+1) k_j with data-dependent Householder-like "
    "H_t = I - beta_t w_t w_t^T",
)
class PaTH(PositionalEncoding):
    """PaTH's Householder transforms as a WEIGHTS-site encoding (causal attention only).

    Args:
        d_model: ``C``, the width of the layer's input.
        num_heads: ``H``.
        head_dim: ``D``; None: ``d_model // num_heads``.
        causal: must be True.

    Attributes:
        direction: ``nn.Linear(d_model, num_heads * head_dim, bias=False)``, ``W_w``.
        strength: ``nn.Linear(d_model, num_heads)``, ``u`` and ``b`` of ``beta``.

    Raises:
        ValueError: sizes < 1, or ``causal=False``.
    """

    sites = Site.WEIGHTS
    causal_only = True

    def __init__(
        self, d_model: int, num_heads: int, *, head_dim: int | None = None, causal: bool = True
    ) -> None:
        super().__init__()
        if not check_bool("causal", causal):
            raise ValueError("PaTH is only defined for causal attention, got causal=False")
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        default = max(self.d_model // self.num_heads, 1)
        self.head_dim = check_int("head_dim", default if head_dim is None else head_dim)
        self.direction = nn.Linear(self.d_model, self.num_heads * self.head_dim, bias=False)
        self.strength = nn.Linear(self.d_model, self.num_heads)

    def gates(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """``[w, beta, index]`` of ``x [B, T, C]``: ``[B, H, T, D + 2]`` in float32
        (float64 for float64 ``x``), indices continuing after ``past`` (cached gates)."""
        x = check_input(x, self.d_model)
        work = compute_dtype(x.dtype)
        batch, length, _ = x.shape
        w = F.linear(x, self.direction.weight.to(x.dtype)).to(work)
        w = F.normalize(w.view(batch, length, self.num_heads, self.head_dim), dim=-1)
        pre = F.linear(x, self.strength.weight.to(x.dtype), self.strength.bias.to(x.dtype))
        beta = 2.0 * torch.sigmoid(pre.to(work))  # [B, T, H]
        start = 0 if past is None else past.shape[-2]
        index = torch.arange(start, start + length, device=x.device, dtype=work)
        index = index[None, :, None].expand(batch, length, self.num_heads)
        gates = torch.cat((w, beta[..., None], index[..., None]), dim=-1)  # [B, T, H, D + 2]
        return gates.transpose(1, 2)

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
        """``[B, H, Tq, Tk]`` weights (``path_weights``)."""
        return path_weights(q, k, q_pos, k_pos, q_gates, k_gates, mask)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}"
