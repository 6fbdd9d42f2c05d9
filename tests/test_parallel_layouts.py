"""Context-parallel shard layouts (posenc.parallel.layouts): properties, errors, and the
engines' own index functions (PyTorch's load balancers, Megatron-Core's rope_utils).

The references here are written from the rule itself (token ``t`` of a sequence of ``2N``
chunks of ``c`` tokens is in chunk ``t // c``; rank ``r`` holds chunks ``r`` and
``2N-1-r``), one token at a time, never through the layout code.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _megatron_cpu import Group, import_embeddings, patch_to_cpu
from posenc.parallel import (
    contiguous_layout,
    head_tail_layout,
    shard_batch,
    shard_mrope_positions,
    thd_layout,
    unshard,
)

SIZES = st.integers(1, 6)


def _head_tail_reference(length: int, size: int, rank: int) -> list[int]:
    chunk = length // (2 * size)
    held = (rank, 2 * size - 1 - rank)
    head = [t for t in range(length) if t // chunk == held[0]] if chunk else []
    tail = [t for t in range(length) if t // chunk == held[1]] if chunk else []
    return head + tail


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()])


@st.composite
def sequences(draw):
    """``(kind, T or cu_seqlens, N)`` for every layout kind, lengths that divide."""
    size = draw(SIZES)
    kind = draw(st.sampled_from(["contiguous", "head_tail", "thd"]))
    if kind == "thd":
        docs = draw(st.lists(st.integers(0, 4), min_size=1, max_size=5))
        return kind, _cu([2 * size * d for d in docs]), size
    multiple = size if kind == "contiguous" else 2 * size
    return kind, multiple * draw(st.integers(0, 5)), size


def _layouts(kind, spec, size):
    build = {"contiguous": contiguous_layout, "head_tail": head_tail_layout, "thd": thd_layout}
    return [build[kind](spec, size, r) for r in range(size)]


@settings(max_examples=150, deadline=None)
@given(sequences())
def test_ranks_together_hold_every_token_once(case):
    layouts = _layouts(*case)
    order = torch.cat([layout.indices for layout in layouts])
    seq_len = layouts[0].seq_len
    assert torch.equal(order.sort().values, torch.arange(seq_len))
    assert {layout.indices.numel() for layout in layouts} <= {seq_len // case[2]}


@settings(max_examples=150, deadline=None)
@given(sequences(), st.integers(1, 3))
def test_unshard_restores_sequence_order(case, batch):
    layouts = _layouts(*case)
    seq_len = layouts[0].seq_len
    x = torch.randn(batch, seq_len, 3, dtype=torch.float64)
    shards = [layout.shard(x) for layout in layouts]
    assert torch.equal(unshard(shards, layouts), x)
    positions = torch.arange(seq_len)  # the token axis first ([T]), dim 0
    assert torch.equal(unshard([p.shard(positions, 0) for p in layouts], layouts, 0), positions)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["contiguous", "head_tail"]), SIZES, st.integers(0, 5))
def test_one_sequence_positions_are_the_global_arange(kind, size, chunks):
    multiple = size if kind == "contiguous" else 2 * size
    seq_len = multiple * chunks
    for rank, layout in enumerate(_layouts(kind, seq_len, size)):
        if kind == "contiguous":
            shard = seq_len // size
            expected = list(range(rank * shard, (rank + 1) * shard))
        else:
            expected = _head_tail_reference(seq_len, size, rank)
        assert layout.indices.tolist() == expected
        assert torch.equal(layout.positions, layout.indices)
        assert layout.cu_seqlens is None and layout.unsplit_length == seq_len


@settings(max_examples=150, deadline=None)
@given(SIZES, st.lists(st.integers(0, 4), min_size=1, max_size=5))
def test_thd_positions_restart_in_every_document(size, docs):
    lengths = [2 * size * d for d in docs]
    cu = _cu(lengths)
    for rank in range(size):
        layout = thd_layout(cu, size, rank, seq_len=int(cu[-1]))
        expected_indices, expected_positions = [], []
        for k, length in enumerate(lengths):
            offsets = _head_tail_reference(length, size, rank)
            expected_indices += [int(cu[k]) + o for o in offsets]
            expected_positions += offsets
        assert layout.indices.tolist() == expected_indices
        assert layout.positions.tolist() == expected_positions
        assert torch.equal(layout.cu_seqlens, cu // size)
        assert layout.unsplit_length == max(lengths)
        # the shard's own document k holds exactly document k's tokens
        for k in range(len(lengths)):
            held = layout.indices[layout.cu_seqlens[k] : layout.cu_seqlens[k + 1]]
            assert bool(((held >= cu[k]) & (held < cu[k + 1])).all())


def test_later_documents_never_reuse_document_zeros_positions():
    # Megatron-LM#5243: two packed documents of 4, 2 ranks; rank 0 holds tokens [0, 3, 4, 7]
    layout = thd_layout(torch.tensor([0, 4, 8]), 2, 0)
    assert layout.indices.tolist() == [0, 3, 4, 7]
    assert layout.positions.tolist() == [0, 3, 0, 3]
    # per-token position ids (as a VLM's packed ids) are looked up at the tokens held
    ids = torch.tensor([[0, 1, 2, 3, 10, 11, 12, 13]] * 3)  # [3, T], document 1 apart
    assert shard_mrope_positions(ids, layout).tolist() == [[0, 3, 10, 13]] * 3


@settings(max_examples=60, deadline=None)
@given(SIZES, st.integers(0, 3), st.integers(1, 4))
def test_mrope_ids_split_on_the_token_axis(size, chunks, batch):
    seq_len = 2 * size * chunks
    ids = torch.randint(0, 100, (3, batch, seq_len))
    for layout in _layouts("head_tail", seq_len, size):
        sharded = shard_mrope_positions(ids, layout)
        assert sharded.shape == (3, batch, seq_len // size)
        for s, t in enumerate(layout.indices.tolist()):
            assert torch.equal(sharded[:, :, s], ids[:, :, t])
        assert torch.equal(shard_mrope_positions(ids[:, 0], layout), sharded[:, 0])


def test_shard_batch_splits_each_tensor_on_its_token_axis():
    seq_len, batch = 8, 3
    layout = head_tail_layout(seq_len, 2, 1)
    data = {
        "inputs": torch.arange(batch * seq_len).view(batch, seq_len),
        "hidden": torch.randn(batch, seq_len, 5),
        "positions": torch.arange(seq_len),
        "mrope": torch.arange(3 * batch * seq_len).view(3, batch, seq_len),
    }
    out = shard_batch(data, layout, seq_dims={"positions": 0, "mrope": -1})
    idx = [2, 3, 4, 5]
    assert torch.equal(out["inputs"], data["inputs"][:, idx])
    assert torch.equal(out["hidden"], data["hidden"][:, idx])
    assert torch.equal(out["positions"], torch.tensor(idx))
    assert torch.equal(out["mrope"], data["mrope"][..., idx])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: head_tail_layout(8, 0, 0), ValueError, "cp_size must be >= 1"),
        (lambda: head_tail_layout(8, True, 0), TypeError, "cp_size must be an integer"),
        (lambda: head_tail_layout(8, 2.0, 0), TypeError, "cp_size must be an integer"),
        (lambda: head_tail_layout(8, 2, 2), ValueError, "cp_rank must be < cp_size = 2"),
        (lambda: contiguous_layout(8, 2, -1), ValueError, "cp_rank must be >= 0"),
        (lambda: contiguous_layout(-4, 2, 0), ValueError, "seq_len must be >= 0"),
        (lambda: contiguous_layout(9, 2, 0), ValueError, "not a multiple of 2.*pad it to 10"),
        (lambda: head_tail_layout(12, 4, 0), ValueError, "not a multiple of 8.*pad it to 16"),
        (lambda: thd_layout([0, 4], 2, 0), TypeError, "cu_seqlens must be a torch.Tensor"),
        (lambda: thd_layout(torch.tensor([0.0, 4.0]), 2, 0), TypeError, "integer tensor"),
        (lambda: thd_layout(torch.tensor([[0, 4]]), 2, 0), ValueError, "1-D"),
        (lambda: thd_layout(torch.tensor([0]), 2, 0), ValueError, "K\\+1 >= 2"),
        (lambda: thd_layout(torch.tensor([1, 5]), 2, 0), ValueError, "start at 0"),
        (lambda: thd_layout(torch.tensor([0, 8, 4]), 2, 0), ValueError, "non-decreasing"),
        (lambda: thd_layout(torch.tensor([0, 8]), 2, 0, seq_len=12), ValueError, "end at seq_len"),
        (
            lambda: thd_layout(torch.tensor([0, 8, 14]), 2, 0),
            ValueError,
            "document 1's length 6 is not a multiple of 4.*pad it to 8",
        ),
        (lambda: head_tail_layout(8, 2, 0).shard(torch.zeros(2, 6)), ValueError, "splits 8"),
        (lambda: head_tail_layout(8, 2, 0).shard(torch.zeros(8), 1), ValueError, "out of range"),
        (
            lambda: shard_mrope_positions(torch.zeros(8), head_tail_layout(8, 2, 0)),
            ValueError,
            "A, B, T",
        ),
        (
            lambda: shard_batch(
                {"x": torch.zeros(1, 8)}, head_tail_layout(8, 2, 0), seq_dims={"y": 0}
            ),
            ValueError,
            "not in the batch",
        ),
        (
            lambda: shard_batch({"x": torch.zeros(3, 2, 8)}, head_tail_layout(8, 2, 0)),
            ValueError,
            "batch\\['x'\\]: x has 2 tokens",
        ),
    ],
)
def test_bad_input_raises_naming_the_value(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_unshard_refuses_mismatched_shards_and_layouts():
    layouts = [head_tail_layout(8, 2, r) for r in range(2)]
    x = torch.randn(1, 8)
    shards = [layout.shard(x) for layout in layouts]
    with pytest.raises(ValueError, match="got 1 shards for 2 layouts"):
        unshard(shards[:1], layouts)
    with pytest.raises(ValueError, match="layouts\\[0\\] is rank 1 of 2"):
        unshard(shards, layouts[::-1])
    with pytest.raises(ValueError, match="shards\\[1\\] has 3 tokens"):
        unshard([shards[0], shards[1][:, :3]], layouts)
    mixed = [layouts[0], contiguous_layout(8, 2, 1)]  # tokens 4, 5 twice, 2, 3 never
    with pytest.raises(ValueError, match="exactly once"):
        unshard([layout.shard(x) for layout in mixed], mixed)


# ---------------------------------------------------------------- PyTorch's own balancers


@settings(max_examples=60, deadline=None)
@given(SIZES, st.integers(1, 5))
def test_head_tail_equals_pytorch_load_balancer(size, chunks):
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _HeadTailLoadBalancer,
    )

    seq_len = 2 * size * chunks
    balancer = _HeadTailLoadBalancer(seq_len, size, "cpu")
    # context_parallel rearranges by these indices, then gives rank r the r-th of N equal parts
    rearranged = balancer._generate_indices()[0].long()
    layouts = _layouts("head_tail", seq_len, size)
    for layout, part in zip(layouts, rearranged.chunk(size), strict=True):
        assert torch.equal(layout.indices, part)
    restore = balancer._generate_indices(restore=True)[0].long()
    x = torch.arange(seq_len)
    assert torch.equal(unshard([layout.shard(x, 0) for layout in layouts], layouts, 0), x)
    assert torch.equal(x[rearranged][restore], x)


@settings(max_examples=60, deadline=None)
@given(SIZES, st.lists(st.integers(1, 3), min_size=1, max_size=4))
def test_thd_chunks_equal_pytorch_per_document_balancer(size, docs):
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _PerDocumentHeadTailLoadBalancer,
    )

    lengths = [2 * size * d for d in docs]
    cu = _cu(lengths)
    rearranged = _PerDocumentHeadTailLoadBalancer([lengths], size, "cpu")._generate_indices()
    rearranged = rearranged[0].long()
    # PyTorch writes each document's rank pieces in rank order, document after document
    for k in range(len(lengths)):
        pieces = rearranged[cu[k] : cu[k + 1]].chunk(size)
        for rank in range(size):
            layout = thd_layout(cu, size, rank)
            mine = layout.indices[layout.cu_seqlens[k] : layout.cu_seqlens[k + 1]]
            assert torch.equal(mine, pieces[rank])


def test_pytorch_per_document_shards_keep_documents_in_sequence_order():
    """Torch 2.13 gives rank r the r-th contiguous part of that document-major order, so with
    several documents a rank holds whole documents (not a head-tail pair of each, as its
    docstring draws and as Megatron does); thd_layout follows Megatron."""
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _PerDocumentHeadTailLoadBalancer,
    )

    lengths = [4, 8, 4]
    rearranged = _PerDocumentHeadTailLoadBalancer([lengths], 2, "cpu")._generate_indices()
    torch_rank0 = rearranged[0].chunk(2)[0].tolist()
    assert torch_rank0 == [0, 3, 1, 2, 4, 5, 10, 11]
    assert thd_layout(_cu(lengths), 2, 0).indices.tolist() == [0, 3, 4, 5, 10, 11, 12, 15]


# ---------------------------------------------------------------- Megatron-Core's own functions


@pytest.fixture(scope="module")
def rope_utils():
    return import_embeddings()[0]


@pytest.fixture
def cpu_megatron(rope_utils, monkeypatch):
    patch_to_cpu(rope_utils, monkeypatch)
    return rope_utils


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_head_tail_equals_megatron_get_pos_emb_on_this_cp_rank(cpu_megatron, size):
    seq_len = 2 * size * 3
    table = torch.arange(seq_len)[:, None, None, None].expand(seq_len, 1, 1, 2)  # [s, 1, 1, d]
    for rank in range(size):
        got = cpu_megatron.get_pos_emb_on_this_cp_rank(table.contiguous(), 0, Group(size, rank))
        assert torch.equal(got[:, 0, 0, 0], head_tail_layout(seq_len, size, rank).positions)


@pytest.mark.parametrize("size", [1, 2, 4])
def test_thd_equals_megatron_get_thd_freqs_on_this_cp_rank(rope_utils, size):
    lengths = [2 * size * d for d in (1, 3, 2)]
    cu = _cu(lengths)
    table = torch.arange(int(cu[-1]))  # a lookup table whose row r is r
    for rank in range(size):
        layout = thd_layout(cu, size, rank)
        shards = torch.split(torch.empty(layout.indices.numel()), [n // size for n in lengths])
        restarted = [
            rope_utils._get_thd_freqs_on_this_cp_rank(rank, size, x, table) for x in shards
        ]
        assert torch.equal(torch.cat(restarted), layout.positions)
        # Megatron's exact mapping (one row per packed token, with each document's offset)
        exact = [
            rope_utils._get_thd_freqs_on_this_cp_rank(rank, size, x, table, int(cu[k]))
            for k, x in enumerate(shards)
        ]
        assert torch.equal(torch.cat(exact), layout.indices)


@pytest.mark.parametrize("size", [2, 4])
def test_mrope_ids_split_as_megatron_multimodal_rotary_embedding(cpu_megatron, size):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import (
        MultimodalRotaryEmbedding,
    )

    batch, seq_len, section = 2, 8 * size, [2, 3, 3]  # head_dim 16: 8 pairs over 3 axes
    ids = torch.randint(0, 50, (3, batch, seq_len))
    mrope = MultimodalRotaryEmbedding(kv_channels=16, rotary_percent=1.0)
    for rank in range(size):
        # Megatron: the table of all tokens, then its CP split; posenc: the ids' split first
        want = mrope.forward(ids, section, cp_group=Group(size, rank))
        sharded = shard_mrope_positions(ids, head_tail_layout(seq_len, size, rank))
        assert torch.equal(mrope.forward(sharded, section, cp_group=Group(1, 0)), want)
