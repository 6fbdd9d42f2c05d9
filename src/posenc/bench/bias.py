"""Attention-bias benchmark: each SCORE encoding's attention against bias-free SDPA.

The issue's targets are on the attention core alone (``attention_groups``, the
``attention`` suite of ``posenc bench``): ``q, k, v [1, 8, T, 64]`` float32, causal, no
gradients, ``posenc.attention.attend`` with ``backend="auto"`` (FlexAttention from
``FLEX_MIN_LENGTH`` queries on) against ``scaled_dot_product_attention(is_causal=True)``
at every power of two from 256 to 8192 tokens: offset-only biases (ALiBi, T5, KERPLE,
Sandwich) within 1.5x, FIRE, CoPE and Shaw within 3x, on the median of the round-robin
repeats, the ratio of the maxima reported beside it (``bias_targets``), each next to
causal SDPA's spread against itself timed again in the same rounds (its A/A control).

Shapes: ``B`` batch (1), ``T`` length, ``C`` d_model, ``H`` heads. For every registered
encoding with a SCORE (or VALUE) site, ``posenc.MultiHeadAttention`` runs a causal
forward pass on ``x [1, T, C]`` with its default backend (FlexAttention from
``FLEX_MIN_LENGTH`` tokens where it applies, else query blocks; the bias computation
is included), against the same layer without a position (one SDPA causal call). Peak
memory (counted on the query-block path: FlexAttention does not run under the counting
dispatch mode) compares that backend with the materialized ``[1, H, T, T]`` bias
(``backend="sdpa"``, or ``"eager"`` for VALUE encodings), as counted by
``posenc.attention.backends.peak_tensor_bytes``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from posenc.attention import MultiHeadAttention
from posenc.attention.backends import Masking, attend, peak_tensor_bytes
from posenc.base import Site, available, build, info
from posenc.bench.report import Target
from posenc.bench.timing import Group, measure, with_control

__all__ = [
    "BIAS_LIMITS",
    "attention_groups",
    "bias_encodings",
    "bias_groups",
    "bias_memory",
    "bias_targets",
]

BASELINE = "SDPA causal, no bias"
CORE_BASELINE = "SDPA causal"
#: The core baseline's A/A control: the same call timed again (``timing.with_control``).
CORE_CONTROLS = {CORE_BASELINE: "SDPA causal again"}
HEAD_DIM = 64
TARGET_LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
#: Heads of the attention core (``attention_groups``).
CORE_HEADS = 8
#: The issue's limits: each encoding's attention core as a multiple of causal SDPA.
BIAS_LIMITS = {"alibi": 1.5, "t5": 1.5, "kerple": 1.5, "sandwich": 1.5}
BIAS_LIMITS |= {"fire": 3.0, "cope": 3.0, "shaw": 3.0}
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


def attention_groups(*, quick: bool, repeats: int, warmup: int) -> list[Group]:
    """The attention core of each encoding in ``BIAS_LIMITS`` (``attend``, backend
    ``auto``, no gradients) next to causal SDPA and its A/A control, round-robin: one group
    per encoding and target length, so that each ratio is taken in rounds of that encoding
    and SDPA alone (a model runs one encoding; interleaving seven puts each one's caches
    and thread wake-ups on the others' clocks)."""
    groups = []
    for length in QUICK_LENGTHS if quick else TARGET_LENGTHS:
        gen = torch.Generator().manual_seed(0)
        qkv = [torch.randn(1, CORE_HEADS, length, HEAD_DIM, generator=gen) for _ in range(3)]
        pos = torch.arange(length)
        masking = Masking(True, pos, pos, aligned=True)
        sdpa = functools.partial(F.scaled_dot_product_attention, *qkv, is_causal=True)
        info_ = {"T": length, "heads": CORE_HEADS, "head_dim": HEAD_DIM, "dtype": "float32",
                 "core": True}  # fmt: skip
        for name in BIAS_LIMITS:
            torch.manual_seed(0)
            shape = {
                "num_heads": CORE_HEADS,
                "head_dim": HEAD_DIM,
                "d_model": CORE_HEADS * HEAD_DIM,
            }
            position = build(name, causal=True, **shape).eval()
            cases = {CORE_BASELINE: sdpa, name: _core(qkv, position, masking)}
            stats = measure(with_control(cases, CORE_CONTROLS), repeats=repeats, warmup=warmup)
            title = f"attention core T={length} H={CORE_HEADS} D={HEAD_DIM}: {name}"
            groups.append(
                Group("attention", title, stats, CORE_BASELINE, info=info_ | {"encoding": name},
                      controls=CORE_CONTROLS)
            )  # fmt: skip
    return groups


def _core(qkv: list[torch.Tensor], position, masking: Masking) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return attend(*qkv, position=position, masking=masking, backend="auto")

    return run


def bias_targets(groups: list[Group]) -> list[Target]:
    """``BIAS_LIMITS`` on the attention-core groups at the target lengths: each encoding's
    median and maximum over causal SDPA's (skipped for ``--quick`` shapes)."""
    targets = []
    for group in groups:
        if not group.info.get("core") or group.info["T"] not in TARGET_LENGTHS:
            continue
        floor, label = group.stats[CORE_BASELINE], f"attention T={group.info['T']:,}"
        spread, spread_max = group.spread(CORE_BASELINE), group.spread(CORE_BASELINE, worst=True)
        for name, limit in BIAS_LIMITS.items():
            if name not in group.stats:
                continue
            ratio = group.ratio_to_floor(name)
            targets.append(Target(label, f"{name}: ÷ SDPA", ratio, limit, True, spread))
            top = group.stats[name].max_ms / floor.max_ms
            targets.append(Target(label, f"{name}: ÷ SDPA (max)", top, limit, True, spread_max))
    return targets
