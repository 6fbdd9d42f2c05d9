"""The communication of ring attention, in one place: the ring of point-to-point shifts and
the check of every rank's shard before the first of them.

Shapes: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``T`` the tokens of one
rank's shard, ``D`` head_dim, ``R`` ranks in the group.

``Ring.shift`` sends tensors to the next rank and receives the same shapes from the previous
one (``torch.distributed.batch_isend_irecv``: gloo on CPU, NCCL on GPU); every wait has the
call's timeout (None: the process group's own). ``check_shards`` first gathers each rank's
shapes and then its positions, so that a rank whose shard does not fit the others' makes
every rank raise the same ``ValueError`` (naming that rank) instead of leaving the others
waiting for blocks that never come.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Ring", "ShardInfo", "Traffic", "check_shards", "ring_traffic"]

#: The per-rank fields ``check_shards`` gathers, in order.
FIELDS = (
    "batch", "heads", "kv_heads", "q_len", "k_len", "v_len", "head_dim", "v_dim", "dtype",
    "pos_len", "pos_batch", "pos_float", "seg", "seg_batch", "seg_len", "causal", "sinks",
)  # fmt: skip
#: Fields every rank must agree on, with the words an error uses for them.
SHARED = {
    "batch": "batch size B", "heads": "query heads H", "kv_heads": "key/value heads Hkv",
    "head_dim": "head_dim D", "dtype": "dtype", "pos_float": "positions dtype (integer or "
    "floating)", "seg": "segment_ids (given or None)", "causal": "causal",
    "sinks": "sinks (given or None)",
}  # fmt: skip
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


@dataclass
class Traffic:
    """What the rings of this process sent while ``ring_traffic`` was open."""

    bytes_sent: int = 0
    shifts: int = 0


_COUNTERS: list[Traffic] = []


@contextlib.contextmanager
def ring_traffic() -> Iterator[Traffic]:
    """Count the bytes this process's ring attention sends to its next rank (point-to-point
    shifts, forward and backward; the shard check's small all-gathers are not counted).

    Example::

        with ring_traffic() as traffic:
            ring_attention(q, k, v, positions=positions, position=alibi).sum().backward()
        traffic.bytes_sent  # per step, this rank
    """
    traffic = Traffic()
    _COUNTERS.append(traffic)
    try:
        yield traffic
    finally:
        _COUNTERS.remove(traffic)


@dataclass
class Ring:
    """The ranks of ``group`` (None: the default group) in a ring: rank ``r`` sends to
    ``r + 1`` and receives from ``r - 1`` (mod ``R``)."""

    group: dist.ProcessGroup | None
    timeout: timedelta | None

    def __post_init__(self) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ring attention needs an initialized torch.distributed process group "
                "(torch.distributed.init_process_group)"
            )
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError(
                f"process {dist.get_rank()} is not a member of the ring's group; call ring "
                "attention on the ranks of the group only"
            )
        self.size = dist.get_world_size(self.group)
        group = self.group if self.group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def start(self, tensors: list[Tensor]) -> tuple[list, list[Tensor]]:
        """Send ``tensors`` to the next rank and receive their shapes from the previous one;
        returns the pending requests and the buffers they fill (``finish``)."""
        sends = [t.contiguous() for t in tensors]
        for traffic in _COUNTERS:
            traffic.bytes_sent += sum(t.numel() * t.element_size() for t in sends)
            traffic.shifts += 1
        recvs = [torch.empty_like(t) for t in sends]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in recvs]
        return dist.batch_isend_irecv(ops), recvs

    def finish(self, pending: tuple[list, list[Tensor]]) -> list[Tensor]:
        """Wait (with the timeout) for a ``start`` and return what it received."""
        requests, recvs = pending
        for request in requests:
            self._wait(request)
        return recvs

    def all_gather(self, tensor: Tensor) -> Tensor:
        """``[R, *tensor.shape]``: every rank's ``tensor`` (equal shapes), with the timeout."""
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        self._wait(dist.all_gather(parts, tensor.contiguous(), group=self.group, async_op=True))
        return torch.stack(parts)

    def _wait(self, request: dist.Work) -> None:
        try:
            request.wait() if self.timeout is None else request.wait(self.timeout)
        except RuntimeError as err:
            within = "the process group's timeout" if self.timeout is None else self.timeout
            raise RuntimeError(
                f"ring attention: rank {self.rank} got no answer from the other ranks within "
                f"{within} (did every rank of the group call it?): {err}"
            ) from err


@dataclass(frozen=True)
class ShardInfo:
    """What ``check_shards`` learned: ``batched`` when some rank's positions are ``[B, T]``
    (every rank then sends ``[B, T]``), and the largest position of the group."""

    batched: bool
    max_position: float


def _fields(
    q: Tensor, k: Tensor, v: Tensor, positions: Tensor, segment_ids: Tensor | None,
    causal: bool, sinks: Tensor | None,
) -> list[int]:  # fmt: skip
    seg = segment_ids
    return [
        q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], v.shape[2], q.shape[3],
        v.shape[3], DTYPES.index(q.dtype), positions.shape[-1],
        positions.shape[0] if positions.dim() == 2 else 0, int(positions.is_floating_point()),
        int(seg is not None), 0 if seg is None else seg.shape[0],
        0 if seg is None else seg.shape[-1], int(causal), int(sinks is not None),
    ]  # fmt: skip


def _shape_error(table: list[dict[str, int]]) -> str | None:
    """The first thing wrong with the gathered shapes (one dict per rank), or None."""
    for key, words in SHARED.items():
        values = [row[key] for row in table]
        if len(set(values)) > 1:
            if key == "dtype":
                values = [str(DTYPES[x]) for x in values]
            ranks = ", ".join(f"rank {r} has {x}" for r, x in enumerate(values))
            return f"the ranks disagree on {words}: {ranks}"
    for r, row in enumerate(table):
        if row["heads"] % row["kv_heads"]:
            return f"rank {r}: H={row['heads']} is not divisible by Hkv={row['kv_heads']}"
        for name, key, want in (("k", "k_len", "q_len"), ("v", "v_len", "q_len"),
                                ("positions", "pos_len", "q_len")):  # fmt: skip
            if row[key] != row[want]:
                return (
                    f"rank {r}: {name} has {row[key]} tokens but q has {row['q_len']} (q, k, "
                    "v and positions hold the same tokens, the rank's shard)"
                )
        if row["v_dim"] != row["head_dim"]:
            return f"rank {r}: v has head_dim {row['v_dim']}, q has {row['head_dim']}"
        if row["pos_batch"] not in (0, 1, row["batch"]):
            return f"rank {r}: positions have batch {row['pos_batch']}, q has B={row['batch']}"
        if row["seg"] and (row["seg_batch"], row["seg_len"]) != (row["batch"], row["q_len"]):
            return (
                f"rank {r}: segment_ids have shape [{row['seg_batch']}, {row['seg_len']}], "
                f"expected [B={row['batch']}, T={row['q_len']}]"
            )
    lengths = [row["q_len"] for row in table]
    if len(set(lengths)) > 1:
        held = ", ".join(f"rank {r} holds {n}" for r, n in enumerate(lengths))
        return (
            f"shard lengths differ ({held} tokens); every rank holds as many tokens (pad a "
            "shard with tokens of a segment of their own)"
        )
    return None


def check_shards(
    ring: Ring,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    segment_ids: Tensor | None,
    *,
    causal: bool,
    sinks: Tensor | None,
) -> ShardInfo:
    """Gather every rank's shapes, then its positions, and raise the same error everywhere.

    Raises:
        ValueError: ranks that disagree on the batch, heads, head_dim, dtype, causal, sinks
            or segment ids; a rank whose k, v or positions do not cover its queries; shards
            of different lengths; a (segment, position) held twice in a batch row (each
            rank passing ``arange`` of its own length does that). The message names the
            ranks and is the same on every rank.
        RuntimeError: a rank that does not reach the check within the timeout.
    """
    device = q.device
    mine = torch.tensor(_fields(q, k, v, positions, segment_ids, causal, sinks), device=device)
    table = [dict(zip(FIELDS, row, strict=True)) for row in ring.all_gather(mine).tolist()]
    error = _shape_error(table)
    if error is not None:
        raise ValueError(f"ring attention: {error}")
    batch, length = table[0]["batch"], table[0]["q_len"]
    batched = any(row["pos_batch"] for row in table)
    pos = positions.expand(batch, length) if batched else positions
    wide = torch.float64 if pos.is_floating_point() else torch.int64
    held = ring.all_gather(pos.to(device, wide))  # [R, B, T] or [R, T]
    if segment_ids is None:
        seg = None
    else:
        seg = ring.all_gather(segment_ids.to(device, torch.int64)).double()
    every = held.double() if batched else held.double()[:, None].expand(-1, batch, -1)
    _check_unique(every, seg)  # [R, B, T]
    top = float(held.max()) if held.numel() else 0.0
    return ShardInfo(batched, top)


def _check_unique(held: Tensor, seg: Tensor | None) -> None:
    """Raise ``ValueError`` when a (segment, position) pair of a batch row is held twice;
    ``held`` and ``seg`` (None: one segment) are ``[R, B, T]``. Sorted by position, then
    (stably) by segment, a repeated pair lies next to itself."""
    _, batch, length = held.shape
    pos = held.permute(1, 0, 2).reshape(batch, -1)  # [B, R*T]
    ids = torch.zeros_like(pos) if seg is None else seg.permute(1, 0, 2).reshape(batch, -1)
    order = torch.argsort(pos, dim=-1, stable=True)
    order = order.gather(-1, torch.argsort(ids.gather(-1, order), dim=-1, stable=True))
    pos, ids = pos.gather(-1, order), ids.gather(-1, order)
    twice = (pos[:, 1:] == pos[:, :-1]) & (ids[:, 1:] == ids[:, :-1])  # [B, R*T - 1]
    if not bool(twice.any()):
        return
    b, i = (int(x) for x in twice.nonzero()[0])
    ranks = sorted({int(order[b, j]) // length for j in (i, i + 1)})
    where = f"position {float(pos[b, i]):g}"
    where += "" if seg is None else f" of segment {float(ids[b, i]):g}"
    held_by = " and ".join(f"rank {r}" for r in ranks) if len(ranks) > 1 else f"rank {ranks[0]}"
    raise ValueError(
        f"ring attention: {where} (batch row {b}) is held more than once ({held_by}); pass "
        "each rank the global positions of its own tokens (a local arange repeats them)"
    )
