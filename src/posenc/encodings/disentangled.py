"""Disentangled attention (He, Liu, Gao and Chen 2021, "DeBERTa: Decoding-enhanced BERT with
Disentangled Attention", eqs. 2-4 and Algorithm 1; DeBERTa-v2/v3's log buckets).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim, ``C`` d_model,
``k`` the span (``max_relative_positions``, or ``position_buckets`` when bucketed). One table
of relative embeddings ``P [2k, C]`` (shared by the model's layers; layer-normed in
DeBERTa-v2 when ``norm_rel_ebd`` says so) is projected per layer to position keys
``K^r = P W_{k,r}`` and position queries ``Q^r = P W_{q,r}``, ``[H, 2k, D]``. The scores are

    A_ij = (q_i . k_j + q_i . K^r[idx_ij] + k_j . Q^r[idx_ij]) / sqrt(D * s)

with ``s = 1 + (number of position terms)``: content-to-content, content-to-position
("c2p") and position-to-content ("p2c"); ``idx_ij = clip(r_ij + k, 0, 2k - 1)`` with
``r_ij = i - j``, or its log bucket ``r_ij = bucket(i - j)`` (DeBERTa-v2,
``log_bucket_position``). The p2c row: the paper's eq. 4 indexes ``Q^r`` by ``delta(j, i)``;
transformers' code (ported from the released one, with which the checkpoints were trained)
gathers it at ``-bucket(j - i) = bucket(i - j)``, the same row as c2p. posenc reads that row
(the tests compare the scores with transformers' own).

posenc's attention divides ``q . k`` by ``sqrt(D)`` only, so this encoding acts at two sites:
QK multiplies the queries by ``1 / sqrt(s)`` (then ``q . k / sqrt(D)`` is DeBERTa's
content term) and SCORE adds ``c2p + p2c``. ``score_bias`` therefore receives the scaled
queries. With ``share_att_key`` (DeBERTa-v2) the position projections are the layer's own
query and key projections: ``posenc.hf.load_hf_weights`` copies those into this module's
projections (copies: training them here would untie them).

Positions: integer ``[T]`` or ``[B, T]``; the scores depend on ``i - j`` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from posenc._checks import check_bool, check_float, check_int
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings._relative import (
    check_hook_inputs,
    check_position_pair,
    offsets,
    require_integer,
)

__all__ = [
    "POS_ATT_TYPES",
    "DisentangledAttention",
    "RelativeEmbeddingTable",
    "disentangled_bias",
    "disentangled_relative_index",
    "log_bucket_position",
]

#: The position terms DeBERTa defines ("p2p" is accepted by transformers' config but adds
#: nothing to the scores in DeBERTa-v2 while it changes the scale in DeBERTa: rejected).
POS_ATT_TYPES = ("c2p", "p2c")


def _check_buckets(position_buckets: int, max_relative_positions: int) -> None:
    check_int("position_buckets", position_buckets, minimum=2)
    check_int("max_relative_positions", max_relative_positions)
    if max_relative_positions - 1 <= position_buckets // 2:
        raise ValueError(
            f"max_relative_positions={max_relative_positions} must exceed "
            f"position_buckets // 2 + 1 = {position_buckets // 2 + 1} (the log range is empty)"
        )


def log_bucket_position(
    relative: Tensor, *, position_buckets: int, max_relative_positions: int
) -> Tensor:
    """DeBERTa-v2's log buckets of integer offsets (``make_log_bucket_position``).

    With ``m = position_buckets // 2``: offsets with ``|r| <= m`` stay; larger ones map to
    ``sign(r) * (m + ceil((m - 1) * ln(|r| / m) / ln((max_relative_positions - 1) / m)))``,
    evaluated in float32 as transformers does, so the buckets are the checkpoints' own.

    Args:
        relative: integer offsets ``r = i - j``, any shape.
        position_buckets: ``>= 2``.
        max_relative_positions: greater than ``position_buckets // 2 + 1``.

    Returns:
        int64, ``relative``'s shape.

    Raises:
        ValueError: ``position_buckets < 2`` or an empty log range.
        TypeError: floating-point offsets.
    """
    if relative.is_floating_point():
        raise TypeError(f"log_bucket_position needs integer offsets, got {relative.dtype}")
    _check_buckets(position_buckets, max_relative_positions)
    mid = position_buckets // 2
    relative = relative.to(torch.int64)
    magnitude = relative.abs()
    inside = magnitude <= mid
    ratio = magnitude.clamp(min=mid).to(torch.float32) / mid  # >= 1 where it is used
    log_range = torch.log(torch.tensor((max_relative_positions - 1) / mid, dtype=torch.float32))
    logs = torch.ceil(torch.log(ratio) / log_range.to(ratio.device) * (mid - 1)) + mid
    return torch.where(inside, relative, logs.to(torch.int64) * relative.sign())


def disentangled_relative_index(
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    span: int,
    position_buckets: int | None = None,
    max_relative_positions: int | None = None,
) -> Tensor:
    """Row of ``P`` read by each query/key pair: ``clip(r_ij + k, 0, 2k - 1)``.

    Args:
        q_pos: ``[Tq]`` or ``[B, Tq]`` integer positions ``i``.
        k_pos: ``[Tk]`` or ``[B, Tk]`` integer positions ``j``.
        span: ``k``, half the table's rows.
        position_buckets: log buckets of ``i - j`` when given (then
            ``max_relative_positions`` is required); plain offsets when None.
        max_relative_positions: the log range's end.

    Returns:
        int64 ``[B|1, 1, Tq, Tk]`` in ``[0, 2k - 1]``.

    Raises:
        TypeError: float positions. ValueError: bad ranks, ``span < 1``, bad buckets.
    """
    span = check_int("span", span)
    q_pos, k_pos = check_position_pair(q_pos, k_pos)
    require_integer("disentangled attention", q_pos, k_pos)
    relative = offsets(q_pos, k_pos)  # i - j
    if position_buckets is not None:
        if max_relative_positions is None:
            raise ValueError("position_buckets needs max_relative_positions")
        relative = log_bucket_position(
            relative,
            position_buckets=position_buckets,
            max_relative_positions=max_relative_positions,
        )
    return (relative + span).clamp(0, 2 * span - 1)


def disentangled_bias(
    q: Tensor, k: Tensor, index: Tensor, pos_key: Tensor | None, pos_query: Tensor | None
) -> Tensor:
    """``q_i . pos_key[idx_ij] + k_j . pos_query[idx_ij]`` (either term may be None).

    Neither term materializes ``[B, H, Tq, Tk, D]``: ``q`` meets the ``2k`` position keys
    (``[B, H, Tq, 2k]``) and the result is gathered by row; likewise ``k`` (``[B, H, Tk, 2k]``).

    Args:
        q: ``[B, H, Tq, D]``. k: ``[B, H, Tk, D]``.
        index: ``[B|1, 1, Tq, Tk]`` rows from ``disentangled_relative_index``.
        pos_key: ``K^r [H, 2k, D]`` (c2p) or None. pos_query: ``Q^r [H, 2k, D]`` (p2c) or None.

    Returns:
        ``[B, H, Tq, Tk]`` in ``q``'s dtype, ``k`` read in it too (zeros when both terms
        are None).
    """
    batch, heads, tq, _ = q.shape
    index = index.expand(batch, heads, tq, k.shape[2])
    out = q.new_zeros(batch, heads, tq, k.shape[2])
    if pos_key is not None:
        c2p = torch.matmul(q, pos_key.to(q.dtype).transpose(-1, -2))  # [B, H, Tq, 2k]
        out = out + c2p.gather(-1, index)
    if pos_query is not None:
        p2c = torch.matmul(k.to(q.dtype), pos_query.to(q.dtype).transpose(-1, -2))  # [B, H, Tk, 2k]
        out = out + p2c.transpose(-1, -2).gather(-2, index)
    return out


class RelativeEmbeddingTable(nn.Module):
    """The relative embeddings ``P [2k, C]``, layer-normed on read when ``layer_norm``.

    Pass one table to every layer's ``DisentangledAttention`` to share it, as DeBERTa does.

    Args:
        d_model: ``C``. span: ``k``.
        layer_norm: DeBERTa-v2's ``norm_rel_ebd="layer_norm"``. eps: its epsilon.

    Raises:
        ValueError: ``d_model < 1``, ``span < 1``, a non-positive ``eps``.
    """

    def __init__(
        self, d_model: int, span: int, *, layer_norm: bool = False, eps: float = 1e-7
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model)
        self.span = check_int("span", span)
        self.weight = nn.Parameter(torch.randn(2 * self.span, self.d_model) * 0.02)
        check_bool("layer_norm", layer_norm)
        eps = check_float("eps", eps, positive=True)
        self.norm = nn.LayerNorm(self.d_model, eps=eps) if layer_norm else None

    def forward(self) -> Tensor:
        """``P [2k, C]`` (normed when the table has a LayerNorm)."""
        return self.weight if self.norm is None else self.norm(self.weight)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, span={self.span}"


def _pos_att_type(value: Sequence[str] | str) -> tuple[str, ...]:
    kinds = value.split("|") if isinstance(value, str) else list(value)
    kinds = [k.strip().lower() if isinstance(k, str) else k for k in kinds]
    bad = [k for k in kinds if k not in POS_ATT_TYPES]
    if bad or len(set(kinds)) != len(kinds):
        raise ValueError(
            f"pos_att_type={value!r}: each of {list(POS_ATT_TYPES)} at most once"
            + (f"; unknown {bad}" if bad else "")
        )
    return tuple(k for k in POS_ATT_TYPES if k in kinds)


@register(
    "disentangled",
    paper="He et al. 2021, DeBERTa: Decoding-enhanced BERT with Disentangled Attention",
    description="relative embeddings projected to position keys and queries (c2p, p2c)",
)
class DisentangledAttention(PositionalEncoding):
    """DeBERTa's content-to-position and position-to-content terms (QK and SCORE sites).

    Args:
        d_model: ``C``, the width of the relative embeddings.
        num_heads: ``H``.
        head_dim: ``D`` (``d_model // num_heads`` when None).
        max_relative_positions: ``k`` without buckets; the log range's end with them.
        position_buckets: DeBERTa-v2's buckets (then ``k = position_buckets``); None: none.
        pos_att_type: a subset of ``("c2p", "p2c")`` or ``"c2p|p2c"``.
        table: a ``RelativeEmbeddingTable`` to share (built here when None).
        key_bias: whether the position-key projection has a bias (DeBERTa's has none).

    Raises:
        ValueError: an unknown or repeated ``pos_att_type``, ``position_buckets < 2``, an
            empty log range, a ``table`` whose span or width does not fit.
    """

    sites = Site.QK | Site.SCORE

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        max_relative_positions: int = 512,
        position_buckets: int | None = None,
        pos_att_type: Sequence[str] | str = POS_ATT_TYPES,
        table: RelativeEmbeddingTable | None = None,
        key_bias: bool = True,
    ) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        self.head_dim = check_int(
            "head_dim", d_model // num_heads if head_dim is None else head_dim
        )
        self.max_relative_positions = check_int("max_relative_positions", max_relative_positions)
        if position_buckets is not None:
            _check_buckets(position_buckets, max_relative_positions)
        self.position_buckets = position_buckets
        self.pos_att_type = _pos_att_type(pos_att_type)
        self.span = max_relative_positions if position_buckets is None else position_buckets
        if table is None:
            table = RelativeEmbeddingTable(self.d_model, self.span)
        if not isinstance(table, RelativeEmbeddingTable):
            raise TypeError(f"table must be a RelativeEmbeddingTable, got {type(table).__name__}")
        if (table.span, table.d_model) != (self.span, self.d_model):
            raise ValueError(
                f"table has span {table.span} and width {table.d_model}; expected span "
                f"{self.span} and width {self.d_model}"
            )
        self.table = table
        width = self.num_heads * self.head_dim
        has = set(self.pos_att_type)
        check_bool("key_bias", key_bias)
        self.pos_key_proj = nn.Linear(d_model, width, bias=key_bias) if "c2p" in has else None
        self.pos_query_proj = nn.Linear(d_model, width) if "p2c" in has else None

    @property
    def scale_factor(self) -> int:
        """``s = 1 + len(pos_att_type)``."""
        return 1 + len(self.pos_att_type)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """``(q / sqrt(s), k)``: posenc's ``1 / sqrt(D)`` then gives DeBERTa's content term."""
        return q * self.scale_factor**-0.5, k

    def _projected(self, proj: nn.Linear | None, rows: Tensor, scale: float) -> Tensor | None:
        if proj is None:
            return None
        out = proj(rows).view(rows.shape[0], self.num_heads, self.head_dim) * scale
        return out.transpose(0, 1)  # [H, 2k, D]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``c2p + p2c`` in logits units, ``[B, H, Tq, Tk]`` in ``q``'s dtype.

        ``q`` is the output of ``rotate`` (already divided by ``sqrt(s)``).
        """
        q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos, num_heads=self.num_heads, module=self)
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q has head_dim {q.shape[-1]}, expected {self.head_dim}")
        index = disentangled_relative_index(
            q_pos,
            k_pos,
            span=self.span,
            position_buckets=self.position_buckets,
            max_relative_positions=self.max_relative_positions,
        )
        rows = self.table()  # [2k, C]
        root_d = math.sqrt(self.head_dim)
        pos_key = self._projected(self.pos_key_proj, rows, 1 / root_d)
        pos_query = self._projected(
            self.pos_query_proj, rows, 1 / (root_d * self.scale_factor**0.5)
        )
        return disentangled_bias(q, k, index, pos_key, pos_query)

    def extra_repr(self) -> str:
        buckets = (
            "" if self.position_buckets is None else f", position_buckets={self.position_buckets}"
        )
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"max_relative_positions={self.max_relative_positions}{buckets}, "
            f"pos_att_type={'|'.join(self.pos_att_type)}"
        )
