"""Shared test helpers: dtype-derived tolerances and seeded generators."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings

settings.register_profile("posenc", deadline=None, max_examples=40)
settings.load_profile("posenc")


def tolerances(dtype: torch.dtype, *, ops: int = 8) -> dict[str, float]:
    """``rtol``/``atol`` for comparing a ``dtype`` computation with the float64 reference.

    Derived from the dtype's machine epsilon times a small operation count ``ops`` (the
    number of roundings a value goes through), never hand-tuned per test.
    """
    eps = torch.finfo(dtype).eps
    return {"rtol": ops * eps, "atol": ops * eps}


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)
