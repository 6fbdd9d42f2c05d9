"""One rank of tests/test_parallel_torch_cp.py: PyTorch's own context parallelism on the CPU.

Usage (through ``tests/_ranks.py``): ``python _torch_cp_worker.py RANK WORLD PORT OUT.json``.
Rank 0 writes every rank's findings: the error the SDPA path raises, and the largest
difference between the FlexAttention path (ALiBi as a ``score_mod`` reading the shard's
positions from ``posenc.parallel``) and the unsplit attention.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import posenc
from _ranks import finish, write_gathered
from posenc.parallel import head_tail_layout

B, H, T, D = 1, 2, 256, 8  # the block mask needs T divisible by world * 128


class _Flex(nn.Module):
    def forward(self, q, k, v, score_mod=None, block_mask=None):
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)


def _sdpa_error(mesh, q, k, v) -> str:
    from torch.distributed.tensor.experimental import context_parallel

    buffers = [t.clone() for t in (q, k, v)]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(*buffers, is_causal=True)
    except NotImplementedError as err:
        return str(err)
    return ""


def _flex_difference(mesh, rank: int, world: int, q, k, v) -> float:
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _context_parallel_shard,
        _ContextParallel,
    )
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _HeadTailLoadBalancer,
    )
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.attention.flex_attention import create_block_mask

    slopes = posenc.alibi_slopes(H)
    layouts = [head_tail_layout(T, world, r) for r in range(world)]
    q_pos = layouts[rank].positions  # the shard's queries
    k_pos = torch.cat([layout.positions for layout in layouts])  # keys as gathered, rank order

    def alibi(positions_q, positions_k):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (positions_q[q_idx] - positions_k[kv_idx])

        return score_mod

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    mask = create_block_mask(causal, B, H, T, T, device="cpu")
    style = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX)
    attend = parallelize_module(_Flex(), mesh, style)
    balancer = _HeadTailLoadBalancer(T, world, "cpu")
    qs, ks, vs, mask_shard = _context_parallel_shard(
        mesh, [q, k, v, mask], [2, 2, 2, 2], load_balancer=balancer
    )
    out = attend(qs, ks, vs, score_mod=alibi(q_pos, k_pos), block_mask=mask_shard)
    full = torch.arange(T)
    want = _Flex()(q, k, v, score_mod=alibi(full, full), block_mask=mask)
    return (out - layouts[rank].shard(want, 2)).abs().max().item()


def main(rank: int, world: int, port: str, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    found = {"sdpa_error": _sdpa_error(mesh, q, k, v)}
    found["flex_difference"] = _flex_difference(mesh, rank, world, q, k, v)
    write_gathered(found, out)
    finish()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
