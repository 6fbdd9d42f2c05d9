"""The ``flex`` backend: bias attention through FlexAttention, compiled (CPU inference).

Shapes: ``B`` batch, ``H`` heads, ``T`` queries = keys, ``D`` head_dim, ``K`` Shaw's clip
distance. FlexAttention (Dong et al. 2024, "Flex Attention: A Programming Model for
Generating Optimized Attention Kernels") fuses a ``score_mod(score, b, h, q_idx, kv_idx)``
into a blocked attention kernel; ``torch.compile`` turns it into one C++ kernel on CPU
(inductor's flex template), so no ``[Tq, Tk]`` bias is ever written and blocks that the
causal mask hides are skipped. Per encoding:

* ALiBi: its closed form ``-m_h |q_idx - kv_idx|`` (``ALiBi.score_mod``, marked
  ``flex_score_mod``): one slope per score, where a table read costs 9-18 % at 2k-4k;
* the other ``offset_only`` encodings (T5, KERPLE, Sandwich): the bias at each of the
  ``2T - 1`` offsets, one row per head (``posenc.attention.blocks.offset_table``), read by
  offset ``q_idx - kv_idx``. Under a causal mask, where every head's bias is one constant
  from some offset ``W <= T/2`` on (T5: every distance from about ``max_distance`` on
  shares the last bucket), that constant is the same for every key a row sees beyond the
  band, so the softmax ignores it: the bias minus it is read from a ``[H, W]`` table
  inside the band and is zero beyond (a masked load that inductor skips for each vector
  of 16 scores outside the band; negative offsets, hidden by the block mask, are outside
  too). Causal T5 (32 buckets, ``max_distance`` 128, so ``W = 113``), ``[1, 4, T, 64]``
  float32, 2 threads on a 2-core EPYC VM (load average 0.8-1.5), medians of 20
  round-robin repeats in three runs: 1.03-1.05x causal SDPA at 2048 tokens and
  1.05-1.06x at 4096 (1.08x at 8192, 10 repeats), was 1.14x, 1.18-1.19x (1.22x) with the
  full table; FlexAttention without a bias: 0.91-0.94x, 0.99x (1.03x). KERPLE and Sandwich
  have no constant tail and keep the table (1.12-1.21x at 2k-4k, 1.22-1.25x at 8k);
* encodings with a ``score_mod()`` method (FIRE): that method, exact with the indices
  as positions, given the bucket's length when it takes one: FIRE then reads its MLP as
  the piecewise-linear function it is, through a grid of the MLP's input
  (``FIRE.score_mod``), two table reads, a comparison and a multiply-add per score
  instead of 32 units (``[1, 8, 4096, 64]``: 2.6x causal SDPA, was 3.0x);
* CoPE: its gates are a cumulative sum over the keys, which no ``score_mod`` can
  compute; but once the sum from the diagonal reaches ``P - 1`` every farther key gets
  the same bias, a per-row constant the softmax ignores, so the bias minus that constant
  is zero beyond a band of ``W`` offsets (``CoPE.band_bias``, ``[B, H, T, W]``: one
  batched matmul, then compiled loops for the gates and the interpolation around their
  cumulative sum), read in the band by a masked load (as T5's) and zero beyond. With
  ``P = 64`` (``W = 256``), ``[1, 4, T, 64]`` float32, 2 threads on the same VM (load
  average 0.4-1.3), medians of 20 round-robin repeats: 1.72-2.44x causal SDPA at 2048
  tokens, 1.57-1.94x at 4096 (seven runs) and 1.58x at 8192 (one), where a clamped gather
  for every score, timed beside it, took 1.06x as long at 2048 (median of nine runs,
  1.02-1.08x) and 1.10x at 4096 (1.08-1.17x) and 8192; the band step alone was
  0.47-0.72x causal SDPA, and at 8 heads 1.0x at 512 tokens and 0.6x at 2048 once it
  took its keys in reverse order (loops inductor vectorizes) in blocks of 64 queries
  (``BAND_ROWS``; blocks of ``W = 256`` queries took 1.4x);
* Shaw et al.'s relative representations: the key term is ``q_i . w^K[r] / sqrt(D)``
  for the ``2K + 1`` clipped offsets ``r`` (``[B, H, T, 2K + 1]``), gathered by offset. The
  value term ``sum_j p_ij w^V[clip(j - i)]`` needs the probabilities of the ``K`` keys
  nearest the diagonal (causal: every farther key shares ``w^V[0]``), but FlexAttention
  on CPU returns no log-sum-exp. So a phantom key is put first, visible to every query,
  with logit ``c_i`` (the largest logit of the band) and value ``e_{D+1}``: the extra
  output column is ``p0_i = e^c_i / (Z_i + e^c_i)``, hence ``Z_i = e^c_i (1 - p0_i) / p0_i``,
  the band's probabilities ``p_ij = e^(s_ij - c_i) p0_i / (1 - p0_i)`` and the output
  ``out_i / (1 - p0_i)``; ``p0_i <= 1/2`` because ``Z_i >= e^c_i``, so nothing cancels.
  Then ``value = w^V[0] + sum_d p_i,i-d (w^V[K - d] - w^V[0])`` over ``d < K``.

Up to ``SHORT_MAX`` tokens CoPE and Shaw run instead as one compiled graph
(``posenc.attention.short``), where the band and phantom-key steps above cost more than
the attention. ``backend="auto"`` does not pick this backend for the ``offset_only``
encodings: their table read by SDPA as a view (``posenc.attention.blocks``) is faster
at every length from 256 to 8192 at 4 and 8 heads and compiles nothing.

Applies only where it is exact and supported: float32 CPU tensors without gradients
(FlexAttention has no CPU backward), queries that are the keys at positions ``0..T-1``
(``Masking.aligned``: no cached keys, padding or segments), no dropout, not inside an
outer ``torch.compile`` or a ``TorchDispatchMode``; Shaw and CoPE only under a causal
mask.

Compilation: a bounded set of length buckets, not one kernel per length. A sequence of
``T`` tokens is zero-padded to ``flex_bucket(T)`` (the next power of two, at least
``FLEX_MIN_BUCKET``) and every table is built at that length; the block mask hides the
padded keys from every real query and marks the padded queries' rows empty, so the
kernel skips their blocks and its work stays that of ``T`` tokens; the first ``T`` rows
are returned. Each kernel compiles once per bucket (and band width, CoPE's or T5's;
static shapes, 5-30 s on 2 cores, then cached on disk by inductor): 6 buckets cover
256-8k. Dynamic shapes are not used: they fail to build the Shaw kernel in torch 2.13 (a
C++ compile error). CoPE's band step (``cope_band_bias(compiled=True)``) runs on the
padded tensors, so it compiles once per bucket and band width too (zero queries and keys
reach the row constant within the first band: the padding widens no band).
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from posenc._compiling import static_compiled
from posenc.attention.blocks import offset_table
from posenc.attention.masking import Masking
from posenc.attention.reuse import EncodingCache
from posenc.attention.short import runs_short, short_attend
from posenc.base import PositionalEncoding, Site
from posenc.encodings._relative import band_dots
from posenc.encodings.shaw import shaw_band_value

__all__ = [
    "FLEX_MAX_BAND",
    "FLEX_MIN_BUCKET",
    "FLEX_MIN_LENGTH",
    "flex_attend",
    "flex_bucket",
    "flex_kind",
    "flex_refusal",
]

#: Shortest sequence for which ``backend="auto"`` picks FlexAttention for FIRE, CoPE and
#: Shaw (from 256 tokens on it is 1.8-9x faster than their chunked path at 8 heads);
#: shorter ones stay on the chunked path, which compiles nothing.
FLEX_MIN_LENGTH = 256

#: Shortest length bucket (FlexAttention's block of 128 tokens).
FLEX_MIN_BUCKET = 128

#: Widest CoPE band (offsets) ``auto`` accepts: its table is ``[B, H, T, W]``; a wider
#: one (gates far below 1 everywhere) runs on the chunked path.
FLEX_MAX_BAND = 1024


def flex_kind(position: PositionalEncoding) -> str | None:
    """How FlexAttention computes ``position``'s bias: ``"offset"``, ``"score_mod"``,
    ``"band"`` (CoPE), ``"shaw"``, or None when it cannot (a WEIGHTS or QK site)."""
    sites = position.sites
    if sites & (Site.WEIGHTS | Site.QK | Site.INPUT):
        return None
    if sites == Site.SCORE and getattr(position, "flex_score_mod", False):
        return "score_mod"
    if sites == Site.SCORE and getattr(position, "offset_only", False):
        return "offset"
    if sites == Site.SCORE and callable(getattr(position, "score_mod", None)):
        return "score_mod"
    if sites == Site.SCORE and callable(getattr(position, "band_bias", None)):
        return "band"
    shaw = all(hasattr(position, a) for a in ("key_table", "value_table", "max_relative_position"))
    return "shaw" if sites == Site.SCORE | Site.VALUE and shaw else None


def flex_refusal(
    position: PositionalEncoding, q: Tensor, masking: Masking, dropout_p: float, params: list
) -> str | None:
    """Why the ``flex`` backend cannot run this attention, or None when it can."""
    kind = flex_kind(position)
    if kind is None:
        return f"{type(position).__name__} has no FlexAttention form"
    if torch.compiler.is_compiling():
        return "it compiles its own kernel; call it outside torch.compile"
    if _get_current_dispatch_mode() is not None:  # e.g. peak_tensor_bytes' memory count
        return "a TorchDispatchMode is active, which FlexAttention's operator does not support"
    if q.device.type != "cpu" or q.dtype != torch.float32:
        return f"it runs float32 CPU tensors only, got {q.dtype} on {q.device.type}"
    needs_grad = any(t.requires_grad for t in params)
    if torch.is_grad_enabled() and needs_grad:
        return "FlexAttention has no CPU backward; run under torch.no_grad() or use 'chunked'"
    if not masking.aligned:
        return "it needs queries at positions 0..T-1 (no KV cache, padding or segments)"
    if kind in ("shaw", "band") and not masking.causal:
        return f"{type(position).__name__}'s flex form is for causal attention only"
    if dropout_p > 0:
        return "attention dropout is not supported"
    return None


def flex_bucket(length: int) -> int:
    """The padded length at which a ``length``-token sequence runs: the next power of two,
    at least ``FLEX_MIN_BUCKET`` (one compiled kernel per bucket, not per length)."""
    return max(FLEX_MIN_BUCKET, 1 << max(length - 1, 0).bit_length())


def flex_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    position: PositionalEncoding,
    masking: Masking,
    scale: float,
    max_band: int | None = None,
) -> Tensor | None:
    """Attention of ``q, k, v [B, H, T, D]`` with ``position``'s bias through FlexAttention
    (check ``flex_refusal`` first): ``[B, H, T, D]``, or None when a band-limited bias
    (CoPE) needs a band wider than ``max_band`` offsets (None: any). Runs at the length
    ``flex_bucket(T)``, the padding hidden by the block mask."""
    length = q.shape[-2]
    size = flex_bucket(length)
    if size > length:
        q, k, v = (nn.functional.pad(t, (0, 0, 0, size - length)) for t in (q, k, v))
    kind = flex_kind(position)
    if runs_short(q, kind):  # one compiled graph
        return short_attend(q, k, v, position, kind, scale)[..., :length, :]
    if kind == "shaw":
        return _shaw(q, k, v, position, scale, length)[..., :length, :]
    if kind == "band":
        band = position.band_bias(q, k, max_width=max_band or size, compiled=True)
        if band is None:
            return None
        score_mod = _band_mod(band)
    elif kind == "offset":
        pos = torch.arange(size, device=q.device)
        padded = Masking(masking.causal, pos, pos, aligned=True)
        values = offset_table(position, q, k, padded).values.detach()  # [H, 2 size - 1]
        band = _constant_tail_band(values[:, size - 1 :]) if masking.causal else None
        score_mod = _table_mod(values, size - 1) if band is None else _band_mod(band)
    else:
        score_mod = SCORE_MODS.get(position, (size, q.device), lambda: _score_mod(position, size))
    mask = _block_mask(size, length, 0, masking.causal, q.device.type)
    out = _flex(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    return out[..., :length, :]


def _table_mod(values: Tensor, shift: int):
    """``score + values[h, q_idx - kv_idx + shift]``."""

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + values[h, q_idx - kv_idx + shift]

    return score_mod


def _constant_tail_band(causal: Tensor) -> Tensor | None:
    """From ``causal [H, T]``, the bias at offsets ``0..T-1``: ``[H, W]``, the bias at
    offsets ``0..W-1`` minus the bias at ``T - 1``, where ``W`` is the first offset from
    which every head's bias equals its bias at ``T - 1``; None when ``W > T/2`` or that
    last bias is not finite."""
    last = causal[:, -1:]  # [H, 1]
    differs = (causal != last).any(0).nonzero()
    width = int(differs[-1]) + 1 if len(differs) else 1
    if 2 * width > causal.shape[-1] or not bool(torch.isfinite(last).all()):
        return None
    return (causal[:, :width] - last).contiguous()


def _band_mod(band: Tensor):
    """``score + band[..., q_idx - kv_idx]`` at offsets ``0..W-1``, ``score`` elsewhere,
    for a band of one row per head (``[H, W]``: T5's) or per query (``[B, H, T, W]``:
    CoPE's): a masked load, skipped for each vector of scores wholly outside the band."""
    width, per_query = band.shape[-1], band.dim() == 4

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        offset = q_idx - kv_idx
        near = (offset >= 0) & (offset < width)
        index = [b, h, q_idx, offset] if per_query else [h, offset]
        return score + torch.ops.aten._unsafe_masked_index(band, near, index, 0.0)

    return score_mod


@functools.lru_cache(maxsize=16)
def _block_mask(size: int, length: int, lead: int, causal: bool, device: str):
    """``BlockMask`` of ``size`` queries over ``size + lead`` keys, key ``kv_idx`` at
    position ``kv_idx - lead``, of which the first ``length`` queries (and keys) are real:
    a padded query sees nothing (its blocks are skipped), a padded key no real query."""
    from torch.nn.attention.flex_attention import create_block_mask

    real = torch.tensor(length, device=device)  # a kernel input: one kernel per size

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        visible = kv_idx <= q_idx + lead if causal else kv_idx < real + lead
        return visible & (q_idx < real)

    return create_block_mask(mask, None, None, size, size + lead, device=device)


def _flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


#: Each encoding's ``score_mod`` for a bucket, reused while the encoding is unchanged:
#: building FIRE's tables took 0.49 ms, about half of a causal SDPA call at
#: ``[1, 8, 256, 64]`` (0.93 ms).
SCORE_MODS = EncodingCache()


def _score_mod(position: PositionalEncoding, size: int):
    """``position.score_mod``, given the bucket's length when it takes one (FIRE's
    tables run up to it)."""
    if "length" in inspect.signature(position.score_mod).parameters:
        return position.score_mod(length=size)
    return position.score_mod()


#: FlexAttention, compiled once per kernel and length bucket.
_flex = static_compiled(_flex_attention)


def _shaw(
    q: Tensor, k: Tensor, v: Tensor, position: PositionalEncoding, scale: float, real: int
) -> Tensor:
    """Shaw's key and value terms under a causal mask, through one FlexAttention call with
    a phantom first key (see the module docstring); the first ``real`` queries are real.
    The band before and the value term after it are compiled too (once per bucket): about
    20 small operations each, which a loaded machine makes cost more than the kernel."""
    clip = int(position.max_relative_position)
    key_table = position.key_table.detach().to(q.dtype)  # [2K + 1, D]
    per_offset, band, top, k_aug, v_aug = _shaw_band(q, k, v, key_table, clip, scale)

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        rel = torch.clamp(kv_idx - 1 - q_idx, -clip, clip) + clip
        return torch.where(kv_idx == 0, top[b, h, q_idx], score + per_offset[b, h, q_idx, rel])

    mask = _block_mask(q.shape[-2], real, 1, True, q.device.type)
    out = _flex(q, k_aug, v_aug, score_mod=score_mod, block_mask=mask, scale=scale)
    return _shaw_value(out, band, top, position.value_table.detach().to(q.dtype))


def _shaw_band_eager(
    q: Tensor, k: Tensor, v: Tensor, key_table: Tensor, clip: int, scale: float
) -> tuple[Tensor, ...]:
    """Shaw's per-offset key logits ``[B, H, T, 2K + 1]``, the band's logits ``[B, H, T, K]``
    (key ``i - d`` at ``d``), their row maxima ``[B, H, T]``, and the keys and values with
    the phantom first key."""
    batch, heads, length, dim = q.shape
    per_offset = torch.matmul(q, key_table.T) * dim**-0.5
    near = clip - torch.arange(clip, device=q.device)  # w rows K - d of the keys i - d
    band = band_dots(q, k, clip) * scale + per_offset[..., near]
    ahead = torch.arange(clip, device=q.device) > torch.arange(length, device=q.device)[:, None]
    band = band.masked_fill(ahead, float("-inf"))  # keys before position 0
    k_aug = torch.cat((k.new_zeros(batch, heads, 1, dim), k), -2)  # [B, H, T + 1, D]
    phantom = torch.zeros(dim + 1, dtype=v.dtype, device=v.device)
    phantom[dim] = 1.0
    v_aug = torch.cat(
        (phantom.expand(batch, heads, 1, dim + 1), nn.functional.pad(v, (0, 1))), -2
    )  # [B, H, T + 1, D + 1]
    return per_offset, band, band.amax(-1), k_aug, v_aug  # the diagonal is always in the band


def _shaw_value_eager(out: Tensor, band: Tensor, top: Tensor, value_table: Tensor) -> Tensor:
    """The output from the phantom-key call ``out [B, H, T, D + 1]``: renormalized, plus
    the value term of the band's probabilities (see the module docstring)."""
    dim = out.shape[-1] - 1
    p0 = out[..., dim:]  # [B, H, T, 1]
    rest = 1.0 - p0
    probs = torch.exp(band - top[..., None]) * (p0 / rest)  # [B, H, T, K]
    return out[..., :dim] / rest + shaw_band_value(probs, value_table)


_shaw_band = static_compiled(lambda: _shaw_band_eager, fullgraph=True)
_shaw_value = static_compiled(lambda: _shaw_value_eager, fullgraph=True)
