"""Ring attention benchmark: one attention layer's training step with a position bias, on
two CPU processes that split the sequence, against the same layer unsplit in one process.

Shapes: ``B`` batch, ``T`` the whole sequence, ``C`` d_model, ``H`` heads. Two processes
(gloo over a file store, one thread each) build the same ``posenc.MultiHeadAttention`` and
input ``[B, T, C]``. Cases, timed round-robin on rank 0 (``posenc.bench.timing.measure``):

* ``<name> unsplit``: rank 0 runs the layer's forward and backward over all ``T`` tokens
  while rank 1 waits (the one-process baseline);
* ``<name> ring``: both ranks run it on their head-tail shard (``T / 2`` tokens at their
  global positions) by ring attention (``posenc.parallel.ring_context``).

``Group.info["bytes_sent_per_step"]`` is what rank 0's ring sent per step (forward and
backward, ``posenc.parallel.ring_traffic``). On 2 cores the ideal ring step is half the
unsplit one; the ratio shows what the communication and the block-wise merge cost.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from posenc.attention import MultiHeadAttention
from posenc.base import build
from posenc.bench.timing import Group, Stats, measure
from posenc.parallel import head_tail_layout, ring_context, ring_traffic

__all__ = ["ENCODINGS", "ring_groups"]

#: Biases of each kind (a fixed offset bias, a learned bucket table, a learned kernel)
#: and RoPE for comparison.
ENCODINGS = ("alibi", "t5", "kerple", "rope")
WORLD = 2


def _cases(rank: int, name: str, shape: dict[str, int]) -> tuple[dict, int]:
    """This rank's callables for ``name`` and the bytes one ring step sends from it."""
    batch, length, d_model, heads = (shape[k] for k in ("batch", "length", "d_model", "heads"))
    torch.manual_seed(0)
    encoding = build(name, d_model=d_model, num_heads=heads, head_dim=d_model // heads,
                     max_len=length, causal=True)  # fmt: skip
    layer = MultiHeadAttention(d_model, heads, position=encoding)
    x = torch.randn(batch, length, d_model, requires_grad=True)
    layout = head_tail_layout(length, WORLD, rank)
    shard = layout.shard(x.detach()).requires_grad_()

    def unsplit() -> None:
        if rank == 0:
            layer(x).sum().backward()
        dist.barrier()

    def ring() -> None:
        with ring_context(layer):
            out = layer(shard, layout.positions)
        out.sum().backward()

    with ring_traffic() as traffic:
        ring()
    return {f"{name} unsplit": unsplit, f"{name} ring": ring}, traffic.bytes_sent


def _worker(rank: int, store: str, shape: dict[str, int], repeats: int, warmup: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        out = {}
        for name in ENCODINGS:
            cases, sent = _cases(rank, name, shape)
            stats = measure(cases, repeats=repeats, warmup=warmup)
            out[name] = {"stats": {k: vars(v) for k, v in stats.items()}, "bytes": sent}
        if rank == 0:
            Path(store).with_suffix(".json").write_text(json.dumps(out), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def ring_groups(*, quick: bool, repeats: int, warmup: int) -> list[Group]:
    """Time ring attention against the unsplit layer per encoding in ``ENCODINGS``."""
    shape = (
        {"batch": 1, "length": 128, "d_model": 32, "heads": 2}
        if quick
        else {"batch": 1, "length": 2048, "d_model": 512, "heads": 8}
    )
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        mp.start_processes(_worker, args=(store, shape, repeats, warmup), nprocs=WORLD,
                           start_method="spawn")  # fmt: skip
        results = json.loads(Path(store).with_suffix(".json").read_text(encoding="utf-8"))
    groups = []
    for name, result in results.items():
        stats = {case: Stats(**values) for case, values in result["stats"].items()}
        title = (
            f"{name} attention layer, forward + backward, [{shape['batch']}, {shape['length']}, "
            f"{shape['d_model']}], {shape['heads']} heads: ring on {WORLD} processes vs unsplit"
        )
        info = {"bytes_sent_per_step": result["bytes"], "processes": WORLD, **shape}
        groups.append(Group("ring", title, stats, speedup_over=(f"{name} unsplit",), info=info))
    return groups
