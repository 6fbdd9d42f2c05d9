"""Ring attention that takes any posenc encoding: one sequence split across the ranks of a
process group, each rank keeping its queries while the key/value blocks travel around the
ring with their global positions (Liu, Zaharia and Abbeel 2023, "Ring Attention with
Blockwise Transformers for Near-Infinite Context"; the online softmax of Milakov &
Gimelshein 2018; the recomputing backward of Dao et al. 2022, "FlashAttention").

Shapes: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``T`` the tokens of this
rank's shard (any layout: contiguous, head-tail, per-document packed), ``D`` head_dim,
``R`` ranks in the group.

For each of the ``R`` key blocks (its own first), a rank computes the logits of its queries
against the block with the encoding's own bias for their *global* positions (SCORE site:
ALiBi, T5, KERPLE, Sandwich, FIRE, Shaw, DAPE, ...), its value term (VALUE site: Shaw), the
causal and segment mask, and merges the block into its running log-sum-exp; a block that no
query of the rank may see (a later chunk under a causal mask, other documents) is not
computed, only passed on. Rotary encodings (QK site) rotate the local queries and keys at
their global positions before the ring. The backward runs the ring again: the probabilities
are recomputed from the saved global log-sum-exp, ``dQ`` stays with the rank and the key
blocks' ``dK``, ``dV`` travel with them back to their owner. Each pair is computed
``block_size`` queries at a time; on the CPU by PyTorch's fused attention kernels where they
apply (``posenc.parallel._ring_fused``), elsewhere, and on other devices, by the eager
formula (``posenc.parallel._ring_blocks``; a GPU run is not part of the tests here).

Encodings whose bias of a pair depends on keys outside the pair are refused by name
(``ValueError``): CoPE (its contextual position sums gates over every key between the query
and the key) and the WEIGHTS-site encodings (FoX, stick-breaking, PaTH, dual-chunk), whose
weights carry state along the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from posenc._checks import check_int, check_positions, check_tensor
from posenc._dtypes import without_autocast
from posenc.attention.backends import DEFAULT_BLOCK_SIZE
from posenc.base import PositionalEncoding, Site
from posenc.encodings.nope import NoPE
from posenc.parallel._ring_blocks import (
    Pair,
    Shard,
    add,
    block_backward,
    block_forward,
    merge,
)
from posenc.parallel._ring_comm import DTYPES, Ring, check_shards
from posenc.parallel._ring_encodings import (
    check_splittable,
    kernel_parameters,
    observe_length,
    position_only_bias,
)

__all__ = ["check_splittable", "ring_attention"]


@dataclass(frozen=True)
class _Setup:
    """What the ring's forward and backward share besides the tensors."""

    ring: Ring
    position: PositionalEncoding
    queries: Shard
    causal: bool
    scale: float
    block_size: int
    fused: tuple[bool, bool]


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    positions: Tensor,
    position: PositionalEncoding | None = None,
    rotary_positions: Tensor | None = None,
    segment_ids: Tensor | None = None,
    causal: bool = True,
    group: dist.ProcessGroup | None = None,
    sinks: Tensor | None = None,
    scale: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    timeout: timedelta | float | None = None,
) -> Tensor:
    """Attention of this rank's queries over every rank's keys, with ``position`` applied
    at the tokens' global positions; equal to the unsplit attention's rows for these queries.

    Every rank of ``group`` calls this together (a collective), each with its own shard.

    Args:
        q: ``[B, H, T, D]`` the shard's queries (projected, not yet rotated).
        k: ``[B, Hkv, T, D]`` its keys (not yet rotated); ``Hkv`` divides ``H``.
        v: ``[B, Hkv, T, D]`` its values.
        positions: ``[T]`` or ``[B, T]``, the global positions of the shard's tokens (integer
            or floating). They define the mask (a key is visible iff ``k_pos <= q_pos``
            under ``causal``) and every bias; within a batch row (and segment) no position
            may be held twice.
        position: the encoding (its QK, SCORE and VALUE hooks); None: NoPE. Its INPUT site
            is the model's, as in ``MultiHeadAttention``.
        rotary_positions: structured positions of the shard for the rotation (M-RoPE's
            ``[3, B, T]``, axial RoPE's ``[T, 2]``); None: ``positions``.
        segment_ids: ``[B, T]`` integer document ids of packed sequences; tokens of
            different documents do not attend to each other.
        causal: hide keys at later positions.
        group: the context-parallel process group (None: the default group). Rank ``r``
            sends to rank ``r + 1`` of the group.
        sinks: ``[H]`` learned sink logits in every row's denominator (GPT-OSS), or None.
        scale: logits scale; None: ``1 / sqrt(D)``.
        block_size: queries per block within a pair (memory ``O(B * H * block_size * T)``);
            a block that sees no key of the pair is not computed.
        timeout: seconds (or a ``timedelta``) any rank waits for another; None: the
            process group's timeout.

    Returns:
        ``[B, H, T, D]`` in ``q``'s dtype: the outputs of the shard's queries. A query that
        sees no key (and has no sink) outputs zeros.

    Gradients: those of the shard's ``q``, ``k`` and ``v`` are exact. Those of ``sinks`` and
    of the encoding's parameters (T5's table, KERPLE, FIRE's MLP, Shaw's tables, a learned
    rotation's) are this rank's share, the part from its own tokens: the unsplit gradient
    is their sum over the group, which the data-parallel
    all-reduce of the gradients computes when its group includes the context-parallel ranks
    (as torchtitan's and Megatron's do); otherwise all-reduce them over ``group``. The
    backward is not itself differentiable. Computation runs in float32 for bf16/fp16
    inputs.

    Raises:
        ValueError: on every rank, when any rank's shard does not fit (shapes, lengths,
            dtypes, duplicated positions; the message names the rank); an encoding that
            needs state carried across blocks (CoPE, FoX, stick-breaking, PaTH,
            dual-chunk; named, with the reason); a causal-only encoding without
            ``causal``; ``sinks`` not ``[H]``.
        TypeError: tensors that are not floating tensors of 4 dims; ``segment_ids`` that
            are not integers; a ``position`` that is not a ``PositionalEncoding``.
        RuntimeError: no initialized process group; a rank that does not answer within
            the timeout.
    """
    position = check_splittable(NoPE() if position is None else position, causal=causal)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, ndim=4)
        if x.dtype not in DTYPES:
            raise TypeError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    positions = check_positions(positions)
    if segment_ids is not None and (
        not isinstance(segment_ids, Tensor) or segment_ids.is_floating_point()
        or segment_ids.dtype == torch.bool
    ):  # fmt: skip
        raise TypeError(f"segment_ids must be an integer tensor, got {segment_ids!r:.80}")
    if sinks is not None and (not isinstance(sinks, Tensor) or sinks.shape != (q.shape[1],)):
        got = tuple(sinks.shape) if isinstance(sinks, Tensor) else type(sinks).__name__
        raise ValueError(f"sinks must be a tensor of shape [H={q.shape[1]}], got {got}")
    block_size = check_int("block_size", block_size)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        timeout = timedelta(seconds=timeout)
    ring = Ring(group, timeout)
    info = check_shards(ring, q, k, v, positions, segment_ids, causal=causal, sinks=sinks)
    positions = positions.to(q.device)
    if info.batched:
        positions = positions.expand(q.shape[0], -1)
    if segment_ids is not None:
        segment_ids = segment_ids.to(q.device)
    if position.sites & Site.QK:
        observe_length(position, int(info.max_position) + 1)
        at = positions if rotary_positions is None else rotary_positions
        q, k = position.rotate(q, k, at, at)
    params = [p for p in kernel_parameters(position) if p.requires_grad]
    fused = q.device.type == "cpu" and not position.sites & Site.VALUE  # see _ring_fused
    setup = _Setup(
        ring, position, Shard(positions, segment_ids), causal,
        q.shape[-1] ** -0.5 if scale is None else float(scale), block_size,
        (fused, fused and not params and position_only_bias(position)),
    )  # fmt: skip
    with without_autocast(q.device.type):  # the blocks run in the accumulation dtype
        return _RingAttention.apply(q, k, v, sinks, setup, *params)


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class _RingAttention(torch.autograd.Function):
    """The ring's forward (online softmax) and its recomputing backward."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, setup: _Setup, *params):
        acc = _accumulation(q.dtype)
        ring, queries = setup.ring, setup.queries
        q_acc = q.to(acc)
        block = [k, v, queries.positions, *_segments(queries)]
        state = None
        for step in range(ring.size):
            pending = ring.start(block) if step < ring.size - 1 else None
            # query blocks that see none of the block's keys are not computed
            state = merge(state, block_forward(_pair(setup, q_acc, block), setup.block_size))
            if pending is not None:
                block = ring.finish(pending)
        out, lse = _finish(state, q_acc, sinks)
        ctx.setup = setup
        ctx.save_for_backward(q, k, v, sinks, out, lse, *params)
        return out.to(q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, sinks, out, lse, *params = ctx.saved_tensors
        with without_autocast(q.device.type):
            dq, dk, dv, d_params = _backward(ctx.setup, grad_out, q, k, v, out, lse, params)
            d_sinks = None
            if sinks is not None and ctx.needs_input_grad[3]:
                delta = (grad_out.to(out.dtype) * out).sum(-1)  # [B, H, T]
                p_sink = torch.exp(sinks.to(out.dtype).view(1, -1, 1) - lse)
                d_sinks = -(p_sink * delta).sum((0, 2)).to(sinks.dtype)
        d_params = [
            None if g is None else g.to(p.dtype) for g, p in zip(d_params, params, strict=True)
        ]
        return dq, dk, dv, d_sinks, None, *d_params


def _backward(
    setup: _Setup,
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    params: list[Tensor],
) -> tuple[Tensor, Tensor, Tensor, list[Tensor | None]]:
    """``(dq, dk, dv, d params)``: the ring run again, ``dK``, ``dV`` travelling with their
    block (after ``R`` shifts they are back with their owner); ``out`` and ``lse`` in the
    accumulation dtype."""
    ring, acc = setup.ring, out.dtype
    q_acc, d_out = q.to(acc), grad_out.to(acc)
    dq = torch.zeros_like(q_acc)
    d_params: list[Tensor | None] = [None] * len(params)
    block = [k, v, setup.queries.positions, *_segments(setup.queries)]
    grads = [torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)]
    for step in range(ring.size):
        pending = ring.start(block) if step < ring.size - 1 else None
        pair = _pair(setup, q_acc, block)
        dq_b, dk_b, dv_b, dp_b = block_backward(pair, d_out, out, lse, params, setup.block_size)
        dq += dq_b
        grads = [grads[0] + dk_b, grads[1] + dv_b]
        d_params = [add(a, b) for a, b in zip(d_params, dp_b, strict=True)]
        if pending is not None:
            block = ring.finish(pending)
        if ring.size > 1:
            grads = ring.finish(ring.start(grads))
    return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype), d_params


def _pair(setup: _Setup, q: Tensor, block: list[Tensor]) -> Pair:
    """The pair of the queries ``q`` (accumulation dtype) and ``block`` (``[k, v, positions,
    segment ids?]`` as it travels)."""
    keys = Shard(block[2], block[3] if len(block) > 3 else None)
    k, v = (x.to(q.dtype) for x in block[:2])
    return Pair(
        q, k, v, setup.queries, keys, setup.causal, setup.position, setup.scale, setup.fused
    )


def _segments(shard: Shard) -> list[Tensor]:
    return [] if shard.segment_ids is None else [shard.segment_ids]


def _finish(
    state: tuple[Tensor, Tensor, Tensor], q: Tensor, sinks: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``(out [B, H, T, D], lse [B, H, T])`` from the merged state, the sink in each row's
    denominator; ``lse`` is 0 (finite) for a row that sees nothing."""
    peak, total, acc = state
    if sinks is not None:
        sink = sinks.to(q.dtype).view(1, -1, 1).expand_as(peak)
        peak, total, acc = merge(state, (sink, torch.ones_like(total), torch.zeros_like(acc)))
    seen = total > 0
    out = acc / torch.where(seen, total, torch.ones_like(total))[..., None]
    lse = torch.where(seen, peak + torch.log(torch.where(seen, total, 1.0)), 0.0)
    return out, lse
