"""The chunked backend's kernels: the offset path of ALiBi, T5, KERPLE and Sandwich
against the materialized bias (forward, gradients, memory), non-finite inputs that must
not cross a mask on any backend, and double backward (``gradgradcheck``)."""

from __future__ import annotations

import pytest
import torch

import posenc
from conftest import tolerances
from posenc import MultiHeadAttention
from posenc.attention import blocks
from posenc.attention.backends import Masking, attend, peak_tensor_bytes

OFFSET = ["alibi", "t5", "kerple", "sandwich"]
C, H = 16, 4
D = C // H
OPS = 64


def _encoding(name: str, causal: bool = True) -> posenc.PositionalEncoding:
    torch.manual_seed(0)
    return posenc.build(name, d_model=C, num_heads=H, head_dim=D, causal=causal).double()


def _qkv(batch: int, length: int, num_keys: int | None = None, *, grad: bool = False):
    gen = torch.Generator().manual_seed(1)
    shapes = [(batch, H, length, D)] + 2 * [(batch, H, num_keys or length, D)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_(grad) for s in shapes]


@pytest.mark.parametrize("name", OFFSET)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "length,num_keys,shift,start,block",
    [
        (37, 37, 0, 0, 8),
        (37, 37, 0, 0, 512),
        (5, 40, 35, 0, 2),
        (1, 23, 22, 0, 4),
        (30, 30, 0, -7, 8),
    ],
    ids=["blocks", "one-block", "cached", "decode", "negative"],
)
def test_offset_path_equals_the_materialized_bias(
    name, causal, length, num_keys, shift, start, block
):
    """Queries at ``start + shift + arange(Tq)``, keys at ``start + arange(Tk)``: prefill,
    KV cache, decoding step, negative positions."""
    position = _encoding(name, causal)
    q, k, v = _qkv(2, length, num_keys)
    q_pos, k_pos = torch.arange(length) + start + shift, torch.arange(num_keys) + start
    masking = Masking(causal, q_pos, k_pos)
    want = attend(q, k, v, position=position, masking=masking, backend="eager")
    got = attend(q, k, v, position=position, masking=masking, backend="chunked", block_size=block)
    torch.testing.assert_close(got, want, **tolerances(torch.float64, ops=OPS))


@pytest.mark.parametrize("name", ["t5", "kerple", "alibi"])
def test_offset_path_gradients_equal_the_materialized_bias(name):
    """Gradients of q, k, v and the encoding's parameters (T5's table, KERPLE's r1, r2)."""
    grads = []
    for backend in ("eager", "chunked"):
        position = _encoding(name)
        q, k, v = _qkv(2, 600, grad=True)
        pos = torch.arange(600)
        out = attend(q, k, v, position=position, masking=Masking(True, pos, pos), backend=backend)
        out.square().sum().backward()
        grads.append([q.grad, k.grad, v.grad, *(p.grad for p in position.parameters())])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, **tolerances(torch.float64, ops=OPS))


def test_offset_path_writes_no_score_block():
    """The bias is one row of Tq + Tk - 1 values per head, read as a view by every block."""
    heads, length = 8, 2048
    q, k, v = (torch.randn(1, heads, length, 8) for _ in range(3))
    position = posenc.build("alibi", num_heads=heads)
    pos = torch.arange(length)
    masking = Masking(True, pos, pos, aligned=True)
    peak, largest = peak_tensor_bytes(
        lambda: attend(q, k, v, position=position, masking=masking, backend="chunked")
    )
    assert largest <= q.numel() * q.element_size()  # nothing larger than q itself
    assert peak < 8 * q.numel() * q.element_size()


# ------------------------------------------------------------------ non-finite inputs

BACKENDS = ["sdpa", "eager", "chunked"]
ENCODINGS = ["nope", "rope", "alibi", "t5", "fire", "cope", "shaw"]


def _layer(name: str, backend: str) -> MultiHeadAttention:
    if backend == "sdpa" and name == "shaw":
        pytest.skip("backend='sdpa' cannot serve a VALUE term")
    torch.manual_seed(0)
    return MultiHeadAttention(C, H, position=name, backend=backend, block_size=3).double().eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nan_in_padding_does_not_reach_real_tokens(name, backend, dtype):
    """guarantees.md: every real token of every row is bit-identical to the clean run."""
    layer = _layer(name, backend).to(dtype)
    x = torch.randn(2, 10, C, dtype=dtype)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, 3] = mask[1, 0] = False
    poisoned = x.clone()
    poisoned[0, 3] = float("nan")  # row 1 holds no NaN: it must not move by one bit
    got, want = layer(poisoned, key_padding_mask=mask), layer(x, key_padding_mask=mask)
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_future_token_reaches_only_later_rows(name, backend, value):
    layer = _layer(name, backend)
    x = torch.randn(2, 10, C, dtype=torch.float64)
    poisoned = x.clone()
    poisoned[:, 7] = value
    got, want = layer(poisoned), layer(x)
    torch.testing.assert_close(got[:, :7], want[:, :7], rtol=0, atol=0)  # bit-identical
    assert got[:, 7:].isnan().all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_another_segment_does_not_reach(backend):
    layer = _layer("alibi", backend)
    x = torch.randn(1, 8, C, dtype=torch.float64)
    segments = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    poisoned = x.clone()
    poisoned[:, 6] = float("nan")
    got = layer(poisoned, pos, segment_ids=segments)
    want = layer(x, pos, segment_ids=segments)
    torch.testing.assert_close(got[:, :6], want[:, :6], rtol=0, atol=0)
    assert got[:, 6:].isnan().all()


# ------------------------------------------------------------------ double backward


@pytest.mark.parametrize(
    "name,backend",
    [
        ("alibi", "auto"),
        ("t5", "chunked"),
        ("fire", "chunked"),
        ("shaw", "chunked"),
        ("alibi", "eager"),
    ],
)
def test_attention_is_twice_differentiable(name, backend):
    """Offset path (ALiBi, T5), general path (FIRE), eager blocks (Shaw), eager backend."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(4, 2, position=name, backend=backend, block_size=2).double()
    x = torch.randn(1, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(layer, (x,))


def test_sdpa_backend_refuses_double_backward_by_name():
    layer = MultiHeadAttention(8, 2, position="alibi", backend="sdpa").double()
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="backend='sdpa' is not twice differentiable"):
        torch.autograd.grad(layer(x).sum(), x, create_graph=True)


def test_double_backward_through_dropout_raises():
    layer = MultiHeadAttention(8, 2, position="alibi", dropout=0.5, block_size=3).double().train()
    x = torch.randn(1, 7, 8, dtype=torch.float64, requires_grad=True)
    layer(x).sum().backward()  # an ordinary backward replays the dropout: fine
    with pytest.raises(RuntimeError, match="dropout"):
        torch.autograd.grad(layer(x).sum(), x, create_graph=True)


def _fresh_table(position, q, k, masking):
    """The table built anew (the cache emptied first)."""
    blocks.TABLES.forget(position)
    return blocks.offset_table(position, q, k, masking)


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "sandwich"])
def test_offset_table_is_reused_until_the_encoding_changes(name):
    position = _encoding(name)
    q, k, _ = _qkv(1, 24)
    pos = torch.arange(24)
    masking = Masking(True, pos, pos, aligned=True)
    with torch.no_grad():
        first = _fresh_table(position, q, k, masking)
        assert blocks.offset_table(position, q, k, masking) is first  # reused
        shorter = blocks.offset_table(position, q[..., :20, :], k[..., :20, :], masking)
        assert shorter.values.shape[-1] == 39  # another length: built for it
        for p in position.parameters():  # an in-place change, as an optimizer step makes
            p.mul_(1.5).add_(0.25)
        changed = blocks.offset_table(position, q, k, masking)
    assert changed is not first
    torch.testing.assert_close(changed.values, _fresh_table(position, q, k, masking).values)


def test_offset_table_follows_a_changed_attribute():
    position = _encoding("alibi")
    q, k, _ = _qkv(1, 16)
    pos = torch.arange(16)
    masking = Masking(False, pos, pos, aligned=True)  # later keys: the bias reads `causal`
    with torch.no_grad():
        before = blocks.offset_table(position, q, k, masking).values
        position.causal = False  # a plain attribute
        after = blocks.offset_table(position, q, k, masking).values
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, _fresh_table(position, q, k, masking).values)


def test_offset_table_with_gradients_is_built_every_call():
    position = _encoding("t5")
    q, k, v = _qkv(1, 16)
    pos = torch.arange(16)
    masking = Masking(True, pos, pos, aligned=True)
    blocks.TABLES.forget(position)
    first = blocks.offset_table(position, q, k, masking)
    assert first.values.requires_grad and position not in blocks.TABLES
    out = attend(q, k, v, position=position, masking=masking, backend="chunked")
    out.sum().backward()
    assert all(p.grad is not None for p in position.parameters())
