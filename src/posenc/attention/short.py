"""Short sequences on the ``flex`` backend: CoPE's and Shaw's whole attention as one graph.

Shapes: ``B`` batch, ``H`` heads, ``T`` queries = keys (a length bucket), ``D`` head_dim,
``P`` CoPE's npos_max, ``K`` Shaw's clip distance. Causal attention at positions
``0..T-1``, as the ``flex`` backend runs it (``posenc.attention.flex``).

Up to ``SHORT_MAX`` tokens (and ``SHORT_MAX_SCORES`` scores), CoPE's band covers the
whole sequence (its first band is ``4P = 256`` offsets wide) and Shaw's band step,
phantom key and value step are three calls around FlexAttention, each with its fixed
cost; there the eager formula of
``posenc.attention.blocks`` compiled as one graph (static shapes, once per length bucket)
does less: one ``[B, H, T, T]`` product of queries and keys serves both CoPE's gates and
the logits (Golovneva et al. 2024, eqs. (3)-(6)), and Shaw's key and value terms (Shaw
et al. 2018, eqs. (3)-(4)) are a gather and a ``[T, 2K + 1]`` product around it. Same
formulas as the eager backend: ``posenc.encodings.cope`` and ``posenc.encodings.shaw``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._compiling import static_compiled
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding
from posenc.encodings.cope import _interpolate
from posenc.encodings.shaw import shaw_band_value

__all__ = ["SHORT_MAX", "SHORT_MAX_SCORES", "runs_short", "short_attend"]

#: Longest length bucket run as one compiled graph, per flex kind (CoPE's ``"band"``,
#: ``"shaw"``); longer ones use FlexAttention. At ``[1, 8, 512, 64]`` CoPE's band step and
#: FlexAttention (2.3x causal SDPA) beat its graph, which writes five ``[B, H, T, T]``
#: tensors (2.3x, but up to 4x when the allocator hands those pages back between calls).
SHORT_MAX = {"band": 256, "shaw": 512}

#: Most scores ``B * H * T^2`` of one call run as one graph: it writes a few tensors of
#: that size (16 MiB each in float32), where FlexAttention writes none.
SHORT_MAX_SCORES = 1 << 22


def runs_short(q: Tensor, kind: str) -> bool:
    """Whether ``q [B, H, T, D]`` (``T`` a length bucket) runs as one compiled graph for
    the flex kind ``kind``."""
    batch, heads, length, _ = q.shape
    fits = batch * heads * length * length <= SHORT_MAX_SCORES
    return fits and length <= SHORT_MAX.get(kind, 0)


def short_attend(
    q: Tensor, k: Tensor, v: Tensor, position: PositionalEncoding, kind: str, scale: float
) -> Tensor:
    """Causal attention of ``q, k, v [B, H, T, D]`` (positions ``0..T-1``) with CoPE's
    (``kind="band"``) or Shaw's (``kind="shaw"``) bias, ``[B, H, T, D]``."""
    if kind == "band":
        logits = _cope_logits(q, k, position.pos_emb.detach().to(q.dtype), scale)
        return torch.matmul(torch.softmax(logits, -1).to(v.dtype), v.flip(-2))
    key_table, value_table = (
        t.detach().to(q.dtype) for t in (position.key_table, position.value_table)
    )
    probs = torch.softmax(_shaw_logits(q, k, key_table, scale), -1).to(v.dtype)
    return torch.matmul(probs, v.flip(-2)) + _shaw_values(probs, value_table)


def _reversed(length: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The geometry of keys taken in reverse order: ``rows [T, 1]``, the query positions,
    and ``keys [T]``, the position of the key at each column ``c`` (``T - 1 - c``)."""
    index = torch.arange(length, device=device)
    return index[:, None], length - 1 - index


def _cope_logits_eager(q: Tensor, k: Tensor, pos_emb: Tensor, scale: float) -> Tensor:
    """CoPE's masked logits over the keys in reverse order (``cope_bias`` plus the
    scores), the products of queries and keys computed once for the gates and the logits.

    Reversed, the gates' sum from the diagonal is a cumulative sum. The softmax runs after
    the graph: fused into it, inductor recomputes the interpolation's gathers in each of
    the softmax's passes."""
    length, dim, npos = q.shape[-2], q.shape[-1], pos_emb.shape[0]
    work = compute_dtype(q.dtype)
    rows, keys = _reversed(length, q.device)
    visible = keys <= rows  # [T, T]
    dots = torch.matmul(q, k.flip(-2).transpose(-2, -1)).to(work)  # [B, H, T, T]
    gates = torch.sigmoid(dots * dim**-0.5) * visible
    positions = gates.cumsum(-1).clamp(max=npos - 1)
    per_position = torch.matmul(q, pos_emb.T).to(work) * dim**-0.5  # [B, H, T, P]
    logits = dots * scale + _interpolate(per_position, positions)
    return logits.masked_fill(~visible, float("-inf"))


def _shaw_logits_eager(q: Tensor, k: Tensor, key_table: Tensor, scale: float) -> Tensor:
    """Shaw's masked logits over the keys in reverse order: the scores plus the key term,
    gathered from the ``2K + 1`` per-offset products ``q_i . w^K[r] / sqrt(D)``."""
    length, dim, clip = q.shape[-2], q.shape[-1], (key_table.shape[0] - 1) // 2
    rows, keys = _reversed(length, q.device)
    offset = (keys - rows).clamp(-clip, clip) + clip  # [T, T]: the row of w^K
    per_offset = torch.matmul(q, key_table.T) * dim**-0.5  # [B, H, T, 2K + 1]
    key_term = per_offset.gather(-1, offset.expand(*q.shape[:2], length, length))
    logits = torch.matmul(q, k.flip(-2).transpose(-2, -1)) * scale + key_term
    return logits.masked_fill(keys > rows, float("-inf"))


def _shaw_values_eager(probs: Tensor, value_table: Tensor) -> Tensor:
    """Shaw's value term from ``probs [B, H, T, T]`` over the keys in reverse order: the
    probabilities of the ``K`` keys nearest the diagonal (``shaw_band_value``)."""
    length, clip = probs.shape[-1], (value_table.shape[0] - 1) // 2
    rows, _ = _reversed(length, probs.device)
    near = torch.arange(clip, device=probs.device)  # d: key i - d at c = T - 1 - i + d
    column = (length - 1 - rows + near).clamp(max=length - 1)  # [T, K]
    band = probs.gather(-1, column.expand(*probs.shape[:2], length, clip))
    band = band.masked_fill(near > rows, 0.0)  # keys before position 0
    return shaw_band_value(band, value_table)


_cope_logits = static_compiled(lambda: _cope_logits_eager, fullgraph=True)
_shaw_logits = static_compiled(lambda: _shaw_logits_eager, fullgraph=True)
_shaw_values = static_compiled(lambda: _shaw_values_eager, fullgraph=True)
