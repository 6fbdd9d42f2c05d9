"""ALiBi: attention with linear biases (Press, Smith and Lewis 2022, "Train Short, Test
Long", sec. 3).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys. Head ``h`` adds to the
logit of query position ``i`` and key position ``j``

    causal:         b_h(i, j) = -m_h * (i - j)
    bidirectional:  b_h(i, j) = -m_h * |i - j|

with the geometric slopes of the paper's code: for ``H`` a power of two,
``m_h = 2 ** (-8 h / H)``, ``h = 1..H``; otherwise, with ``c`` the largest power of two
below ``H``, the ``c`` slopes of ``c`` heads followed by the first ``H - c`` of every
other slope of ``2c`` heads (``slopes(2c)[0::2]``). MPT generalises the 8 to its
``alibi_bias_max`` (``max_bias`` here); a checkpoint's own slopes (Falcon rounds them to
bfloat16) can be passed as ``slopes``.

The bias is computed from ``q_pos - k_pos`` itself, in float32 (float64 for float64
inputs), and rounded to the output dtype once. It is *not* the row-shifted ``m * j``
shortcut (equal to it only under a causal mask, after the softmax): that one holds
values of size ``m * T`` whose bf16 rounding erases the one-step differences between
neighbouring keys at long lengths, while here the bias near the diagonal stays small and
exact. Under a causal mask the keys after the query are masked, so ``causal=True`` leaves
their (positive) bias unused; use ``causal=False`` without one.

Negative positions: allowed; the bias depends on ``q_pos - k_pos`` only, so positions
shifted below zero give the same bias.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_bool, check_float, check_float_dtype, check_int, check_tensor
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings._relative import (
    ScoreMod,
    check_hook_inputs,
    check_position_pair,
    per_head,
    toeplitz_bias,
)

__all__ = ["ALiBi", "alibi_bias", "alibi_slopes"]


def alibi_slopes(
    num_heads: int, *, max_bias: float = 8.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The ALiBi slope of each head, ``[H]``, for any head count.

    Args:
        num_heads: ``H >= 1``.
        max_bias: ``b`` in ``m_h = 2 ** (-b h / c)`` (8 in the paper; MPT's
            ``alibi_bias_max``).
        dtype: a floating-point output dtype (the slopes are computed in float64 and
            rounded once).

    Returns:
        ``[H]`` slopes, largest (most local head) first.

    Raises:
        ValueError: ``num_heads < 1``, a non-positive or non-finite ``max_bias``.
        TypeError: a non-integer ``num_heads``, a non-floating ``dtype``.
    """
    num_heads = check_int("num_heads", num_heads)
    max_bias = check_float("max_bias", max_bias, positive=True)
    dtype = check_float_dtype("dtype", dtype)
    c = 1 << (num_heads.bit_length() - 1)  # largest power of two <= H
    h = torch.arange(1, c + 1, dtype=torch.float64)
    slopes = torch.exp2(-max_bias * h / c)
    if c < num_heads:
        odd = torch.arange(1, 2 * (num_heads - c), 2, dtype=torch.float64)
        slopes = torch.cat((slopes, torch.exp2(-max_bias * odd / (2 * c))))
    return slopes.to(dtype)


def _explicit_slopes(slopes: object, num_heads: int) -> Tensor:
    """Checked ``[H]`` float64 copy of a checkpoint's slopes."""
    check_tensor("slopes", slopes, ndim=1)
    if slopes.shape[0] != num_heads:
        raise ValueError(f"slopes has {slopes.shape[0]} entries, expected num_heads={num_heads}")
    if slopes.device.type == "meta":
        raise ValueError("slopes must hold values; got a tensor on the meta device")
    if not bool(torch.isfinite(slopes).all()):
        raise ValueError("slopes must be finite")
    return slopes.detach().to(device="cpu", dtype=torch.float64).clone()


def _alibi_fn(slopes: Tensor, causal: bool):
    def fn(d: Tensor, dtype: torch.dtype) -> Tensor:
        negated = -d if causal else -d.abs()  # exact in int64; no -0.0 on the diagonal
        return per_head(slopes, dtype) * negated.to(dtype)

    return fn


def alibi_bias(
    q_pos: Tensor | int,
    k_pos: Tensor | int,
    num_heads: int,
    *,
    causal: bool = True,
    max_bias: float = 8.0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """ALiBi bias for explicit positions, or for lengths: ``alibi_bias(T, T, num_heads)``.

    Args:
        q_pos: query positions ``[Tq]`` or ``[B, Tq]`` (integer or float); or the number of
            queries ``Tq`` (an int): the last ``Tq`` of the keys' positions.
        k_pos: key positions ``[Tk]`` or ``[B, Tk]``; or the number of keys ``Tk`` (an
            int): positions ``0..Tk-1``.
        num_heads: ``H``.
        causal: ``-m (i - j)`` when True, ``-m |i - j|`` when False.
        max_bias: as in ``alibi_slopes``.
        dtype: a floating-point output dtype.

    Returns:
        ``[B|1, H, Tq, Tk]``.

    Raises:
        ValueError: ``num_heads < 1``, positions of rank other than 1 or 2, lengths below
            1 or ``Tq > Tk``.
        TypeError: bf16/fp16/bool positions, a non-bool ``causal``, a non-floating
            ``dtype``; a length with a positions tensor.
    """
    causal = check_bool("causal", causal)
    lengths = [isinstance(p, int) and not isinstance(p, bool) for p in (q_pos, k_pos)]
    if any(lengths):
        if not all(lengths):
            raise TypeError(
                "alibi_bias takes two lengths or two positions tensors, got "
                f"q_pos {type(q_pos).__name__} and k_pos {type(k_pos).__name__}"
            )
        t_q, t_k = check_int("q_pos (length)", q_pos), check_int("k_pos (length)", k_pos)
        if t_q > t_k:
            raise ValueError(f"alibi_bias: {t_q} queries but only {t_k} keys")
        k_pos = torch.arange(t_k)
        q_pos = k_pos[t_k - t_q :]
    q_pos, k_pos = check_position_pair(q_pos, k_pos)
    slopes = alibi_slopes(num_heads, max_bias=max_bias, dtype=torch.float64).to(q_pos.device)
    return toeplitz_bias(_alibi_fn(slopes, causal), q_pos, k_pos, dtype)


@register(
    "alibi",
    paper="Press et al. 2022, Train Short, Test Long: Attention with Linear Biases",
    description="per-head linear penalty -m * distance on the attention logits; no parameters",
)
class ALiBi(PositionalEncoding):
    """ALiBi as a SCORE-site encoding (no parameters).

    Args:
        num_heads: ``H``; the slopes follow ``alibi_slopes(H, max_bias=max_bias)``.
        causal: True for ``-m (i - j)`` (keys after the query must be masked), False for
            the symmetric ``-m |i - j|``.
        max_bias: as in ``alibi_slopes`` (MPT's ``alibi_bias_max``).
        slopes: a checkpoint's own slopes ``[H]`` instead (e.g. Falcon's, rounded to
            bfloat16); ``max_bias`` is then unused.

    Raises:
        ValueError: ``num_heads < 1``, ``slopes`` not of length ``H`` or not finite.
        TypeError: a non-bool ``causal``; non-float ``slopes``.
    """

    sites = Site.SCORE
    offset_only = True
    #: ``score_mod`` is a closed form: the ``flex`` backend uses it, not the offset table
    flex_score_mod = True

    def __init__(
        self,
        num_heads: int,
        *,
        causal: bool = True,
        max_bias: float = 8.0,
        slopes: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        self.causal = check_bool("causal", causal)
        self.max_bias = check_float("max_bias", max_bias, positive=True)
        self.explicit_slopes = slopes is not None
        if slopes is None:
            slopes = alibi_slopes(self.num_heads, max_bias=self.max_bias, dtype=torch.float64)
        self._base = _explicit_slopes(slopes, self.num_heads)
        self._slopes: dict[torch.device, Tensor] = {}

    def slopes(self, device: torch.device | str | None = None) -> Tensor:
        """The float64 slopes ``[H]`` on ``device`` (cached; not a buffer).

        No lock: two threads that miss the cache at once compute the same slopes, and the
        dict assignment is atomic (a lock would also stop ``torch.compile`` here)."""
        device = torch.device(device or "cpu")
        cached = self._slopes.get(device)
        if cached is None:
            cached = self._base.to(device)
            if not torch.compiler.is_compiling():  # a checkpointed graph keeps none it made
                self._slopes[device] = cached
        return cached

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``[B|1, H, Tq, Tk]`` bias in ``q``'s dtype."""
        q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos, num_heads=self.num_heads)
        fn = _alibi_fn(self.slopes(q.device), self.causal)
        return toeplitz_bias(fn, q_pos, k_pos, q.dtype)

    def score_mod(self, device: torch.device | str | None = None) -> ScoreMod:
        """FlexAttention ``score_mod`` adding this bias (query/key indices as positions),
        for inputs on ``device``: the closed form ``-m_h |i - j|`` in float32, one slope
        read per score (FlexAttention compiled for the CPU prefers it to reading an offset
        table: about SDPA's speed at 2k-4k tokens, where the table costs 9-18 %)."""
        slopes = self.slopes(device).to(torch.float32)  # [H]
        causal = self.causal

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
            d = q_idx - kv_idx
            distance = d if causal else torch.abs(d)  # exact in int; no -0.0 on the diagonal
            return score - (slopes[h] * distance).to(score.dtype)

        return score_mod

    def extra_repr(self) -> str:
        slopes = "explicit" if self.explicit_slopes else f"max_bias={self.max_bias}"
        return f"num_heads={self.num_heads}, causal={self.causal}, slopes: {slopes}"
