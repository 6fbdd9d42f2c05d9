"""Context parallelism: one sequence split across processes, as the training engines split it.

Shard layouts (contiguous, head-tail load balancing, per-document THD, M-RoPE ids) are pure
functions of lengths and positions in `posenc.parallel.layouts`; the per-rank RoPE tables in the
forms torchtitan and Megatron-Core consume are in `posenc.parallel.engines`; ring attention that
takes any posenc encoding at the shard's global positions is `posenc.parallel.ring` (and
`ring_context` runs a model's `MultiHeadAttention` layers by it).
"""

from posenc.parallel._ring_comm import Traffic, ring_traffic
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
from posenc.parallel.ring import check_splittable, ring_attention
from posenc.parallel.ring_module import ring_context

__all__ = [
    "ShardLayout",
    "Traffic",
    "check_splittable",
    "contiguous_layout",
    "head_tail_layout",
    "megatron_rope_freqs",
    "ring_attention",
    "ring_context",
    "ring_traffic",
    "shard_batch",
    "shard_mrope_positions",
    "thd_layout",
    "torchtitan_cos_sin",
    "torchtitan_freqs_cis",
    "unshard",
]
