"""What the ring attention workers share: the shapes, the shard layouts of the global
sequence, the encodings, seeded inputs, the one-process reference and the error measure.

Shapes: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``T`` global length, ``S``
a rank's shard, ``D`` head_dim. Every rank draws the same global inputs (one seed).
"""

from __future__ import annotations

from datetime import timedelta

import torch

import posenc
from _build import SHORT
from posenc.attention import Masking, attend, repeat_kv
from posenc.parallel import ShardLayout, contiguous_layout, head_tail_layout, thd_layout
from posenc.parallel._ring_encodings import REFUSED

B, H, HKV, D = 2, 4, 2, 8
LAYOUTS = ("contiguous", "head_tail", "packed")
#: Beyond the registry: a composition, and a bias without parameters to train (whose
#: backward, as RoPE's and ALiBi's, runs PyTorch's fused CPU kernel).
EXTRA = ("rope+alibi", "t5-frozen")
#: Encodings run inside ``MultiHeadAttention`` by ``ring_context``.
LAYER_ENCODINGS = ("t5", "shaw", "rope", "mrope")
#: Encodings also run with positions ``[B, T]`` (each batch row shifted), and on a shuffled
#: layout (a seeded permutation of the tokens, dealt to the ranks).
BATCHED = ("alibi", "t5", "kerple", "fire", "shaw", "dape", "rope", "mrope")
TIMEOUT = timedelta(seconds=60)


def length(world: int) -> int:
    return 8 * world


def layout(name: str, world: int, rank: int):
    """``(layout, segment_ids [B, T] or None)`` of the global sequence."""
    t = length(world)
    if name == "contiguous":
        return contiguous_layout(t, world, rank), None
    if name == "head_tail":
        return head_tail_layout(t, world, rank), None
    if name == "shuffled":  # any layout: a seeded permutation, unsorted within each rank
        mine = torch.randperm(t, generator=torch.Generator().manual_seed(3))[rank::world]
        return ShardLayout(t, world, rank, mine, mine.clone()), None
    cu = torch.tensor([0, t // 2, 3 * t // 4, t])  # three documents, lengths multiples of 2N
    docs = torch.repeat_interleave(torch.arange(3), cu[1:] - cu[:-1])
    return thd_layout(cu, world, rank), docs.expand(B, t)


def encodings() -> list[str]:
    """Every registered encoding the ring takes (the refused ones are checked apart)."""
    return [n for n in posenc.available() if posenc.info(n).cls.__name__ not in REFUSED]


def build(name: str, causal: bool, dtype: torch.dtype) -> posenc.PositionalEncoding:
    """``name`` for the shapes above, every parameter moved off its init (seeded)."""
    torch.manual_seed(0)
    shape = {"d_model": H * D, "num_heads": H, "head_dim": D, "max_len": 64, "causal": causal}
    if name == "rope+alibi":
        enc = posenc.Compose([posenc.RotaryEmbedding(D), posenc.ALiBi(H, causal=causal)])
    else:
        enc = posenc.build(name.removesuffix("-frozen"), **shape, **SHORT.get(name, {}))
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return enc.to(dtype).requires_grad_(not name.endswith("-frozen"))


def inputs(t: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, t, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, HKV, t, D, generator=g, dtype=torch.float64) for _ in range(2))
    grad = torch.randn(B, H, t, D, generator=g, dtype=torch.float64)
    sinks = torch.randn(H, generator=g, dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v, grad, sinks)]


def leaves(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_() for x in xs]


def unsplit(enc, q, k, v, sinks, pos, rot, seg, causal):
    """The one-process attention ``[B, H, T, D]`` of the whole sequence."""
    if enc.sites & posenc.Site.QK:
        q, k = enc.rotate(q, k, rot, rot)
    masking = Masking(causal, pos, pos, None, seg, seg)
    k, v = repeat_kv(k, H), repeat_kv(v, H)
    return attend(q, k, v, position=enc, masking=masking, backend="eager", sinks=sinks)


def error(got: torch.Tensor | None, want: torch.Tensor | None) -> float:
    if got is None or want is None:
        return 0.0 if got is None and want is None else float("inf")
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max()) / max(float(want.abs().max()), 1.0)


def global_positions(where: str, world: int) -> torch.Tensor:
    """``[T]``: the position of every token of the sequence, in sequence order."""
    every = [layout(where, world, r)[0] for r in range(world)]
    return torch.zeros(length(world), dtype=torch.int64).index_put_(
        (torch.cat([a.indices for a in every]),), torch.cat([a.positions for a in every])
    )


def expect_error(call) -> str:
    """The message of the ``ValueError`` (or ``RuntimeError``) ``call()`` raises, else ``""``."""
    try:
        call()
    except (ValueError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
    return ""
