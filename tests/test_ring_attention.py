"""Ring attention (``posenc.parallel.ring_attention``) gives the unsplit attention's outputs
and gradients for every encoding it takes, and refuses the others by name.

Gloo ranks on the CPU run ``tests/_ring_worker.py``: every encoding (and RoPE + ALiBi, a
frozen T5) x (contiguous, head-tail, per-document packed) x (causal, bidirectional with
sinks), grouped key/value heads, in float64 (to rounding) with blocks of 3 queries within a
pair (ragged blocks of a shard of 8 or 16); some also on a shuffled layout (any permutation
of the tokens); a few in float32, and with positions ``[B, T]``, in one block. The forward
runs PyTorch's fused CPU kernel except for Shaw (a value term), the backward except for the
encodings with parameters to train or content in their bias. Bad shards raise the same
error on every rank; ``ring_context`` runs ``MultiHeadAttention`` by the ring; a causal
block that no query of a rank sees is not computed. Two ranks run by default, four under
``slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import posenc
from _ranks import run_ranks
from _ring_cases import BATCHED, EXTRA, LAYER_ENCODINGS, LAYOUTS, H, encodings
from conftest import tolerances
from posenc.parallel import ring_attention

WORKER = Path(__file__).with_name("_ring_worker.py")
FLOAT32 = ("alibi", "t5", "shaw", "fire")
#: Roundings a value goes through: sums over up to 32 keys, the bias MLPs (FIRE, DAPE).
OPS = 64


def _cases() -> list[str]:
    out = [
        f"{name}-{where}-{mask}"
        for name in [*encodings(), *EXTRA]
        for where in LAYOUTS
        for mask in ("causal", "bidirectional")
    ]
    out += [
        f"{name}-{kind}-{mask}"
        for name in BATCHED
        for kind in ("batched", "shuffled")
        for mask in ("causal", "bidirectional")
    ]
    return out + [f"{name}-float32" for name in FLOAT32]


def _tolerance(case: str) -> float:
    return tolerances(torch.float32 if case.endswith("float32") else torch.float64, ops=OPS)["atol"]


@pytest.fixture(scope="module")
def grid2() -> dict[str, float]:
    return run_ranks(WORKER, 2, "grid")


@pytest.fixture(scope="module")
def grid4() -> dict[str, float]:
    return run_ranks(WORKER, 4, "grid")


@pytest.mark.distributed
def test_every_case_ran(grid2):
    assert sorted(grid2) == sorted(_cases())


@pytest.mark.distributed
@pytest.mark.parametrize("case", _cases())
def test_two_ranks_equal_the_unsplit_attention(grid2, case):
    assert grid2[case] <= _tolerance(case)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", _cases())
def test_four_ranks_equal_the_unsplit_attention(grid4, case):
    assert grid4[case] <= _tolerance(case)


@pytest.fixture(scope="module")
def bad_shards() -> dict[str, list[str]]:
    return run_ranks(WORKER, 2, "errors")


BAD = {
    "shorter shard": "shard lengths differ (rank 0 holds 8, rank 1 holds 7 tokens)",
    "positions longer than the shard": "rank 1: positions has 9 tokens but q has 8",
    "keys shorter than the queries": "rank 1: k has 7 tokens but q has 8",
    "local arange": "position 0 (batch row 0) is held more than once (rank 0 and rank 1)",
    "a position twice on one rank": "position 8 (batch row 0) is held more than once (rank 1)",
    "heads": "disagree on query heads H: rank 0 has 4, rank 1 has 2",
    "dtype": "disagree on dtype: rank 0 has torch.float64, rank 1 has torch.float32",
    "segment ids": "rank 1: segment_ids have shape [2, 9], expected [B=2, T=8]",
}


@pytest.mark.distributed
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_shard_raises_the_same_error_on_every_rank(bad_shards, case):
    messages = bad_shards[case]
    assert len(messages) == 2 and messages[0] == messages[1]
    assert messages[0].startswith("ValueError: ring attention: ")
    assert BAD[case] in messages[0]


@pytest.mark.distributed
def test_a_process_outside_the_group_is_told_so(bad_shards):
    inside, outside = bad_shards["not in the group"]
    assert inside == ""  # rank 0 alone: a ring of one
    assert outside.startswith("ValueError: process 1 is not a member of the ring's group")


@pytest.mark.distributed
def test_a_rank_that_never_calls_times_out_instead_of_hanging(bad_shards):
    (message,) = bad_shards["a rank that never calls"]
    assert message.startswith("RuntimeError: ring attention: rank 0 got no answer")


REFUSED = {"cope", "dual_chunk", "fox", "path", "stick_breaking"}


def test_exactly_the_stateful_encodings_are_refused():
    assert set(posenc.available()) - set(encodings()) == REFUSED


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_stateful_encoding_is_refused_by_name(name):
    enc = posenc.build(name, d_model=32, num_heads=H, head_dim=8, max_len=16, causal=True)
    q = torch.zeros(1, H, 4, 8)
    with pytest.raises(ValueError, match=f"cannot split {type(enc).__name__} into blocks: "):
        ring_attention(q, q, q, positions=torch.arange(4), position=enc)


def test_a_refused_part_of_a_composition_is_named():
    enc = posenc.Compose([posenc.RotaryEmbedding(8), posenc.build("cope", head_dim=8)])
    q = torch.zeros(1, H, 4, 8)
    with pytest.raises(ValueError, match="cannot split CoPE"):
        ring_attention(q, q, q, positions=torch.arange(4), position=enc)


def test_without_a_process_group_it_says_so():
    q = torch.zeros(1, H, 4, 8)
    with pytest.raises(RuntimeError, match=r"initialized torch\.distributed process group"):
        ring_attention(q, q, q, positions=torch.arange(4))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"sinks": torch.zeros(3)}, ValueError, r"sinks must be a tensor of shape \[H=4\]"),
        ({"segment_ids": torch.zeros(1, 4)}, TypeError, "segment_ids must be an integer"),
        ({"position": "alibi"}, TypeError, "position must be a PositionalEncoding"),
        ({"positions": torch.arange(4).to(torch.bfloat16)}, TypeError, "positions"),
    ],
)
def test_bad_arguments_raise_before_any_communication(kwargs, error, match):
    q = torch.zeros(1, H, 4, 8)
    with pytest.raises(error, match=match):
        ring_attention(q, q, q, **{"positions": torch.arange(4), **kwargs})


@pytest.fixture(scope="module")
def layers() -> dict[str, object]:
    return run_ranks(WORKER, 2, "module")


@pytest.mark.distributed
@pytest.mark.parametrize("name", LAYER_ENCODINGS)
@pytest.mark.parametrize("where", LAYOUTS)
def test_ring_context_runs_multi_head_attention_unsplit(layers, name, where):
    # outputs, input and parameter gradients (sinks, projections, the encoding's tables)
    assert layers[f"{name}-{where}"] <= tolerances(torch.float64, ops=OPS)["atol"]


@pytest.mark.distributed
def test_a_layer_without_global_positions_is_told_to_pass_them(layers):
    assert "pass each rank the global positions" in layers["no positions"]


@pytest.mark.distributed
def test_a_hidden_causal_block_is_not_computed(layers):
    # contiguous: rank 0's queries precede rank 1's keys (one pair, forward and backward)
    assert layers["pairs-contiguous"] == [[1, 1], [2, 2]]
    # head-tail: every rank holds a late chunk that sees every other rank's keys
    assert layers["pairs-head_tail"] == [[2, 2], [2, 2]]
