"""posenc.fastpath: cheap fresh outputs, cache-sized chunks, the one-pass addition."""

from __future__ import annotations

import pytest
import torch

from conftest import tolerances
from posenc.fastpath import add, chunks, empty_like


def test_chunks_cover_the_range():
    spans = chunks(10, 100, target=300)
    assert [(s.start, s.stop) for s in spans] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert chunks(5, 10**9, target=1) == [slice(i, i + 1) for i in range(5)]
    assert chunks(0, 4) == []


@pytest.mark.parametrize("shape", [(3, 5), (3, 1024, 1024)])  # small, and huge-page eligible
def test_empty_like_keeps_layout(shape):
    x = torch.randn(shape).transpose(0, -1)
    out = empty_like(x)
    assert out.shape == x.shape and out.stride() == x.stride() and out.dtype == x.dtype
    out.copy_(x)
    assert torch.equal(out, x)
    assert empty_like(x, dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("y_shape", [(5, 6), (2, 5, 6), (1, 5, 6)])
def test_add_values_and_gradients(gen, y_shape):
    x = torch.randn(2, 5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(y_shape, generator=gen, dtype=torch.float64, requires_grad=True)
    out = add(x, y)
    torch.testing.assert_close(out, x.detach() + y.detach(), rtol=0, atol=0)
    assert torch.autograd.gradcheck(add, (x, y))


def test_add_falls_back_when_it_cannot_write_into_x_shape(gen):
    x = torch.randn(5, 6, generator=gen)
    wider = torch.randn(2, 5, 6, generator=gen)
    torch.testing.assert_close(add(x, wider), x + wider, rtol=0, atol=0)
    half = wider.bfloat16()
    torch.testing.assert_close(add(x, half), x + half, **tolerances(torch.float32))
