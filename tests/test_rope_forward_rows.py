"""``RotaryEmbedding.forward`` without positions slices its cos/sin from the cached table
(and keeps the slices of a length from 0): it must rotate exactly as ``rotate`` at the
explicit positions, whatever lengths, offsets and dtypes came before."""

from __future__ import annotations

import pytest
import torch

from posenc import RotaryEmbedding

D = 16


@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}],
)
def test_forward_equals_rotate_at_the_positions_across_lengths(scaling):
    rope = RotaryEmbedding(D, scaling=scaling, max_len=64)
    gen = torch.Generator().manual_seed(0)
    f32, f64, bf16 = torch.float32, torch.float64, torch.bfloat16
    calls = [(8, 0, f32), (300, 0, f64), (8, 0, f32), (1, 300, bf16), (40, 5000, f32), (8, 0, f32)]
    longest = 0
    for t, offset, dtype in calls:
        q = torch.randn(1, 2, t, D, generator=gen).to(dtype)
        k = torch.randn(1, 2, t, D, generator=gen).to(dtype)
        positions = torch.arange(offset, offset + t)
        got_q, got_k = rope(q, k, offset=offset)
        longest = max(longest, offset + t)  # dynamic NTK's frequencies: the longest so far
        want = RotaryEmbedding(D, scaling=scaling, max_len=64)
        want.observe_length(longest)
        want_q, want_k = want.rotate(q, k, positions, positions)
        torch.testing.assert_close(got_q, want_q, rtol=0, atol=0)
        torch.testing.assert_close(got_k, want_k, rtol=0, atol=0)
