"""RoPE frequency scalings against the float64 reference, worked values and invariants."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import (
    DefaultRope,
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    YarnScaling,
    rope_inv_freq,
)
from posenc.encodings.rotary.context_scaling import yarn_correction_range
from posenc.encodings.rotary.scaling import base_inv_freq, resolve_scaling, scaling_from_dict
from posenc.reference import rope as ref


def freq_tol(dtype: torch.dtype, base: float) -> dict[str, float]:
    """``base ** x`` amplifies the rounding of ``x ln(base)`` by ``ln(base)``."""
    return tolerances(dtype, ops=8 + math.ceil(math.log(base)))


def inv64(dim: int, base: float, params, seq_len: int | None = None) -> np.ndarray:
    inv_freq, _ = params.inv_freq(dim, base, seq_len=seq_len)
    assert inv_freq.dtype == torch.float64
    return inv_freq.numpy()


SHORT = [1.0 + 0.05 * i for i in range(32)]
LONG = [1.0 + 0.9 * i for i in range(32)]

CASES = [
    ("default", 128, 1e4, DefaultRope(), None, lambda: ref.rope_frequencies(128, 1e4)),
    ("linear", 64, 5e5, LinearScaling(4.0), None, lambda: ref.linear_frequencies(64, 5e5, 4.0)),
    ("ntk", 128, 1e4, NTKScaling(8.0), None, lambda: ref.ntk_frequencies(128, 1e4, 8.0)),
    *[
        (
            f"dynamic-{n}",
            128,
            1e4,
            DynamicNTKScaling(2.0, 2048),
            n,
            lambda n=n: ref.dynamic_ntk_frequencies(128, 1e4, 2.0, 2048, n),
        )
        for n in (100, 2048, 4096, 9000)
    ],
    (
        "yarn",
        128,
        1e4,
        YarnScaling(4.0, 4096),
        None,
        lambda: ref.yarn_frequencies(128, 1e4, 4.0, 4096),
    ),
    (
        "yarn-qwen",
        128,
        1e6,
        YarnScaling(4.0, 32768, beta_fast=16.0, beta_slow=2.0, truncate=False),
        None,
        lambda: ref.yarn_frequencies(
            128, 1e6, 4.0, 32768, beta_fast=16.0, beta_slow=2.0, truncate=False
        ),
    ),
    (
        "llama3",
        128,
        5e5,
        Llama3Scaling(8.0, 1.0, 4.0, 8192),
        None,
        lambda: ref.llama3_frequencies(128, 5e5, 8.0, 1.0, 4.0, 8192),
    ),
    *[
        (
            f"longrope-{n}",
            64,
            1e4,
            LongRopeScaling(SHORT, LONG, 4096, 32.0),
            n,
            lambda n=n: ref.longrope_frequencies(64, 1e4, SHORT, LONG, 4096, n),
        )
        for n in (None, 4096, 4097)
    ],
]


@pytest.mark.parametrize(("name", "dim", "base", "params", "seq_len", "expected"), CASES)
def test_inv_freq_matches_reference(name, dim, base, params, seq_len, expected):
    np.testing.assert_allclose(
        inv64(dim, base, params, seq_len), expected(), **freq_tol(torch.float64, base)
    )
    rounded, _ = rope_inv_freq(dim, base=base, scaling=params, seq_len=seq_len)
    assert rounded.dtype == torch.float32
    np.testing.assert_allclose(rounded.numpy(), expected(), **freq_tol(torch.float32, base))


def test_attention_factors_match_reference():
    assert YarnScaling(4.0, 4096).inv_freq(64, 1e4)[1] == pytest.approx(
        ref.yarn_attention_factor(4.0), rel=1e-15
    )
    deepseek = YarnScaling(40.0, 4096, mscale=1.0, mscale_all_dim=0.707)
    assert deepseek.inv_freq(64, 1e4)[1] == pytest.approx(
        ref.yarn_attention_factor(40.0, mscale=1.0, mscale_all_dim=0.707), rel=1e-15
    )
    assert YarnScaling(4.0, 4096, attention_factor=1.5).inv_freq(64, 1e4)[1] == 1.5
    longrope = LongRopeScaling(SHORT, LONG, 4096, 32.0)
    assert longrope.inv_freq(64, 1e4)[1] == pytest.approx(
        ref.longrope_attention_factor(32.0, 4096), rel=1e-15
    )


# --------------------------------------------------------------------------- worked values


def test_yarn_worked_values():
    assert yarn_correction_range(128, 1e4, YarnScaling(4.0, 4096)) == (20, 46)
    _, scale = rope_inv_freq(128, scaling=YarnScaling(4.0, 4096))
    assert scale == pytest.approx(1.1386294, abs=1e-7)


def test_llama31_worked_values():
    theta = base_inv_freq(128, 5e5)
    inv_freq = inv64(128, 5e5, Llama3Scaling(8.0, 1.0, 4.0, 8192))
    kept = np.isclose(inv_freq, theta.numpy(), rtol=1e-14, atol=0)
    divided = np.isclose(inv_freq, theta.numpy() / 8, rtol=1e-14, atol=0)
    assert (kept.sum(), divided.sum(), (~kept & ~divided).sum()) == (29, 29, 6)


def test_dynamic_worked_value():
    inv_freq = inv64(128, 1e4, DynamicNTKScaling(2.0, 2048), seq_len=4096)
    # theta_last = base' ** (-(d - 2) / d)  =>  base' = theta_last ** (-d / (d - 2))
    new_base = inv_freq[-1] ** (-128 / 126)
    assert new_base == pytest.approx(30527.74, abs=0.01)


def test_longrope_worked_value():
    _, scale = rope_inv_freq(96, scaling=LongRopeScaling([1.0] * 48, [2.0] * 48, 4096, 32.0))
    assert scale == pytest.approx(1.1902381, abs=1e-7)


# --------------------------------------------------------------------------- invariants

dims = st.sampled_from([8, 32, 64, 128])
bases = st.sampled_from([500.0, 1e4, 5e5, 1e6])
factors = st.floats(1.0, 64.0)


@given(dim=dims, base=bases, factor=factors)
def test_linear_is_default_over_factor(dim, base, factor):
    np.testing.assert_allclose(
        inv64(dim, base, LinearScaling(factor)),
        inv64(dim, base, DefaultRope()) / factor,
        **tolerances(torch.float64),
    )


@given(dim=dims, base=bases, factor=factors, original=st.integers(16, 8192), frac=st.floats(0, 1))
def test_dynamic_is_default_up_to_the_original_length(dim, base, factor, original, frac):
    seq_len = max(1, int(frac * original))
    np.testing.assert_allclose(
        inv64(dim, base, DynamicNTKScaling(factor, original), seq_len),
        inv64(dim, base, DefaultRope()),
        **tolerances(torch.float64),
    )


@given(dim=dims, base=bases, factor=factors)
def test_ntk_keeps_highest_and_divides_lowest_frequency(dim, base, factor):
    theta, ntk = inv64(dim, base, DefaultRope()), inv64(dim, base, NTKScaling(factor))
    assert ntk[0] == theta[0] == 1.0
    assert ntk[-1] == pytest.approx(theta[-1] / factor, rel=64 * np.finfo(np.float64).eps)


@given(dim=dims, base=bases, factor=factors, original=st.integers(64, 65536))
def test_yarn_inside_its_bounds(dim, base, factor, original):
    params = YarnScaling(factor, original)
    theta, yarn = inv64(dim, base, DefaultRope()), inv64(dim, base, params)
    eps = 4 * np.finfo(np.float64).eps
    assert np.all(yarn <= theta * (1 + eps)) and np.all(yarn >= theta / factor * (1 - eps))
    low, high = yarn_correction_range(dim, base, params)
    index = np.arange(dim // 2)
    np.testing.assert_allclose(yarn[index <= low], theta[index <= low], rtol=eps)
    np.testing.assert_allclose(yarn[index >= high], theta[index >= high] / factor, rtol=eps)


@given(dim=dims, base=bases, factor=factors, low=st.floats(0.5, 2.0), gap=st.floats(0.5, 8.0))
def test_llama3_between_divided_and_kept(dim, base, factor, low, gap):
    theta = inv64(dim, base, DefaultRope())
    out = inv64(dim, base, Llama3Scaling(factor, low, low + gap, 8192))
    eps = 4 * np.finfo(np.float64).eps
    assert np.all(out <= theta * (1 + eps)) and np.all(out >= theta / factor * (1 - eps))


def test_longrope_switches_after_the_original_length():
    params = LongRopeScaling(SHORT, LONG, 4096, 32.0)
    short, long = inv64(64, 1e4, params, 4096), inv64(64, 1e4, params, 4097)
    theta = inv64(64, 1e4, DefaultRope())
    np.testing.assert_allclose(short * np.array(SHORT), theta, rtol=1e-15)
    np.testing.assert_allclose(long * np.array(LONG), theta, rtol=1e-15)


# --------------------------------------------------------------------------- HF-style dicts


def test_dict_equals_dataclass():
    spec = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    assert scaling_from_dict(spec) == YarnScaling(4.0, 4096)
    legacy = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    assert scaling_from_dict(legacy) == YarnScaling(4.0, 4096)
    with_nulls = {**spec, "beta_fast": None, "attention_factor": None}
    assert scaling_from_dict(with_nulls) == YarnScaling(4.0, 4096)
    su = {"type": "su", "short_factor": SHORT, "long_factor": LONG, "factor": 32.0}
    su["original_max_position_embeddings"] = 4096
    assert scaling_from_dict(su) == LongRopeScaling(tuple(SHORT), tuple(LONG), 4096, 32.0)
    assert scaling_from_dict({}) == DefaultRope()


def test_dict_theta_and_partial_rotary():
    spec = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6, "partial_rotary_factor": 0.5}
    params, base, rotary_dim = resolve_scaling(spec, head_dim=128, base=1e4)
    assert (params, base, rotary_dim) == (LinearScaling(2.0), 1e6, 64)
    inv_freq, _ = rope_inv_freq(128, scaling=spec)
    np.testing.assert_allclose(
        inv_freq.numpy(), ref.linear_frequencies(64, 1e6, 2.0), **freq_tol(torch.float32, 1e6)
    )


def test_scaling_types_and_frozen():
    known = {
        "default",
        "linear",
        "ntk",
        "ntk_alpha",
        "dynamic",
        "yarn",
        "llama3",
        "longrope",
        "proportional",
    }
    assert set(posenc.scaling_types()) == known
    with pytest.raises(dataclasses.FrozenInstanceError):
        LinearScaling(2.0).factor = 3.0  # type: ignore[misc]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: LinearScaling(0.0), "linear factor must be >= 1.0, got 0.0"),
        (lambda: LinearScaling(-2), "linear factor must be >= 1.0, got -2"),
        (lambda: NTKScaling(0.5), "ntk factor must be >= 1.0, got 0.5"),
        (lambda: DynamicNTKScaling(2.0, 0), "original_max_position_embeddings must be >= 1, got 0"),
        (lambda: YarnScaling(0.9, 4096), "yarn factor must be >= 1.0, got 0.9"),
        (lambda: YarnScaling(4.0, 4096, beta_fast=1, beta_slow=2), "beta_fast must be at least"),
        (lambda: YarnScaling(4.0, 4096, attention_factor=0.0), "attention_factor must be > 0"),
        (lambda: YarnScaling(4.0, 4096, mscale=-1.0), "mscale must be >= 0.0, got -1.0"),
        (lambda: Llama3Scaling(8.0, 4.0, 1.0, 8192), "high_freq_factor must exceed"),
        (lambda: Llama3Scaling(8.0, 0.0, 4.0, 8192), "low_freq_factor must be > 0, got 0.0"),
        (lambda: LongRopeScaling([1.0, 0.0], [1.0, 1.0], 4096, 2.0), r"short_factor\[1\]"),
        (lambda: LongRopeScaling([1.0], [1.0, 1.0], 4096, 2.0), "differ in length: 1 vs 2"),
        (lambda: LongRopeScaling([1.0] * 4, [1.0] * 4, 4096, 0.0), "factor must be >= 1.0"),
        (lambda: rope_inv_freq(65), "head_dim must be even, got 65"),
        (lambda: resolve_scaling(None, head_dim=64, base=1e4, rotary_dim=31), "rotary_dim"),
        (lambda: resolve_scaling(None, head_dim=64, base=1e4, rotary_dim=80), "rotary_dim=80"),
        (lambda: rope_inv_freq(64, base=0.0), "base must be > 0, got 0.0"),
    ],
)
def test_invalid_parameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_longrope_list_length_must_fit_rotary_dim():
    with pytest.raises(ValueError, match="have 4 entries, rotary dim 64 needs 32"):
        rope_inv_freq(64, scaling=LongRopeScaling([1.0] * 4, [1.0] * 4, 4096, 2.0))


def test_ntk_needs_four_rotary_features():
    with pytest.raises(ValueError, match="rotary dim >= 4, got 2"):
        rope_inv_freq(2, scaling=NTKScaling(2.0))


def test_unknown_rope_type_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown rope_type 'mrope'.*default.*dynamic.*yarn"):
        rope_inv_freq(64, scaling={"rope_type": "mrope"})


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"rope_type": "linear"}, r"missing required keys \['factor'\]"),
        ({"rope_type": "yarn", "factor": 4.0}, "original_max_position_embeddings"),
        ({"rope_type": "llama3", "factor": 8.0}, "high_freq_factor"),
        (
            {"rope_type": "linear", "factor": 2.0, "beta_fast": 3},
            r"unexpected keys \['beta_fast'\]",
        ),
        ({"rope_type": "linear", "type": "yarn", "factor": 2.0}, "disagree"),
        ({"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}, "rope_theta=500000.0"),
        ({"partial_rotary_factor": 0.3}, "rotary dim 19"),
        ({"partial_rotary_factor": 1.5}, r"in \(0, 1\], got 1.5"),
    ],
)
def test_invalid_dicts_raise(spec, match):
    with pytest.raises(ValueError, match=match):
        rope_inv_freq(64, base=2e4, scaling=spec)


def test_wrong_types_raise():
    with pytest.raises(TypeError, match="scaling must be None"):
        rope_inv_freq(64, scaling="yarn")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="linear factor must be a real number"):
        LinearScaling("2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="truncate must be a bool"):
        YarnScaling(4.0, 4096, truncate=1)  # type: ignore[arg-type]
