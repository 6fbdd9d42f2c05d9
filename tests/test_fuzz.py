"""Fuzzing the public entry points: random dtypes, ranks, sizes and values.

Each drawn call is classified, and only two outcomes pass:

* a clear error: ``ValueError`` or ``TypeError`` raised by posenc's own code (the
  innermost frame is in the package), whose message names the argument that was made
  bad; or
* a result equal to a float64 reference written here from the formula, within a
  tolerance derived from the dtype.

Anything else fails: an error from inside torch, an exception of another type, a result
for an input that was drawn to be invalid, or a wrong result. Inputs are drawn valid
about half the time, so both branches are exercised.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model.
"""

from __future__ import annotations

import math
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc

PACKAGE = Path(posenc.__file__).parent
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
NOT_FLOATS = [torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64]
H, D = 2, 4


@dataclass
class Drawn:
    """One tensor argument: its value, and the reason it is invalid (None if valid)."""

    name: str
    value: object
    bad: str | None = None

    @property
    def meta(self) -> bool:
        return isinstance(self.value, torch.Tensor) and self.value.device.type == "meta"


def _data(draw, name: str, shape: tuple[int, ...], *, allow_bad: bool = True) -> Drawn:
    """A data tensor of ``shape``: valid floats (NaN/inf sprinkled in), or one defect."""
    defect = (
        draw(st.sampled_from(["none"] * 4 + ["dtype", "rank", "list", "meta"]))
        if allow_bad
        else "none"
    )
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    values = torch.randn(shape, generator=g, dtype=torch.float64) * draw(
        st.sampled_from([1.0, 1e3])
    )
    if values.numel() and draw(st.booleans()):
        values.view(-1)[draw(st.integers(0, values.numel() - 1))] = draw(
            st.sampled_from([math.nan, math.inf])
        )
    if defect == "dtype":
        dtype = draw(st.sampled_from(NOT_FLOATS))
        return Drawn(name, values.nan_to_num().to(dtype), str(dtype))
    dtype = draw(st.sampled_from(FLOATS))
    if defect == "rank":
        return Drawn(name, values.to(dtype).unsqueeze(0), name)
    if defect == "list":
        return Drawn(name, values.tolist(), name)
    if defect == "meta":  # valid but value-less: shapes only, or an error naming meta
        return Drawn(name, values.to(dtype).to("meta"))
    return Drawn(name, values.to(dtype))


def _positions(
    draw, name: str, length: int, *, integer_only: bool = False, low: int = -(2**20)
) -> Drawn:
    """Positions ``[T]`` or ``[1, T]``: valid integers/floats, or one defect."""
    kind = draw(st.sampled_from(["int"] * 4 + ["float", "half", "bool", "nan", "length", "rank"]))
    start = draw(st.integers(low, 2**20))
    base = torch.arange(start, start + length)
    if draw(st.booleans()):
        base = base.unsqueeze(0)
    if kind == "int":
        return Drawn(name, base.to(draw(st.sampled_from([torch.int64, torch.int32]))))
    if kind == "float":
        return Drawn(name, base.to(torch.float64) + 0.5, "integer" if integer_only else None)
    if kind == "half":
        return Drawn(name, base.to(torch.bfloat16), "bfloat16")
    if kind == "bool":
        return Drawn(name, base > start, "bool")
    if kind == "nan" and length:
        bad = base.to(torch.float64)
        bad.view(-1)[0] = math.nan
        return Drawn(name, bad, "integer" if integer_only else "finite")
    if kind == "nan":  # nothing to poison
        return Drawn(name, base)
    if kind == "length":
        return Drawn(name, torch.arange(start, start + length + 1), name)
    return Drawn(name, base.view(1, 1, -1), name)


def _classify(call, drawn: list[Drawn], check) -> None:
    """Run ``call``; pass on a clear posenc error for bad input, or on a checked result."""
    bad = [d for d in drawn if d.bad is not None]
    meta = [d for d in drawn if d.meta]
    try:
        out = call()
    except (ValueError, TypeError) as error:
        frame = traceback.extract_tb(error.__traceback__)[-1]
        assert Path(frame.filename).is_relative_to(PACKAGE), (
            f"{error!r} raised inside {frame.filename}"
        )
        assert bad or meta, f"valid input refused: {error}"
        message = str(error)
        named = [d.bad for d in bad] + [d.name for d in bad] + ["meta"] * bool(meta)
        assert any(re.search(rf"\b{re.escape(n)}\b", message) for n in named), (named, message)
        return
    assert not bad, f"accepted bad {[(d.name, d.bad) for d in bad]}"
    if meta:  # shapes only: the result must be a meta tensor
        first = out[0] if isinstance(out, tuple) else out
        assert first.device.type == "meta", first.device
        return
    check(out)


def _maxabs(x: torch.Tensor) -> float:
    """The largest finite magnitude of ``x`` (1 for an empty or all-non-finite tensor)."""
    finite = x[torch.isfinite(x)].to(torch.float64)
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


def _close(
    got: torch.Tensor,
    want: torch.Tensor,
    dtype: torch.dtype,
    scale: float = 1.0,
    angle: float = 0.0,
) -> None:
    """``got`` equals the float64 ``want`` rounded to ``dtype`` (overflow included), up to a
    few roundings of ``dtype`` relative to the value and to ``scale``, plus the float64
    rounding of angles up to ``angle`` (the formula's own ``|angle| * eps64``)."""
    eps = torch.finfo(dtype).eps
    rounded = want.to(dtype).to(torch.float64)
    atol = 4 * eps * scale + 8 * torch.finfo(torch.float64).eps * angle
    torch.testing.assert_close(
        got.to(torch.float64), rounded, rtol=4 * eps, atol=atol, equal_nan=True
    )


def _alibi_reference(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Press et al. 2022: -m_h (i - j), m_h = 2^(-8 h / H) for H = 2 (float64)."""
    slopes = torch.tensor([2.0 ** (-8 * h / H) for h in range(1, H + 1)], dtype=torch.float64)
    d = q_pos.to(torch.float64)[..., :, None] - k_pos.to(torch.float64)[..., None, :]
    d = d if d.dim() == 3 else d.unsqueeze(0)
    return -slopes.view(1, -1, 1, 1) * d.unsqueeze(1)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), tq=st.integers(0, 5), tk=st.integers(1, 5))
def test_fuzz_alibi_score_bias(data, tq, tk):
    draw = data.draw
    q = _data(draw, "q", (1, H, tq, D))
    k = _data(draw, "k", (1, H, tk, D), allow_bad=False)
    if isinstance(q.value, torch.Tensor) and q.bad is None:
        k.value = k.value.to(q.value.dtype)
    q_pos, k_pos = _positions(draw, "q_pos", tq), _positions(draw, "k_pos", tk)
    enc = posenc.ALiBi(H)

    def check(out):
        _close(out, _alibi_reference(q_pos.value, k_pos.value), q.value.dtype)

    _classify(
        lambda: enc.score_bias(q.value, k.value, q_pos.value, k_pos.value),
        [q, k, q_pos, k_pos],
        check,
    )


def _t5_bucket(r: int, num_buckets: int = 32, max_distance: int = 128) -> int:
    """Raffel et al. 2020 (bidirectional): sign halves, exact then log-spaced buckets."""
    half = num_buckets // 2
    side, n = (half if r > 0 else 0), abs(r)
    exact = half // 2
    if n < exact:
        return side + n
    scaled = math.log(n / exact) / math.log(max_distance / exact) * (half - exact)
    return side + min(exact + int(scaled), half - 1)


@settings(max_examples=120, deadline=None)
@given(data=st.data(), tq=st.integers(0, 4), tk=st.integers(1, 4))
def test_fuzz_t5_score_bias(data, tq, tk):
    draw = data.draw
    q = _data(draw, "q", (1, H, tq, D))
    k = _data(draw, "k", (1, H, tk, D), allow_bad=False)
    if isinstance(q.value, torch.Tensor) and q.bad is None:
        k.value = k.value.to(q.value.dtype)
    q_pos = _positions(draw, "q_pos", tq, integer_only=True)
    k_pos = _positions(draw, "k_pos", tk, integer_only=True)
    enc = posenc.T5RelativeBias(H, bidirectional=True)
    table = enc.relative_attention_bias.weight.detach().to(torch.float64)

    def check(out):
        qp, kp = q_pos.value.reshape(-1).tolist(), k_pos.value.reshape(-1).tolist()
        buckets = torch.tensor([_t5_bucket(j - i) for i in qp for j in kp], dtype=torch.int64)
        want = table[buckets].T.reshape(1, H, len(qp), len(kp))
        _close(out.expand_as(want), want, q.value.dtype)

    _classify(
        lambda: enc.score_bias(q.value, k.value, q_pos.value, k_pos.value),
        [q, k, q_pos, k_pos],
        check,
    )


def _sinusoid(positions: torch.Tensor, width: int) -> torch.Tensor:
    """Vaswani et al. 2017, sec. 3.5: sin/cos at 2i/2i+1 of p * 10000^(-2i/C) (float64)."""
    i = torch.arange(0, width, 2, dtype=torch.float64)
    angles = positions.to(torch.float64)[..., None] * 10000.0 ** (-i / width)
    return torch.stack((angles.sin(), angles.cos()), -1).flatten(-2)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), t=st.integers(0, 5), which=st.sampled_from(["sinusoidal", "learned"]))
def test_fuzz_input_encodings(data, t, which):
    draw = data.draw
    width = 2 * D
    x = _data(draw, "x", (1, t, width))
    learned = which == "learned"
    positions = _positions(
        draw, "positions", t, integer_only=learned, low=0 if learned else -(2**20)
    )
    if (
        learned
        and positions.bad is None
        and positions.value.numel()
        and int(positions.value.max()) >= 64
    ):
        positions.bad = "64"  # beyond the table: the error names max_len=64
    enc = (
        posenc.LearnedPositionalEncoding(width, 64)
        if learned
        else posenc.SinusoidalPositionalEncoding(width)
    )

    def check(out):
        p = positions.value
        pe = enc.weight.detach().to(torch.float64)[p.long()] if learned else _sinusoid(p, width)
        want = x.value.to(torch.float64) + pe
        _close(out, want, x.value.dtype, _maxabs(want), angle=_maxabs(p))

    _classify(lambda: enc.embed(x.value, positions.value), [x, positions], check)


def _rotate_reference(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Su et al. 2021 (half-split pairs (i, i + D/2)), angles p * 10000^(-2i/D) (float64)."""
    x = x.to(torch.float64)
    half = D // 2
    angles = positions.to(torch.float64)[..., None] * 10000.0 ** (
        -torch.arange(half, dtype=torch.float64) * 2 / D
    )
    cos, sin = angles.cos(), angles.sin()
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), -1)


@settings(max_examples=120, deadline=None)
@given(data=st.data(), t=st.integers(0, 5))
def test_fuzz_rope_rotate(data, t):
    draw = data.draw
    q = _data(draw, "q", (1, H, t, D))
    k = _data(draw, "k", (1, H, t, D), allow_bad=False)
    if isinstance(q.value, torch.Tensor) and q.bad is None:
        k.value = k.value.to(q.value.dtype)
    pos = _positions(draw, "q_pos", t, low=-(2**10))
    enc = posenc.RotaryEmbedding(D)

    def check(out):
        want = _rotate_reference(q.value, pos.value)
        _close(
            out[0],
            want,
            q.value.dtype,
            _maxabs(q.value),
            angle=_maxabs(pos.value) * _maxabs(q.value),
        )

    _classify(lambda: enc.rotate(q.value, k.value, pos.value, pos.value), [q, k, pos], check)


@settings(max_examples=100, deadline=None)
@given(
    heads=st.one_of(st.integers(-2, 40), st.sampled_from([2.0, "4", None, True])),
    dtype=st.sampled_from(FLOATS + NOT_FLOATS),
)
def test_fuzz_alibi_slopes(heads, dtype):
    bad = []
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        bad.append(Drawn("num_heads", heads, "num_heads"))
    if not dtype.is_floating_point:
        bad.append(Drawn("dtype", dtype, str(dtype)))

    def check(out):
        c = 2 ** math.floor(math.log2(heads))
        want = [2 ** (-8 * h / c) for h in range(1, c + 1)]
        want += [2 ** (-8 * h / (2 * c)) for h in range(1, 2 * c, 2)][: heads - c]
        _close(out, torch.tensor(want, dtype=torch.float64), dtype)

    _classify(lambda: posenc.alibi_slopes(heads, dtype=dtype), bad, check)


@pytest.mark.parametrize("position", ["nope", "alibi", "rope"])
@settings(max_examples=40, deadline=None)
@given(data=st.data(), t=st.integers(0, 4))
def test_fuzz_attention_layer(position, data, t):
    """The layer on fuzzed ``x``; the reference is the same layer in float64 (its
    positions and projections are checked against formulas elsewhere)."""
    torch.manual_seed(0)
    layer = posenc.MultiHeadAttention(H * D, H, position=position).eval()
    x = _data(data.draw, "x", (1, t, H * D))
    if isinstance(x.value, torch.Tensor) and x.bad is None and x.value.dtype != torch.float32:
        x.bad = str(x.value.dtype)  # the weights are float32: a dtype mismatch is named

    def check(out):
        with torch.no_grad():
            want = layer.double()(x.value.double())
        layer.float()
        _close(out, want, torch.float32, _maxabs(x.value) * 64)

    with torch.no_grad():
        _classify(lambda: layer(x.value), [x], check)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    t=st.integers(0, 5),
    which=st.sampled_from(["sinusoidal_table", "rope_cos_sin", "t5_bucket"]),
    dtype=st.sampled_from(FLOATS + NOT_FLOATS),
)
def test_fuzz_functions(data, t, which, dtype):
    """The functional forms on fuzzed positions and output dtypes."""
    integer_only = which == "t5_bucket"
    positions = _positions(
        data.draw,
        "relative_position" if integer_only else "positions",
        t,
        integer_only=integer_only,
    )
    if positions.bad == positions.name:
        positions.bad = None  # these take positions of any shape
    if integer_only and positions.bad in ("bool", "bfloat16"):
        positions.bad = "integer"  # the bucket function asks for integers by name
    out_dtype = Drawn("dtype", dtype, None if dtype.is_floating_point else str(dtype))
    inv_freq = torch.tensor([1.0, 0.01], dtype=torch.float64)
    calls = {
        "sinusoidal_table": lambda: posenc.sinusoidal_table(positions.value, 4, dtype=dtype),
        "rope_cos_sin": lambda: posenc.rope_cos_sin(positions.value, inv_freq, dtype=dtype),
        "t5_bucket": lambda: posenc.t5_relative_position_bucket(positions.value),
    }
    drawn = [positions] if integer_only else [positions, out_dtype]

    def check(out):
        p = positions.value
        if which == "t5_bucket":
            want = [_t5_bucket(int(r)) for r in p.reshape(-1).tolist()]
            assert out.reshape(-1).tolist() == want
        elif which == "sinusoidal_table":
            _close(out, _sinusoid(p, 4), dtype, angle=_maxabs(p))
        else:
            angles = p.to(torch.float64)[..., None] * inv_freq
            _close(out[0], angles.cos(), dtype, angle=_maxabs(p))
            _close(out[1], angles.sin(), dtype, angle=_maxabs(p))

    _classify(calls[which], drawn, check)
