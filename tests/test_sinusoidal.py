"""posenc.SinusoidalPositionalEncoding against the float64 NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import SinusoidalPositionalEncoding, sinusoidal_table
from posenc.reference import sinusoidal_positional_encoding, sinusoidal_positional_encoding_at

TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def expected(x: torch.Tensor, pe: np.ndarray) -> torch.Tensor:
    """``x + pe`` in float64 from the reference table (broadcast over the batch)."""
    return x.double() + torch.from_numpy(pe)


def assert_adds_reference_table(module: SinusoidalPositionalEncoding, length: int) -> None:
    """A float64 zero input of ``length`` comes out as the reference table."""
    out = module(torch.zeros(1, length, module.d_model, dtype=torch.float64))[0]
    ref = sinusoidal_positional_encoding(length, module.d_model)
    torch.testing.assert_close(out, torch.from_numpy(ref), **TIGHT)


def test_float64_matches_reference(gen):
    x = torch.randn(3, 37, 64, generator=gen, dtype=torch.float64)
    out = SinusoidalPositionalEncoding(64)(x)
    torch.testing.assert_close(out, expected(x, sinusoidal_positional_encoding(37, 64)), **TIGHT)


@given(length=st.integers(1, 96), half=st.integers(1, 64), base=st.sampled_from([1e4, 500.0]))
def test_float64_matches_reference_for_any_size(length, half, base):
    d_model = 2 * half
    table = SinusoidalPositionalEncoding(d_model, max_len=8, base=base).table(
        length, dtype=torch.float64
    )
    ref = sinusoidal_positional_encoding(length, d_model, base=base)
    np.testing.assert_allclose(table.numpy(), ref, **TIGHT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_matches_reference(gen, dtype):
    x = torch.randn(2, 50, 32, generator=gen).to(dtype)
    out = SinusoidalPositionalEncoding(32)(x)
    assert out.dtype == dtype
    ref = expected(x, sinusoidal_positional_encoding(50, 32))
    torch.testing.assert_close(out.double(), ref, **tolerances(dtype))


def test_table_properties():
    table = SinusoidalPositionalEncoding(64).table(100, dtype=torch.float64)
    torch.testing.assert_close(
        table[0], torch.tensor([0.0, 1.0] * 32, dtype=torch.float64), rtol=0, atol=1e-15
    )
    norms = table.norm(dim=-1)
    torch.testing.assert_close(norms, torch.full_like(norms, 32.0**0.5), rtol=1e-12, atol=0)
    assert table.min() >= -1 and table.max() <= 1


def test_cache_grows_for_longer_inputs():
    module = SinusoidalPositionalEncoding(16, max_len=4)
    short = module.table(4)
    assert_adds_reference_table(module, 50)
    torch.testing.assert_close(
        module.table(50).double(),
        torch.from_numpy(sinusoidal_positional_encoding(50, 16)),
        **tolerances(torch.float32),
    )
    torch.testing.assert_close(module.table(4), short)  # the old rows are the same values


def test_explicit_positions_offset_and_packed(gen):
    module = SinusoidalPositionalEncoding(8)
    x = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    offset = torch.arange(100, 105)
    torch.testing.assert_close(
        module(x, offset),
        expected(x, sinusoidal_positional_encoding_at(offset.numpy(), 8)),
        **TIGHT,
    )
    packed = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]])
    torch.testing.assert_close(
        module(x, packed),
        expected(x, sinusoidal_positional_encoding_at(packed.numpy(), 8)),
        **TIGHT,
    )
    one_row = torch.arange(3, 8)[None]  # [1, T] broadcasts over the batch
    torch.testing.assert_close(module(x, one_row), module(x, one_row[0]))


def test_fractional_and_negative_positions_follow_the_formula():
    positions = torch.tensor([0.5, 2.25, -3.0], dtype=torch.float64)
    out = SinusoidalPositionalEncoding(8)(torch.zeros(1, 3, 8, dtype=torch.float64), positions)
    ref = sinusoidal_positional_encoding_at(positions.numpy(), 8)
    np.testing.assert_allclose(out[0].numpy(), ref, **TIGHT)
    np.testing.assert_allclose(
        sinusoidal_table(positions, 8, dtype=torch.float64).numpy(), ref, **TIGHT
    )


def test_to_bfloat16_does_not_degrade_the_table():
    module = SinusoidalPositionalEncoding(16).to(torch.bfloat16)
    assert not list(module.parameters()) and not list(module.buffers())
    assert_adds_reference_table(module, 300)


def test_input_untouched_and_gradient_passes_through(gen):
    x = torch.randn(2, 6, 8, generator=gen, requires_grad=True)
    before = x.detach().clone()
    SinusoidalPositionalEncoding(8)(x).sum().backward()
    torch.testing.assert_close(x.detach(), before, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, torch.ones_like(x))


def test_dropout_only_in_training(gen):
    module = SinusoidalPositionalEncoding(8, dropout=0.5)
    x = torch.randn(4, 10, 8, generator=gen, dtype=torch.float64)
    clean = expected(x, sinusoidal_positional_encoding(10, 8))
    torch.testing.assert_close(module.eval()(x), clean)
    out = module.train()(x)
    kept = out != 0
    assert 0 < kept.sum() < out.numel()
    torch.testing.assert_close(out[kept], 2 * clean[kept])


def test_build_by_name_ignores_other_model_keywords():
    module = posenc.build(
        "sinusoidal", d_model=16, num_heads=2, head_dim=8, max_len=32, causal=True, base=500.0
    )
    assert isinstance(module, SinusoidalPositionalEncoding)
    assert (module.d_model, module.max_len, module.base) == (16, 32, 500.0)
    assert module.sites == posenc.Site.INPUT


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"d_model": 7}, ValueError, "d_model must be even, got 7"),
        ({"d_model": 0}, ValueError, "d_model must be >= 1, got 0"),
        ({"d_model": 8, "max_len": 0}, ValueError, "max_len must be >= 1, got 0"),
        ({"d_model": 8, "max_len": -5}, ValueError, "max_len must be >= 1, got -5"),
        ({"d_model": 8, "base": -1.0}, ValueError, "base must be > 0, got -1.0"),
        ({"d_model": 8, "dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\), got 1.0"),
        ({"d_model": 8.0}, TypeError, "d_model must be an integer, got 8.0"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, error, message):
    with pytest.raises(error, match=message):
        SinusoidalPositionalEncoding(**kwargs)


def test_bad_inputs_raise():
    module = SinusoidalPositionalEncoding(8)
    with pytest.raises(ValueError, match=r"x must have 3 dimensions, got shape \(5, 8\)"):
        module(torch.zeros(5, 8))
    with pytest.raises(ValueError, match="x has last dimension 6, expected d_model=8"):
        module(torch.zeros(1, 5, 6))
    with pytest.raises(TypeError, match=r"floating-point tensor, got dtype torch\.int64"):
        module(torch.zeros(1, 5, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"T = 5, got shape \(4,\)"):
        module(torch.zeros(1, 5, 8), torch.arange(4))
    with pytest.raises(
        ValueError, match="positions has batch size 3, but the input has batch size 2"
    ):
        module(torch.zeros(2, 5, 8), torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match=r"must not be torch\.bfloat16"):
        module(torch.zeros(1, 5, 8), torch.arange(5).to(torch.bfloat16))
    with pytest.raises(ValueError, match="d_model must be even, got 5"):
        sinusoidal_table(torch.arange(3), 5)
