"""Shared pieces of the lab tests: test-only encodings and a way to register them, a time
limit for what could hang, and the check of a one-line error."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor

import posenc.base
from posenc import PositionalEncoding, Site, register


@contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (a FIFO opened for reading waits for a writer forever)."""

    def expire(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def one_line(capsys, *words: str) -> str:
    """The captured error output: one line, no traceback, holding every one of ``words``."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


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
