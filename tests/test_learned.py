"""posenc.LearnedPositionalEncoding against the NumPy reference (forward and backward)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import LearnedPositionalEncoding
from posenc.reference import LearnedPositionalEncoding as RefLearned
from posenc.reference import interpolate_table

TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def pair(
    max_len: int, d_model: int, *, seed: int = 0, **kwargs
) -> tuple[LearnedPositionalEncoding, RefLearned]:
    """A float64 torch module holding the reference's table."""
    ref = RefLearned(max_len, d_model, seed=seed)
    module = LearnedPositionalEncoding(d_model, max_len, **kwargs).double()
    with torch.no_grad():
        module.weight.copy_(torch.from_numpy(ref.embedding))
    return module, ref


def run_both(module, ref, x: np.ndarray, grad: np.ndarray, positions: np.ndarray | None = None):
    """Forward + backward through both; returns (torch out, x.grad) and (ref out, ref dx)."""
    xt = torch.from_numpy(x).requires_grad_(True)
    out = module(xt, None if positions is None else torch.from_numpy(positions))
    out.backward(torch.from_numpy(grad))
    ref_out = ref.forward(x, positions)
    ref_dx = ref.backward(grad)
    return (out.detach().numpy(), xt.grad.numpy()), (ref_out, ref_dx)


@pytest.mark.parametrize(
    "positions",
    [None, np.array([4, 0, 2, 2, 7]), np.array([[0, 1, 2, 0, 1], [3, 4, 5, 6, 7]])],
    ids=["default", "shared", "packed"],
)
def test_float64_forward_and_autograd_match_reference(positions):
    module, ref = pair(8, 6)
    rng = np.random.default_rng(1)
    x, grad = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 5, 6))
    (out, dx), (ref_out, ref_dx) = run_both(module, ref, x, grad, positions)
    np.testing.assert_allclose(out, ref_out, **TIGHT)
    np.testing.assert_allclose(dx, ref_dx, **TIGHT)
    np.testing.assert_allclose(module.weight.grad.numpy(), ref.grad_embedding, **TIGHT)


@given(
    max_len=st.integers(1, 32),
    d_model=st.integers(1, 24),
    batch=st.integers(1, 3),
    data=st.data(),
)
def test_float64_matches_reference_for_any_size(max_len, d_model, batch, data):
    length = data.draw(st.integers(1, max_len))
    module, ref = pair(max_len, d_model, seed=length)
    rng = np.random.default_rng(max_len)
    x, grad = rng.standard_normal((2, batch, length, d_model))
    (out, _), (ref_out, _) = run_both(module, ref, x, grad)
    np.testing.assert_allclose(out, ref_out, **TIGHT)
    np.testing.assert_allclose(module.weight.grad.numpy(), ref.grad_embedding, **TIGHT)


def test_gradient_with_b_identical_upstreams_is_b_times_single():
    B, T, C = 5, 7, 4
    module = LearnedPositionalEncoding(C, 10)
    upstream = torch.randn(T, C, generator=torch.Generator().manual_seed(2))
    module(torch.zeros(1, T, C)).backward(upstream[None])
    single = module.weight.grad.clone()
    module.weight.grad = None
    module(torch.zeros(B, T, C)).backward(upstream.expand(B, T, C))
    torch.testing.assert_close(module.weight.grad, B * single, **tolerances(torch.float32))
    assert torch.all(module.weight.grad[T:] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_input_matches_reference(dtype):
    module, ref = pair(16, 8)
    module.float()
    gen = torch.Generator().manual_seed(3)
    x, grad = torch.randn(2, 2, 12, 8, generator=gen).to(dtype)
    out = module(x)
    out.backward(grad)
    assert out.dtype == dtype and module.weight.grad.dtype == torch.float32
    expected = torch.from_numpy(ref.forward(x.double().numpy()))
    ref.backward(grad.double().numpy())
    torch.testing.assert_close(out.double(), expected, **tolerances(dtype))
    torch.testing.assert_close(
        module.weight.grad.double(), torch.from_numpy(ref.grad_embedding), **tolerances(dtype)
    )


def test_to_bfloat16_converts_the_parameter_and_still_matches():
    module, ref = pair(16, 8)
    module.to(torch.bfloat16)
    assert module.weight.dtype == torch.bfloat16 and isinstance(module.weight, torch.nn.Parameter)
    x = torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    grad = torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    module(x).backward(grad)
    ref.forward(x.double().numpy())
    ref.backward(grad.double().numpy())
    tol = tolerances(torch.bfloat16)
    torch.testing.assert_close(
        module.weight.grad.double(), torch.from_numpy(ref.grad_embedding), **tol
    )
    out = module(x, torch.arange(12) + 4)
    ref_out = ref.forward(x.double().numpy(), np.arange(12) + 4)
    torch.testing.assert_close(out.double(), torch.from_numpy(ref_out), **tol)


# ----------------------------------------------------------------- beyond max_len


def test_interpolate_matches_reference_table_and_gradient():
    module, ref = pair(6, 3, beyond="interpolate")
    length = 17
    torch.testing.assert_close(
        module.table(length).detach(),
        torch.from_numpy(ref.interpolated(length)),
        rtol=1e-12,
        atol=1e-12,
    )
    x = torch.zeros(2, length, 3, dtype=torch.float64)
    grad = torch.randn(
        2, length, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64
    )
    module(x).backward(grad)
    weights = interpolate_table(np.eye(6), length)  # [length, 6]: the linear map of the resampling
    expected = weights.T @ grad.sum(0).numpy()
    np.testing.assert_allclose(module.weight.grad.numpy(), expected, **TIGHT)


def test_interpolate_with_explicit_positions_stretches_to_the_largest():
    module, ref = pair(4, 2, beyond="interpolate")
    positions = torch.tensor([0, 5, 9])
    out = module(torch.zeros(1, 3, 2, dtype=torch.float64), positions)
    np.testing.assert_allclose(out[0].detach().numpy(), ref.interpolated(10)[[0, 5, 9]], **TIGHT)


def test_interpolate_leaves_lengths_within_the_table_alone():
    module, ref = pair(8, 4, beyond="interpolate")
    np.testing.assert_array_equal(module.table(8).detach().numpy(), ref.embedding)
    np.testing.assert_array_equal(module.table(3).detach().numpy(), ref.embedding[:3])


def test_interpolate_of_a_bfloat16_table_resamples_in_float32():
    module, _ = pair(6, 3, beyond="interpolate")
    module.to(torch.bfloat16)
    rounded = module.weight.detach().double().numpy()
    table = module.table(15)
    assert table.dtype == torch.float32
    np.testing.assert_allclose(
        table.detach().double().numpy(), interpolate_table(rounded, 15), **tolerances(torch.float32)
    )


def test_beyond_error_names_both_lengths():
    module = LearnedPositionalEncoding(4, 8)
    with pytest.raises(ValueError, match="sequence length 9 exceeds the learned table's max_len=8"):
        module(torch.zeros(1, 9, 4))
    with pytest.raises(ValueError, match="position 8 is beyond the learned table of max_len=8"):
        module(torch.zeros(1, 2, 4), torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="sequence length 12 exceeds"):
        module.table(12)


# ----------------------------------------------------------------- the module itself


def test_init_is_normal_with_std_002():
    torch.manual_seed(0)
    weight = LearnedPositionalEncoding(128, 256).weight.detach().double()
    n = weight.numel()
    std_err, mean_err = 0.02 / (2 * n) ** 0.5, 0.02 / n**0.5  # sampling errors of std, mean
    assert abs(weight.std().item() - 0.02) < 6 * std_err
    assert abs(weight.mean().item()) < 6 * mean_err


def test_parameter_state_and_build():
    module = posenc.build("learned", d_model=16, num_heads=2, head_dim=8, max_len=32, causal=True)
    assert isinstance(module, LearnedPositionalEncoding) and module.sites == posenc.Site.INPUT
    assert list(module.state_dict()) == ["weight"]
    assert module.weight.shape == (32, 16) and module.weight.requires_grad
    assert "beyond='error'" in repr(module)


def test_input_untouched_and_dropout_only_in_training():
    module, ref = pair(8, 4, dropout=0.5)
    x = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    before = x.clone()
    clean = torch.from_numpy(ref.forward(x.numpy()))
    torch.testing.assert_close(module.eval()(x), clean)
    out = module.train()(x)
    kept = out != 0
    assert 0 < kept.sum() < out.numel()
    torch.testing.assert_close(out[kept], 2 * clean[kept])
    torch.testing.assert_close(x, before, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((0, 8), {}, ValueError, "d_model must be >= 1, got 0"),
        ((4, -1), {}, ValueError, "max_len must be >= 1, got -1"),
        (
            (4, 8),
            {"beyond": "extrapolate"},
            ValueError,
            "beyond must be one of error, interpolate; got 'extrapolate'",
        ),
        ((4, 8), {"dropout": 1.5}, ValueError, r"dropout must be in \[0, 1\), got 1.5"),
        ((4, 8.0), {}, TypeError, "max_len must be an integer, got 8.0"),
    ],
)
def test_bad_constructor_arguments_raise(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        LearnedPositionalEncoding(*args, **kwargs)


def test_bad_inputs_raise():
    module = LearnedPositionalEncoding(4, 8)
    with pytest.raises(ValueError, match=r"x must have 3 dimensions, got shape \(3, 4\)"):
        module(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="x has last dimension 5, expected d_model=4"):
        module(torch.zeros(1, 3, 5))
    with pytest.raises(ValueError, match="positions must be >= 0, got a position -2"):
        module(torch.zeros(1, 2, 4), torch.tensor([-2, 0]))
    with pytest.raises(
        TypeError, match=r"learned positions must be integers, got dtype torch\.float32"
    ):
        module(torch.zeros(1, 2, 4), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"T = 2, got shape \(3,\)"):
        module(torch.zeros(1, 2, 4), torch.arange(3))
    with pytest.raises(ValueError, match="seq_len must be >= 0, got -1"):
        module.table(-1)
