"""``RotaryEmbedding(clockwise=True)``: every pair rotates by ``-theta`` (NanoChat's
``rotate_half`` with flipped signs) against the float64 reference at negated angles;
KV-cache re-rotation keeps the sign; the family table builds it for NanoChat.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from conftest import tolerances
from posenc.reference import rope_frequencies
from posenc.reference.rope_schemes import rotate_by_angles

B, H, T, D = 2, 3, 9, 16
DTYPES = [torch.float64, torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [D, 8])
def test_clockwise_rotates_by_minus_the_angle(dtype, interleaved, rotary_dim):
    enc = posenc.RotaryEmbedding(
        D, base=500.0, rotary_dim=rotary_dim, interleaved=interleaved, clockwise=True
    )
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(B, 1, T, D, generator=gen, dtype=torch.float64).to(dtype)
    positions = torch.randint(0, 3000, (B, T), generator=gen)
    theta = rope_frequencies(rotary_dim, 500.0)
    angles = -positions.numpy()[:, None, :, None].astype(np.float64) * theta  # [B, 1, T, R/2]
    for got, x in zip(enc.rotate(q, k, positions, positions), (q, k), strict=True):
        want = rotate_by_angles(x.double().numpy(), angles, interleaved=interleaved)
        ops = 8 * 3000 if dtype == torch.float64 else 4
        torch.testing.assert_close(
            got.double(), torch.as_tensor(want), **tolerances(dtype, ops=ops)
        )


def test_clockwise_cos_sin_are_the_angles_and_the_scores_flip_the_offset():
    plain, flipped = posenc.RotaryEmbedding(D), posenc.RotaryEmbedding(D, clockwise=True)
    pos = torch.arange(T)
    for a, b in zip(plain.cos_sin(pos), flipped.cos_sin(pos), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 1, T, D, generator=gen, dtype=torch.float64) for _ in range(2))
    q_cw, k_cw = flipped.rotate(q, k, pos, pos)
    q_mirror, k_mirror = plain.rotate(q, k, -pos, -pos)  # by -theta: at positions -m
    torch.testing.assert_close(
        q_cw @ k_cw.transpose(-1, -2),
        q_mirror @ k_mirror.transpose(-1, -2),
        **tolerances(torch.float64, ops=64),
    )


def test_clockwise_decoding_matches_prefix_forward_across_frequency_changes():
    scaling = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
    rope = posenc.RotaryEmbedding(8, scaling=scaling, clockwise=True)
    torch.manual_seed(0)
    mha = posenc.MultiHeadAttention(16, 2, position=rope).double().eval()
    x = torch.randn(1, 20, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    cache = posenc.KVCache()
    mha(x[:, :6], cache=cache)
    for t in range(6, x.shape[1]):
        step = mha(x[:, t : t + 1], cache=cache)
        rope.reset_length()
        full = mha(x[:, : t + 1])[:, -1:]
        torch.testing.assert_close(step, full, **tolerances(torch.float64, ops=64))


def test_clockwise_must_be_a_bool():
    with pytest.raises(TypeError, match="clockwise"):
        posenc.RotaryEmbedding(D, clockwise=1)


def test_nanochat_config_json_builds_a_clockwise_rotation():
    cfg = {
        "model_type": "nanochat", "hidden_size": 64, "num_attention_heads": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }  # fmt: skip
    enc = posenc.from_hf_config(cfg)
    assert enc.clockwise and not enc.interleaved and enc.head_dim == 16
    assert "clockwise" in posenc.hf.families.FAMILIES["nanochat"].summary
    assert not posenc.from_hf_config({**cfg, "model_type": "llama"}).clockwise
