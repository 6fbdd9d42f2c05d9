"""VideoRoPE (Wei et al. 2025) against its float64 reference: the frequency allocation
(time on the lowest frequencies), the diagonal layout with temporal spacing, RoPE for text,
the relative property on each axis, KV-cache decoding, and bad input.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import KVCache, MultiHeadAttention, RotaryEmbedding
from posenc.encodings.rotary.mrope import mrope_decode_positions
from posenc.encodings.rotary.video_rope import (
    VideoRoPE,
    videorope_pair_axes,
    videorope_position_ids,
)
from posenc.reference import video_rope as ref

B, H, D = 2, 3, 16
SEGMENTS = [3, (2, 4, 6), 2, (1, 2, 2), 1]  # text, a 2-frame video, text, an image, text


def _qk(length, dtype=torch.float64, *, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, length, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, 1, length, D, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype)


@pytest.mark.parametrize("delta", [2.0, 1.0, 0.5, 3.0])
@pytest.mark.parametrize("merge", [1, 2])
def test_positions_match_the_reference(delta, merge):
    positions, rope_delta = videorope_position_ids(
        SEGMENTS, spatial_merge_size=merge, temporal_stride=delta
    )
    want = ref.videorope_positions(SEGMENTS, merge, delta)
    torch.testing.assert_close(positions.double(), torch.from_numpy(want), rtol=0, atol=0)
    assert positions.dtype == (torch.int64 if delta.is_integer() else torch.float64)
    assert rope_delta == want[0].max() + 1 - want.shape[1]


def test_frames_are_centred_on_the_text_diagonal():
    positions, _ = videorope_position_ids([4, (3, 3, 5)], temporal_stride=2)
    grid = positions[:, 4:].reshape(3, 3, 3, 5)  # [axis, frame, row, column]
    centre = grid[:, :, 1, 2]  # the middle patch of each frame
    assert torch.equal(centre[0], centre[1]) and torch.equal(centre[0], centre[2])
    torch.testing.assert_close(centre[0], torch.tensor([4, 6, 8]))  # delta = 2 apart


def test_time_takes_the_lowest_frequencies_and_space_alternates():
    assert videorope_pair_axes([16, 24, 24]) == [1, 2] * 24 + [0] * 16
    enc = VideoRoPE(128)
    assert enc.mrope_section == (16, 24, 24)
    inv_freq = enc.rope.inv_freq
    time = enc._axes == 0
    assert inv_freq[time].max() < inv_freq[~time].min()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_rotation_matches_the_reference(dtype):
    enc = VideoRoPE(D, mrope_section=[2, 3, 3])
    positions, _ = videorope_position_ids(SEGMENTS, temporal_stride=0.5)
    q, k = _qk(positions.shape[1], dtype)
    got_q, got_k = enc.rotate(q, k, positions, positions)
    angle = float(positions.abs().max())
    ops = 8 * math.ceil(1.0 + angle) if dtype == torch.float64 else 4 * math.ceil(1.0 + angle)
    tol = tolerances(dtype, ops=ops)
    for got, x in ((got_q, q), (got_k, k)):
        want = ref.videorope_rotate(x.double().numpy(), positions.numpy(), 10000.0, (2, 3, 3))
        torch.testing.assert_close(got.double(), torch.from_numpy(want), **tol)


@settings(max_examples=10, deadline=None)
@given(start=st.integers(0, 1000), length=st.integers(1, 12))
def test_text_positions_are_plain_rope(start, length):
    enc, rope = VideoRoPE(D), RotaryEmbedding(D)
    q, k = _qk(length)
    text = torch.arange(length) + start
    want = rope.rotate(q, k, text, text)
    for positions in (text, text.expand(3, -1)):
        for got, expected in zip(enc.rotate(q, k, positions, positions), want, strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


@settings(max_examples=15, deadline=None)
@given(axis=st.integers(0, 2), shift=st.integers(-500, 500), seed=st.integers(0, 2**16))
def test_scores_are_relative_on_each_axis(axis, shift, seed):
    enc = VideoRoPE(D)
    positions, _ = videorope_position_ids(SEGMENTS)
    q, k = _qk(positions.shape[1], seed=seed)
    moved = positions.clone()
    moved[axis] += shift
    a_q, a_k = enc.rotate(q, k, positions, positions)
    b_q, b_k = enc.rotate(q, k, moved, moved)
    scores = a_q @ a_k.transpose(-1, -2)
    angle = int(moved.abs().max())
    tol = tolerances(torch.float64, ops=64 * (1 + angle))
    torch.testing.assert_close(b_q @ b_k.transpose(-1, -2), scores, **tol)


def test_decoding_with_a_kv_cache_equals_the_full_forward():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, position=VideoRoPE(8), num_kv_heads=1).double().eval()
    prompt, rope_delta = videorope_position_ids([2, (2, 2, 4), 1], temporal_stride=2)
    positions = torch.cat((prompt, mrope_decode_positions(prompt.shape[1], 3, rope_delta)), 1)
    x = torch.randn(B, positions.shape[1], 16, dtype=torch.float64)
    full = mha(x, positions)
    cache, steps, start = KVCache(), [], 0
    for stop in (prompt.shape[1], prompt.shape[1] + 1, positions.shape[1]):
        steps.append(mha(x[:, start:stop], positions[:, start:stop], cache=cache))
        start = stop
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **tolerances(torch.float64))


def test_the_registry_builds_it():
    enc = posenc.build("video_rope", d_model=64, num_heads=4, head_dim=16, max_len=32)
    assert isinstance(enc, VideoRoPE) and enc.position_shape == "[A, T]"


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: VideoRoPE(D, mrope_section=[2, 4, 2]), "s_h == s_w"),
        (lambda: VideoRoPE(D, mrope_section=[4, 3, 3]), "sums to 10"),
        (lambda: VideoRoPE(15), "head_dim"),
        (lambda: videorope_position_ids([(2, 3, 4)], spatial_merge_size=2), "divisible"),
        (lambda: videorope_position_ids([(2, 4)]), r"\(t, h, w\)"),
        (lambda: videorope_position_ids([2], temporal_stride=0), "temporal_stride"),
        (lambda: videorope_position_ids([0]), "no tokens"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
