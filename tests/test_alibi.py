"""ALiBi: slopes against the paper's definition, the bias against the float64 reference,
query blocks, bf16 recency at long lengths, score_mod, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from conftest import tolerances
from posenc import ALiBi, alibi_slopes
from posenc.encodings.alibi import alibi_bias
from posenc.reference import alibi_bias as ref_alibi_bias
from posenc.reference import alibi_slopes as ref_alibi_slopes

DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def _qk(batch: int, heads: int, tq: int, tk: int, dtype=torch.float32):
    return torch.zeros(batch, heads, tq, 4, dtype=dtype), torch.zeros(
        batch, heads, tk, 4, dtype=dtype
    )


def _reference(q_pos: torch.Tensor, k_pos: torch.Tensor, heads: int, causal: bool) -> np.ndarray:
    """``[B|1, H, Tq, Tk]`` reference, one row of positions at a time."""
    qs = q_pos.reshape(-1, q_pos.shape[-1]).numpy()
    ks = k_pos.reshape(-1, k_pos.shape[-1]).numpy()
    rows = max(len(qs), len(ks))
    slopes = ref_alibi_slopes(heads)
    return np.stack(
        [
            ref_alibi_bias(qs[b % len(qs)], ks[b % len(ks)], slopes, causal=causal)
            for b in range(rows)
        ]
    )


@pytest.mark.parametrize("heads", range(1, 65))
def test_slopes_match_the_official_definition(heads):
    expected = ref_alibi_slopes(heads)
    got = alibi_slopes(heads, dtype=torch.float64).numpy()
    # the official code raises a rounded 2^(-8/n) to the h-th power: its relative error
    # grows to about (h + 2) eps; posenc computes 2^(-8h/n) directly
    np.testing.assert_allclose(got, expected, rtol=(heads + 2) * np.finfo(np.float64).eps, atol=0)
    torch.testing.assert_close(
        alibi_slopes(heads), torch.from_numpy(expected).float(), **tolerances(torch.float32, ops=1)
    )


def test_slopes_worked_values():
    # power of two: 2^(-8h/8) = 2^-h; six heads: slopes(4) then every other of slopes(8)
    assert alibi_slopes(8).tolist() == [2.0**-h for h in range(1, 9)]
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "q_pos, k_pos",
    [
        (torch.arange(7), torch.arange(7)),
        (torch.arange(5, 9), torch.arange(9)),  # a block of queries (decoding-like)
        (
            torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13]]),
            torch.tensor([[0, 1, 2, 3], [7, 9, 10, 13]]),
        ),
        (torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6, 5])),  # arbitrary
        (torch.tensor([0.5, 2.25, 3.0]), torch.tensor([0.0, 1.5, 2.75, 3.0])),  # real positions
    ],
)
def test_bias_matches_reference(dtype, causal, q_pos, k_pos):
    heads = 6
    q, k = _qk(2, heads, q_pos.shape[-1], k_pos.shape[-1], dtype)
    bias = ALiBi(heads, causal=causal).score_bias(q, k, q_pos, k_pos)
    assert bias.dtype == dtype
    expected = torch.from_numpy(_reference(q_pos, k_pos, heads, causal))
    assert bias.shape == expected.shape
    torch.testing.assert_close(bias.double(), expected, **tolerances(dtype))


def test_pure_function_equals_module():
    q_pos, k_pos = torch.arange(3, 8), torch.arange(8)
    q, k = _qk(1, 4, 5, 8)
    torch.testing.assert_close(alibi_bias(q_pos, k_pos, 4), ALiBi(4).score_bias(q, k, q_pos, k_pos))


@pytest.mark.parametrize("start, stop", [(0, 4), (4, 9), (8, 12)])
def test_query_block_equals_rows_of_full_bias(start, stop):
    enc = ALiBi(5)
    positions = torch.arange(12) + 100
    q, k = _qk(1, 5, 12, 12)
    full = enc.score_bias(q, k, positions, positions)
    block = enc.score_bias(q[:, :, start:stop], k, positions[start:stop], positions)
    torch.testing.assert_close(block, full[:, :, start:stop], rtol=0, atol=0)


def test_bf16_keeps_recency_signal_at_long_lengths():
    # Two queries at the end of a 65536-token context against every key: near the
    # diagonal the bias steps by exactly one slope per key, even in bf16.
    heads, length = 8, 1 << 16
    q_pos, k_pos = torch.arange(length - 2, length), torch.arange(length)
    q, k = _qk(1, heads, 2, length, torch.bfloat16)
    bias = ALiBi(heads).score_bias(q, k, q_pos, k_pos)[0]  # [H, 2, T]
    slopes = alibi_slopes(heads).to(torch.bfloat16)
    for row, i in enumerate(q_pos.tolist()):
        window = bias[:, row, i - 8 : i + 1]  # keys i-8 .. i
        steps = window[:, 1:] - window[:, :-1]
        assert torch.equal(window[:, -1], torch.zeros(heads, dtype=torch.bfloat16))
        assert torch.equal(steps, slopes[:, None].expand_as(steps))


def test_slopes_survive_a_dtype_cast():
    enc = ALiBi(8).to(torch.bfloat16)
    assert enc.slopes().dtype == torch.float64
    q, k = _qk(1, 8, 3, 3)
    torch.testing.assert_close(
        enc.score_bias(q, k, torch.arange(3), torch.arange(3)),
        ALiBi(8).score_bias(q, k, torch.arange(3), torch.arange(3)),
        rtol=0,
        atol=0,
    )


def test_registry_builds_alibi():
    enc = posenc.build("alibi", d_model=32, num_heads=4, head_dim=8, max_len=16, causal=False)
    assert isinstance(enc, ALiBi) and enc.num_heads == 4 and not enc.causal


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("causal", [True, False])
def test_score_mod_matches_dense_bias(causal):
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 8, 8, generator=gen) for _ in range(3))
    enc = ALiBi(4, causal=causal)
    try:
        out = flex.flex_attention(q, k, v, score_mod=enc.score_mod())
    except Exception as err:  # pragma: no cover - depends on the torch build
        pytest.skip(f"flex_attention does not run here: {err}")
    bias = enc.score_bias(q, k, torch.arange(8), torch.arange(8))
    dense = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5 + bias, -1) @ v
    torch.testing.assert_close(out, dense, **tolerances(torch.float32, ops=64))


@pytest.mark.parametrize("heads", [0, -3])
def test_bad_num_heads_raises(heads):
    with pytest.raises(ValueError, match=str(heads)):
        ALiBi(heads)
    with pytest.raises(ValueError, match=str(heads)):
        alibi_slopes(heads)


def test_bad_inputs_raise():
    enc = ALiBi(4)
    q, k = _qk(1, 4, 3, 3)
    with pytest.raises(TypeError, match="num_heads"):
        ALiBi(2.5)
    with pytest.raises(ValueError, match=r"\(4, 3, 4\)"):
        enc.score_bias(q[0], k, torch.arange(3), torch.arange(3))
    with pytest.raises(ValueError, match="3 heads"):
        enc.score_bias(q[:, :3], k[:, :3], torch.arange(3), torch.arange(3))
    with pytest.raises(ValueError, match=r"k_pos.*\(5,\)"):
        enc.score_bias(q, k, torch.arange(3), torch.arange(5))
    with pytest.raises(TypeError, match="bfloat16"):
        enc.score_bias(q, k, torch.arange(3, dtype=torch.bfloat16), torch.arange(3))
    with pytest.raises(ValueError, match=r"\(2, 2, 3\)"):
        alibi_bias(torch.zeros(2, 2, 3), torch.arange(3), 4)
