"""T5 relative buckets: the bucket function against the reference and transformers, the
bias against the float64 reference (Toeplitz and general paths), shift invariance,
query blocks, sharing across layers, Hugging Face weight parity, score_mod, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import posenc
from conftest import tolerances
from posenc import T5RelativeBias, t5_relative_position_bucket
from posenc.encodings.t5 import t5_relative_bias
from posenc.reference import t5_bias as ref_t5_bias
from posenc.reference import t5_relative_position_bucket as ref_bucket

RELATIVE = torch.arange(-1000, 1001)
SETTINGS = [(32, 128), (64, 256), (16, 20), (8, 1000), (4, 3), (2, 5)]


def _settings():
    for num_buckets, max_distance in SETTINGS:
        for bidirectional in (True, False):
            per_side = num_buckets // 2 if bidirectional else num_buckets
            if per_side >= 2 and max_distance > per_side // 2:
                yield num_buckets, max_distance, bidirectional


def _qk(batch: int, heads: int, tq: int, tk: int, dtype=torch.float32):
    return torch.zeros(batch, heads, tq, 4, dtype=dtype), torch.zeros(
        batch, heads, tk, 4, dtype=dtype
    )


@pytest.mark.parametrize("num_buckets, max_distance, bidirectional", list(_settings()))
def test_buckets_match_reference(num_buckets, max_distance, bidirectional):
    kw = {"bidirectional": bidirectional, "num_buckets": num_buckets, "max_distance": max_distance}
    got = t5_relative_position_bucket(RELATIVE, **kw)
    np.testing.assert_array_equal(got.numpy(), ref_bucket(RELATIVE.numpy(), **kw))
    assert got.min() >= 0 and got.max() < num_buckets


@pytest.mark.parametrize("num_buckets, max_distance, bidirectional", list(_settings()))
def test_buckets_match_transformers(num_buckets, max_distance, bidirectional):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    kw = {"bidirectional": bidirectional, "num_buckets": num_buckets, "max_distance": max_distance}
    expected = t5.T5Attention._relative_position_bucket(RELATIVE, **kw)
    assert torch.equal(t5_relative_position_bucket(RELATIVE, **kw), expected)


def test_bucket_worked_values():
    # default encoder: 16 buckets per side, 8 exact, log-spaced to 128
    r = torch.tensor([0, -1, -7, -8, -127, -128, -5000, 1, 7, 5000])
    assert t5_relative_position_bucket(r).tolist() == [0, 1, 7, 8, 15, 15, 15, 17, 23, 31]
    # causal decoder: keys after the query share bucket 0, 16 exact buckets
    r = torch.tensor([5, 0, -1, -15, -16, -5000])
    assert t5_relative_position_bucket(r, bidirectional=False).tolist() == [0, 0, 1, 15, 16, 31]


def _reference(table, q_pos, k_pos, bidirectional, max_distance):
    qs = q_pos.reshape(-1, q_pos.shape[-1]).numpy()
    ks = k_pos.reshape(-1, k_pos.shape[-1]).numpy()
    rows = max(len(qs), len(ks))
    kw = {"bidirectional": bidirectional, "max_distance": max_distance}
    tab = table.detach().double().numpy()
    return np.stack([ref_t5_bias(tab, qs[b % len(qs)], ks[b % len(ks)], **kw) for b in range(rows)])


POSITIONS = [
    (torch.arange(300), torch.arange(300)),  # Toeplitz path, distances beyond max_distance
    (torch.arange(290, 300), torch.arange(300)),  # a query block against all keys
    (torch.tensor([[0, 1, 2, 3], [50, 51, 52, 53]]), torch.tensor([[0, 1, 2, 3], [5, 9, 40, 53]])),
    (torch.tensor([7, 3, 900, 1]), torch.tensor([0, 400, 2, 3, 899])),  # general path
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("q_pos, k_pos", POSITIONS)
def test_bias_matches_reference(dtype, bidirectional, q_pos, k_pos):
    enc = T5RelativeBias(3, bidirectional=bidirectional, max_distance=100).double()
    nn.init.normal_(enc.relative_attention_bias.weight, generator=torch.Generator().manual_seed(1))
    q, k = _qk(2, 3, q_pos.shape[-1], k_pos.shape[-1], dtype)
    bias = enc.score_bias(q, k, q_pos, k_pos)
    assert bias.dtype == dtype
    expected = torch.from_numpy(
        _reference(enc.relative_attention_bias.weight, q_pos, k_pos, bidirectional, 100)
    )
    assert bias.shape == expected.shape
    torch.testing.assert_close(bias.double(), expected, **tolerances(dtype, ops=1))


def test_toeplitz_path_equals_general_path():
    enc = T5RelativeBias(4)
    positions = torch.arange(40, 90)
    q, k = _qk(2, 4, 50, 50)
    fast = enc.score_bias(q, k, positions, positions)
    per_row = positions.repeat(2, 1)  # [B, T] with its own rows: elementwise path
    torch.testing.assert_close(
        enc.score_bias(q, k, per_row, per_row), fast.expand(2, -1, -1, -1), rtol=0, atol=0
    )


@pytest.mark.parametrize("start, stop", [(0, 1), (3, 9), (15, 16)])
def test_query_block_equals_rows_of_full_bias(start, stop):
    enc = T5RelativeBias(4, bidirectional=False)
    positions = torch.arange(16)
    q, k = _qk(1, 4, 16, 16)
    full = enc.score_bias(q, k, positions, positions)
    block = enc.score_bias(q[:, :, start:stop], k, positions[start:stop], positions)
    torch.testing.assert_close(block, full[:, :, start:stop], rtol=0, atol=0)


def test_pure_function_equals_module():
    enc = T5RelativeBias(4)
    q, k = _qk(1, 4, 6, 9)
    expected = enc.score_bias(q, k, torch.arange(3, 9), torch.arange(9))
    got = t5_relative_bias(enc.relative_attention_bias.weight, torch.arange(3, 9), torch.arange(9))
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_matches_hugging_face_t5_with_the_same_weights(bidirectional):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    from transformers import T5Config

    config = T5Config(d_model=32, num_heads=4, d_kv=8, is_decoder=not bidirectional)
    theirs = t5.T5Attention(config, has_relative_attention_bias=True)
    ours = T5RelativeBias(4, bidirectional=bidirectional)
    ours.load_state_dict({"relative_attention_bias.weight": theirs.relative_attention_bias.weight})
    q, k = _qk(1, 4, 200, 200)
    positions = torch.arange(200)
    expected = theirs.compute_bias(200, 200)
    torch.testing.assert_close(
        ours.score_bias(q, k, positions, positions), expected, rtol=0, atol=0
    )


def test_one_instance_shared_across_layers_gets_both_gradients():
    shared = T5RelativeBias(4)
    layers = nn.Sequential(
        posenc.MultiHeadAttention(16, 4, position=shared),
        posenc.MultiHeadAttention(16, 4, position=shared),
    )
    weight = shared.relative_attention_bias.weight
    assert sum(p is weight for p in layers.parameters()) == 1
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(0))
    layers(x).square().sum().backward()
    both = weight.grad.clone()
    weight.grad = None
    layers[1](layers[0](x).detach()).square().sum().backward()  # second use only
    second = weight.grad.clone()
    assert second.abs().sum() > 0 and (both - second).abs().sum() > 0


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("bidirectional", [True, False])
def test_score_mod_matches_dense_bias(bidirectional):
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=gen) for _ in range(3))
    enc = T5RelativeBias(2, num_buckets=8, max_distance=12, bidirectional=bidirectional)
    with torch.no_grad():
        enc.relative_attention_bias.weight.normal_(generator=gen)
        try:
            out = flex.flex_attention(q, k, v, score_mod=enc.score_mod())
        except Exception as err:  # pragma: no cover - depends on the torch build
            pytest.skip(f"flex_attention does not run here: {err}")
        bias = enc.score_bias(q, k, torch.arange(24), torch.arange(24))
    dense = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5 + bias, -1) @ v
    torch.testing.assert_close(out, dense, **tolerances(torch.float32, ops=64))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_buckets": 1}, "num_buckets must be >= 2, got 1"),
        ({"num_buckets": 33}, "even when bidirectional, got 33"),
        ({"num_buckets": 2}, "num_buckets=2"),
        ({"max_distance": 8}, "max_distance .* got 8"),
        ({"max_distance": 0}, "max_distance must be >= 1, got 0"),
        ({"num_buckets": 3, "bidirectional": False, "max_distance": 1}, "got 1"),
    ],
)
def test_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        T5RelativeBias(2, **kwargs)
    with pytest.raises(ValueError, match=match):
        t5_relative_position_bucket(torch.arange(3), **kwargs)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="num_heads must be >= 1, got 0"):
        T5RelativeBias(0)
    with pytest.raises(TypeError, match="float32"):
        t5_relative_position_bucket(torch.arange(3.0))
    enc = T5RelativeBias(2)
    q, k = _qk(1, 2, 3, 3)
    with pytest.raises(TypeError, match=r"q_pos has dtype torch\.float32"):
        enc.score_bias(q, k, torch.arange(3.0), torch.arange(3))
    with pytest.raises(ValueError, match=r"\(1, 2, 3, 4, 1\)"):
        enc.score_bias(q[..., None], k, torch.arange(3), torch.arange(3))
    with pytest.raises(ValueError, match="table must be"):
        t5_relative_bias(torch.zeros(32), torch.arange(3), torch.arange(3))


def test_causal_models_default_to_one_direction_of_buckets():
    assert posenc.T5RelativeBias(2).bidirectional
    assert not posenc.T5RelativeBias(2, causal=True).bidirectional
    assert posenc.T5RelativeBias(2, causal=True, bidirectional=True).bidirectional
    assert not posenc.build("t5", num_heads=2, causal=True).bidirectional
    assert posenc.build("t5", num_heads=2, causal=False).bidirectional
