"""One query block of attention with a positional bias: the kernels of the chunked backend.

Shapes: ``B`` batch, ``H`` heads, ``Tb`` queries of the block, ``Tq`` queries in all,
``Tk`` keys, ``D`` head_dim, ``L = Tq + Tk - 1`` distinct offsets.

* ``general_block``: calls the encoding's ``score_bias`` for the block, adds the mask, and
  runs SDPA (or the eager formula, which also serves the VALUE site).
* ``offset_block``: for an encoding whose bias depends on ``q_pos - k_pos`` only
  (``PositionalEncoding.offset_only``) over consecutive integer positions, the bias of the
  whole attention is one row of ``L`` values per head, in increasing offset, with
  ``-inf`` at the offsets the causal mask hides (``offset_table``, built once). With the
  keys taken in reverse order (``k`` and ``v`` flipped once per call; the attention does
  not depend on the order of the keys), ``bias[i, j] = table[start + i + j + Tk - limit]``
  for the keys ``0..limit-1`` is a Hankel matrix, i.e. the zero-copy view
  ``as_strided((H, Tb, limit), (L, 1, 1))`` of the table, which SDPA reads as its float
  mask. Nothing of size ``Tb x Tk`` is written (the Toeplitz structure of a relative
  bias: Gray 2006, "Toeplitz and Circulant Matrices: A Review").

* ``weights_block``: a WEIGHTS-site encoding's own weights (``weights`` hook, from the
  queries, the keys and their gates) times the values.

All take ``exact``: True runs the eager formula instead of SDPA, whose fused CPU/CUDA
kernels have a backward that is not itself differentiable (used for double backward).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.attention.masking import Masking
from posenc.attention.reuse import EncodingCache
from posenc.attention.sinks import sink_key, sink_softmax
from posenc.base import PositionalEncoding, Site
from posenc.encodings._relative import consecutive_runs

__all__ = [
    "OffsetTable",
    "check_term",
    "general_block",
    "offset_block",
    "offset_table",
    "weights_block",
]


def check_term(what: str, term: Tensor, want: tuple[int, ...], position: PositionalEncoding):
    """Raise ``ValueError`` unless a hook's output broadcasts to ``want``."""
    ok = term.dim() == len(want) and all(t in (1, w) for t, w in zip(term.shape, want, strict=True))
    if not ok or term.shape[-2:] != want[-2:]:
        raise ValueError(
            f"{type(position).__name__}.{what} returned shape {tuple(term.shape)}, "
            f"expected {list(want)} (batch may be 1)"
        )


def _masked_bias(bias: Tensor, mask: Tensor, first: int) -> Tensor:
    """``bias`` with ``-inf`` where ``mask`` (covering keys ``first:``) is False."""
    if first == 0:
        return torch.where(mask, bias, float("-inf"))
    shape = torch.broadcast_shapes(bias.shape, (*mask.shape[:-1], bias.shape[-1]))
    out = bias.expand(shape).clone(memory_format=torch.contiguous_format)  # our own copy
    out[..., first:].masked_fill_(~mask, float("-inf"))
    return out


def _eager(
    q: Tensor, k: Tensor, v: Tensor, logits: Tensor, dropout_p: float, sinks: Tensor | None = None
) -> tuple:
    """``(probs @ v, probs)`` from ``logits`` (scaled scores, bias and mask added), with the
    per-head sink logits ``sinks [H]`` in the softmax's denominator if given."""
    acc = torch.promote_types(q.dtype, torch.float32)  # bf16/fp16 softmax in float32
    if sinks is None:
        probs = torch.softmax(logits, dim=-1, dtype=acc).to(q.dtype)
    else:
        probs = sink_softmax(logits, sinks, acc).to(q.dtype)
    probs = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
    return torch.matmul(probs, v), probs


def general_block(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *params: Tensor,
    masking: Masking,
    start: int,
    first: int,
    position: PositionalEncoding,
    use_sdpa: bool,
    dropout_p: float,
    scale: float,
    guard_empty: bool,
    sinks: Tensor | None = None,
    exact: bool = False,
) -> Tensor:
    """Attention of the query block ``q [B, H, Tb, D]`` starting at ``start`` over ``k, v``
    (the first ``Tk`` keys); the keys before ``first`` are visible to every query. ``sinks``
    ``[H]``: learned sink logits in every row's denominator (``posenc.attention.sinks``).

    ``params`` (the encoding's parameters, and the sinks) are not read here: they are passed
    so that a recomputing backward differentiates with respect to them.
    """
    del params
    use_sdpa = use_sdpa and not exact
    stop, num_keys = start + q.shape[-2], k.shape[-2]
    q_pos, k_pos = masking.q_pos[..., start:stop], masking.k_pos[..., :num_keys]
    sites = position.sites
    bias = position.score_bias(q, k, q_pos, k_pos) if sites & Site.SCORE else None
    if bias is not None:
        check_term("score_bias", bias, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]), position)
        bias = bias.to(q.dtype)
    is_causal = use_sdpa and masking.causal and masking.aligned and bias is None
    is_causal = is_causal and sinks is None  # the sink's float mask replaces is_causal
    if is_causal and q.shape[-2] != num_keys:  # a branch, not a SymBool, under compile
        is_causal = False
    needs_mask = not is_causal and first < num_keys  # else every key is visible
    mask = masking.block(start, stop, slice(first, num_keys)) if needs_mask else None
    keep_row = None
    if guard_empty and mask is not None:  # here first == 0: the mask covers every key
        keep_row = mask.any(-1, keepdim=True)  # [B|1, 1, Tb, 1]
        mask = mask | ~keep_row  # attend anywhere, then zero the row: no NaN
    if use_sdpa:
        logits_mask = mask
        if bias is not None:
            logits_mask = bias if mask is None else _masked_bias(bias, mask, first)
        elif mask is not None and first:
            seen = mask.new_ones((*mask.shape[:-1], first))
            logits_mask = torch.cat((seen, mask), dim=-1)
        if sinks is not None:
            k, v, logits_mask = sink_key(q, k, v, logits_mask, sinks)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=logits_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
    else:
        logits = torch.matmul(q, k.transpose(-2, -1)) * scale  # [B, H, Tb, Tk], our own
        if bias is not None:
            logits = logits + bias
        if mask is not None:
            logits[..., first:].masked_fill_(~mask, float("-inf"))
        out, probs = _eager(q, k, v, logits, dropout_p, sinks)
        term = position.value_term(probs, q_pos, k_pos) if sites & Site.VALUE else None
        if term is not None:
            check_term("value_term", term, tuple(out.shape), position)
            out = out + term.to(out.dtype)
    return out if keep_row is None else out.masked_fill(~keep_row, 0.0)


@dataclass(frozen=True)
class OffsetTable:
    """The bias at every offset: ``values[h, m] = b_h(c - (Tk - 1) + m)``, ``m < L``, where
    ``c = q_pos[0] - k_pos[0]``.

    Attributes:
        values: ``[H, L]`` in the compute dtype, ``-inf`` at offsets a causal mask hides.
        num_keys: ``Tk``.
    """

    values: Tensor
    num_keys: int


def offset_table(
    position: PositionalEncoding, q: Tensor, k: Tensor, masking: Masking
) -> OffsetTable | None:
    """The ``OffsetTable`` of ``position`` for this attention, or None when the bias is not
    one row per head: an encoding that is not ``offset_only``, a VALUE term, padding,
    segments, positions that are not shared consecutive integer runs, or a causal query
    that sees no key."""
    if not getattr(position, "offset_only", False) or position.sites != Site.SCORE:
        return None
    if masking.key_padding_mask is not None or masking.q_seg is not None:
        return None
    num_q, num_k = q.shape[-2], k.shape[-2]
    if masking.aligned and not torch.compiler.is_compiling():  # positions 0..T-1: no sync
        runs = (masking.q_pos.reshape(-1)[:num_q], masking.k_pos.reshape(-1)[:num_k])
    else:
        runs = consecutive_runs(masking.q_pos, masking.k_pos)
    if runs is None or num_q == 0 or num_k == 0:
        return None
    q_row, k_row = runs
    offset = 0 if masking.aligned else int(q_row[0]) - int(k_row[0])  # c
    if masking.causal and offset < 0:  # the first query would see no key
        return None
    causal = masking.causal
    shape = (offset, num_q, num_k, causal, q.dtype, q.device)
    build = functools.partial(_build_offset_table, position, q, causal, q_row, k_row, offset)
    return TABLES.get(position, shape, build)


#: The last ``OffsetTable`` of each encoding, reused while the encoding is unchanged.
TABLES = EncodingCache()


def _build_offset_table(
    position: PositionalEncoding,
    q: Tensor,
    causal: bool,
    q_row: Tensor,
    k_row: Tensor,
    offset: int,
) -> OffsetTable:
    """The ``OffsetTable`` of ``position`` for the runs ``q_row``, ``k_row``."""
    num_q, num_k, dim = q_row.shape[-1], k_row.shape[-1], q.shape[-1]
    length = num_q + num_k - 1
    probe_k = k_row[-1] - torch.arange(length, device=k_row.device, dtype=k_row.dtype)
    zeros = q.new_zeros(1, 1, 1, dim)
    bias = position.score_bias(  # offsets q_pos[0] - probe_k = c - (Tk - 1) + m
        zeros.expand(1, q.shape[1], 1, dim), zeros.expand(1, q.shape[1], length, dim),
        q_row[:1], probe_k,
    )  # fmt: skip
    check_term("score_bias", bias, (1, q.shape[1], 1, length), position)
    values = bias[0, :, 0].to(q.dtype).clone(memory_format=torch.contiguous_format)
    if causal:  # negative offsets: a later key
        values[:, : max(num_k - 1 - offset, 0)] = float("-inf")
    return OffsetTable(values, num_k)


def offset_block(
    q: Tensor,
    k_rev: Tensor,
    v_rev: Tensor,
    values: Tensor,
    *,
    start: int,
    num_keys: int,
    dropout_p: float,
    scale: float,
    exact: bool = False,
) -> Tensor:
    """Attention of the query block ``q [B, H, Tb, D]`` starting at ``start`` over the keys
    ``0..limit-1`` given in reverse order (``k_rev, v_rev [B, H, limit, D]``), with the
    bias ``values [H, L]`` of an ``OffsetTable`` (mask included)."""
    heads, length = values.shape
    limit = k_rev.shape[-2]
    hankel = values.as_strided(  # [1, H, Tb, limit]
        (1, heads, q.shape[-2], limit),
        (heads * length, length, 1, 1),
        values.storage_offset() + start + num_keys - limit,
    )
    if exact:
        logits = torch.matmul(q, k_rev.transpose(-2, -1)) * scale + hankel
        return _eager(q, k_rev, v_rev, logits, dropout_p)[0]
    return F.scaled_dot_product_attention(
        q, k_rev, v_rev, attn_mask=hankel, dropout_p=dropout_p, scale=scale
    )


def weights_block(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_gates: Tensor,
    k_gates: Tensor,
    *params: Tensor,
    masking: Masking,
    start: int,
    position: PositionalEncoding,
    dropout_p: float,
    exact: bool = False,
) -> Tensor:
    """Attention of the query block ``q [B, H, Tb, D]`` starting at ``start`` over the first
    ``Tk`` keys ``k, v``, weighted by ``position.weights`` (WEIGHTS site) with the gates
    ``q_gates [B, H, Tb, G]`` and ``k_gates [B, H, Tk, G]``.

    ``params`` are passed for a recomputing backward only; ``exact`` changes nothing (no
    fused kernel runs here).
    """
    del params, exact
    stop, num_keys = start + q.shape[-2], k.shape[-2]
    q_pos, k_pos = masking.q_pos[..., start:stop], masking.k_pos[..., :num_keys]
    mask = masking.block(start, stop, slice(0, num_keys))  # [B|1, 1, Tb, Tk] or None
    probs = position.weights(q, k, q_pos, k_pos, q_gates, k_gates, mask)
    check_term("weights", probs, (q.shape[0], q.shape[1], q.shape[2], num_keys), position)
    probs = probs.to(v.dtype)
    probs = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
    return torch.matmul(probs, v)
