"""The float64 NumPy reference itself: the formulas, the worked example, the backward."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc.reference import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    interpolate_table,
    sinusoidal_frequencies,
    sinusoidal_positional_encoding,
    sinusoidal_positional_encoding_at,
)

even_dims = st.integers(1, 128).map(lambda n: 2 * n)

# ----------------------------------------------------------------- sinusoidal function


def test_position_zero_is_sin0_cos0():
    pe = sinusoidal_positional_encoding(1, 64)
    np.testing.assert_allclose(pe[0, 0::2], np.zeros(32), atol=1e-15)
    np.testing.assert_allclose(pe[0, 1::2], np.ones(32), atol=1e-15)


def test_worked_example_d4_l3():
    # Hand-computed table of the deep-dive seed (d_model = 4, L = 3), to 4 decimals.
    expected = [
        [0.0000, 1.0000, 0.0000, 1.0000],
        [0.8415, 0.5403, 0.0100, 0.99995],
        [0.9093, -0.4161, 0.0200, 0.9998],
    ]
    np.testing.assert_array_almost_equal(sinusoidal_positional_encoding(3, 4), expected, decimal=4)


@pytest.mark.parametrize("d_model", [4, 64, 512, 4096])
def test_log_space_frequencies_match_direct_formula(d_model):
    i = np.arange(d_model // 2, dtype=np.float64)
    direct = 1.0 / (10000.0 ** (2.0 * i / d_model))
    np.testing.assert_allclose(sinusoidal_frequencies(d_model), direct, rtol=1e-12)


@pytest.mark.parametrize("base", [10000.0, 500.0, 1e6])
def test_columns_interleave_sin_and_cos_of_the_paper_formula(base):
    length, d_model = 40, 16
    pe = sinusoidal_positional_encoding(length, d_model, base=base)
    pos = np.arange(length, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angle = pos / base ** (two_i / d_model)
    np.testing.assert_allclose(pe[:, 0::2], np.sin(angle), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(pe[:, 1::2], np.cos(angle), rtol=1e-12, atol=1e-15)


@given(length=st.integers(1, 200), d_model=even_dims)
def test_sinusoidal_properties(length, d_model):
    pe = sinusoidal_positional_encoding(length, d_model)
    assert pe.shape == (length, d_model) and pe.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(pe, axis=1), np.sqrt(d_model / 2), rtol=1e-12)
    assert pe.min() >= -1.0 and pe.max() <= 1.0
    np.testing.assert_allclose(pe[0], np.tile([0.0, 1.0], d_model // 2), atol=1e-15)


def test_encoding_at_arbitrary_positions():
    table = sinusoidal_positional_encoding(10, 8)
    np.testing.assert_array_equal(sinusoidal_positional_encoding_at(np.arange(10), 8), table)
    omega = sinusoidal_frequencies(8)
    at = sinusoidal_positional_encoding_at(np.array([[2.5, -3.0]]), 8)
    assert at.shape == (1, 2, 8)
    np.testing.assert_allclose(at[0, 0, 0::2], np.sin(2.5 * omega), rtol=1e-14)
    np.testing.assert_allclose(at[0, 1, 1::2], np.cos(-3.0 * omega), rtol=1e-14)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((5, 7), "d_model must be even, got 7"),
        ((5, 0), "d_model must be >= 1, got 0"),
        ((0, 8), "seq_len must be >= 1, got 0"),
        ((-3, 8), "seq_len must be >= 1, got -3"),
    ],
)
def test_sinusoidal_bad_sizes_raise(args, message):
    with pytest.raises(ValueError, match=message):
        sinusoidal_positional_encoding(*args)


def test_sinusoidal_bad_base_and_types_raise():
    with pytest.raises(ValueError, match=r"base must be > 0, got 0\.0"):
        sinusoidal_positional_encoding(4, 8, base=0.0)
    with pytest.raises(TypeError, match=r"seq_len must be an integer, got 2\.5"):
        sinusoidal_positional_encoding(2.5, 8)


# ----------------------------------------------------------------- sinusoidal class


def test_sinusoidal_class_forward_broadcasts_over_batch():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 10, 16))
    before = X.copy()
    module = SinusoidalPositionalEncoding(32, 16)
    out = module.forward(X)
    pe = sinusoidal_positional_encoding(10, 16)
    for b in range(3):
        np.testing.assert_array_equal(out[b], X[b] + pe)
    np.testing.assert_array_equal(X, before)


def test_sinusoidal_class_get_encoding_is_a_copy_of_the_table():
    module = SinusoidalPositionalEncoding(32, 16)
    enc = module.get_encoding(12)
    np.testing.assert_array_equal(enc, sinusoidal_positional_encoding(12, 16))
    enc[:] = 0.0
    np.testing.assert_array_equal(module.get_encoding(12), sinusoidal_positional_encoding(12, 16))


def test_sinusoidal_class_bad_input_raises():
    module = SinusoidalPositionalEncoding(8, 4)
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_seq_len 8"):
        module.forward(np.zeros((1, 9, 4)))
    with pytest.raises(ValueError, match="seq_len 9 exceeds max_seq_len 8"):
        module.get_encoding(9)
    with pytest.raises(ValueError, match=r"shape \[B, L, d_model\], got shape \(8, 4\)"):
        module.forward(np.zeros((8, 4)))
    with pytest.raises(ValueError, match="last dimension 6, expected d_model=4"):
        module.forward(np.zeros((1, 3, 6)))
    with pytest.raises(ValueError, match="d_model must be even, got 5"):
        SinusoidalPositionalEncoding(8, 5)
    with pytest.raises(ValueError, match="max_seq_len must be >= 1, got 0"):
        SinusoidalPositionalEncoding(0, 4)


# ----------------------------------------------------------------- learned


def test_learned_init_is_seeded_normal():
    a = LearnedPositionalEncoding(64, 32, seed=1)
    b = LearnedPositionalEncoding(64, 32, rng=np.random.default_rng(1))
    c = LearnedPositionalEncoding(64, 32, seed=2)
    np.testing.assert_array_equal(a.embedding, b.embedding)
    assert not np.array_equal(a.embedding, c.embedding)
    assert a.embedding.shape == (64, 32) and a.embedding.dtype == np.float64
    np.testing.assert_array_equal(
        a.embedding, np.random.default_rng(1).standard_normal((64, 32)) * 0.02
    )
    np.testing.assert_array_equal(a.grad_embedding, np.zeros((64, 32)))


def test_learned_forward_adds_the_first_rows():
    module = LearnedPositionalEncoding(16, 8, seed=0)
    X = np.random.default_rng(1).standard_normal((2, 5, 8))
    np.testing.assert_array_equal(module.forward(X), X + module.embedding[:5])


def test_learned_backward_sums_over_batch_and_zeroes_unused_rows():
    module = LearnedPositionalEncoding(16, 8, seed=0)
    rng = np.random.default_rng(1)
    module.forward(rng.standard_normal((3, 5, 8)))
    grad = rng.standard_normal((3, 5, 8))
    grad_x = module.backward(grad)
    np.testing.assert_allclose(module.grad_embedding[:5], grad.sum(axis=0), atol=1e-15)
    np.testing.assert_array_equal(module.grad_embedding[5:], 0.0)
    np.testing.assert_array_equal(grad_x, grad)
    kept = grad.copy()
    grad_x[:] = 0.0  # a copy: the caller's gradient is untouched
    np.testing.assert_array_equal(grad, kept)


def test_learned_gradient_is_b_times_single_example():
    B, L, d = 4, 6, 8
    upstream = np.random.default_rng(3).standard_normal((L, d))
    module = LearnedPositionalEncoding(10, d, seed=0)
    module.forward(np.zeros((1, L, d)))
    module.backward(upstream[None])
    single = module.grad_embedding.copy()
    module.forward(np.zeros((B, L, d)))
    module.backward(np.broadcast_to(upstream, (B, L, d)))
    np.testing.assert_allclose(module.grad_embedding[:L], B * single[:L], atol=1e-12)


def test_learned_backward_matches_finite_differences():
    module = LearnedPositionalEncoding(6, 3, seed=0)
    rng = np.random.default_rng(4)
    X, weights = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 4, 3))

    def loss() -> float:
        return float((weights * module.forward(X)).sum())

    loss()
    module.backward(weights)
    analytic = module.grad_embedding.copy()
    numeric = np.zeros_like(analytic)
    h = 1e-6
    for idx in np.ndindex(*analytic.shape):
        module.embedding[idx] += h
        up = loss()
        module.embedding[idx] -= 2 * h
        down = loss()
        module.embedding[idx] += h
        numeric[idx] = (up - down) / (2 * h)
    np.testing.assert_allclose(analytic, numeric, atol=1e-8)


def test_learned_explicit_positions_scatter_add_repeats():
    module = LearnedPositionalEncoding(8, 2, seed=0)
    X = np.zeros((2, 4, 2))
    packed = np.array([[0, 1, 0, 1], [5, 6, 7, 0]])
    np.testing.assert_array_equal(module.forward(X, packed), module.embedding[packed])
    grad = np.ones((2, 4, 2))
    module.backward(grad)
    counts = np.bincount(packed.ravel(), minlength=8)[:, None]
    np.testing.assert_array_equal(module.grad_embedding, counts * np.ones((8, 2)))
    shared = np.array([3, 3, 1, 0])  # [L]: summed over the batch, then over repeats
    module.forward(X, shared)
    module.backward(grad)
    np.testing.assert_array_equal(module.grad_embedding[:, 0], [2, 2, 0, 4, 0, 0, 0, 0])


def test_learned_backward_recomputes_instead_of_accumulating():
    module = LearnedPositionalEncoding(4, 2, seed=0)
    for _ in range(2):
        module.forward(np.zeros((1, 3, 2)))
        module.backward(np.ones((1, 3, 2)))
    np.testing.assert_array_equal(module.grad_embedding[:3], 1.0)


def test_learned_bad_input_raises():
    module = LearnedPositionalEncoding(4, 2, seed=0)
    with pytest.raises(RuntimeError, match="backward called before forward"):
        module.backward(np.zeros((1, 3, 2)))
    with pytest.raises(ValueError, match="sequence length 5 exceeds max_seq_len 4"):
        module.forward(np.zeros((1, 5, 2)))
    module.forward(np.zeros((1, 3, 2)))
    with pytest.raises(
        ValueError, match=r"grad_output has shape \(2, 3, 2\), expected \(1, 3, 2\)"
    ):
        module.backward(np.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match="got min 0 and max 4"):
        module.forward(np.zeros((1, 2, 2)), np.array([0, 4]))
    with pytest.raises(ValueError, match="got min -1"):
        module.forward(np.zeros((1, 2, 2)), np.array([-1, 0]))
    with pytest.raises(TypeError, match="positions must be integers, got dtype float64"):
        module.forward(np.zeros((1, 2, 2)), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"positions must be \[L\] or \[B, L\] with L=2"):
        module.forward(np.zeros((1, 2, 2)), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="positions have batch 2, X has batch 1"):
        module.forward(np.zeros((1, 2, 2)), np.zeros((2, 2), dtype=int))
    with pytest.raises(ValueError, match="max_seq_len must be >= 1, got 0"):
        LearnedPositionalEncoding(0, 2)
    with pytest.raises(ValueError, match="d_model must be >= 1, got -2"):
        LearnedPositionalEncoding(4, -2)
    with pytest.raises(ValueError, match=r"std must be >= 0\.0, got -1\.0"):
        LearnedPositionalEncoding(4, 2, std=-1.0)


# ----------------------------------------------------------------- interpolation


def test_interpolate_worked_example():
    # align_corners=False: rows 0..3 read source coordinates -0.25 (clamped), 0.25, 0.75, 1.25.
    out = interpolate_table(np.array([[0.0], [1.0]]), 4)
    np.testing.assert_allclose(out[:, 0], [0.0, 0.25, 0.75, 1.0], atol=1e-15)
    down = interpolate_table(np.arange(8.0).reshape(4, 2), 2)  # coordinates 0.5 and 2.5
    np.testing.assert_allclose(down, [[1.0, 2.0], [5.0, 6.0]], atol=1e-15)


@given(src=st.integers(1, 40), dst=st.integers(1, 120), seed=st.integers(0, 2**16))
def test_interpolate_properties(src, dst, seed):
    table = np.random.default_rng(seed).standard_normal((src, 3))
    out = interpolate_table(table, dst)
    assert out.shape == (dst, 3)
    assert np.all(out >= table.min(axis=0) - 1e-12) and np.all(out <= table.max(axis=0) + 1e-12)
    if dst == src:
        np.testing.assert_allclose(out, table, atol=1e-15)
    if dst >= src:  # upsampling keeps both end rows
        np.testing.assert_allclose(out[[0, -1]], table[[0, -1]], atol=1e-15)


def test_learned_interpolated_uses_its_table():
    module = LearnedPositionalEncoding(5, 3, seed=0)
    np.testing.assert_array_equal(module.interpolated(9), interpolate_table(module.embedding, 9))


def test_interpolate_bad_input_raises():
    with pytest.raises(ValueError, match="length must be >= 1, got 0"):
        interpolate_table(np.zeros((3, 2)), 0)
    with pytest.raises(ValueError, match=r"shape \[L, d\] with L >= 1, got shape \(3,\)"):
        interpolate_table(np.zeros(3), 4)
