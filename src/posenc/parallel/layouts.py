"""Shard layouts of context parallelism: which tokens, at which positions, each rank holds.

Shapes: ``B`` batch, ``T`` global length, ``S`` a rank's shard length (``T / N``), ``N`` ranks
(``cp_size``), ``r`` this rank (``cp_rank``), ``K`` documents of a packed (THD) batch.

Context parallelism (Liu et al. 2023, "Ring Attention with Blockwise Transformers", sec. 3)
splits one sequence along its token axis across ``N`` ranks. A causal mask makes the first
tokens cheap and the last ones expensive, so the engines balance the load by splitting the
sequence into ``2N`` chunks and giving rank ``r`` chunks ``r`` and ``2N-1-r`` (head-tail;
PyTorch's ``context_parallel`` head-tail load balancer, Megatron-Core's
``get_pos_emb_on_this_cp_rank``). A packed batch of documents (THD, ``cu_seqlens``) is
balanced per document: each document is split into ``2N`` chunks, head-tail, and its
positions restart at 0 (Megatron-Core's ``_get_thd_freqs_on_this_cp_rank``).

Every function here is a pure function of lengths and positions, with no communication:
each rank builds its own ``ShardLayout`` and gathers nothing. A length that does not divide
raises ``ValueError`` naming the multiple needed (``N`` contiguous, ``2N`` head-tail, ``2N``
per document for THD); pad the sequence (or each document) to that multiple before sharding,
as the engines require too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc._checks import check_int

__all__ = [
    "ShardLayout",
    "contiguous_layout",
    "head_tail_layout",
    "shard_batch",
    "shard_mrope_positions",
    "thd_layout",
    "unshard",
]


@dataclass(frozen=True, eq=False)  # tensors: compare the fields themselves
class ShardLayout:
    """The tokens rank ``cp_rank`` of ``cp_size`` holds of a sequence of ``seq_len`` tokens.

    Attributes:
        seq_len: ``T``, the global length.
        cp_size: ``N``, the number of ranks.
        cp_rank: ``r``, this rank.
        indices: ``[S]`` int64, the global token indices the rank holds, in the order it holds
            them (a shard is ``x.index_select(dim, indices)``).
        positions: ``[S]`` int64, the positions of those tokens: ``indices`` for one sequence,
            the offsets within each document for a packed (THD) batch.
        cu_seqlens: ``[K+1]`` int64, the shard's own cumulative document lengths (THD only,
            each document's length divided by ``N``), else ``None``.
    """

    seq_len: int
    cp_size: int
    cp_rank: int
    indices: Tensor
    positions: Tensor
    cu_seqlens: Tensor | None = None

    @property
    def unsplit_length(self) -> int:
        """``max(position) + 1`` over every rank: the length an unsplit call observes.

        ``T`` for one sequence, the longest document for THD. A length-dependent RoPE scaling
        (dynamic NTK, LongRoPE) must follow this length on every rank, not the shard's.
        """
        if self.cu_seqlens is None:
            return self.seq_len
        lengths = self.cu_seqlens[1:] - self.cu_seqlens[:-1]
        return int(lengths.max()) * self.cp_size

    def shard(self, x: Tensor, dim: int = 1) -> Tensor:
        """Return this rank's tokens of ``x``, whose axis ``dim`` is the token axis (length T).

        Raises:
            ValueError: if ``x.shape[dim]`` is not ``seq_len``.
        """
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if not -x.dim() <= dim < x.dim():
            raise ValueError(f"dim {dim} is out of range for a tensor of shape {tuple(x.shape)}")
        if x.shape[dim] != self.seq_len:
            raise ValueError(
                f"x has {x.shape[dim]} tokens along dim {dim} (shape {tuple(x.shape)}); "
                f"this layout splits {self.seq_len}"
            )
        return x.index_select(dim, self.indices.to(x.device))


def _check_rank(cp_size: object, cp_rank: object) -> tuple[int, int]:
    size = check_int("cp_size", cp_size)
    rank = check_int("cp_rank", cp_rank, minimum=0)
    if rank >= size:
        raise ValueError(f"cp_rank must be < cp_size = {size}, got {rank}")
    return size, rank


def _check_divides(what: str, length: int, multiple: int, why: str) -> None:
    if length % multiple:
        padded = -(-length // multiple) * multiple
        raise ValueError(
            f"{what} {length} is not a multiple of {multiple} ({why}); pad it to {padded}"
        )


def _head_tail(length: int, size: int, rank: int) -> Tensor:
    """Offsets ``[length / N]`` of chunks ``rank`` and ``2N-1-rank`` of ``2N`` equal chunks."""
    chunk = length // (2 * size)
    head = torch.arange(rank * chunk, (rank + 1) * chunk)
    tail = torch.arange((2 * size - 1 - rank) * chunk, (2 * size - rank) * chunk)
    return torch.cat([head, tail])


def contiguous_layout(seq_len: int, cp_size: int, cp_rank: int) -> ShardLayout:
    """Rank ``r`` holds tokens ``[r*S, (r+1)*S)``, ``S = T / N`` (no load balancing).

    Raises:
        ValueError: if ``seq_len`` is not a multiple of ``cp_size``, or a bad rank.
    """
    size, rank = _check_rank(cp_size, cp_rank)
    length = check_int("seq_len", seq_len, minimum=0)
    _check_divides("seq_len", length, size, f"cp_size {size} equal shards")
    shard = length // size
    indices = torch.arange(rank * shard, (rank + 1) * shard)
    return ShardLayout(length, size, rank, indices, indices.clone())


def head_tail_layout(seq_len: int, cp_size: int, cp_rank: int) -> ShardLayout:
    """Rank ``r`` holds chunks ``r`` and ``2N-1-r`` of ``2N`` equal chunks (head-tail).

    The layout of PyTorch's ``context_parallel`` head-tail load balancer and of Megatron-Core's
    ``get_pos_emb_on_this_cp_rank``: every rank gets the same causal work.

    Raises:
        ValueError: if ``seq_len`` is not a multiple of ``2 * cp_size``, or a bad rank.
    """
    size, rank = _check_rank(cp_size, cp_rank)
    length = check_int("seq_len", seq_len, minimum=0)
    _check_divides("seq_len", length, 2 * size, f"2 * cp_size = {2 * size} head-tail chunks")
    indices = _head_tail(length, size, rank)
    return ShardLayout(length, size, rank, indices, indices.clone())


def _check_cu_seqlens(cu_seqlens: object, seq_len: int | None) -> Tensor:
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
        raise TypeError(f"cu_seqlens must be an integer tensor, got dtype {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with K+1 >= 2 entries, got {cu_seqlens.tolist()}")
    cu = cu_seqlens.detach().to("cpu", torch.int64)
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu.tolist()}")
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu.tolist()}")
    if seq_len is not None and int(cu[-1]) != seq_len:
        raise ValueError(f"cu_seqlens must end at seq_len = {seq_len}, got {cu.tolist()}")
    return cu


def thd_layout(
    cu_seqlens: Tensor, cp_size: int, cp_rank: int, *, seq_len: int | None = None
) -> ShardLayout:
    """Per-document head-tail layout of a packed (THD) batch of ``K`` documents.

    Document ``k`` (tokens ``cu_seqlens[k] .. cu_seqlens[k+1]``) is split into ``2N`` equal
    chunks and rank ``r`` holds its chunks ``r`` and ``2N-1-r``, documents in order; positions
    restart at 0 in every document (a later document never reuses document 0's positions,
    Megatron-LM#5243). The shard's own ``cu_seqlens`` is ``cu_seqlens / N``.

    Args:
        cu_seqlens: ``[K+1]`` integer tensor, 0 first, non-decreasing, the total length last.
        cp_size: ``N``.
        cp_rank: ``r``.
        seq_len: the packed length ``T``; if given, ``cu_seqlens[-1]`` must equal it.

    Raises:
        TypeError: if ``cu_seqlens`` is not an integer tensor.
        ValueError: if it is malformed, or a document's length is not a multiple of ``2N``.
    """
    size, rank = _check_rank(cp_size, cp_rank)
    if seq_len is not None:
        seq_len = check_int("seq_len", seq_len, minimum=0)
    cu = _check_cu_seqlens(cu_seqlens, seq_len)
    lengths = (cu[1:] - cu[:-1]).tolist()
    for k, length in enumerate(lengths):
        _check_divides(
            f"document {k}'s length", length, 2 * size, f"2 * cp_size = {2 * size} chunks each"
        )
    offsets = [_head_tail(length, size, rank) for length in lengths]
    positions = torch.cat(offsets)
    indices = torch.cat([o + int(start) for o, start in zip(offsets, cu[:-1], strict=True)])
    return ShardLayout(int(cu[-1]), size, rank, indices, positions, cu // size)


def shard_mrope_positions(position_ids: Tensor, layout: ShardLayout) -> Tensor:
    """This rank's M-RoPE position ids: ``[A, T] -> [A, S]`` or ``[A, B, T] -> [A, B, S]``.

    The ids' first axis is the rotary axes (``A = 3`` for Qwen2-VL's temporal, height and
    width), so the token axis is the last one, never axis 1 (NeMo Automodel#1482 split the
    batch axis of ``[3, B, T]``).

    Raises:
        ValueError: if ``position_ids`` is not 2-D or 3-D with ``T`` tokens last.
    """
    if not isinstance(position_ids, Tensor):
        raise TypeError(f"position_ids must be a torch.Tensor, got {type(position_ids).__name__}")
    if position_ids.dim() not in (2, 3):
        raise ValueError(
            f"position_ids must be [A, T] or [A, B, T], got shape {tuple(position_ids.shape)}"
        )
    return layout.shard(position_ids, dim=-1)


def shard_batch(
    batch: Mapping[str, Tensor], layout: ShardLayout, *, seq_dims: Mapping[str, int] | None = None
) -> dict[str, Tensor]:
    """This rank's share of every tensor of ``batch``, split along its token axis.

    Tensors are ``[B, T, ...]`` (token axis 1) unless ``seq_dims`` names another axis for that
    key: ``0`` for ``[T]`` positions, ``-1`` for M-RoPE ids ``[3, B, T]``. Every tensor must
    have ``T`` tokens on its axis. The positions to rotate or bias with are
    ``layout.positions`` (global, or per document for THD), whether or not the batch has them.

    Raises:
        ValueError: if a key of ``seq_dims`` is not in ``batch``, or a tensor's length is not T.
    """
    dims = dict(seq_dims or {})
    unknown = sorted(set(dims) - set(batch))
    if unknown:
        raise ValueError(f"seq_dims names keys not in the batch: {unknown}; keys: {sorted(batch)}")
    out = {}
    for key, value in batch.items():
        try:
            out[key] = layout.shard(value, dims.get(key, 1))
        except (TypeError, ValueError) as err:
            raise type(err)(f"batch[{key!r}]: {err}") from None
    return out


def unshard(shards: Sequence[Tensor], layouts: Sequence[ShardLayout], dim: int = 1) -> Tensor:
    """Put every rank's outputs back in sequence order: the inverse of ``ShardLayout.shard``.

    Args:
        shards: ``N`` tensors, rank ``r``'s shard (``S_r`` tokens along ``dim``) at index ``r``,
            as ``torch.distributed.all_gather`` returns them.
        layouts: the ``N`` ranks' layouts of one sequence, rank ``r``'s at index ``r``.
        dim: the token axis.

    Returns:
        The ``T`` tokens along ``dim`` in global order (differentiable).

    Raises:
        ValueError: if the counts, ranks or lengths disagree, or the layouts do not cover the
            sequence exactly once.
    """
    if len(shards) != len(layouts) or not layouts:
        raise ValueError(f"got {len(shards)} shards for {len(layouts)} layouts (need one each)")
    expected = [(r, len(layouts), layouts[0].seq_len) for r in range(len(layouts))]
    for r, layout in enumerate(layouts):
        if (layout.cp_rank, layout.cp_size, layout.seq_len) != expected[r]:
            raise ValueError(
                f"layouts[{r}] is rank {layout.cp_rank} of {layout.cp_size} splitting "
                f"{layout.seq_len} tokens; expected rank {r} of {len(layouts)} splitting "
                f"{layouts[0].seq_len}"
            )
        if shards[r].shape[dim] != layout.indices.numel():
            raise ValueError(
                f"shards[{r}] has {shards[r].shape[dim]} tokens along dim {dim}, "
                f"its layout holds {layout.indices.numel()}"
            )
    order = torch.cat([layout.indices for layout in layouts])
    seq_len = layouts[0].seq_len
    if order.numel() != seq_len or not torch.equal(order.sort().values, torch.arange(seq_len)):
        raise ValueError("the layouts do not hold every token of the sequence exactly once")
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(seq_len)
    return torch.cat(list(shards), dim).index_select(dim, inverse.to(shards[0].device))
