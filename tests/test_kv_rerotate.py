"""KV-cache decoding with length-dependent RoPE scalings (dynamic NTK, LongRoPE).

Policy under test: before a cached forward that reaches length n, the encoding picks
the frequencies for n and re-rotates the cached keys to them, so the new token attends
exactly as the last token of a full forward over the n-token prefix does.
"""

from __future__ import annotations

import pytest
import torch

import posenc
from conftest import tolerances

L0 = 8
SCALINGS = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": L0},
    "longrope": {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": L0,
        "short_factor": [1.0, 1.1, 1.2, 1.3],
        "long_factor": [1.5, 2.0, 3.0, 4.0],
    },
}


def _layer(scaling: dict, shared: posenc.RotaryEmbedding | None = None):
    rope = shared or posenc.RotaryEmbedding(8, scaling=scaling)
    torch.manual_seed(0)
    mha = posenc.MultiHeadAttention(16, 2, position=rope).double().eval()
    return mha, rope


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_decoding_matches_prefix_forward_across_frequency_changes(name):
    mha, rope = _layer(SCALINGS[name])
    x = torch.randn(1, 3 * L0, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cache = posenc.KVCache()
    mha(x[:, : L0 - 2], cache=cache)  # prefill below the original length
    for t in range(L0 - 2, x.shape[1]):
        step = mha(x[:, t : t + 1], cache=cache)
        rope.reset_length()
        full = mha(x[:, : t + 1])[:, -1:]  # a fresh full forward over the prefix
        torch.testing.assert_close(step, full, **tolerances(torch.float64, ops=64))
    assert rope.seen_length == x.shape[1]


def test_shared_encoding_keeps_every_layers_cache_consistent():
    scaling = SCALINGS["dynamic"]
    first, rope = _layer(scaling)
    second, _ = _layer(scaling, shared=rope)
    x = torch.randn(1, 2 * L0, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    caches = [posenc.KVCache(), posenc.KVCache()]
    for layer, cache in zip((first, second), caches, strict=True):
        layer(x[:, :L0], cache=cache)
    for t in range(L0, x.shape[1]):
        for layer, cache in zip((first, second), caches, strict=True):
            step = layer(x[:, t : t + 1], cache=cache)
            rope.reset_length()
            full = layer(x[:, : t + 1])[:, -1:]
            rope.observe_length(t + 1)
            torch.testing.assert_close(step, full, **tolerances(torch.float64, ops=64))
