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
last chunk of ``c`` to the first (``Tk / c`` steps of matrix products), carrying
``H_e ... H_i q_i`` for every query, with each chunk's transforms in the compact WY form
``H_s ... H_{s+m} = I - W^T T W`` (Schreiber and Van Loan 1989; the paper's kernels use
the equivalent UT transform): the keys of a chunk read ``T``'s blocks for the runs inside.
Keys are taken in storage order: those a query sees must be strictly increasing in position,
as in a cache (``posenc.encodings.data_dependent._common.ordered_keys``: a ``ValueError`` on
the CPU, NaN rows on an accelerator); positions only decide visibility (``k_pos <= q_pos``).

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
from posenc.encodings.data_dependent._common import check_gates, check_input, ordered_keys

__all__ = ["PaTH", "path_weights"]


def _chunk_transforms(w: Tensor, beta: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """Per chunk of ``c`` tokens, ``W [B, H, N, c, D]`` and the ``T [B, H, N, c, c]`` of the
    compact WY form ``H_s H_{s+1} ... H_{s+m} = I - W_m^T T_m W_m`` (leading ``m + 1``
    rows; any contiguous run uses the matching diagonal block of ``T``). Padding tokens
    have ``beta = 0`` (identity transforms)."""
    batch, heads, length, dim = w.shape
    pad = -length % chunk
    w = F.pad(w, (0, 0, 0, pad)).view(batch, heads, -1, chunk, dim)
    beta = F.pad(beta, (0, pad)).view(batch, heads, -1, chunk)
    strict = torch.triu(w @ w.transpose(-2, -1), diagonal=1)  # w_r . w_r', r < r'
    eye = torch.eye(chunk, dtype=w.dtype, device=w.device)
    unit = eye + beta[..., :, None] * strict  # unit upper triangular
    t = torch.linalg.solve_triangular(unit, torch.diag_embed(beta), upper=True, unitriangular=True)
    return w, t


def path_weights(
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    q_gates: Tensor,
    k_gates: Tensor,
    mask: Tensor | None = None,
    *,
    chunk_size: int = 32,
) -> Tensor:
    """PaTH's attention weights ``softmax_j(q_i^T H_i ... H_{j+1} k_j / sqrt(D))``.

    Args:
        q: ``[B, H, Tq, D]`` queries.
        k: ``[B, H, Tk, D]`` keys, in storage order; those a query sees in strictly
            increasing position order.
        q_pos: ``[Tq]`` or ``[B, Tq]`` positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` positions; key ``j`` is visible iff
            ``k_pos[j] <= q_pos[i]``.
        q_gates: ``[B, H, Tq, D + 2]``: the queries' ``[w, beta, index]`` (index read).
        k_gates: ``[B, H, Tk, D + 2]``: the keys' ``[w, beta, index]`` (index ``0..Tk-1``).
        mask: bool ``[B|1, 1, Tq, Tk]``, True = visible (padding, segments), or None.
        chunk_size: keys per step of the sweep.

    Returns:
        ``[B, H, Tq, Tk]`` in ``q``'s dtype; rows sum to 1, or are 0 without a visible key;
        NaN rows for the queries at or after a key with non-finite ``w`` or ``beta``, and
        (off the CPU) for queries whose keys are out of order.

    Raises:
        ValueError: wrong ranks or shapes, ``chunk_size < 1``; on the CPU, keys a query sees
            that are not in strictly increasing position order (naming the first).
        TypeError: non-float inputs, bf16/fp16 positions, a non-bool mask.
    """
    chunk = check_int("chunk_size", chunk_size)
    visible, disordered = ordered_keys("PaTH", q, k, q_pos, k_pos, mask, strict=False)
    dim, num_keys = q.shape[-1], k.shape[-2]
    check_gates("q_gates", q_gates, q, dim + 2)
    check_gates("k_gates", k_gates, k, dim + 2)
    if num_keys == 0:
        return q.new_zeros(*q.shape[:-1], 0)
    work = compute_dtype(q.dtype)
    u = q.to(work)  # H_e ... H_{a_i} q_i, for the chunks after the current one
    # a non-finite transform would spread through its chunk's T: run it as the identity,
    # then give NaN to the queries whose products include it (their keys before it)
    gates = k_gates[..., : dim + 1].to(work)
    bad = ~torch.isfinite(gates).all(-1)  # [B, H, Tk]
    gates = torch.where(bad.unsqueeze(-1), 0.0, gates)
    w, t = _chunk_transforms(gates[..., :dim], gates[..., dim], chunk)
    keys = F.pad(k.to(work), (0, 0, 0, -num_keys % chunk)).view(w.shape)  # [B, H, N, c, D]
    later = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), 1)
    zk = torch.where(later, keys @ w.transpose(-2, -1), 0.0)  # w_r . k_j for r > j
    rows = torch.arange(chunk, device=q.device, dtype=work)
    q_index = q_gates[..., dim + 1].to(work)  # a_i, [B, H, Tq]
    columns = []
    for n in range(w.shape[2] - 1, -1, -1):  # the chunk [n c, (n + 1) c) of keys
        reach = rows <= (q_index - n * chunk).unsqueeze(-1)  # H_{nc + r} before a_i
        v = torch.where(reach, u @ w[:, :, n].transpose(-2, -1), 0.0)
        v = v @ t[:, :, n].transpose(-2, -1)  # [B, H, Tq, c]
        columns.append(u @ keys[:, :, n].transpose(-2, -1) - v @ zk[:, :, n].transpose(-2, -1))
        u = u - v @ w[:, :, n]  # through the chunk's transforms up to a_i
    logits = torch.cat(columns[::-1], dim=-1)[..., :num_keys] * dim**-0.5  # [B, H, Tq, Tk]
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    probs = torch.where(visible, probs, 0.0)
    at = q_index.long().clamp(0, num_keys - 1)  # each query's own index among the keys
    poisoned = (bad.cumsum(-1) > 0).gather(-1, at).unsqueeze(-1) | disordered  # a bad H_t, t <= a_i
    return torch.where(poisoned, float("nan"), probs).to(q.dtype)


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
        chunk_size: keys per step of the sweep (``path_weights``).
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
        self,
        d_model: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        chunk_size: int = 32,
        causal: bool = True,
    ) -> None:
        super().__init__()
        if not check_bool("causal", causal):
            raise ValueError("PaTH is only defined for causal attention, got causal=False")
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        default = max(self.d_model // self.num_heads, 1)
        self.head_dim = check_int("head_dim", default if head_dim is None else head_dim)
        self.chunk_size = check_int("chunk_size", chunk_size)
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
        return path_weights(q, k, q_pos, k_pos, q_gates, k_gates, mask, chunk_size=self.chunk_size)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"chunk_size={self.chunk_size}"
        )
