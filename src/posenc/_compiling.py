"""Functions compiled for static shapes, once per process (the CPU paths that compile
their own kernels: FlexAttention in ``posenc.attention.flex``, CoPE's band step).

Each shape (length, band width) gets its own graph, so dynamo's default of 8 graphs per
function is raised to ``RECOMPILE_LIMIT`` while they run; past it dynamo falls back to
eager, never to a wrong result.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["RECOMPILE_LIMIT", "static_compiled"]

#: Graphs kept per compiled function (one per shape).
RECOMPILE_LIMIT = 64


def static_compiled(
    make: Callable[[], Callable[..., Any]], *, fullgraph: bool = False
) -> Callable[..., Any]:
    """``torch.compile(make(), dynamic=False, fullgraph=fullgraph)``, built on the first
    call (``make`` may import what it compiles) and run with ``RECOMPILE_LIMIT``."""

    @functools.cache
    def compiled() -> Callable[..., Any]:
        return torch.compile(make(), dynamic=False, fullgraph=fullgraph)

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            return compiled()(*args, **kwargs)

    return run
