"""Attention kernels behind ``MultiHeadAttention``: SDPA, eager and query-block chunked.

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim.

Scaled dot-product attention (Vaswani et al. 2017, "Attention Is All You Need", eq. 1)
with a positional bias ``b`` on the logits and an optional value term ``c``::

    out_i = sum_j softmax_j(q_i . k_j / sqrt(D) + b_ij + mask_ij) v_j + c_i(probs)

Backends:

* ``sdpa``: one call of ``torch.nn.functional.scaled_dot_product_attention``, the bias
  (if any) added to the boolean mask as a float mask, i.e. materialized ``[B|1, H, Tq, Tk]``.
* ``eager``: the formula above written out; the only backend that serves the VALUE site
  without chunking.
* ``chunked``: the queries in blocks of ``block_size`` (Rabe & Staats 2021, "Self-attention
  Does Not Need O(n^2) Memory"): per block, the encoding's bias for that block only, then
  SDPA (or the eager formula when the encoding has a VALUE term). Under a causal mask
  with non-decreasing key positions, keys no query of the block may see are skipped (the
  hooks then see a prefix of the keys) and only the keys that some query of the block
  may not see get a ``-inf`` mask; a decoding step needs no mask at all. With
  gradients enabled each block is recomputed in the backward pass
  (``torch.utils.checkpoint``; Chen et al. 2016), so forward and backward hold
  ``O(B * H * block_size * Tk)`` extra memory and never a ``[H, Tq, Tk]`` tensor.

Masking: a key is visible to a query iff ``k_pos <= q_pos`` (causal), the key is not
padding, and both lie in the same segment (packed sequences). A query with no visible key
outputs zeros (not NaN), in every backend, forward and backward.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint

from posenc.base import PositionalEncoding, Site

__all__ = [
    "BACKENDS",
    "DEFAULT_BLOCK_SIZE",
    "Masking",
    "attend",
    "check_backend",
    "peak_tensor_bytes",
]

BACKENDS = ("auto", "sdpa", "eager", "chunked")
DEFAULT_BLOCK_SIZE = 128


@dataclass(frozen=True)
class Masking:
    """Which keys each query may attend to, as positions and ids (never a ``[Tq, Tk]`` mask).

    Attributes:
        causal: a key is visible iff ``k_pos <= q_pos``.
        q_pos: query positions ``[Tq]`` or ``[B, Tq]``.
        k_pos: key positions ``[Tk]`` or ``[B, Tk]``.
        key_padding_mask: ``[B, Tk]`` bool, True = attend; None: no padding.
        q_seg: ``[B, Tq]`` segment ids of the queries (packed sequences), or None.
        k_seg: ``[B, Tk]`` segment ids of the keys, or None.
        aligned: True when the queries are the keys at positions ``0..T-1`` (no cache, no
            padding, no segments), so a causal mask is SDPA's ``is_causal``.
    """

    causal: bool
    q_pos: Tensor
    k_pos: Tensor
    key_padding_mask: Tensor | None = None
    q_seg: Tensor | None = None
    k_seg: Tensor | None = None
    aligned: bool = False

    def block(self, start: int, stop: int, keys: slice) -> Tensor | None:
        """Bool mask ``[B|1, 1, stop - start, len(keys)]`` for queries ``start:stop`` and
        the keys ``keys`` (True = attend), or None when every key is visible."""
        mask = None
        if self.causal:
            q = self.q_pos[..., start:stop, None]
            mask = self.k_pos[..., None, keys] <= q  # [Tq, Tk] or [B, Tq, Tk]
        if self.q_seg is not None and self.k_seg is not None:
            same = self.k_seg[:, None, keys] == self.q_seg[:, start:stop, None]
            mask = same if mask is None else mask & same
        if self.key_padding_mask is not None:
            keep = self.key_padding_mask[:, None, keys]  # [B, 1, Tk]
            mask = keep if mask is None else mask & keep
        if mask is None:
            return None
        return mask.unsqueeze(-3) if mask.dim() == 3 else mask[None, None]

    def key_ranges(
        self, starts: list[int], block_size: int, num_keys: int
    ) -> list[tuple[int, int]]:
        """Per query block ``start:start + block_size``, the keys that need a mask:
        ``(first, limit)`` where keys ``>= limit`` are invisible to every query of the
        block and keys ``< first`` are visible to all of them.

        Only a causal mask over non-decreasing key positions narrows the range; padding
        and segments need the mask on every key (``first = 0``).
        """
        k_pos = self.k_pos
        if not self.causal or bool((k_pos[..., 1:] < k_pos[..., :-1]).any()):
            return [(0, num_keys)] * len(starts)
        blocks = [self.q_pos[..., s : s + block_size] for s in starts]
        latest = torch.stack([b.amax(-1) for b in blocks], -1)  # [blocks] or [B, blocks]
        earliest = torch.stack([b.amin(-1) for b in blocks], -1)
        bounds = torch.cat((latest, earliest), -1)  # [2 * blocks] or [B, 2 * blocks]
        if k_pos.dim() == 2:  # one sorted row per sequence: one row of bounds each
            bounds = bounds.expand(k_pos.shape[0], -1)
        common = torch.promote_types(k_pos.dtype, bounds.dtype)
        counts = torch.searchsorted(
            k_pos.to(common).contiguous(), bounds.to(common).contiguous(), right=True
        ).reshape(-1, 2, len(starts))
        limits, firsts = counts[:, 0].amax(0).tolist(), counts[:, 1].amin(0).tolist()
        if self.key_padding_mask is not None or self.q_seg is not None:
            firsts = [0] * len(starts)
        return list(zip(firsts, limits, strict=True))


def check_backend(backend: str, position: PositionalEncoding) -> None:
    """Raise ``ValueError`` for an unknown backend or one that cannot serve ``position``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}")
    if backend == "sdpa" and position.sites & Site.VALUE:
        raise ValueError(
            f"backend='sdpa' cannot apply the value term of {type(position).__name__} "
            "(VALUE site); use backend='auto', 'eager' or 'chunked'"
        )


def _check_term(what: str, term: Tensor, want: tuple[int, ...], position: PositionalEncoding):
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


def _block(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    masking: Masking,
    start: int,
    first: int,
    position: PositionalEncoding,
    use_sdpa: bool,
    dropout_p: float,
    scale: float,
    guard_empty: bool,
) -> Tensor:
    """Attention of the query block ``q [B, H, Tb, D]`` starting at ``start`` over ``k, v``
    (the first ``Tk`` keys); the keys before ``first`` are visible to every query."""
    stop, num_keys = start + q.shape[-2], k.shape[-2]
    q_pos, k_pos = masking.q_pos[..., start:stop], masking.k_pos[..., :num_keys]
    sites = position.sites
    bias = position.score_bias(q, k, q_pos, k_pos) if sites & Site.SCORE else None
    if bias is not None:
        _check_term("score_bias", bias, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]), position)
        bias = bias.to(q.dtype)
    is_causal = use_sdpa and masking.causal and masking.aligned and bias is None
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
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=logits_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
    else:
        logits = torch.matmul(q, k.transpose(-2, -1)) * scale  # [B, H, Tb, Tk], our own
        if bias is not None:
            logits = logits + bias
        if mask is not None:
            logits[..., first:].masked_fill_(~mask, float("-inf"))
        acc = torch.promote_types(q.dtype, torch.float32)  # bf16/fp16 softmax in float32
        probs = torch.softmax(logits, dim=-1, dtype=acc).to(q.dtype)
        probs = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
        out = torch.matmul(probs, v)  # [B, H, Tb, D]
        term = position.value_term(probs, q_pos, k_pos) if sites & Site.VALUE else None
        if term is not None:
            _check_term("value_term", term, tuple(out.shape), position)
            out = out + term.to(out.dtype)
    return out if keep_row is None else out.masked_fill(~keep_row, 0.0)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    position: PositionalEncoding,
    masking: Masking,
    backend: str = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """Attention of ``q [B, H, Tq, D]`` over ``k, v [B, H, Tk, D]`` with ``position``'s
    SCORE and VALUE hooks (QK is applied by the caller, before caching).

    Args:
        q: queries (already through the QK hook).
        k: keys at ``H`` heads (grouped keys expanded by the caller).
        v: values at ``H`` heads.
        position: the encoding whose ``score_bias`` / ``value_term`` are applied.
        masking: positions, padding and segments that define the mask.
        backend: ``"auto"`` (SDPA without SCORE/VALUE, else chunked), ``"sdpa"``,
            ``"eager"`` or ``"chunked"``.
        block_size: queries per block of the chunked backend.
        dropout_p: attention dropout (applied to the probabilities).
        scale: logits scale; ``1 / sqrt(D)`` when None.

    Returns:
        ``[B, H, Tq, D]`` in ``q``'s dtype.

    Raises:
        ValueError: a VALUE encoding with ``backend="sdpa"``, an unknown backend, or a
            hook output of the wrong shape.
    """
    check_backend(backend, position)
    sites = position.sites
    if backend == "auto":
        backend = "chunked" if sites & (Site.SCORE | Site.VALUE) else "sdpa"
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    num_q, num_k = q.shape[-2], k.shape[-2]
    kernel = functools.partial(
        _block,
        masking=masking,
        position=position,
        use_sdpa=backend == "sdpa" or (backend == "chunked" and not sites & Site.VALUE),
        dropout_p=dropout_p,
        scale=scale,
        guard_empty=masking.key_padding_mask is not None,
    )
    if backend != "chunked" or num_q <= block_size:
        return kernel(q, k, v, start=0, first=0)
    starts = list(range(0, num_q, block_size))
    ranges = masking.key_ranges(starts, block_size, num_k)
    recompute = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad
        or any(p.requires_grad for p in position.parameters())
    )  # fmt: skip
    outs = []
    for start, (first, limit) in zip(starts, ranges, strict=True):
        blk = (q[..., start : start + block_size, :], k[..., :limit, :], v[..., :limit, :])
        fn = functools.partial(kernel, start=start, first=first)
        outs.append(checkpoint(fn, *blk, use_reentrant=False) if recompute else fn(*blk))
    return torch.cat(outs, dim=-2)


class _TensorMemory(TorchDispatchMode):
    """Dispatch mode that tracks the bytes of live tensor storages created by aten ops."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.largest = 0
        self._seen: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in self._seen:
                continue
            self._seen.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            self.largest = max(self.largest, nbytes)
            weakref.finalize(storage, self._release, key, nbytes)
        return out


def peak_tensor_bytes(fn: Callable[[], object]) -> tuple[int, int]:
    """Run ``fn()``; return (peak live bytes, largest single tensor) of what it allocates.

    Counts every tensor storage created by an aten op while ``fn`` runs (forward and, if
    ``fn`` calls it, backward), freed when its last reference goes; tensors created
    before the call are not counted. Scratch space inside a fused kernel is not seen.
    This is how the chunked backend's memory bound is checked on CPU.
    """
    with _TensorMemory() as tracker:
        fn()
    return tracker.peak, tracker.largest
