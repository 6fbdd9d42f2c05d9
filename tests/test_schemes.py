"""The RoPE schemes of current checkpoints against their float64 references: proportional
RoPE, M-RoPE (blocks, cyclic sections, GLM-4V), 2-D axial RoPE, position temperature and
MLA's decoupled RoPE; relative-position properties per axis; their use in attention.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import (
    AxialRope,
    Compose,
    KVCache,
    MLARope,
    MRoPE,
    MultiHeadAttention,
    PositionTemperature,
    RotaryEmbedding,
    YarnScaling,
)
from posenc.encodings.rotary.mla import mla_softmax_scale
from posenc.encodings.rotary.mrope import mrope_decode_positions, mrope_position_ids
from posenc.reference import rope_frequencies, yarn_attention_factor, yarn_frequencies
from posenc.reference import rope_schemes as ref

B, H, T, D = 2, 3, 7, 16
DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def _qk(dtype=torch.float64, *, seed=0, length=T, head_dim=D, batch=B):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, H, length, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(batch, 1, length, head_dim, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype)


def _check(got, want, dtype, *, angle=1.0):
    """Compare with the float64 reference; ``angle`` bounds the angles, whose float64
    rounding (relative to their size) is the reference's own error."""
    ops = 8 * math.ceil(1.0 + angle) if dtype == torch.float64 else 4
    torch.testing.assert_close(got.double(), torch.as_tensor(want), **tolerances(dtype, ops=ops))


def _assert_shift_invariant(enc, q, k, p_q, p_k, shift):
    """``<R(p_q) q, R(p_k) k>`` equals the score with both positions shifted by ``shift``."""
    a_q, a_k = enc.rotate(q, k, p_q, p_k)
    b_q, b_k = enc.rotate(q, k, p_q + shift, p_k + shift)
    angle = int(max(p.abs().max() for p in (p_q, p_k, p_q + shift, p_k + shift)))
    torch.testing.assert_close(
        (a_q * a_k).sum(-1), (b_q * b_k).sum(-1), **tolerances(torch.float64, ops=64 * (1 + angle))
    )


# --------------------------------------------------------------------------- proportional


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0, 0.3])
def test_proportional_frequencies_match_the_reference(fraction):
    spec = {"rope_type": "proportional", "partial_rotary_factor": fraction, "factor": 2.0}
    got, scale = posenc.rope_inv_freq(D, base=500.0, scaling=spec, dtype=torch.float64)
    want = ref.proportional_frequencies(D, 500.0, fraction, 2.0)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-15, atol=0)
    assert scale == 1.0 and (got[int(fraction * D // 2) :] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_proportional_rope_rotates_the_whole_head(dtype):
    spec = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    rope = RotaryEmbedding(D, scaling=spec)
    assert rope.rotary_dim == D and rope.base == 1e6
    q, k = _qk(dtype)
    pos = torch.arange(T) * 37
    got_q, _ = rope.rotate(q, k, pos, pos)
    angles = pos.double().numpy()[:, None] * ref.proportional_frequencies(D, 1e6, 0.25)
    _check(got_q, ref.rotate_by_angles(q.double().numpy(), angles), dtype, angle=T * 37)


# --------------------------------------------------------------------------- M-RoPE

MROPE_CASES = {  # name: (kwargs, rotary_dim)
    "qwen2vl": ({"mrope_section": [2, 3, 3]}, D),
    "qwen3vl": ({"mrope_section": [4, 2, 2], "mrope_interleaved": True}, D),
    "glm4v": ({"mrope_section": [1, 1, 2], "interleaved": True, "rotary_dim": 8}, 8),
}


def _mrope_reference(x, positions, kwargs, rotary_dim, base=10000.0):
    return ref.mrope_rotate(
        x.double().numpy(),
        positions.numpy(),
        rope_frequencies(rotary_dim, base),
        kwargs["mrope_section"],
        cyclic=kwargs.get("mrope_interleaved", False),
        interleaved=kwargs.get("interleaved", False),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MROPE_CASES)
@pytest.mark.parametrize("batched", [False, True])
def test_mrope_matches_the_reference(case, dtype, batched):
    kwargs, rotary_dim = MROPE_CASES[case]
    enc = MRoPE(D, **kwargs)
    q, k = _qk(dtype)
    g = torch.Generator().manual_seed(3)
    shape = (3, B, T) if batched else (3, T)
    q_pos = torch.randint(0, 300, shape, generator=g)
    k_pos = torch.randint(0, 300, shape, generator=g)
    got_q, got_k = enc.rotate(q, k, q_pos, k_pos)
    _check(got_q, _mrope_reference(q, q_pos, kwargs, rotary_dim), dtype, angle=300)
    _check(got_k, _mrope_reference(k, k_pos, kwargs, rotary_dim), dtype, angle=300)


@pytest.mark.parametrize("case", MROPE_CASES)
def test_mrope_of_text_positions_is_plain_rope(case):
    """Positions ``[T]`` / ``[B, T]`` are text: equal on the three axes, i.e. RoPE."""
    kwargs, rotary_dim = MROPE_CASES[case]
    enc = MRoPE(D, **kwargs)
    rope = RotaryEmbedding(D, rotary_dim=rotary_dim, interleaved=kwargs.get("interleaved", False))
    q, k = _qk()
    for pos in (torch.arange(T) + 5, torch.stack((torch.arange(T), torch.arange(T) * 2))):
        axes = pos.expand(3, *pos.shape)
        for got, want in zip(enc.rotate(q, k, pos, pos), rope.rotate(q, k, pos, pos), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        rotated = enc.rotate(q, k, axes, axes)
        for got, want in zip(rotated, rope.rotate(q, k, pos, pos), strict=True):
            torch.testing.assert_close(got, want, **tolerances(torch.float64))


@given(
    case=st.sampled_from(sorted(MROPE_CASES)),
    pos=st.lists(st.integers(0, 500), min_size=6, max_size=6),
    shift=st.lists(st.integers(-200, 200), min_size=3, max_size=3),
)
def test_mrope_scores_depend_on_the_position_difference_per_axis(case, pos, shift):
    kwargs, _ = MROPE_CASES[case]
    enc = MRoPE(D, **kwargs)
    q, k = _qk(length=1, batch=1)
    p_q, p_k = torch.tensor(pos[:3])[:, None], torch.tensor(pos[3:])[:, None]  # [3, 1]
    s = torch.tensor(shift)[:, None]
    _assert_shift_invariant(enc, q, k, p_q, p_k, s)


def test_mrope_position_ids_continue_into_decoding():
    """The decoding positions continue exactly as the ids of the longer sequence."""
    segments = [3, (2, 4, 6, 2.0), 2, (1, 2, 2)]
    prompt, delta = mrope_position_ids(segments, spatial_merge_size=2)
    full, _ = mrope_position_ids([*segments, 5], spatial_merge_size=2)
    length = prompt.shape[1]
    torch.testing.assert_close(full[:, :length], prompt)
    torch.testing.assert_close(mrope_decode_positions(length, 5, delta), full[:, length:])
    assert delta == int(prompt.max()) + 1 - length


def test_mrope_decoding_with_a_kv_cache_equals_the_full_forward():
    torch.manual_seed(0)
    enc = MRoPE(8, mrope_section=[1, 1, 2], mrope_interleaved=True)
    mha = MultiHeadAttention(16, 2, position=enc, num_kv_heads=1).double().eval()
    segments = [2, (1, 4, 2)]
    prompt, delta = mrope_position_ids(segments, spatial_merge_size=2)
    tail = mrope_decode_positions(prompt.shape[1], 3, delta)
    positions = torch.cat((prompt, tail), dim=1)  # [3, T]
    batch_pos = positions[:, None].expand(3, B, -1)  # [3, B, T]
    x = torch.randn(B, positions.shape[1], 16, dtype=torch.float64)
    for pos in (positions, batch_pos):
        full = mha(x, pos)
        cache, steps, start = KVCache(), [], 0
        for stop in (prompt.shape[1], prompt.shape[1] + 1, positions.shape[1]):
            steps.append(mha(x[:, start:stop], pos[..., start:stop], cache=cache))
            start = stop
        torch.testing.assert_close(torch.cat(steps, dim=1), full, **tolerances(torch.float64))


# --------------------------------------------------------------------------- axial


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("frequencies", ["shared", "alternating"])
@pytest.mark.parametrize("prefix", [0, 2])
def test_axial_rope_matches_the_reference(dtype, frequencies, prefix):
    grid = (3, 2)
    enc = AxialRope(D, base=100.0, frequencies=frequencies, num_prefix_tokens=prefix)
    q, k = _qk(dtype, length=6 + prefix)
    for pos in (posenc.axial_positions(grid), posenc.dinov3_positions(grid)):
        got_q, got_k = enc.rotate(q, k, pos, pos)
        for got, x in ((got_q, q), (got_k, k)):
            want = ref.axial_rotate(
                x.double().numpy(), pos.numpy(), D, 100.0,
                alternating=frequencies == "alternating", prefix=prefix,
            )  # fmt: skip
            _check(got, want, dtype, angle=8)


def test_axial_positions_follow_the_merge_blocks():
    pos = posenc.axial_positions((2, 4), merge_size=2)
    assert pos.tolist() == [
        [0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]
    ]  # fmt: skip
    assert posenc.axial_positions((2, 3)).tolist() == [[y, x] for y in range(2) for x in range(3)]


def test_axial_rope_takes_a_grid_shape():
    enc = AxialRope(D, num_prefix_tokens=1)
    q, k = _qk(length=1 + 8)
    pos = posenc.axial_positions((2, 4), merge_size=2)
    for got, want in zip(enc(q, k, grid=(2, 4), merge_size=2), enc(q, k, pos), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for kwargs in ({}, {"positions": pos, "grid": (2, 4)}):
        with pytest.raises(ValueError, match="positions or grid"):
            enc(q, k, **kwargs)
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        enc(q, k, grid=(3, 4), merge_size=2)


@given(
    pos=st.lists(st.integers(-50, 50), min_size=4, max_size=4),
    shift=st.lists(st.integers(-100, 100), min_size=2, max_size=2),
    frequencies=st.sampled_from(["shared", "alternating"]),
)
def test_axial_scores_depend_on_the_offset_per_axis(pos, shift, frequencies):
    enc = AxialRope(D, frequencies=frequencies)
    q, k = _qk(length=1, batch=1)
    p_q, p_k, s = torch.tensor([pos[:2]]), torch.tensor([pos[2:]]), torch.tensor([shift])
    _assert_shift_invariant(enc, q, k, p_q, p_k, s)


def test_axial_attention_is_equivariant_to_permuting_patches_with_their_positions():
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 2, position=AxialRope(D), causal=False).double()
    pos = posenc.axial_positions((3, 4))
    x = torch.randn(B, 12, 32, dtype=torch.float64)
    perm = torch.randperm(12)
    torch.testing.assert_close(
        mha(x[:, perm], pos[perm]), mha(x, pos)[:, perm], **tolerances(torch.float64, ops=64)
    )
    assert not torch.allclose(mha(x[:, perm], pos), mha(x, pos)[:, perm])


# --------------------------------------------------------------------------- temperature


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("beta", "length", "offset"), [(0.1, 4, 0), (0.5, 3, 1)])
def test_position_temperature_matches_the_reference(dtype, beta, length, offset):
    enc = PositionTemperature(beta, length, offset=offset)
    q, k = _qk(dtype)
    for pos in (torch.arange(T) * 3, torch.stack((torch.arange(T), torch.arange(T) + 9))):
        got_q, got_k = enc.rotate(q, k, pos, pos)
        scale = ref.position_temperature(pos.numpy(), beta, length, offset)
        scale = scale[:, None] if scale.ndim == 1 else scale[:, None, :, None]
        _check(got_q, q.double().numpy() * scale, dtype)
        assert got_k is k


def test_temperature_composes_with_rope_in_either_order():
    rope, temp = RotaryEmbedding(D), PositionTemperature(0.2, 2)
    q, k = _qk()
    pos = torch.arange(T) + 11
    a = Compose([rope, temp]).rotate(q, k, pos, pos)
    b = Compose([temp, rope]).rotate(q, k, pos, pos)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, **tolerances(torch.float64))


# --------------------------------------------------------------------------- MLA


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope_interleave", [False, True])
def test_mla_rope_matches_the_reference(dtype, rope_interleave):
    yarn = YarnScaling(4.0, 64, mscale=1.0, mscale_all_dim=0.5)
    enc = MLARope(24, 8, base=500.0, scaling=yarn, rope_interleave=rope_interleave)
    q, k = _qk(dtype, head_dim=24)
    pos = torch.stack((torch.arange(T) * 50, torch.arange(T)))
    freqs = yarn_frequencies(8, 500.0, 4.0, 64)
    factor = yarn_attention_factor(4.0, mscale=1.0, mscale_all_dim=0.5)
    got_q, got_k = enc.rotate(q, k, pos, pos)
    for got, x in ((got_q, q), (got_k, k)):
        want = ref.mla_rotate(
            x.double().numpy(), pos.numpy(), freqs,
            rope_interleave=rope_interleave, attention_scale=factor,
        )  # fmt: skip
        _check(got, want, dtype, angle=T * 50)
    mscale = 0.1 * 0.5 * math.log(4.0) + 1.0
    assert enc.softmax_scale == pytest.approx(24**-0.5 * mscale**2, rel=1e-15)


def test_mla_scale_queries_gives_the_softmax_scale_under_the_default_one():
    yarn = YarnScaling(4.0, 64, mscale=1.0, mscale_all_dim=1.0)
    plain = MLARope(24, 8, scaling=yarn)
    scaled = MLARope(24, 8, scaling=yarn, scale_queries=True)
    q, k = _qk(head_dim=24)
    pos = torch.arange(T)
    (pq, pk), (sq, sk) = plain.rotate(q, k, pos, pos), scaled.rotate(q, k, pos, pos)
    torch.testing.assert_close(sq * 24**-0.5, pq * plain.softmax_scale, **tolerances(torch.float64))
    torch.testing.assert_close(sk, pk, rtol=0, atol=0)
    assert mla_softmax_scale(24) == 24**-0.5


# --------------------------------------------------------------------------- bad input

DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
PROPORTIONAL = {"rope_type": "proportional", "partial_rotary_factor": 1.5}
BAD = [
    (lambda: MRoPE(D, mrope_section=[2, 3, 4]), "sums to 9"),
    (lambda: MRoPE(D, mrope_section=[4, 4]), "3 entries"),
    (lambda: MRoPE(D, mrope_section=[9, -1, 0]), "mrope_section[1]"),
    (lambda: MRoPE(D, mrope_section=[2, 3, 3], scaling=DYNAMIC), "dynamic"),
    (lambda: AxialRope(6), "divisible by 4"),
    (lambda: AxialRope(D, frequencies="diagonal"), "diagonal"),
    (lambda: posenc.axial_positions((3, 0)), "grid[1]"),
    (lambda: posenc.axial_positions((3,)), "(3,)"),
    (lambda: posenc.axial_positions((3, 4), merge_size=2), "(3, 4)"),
    (lambda: mrope_position_ids([2, (1, 3, 4)], spatial_merge_size=2), "(1, 3, 4)"),
    (lambda: mrope_position_ids([2, (1, 2)]), "(1, 2)"),
    (lambda: mrope_position_ids([]), "no tokens"),
    (lambda: RotaryEmbedding(D, scaling=PROPORTIONAL), "1.5"),
    (lambda: MLARope(8, 16), "rope_head_dim=16"),
    (lambda: PositionTemperature(0.1, 0), "length"),
]


@pytest.mark.parametrize(("make", "fragment"), BAD)
def test_bad_constructions_raise_naming_the_value(make, fragment):
    with pytest.raises(ValueError, match=None) as raised:
        make()
    assert fragment in str(raised.value)


def test_positions_of_the_wrong_rank_raise_naming_the_shape():
    q, k = _qk()
    mrope = MRoPE(D, mrope_section=[2, 3, 3])
    for pos, fragment in [
        (torch.zeros(3, B, T, 1, dtype=torch.long), "(3, 2, 7, 1)"),
        (torch.zeros(4, B, T, dtype=torch.long), "(4, 2, 7)"),
        (torch.zeros(3, T + 1, dtype=torch.long), "(3, 8)"),
    ]:
        with pytest.raises(ValueError, match=None) as raised:
            mrope.rotate(q, k, pos, pos)
        assert fragment in str(raised.value)
    q3, k3 = _qk(batch=3)
    with pytest.raises(ValueError, match="ambiguous"):
        mrope.rotate(q3, k3, torch.zeros(3, T, dtype=torch.long), torch.zeros(3, T))
    with pytest.raises(ValueError, match=r"\(3, 2, 7\)"):
        RotaryEmbedding(D).rotate(q, k, torch.zeros(3, B, T), torch.zeros(3, B, T))
    axial = AxialRope(D)
    for pos in (torch.arange(T), torch.zeros(T, 3), torch.zeros(T + 1, 2)):
        with pytest.raises(ValueError, match="axial RoPE q_pos"):
            axial.rotate(q, k, pos, pos)


def test_attention_rejects_bad_structured_positions():
    mha = MultiHeadAttention(32, 2, position=MRoPE(D, mrope_section=[2, 3, 3]))
    x = torch.randn(B, T, 32)
    with pytest.raises(ValueError, match=r"\(2, 2, 7\)"):
        mha(x, torch.zeros(2, B, T, dtype=torch.long))
    with pytest.raises(ValueError, match="axial RoPE positions"):
        MultiHeadAttention(32, 2, position=AxialRope(D))(x, torch.zeros(T, 3))
