"""Integer positions are turned to float only where the float holds them exactly.

Shapes: ``B`` batch, ``T`` length, ``C`` d_model. An int64 position beyond ``2**53``
(``2**24`` for a float32 computation) rounds to a neighbour when angles are formed, so
neighbouring tokens would share a rotation; ``posenc._checks.float_positions`` refuses it
by name, in every encoding that turns absolute positions to float. Encodings that read
only offsets ``q_pos - k_pos`` form them in int64 and stay exact at any shift.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _build import SHORT, attention_positions
from conftest import tolerances
from posenc._checks import float_positions
from posenc.encodings.sinusoidal_layouts import sinusoidal_layout_table

C, H, T = 32, 4, 6
LIMIT = 2**53
#: Encodings that turn absolute positions into angles (or a temperature) in float64.
ABSOLUTE = (
    "rope", "p_rope", "mla_rope", "mrope", "video_rope", "axial_rope", "comrope", "liere",
    "fope", "temperature", "xpos",
)  # fmt: skip
#: Encodings that read integer offsets only: a shift of every position changes nothing.
RELATIVE = ("alibi", "t5", "kerple", "sandwich", "shaw", "cope", "disentangled", "fox")


def _layer(name: str) -> posenc.MultiHeadAttention:
    torch.manual_seed(0)
    shape = {"d_model": C, "num_heads": H, "head_dim": C // H, "max_len": 64, "causal": True}
    position = posenc.build(name, **shape, **SHORT.get(name, {}))
    return posenc.MultiHeadAttention(C, H, position=position).double().eval()


def _positions(mha: posenc.MultiHeadAttention) -> torch.Tensor:
    index = attention_positions(mha.position, None, T)
    return torch.arange(T) if index is None else index


@pytest.mark.parametrize("name", ABSOLUTE)
def test_positions_beyond_2_53_are_refused_by_name(name):
    """The round-4 reproducer: a shift of 2**53 collapsed neighbouring positions."""
    mha, x = _layer(name), torch.randn(1, T, C, dtype=torch.float64)
    base = _positions(mha)
    with pytest.raises(ValueError, match=rf"within \+-{LIMIT} \(2\*\*53.*got {LIMIT + 1}\b"):
        mha(x, base - base.max() + LIMIT + 1)
    with pytest.raises(ValueError, match=rf"got {-LIMIT - 1}\b"):
        mha(x, base - base.min() - LIMIT - 1)
    if name != "xpos":  # xPos refuses far earlier: its scales leave float64's range
        assert torch.isfinite(mha(x, base - base.max() + LIMIT)).all()  # 2**53: still exact


@pytest.mark.parametrize("name", RELATIVE)
def test_offset_encodings_are_exact_at_any_shift(name):
    mha, x = _layer(name), torch.randn(1, T, C, dtype=torch.float64)
    base = _positions(mha)
    torch.testing.assert_close(mha(x, base + 2**62), mha(x, base), rtol=0, atol=0)


def test_absolute_encodings_refuse_positions_beyond_2_53():
    far = torch.tensor([LIMIT + 1])
    for make in (
        lambda p: posenc.SinusoidalPositionalEncoding(8).encoding(p),
        lambda p: sinusoidal_layout_table(p, 8),
        lambda p: posenc.rope_cos_sin(p, torch.ones(2)),
    ):
        with pytest.raises(ValueError, match=r"2\*\*53"):
            make(far)
        make(far - 1)


def test_a_float32_computation_refuses_positions_beyond_2_24():
    """FoPE forms its angles in float32 for float32 input."""
    mha = _layer("fope").float()
    x = torch.randn(1, T, C)
    with pytest.raises(ValueError, match=r"2\*\*24, the integers float32 holds"):
        mha(x, torch.arange(T) + 2**24 - T + 2)
    assert torch.isfinite(mha(x, torch.arange(T) + 2**24 - T + 1)).all()


@settings(max_examples=50, deadline=None)
@given(
    position=st.integers(-(2**63), 2**63 - 1),
    dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]),
)
def test_float_positions_is_exact_or_refuses(position, dtype):
    """Accepted integers convert exactly (and back); the rest are refused, or NaN where no
    host sync may read them (``torch.compile``)."""
    limit = int(2 / torch.finfo(dtype).eps)
    p = torch.tensor([position, 0])
    if abs(position) <= limit:
        assert int(float_positions(p, dtype)[0]) == position
        return
    with pytest.raises(ValueError, match=rf"within \+-{limit}\b.*got {position}\b"):
        float_positions(p, dtype)


def test_float_positions_under_compile_are_nan_beyond_the_limit(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    got = float_positions(torch.tensor([LIMIT + 1, LIMIT, -LIMIT - 1, 3]), torch.float64)
    torch.testing.assert_close(
        got, torch.tensor([float("nan"), LIMIT, float("nan"), 3.0], dtype=torch.float64),
        equal_nan=True, **tolerances(torch.float64),
    )  # fmt: skip
