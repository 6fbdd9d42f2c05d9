"""Dual chunk attention against its float64 reference (whole rotation matrices from the
index maps), plain RoPE below chunk_size, the paper's index bound, and decoding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import tolerances
from posenc import KVCache, MultiHeadAttention, RotaryEmbedding
from posenc.attention import Masking, attend
from posenc.encodings import DualChunkAttention, dual_chunk_indices
from posenc.reference import dual_chunk_attention, dual_chunk_query_index

H, D, T = 2, 8, 23
CHUNK, LOCAL = 8, 3  # chunks of 5 tokens: intra, successive and inter-chunk keys at T = 23


def _layer(**kwargs) -> MultiHeadAttention:
    enc = DualChunkAttention(8, H, chunk_size=CHUNK, local_size=LOCAL)
    return MultiHeadAttention(16, H, position=enc, **kwargs).double()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["eager", "chunked", "sdpa"])
def test_matches_reference(gen, backend, dtype):
    enc = DualChunkAttention(D, H, chunk_size=CHUNK, local_size=LOCAL)
    q, k, v = (torch.randn(1, H, T, D, generator=gen, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(T)
    out = attend(
        *(t.to(dtype) for t in (q, k, v)), position=enc, masking=Masking(True, pos, pos),
        backend=backend, block_size=4, gates=q.new_zeros(1, H, T, 0),
    )  # fmt: skip
    want = dual_chunk_attention(*(t[0].numpy() for t in (q, k, v)), chunk_size=CHUNK,
                                local_size=LOCAL)  # fmt: skip
    torch.testing.assert_close(
        out[0].double(), torch.from_numpy(want), **tolerances(dtype, ops=4 * D)
    )


def test_equals_rope_attention_up_to_chunk_size(gen):
    dca = _layer()
    rope = MultiHeadAttention(16, H, position=RotaryEmbedding(8)).double()
    rope.load_state_dict(dca.state_dict())
    x = torch.randn(2, CHUNK, 16, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(dca(x), rope(x), **tolerances(torch.float64, ops=64))
    longer = torch.randn(1, 2 * CHUNK, 16, generator=gen, dtype=torch.float64)
    assert not torch.allclose(dca(longer), rope(longer))  # beyond chunk_size they differ


@settings(max_examples=40, deadline=None)
@given(
    chunk=st.integers(2, 40),
    local_frac=st.floats(0.0, 0.49),
    length=st.integers(1, 120),
    start=st.integers(0, 1000),
)
def test_indices_stay_below_chunk_size_and_exact_in_the_local_window(
    chunk, local_frac, length, start
):
    local = int(local_frac * chunk)
    pos = torch.arange(start, start + length)
    q_index, k_index = dual_chunk_indices(pos, pos, chunk_size=chunk, local_size=local)
    visible = pos[None, :] <= pos[:, None]
    relative = (q_index - k_index[None, :])[visible]
    assert int(q_index.max()) <= chunk and int(k_index.max()) < chunk - local
    assert int(relative.min()) >= 0 and int(relative.max()) <= chunk  # the paper's bound
    distance = (pos[:, None] - pos[None, :])[visible]
    near = distance <= local
    assert torch.equal(relative[near], distance[near])  # the local window stays exact
    i, j = start + length - 1, start + length // 2
    want = dual_chunk_query_index(i, j, chunk_size=chunk, local_size=local)
    assert int(q_index[length - 1, length // 2]) == want


@pytest.mark.parametrize("prefill", [1, 7, 12])
def test_decoding_equals_full_forward(gen, prefill):
    mha = _layer(num_kv_heads=1)
    x = torch.randn(2, 17, 16, generator=gen, dtype=torch.float64)
    cache = KVCache()
    steps = [mha(x[:, :prefill], cache=cache)]
    steps += [mha(x[:, t : t + 1], cache=cache) for t in range(prefill, 17)]
    torch.testing.assert_close(torch.cat(steps, 1), mha(x), **tolerances(torch.float64, ops=64))


def test_gradients_flow(gen):
    mha = _layer()
    x = torch.randn(1, 12, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mha, (x,), fast_mode=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"chunk_size": 8, "local_size": 4}, ValueError, "local_size=4"),
        ({"chunk_size": 1, "local_size": 0}, ValueError, "chunk_size"),
        ({"chunk_size": 8, "local_size": -1}, ValueError, "local_size"),
        ({"chunk_size": 8, "local_size": 2, "causal": False}, ValueError, "causal"),
        ({"chunk_size": 8.0, "local_size": 2}, TypeError, "chunk_size"),
    ],
)
def test_bad_construction_raises(kwargs, error, match):
    with pytest.raises(error, match=match):
        DualChunkAttention(8, H, **kwargs)


def test_from_qwen_config():
    transformers = pytest.importorskip("transformers")
    dca = {"chunk_size": 262144, "local_size": 8192, "original_max_position_embeddings": 262144}
    config = transformers.Qwen2Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, rope_theta=1e7,
        dual_chunk_attention_config=dca,
    )  # fmt: skip
    raw = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e7,
           "dual_chunk_attention_config": dca}  # fmt: skip
    for source in (config, raw):
        enc = DualChunkAttention.from_hf_config(source)
        got = (enc.head_dim, enc.num_heads, enc.chunk_size, enc.local_size, enc.base)
        assert got == (16, 4, 262144, 8192, 1e7)
    with pytest.raises(ValueError, match="dual_chunk_attention_config"):
        DualChunkAttention.from_hf_config({"hidden_size": 64, "num_attention_heads": 4})
    yarn = {**raw, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ValueError, match="yarn"):
        DualChunkAttention.from_hf_config(yarn)


def test_float_positions_raise():
    with pytest.raises(TypeError, match="integer q_pos"):
        dual_chunk_indices(torch.arange(4.0), torch.arange(4), chunk_size=8, local_size=2)
