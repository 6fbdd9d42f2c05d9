"""NTK-aware's alpha follows the training length (Liu et al. 2024's critical dimension);
transformers' convention, alpha = factor, is kept as the row ``+ntk +hf``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import tolerances
from posenc.lab import LabConfig
from posenc.lab.variants import build_encoding, critical_dim, ntk_alpha, scaling_spec, variants

F64 = tolerances(torch.float64, ops=64)  # a few float64 pow/log/exp roundings


def _inv_freq(rotary_dim: int, base: float) -> np.ndarray:
    """theta_i = base ** (-2i / R), float64 (Su et al. 2021, eq. 15)."""
    return base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)


def _critical(rotary_dim: int, base: float, original: int) -> int:
    """The first pair index whose wavelength 2 pi / theta_i exceeds ``original``, in dims
    (at least one pair, at most the last), counted directly from the wavelengths."""
    waves = 2 * math.pi / _inv_freq(rotary_dim, base)
    index = int(np.searchsorted(waves, original, side="right"))  # pairs turning >= once
    return 2 * min(max(1, index), rotary_dim // 2 - 1)


@settings(max_examples=40, deadline=None)
@given(
    rotary_dim=st.sampled_from([8, 16, 24, 64, 128]),
    base=st.sampled_from([1e4, 5e5]),
    original=st.integers(8, 8192),
)
def test_critical_dim_counts_the_pairs_that_turn_within_the_training_length(
    rotary_dim, base, original
):
    assert critical_dim(rotary_dim, base, original) == _critical(rotary_dim, base, original)


@pytest.mark.parametrize(("rotary_dim", "original"), [(24, 64), (24, 256), (64, 4096)])
@pytest.mark.parametrize("factor", [2.0, 16.0])
def test_length_following_alpha_divides_the_critical_pair_by_the_factor(
    rotary_dim, original, factor
):
    base = 1e4
    critical = critical_dim(rotary_dim, base, original)
    alpha = ntk_alpha(factor, original, rotary_dim=rotary_dim, base=base)
    assert alpha == pytest.approx(factor ** ((rotary_dim - 2) / critical), rel=F64["rtol"])
    scaled = _inv_freq(rotary_dim, base * alpha ** (rotary_dim / (rotary_dim - 2)))
    plain = _inv_freq(rotary_dim, base)
    pair = critical // 2
    np.testing.assert_allclose(plain[pair] / scaled[pair], factor, rtol=F64["rtol"])
    # transformers' convention divides the last pair by the factor instead
    hf = _inv_freq(rotary_dim, base * factor ** (rotary_dim / (rotary_dim - 2)))
    np.testing.assert_allclose(plain[-1] / hf[-1], factor, rtol=F64["rtol"])


def test_lab_rows_use_the_length_following_alpha_and_keep_transformers_row():
    config = LabConfig(encodings=("rope",), scalings=("ntk",))
    rows = {v.label: v for v in variants("rope", config)}
    assert set(rows) == {"rope +ntk", "rope +ntk +hf"}
    factor = 8.0
    ours = rows["rope +ntk"].encoding("rope", config, factor)
    hf = rows["rope +ntk +hf"].encoding("rope", config, factor)
    want = ntk_alpha(factor, config.train_len, rotary_dim=config.head_dim, base=10000.0)
    assert ours.scaling.factor == pytest.approx(want, rel=F64["rtol"])
    assert hf.scaling.factor == factor
    assert not rows["rope +ntk +hf"].tunable
    # posenc extend (no rotary shape given) keeps transformers' convention
    assert scaling_spec("ntk", factor, 4096)["factor"] == factor
    plain = build_encoding("rope", config).inv_freq.double().numpy()
    got = ours.inv_freq.double().numpy()
    pair = critical_dim(config.head_dim, 10000.0, config.train_len) // 2  # float64 inv_freq
    np.testing.assert_allclose(plain[pair] / got[pair], factor, rtol=F64["rtol"])
