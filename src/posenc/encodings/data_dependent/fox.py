"""FoX, the Forgetting Transformer (Lin, Nikishin, He and Courville 2025, "Forgetting
Transformer: Softmax Attention with a Forget Gate", ICLR 2025, eqs. (4)-(6)).

Shapes: ``B`` batch, ``H`` heads, ``T`` new tokens, ``Tq`` queries, ``Tk`` keys, ``D``
head_dim, ``C`` d_model. Each head ``h`` has a scalar forget gate per token

    f_t = sigmoid(w_h . x_t + b_h)                          (x_t the layer's input)

and query ``i`` weighs the keys ``j <= i`` with

    a_ij = softmax_j(q_i . k_j / sqrt(D) + D_ij),   D_ij = sum_{l = j+1..i} log f_l

(``D_ii = 0``): a data-dependent, learned decay. With constant gates ``f = exp(-m)`` it is
ALiBi with slope ``m``; no other position encoding is needed. ``D_ij = c_i - c_j`` with
the cumulative log gates ``c_t = sum_{l <= t} log f_l``, which are the gates this encoding
hands ``MultiHeadAttention`` (``[B, H, T, 1]``, float32, float64 for float64 input) and the
KV cache keeps: a cached forward continues the sum from the last cached token, so decoding
equals the full forward. ``l`` runs over the tokens in storage order (cache first), so the
keys a query sees must be stored in strictly increasing position order, as in a cache
(``posenc.encodings.data_dependent._common.ordered_keys``: a ``ValueError`` on the CPU, NaN
rows on an accelerator); positions only decide visibility (``k_pos <= q_pos``). Gates of
padding tokens enter ``c`` but never a difference between two tokens after the padding
(left padding changes nothing).

Reference kernel: ``fla.ops.forgetting_attn.parallel_forgetting_attn`` (flash-linear-
attention), whose ``g`` is ``log f`` per token and head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc._checks import check_bool, check_int
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings.data_dependent._common import check_gates, check_input, ordered_keys

__all__ = ["GATE_STD", "ForgettingAttention", "fox_weights"]

#: Standard deviation of the gate weights at initialisation (the paper's code:
#: ``initializer_range`` 0.02 for every linear layer, biases zero).
GATE_STD = 0.02


def fox_weights(
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    q_cum: Tensor,
    k_cum: Tensor,
    mask: Tensor | None = None,
) -> Tensor:
    """Forgetting attention's weights ``softmax_j(q_i . k_j / sqrt(D) + c_i - c_j)``.

    Args:
        q: ``[B, H, Tq, D]`` queries.
        k: ``[B, H, Tk, D]`` keys.
        q_pos: ``[Tq]`` or ``[B, Tq]`` positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` positions; key ``j`` is visible iff
            ``k_pos[j] <= q_pos[i]``; the keys a query sees strictly increasing in storage
            order.
        q_cum: ``[B, H, Tq, 1]`` cumulative log forget gates ``c_i`` of the queries.
        k_cum: ``[B, H, Tk, 1]`` cumulative log forget gates ``c_j`` of the keys.
        mask: bool ``[B|1, 1, Tq, Tk]``, True = visible (padding, segments), or None.

    Returns:
        ``[B, H, Tq, Tk]`` in ``q``'s dtype; rows sum to 1, or are 0 without a visible key;
        NaN rows for queries whose keys are out of order (off the CPU, see Raises).

    Raises:
        ValueError: wrong ranks or shapes; on the CPU, keys a query sees that are not in
            strictly increasing position order (naming the first).
        TypeError: non-float inputs, bf16/fp16 positions, a non-bool mask.
    """
    visible, disordered = ordered_keys("FoX", q, k, q_pos, k_pos, mask, strict=False)
    check_gates("q_cum", q_cum, q, 1)
    check_gates("k_cum", k_cum, k, 1)
    work = compute_dtype(q.dtype)
    logits = torch.matmul(q, k.to(q.dtype).transpose(-2, -1)).to(work) * q.shape[-1] ** -0.5
    decay = q_cum.to(work) - k_cum.to(work).transpose(-2, -1)  # [B, H, Tq, Tk], <= 0
    logits = (logits + decay).masked_fill(~visible, float("-inf"))
    probs = torch.where(visible, torch.softmax(logits, dim=-1), 0.0)  # no keys: 0, not NaN
    return torch.where(disordered, float("nan"), probs).to(q.dtype)


@register(
    "fox",
    paper="Lin et al. 2025, Forgetting Transformer: Softmax Attention with a Forget Gate",
    description="per-head forget gates sigmoid(w.x + b); logits add the summed log gates "
    "between key and query",
)
class ForgettingAttention(PositionalEncoding):
    """FoX's forget gates as a WEIGHTS-site encoding (causal attention only).

    Args:
        d_model: ``C``, the width of the layer's input the gates read.
        num_heads: ``H``, one gate per head and token.
        causal: must be True.

    Attributes:
        gate: ``nn.Linear(d_model, num_heads)``, ``w`` and ``b`` of every head, initialised
            as the paper's code does for its data-dependent gate (``fgate_type="full"``,
            no special bias initialisation): ``w ~ N(0, GATE_STD^2)``, ``b = 0``, so every
            gate starts near ``sigmoid(0) = 1/2``.

    Raises:
        ValueError: ``d_model`` or ``num_heads`` < 1, or ``causal=False``.
    """

    sites = Site.WEIGHTS
    causal_only = True

    def __init__(self, d_model: int, num_heads: int, *, causal: bool = True) -> None:
        super().__init__()
        if not check_bool("causal", causal):
            raise ValueError("FoX is only defined for causal attention, got causal=False")
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        self.gate = nn.Linear(self.d_model, self.num_heads)
        nn.init.normal_(self.gate.weight, mean=0.0, std=GATE_STD)
        nn.init.zeros_(self.gate.bias)

    def log_forget(self, x: Tensor) -> Tensor:
        """``log f_t = logsigmoid(w . x_t + b)``, ``[B, H, T]`` in float32 (float64 for
        float64 ``x [B, T, C]``)."""
        x = check_input(x, self.d_model)
        pre = F.linear(x, self.gate.weight.to(x.dtype), self.gate.bias.to(x.dtype))
        return F.logsigmoid(pre.to(compute_dtype(x.dtype))).transpose(1, 2)

    def gates(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """Cumulative log forget gates ``c [B, H, T, 1]`` of ``x [B, T, C]``, continuing
        from the last of ``past [B, H, Tk, 1]`` (the cached tokens' gates)."""
        cum = self.log_forget(x).cumsum(-1).unsqueeze(-1)  # [B, H, T, 1]
        if past is not None and past.shape[-2]:
            cum = cum + past[..., -1:, :].to(cum.dtype)
        return cum

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
        """``[B, H, Tq, Tk]`` weights (``fox_weights``)."""
        return fox_weights(q, k, q_pos, k_pos, q_gates, k_gates, mask)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}"
