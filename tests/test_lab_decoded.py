"""Methods as deployed: dynamic NTK scored as decoded through a KV cache, and YaRN's
ramp bounds scaled to the training length (transformers' defaults kept as a row)."""

from __future__ import annotations

import pytest
import torch

from posenc import MultiHeadAttention, RotaryEmbedding
from posenc.encodings.rotary.context_scaling import YarnScaling, yarn_correction_range
from posenc.kv_cache import KVCache
from posenc.lab import LabConfig
from posenc.lab.decoded import DecodedDynamicNTK
from posenc.lab.model import seeded_model
from posenc.lab.variants import (
    YARN_BETAS,
    YARN_REFERENCE_LEN,
    build_encoding,
    scaling_spec,
    variants,
    yarn_betas,
)

HEAD_DIM, HEADS, L0, T = 8, 2, 8, 40


def _pair(position, dtype=torch.float64) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """A layer with ``position`` and a copy of its weights with the decoded encoding."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(HEAD_DIM * HEADS, HEADS, position=position).to(dtype)
    decoded = DecodedDynamicNTK(HEAD_DIM, factor=2.0, original=L0)
    twin = MultiHeadAttention(HEAD_DIM * HEADS, HEADS, position=decoded).to(dtype)
    twin.load_state_dict(layer.state_dict())
    return layer, twin


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decoded_dynamic_ntk_is_kv_cache_decoding(dtype):
    spec = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": L0}
    rope = RotaryEmbedding(HEAD_DIM, scaling=spec, length_policy="transformers")
    layer, twin = _pair(rope, dtype)
    x = torch.randn(3, T, HEAD_DIM * HEADS, dtype=dtype)
    cache = KVCache()
    with torch.no_grad():
        steps = [layer(x[:, t : t + 1], torch.tensor([t]), cache=cache) for t in range(T)]
        decoded = torch.cat(steps, 1)  # [B, T, C], one token at a time
        once = twin(x)
        whole = _pair(RotaryEmbedding(HEAD_DIM, scaling=spec), dtype)[0]
        short, full = whole(x[:, :L0]), whole(x)
    tol = 64 * torch.finfo(dtype).eps
    torch.testing.assert_close(once, decoded, rtol=tol, atol=tol)
    # a window of L0 is plain RoPE, as decoding is up to L0; a window of T > L0 stretches
    # every position's base to T's, which decoding does not
    torch.testing.assert_close(short, decoded[:, :L0], rtol=tol, atol=tol)
    assert (full - decoded).abs().max() > 1e3 * tol


def test_decoded_row_is_the_trained_model_up_to_its_length():
    config = LabConfig(encodings=("rope",), d_model=16, num_heads=2, train_len=16)
    model = seeded_model(lambda: build_encoding("rope", config), seed=0, vocab_size=256,
                         d_model=16, num_layers=2, num_heads=2)  # fmt: skip
    (row,) = [v for v in variants("rope", config) if v.label == "rope +dynamic +decoded"]
    tokens = torch.randint(0, 256, (2, 48))
    with torch.no_grad():
        plain = model(tokens)
        decoded = model.with_encoding(row.encoding("rope", config, 3.0))(tokens)
    tol = 64 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(decoded[:, :16], plain[:, :16], rtol=tol, atol=tol)
    assert not torch.allclose(decoded[:, 16:], plain[:, 16:])
    assert not row.tunable


def test_yarn_betas_keep_the_reference_split_of_the_pairs():
    fast, slow = yarn_betas(64)
    assert (fast, slow) == pytest.approx((YARN_BETAS[0] / 64, YARN_BETAS[1] / 64))
    for head_dim in (24, 64, 128):
        short = YarnScaling(factor=4.0, original_max_position_embeddings=64,
                            beta_fast=fast, beta_slow=slow)  # fmt: skip
        reference = YarnScaling(factor=4.0, original_max_position_embeddings=YARN_REFERENCE_LEN)
        assert yarn_correction_range(head_dim, 1e4, short) == yarn_correction_range(
            head_dim, 1e4, reference
        )
    spec = scaling_spec("yarn", 4.0, 64)
    hf = scaling_spec("yarn", 4.0, 64, hf_defaults=True)
    assert (spec["beta_fast"], spec["beta_slow"]) == (fast, slow)
    assert "beta_fast" not in hf  # transformers' defaults, 32 and 1
    config = LabConfig(encodings=("rope",))
    rope = build_encoding("rope", config, scaling=hf)
    assert (rope.scaling.beta_fast, rope.scaling.beta_slow) == YARN_BETAS


def test_decoded_refuses_bad_input():
    with pytest.raises(ValueError, match="head_dim must be even"):
        DecodedDynamicNTK(7, factor=2.0, original=8)
    with pytest.raises(ValueError, match="factor"):
        DecodedDynamicNTK(8, factor=-1.0, original=8)
    enc = DecodedDynamicNTK(8, factor=2.0, original=8)
    q = torch.zeros(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"q_pos must be \[5\]"):
        enc.rotate(q, q, torch.arange(4), torch.arange(5))
