"""p-RoPE (Barbero et al. 2025, sec. 6) against its float64 reference: the kept pairs rotate
as RoPE, the others not at all; p = 1 is RoPE, p = 0 is NoPE; scores depend on the offset.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import ProportionalScaling, RotaryEmbedding
from posenc.encodings import PRoPE
from posenc.reference import rope_schemes as ref

B, H, T, D = 2, 3, 9, 16
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
FRACTIONS = [0.0, 0.25, 0.5, 0.75, 1.0]


def _qk(dtype=torch.float64, *, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(2))
    return q.to(dtype), k.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fraction", FRACTIONS)
def test_p_rope_matches_the_reference(fraction, dtype):
    enc = PRoPE(D, fraction=fraction, base=500.0)
    q, k = _qk(dtype)
    pos = torch.arange(T) * 11
    got_q, got_k = enc.rotate(q, k, pos, pos)
    angles = pos.double().numpy()[:, None] * ref.proportional_frequencies(D, 500.0, fraction)
    angle = float(angles.max())
    ops = 8 * math.ceil(1.0 + angle) if dtype == torch.float64 else 4
    for got, x in ((got_q, q), (got_k, k)):
        want = torch.as_tensor(ref.rotate_by_angles(x.double().numpy(), angles))
        torch.testing.assert_close(got.double(), want, **tolerances(dtype, ops=ops))


@pytest.mark.parametrize("fraction", FRACTIONS)
def test_the_lowest_frequencies_are_flat(fraction):
    enc = PRoPE(D, fraction=fraction)
    kept = int(fraction * D // 2)
    assert enc.kept_pairs == kept and (enc.inv_freq[kept:] == 0).all()
    assert (enc.inv_freq[:kept] > 0).all()
    q, k = _qk()
    pos = torch.arange(T) * 5
    got_q, _ = enc.rotate(q, k, pos, pos)
    flat = torch.cat([torch.arange(kept, D // 2), torch.arange(D // 2 + kept, D)])
    torch.testing.assert_close(got_q[..., flat], q[..., flat], rtol=0, atol=0)


def test_p_1_is_rope_and_p_0_is_nope():
    q, k = _qk(torch.float32)
    pos = torch.arange(T) * 3
    rope_q, rope_k = RotaryEmbedding(D).rotate(q, k, pos, pos)
    one_q, one_k = PRoPE(D, fraction=1.0).rotate(q, k, pos, pos)
    torch.testing.assert_close(one_q, rope_q, rtol=0, atol=0)
    torch.testing.assert_close(one_k, rope_k, rtol=0, atol=0)
    zero_q, zero_k = PRoPE(D, fraction=0.0).rotate(q, k, pos, pos)
    torch.testing.assert_close(zero_q, q, rtol=0, atol=0)
    torch.testing.assert_close(zero_k, k, rtol=0, atol=0)


@settings(max_examples=25, deadline=None)
@given(
    fraction=st.floats(0.0, 1.0),
    p_q=st.integers(0, 500),
    p_k=st.integers(0, 500),
    shift=st.integers(-200, 200),
)
def test_scores_depend_on_the_offset_only(fraction, p_q, p_k, shift):
    enc = PRoPE(D, fraction=fraction)
    q, k = (x[:, :, :1] for x in _qk())
    a_q, a_k = enc.rotate(q, k, torch.tensor([p_q]), torch.tensor([p_k]))
    b_q, b_k = enc.rotate(q, k, torch.tensor([p_q + shift]), torch.tensor([p_k + shift]))
    angle = max(abs(p_q), abs(p_k), abs(p_q + shift), abs(p_k + shift))
    torch.testing.assert_close(
        (a_q * a_k).sum(-1), (b_q * b_k).sum(-1), **tolerances(torch.float64, ops=64 * (1 + angle))
    )


def test_registered_for_the_lab():
    enc = posenc.build("p_rope", d_model=64, num_heads=4, head_dim=D, max_len=32, causal=True)
    assert isinstance(enc, PRoPE) and enc.fraction == 0.75 and enc.rotary_dim == D
    assert "Barbero" in posenc.info("p_rope").paper


def test_proportional_scaling_accepts_zero():
    inv_freq, scale = posenc.rope_inv_freq(
        D, scaling=ProportionalScaling(partial_rotary_factor=0.0), dtype=torch.float64
    )
    np.testing.assert_array_equal(inv_freq.numpy(), ref.proportional_frequencies(D, 1e4, 0.0))
    assert scale == 1.0


@pytest.mark.parametrize(
    ("fraction", "error", "match"),
    [
        (-0.25, ValueError, "-0.25"),
        (1.5, ValueError, "1.5"),
        (float("nan"), ValueError, "nan"),
        ("0.5", TypeError, "'0.5'"),
        (True, TypeError, "True"),
    ],
)
def test_bad_fraction_is_refused(fraction, error, match):
    with pytest.raises(error, match=match):
        PRoPE(D, fraction=fraction)
