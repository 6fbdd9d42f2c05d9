"""posenc.analysis on sinusoidal, learned and hand-made tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import SinusoidalPositionalEncoding
from posenc.analysis import (
    cosine_similarity_matrix,
    difference_consistency,
    dot_product_distance,
    encoding_statistics,
    permutation_equivariance_error,
    relative_position_matrix,
    uniqueness,
)
from posenc.reference import sinusoidal_frequencies, sinusoidal_positional_encoding

PE = sinusoidal_positional_encoding(100, 64)

# ----------------------------------------------------------------- M_k


@pytest.mark.parametrize("k", [1, 5, 10, 50])
def test_rotation_reconstructs_every_shifted_position(k):
    _, error = relative_position_matrix(PE, k)
    assert error < 1e-10


def test_rotation_is_block_diagonal_orthogonal_and_additive():
    m3, _ = relative_position_matrix(PE, 3)
    m4, _ = relative_position_matrix(PE, 4)
    m7, _ = relative_position_matrix(PE, 7)
    m_minus3, error = relative_position_matrix(PE, -3)
    np.testing.assert_allclose(m3 @ m3.T, np.eye(64), atol=1e-12)
    np.testing.assert_allclose(m3 @ m4, m7, atol=1e-12)
    np.testing.assert_allclose(m_minus3, m3.T, atol=1e-15)
    assert error < 1e-10
    np.testing.assert_allclose(relative_position_matrix(PE, 0)[0], np.eye(64), atol=0)
    block = np.kron(np.eye(32), np.ones((2, 2)))  # the 2x2 diagonal blocks
    assert np.all(m3[block == 0] == 0)
    omega = sinusoidal_frequencies(64)
    np.testing.assert_allclose(m3[0::2, 0::2].diagonal(), np.cos(3 * omega), atol=1e-15)
    np.testing.assert_allclose(m3[0::2, 1::2].diagonal(), np.sin(3 * omega), atol=1e-15)


@given(length=st.integers(2, 80), half=st.integers(1, 48), data=st.data())
def test_rotation_holds_for_any_size(length, half, data):
    k = data.draw(st.integers(-(length - 1), length - 1))
    _, error = relative_position_matrix(sinusoidal_positional_encoding(length, 2 * half), k)
    assert error < 1e-10


def test_rotation_fails_for_tables_without_the_structure():
    angles = np.arange(100)[:, None] * sinusoidal_frequencies(64)
    concatenated = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)  # not interleaved
    learned = np.random.default_rng(0).normal(0, 0.02, (100, 64))
    assert relative_position_matrix(concatenated, 5)[1] > 0.1
    assert relative_position_matrix(learned, 5)[1] > 0.01
    other_base = sinusoidal_positional_encoding(100, 64, base=500.0)
    assert relative_position_matrix(other_base, 5, base=500.0)[1] < 1e-10
    assert relative_position_matrix(other_base, 5)[1] > 0.1


def test_torch_tables_are_accepted():
    table = SinusoidalPositionalEncoding(64).table(100, dtype=torch.float64)
    m_torch, error = relative_position_matrix(table, 10)
    np.testing.assert_array_equal(m_torch, relative_position_matrix(PE, 10)[0])
    assert error < 1e-10
    np.testing.assert_allclose(dot_product_distance(table), dot_product_distance(PE), atol=1e-12)
    assert uniqueness(table.float().requires_grad_()) > 0


# ----------------------------------------------------------------- dot products


def test_dot_products_depend_only_on_the_offset():
    D = dot_product_distance(PE)
    for k in [1, 3, 5, 10]:
        np.testing.assert_allclose(D[0, k], D[10, 10 + k], atol=1e-10)
    np.testing.assert_allclose(np.diag(D), 32.0, atol=1e-12)
    offsets = np.subtract.outer(np.arange(100), np.arange(100))  # p1 - p2
    closed_form = np.cos(offsets[..., None] * sinusoidal_frequencies(64)).sum(-1)
    np.testing.assert_allclose(D, closed_form, atol=1e-10)


def test_dot_product_and_cosine_of_a_small_table():
    table = np.array([[3.0, 4.0], [0.0, 2.0], [0.0, 0.0]])
    np.testing.assert_array_equal(
        dot_product_distance(table), [[25.0, 8.0, 0.0], [8.0, 4.0, 0.0], [0.0, 0.0, 0.0]]
    )
    np.testing.assert_allclose(
        cosine_similarity_matrix(table), [[1.0, 0.8, 0.0], [0.8, 1.0, 0.0], [0.0, 0.0, 0.0]]
    )


def test_cosine_of_sinusoids_is_the_scaled_dot_product():
    np.testing.assert_allclose(
        cosine_similarity_matrix(PE), dot_product_distance(PE) / 32.0, atol=1e-12
    )


def test_same_token_is_told_apart_only_with_positions():
    # The kata's check: one token embedding at positions 3 and 7.
    pe = sinusoidal_positional_encoding(20, 16)
    word = np.full(16, 0.5)
    with_pe = cosine_similarity_matrix(np.stack([word + pe[3], word + pe[7]]))[0, 1]
    without = cosine_similarity_matrix(np.stack([word, word]))[0, 1]
    np.testing.assert_allclose(without, 1.0, atol=1e-15)
    assert with_pe < 1.0 - 1e-3


# ----------------------------------------------------------------- statistics, uniqueness


def test_statistics_of_a_small_table():
    stats = encoding_statistics(np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert set(stats) == {"norms", "mean", "var", "min", "max"}
    np.testing.assert_allclose(stats["norms"], [5**0.5, 5.0])
    np.testing.assert_array_equal(stats["mean"], [2.0, 3.0])
    np.testing.assert_array_equal(stats["var"], [1.0, 1.0])
    assert (stats["min"], stats["max"]) == (1.0, 4.0)


def test_statistics_of_sinusoids():
    stats = encoding_statistics(PE)
    np.testing.assert_allclose(stats["norms"], np.sqrt(32.0), rtol=1e-12)
    assert stats["min"] >= -1.0 and stats["max"] <= 1.0
    assert stats["mean"].shape == stats["var"].shape == (64,)


def test_every_sinusoidal_position_is_unique():
    pe = sinusoidal_positional_encoding(20, 16)
    distances = np.linalg.norm(pe[:, None] - pe[None], axis=-1)
    np.testing.assert_allclose(np.diag(distances), 0.0, atol=0)
    assert uniqueness(pe) == pytest.approx(distances[~np.eye(20, dtype=bool)].min(), rel=1e-12)
    assert uniqueness(PE) > 0.1


def test_uniqueness_of_small_tables():
    assert uniqueness(np.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]])) == 1.0
    assert uniqueness(np.array([[1.0, 2.0], [5.0, 5.0], [1.0, 2.0]])) == 0.0


def test_uniqueness_across_blocks_keeps_tiny_distances():
    table = np.random.default_rng(1).standard_normal((300, 64)) * 100  # several row blocks
    table[290] = table[5]
    table[290, 3] += 1e-9  # far from each other in the table, about 1e-9 apart
    gap = abs(table[290, 3] - table[5, 3])  # exact (Sterbenz), within rounding of 1e-9
    assert gap == pytest.approx(1e-9, rel=1e-4)
    assert uniqueness(table) == pytest.approx(gap, rel=1e-12)


# ----------------------------------------------------------------- difference consistency


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sinusoidal_steps_turn_by_a_constant_angle(k):
    # The kata's setting: d = 16, L = 20. delta_{p+1} = M_1 delta_p, so every similarity is
    # sum_i |delta^(i)|^2 cos(w_i) / sum_i |delta^(i)|^2 with |delta^(i)| = 2 |sin(w_i k / 2)|.
    omega = sinusoidal_frequencies(16)
    weight = np.sin(omega * k / 2) ** 2
    closed_form = (weight * np.cos(omega)).sum() / weight.sum()
    result = difference_consistency(sinusoidal_positional_encoding(20, 16), k)
    assert result["similarities"].shape == (20 - k - 1,)
    np.testing.assert_allclose(result["similarities"], closed_form, rtol=1e-12)
    assert result["mean"] == pytest.approx(closed_form, rel=1e-12)
    assert result["min"] == pytest.approx(closed_form, rel=1e-12)


def test_random_tables_have_inconsistent_steps():
    result = difference_consistency(np.random.default_rng(2).standard_normal((20, 16)), 1)
    assert np.ptp(result["similarities"]) > 0.5
    assert result["min"] <= result["mean"]


def test_zero_steps_count_as_zero_similarity():
    result = difference_consistency(np.zeros((5, 4)), 1)
    np.testing.assert_array_equal(result["similarities"], 0.0)


# ----------------------------------------------------------------- permutation equivariance


def test_attention_is_permutation_equivariant_only_without_positions():
    assert permutation_equivariance_error(seq_len=16, d_model=32, seed=0) < 1e-12
    assert permutation_equivariance_error(np.zeros((16, 32))) < 1e-12  # NoPE: a zero table
    pe = sinusoidal_positional_encoding(16, 32)
    assert permutation_equivariance_error(pe, seed=0) > 1e-2
    assert permutation_equivariance_error(torch.from_numpy(pe), seed=0) == (
        permutation_equivariance_error(pe, seed=0)
    )


@given(length=st.integers(2, 24), width=st.integers(1, 24), seed=st.integers(0, 1000))
def test_equivariance_without_positions_for_any_size(length, width, seed):
    assert permutation_equivariance_error(seq_len=length, d_model=width, seed=seed) < 1e-12


# ----------------------------------------------------------------- bad input


def test_bad_input_raises():
    with pytest.raises(ValueError, match=r"shape \[L, d\] with L, d >= 1, got shape \(4,\)"):
        encoding_statistics(np.zeros(4))
    with pytest.raises(ValueError, match=r"got shape \(2, 3, 4\)"):
        dot_product_distance(torch.zeros(2, 3, 4))
    with pytest.raises(TypeError, match="numpy array or torch tensor, got list"):
        cosine_similarity_matrix([[1.0, 2.0]])
    with pytest.raises(TypeError, match="must hold real numbers, got dtype complex128"):
        encoding_statistics(np.ones((2, 2), dtype=complex))
    with pytest.raises(ValueError, match="d_model must be even, got 63"):
        relative_position_matrix(np.zeros((10, 63)), 1)
    with pytest.raises(
        ValueError, match="offset 100 leaves no pair of positions in a table of L=100"
    ):
        relative_position_matrix(PE, 100)
    with pytest.raises(TypeError, match=r"offset must be an integer, got 1\.5"):
        relative_position_matrix(PE, 1.5)
    with pytest.raises(ValueError, match="uniqueness needs at least 2 positions, got L=1"):
        uniqueness(PE[:1])
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        difference_consistency(PE, 0)
    with pytest.raises(ValueError, match="k=99 leaves fewer than two difference vectors in L=100"):
        difference_consistency(PE, 99)
    with pytest.raises(ValueError, match="seq_len is required when pe is None"):
        permutation_equivariance_error(d_model=8)
    with pytest.raises(ValueError, match=r"d_model=8 disagrees with pe of shape \(100, 64\)"):
        permutation_equivariance_error(PE, d_model=8)
    with pytest.raises(ValueError, match="seq_len must be >= 2, got 1"):
        permutation_equivariance_error(seq_len=1, d_model=8)
