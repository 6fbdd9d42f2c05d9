"""Numerics at long positions (up to 2^21): the bound docs/numerics.md derives, and the
error of the common shortcuts posenc avoids.

Shapes: ``P`` positions, ``R`` rotary dim (``R/2`` frequencies), ``C`` d_model.

posenc forms ``theta_i`` and the angle ``p * theta_i`` in float64 and rounds cos/sin once,
so against the float64 reference a float32 table is off by at most

    |cos32 - cos| <= 2^-24 |cos| + 2^-47 p theta_i

(the final rounding, plus a float64 allowance of 64 units of 2^-53 on the angle for the
two sides' frequency and product roundings). Run this file as a script to print the
comparison table of docs/numerics.md: ``python tests/test_numerics_long.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import reference

MAX_POSITION = 2**21
LENGTHS = (2**11, 2**16, 2**21)
HEAD_DIM = 128
ANGLE_ALLOWANCE = 2.0**-47  # float64 roundings of theta_i and p * theta_i, both sides
ROUNDING = 2.0**-24  # float32 unit roundoff


def _positions(length: int, count: int = 2048) -> torch.Tensor:
    """The first ``count`` positions and ``count`` spread up to ``length - 1`` (int64)."""
    spread = torch.linspace(0, length - 1, count, dtype=torch.float64).round().long()
    return torch.unique(torch.cat((torch.arange(min(count, length)), spread)))


def _bound(reference_values: np.ndarray, angles: np.ndarray) -> np.ndarray:
    return ROUNDING * np.abs(reference_values) + ANGLE_ALLOWANCE * np.abs(angles) + 2.0**-60


def _check_bound(got: torch.Tensor, want: np.ndarray, angles: np.ndarray) -> None:
    error = np.abs(got.double().numpy() - want)
    excess = error - _bound(want, angles)
    assert excess.max() <= 0, f"error {error.max():.3g} beyond the bound by {excess.max():.3g}"


@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}],
    ids=["default", "yarn"],
)
def test_rope_cos_sin_float32_within_the_rounding_bound(scaling):
    rope = posenc.RotaryEmbedding(HEAD_DIM, scaling=scaling)
    positions = _positions(MAX_POSITION + 1)
    theta = rope.inv_freq.numpy()  # float64 frequencies (the scaling's own formula)
    angles = positions.double().numpy()[:, None] * theta  # [P, R/2]
    scale = rope.attention_scale
    cos, sin = posenc.rope_cos_sin(positions, rope.inv_freq, attention_scale=scale)
    assert cos.dtype == torch.float32
    _check_bound(cos, scale * np.cos(angles), scale * angles)
    _check_bound(sin, scale * np.sin(angles), scale * angles)
    if scaling is None:  # theta itself against the paper's formula
        np.testing.assert_allclose(theta, reference.rope_frequencies(HEAD_DIM), rtol=2**-48)
    cos_m, sin_m = rope.cos_sin(positions.double())  # the module's path for any position
    assert torch.equal(cos_m, cos) and torch.equal(sin_m, sin)


@given(
    positions=st.lists(st.integers(0, MAX_POSITION), min_size=1, max_size=64),
    half_dim=st.integers(1, 64),
    base=st.floats(100.0, 1e6),
)
def test_rope_bound_holds_for_any_positions_dim_and_base(positions, half_dim, base):
    p = torch.tensor(positions)
    rope = posenc.RotaryEmbedding(2 * half_dim, base=base)
    cos, sin = rope.cos_sin(p.double())  # computed directly: no 2^21-row cache per example
    angles = p.double().numpy()[:, None] * reference.rope_frequencies(2 * half_dim, base)
    _check_bound(cos, np.cos(angles), angles)
    _check_bound(sin, np.sin(angles), angles)


def test_rope_cache_holds_the_same_numbers():
    rope = posenc.RotaryEmbedding(HEAD_DIM, max_len=16)
    positions = torch.tensor([0, 1, 4095, 3, 70000])  # grows the cache twice
    direct = posenc.rope_cos_sin(positions, rope.inv_freq)
    cached = rope.cos_sin(positions)
    assert all(torch.equal(a, b) for a, b in zip(direct, cached, strict=True))


def test_sinusoidal_float32_within_the_rounding_bound():
    positions = _positions(MAX_POSITION + 1)
    table = posenc.sinusoidal_table(positions, HEAD_DIM)  # [P, C]
    want = reference.sinusoidal_positional_encoding_at(positions.numpy(), HEAD_DIM)
    omega = reference.sinusoidal_frequencies(HEAD_DIM)
    angles = np.repeat(positions.double().numpy()[:, None] * omega, 2, axis=-1)
    _check_bound(table, want, angles)
    module = posenc.SinusoidalPositionalEncoding(HEAD_DIM, max_len=8)
    assert torch.equal(module.encoding(positions.float()), table)
    assert torch.equal(module.table(5000), posenc.sinusoidal_table(torch.arange(5000), HEAD_DIM))


@pytest.mark.parametrize("interleaved", [False, True], ids=["half-split", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rope_is_the_float32_result_rounded(dtype, interleaved):
    g = torch.Generator().manual_seed(0)
    rope = posenc.XPos(64, interleaved=interleaved, scale_base=2.0**22)
    positions = torch.randint(0, MAX_POSITION, (2, 96), generator=g).double()  # no cache
    q = torch.randn(2, 2, 96, 64, generator=g).to(dtype)
    k = torch.randn(2, 1, 96, 64, generator=g).to(dtype)
    got = rope.rotate(q, k, positions, positions)
    want = rope.rotate(q.float(), k.float(), positions, positions)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == dtype
        assert torch.equal(a, b.to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_sinusoidal_adds_the_rounded_float32_table(dtype):
    """One addition in the input's dtype of the float32 table rounded once (never a
    table computed in half precision)."""
    g = torch.Generator().manual_seed(0)
    module = posenc.SinusoidalPositionalEncoding(HEAD_DIM)
    positions = _positions(MAX_POSITION + 1, count=64).float()
    x = torch.randn(1, positions.numel(), HEAD_DIM, generator=g).to(dtype)
    table = posenc.sinusoidal_table(positions, HEAD_DIM)
    assert torch.equal(module(x, positions), x + table.to(dtype))


# ------------------------------------------------------------------ the shortcuts compared


def _posenc(p: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    return (p.double()[:, None] * theta).cos().float()  # float64 angle, rounded once


def _float32_angle(p: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    return (p.float()[:, None] * theta.float()).cos()  # transformers' default


def _fp16_positions(p: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    return (p.half().float()[:, None] * theta.float()).cos()  # inf beyond 65504


def _bf16_positions(p: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    return (p.bfloat16().float()[:, None] * theta.float()).cos()  # 257 -> 256


def _bf16_angle(p: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    return (p.bfloat16()[:, None] * theta.bfloat16()).float().cos()  # product in bf16


POSENC = "posenc: float64 angle, float32 cos"
SHORTCUTS = {
    POSENC: _posenc,
    "float32 angle (positions and inv_freq in float32)": _float32_angle,
    "positions in fp16": _fp16_positions,
    "positions in bf16": _bf16_positions,
    "angle in bf16": _bf16_angle,
}


def shortcut_errors(lengths=LENGTHS, head_dim: int = HEAD_DIM) -> dict[str, list[float]]:
    """Largest ``|cos - cos_ref|`` over the positions below each length and every frequency,
    for each way of forming the angle (NaN where it overflows)."""
    theta = torch.from_numpy(reference.rope_frequencies(head_dim))
    errors: dict[str, list[float]] = {name: [] for name in SHORTCUTS}
    for length in lengths:
        p = _positions(length)
        want = np.cos(p.double().numpy()[:, None] * theta.numpy())
        for name, cos in SHORTCUTS.items():
            errors[name].append(float(np.abs(cos(p, theta).double().numpy() - want).max()))
    return errors


def test_bf16_positions_lose_integers_above_256():
    p = torch.tensor([255, 256, 257, 258, 2**21 + 1])
    assert p.bfloat16().long().tolist() == [255, 256, 256, 258, 2**21]


def test_the_shortcuts_are_orders_of_magnitude_worse_at_long_positions():
    errors = shortcut_errors(lengths=(MAX_POSITION + 1,))
    ours = errors.pop(POSENC)[0]
    assert ours <= ROUNDING + ANGLE_ALLOWANCE * MAX_POSITION
    for name, (error,) in errors.items():
        assert not error <= 1e3 * ours, f"{name}: {error:.3g} is not far above {ours:.3g}"


def markdown_table() -> str:
    """The table of docs/numerics.md."""
    head = "| angle formed as | " + " | ".join(f"p < 2^{n.bit_length() - 1}" for n in LENGTHS)
    rows = [head + " |", "|---" * (len(LENGTHS) + 1) + "|"]
    for name, values in shortcut_errors().items():
        rows.append(f"| {name} | " + " | ".join(f"{v:.2g}" for v in values) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
