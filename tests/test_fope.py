"""FoPE (Hua et al. 2025) against its float64 reference: shapes and layouts, clipping,
gradients into the coefficients, RoPE as the special case, KV-cache decoding, bad input.

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
from posenc import FourierRope, KVCache, MultiHeadAttention, RotaryEmbedding
from posenc.encodings.rotary.fourier import fope_frequencies
from posenc.reference import fourier_rope as ref

B, H, T, D = 2, 4, 6, 16


def _qk(dtype=torch.float64, *, seed=0, kv_heads=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, kv_heads, T, D, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype)


def _reference(enc, x, positions):
    coefs = [c.detach().double().numpy() for c in (enc.cos_coef, enc.sin_coef)]
    options = {"clipped_sin": enc.clipped_sin, "interleaved": enc.interleaved}
    rows = []
    for b in range(x.shape[0]):
        at = positions[b] if positions.dim() == 2 else positions
        row = x[b].double().numpy()
        rows.append(ref.fope_transform(row, at, enc.inv_freq.numpy(), *coefs, **options))
    return torch.from_numpy(np.stack(rows))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("coef_heads", "clipped_sin"), [(1, 0.0), (2, 0.0), (2, 1.0)])
def test_fope_matches_the_reference(dtype, interleaved, coef_heads, clipped_sin):
    torch.manual_seed(0)
    enc = FourierRope(
        D, coef_heads=coef_heads, max_len=24, sigma=0.5, clipped_sin=clipped_sin,
        interleaved=interleaved,
    )  # fmt: skip
    q, k = _qk(dtype)
    positions = torch.tensor([[0, 3, 5, 9, 30, 31], [2, 4, 6, 8, 10, 12]])
    got_q, got_k = enc.rotate(q, k, positions, positions)
    assert got_q.shape == q.shape and got_k.shape == k.shape and got_q.dtype == dtype
    # each output sums F coefficient terms at angles up to 31 rad (float32 cos/sin)
    ops = 16 * enc.inv_freq.numel() * (1 if dtype == torch.bfloat16 else 32)
    for got, x in ((got_q, q), (got_k, k)):
        want = _reference(enc, x, positions)
        torch.testing.assert_close(got.double(), want, **tolerances(dtype, ops=ops))


def test_the_floor_keeps_the_pairs_that_turn_within_the_training_length():
    base, train_len = 10000.0, 64
    kept = fope_frequencies(D, base=base, max_len=train_len)
    want = ref.fope_kept_frequencies(D, base, train_len)
    torch.testing.assert_close(kept.numpy(), want, **tolerances(torch.float64, ops=D))
    everything = fope_frequencies(D, base=base)
    assert torch.all(kept > 2 * math.pi / train_len)
    assert torch.all(everything[kept.numel() :] <= 2 * math.pi / train_len)
    assert fope_frequencies(D, num_inv_freq=3).numel() == 3


def test_clipped_pairs_pass_unchanged():
    torch.manual_seed(0)
    enc = FourierRope(D, coef_heads=2, max_len=16)
    q, k = _qk()
    kept = enc.inv_freq.numel()
    out_q, _ = enc(q, k)
    for half in (0, D // 2):
        span = slice(half + kept, half + D // 2)
        torch.testing.assert_close(out_q[..., span], q[..., span], rtol=0, atol=0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), interleaved=st.booleans())
def test_identity_coefficients_without_clipping_are_rope(seed, interleaved):
    torch.manual_seed(seed)
    enc = FourierRope(D, coef_heads=2, sigma=0.0, interleaved=interleaved)
    rope = RotaryEmbedding(D, interleaved=interleaved)
    q, k = _qk(seed=seed)
    positions = torch.randint(0, 500, (T,))
    got, want = enc.rotate(q, k, positions, positions), rope.rotate(q, k, positions, positions)
    tol = tolerances(torch.float64, ops=4 * (1 + int(positions.max())))  # angles in rad
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **tol)


def test_gradients_reach_the_coefficients():
    torch.manual_seed(0)
    enc = FourierRope(D, coef_heads=2, max_len=32)
    q, k = _qk(torch.float32)
    q.requires_grad_(True)
    out_q, out_k = enc(q, k)
    (out_q.square().sum() + out_k.sum()).backward()
    for grad in (enc.cos_coef.grad, enc.sin_coef.grad, q.grad):
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    enc, (q, k) = enc.double(), _qk()

    def transformed(cos_coef, sin_coef):
        params = {"cos_coef": cos_coef, "sin_coef": sin_coef}
        return torch.func.functional_call(enc, params, (q, k))

    coefs = (enc.cos_coef.detach().requires_grad_(True), enc.sin_coef.detach().requires_grad_(True))
    assert torch.autograd.gradcheck(transformed, coefs)


def test_decoding_with_a_kv_cache_equals_the_full_forward():
    torch.manual_seed(0)
    enc = FourierRope(8, max_len=12)
    mha = MultiHeadAttention(16, 2, position=enc, num_kv_heads=1).double().eval()
    x = torch.randn(B, 9, 16, dtype=torch.float64)
    with torch.no_grad():
        full = mha(x)
        cache, steps, start = KVCache(), [], 0
        for stop in (5, 6, 9):
            steps.append(mha(x[:, start:stop], cache=cache))
            start = stop
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **tolerances(torch.float64))


def test_the_registry_builds_it_for_a_model_shape():
    enc = posenc.build(
        "fope", d_model=64, num_heads=4, head_dim=16, max_len=32, causal=True, coef_heads=4
    )
    assert isinstance(enc, FourierRope) and enc.cos_coef.shape[0] == 4
    assert enc.inv_freq.numel() == fope_frequencies(16, max_len=32).numel()


def test_to_bfloat16_keeps_the_frequencies():
    enc = FourierRope(D, coef_heads=1, max_len=64).to(torch.bfloat16)
    assert enc.inv_freq.dtype == torch.float64


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"head_dim": 15}, "head_dim"),
        ({"head_dim": 16, "coef_heads": 0}, "coef_heads"),
        ({"head_dim": 16, "sigma": -1.0}, "sigma"),
        ({"head_dim": 16, "num_inv_freq": 9}, "num_inv_freq"),
        ({"head_dim": 16, "max_len": 1}, "max_len=1"),
        ({"head_dim": 16, "clipped_sin": float("nan")}, "clipped_sin"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FourierRope(**kwargs)


def test_bad_heads_and_positions_raise():
    enc = FourierRope(D, coef_heads=3)
    q, k = _qk()
    with pytest.raises(ValueError, match="multiple"):
        enc(q, k)
    enc = FourierRope(D, coef_heads=2)
    with pytest.raises(ValueError, match="q_pos"):
        enc.rotate(q, k, torch.arange(T + 1), torch.arange(T))
