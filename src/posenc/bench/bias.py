"""Attention-bias benchmark: each SCORE encoding's attention against bias-free SDPA.

Shapes: ``B`` batch (1), ``T`` length, ``C`` d_model, ``H`` heads. For every registered
encoding with a SCORE (or VALUE) site, ``posenc.MultiHeadAttention`` runs a causal
forward pass on ``x [1, T, C]`` with its default backend (query blocks; the bias
computation is included), against the same layer without a position (one SDPA causal
call). Peak memory compares that backend with the materialized ``[1, H, T, T]`` bias
(``backend="sdpa"``, or ``"eager"`` for VALUE encodings), as counted by
``posenc.attention.backends.peak_tensor_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posenc.attention import MultiHeadAttention
from posenc.attention.backends import peak_tensor_bytes
from posenc.base import Site, available, info
from posenc.bench.timing import Group, measure

__all__ = ["bias_encodings", "bias_groups", "bias_memory"]

BASELINE = "SDPA causal, no bias"
D_MODEL, HEADS = 256, 4
FULL_LENGTHS = (512, 1024, 2048, 4096, 8192)
QUICK_LENGTHS = (64,)
FULL_MEMORY_LENGTHS = (2048, 4096)


def bias_encodings() -> list[str]:
    """Registered encodings that act on the attention scores or the values."""
    return [name for name in available() if info(name).sites & (Site.SCORE | Site.VALUE)]


def _layer(position: str | None, backend: str = "auto") -> MultiHeadAttention:
    torch.manual_seed(0)
    layer = MultiHeadAttention(D_MODEL, HEADS, position=position, causal=True, backend=backend)
    return layer.eval()


def _forward(layer: MultiHeadAttention, x: torch.Tensor) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return layer(x)

    return run


def _input(length: int) -> torch.Tensor:
    return torch.randn(1, length, D_MODEL, generator=torch.Generator().manual_seed(0))


def bias_groups(*, quick: bool, repeats: int, warmup: int) -> list[Group]:
    """Time every bias encoding's attention at each length, next to bias-free SDPA."""
    groups = []
    names = bias_encodings()
    for length in QUICK_LENGTHS if quick else FULL_LENGTHS:
        x = _input(length)
        cases = {BASELINE: _forward(_layer(None), x)}
        cases.update({name: _forward(_layer(name), x) for name in names})
        stats = measure(cases, repeats=min(repeats, 5), warmup=warmup)  # seconds per call
        info_ = {"T": length, "d_model": D_MODEL, "heads": HEADS, "dtype": "float32"}
        title = f"attention T={length} C={D_MODEL} H={HEADS}"
        groups.append(Group("bias", title, stats, floor=BASELINE, info=info_))
    return groups


def bias_memory(*, quick: bool) -> list[dict[str, object]]:
    """Peak tensor memory of each bias encoding's attention, blocked vs materialized."""
    rows = []
    for name in bias_encodings():
        materialized = "eager" if info(name).sites & Site.VALUE else "sdpa"
        for length in QUICK_LENGTHS if quick else FULL_MEMORY_LENGTHS:
            x = _input(length)
            blocked, _ = peak_tensor_bytes(_forward(_layer(name), x))
            full, _ = peak_tensor_bytes(_forward(_layer(name, materialized), x))
            rows.append(
                {
                    "encoding": name,
                    "T": length,
                    "blocked_mib": blocked / 2**20,
                    "materialized_mib": full / 2**20,
                    "materialized_backend": materialized,
                    "saving": full / blocked if blocked else None,
                }
            )
    return rows
