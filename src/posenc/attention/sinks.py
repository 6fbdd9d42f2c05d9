"""Learned attention sinks: one extra logit per head in the softmax's denominator (GPT-OSS,
OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", sec. 2.1; the "off-by-one" softmax of
Miller 2023 is a sink fixed at 0; Xiao et al. 2024, "Efficient Streaming Language Models
with Attention Sinks", for why heads want somewhere to put weight).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim.

Head ``h`` has a learned scalar ``s_h`` that joins every query's softmax as the logit of a
key with a zero value::

    p_ij = exp(l_ij) / (exp(s_h) + sum_j' exp(l_ij')),     out_i = sum_j p_ij v_j

so a row's weights sum to ``sigmoid(lse_i - s_h) < 1``, ``lse_i`` the log-sum-exp of the
row's logits. The eager formula appends the column to the logits (``sink_softmax``).
SDPA has no such term; ``sink_key`` appends the zero key and value the formula describes,
with the sink as the float mask of that key (``0 . q + s_h``), which is exact in one SDPA
call at the cost of a float mask with one more column (a causal SDPA call then needs that
mask instead of ``is_causal``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["sink_key", "sink_softmax"]


def _column(sinks: Tensor, like: Tensor, dtype: torch.dtype) -> Tensor:
    """``sinks [H]`` as a last column ``[*like.shape[:-1], 1]``."""
    return sinks.to(dtype).view(1, -1, 1, 1).expand(*like.shape[:-1], 1)


def sink_softmax(logits: Tensor, sinks: Tensor, dtype: torch.dtype) -> Tensor:
    """Softmax of ``logits [B, H, Tq, Tk]`` with the sink logit ``sinks [H]`` in each row's
    denominator, computed in ``dtype``: ``[B, H, Tq, Tk]`` (rows sum to less than 1; a row
    of ``-inf`` gives zeros)."""
    logits = logits.to(dtype)
    full = torch.cat((logits, _column(sinks, logits, dtype)), dim=-1)
    return torch.softmax(full, dim=-1)[..., :-1]


def sink_key(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, sinks: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``(k, v, attn_mask)`` for one SDPA call with sinks: a zero key and value appended to
    ``k, v [B, H, Tk, D]`` and the float mask ``[B|1, H, Tq|1, Tk + 1]`` whose last column is
    ``sinks [H]``; ``attn_mask`` (None, bool with True = attend, or float, broadcasting to
    ``[B, H, Tq, Tk]``) fills the rest."""
    zero = k.new_zeros((*k.shape[:-2], 1, k.shape[-1]))
    k, v = torch.cat((k, zero), dim=-2), torch.cat((v, zero), dim=-2)
    if attn_mask is None:
        attn_mask = q.new_zeros(1, 1, 1, k.shape[-2] - 1)
    elif attn_mask.dtype == torch.bool:
        attn_mask = q.new_zeros(attn_mask.shape).masked_fill_(~attn_mask, float("-inf"))
    heads = q.shape[1]
    attn_mask = attn_mask.to(q.dtype).expand(attn_mask.shape[0], heads, *attn_mask.shape[2:])
    return k, v, torch.cat((attn_mask, _column(sinks, attn_mask, q.dtype)), dim=-1)
