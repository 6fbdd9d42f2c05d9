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
* ``flex``: FlexAttention compiled for CPU, the bias as a fused ``score_mod``
  (``posenc.attention.flex``): float32 inference over a whole sequence (no KV cache,
  padding, segments or sinks) with ALiBi, T5, KERPLE, Sandwich, FIRE, CoPE or Shaw
  (the last two causal). ``auto`` picks it there for FIRE, CoPE and Shaw from
  ``FLEX_MIN_LENGTH`` queries on (the offset biases stay on ``chunked``'s table path,
  faster at every length); forced elsewhere it raises ``ValueError`` saying why.
* ``chunked``: the queries in blocks of ``block_size`` (Rabe & Staats 2021, "Self-attention
  Does Not Need O(n^2) Memory"): per block, the encoding's bias for that block only, then
  SDPA (or the eager formula when the encoding has a VALUE term). Under a causal mask
  with non-decreasing key positions, keys no query of the block may see are skipped (the
  hooks then see a prefix of the keys) and only the keys that some query of the block
  may not see get a ``-inf`` mask; a decoding step needs no mask at all. An encoding
  whose bias is a function of ``q_pos - k_pos`` (``offset_only``: ALiBi, T5, KERPLE,
  Sandwich) over consecutive positions is evaluated once per offset and read by every
  block as a zero-copy view (``posenc.attention.blocks.offset_block``); without
  gradients through it, that table is kept for the next call at the same length until
  the encoding changes. With gradients
  enabled each block is recomputed in the backward pass (``posenc.attention.grad``;
  Chen et al. 2016), so forward and backward hold ``O(B * H * block_size * Tk)`` extra
  memory and never a ``[H, Tq, Tk]`` tensor; the backward is itself differentiable.

WEIGHTS-site encodings (data-dependent attention: FoX, stick-breaking) replace the
softmax of the logits by their own ``weights`` hook, given per-token gates; every backend
runs them by query blocks (``posenc.attention.blocks.weights_block``), ``chunked`` in
blocks of ``block_size``, the others in one. Their backward keeps every block's weights
(no recomputation): ``O(B * H * Tq * Tk)`` memory with gradients.

Attention sinks (GPT-OSS; ``posenc.attention.sinks``): a learned logit per head in every
row's softmax denominator, on every backend: appended to the logits (eager), or as a zero
key whose float mask is the sink (SDPA, in each block of ``chunked``); the offset-table
path is then not taken.

Masking: a key is visible to a query iff ``k_pos <= q_pos`` (causal), the key is not
padding, and both lie in the same segment (packed sequences). A query with no visible key
outputs zeros (not NaN), in every backend, forward and backward.

Non-finite inputs: masked keys and values never reach a query, in every backend. When the
output has a non-finite value (one check of ``[B, H, Tq, D]``), the attention is run again
with the non-finite keys and values set to zero, and the queries that may see one of them
are set to NaN; the others keep their finite result. Under ``torch.compile`` the check is
skipped (it would break the graph), so there a masked NaN may still spread as in SDPA.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from posenc.attention.blocks import general_block, offset_block, offset_table, weights_block
from posenc.attention.flex import (
    FLEX_MAX_BAND,
    FLEX_MIN_LENGTH,
    flex_attend,
    flex_kind,
    flex_refusal,
)
from posenc.attention.grad import forbid_double_backward, recompute
from posenc.attention.masking import Masking
from posenc.attention.memory import peak_tensor_bytes
from posenc.base import Compose, PositionalEncoding, Site

__all__ = [
    "BACKENDS",
    "DEFAULT_BLOCK_SIZE",
    "Masking",
    "attend",
    "check_backend",
    "peak_tensor_bytes",
]

BACKENDS = ("auto", "sdpa", "eager", "chunked", "flex")
DEFAULT_BLOCK_SIZE = 128
OFFSET_BLOCKS, OFFSET_MIN_BLOCK = 4, 256  # query blocks of the offset path (see below)


def check_backend(backend: str, position: PositionalEncoding) -> None:
    """Raise ``ValueError`` for an unknown backend or one that cannot serve ``position``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}")
    if backend == "sdpa" and position.sites & Site.VALUE:
        raise ValueError(
            f"backend='sdpa' cannot apply the value term of {type(position).__name__} "
            "(VALUE site); use backend='auto', 'eager' or 'chunked'"
        )
    if backend == "flex" and flex_kind(position) is None:
        raise ValueError(
            f"backend='flex' cannot compute the bias of {type(position).__name__}; "
            "use backend='auto' or 'chunked'"
        )


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
    gates: Tensor | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """Attention of ``q [B, H, Tq, D]`` over ``k, v [B, H, Tk, D]`` with ``position``'s
    SCORE and VALUE hooks (QK is applied by the caller, before caching).

    Args:
        q: queries (already through the QK hook).
        k: keys at ``H`` heads (grouped keys expanded by the caller).
        v: values at ``H`` heads.
        position: the encoding whose ``score_bias`` / ``value_term`` are applied.
        masking: positions, padding and segments that define the mask.
        backend: ``"auto"`` (SDPA without SCORE/VALUE; an ``offset_only`` bias
            chunked; else ``flex`` where it applies from ``FLEX_MIN_LENGTH`` queries on,
            otherwise chunked), ``"sdpa"``,
            ``"eager"``, ``"chunked"`` or ``"flex"``.
        block_size: queries per block of the chunked backend.
        dropout_p: attention dropout (applied to the probabilities).
        scale: logits scale; ``1 / sqrt(D)`` when None.
        gates: ``[B, H, Tk, G]`` per-key gates of a WEIGHTS-site encoding (the queries are
            the last ``Tq`` keys); required by, and only read for, such an encoding.
        sinks: ``[H]`` learned sink logits joining every row's softmax denominator
            (``posenc.attention.sinks``; GPT-OSS), or None. Not with a WEIGHTS encoding.

    Returns:
        ``[B, H, Tq, D]`` in ``q``'s dtype. A row is non-finite only if its query, or a
        key or value it may see, is (then NaN); masked keys never reach it.

    Raises:
        ValueError: a VALUE encoding with ``backend="sdpa"``, an unknown backend, a
            hook output of the wrong shape, a WEIGHTS encoding without ``gates`` or with
            ``sinks``, ``sinks`` not ``[H]``, or ``backend="flex"`` where it does not
            apply (the message says why).
        RuntimeError: a double backward (``create_graph=True``) through ``backend="sdpa"``
            or through attention dropout.
    """
    check_backend(backend, position)
    _check_sinks(sinks, position, q.shape[1])
    if backend == "auto":
        backend = "chunked" if position.sites & (Site.SCORE | Site.VALUE) else "sdpa"
        offset = getattr(position, "offset_only", False)  # the table path is faster
        if backend == "chunked" and q.shape[-2] >= FLEX_MIN_LENGTH and not offset:
            backend = "auto-flex"  # flex if it applies to this call, else chunked
    max_band = None
    if backend in ("flex", "auto-flex"):
        params = [q, k, v, *position.parameters()]
        refusal = flex_refusal(position, q, masking, dropout_p, params)
        refusal = refusal or ("attention sinks are not supported" if sinks is not None else None)
        if refusal is not None and backend == "flex":
            raise ValueError(f"backend='flex' does not apply here: {refusal}")
        max_band = FLEX_MAX_BAND if backend == "auto-flex" else None
        backend = "chunked" if refusal else "flex"
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    run = functools.partial(
        _attend, position=position, masking=masking, backend=backend,
        block_size=block_size, dropout_p=dropout_p, scale=scale, gates=gates, sinks=sinks,
        max_band=max_band,
    )  # fmt: skip
    out = run(q, k, v)
    if torch.compiler.is_compiling() or bool(out.sum().isfinite()):  # one pass over out
        return out
    bad = ~(torch.isfinite(k).all(-1) & torch.isfinite(v).all(-1))  # [B, H, Tk]
    if not bool(bad.any()):
        return out  # from the queries (or the bias) themselves: nothing was masked
    # zeroed in copies with the same strides: a matmul over another memory layout may
    # round differently, and the rows that see no bad key must stay bit-identical
    k, v = (t.clone().masked_fill_(bad[..., None], 0.0) for t in (k, v))
    return run(q, k, v).masked_fill(_sees(masking, bad, block_size)[..., None], float("nan"))


def _check_sinks(sinks: Tensor | None, position: PositionalEncoding, heads: int) -> None:
    """Raise ``ValueError`` for sinks that are not ``[H]`` or beside a WEIGHTS encoding."""
    if sinks is None:
        return
    if position.sites & Site.WEIGHTS:
        raise ValueError(
            f"{type(position).__name__} computes the attention weights itself (WEIGHTS "
            "site); attention sinks join a softmax it does not have"
        )
    if not isinstance(sinks, Tensor) or tuple(sinks.shape) != (heads,):
        got = tuple(sinks.shape) if isinstance(sinks, Tensor) else type(sinks).__name__
        raise ValueError(f"sinks must be a tensor of shape [H={heads}], got {got}")


def _sees(masking: Masking, bad: Tensor, block_size: int) -> Tensor:
    """``[B, H, Tq]``: whether each query may see a key marked in ``bad [B, H, Tk]``."""
    num_q, num_k = masking.q_pos.shape[-1], bad.shape[-1]
    rows = []
    for start in range(0, num_q, block_size):
        stop = min(start + block_size, num_q)
        mask = masking.block(start, stop, slice(0, num_k))  # [B|1, 1, Tb, Tk] or None
        if mask is None:
            rows.append(bad.any(-1, keepdim=True).expand(-1, -1, stop - start))
        else:
            rows.append((mask & bad[:, :, None, :]).any(-1))
    return torch.cat(rows, dim=-1) if rows else bad.new_zeros((*bad.shape[:-1], 0))


def _offset_block_size(num_queries: int, block_size: int) -> int:
    """Queries per block of the offset path, whose memory does not grow with the block.

    Each block costs one SDPA call (a thread-pool barrier, expensive on a busy machine,
    and CPU SDPA is least efficient below ~256 queries), and under a causal mask a block
    also computes the scores of its hidden upper triangle: ``Tq * Tb / 2`` of the
    ``Tq^2 / 2`` visible ones. About four blocks balance the two (25% extra scores).
    """
    return max(block_size, OFFSET_MIN_BLOCK, -(-num_queries // OFFSET_BLOCKS))


def _attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    position: PositionalEncoding,
    masking: Masking,
    backend: str,
    block_size: int,
    dropout_p: float,
    scale: float,
    gates: Tensor | None,
    sinks: Tensor | None,
    max_band: int | None = None,
) -> Tensor:
    """``attend`` with a resolved backend, before the non-finite check; ``max_band``: the
    widest CoPE band ``flex`` may use (None: any), else ``chunked`` runs."""
    sites = position.sites
    if backend == "flex":
        out = flex_attend(
            q, k, v, position=position, masking=masking, scale=scale, max_band=max_band
        )
        if out is not None:
            return out
        backend = "chunked"
    if sites & Site.WEIGHTS:
        size = None if backend != "chunked" or q.shape[-2] <= block_size else block_size
        return _attend_weights(q, k, v, gates, position, masking, size, dropout_p)
    use_sdpa = backend == "sdpa" or (backend == "chunked" and not sites & Site.VALUE)
    kernel = functools.partial(
        general_block,
        masking=masking,
        position=position,
        use_sdpa=use_sdpa,
        dropout_p=dropout_p,
        scale=scale,
        guard_empty=masking.key_padding_mask is not None,
        sinks=sinks,
    )
    num_q, num_k = q.shape[-2], k.shape[-2]
    if backend != "chunked" or num_q == 0:
        out = kernel(q, k, v, start=0, first=0)
        return forbid_double_backward(out) if backend == "sdpa" else out
    params = [p for p in _kernel_parameters(position) if p.requires_grad]
    if sinks is not None and sinks.requires_grad:
        params.append(sinks)  # read by the kernel; here for the recomputing backward
    grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or bool(params)
    )
    table = offset_table(position, q, k, masking) if use_sdpa and sinks is None else None
    if table is not None:  # keys in reverse order: each block's bias is a view
        k, v = k.flip(-2), v.flip(-2)
        block_size = _offset_block_size(num_q, block_size)
    if num_q <= block_size:  # one block: a guard under torch.compile, not one graph per T
        starts, ranges = [0], [(0, num_k)]
    else:
        starts = list(range(0, num_q, block_size))
        ranges = masking.key_ranges(starts, block_size, num_k)
    outs = []
    for start, (first, limit) in zip(starts, ranges, strict=True):
        q_blk = q[..., start : start + block_size, :]
        if table is None:
            fn = functools.partial(kernel, start=start, first=first)
            blk = (q_blk, k[..., :limit, :], v[..., :limit, :], *params)
        else:
            fn = functools.partial(
                offset_block, start=start, num_keys=num_k, dropout_p=dropout_p, scale=scale
            )
            blk = (q_blk, k[..., num_k - limit :, :], v[..., num_k - limit :, :], table.values)
        outs.append(recompute(fn, *blk, dropout=dropout_p > 0) if grad else fn(*blk))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _kernel_parameters(position: PositionalEncoding) -> list[Tensor]:
    """The parameters the kernel reads: those of the SCORE and VALUE hooks. A QK part's
    (FoPE's coefficients) act on ``q`` and ``k`` before attention; handing them to the
    recomputing backward would differentiate that graph a second time."""
    parts = position.encodings if isinstance(position, Compose) else [position]
    kernel_sites = Site.SCORE | Site.VALUE
    return [p for part in parts if part.sites & kernel_sites for p in part.parameters()]


def _attend_weights(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gates: Tensor | None,
    position: PositionalEncoding,
    masking: Masking,
    block_size: int | None,
    dropout_p: float,
) -> Tensor:
    """A WEIGHTS-site encoding's attention, by query blocks of ``block_size`` (None: one)."""
    num_q, num_k = q.shape[-2], k.shape[-2]
    if gates is None or gates.shape[-2] != num_k:
        got = None if gates is None else tuple(gates.shape)
        raise ValueError(
            f"{type(position).__name__} computes its attention weights from per-key gates "
            f"[B, H, Tk={num_k}, G]; got {got}"
        )
    q_gates = gates[..., num_k - num_q :, :]  # the queries are the last Tq keys
    kernel = functools.partial(
        weights_block, masking=masking, position=position, dropout_p=dropout_p
    )
    if block_size is None:  # one block: a guard under torch.compile, not one graph per T
        starts, ranges, block_size = [0], [(0, num_k)], num_q
    else:
        starts = list(range(0, num_q, block_size))
        ranges = masking.key_ranges(starts, block_size, num_k)
    outs = []
    for start, (_, limit) in zip(starts, ranges, strict=True):
        stop = start + block_size
        blk = (q[..., start:stop, :], k[..., :limit, :], v[..., :limit, :])
        blk += (q_gates[..., start:stop, :], gates[..., :limit, :])
        outs.append(kernel(*blk, start=start))
    return torch.cat(outs, dim=-2)
