"""Context parallelism: one sequence split across processes, as the training engines split it.

Shard layouts (contiguous, head-tail load balancing, per-document THD, M-RoPE ids) are pure
functions of lengths and positions in `posenc.parallel.layouts`.
"""

from posenc.parallel.layouts import (
    ShardLayout,
    contiguous_layout,
    head_tail_layout,
    shard_batch,
    shard_mrope_positions,
    thd_layout,
    unshard,
)

__all__ = [
    "ShardLayout",
    "contiguous_layout",
    "head_tail_layout",
    "shard_batch",
    "shard_mrope_positions",
    "thd_layout",
    "unshard",
]
