"""One rank of tests/test_parallel_torchtitan.py: torchtitan's own ``cp_shard`` (head-tail, on a
gloo DeviceMesh) and ``ComplexRoPE`` against posenc's layouts and rotation.

Usage (through ``tests/_ranks.py``): ``python _torchtitan_worker.py RANK WORLD PORT OUT.json``;
rank 0 writes every rank's largest differences (0 where the values must be equal).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import posenc
from _ranks import finish, write_gathered
from posenc.parallel import head_tail_layout, torchtitan_freqs_cis

B, T, H, D = 2, 32, 2, 16
DOCS = (8, 16, 8)  # packed documents: positions restart in each


def main(rank: int, world: int, port: str, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed.context_parallel import cp_shard
    from torchtitan.models.common.rope import ComplexRoPE

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 1000, (B, T), generator=gen)
    positions = torch.cat([torch.arange(n) for n in DOCS]).expand(B, T)
    q = torch.randn(B, T, H, D, generator=gen)
    (tokens_shard, positions_shard, q_shard), _ = cp_shard(
        mesh, (tokens, positions, q), None, "headtail"
    )
    layout = head_tail_layout(T, world, rank)

    config = ComplexRoPE.Config(dim=D, max_seq_len=T, theta=10000.0)
    theirs, _ = ComplexRoPE(config)(q_shard, q_shard, positions=positions_shard)
    rope = posenc.RotaryEmbedding(D, interleaved=True)  # ComplexRoPE pairs adjacent features
    q64 = q.transpose(1, 2).double()  # [B, H, T, D]
    unsplit, _ = rope.rotate(q64, q64, positions, positions)
    table = torchtitan_freqs_cis(rope, T)
    looked_up = torch.view_as_real(
        torch.view_as_complex(q_shard.reshape(B, -1, H, D // 2, 2))
        * table[layout.shard(positions)][:, :, None]
    ).flatten(3)
    errors = {
        "tokens": (tokens_shard - layout.shard(tokens)).abs().max().item(),
        "positions": (positions_shard - layout.shard(positions)).abs().max().item(),
        "rope_vs_unsplit": (theirs.double() - layout.shard(unsplit.transpose(1, 2), 1))
        .abs()
        .max()
        .item(),
        "table_vs_complex_rope": (looked_up - theirs).abs().max().item(),
    }
    write_gathered(errors, out)
    finish()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
