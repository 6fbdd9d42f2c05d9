"""Positions at the edges real use reaches: huge values, every integer dtype, NaN/inf.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model.

Cost must follow the number of positions asked for, not their value: a decode step at
position 2^24 may not build a 2^24-row table (it took 2.3 GB at 2^20 and failed at 2^24
before the caches were bounded). Integer positions of any dtype mean the same positions
(a uint8 index tensor used to be read as a boolean mask); NaN/inf are refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from conftest import tolerances
from posenc.reference import absolute as ref_abs
from posenc.reference import rope as ref_rope

HUGE = [2**24 - 3, 2**24, 2**24 + 7]
EPS32 = torch.finfo(torch.float32).eps


def _table_rows(tables: dict) -> int:
    return max((v[0] if isinstance(v, tuple) else v).shape[0] for v in tables.values())


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_at_huge_positions_is_exact_and_builds_no_huge_table(gen, interleaved):
    rope = posenc.RotaryEmbedding(16, interleaved=interleaved, max_len=64)
    rope.rotate(*(torch.randn(1, 2, 4, 16, generator=gen),) * 2, *(torch.arange(4),) * 2)
    q = torch.randn(1, 2, len(HUGE), 16, generator=gen)
    positions = torch.tensor(HUGE)
    q_rot, _ = rope.rotate(q, q, positions, positions)
    want = ref_rope.rope_rotate(
        q.numpy(), positions.numpy(), ref_rope.rope_frequencies(16), interleaved=interleaved
    )
    # cos/sin are float32 rounded once from float64 angles; then a product and a sum
    atol = 4 * EPS32 * float(q.abs().max())
    np.testing.assert_allclose(q_rot.numpy(), want, rtol=0, atol=atol)
    assert _table_rows(rope._state.tables) <= posenc.encodings.rotary.module.TABLE_ROWS


def test_sinusoidal_at_huge_positions_is_exact_and_builds_no_huge_table():
    enc = posenc.SinusoidalPositionalEncoding(8, max_len=16)
    x = torch.zeros(1, len(HUGE), 8)
    out = enc(x, torch.tensor(HUGE))
    want = ref_abs.sinusoidal_positional_encoding_at(np.array(HUGE), 8)
    np.testing.assert_allclose(out[0].numpy(), want, rtol=0, atol=EPS32)
    enc(torch.zeros(1, 4, 8))
    assert _table_rows(enc._tables) <= posenc.encodings.sinusoidal.TABLE_ROWS


def test_learned_interpolation_reads_only_the_rows_asked_for(gen):
    enc = posenc.LearnedPositionalEncoding(4, 16, beyond="interpolate")
    length = 2**20
    positions = torch.tensor([0, 3, 5000, length - 1])
    got = enc.encoding(positions).detach()
    table = ref_abs.interpolate_table(enc.weight.detach().double().numpy(), length)
    np.testing.assert_allclose(got.numpy(), table[positions.numpy()], **tolerances(torch.float32))


def test_learned_interpolation_keeps_the_rule_of_f_interpolate(gen):
    enc = posenc.LearnedPositionalEncoding(6, 16, beyond="interpolate")
    rows = enc.weight.detach().t().unsqueeze(0)  # [1, C, max_len]
    for length in (17, 40, 333):
        theirs = torch.nn.functional.interpolate(rows, size=length, mode="linear")
        torch.testing.assert_close(enc.table(length).detach(), theirs[0].t())


def test_attention_decode_step_at_a_huge_position_matches_a_shifted_one():
    torch.manual_seed(0)
    layer = posenc.MultiHeadAttention(32, 4, position="rope").eval()
    x = torch.randn(1, 3, 32)
    with torch.no_grad():
        near = layer(x, torch.arange(3) + 10)
        far = layer(x, torch.arange(3) + 2**24)  # RoPE scores depend on differences only
    # angles are formed in float64, so cos/sin at 2^24 are as exact as at 10 (half an ulp)
    torch.testing.assert_close(far, near, **tolerances(torch.float32, ops=32))


INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.uint16, torch.uint32]


def _each_encoding(positions: torch.Tensor) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(2, positions.shape[-1], 16)
    q = torch.randn(2, 2, positions.shape[-1], 8)
    out = {
        "sinusoidal": posenc.SinusoidalPositionalEncoding(16)(x, positions),
        "learned": posenc.LearnedPositionalEncoding(16, 128)(x, positions),
        "rope": posenc.RotaryEmbedding(8).rotate(q, q, positions, positions)[0],
        "alibi": posenc.ALiBi(2).score_bias(q, q, positions, positions),
        "sinusoidal_table": posenc.sinusoidal_table(positions, 16),
        "rope_cos_sin": posenc.rope_cos_sin(positions, torch.ones(4, dtype=torch.float64))[0],
    }
    torch.manual_seed(0)
    layer = posenc.MultiHeadAttention(16, 2, position="rope").eval()
    with torch.no_grad():
        out["attention"] = layer(x, positions)
    return out


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_every_integer_dtype_means_the_same_positions(dtype):
    positions = torch.tensor([0, 5, 1, 77, 100, 3])
    want = _each_encoding(positions)
    got = _each_encoding(positions.to(dtype))
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize(
    "call",
    [
        lambda p: posenc.RotaryEmbedding(8).rotate(*(torch.zeros(1, 1, 2, 8),) * 2, p, p),
        lambda p: posenc.SinusoidalPositionalEncoding(8)(torch.zeros(1, 2, 8), p),
        lambda p: posenc.sinusoidal_table(p, 8),
        lambda p: posenc.rope_cos_sin(p, torch.ones(2, dtype=torch.float64)),
        lambda p: posenc.MultiHeadAttention(8, 2, position="alibi")(torch.zeros(1, 2, 8), p),
    ],
    ids=["rope", "sinusoidal", "sinusoidal_table", "rope_cos_sin", "attention"],
)
def test_non_finite_float_positions_are_refused_by_name(call, bad):
    with pytest.raises(ValueError, match=r"(positions|q_pos) must be finite, got (nan|inf|-inf)"):
        call(torch.tensor([1.0, bad]))
