"""FoX, stick-breaking and PaTH need the keys a query sees stored in position order.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model. Their sums
and products run over the keys between a key and its query in storage order, so tokens
stored out of position order (or sharing a position) would silently give another result;
on the CPU it is a ``ValueError``, elsewhere (no host sync) NaN rows.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc.encodings import fox_weights, path_weights, stick_breaking_weights
from posenc.kv_cache import KVCache

C, H, T = 16, 4, 7
D = C // H
NAMES = ("fox", "stick_breaking", "path")


def _layer(name: str, **kwargs) -> posenc.MultiHeadAttention:
    torch.manual_seed(0)
    position = posenc.build(name, d_model=C, num_heads=H, head_dim=D, **kwargs)
    return posenc.MultiHeadAttention(C, H, position=position).double().eval()


def _x(length: int = T, batch: int = 1, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, C, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("name", NAMES)
def test_tokens_out_of_position_order_are_refused_naming_the_key(name):
    """Tokens and positions permuted together (query 0 sees the keys at 0, 1 and 2 stored
    after the one at 3, stick-breaking after the one at 6); a token far ahead stored among
    earlier ones (FoX and PaTH would sum its gate or transform)."""
    mha, x = _layer(name), _x()
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    first = "key 3 (position 1) comes after a key at position 6"
    if name != "stick_breaking":
        first = "key 1 (position 0) comes after a key at position 3"
    message = re.escape(f"query 0 (position 3) of batch row 0, {first}")
    with pytest.raises(ValueError, match=message):
        mha(x[:, perm], perm)
    with pytest.raises(ValueError, match=r"key 2 \(position 1\) comes after a key at position 9"):
        mha(x, torch.tensor([0, 9, 1, 2, 3, 4, 5]))


@pytest.mark.parametrize("name", NAMES)
def test_keys_sharing_a_position_are_refused(name):
    mha, x = _layer(name), _x()
    with pytest.raises(ValueError, match=r"key 3 \(position 2\) comes after a key at position 2"):
        mha(x, torch.tensor([0, 1, 2, 2, 3, 4, 5]))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=10, deadline=None)
@given(gaps=st.lists(st.integers(1, 2**40), min_size=T - 1, max_size=T - 1))
def test_any_increasing_positions_give_the_arange_result(name, gaps):
    """Positions only decide visibility: strictly increasing ones, gaps of any size
    included, see the same keys as ``arange``."""
    mha, x = _layer(name), _x()
    positions = torch.tensor([0, *gaps]).cumsum(0)
    torch.testing.assert_close(mha(x, positions), mha(x), **tolerances(torch.float64))


@pytest.mark.parametrize("name", NAMES)
def test_packed_segments_whose_positions_restart_equal_separate_runs(name):
    """Positions ``0..3, 0..2`` in one row are allowed when ``segment_ids`` separate them."""
    mha, x = _layer(name), _x()
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    packed = mha(x, positions, segment_ids=segments)
    alone = torch.cat((mha(x[:, :4]), mha(x[:, 4:])), dim=1)
    torch.testing.assert_close(packed, alone, **tolerances(torch.float64, ops=64))
    with pytest.raises(ValueError, match=r"key 4 \(position 0\)"):
        mha(x, positions)  # without the segments the second sequence sees the first


@pytest.mark.parametrize("name", NAMES)
def test_masked_padding_may_hold_any_position(name):
    """Left padding at position 0 before a sequence starting at 0: the mask hides it."""
    mha, x = _layer(name), _x(batch=2)
    positions = torch.tensor([[0, 0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6]])
    padding = positions.new_ones(2, T, dtype=torch.bool)
    padding[0, :2] = False
    out = mha(x, positions, key_padding_mask=padding)
    torch.testing.assert_close(out[0, 2:], mha(x[:1, 2:])[0], **tolerances(torch.float64, ops=64))


@pytest.mark.parametrize("name", NAMES)
def test_a_decoded_token_among_the_cached_positions_is_refused(name):
    """Position 12 after the cache's 10..14: the keys at 13 and 14 lie between the keys
    at or before 12 and the new token (stick-breaking: when it attends to itself)."""
    kwargs = {"attend_current": True} if name == "stick_breaking" else {}
    mha, x, cache = _layer(name, **kwargs), _x(), KVCache()
    mha(x[:, :5], torch.arange(10, 15), cache=cache)
    with pytest.raises(ValueError, match=r"key 5 \(position 12\) comes after a key at position 14"):
        mha(x[:, 5:6], torch.tensor([12]), cache=cache)


def _weights(name: str, q, k, pos):
    if name == "stick_breaking":
        return stick_breaking_weights(q, k, pos, pos, attend_current=True)
    if name == "fox":
        cum = torch.zeros(*q.shape[:-1], 1, dtype=q.dtype)
        return fox_weights(q, k, pos, pos, cum, cum)
    index = torch.arange(q.shape[-2]).double()[:, None].expand_as(q[..., :1])
    gates = torch.cat((torch.nn.functional.normalize(q, dim=-1), torch.ones_like(index), index), -1)
    return path_weights(q, k, pos, pos, gates, gates)


@pytest.mark.parametrize("name", NAMES)
def test_without_a_host_sync_the_rows_out_of_order_are_nan(name, monkeypatch):
    """Under ``torch.compile`` (and on an accelerator) nothing is read back to the host:
    exactly the queries that see keys out of order get NaN rows, the others are unchanged."""
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, D, generator=gen, dtype=torch.float64) for _ in range(2))
    swapped = torch.tensor([0, 1, 3, 2, 4])  # queries 2-4 see keys 2 and 3 out of order
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    got = _weights(name, q, k, swapped)
    assert not got[..., :2, :].isnan().any()
    assert got[..., 2:, :].isnan().all()
    torch.testing.assert_close(got[..., :2, :], _weights(name, q, k, torch.arange(5))[..., :2, :])
