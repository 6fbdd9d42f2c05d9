"""T5 relative position buckets (Raffel et al. 2020, "Exploring the Limits of Transfer
Learning with a Unified Text-to-Text Transformer", sec. 2.1).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``N`` num_buckets. Each head
learns one scalar per bucket of the relative position ``r = k_pos - q_pos`` (memory minus
query, T5's convention), added to the attention logits. The bucket of ``r``:

* bidirectional: half of the ``N`` buckets for ``r > 0`` (offset ``N/2``), half for
  ``r <= 0``, each over ``n = |r|``; unidirectional (causal): ``n = max(-r, 0)`` and all
  ``N`` buckets (keys after the query share bucket 0);
* with ``M`` buckets per side and ``E = M // 2``: ``n < E`` gets its own bucket ``n``;
  larger ``n`` get log-spaced buckets
  ``E + trunc(log(n / E) / log(max_distance / E) * (M - E))``, capped at ``M - 1``, so
  every distance ``>= max_distance`` shares the last bucket.

The logarithm is taken in float32 in the same order of operations as T5 (and Hugging Face
transformers) so that buckets match pretrained checkpoints exactly.

``T5RelativeBias`` computes the bias through the ``Tq + Tk - 1`` distinct offsets when
positions are consecutive (a Toeplitz matrix: bucket and gather a short vector, then
expand), instead of bucketing a ``[Tq, Tk]`` matrix; other positions are bucketed
elementwise. One instance can serve several layers (T5 shares it across the stack).

Negative positions: allowed; the bias depends on ``q_pos - k_pos`` only, so positions
shifted below zero give the same bias.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc._checks import check_bool, check_int
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings._relative import (
    ScoreMod,
    check_hook_inputs,
    check_position_pair,
    offset_score_mod,
    require_integer,
    toeplitz_bias,
)

__all__ = ["T5RelativeBias", "t5_relative_bias", "t5_relative_position_bucket"]


def _check_buckets(num_buckets: int, max_distance: int, bidirectional: bool) -> None:
    check_bool("bidirectional", bidirectional)
    check_int("num_buckets", num_buckets, minimum=2)
    check_int("max_distance", max_distance)
    if bidirectional and num_buckets % 2:
        raise ValueError(f"num_buckets must be even when bidirectional, got {num_buckets}")
    per_side = num_buckets // 2 if bidirectional else num_buckets
    exact = per_side // 2
    if exact < 1:
        raise ValueError(
            f"num_buckets={num_buckets} leaves no exact bucket; use at least "
            f"{4 if bidirectional else 2}"
        )
    if max_distance <= exact:
        raise ValueError(
            f"max_distance must exceed the {exact} exact buckets "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional}), got {max_distance}"
        )


def t5_relative_position_bucket(
    relative_position: Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5's bucket of each relative position (``memory_position - query_position``).

    Args:
        relative_position: integer tensor of any shape.
        bidirectional: split the buckets by sign (encoder) or not (causal decoder).
        num_buckets: total buckets ``N`` (even when bidirectional).
        max_distance: distances from here on share the last bucket of their side.

    Returns:
        int64 buckets in ``[0, N)``, same shape as ``relative_position``.

    Raises:
        TypeError: a non-integer ``relative_position``.
        ValueError: too few buckets, an odd ``num_buckets`` when bidirectional, or a
            ``max_distance`` not above the exact-bucket range.
    """
    if not isinstance(relative_position, Tensor):
        raise TypeError(
            f"relative_position must be a torch.Tensor, got {type(relative_position).__name__}"
        )
    if (
        relative_position.is_floating_point()
        or relative_position.is_complex()
        or relative_position.dtype == torch.bool
    ):
        raise TypeError(
            f"relative_position must be an integer tensor, got dtype {relative_position.dtype}"
        )
    _check_buckets(num_buckets, max_distance, bidirectional)
    # every distance >= max_distance shares the last bucket, so clamping there changes no
    # bucket and keeps |r| from overflowing at the int64 minimum
    r = relative_position.to(torch.int64).clamp(-max_distance, max_distance)
    if bidirectional:
        per_side = num_buckets // 2
        side = (r > 0).to(torch.int64) * per_side
        n = r.abs()
    else:
        per_side = num_buckets
        side = torch.zeros_like(r)
        n = (-r).clamp(min=0)
    exact = per_side // 2
    # float32 log in T5's order of operations; n == 0 only reaches the discarded branch
    scaled = torch.log(n.float() / exact) / math.log(max_distance / exact) * (per_side - exact)
    large = (exact + scaled.to(torch.int64)).clamp(max=per_side - 1)
    return side + torch.where(n < exact, n, large)


def _t5_fn(table: Tensor, bidirectional: bool, num_buckets: int, max_distance: int):
    def fn(d: Tensor, dtype: torch.dtype) -> Tensor:
        bucket = t5_relative_position_bucket(
            -d, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )  # [N0, 1, N1, N2]
        return table[bucket.squeeze(1)].to(dtype).permute(0, 3, 1, 2)  # [N0, H, N1, N2]

    return fn


def t5_relative_bias(
    table: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The T5 bias ``table[bucket(k_pos - q_pos)]`` for explicit integer positions.

    Args:
        table: ``[N, H]`` learned values (``N`` = num_buckets).
        q_pos: ``[Tq]`` or ``[B, Tq]`` integer query positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` integer key positions.
        bidirectional: as in ``t5_relative_position_bucket``.
        max_distance: as in ``t5_relative_position_bucket``.
        dtype: output dtype (default: the table's).

    Returns:
        ``[B|1, H, Tq, Tk]``.

    Raises:
        TypeError: float positions (T5 buckets integer offsets).
        ValueError: a ``table`` that is not 2-D, or bad bucket settings.
    """
    if table.dim() != 2:
        raise ValueError(f"table must be [num_buckets, num_heads], got {tuple(table.shape)}")
    q_pos, k_pos = check_position_pair(q_pos, k_pos)
    require_integer("T5RelativeBias", q_pos, k_pos)
    fn = _t5_fn(table, bidirectional, table.shape[0], max_distance)
    return toeplitz_bias(fn, q_pos, k_pos, table.dtype if dtype is None else dtype)


@register(
    "t5",
    paper="Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5), sec. 2.1",
    description="learned per-head scalar per log-spaced relative-distance bucket",
)
class T5RelativeBias(PositionalEncoding):
    """T5's learned relative position bias, ``relative_attention_bias.weight [N, H]``.

    The parameter name and layout match Hugging Face's T5 (``relative_attention_bias``),
    so its weights load directly. The table starts normal with std 0.02 (T5 scales its
    initialisation by ``d_model ** -0.5``, which a position module does not know).

    Args:
        num_heads: ``H``.
        num_buckets: ``N`` (even when bidirectional).
        max_distance: distances from here on share the last bucket.
        bidirectional: True for encoders, False for causal decoders (all buckets spent on
            past keys). None (the default) means ``not causal``: True unless the encoding
            is built for a causal model.
        causal: whether the attention using it is causal (``posenc.build`` passes the
            model's setting); only decides the default of ``bidirectional``.

    Raises:
        ValueError: ``num_heads < 1`` or bad bucket settings (see
            ``t5_relative_position_bucket``).
    """

    sites = Site.SCORE
    offset_only = True

    def __init__(
        self,
        num_heads: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool | None = None,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        causal = check_bool("causal", causal)
        if bidirectional is None:  # a decoder spends every bucket on the past (T5's decoder)
            bidirectional = not causal
        _check_buckets(num_buckets, max_distance, bidirectional)
        self.num_buckets = int(num_buckets)
        self.max_distance = int(max_distance)
        self.bidirectional = bool(bidirectional)
        self.relative_attention_bias = nn.Embedding(self.num_buckets, self.num_heads)
        nn.init.normal_(self.relative_attention_bias.weight, std=0.02)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``[B|1, H, Tq, Tk]`` bias in ``q``'s dtype (integer positions only)."""
        q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos, num_heads=self.num_heads, module=self)
        return t5_relative_bias(
            self.relative_attention_bias.weight,
            q_pos,
            k_pos,
            bidirectional=self.bidirectional,
            max_distance=self.max_distance,
            dtype=q.dtype,
        )

    def score_mod(self) -> ScoreMod:
        """FlexAttention ``score_mod`` adding this bias (query/key indices as positions);
        for eager ``flex_attention`` (see ``offset_score_mod``)."""
        table = self.relative_attention_bias.weight
        return offset_score_mod(
            _t5_fn(table, self.bidirectional, self.num_buckets, self.max_distance)
        )

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )
