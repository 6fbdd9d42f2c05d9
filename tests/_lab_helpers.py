"""Shared pieces of the lab tests: test-only encodings and a way to register them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor

import posenc.base
from posenc import PositionalEncoding, Site, register


@contextmanager
def registered(name: str, cls: type[PositionalEncoding]) -> Iterator[None]:
    """Register a test-only encoding for the ``with`` block."""
    register(name, paper="test", description="test only")(cls)
    try:
        yield
    finally:
        posenc.base._REGISTRY.pop(name)


class NaNInput(PositionalEncoding):
    """An input encoding that turns every embedding into NaN (a run that fails)."""

    sites = Site.INPUT

    def __init__(self) -> None:
        super().__init__()

    def embed(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        return x * float("nan")


class Interrupt(NaNInput):
    """An input encoding whose first use is a Ctrl-C."""

    def embed(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        raise KeyboardInterrupt
