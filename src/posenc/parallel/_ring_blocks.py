"""One (query shard, key block) pair of ring attention: logits, online-softmax statistics and
the recomputed backward (Milakov & Gimelshein 2018, "Online normalizer calculation for
softmax"; Dao et al. 2022, "FlashAttention", Algorithm 2 and its backward, Algorithm 4).

Shapes: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``Tq`` the rank's queries,
``Tk`` the keys of the block, ``D`` head_dim. Positions are ``[T]`` or ``[B, T]``, segment
ids ``[B, T]`` or None. Every computation here runs in the accumulation dtype (float32 for
bf16/fp16 inputs).

For a pair the logits are ``l = q k^T * scale + b`` with the encoding's own bias ``b`` for
the pair's global positions (``score_bias``, SCORE site), ``-inf`` where the key is hidden
(``k_pos > q_pos`` under a causal mask, another segment). A block contributes its row maxima
``m``, the sums ``l_sum = sum_j exp(l_ij - m_i)`` and ``acc = sum_j exp(l_ij - m_i) w_ij``
with ``w_ij = v_j`` plus the encoding's value term (VALUE site, linear in the weights: Shaw
et al. 2018, eq. (3)); the shards merge by rescaling to a common maximum.

Backward, given the global log-sum-exp ``lse`` and ``delta_i = dO_i . O_i``: with
``P = exp(l - lse)``, the surrogate ``sum(dO * (P w)) - sum(delta * rowsum(P))`` has the
gradient ``P * (dP - delta)`` with respect to the logits, which is the softmax's
(``dS = P * (dP - rowsum(dO * O))``), so one ``autograd.grad`` of it gives the gradients of
the queries, keys, values and every parameter of the bias and the value term.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from posenc.attention.module import repeat_kv
from posenc.base import PositionalEncoding, Site
from posenc.parallel._ring_fused import fold_heads, fused_backward, fused_forward

__all__ = [
    "Pair",
    "Shard",
    "add",
    "block_backward",
    "block_forward",
    "merge",
    "row_blocks",
    "visible",
]


@dataclass(frozen=True)
class Shard:
    """What travels with a key block (or stays with the queries): global ``positions`` and
    the ``segment_ids`` of its tokens (None: one document)."""

    positions: Tensor
    segment_ids: Tensor | None


def visible(causal: bool, queries: Shard, keys: Shard) -> Tensor | None:
    """Bool ``[B|1, 1, Tq, Tk]`` (True = the query sees the key), or None: every key."""
    mask = None
    if causal:
        mask = keys.positions[..., None, :] <= queries.positions[..., :, None]
    if queries.segment_ids is not None and keys.segment_ids is not None:
        same = keys.segment_ids[:, None, :] == queries.segment_ids[:, :, None]
        mask = same if mask is None else mask & same
    if mask is None:
        return None
    return mask.unsqueeze(-3) if mask.dim() == 3 else mask[None, None]


@dataclass(frozen=True)
class Pair:
    """The rank's queries ``q [B, H, Tq, D]`` and one key block ``k, v [B, Hkv, Tk, D]``
    (accumulation dtype), their shards, the encoding and the logits scale; ``fused``:
    whether the forward and the backward run PyTorch's fused kernels (``_ring_fused``);
    ``mask`` is ``visible(causal, queries, keys)``, set by ``row_blocks``."""

    q: Tensor
    k: Tensor
    v: Tensor
    queries: Shard
    keys: Shard
    causal: bool
    position: PositionalEncoding
    scale: float
    fused: tuple[bool, bool] = (False, False)
    mask: Tensor | None = None

    def additive(self, q: Tensor, k: Tensor) -> Tensor | None:
        """The bias for ``q`` and ``k [B, H, Tk, D]`` with ``-inf`` where the mask hides a
        key, ``[B|1, H|1, Tq, Tk]`` in ``q``'s dtype; None: neither."""
        position, out = self.position, None
        if position.sites & Site.SCORE:
            out = position.score_bias(q, k, self.queries.positions, self.keys.positions)
        if out is not None:
            want = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            if out.dim() != 4 or out.shape[1:] != want[1:] or out.shape[0] not in (1, want[0]):
                raise ValueError(
                    f"{type(position).__name__}.score_bias returned shape {tuple(out.shape)}, "
                    f"expected {list(want)} (batch may be 1)"
                )
            out = out.to(q.dtype)
        if self.mask is None:
            return out
        if out is None:
            return torch.zeros(self.mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
                ~self.mask, float("-inf")
            )
        return out.masked_fill(~self.mask, float("-inf"))

    def logits(self, q: Tensor, k: Tensor) -> Tensor:
        """Scaled, biased, masked logits ``[B, H, Tq, Tk]`` of ``q`` and ``k [B, H, Tk, D]``."""
        logits = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        additive = self.additive(q, k)
        return logits if additive is None else logits + additive

    def rows(self, rows: slice) -> Pair | None:
        """The pair of the queries ``rows`` only, with their mask (None when they see every
        key); None when none of them sees a key of the block."""
        seg = self.queries.segment_ids
        queries = Shard(self.queries.positions[..., rows], None if seg is None else seg[:, rows])
        mask = visible(self.causal, queries, self.keys)
        if mask is not None and not bool(mask.any()):
            return None
        if mask is not None and bool(mask.all()):
            mask = None  # every key visible: no mask to build and add
        return replace(self, q=self.q[..., rows, :], queries=queries, mask=mask)

    def weighted(self, probs: Tensor, v: Tensor) -> Tensor:
        """``probs @ v`` plus the encoding's value term of ``probs``: ``[B, H, Tq, D]``."""
        out = torch.matmul(probs, v)
        if self.position.sites & Site.VALUE:
            term = self.position.value_term(probs, self.queries.positions, self.keys.positions)
            if term is not None:
                out = out + term.to(out.dtype)
        return out


def row_blocks(pair: Pair, size: int) -> Iterator[tuple[slice, Pair]]:
    """The pair in blocks of ``size`` queries, without those that see no key of it."""
    length = pair.q.shape[-2]
    for start in range(0, length, size):
        rows = slice(start, min(start + size, length))
        block = pair.rows(rows)
        if block is not None:
            yield rows, block


def block_forward(pair: Pair, size: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(m, l_sum, acc)`` of one pair: ``[B, H, Tq]``, ``[B, H, Tq]``, ``[B, H, Tq, D]``,
    computed ``size`` queries at a time. A row without a visible key has ``m = -inf`` and
    zeros."""
    peak = pair.q.new_full(pair.q.shape[:-1], float("-inf"))
    total, acc = peak.new_zeros(peak.shape), torch.zeros_like(pair.q)
    for rows, block in row_blocks(pair, size):
        peak[..., rows], total[..., rows], acc[..., rows, :] = _forward(block)
    return peak, total, acc


def _forward(pair: Pair) -> tuple[Tensor, Tensor, Tensor]:
    """``block_forward`` of one block of queries."""
    heads = pair.q.shape[1]
    k, v = repeat_kv(pair.k, heads), repeat_kv(pair.v, heads)
    if pair.fused[0]:
        return fused_forward(pair.q, k, v, pair.additive(pair.q, k), pair.mask, pair.scale)
    logits = pair.logits(pair.q, k)
    peak = logits.amax(-1)  # [B, H, Tq]
    probs = torch.exp(logits - _finite(peak)[..., None])  # 0 where hidden
    return peak, probs.sum(-1), pair.weighted(probs, v)


def merge(
    state: tuple[Tensor, Tensor, Tensor] | None, block: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """Two online-softmax states ``(m, l_sum, acc)`` rescaled to their common maximum."""
    if state is None:
        return block
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = state, block
    peak = torch.maximum(m_a, m_b)
    base = _finite(peak)
    w_a, w_b = torch.exp(m_a - base), torch.exp(m_b - base)  # 0 for a row of -inf
    return peak, l_a * w_a + l_b * w_b, acc_a * w_a[..., None] + acc_b * w_b[..., None]


def block_backward(
    pair: Pair,
    grad_out: Tensor,
    out: Tensor,
    lse: Tensor,
    params: Sequence[Tensor],
    size: int,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor | None]]:
    """Gradients ``(dq, dk, dv, d params)`` of one pair from the recomputed probabilities,
    ``size`` queries at a time.

    Args:
        pair: the pair (its tensors are not differentiated through).
        grad_out: ``dO [B, H, Tq, D]``.
        out: the merged output ``O [B, H, Tq, D]`` (every key of the ring).
        lse: the global log-sum-exp ``[B, H, Tq]`` (finite: 0 for a row that sees nothing).
        params: the parameters of the bias and value term that require gradients.
        size: queries per block.
    """
    dq, dk, dv = (torch.zeros_like(t) for t in (pair.q, pair.k, pair.v))
    d_params: list[Tensor | None] = [None] * len(params)
    for rows, block in row_blocks(pair, size):
        dq_b, dk_b, dv_b, dp_b = _backward(
            block, grad_out[..., rows, :], out[..., rows, :], lse[..., rows], params
        )
        dq[..., rows, :] += dq_b
        dk, dv = dk + dk_b, dv + dv_b
        d_params = [add(a, b) for a, b in zip(d_params, dp_b, strict=True)]
    return dq, dk, dv, d_params


def add(total: Tensor | None, part: Tensor | None) -> Tensor | None:
    """``total + part`` where either may be None (no gradient)."""
    if part is None:
        return total
    return part if total is None else total + part


def _backward(
    pair: Pair, grad_out: Tensor, out: Tensor, lse: Tensor, params: Sequence[Tensor]
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor | None, ...]]:
    """``block_backward`` of one block of queries."""
    heads, kv_heads = pair.q.shape[1], pair.k.shape[1]
    if pair.fused[1]:
        k, v = repeat_kv(pair.k, heads), repeat_kv(pair.v, heads)
        additive = pair.additive(pair.q, k)
        dq, dk, dv = fused_backward(grad_out, pair.q, k, v, out, lse, additive, pair.scale)
        return dq, fold_heads(dk, kv_heads), fold_heads(dv, kv_heads), (None,) * len(params)
    delta = (grad_out * out).sum(-1)  # rowsum(dO * O), [B, H, Tq]
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (pair.q, pair.k, pair.v)]
        q, k, v = leaves
        probs = torch.exp(pair.logits(q, repeat_kv(k, heads)) - lse[..., None])
        mine = pair.weighted(probs, repeat_kv(v, heads))  # this block's share of O
        surrogate = (grad_out * mine).sum() - (delta * probs.sum(-1)).sum()
        grads = torch.autograd.grad(surrogate, [*leaves, *params], allow_unused=True)
    dq, dk, dv = (
        torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads[:3], strict=True)
    )
    return dq, dk, dv, grads[3:]


def _finite(peak: Tensor) -> Tensor:
    """``peak`` with ``-inf`` (a row that sees no key) as 0, to subtract safely."""
    return torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
