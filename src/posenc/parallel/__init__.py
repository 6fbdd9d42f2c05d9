"""Context parallelism: one sequence split across processes, as the training engines split it.

Shard layouts (contiguous, head-tail load balancing, per-document THD, M-RoPE ids) are pure
functions of lengths and positions in `posenc.parallel.layouts`; the per-rank RoPE tables in the
forms torchtitan and Megatron-Core consume are in `posenc.parallel.engines`.
"""

from posenc.parallel.engines import megatron_rope_freqs, torchtitan_cos_sin, torchtitan_freqs_cis
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
    "megatron_rope_freqs",
    "shard_batch",
    "shard_mrope_positions",
    "thd_layout",
    "torchtitan_cos_sin",
    "torchtitan_freqs_cis",
    "unshard",
]
