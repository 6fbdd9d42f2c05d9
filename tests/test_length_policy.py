"""The two length policies of the length-dependent RoPE scalings (dynamic NTK, LongRoPE).

``"transformers"`` must be a drop-in for transformers' own rotary modules over any
sequence of calls (dynamic NTK grows with the longest length and returns to the original
frequencies below the original length; LongRoPE picks its factors per call);
``"monotone"`` keeps the frequencies of the longest length seen (KV-consistent decoding,
tested in test_kv_rerotate.py). Configs are built here, never downloaded.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc

EPS32 = torch.finfo(torch.float32).eps
ORIGINAL = 64
LENGTHS = [32, 100, 80, 70, 40, 200, 64, 65, 150, 10]  # above, between, below the original


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def _llama(transformers):
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=2,
        max_position_embeddings=ORIGINAL,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    )
    ours = posenc.RotaryEmbedding(
        32,
        scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64},
        length_policy="transformers",
    )
    return modeling_llama.LlamaRotaryEmbedding(config), modeling_llama, ours


def _phi3(transformers):
    from transformers.models.phi3 import modeling_phi3

    short = [1.0 + 0.1 * i for i in range(16)]
    long = [2.0 + 0.5 * i for i in range(16)]
    rope = {"rope_type": "longrope", "short_factor": short, "long_factor": long}
    config = transformers.Phi3Config(
        hidden_size=64,
        num_attention_heads=2,
        max_position_embeddings=4 * ORIGINAL,
        original_max_position_embeddings=ORIGINAL,
        rope_parameters={**rope, "rope_theta": 10000.0},
    )
    scaling = {**rope, "factor": 4.0, "original_max_position_embeddings": ORIGINAL}
    ours = posenc.RotaryEmbedding(32, scaling=scaling, length_policy="transformers")
    return modeling_phi3.Phi3RotaryEmbedding(config), modeling_phi3, ours


@pytest.mark.parametrize("family", [_llama, _phi3], ids=["dynamic-ntk", "longrope"])
def test_transformers_policy_is_a_drop_in_over_any_sequence_of_calls(transformers, family, gen):
    theirs, modeling, ours = family(transformers)
    for length in LENGTHS:
        q = torch.randn(2, 2, length, 32, generator=gen)
        k = torch.randn(2, 1, length, 32, generator=gen)
        position_ids = torch.arange(length).expand(2, -1)
        cos, sin = theirs(q, position_ids)
        q_hf, k_hf = modeling.apply_rotary_pos_emb(q, k, cos, sin)
        q_ours, k_ours = ours.rotate(q, k, position_ids, position_ids)
        # transformers forms the angles in float32: ~|angle| * (1 + ln base) eps each
        atol = EPS32 * (8 + length * (1 + math.log(1e4))) * ours.attention_scale
        for mine, hf, x in ((q_ours, q_hf, q), (k_ours, k_hf, k)):
            torch.testing.assert_close(mine, hf, rtol=0, atol=atol * float(x.abs().max()))


def test_monotone_policy_keeps_the_longest_length(transformers):
    _, _, drop_in = _llama(transformers)
    monotone = posenc.RotaryEmbedding(
        32, scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}
    )
    x = torch.zeros(1, 1, 1, 32)
    for enc in (drop_in, monotone):
        for length in (200, 10):
            enc.rotate(x.expand(1, 1, length, 32), x.expand(1, 1, length, 32), None, None)
    assert monotone.seen_length == 200
    assert not torch.equal(monotone.inv_freq, drop_in.inv_freq)
    default = posenc.RotaryEmbedding(32)
    torch.testing.assert_close(drop_in.inv_freq, default.inv_freq, rtol=0, atol=0)


def test_unknown_length_policy_is_refused_by_name():
    with pytest.raises(ValueError, match=r"length_policy must be one of .* got 'latest'"):
        posenc.RotaryEmbedding(8, length_policy="latest")
