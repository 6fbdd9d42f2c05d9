"""Compose with structured positions, and the registry's position shapes.

``MultiHeadAttention`` hands an encoding's ``attention_positions`` the positions it was
given; a ``Compose`` forwards them to its structured part (M-RoPE ``[3, B, T]``, axial
RoPE ``[N, 2]``) and gives the other parts the tokens' indices. Checked against a float64
NumPy attention written from the formulas (Wang et al. 2024, Qwen2-VL sec. 2.1; Meta
2025, Llama 4 attention temperature; Su et al. 2021, RoFormer).

Shapes: ``B`` batch, ``H`` heads, ``Hkv`` key/value heads, ``T`` length, ``D`` head_dim,
``C`` d_model.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import posenc
from conftest import tolerances
from posenc import (
    AxialRope,
    Compose,
    KVCache,
    Llama3Scaling,
    MRoPE,
    MultiHeadAttention,
    PositionalEncoding,
    PositionTemperature,
    RotaryEmbedding,
    Site,
)
from posenc.base import POSITION_SHAPES
from posenc.encodings.rotary.mrope import mrope_decode_positions, mrope_position_ids
from posenc.lab.config import resolve_encodings
from posenc.reference import llama3_frequencies, rope_frequencies, rope_rotate
from posenc.reference import rope_schemes as ref

B, H, KV, D = 2, 4, 2, 16
C = H * D
SECTIONS = [2, 3, 3]
#: text, a 2 x 4 x 4 video grid merged 2 x 2 (8 tokens), text: T = 13
SEGMENTS = [3, (2, 4, 4), 2]
OPS = 2 * C + 4 * D  # roundings along the longest chain: projections, logits, sums
TIGHT = tolerances(torch.float64, ops=64 * OPS)  # angles up to ~60 rad: their rounding too


def _layer(position: PositionalEncoding, *, seed: int = 0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(C, H, position=position, num_kv_heads=KV).double().eval()


def _x(length: int, *, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, length, C, generator=g, dtype=torch.float64)


def _mrope_positions() -> torch.Tensor:
    """``[3, B, T]``: the text + video sequence, the second one shifted by 5 on every axis."""
    pos, _ = mrope_position_ids(SEGMENTS, spatial_merge_size=2)
    return torch.stack((pos, pos + 5), dim=1)


def reference_attention(mha: MultiHeadAttention, x: torch.Tensor, rotate) -> torch.Tensor:
    """Float64 causal attention of ``mha``'s weights over ``x [B, T, C]``, with
    ``rotate(q [B, H, T, D], k [B, Hkv, T, D]) -> (q, k)`` applied to the projections."""
    w = {n: getattr(mha, f"{n}_proj").weight.detach().double().numpy() for n in ("q", "k", "v")}
    xs = x.double().numpy()
    batch, length, _ = xs.shape

    def heads(name: str, count: int) -> np.ndarray:
        return (xs @ w[name].T).reshape(batch, length, count, D).transpose(0, 2, 1, 3)

    q, k = rotate(heads("q", H), heads("k", KV))
    k, v = (np.repeat(t, H // KV, axis=1) for t in (k, heads("v", KV)))
    logits = q @ k.swapaxes(-1, -2) / math.sqrt(D)  # [B, H, T, T]
    logits[..., np.triu(np.ones((length, length), dtype=bool), 1)] = -np.inf
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, C)
    return torch.from_numpy(out @ mha.out_proj.weight.detach().double().numpy().T)


def _temperature(q: np.ndarray, index: np.ndarray, beta: float, length: int, offset: int):
    """``q [B, H, T, D]`` scaled by the temperature of the token indices ``[T]``."""
    return q * ref.position_temperature(index, beta, length, offset)[:, None]


# --------------------------------------------------------------------------- M-RoPE


def test_attention_with_mrope_and_temperature_matches_the_float64_reference():
    enc = Compose([MRoPE(D, mrope_section=SECTIONS), PositionTemperature(0.3, 4, offset=1)])
    mha, pos = _layer(enc), _mrope_positions()
    x = _x(pos.shape[-1])
    theta = rope_frequencies(D)
    index = np.arange(pos.shape[-1])

    def rotate(q, k):
        q = ref.mrope_rotate(q, pos.numpy(), theta, SECTIONS)
        k = ref.mrope_rotate(k, pos.numpy(), theta, SECTIONS)
        return _temperature(q, index, 0.3, 4, 1), k

    torch.testing.assert_close(mha(x, pos), reference_attention(mha, x, rotate), **TIGHT)


@pytest.mark.parametrize("order", ["mrope first", "temperature first"])
def test_identity_temperature_leaves_mrope_alone_unchanged(order):
    mrope = MRoPE(D, mrope_section=SECTIONS, mrope_interleaved=True)
    parts = [mrope, PositionTemperature(0.1, 8192)]  # 1 below position 8192
    alone, composed = (
        _layer(mrope),
        _layer(Compose(parts if order == "mrope first" else parts[::-1])),
    )
    pos = _mrope_positions()
    x = _x(pos.shape[-1])
    torch.testing.assert_close(composed(x, pos), alone(x, pos), rtol=0, atol=0)
    assert composed.position.position_shape == "[A, T]"


def test_mrope_text_positions_reach_every_part_as_plain_rope_does():
    """Text positions ``[B, T]`` are token positions for M-RoPE and the temperature alike:
    the composition equals RoPE + temperature at those positions."""
    temp = PositionTemperature(0.5, 3)
    mrope = _layer(Compose([MRoPE(D, mrope_section=SECTIONS), temp]))
    rope = _layer(Compose([RotaryEmbedding(D), temp]))
    pos = torch.stack((torch.arange(9) + 4, torch.arange(9) * 2))
    x = _x(9)
    torch.testing.assert_close(mrope(x, pos), rope(x, pos), **tolerances(torch.float64, ops=OPS))


def test_mrope_and_temperature_decoding_with_a_kv_cache_equals_the_full_forward():
    """The temperature follows the token index across cached steps; M-RoPE continues at
    the decoding positions (``rope_delta``)."""
    enc = Compose([PositionTemperature(0.4, 3), MRoPE(D, mrope_section=SECTIONS)])
    mha = _layer(enc)
    prompt, delta = mrope_position_ids(SEGMENTS, spatial_merge_size=2)
    tail = mrope_decode_positions(prompt.shape[1], 4, delta)
    pos = torch.cat((prompt, tail), dim=1)
    x = _x(pos.shape[1])
    full = mha(x, pos)
    cache, steps, cut = KVCache(), [], [0, prompt.shape[1], prompt.shape[1] + 1, pos.shape[1]]
    for start, stop in itertools.pairwise(cut):
        steps.append(mha(x[:, start:stop], pos[:, start:stop], cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **tolerances(torch.float64, ops=OPS))


# --------------------------------------------------------------------------- Llama 4


def test_llama4_style_rope_and_temperature_match_the_float64_reference():
    """Llama 4's interleaved RoPE with its llama3 scaling, composed with a query
    temperature (``attn_scale``, ``floor_scale``, index + 1), at per-sequence positions."""
    scaling = Llama3Scaling(8.0, 1.0, 4.0, 16)
    enc = Compose([RotaryEmbedding(D, base=500000.0, scaling=scaling, interleaved=True),
                   PositionTemperature(0.1, 4, offset=1)])  # fmt: skip
    mha = _layer(enc)
    pos = torch.stack((torch.arange(11), torch.arange(11) + 20))
    x = _x(11)
    theta = llama3_frequencies(D, 500000.0, 8.0, 1.0, 4.0, 16)

    def rotate(q, k):
        q = rope_rotate(q, pos.numpy(), theta, interleaved=True)
        scale = ref.position_temperature(pos.numpy(), 0.1, 4, 1)[:, None, :, None]
        return q * scale, rope_rotate(k, pos.numpy(), theta, interleaved=True)

    torch.testing.assert_close(mha(x, pos), reference_attention(mha, x, rotate), **TIGHT)


# --------------------------------------------------------------------------- axial


def test_axial_rope_and_temperature_in_attention_match_the_float64_reference():
    enc = Compose([AxialRope(D), PositionTemperature(0.2, 2)])
    mha = _layer(enc)
    grid = posenc.axial_positions((3, 4))  # [12, 2]
    x = _x(12)

    def rotate(q, k):
        q, k = (ref.axial_rotate(t, grid.numpy(), D, 10000.0) for t in (q, k))
        return _temperature(q, np.arange(12), 0.2, 2, 0), k

    torch.testing.assert_close(mha(x, grid), reference_attention(mha, x, rotate), **TIGHT)
    assert enc.position_shape == "[N, A]"


def test_a_composed_axial_rope_refuses_token_positions():
    mha = _layer(Compose([PositionTemperature(), AxialRope(D)]))
    with pytest.raises(ValueError, match=r"axial RoPE .*got shape \(12,\)"):
        mha(_x(12))
    with pytest.raises(ValueError, match=r"axial RoPE .*got shape \(2, 12\)"):
        mha(_x(12), torch.arange(12).expand(B, -1))


# --------------------------------------------------------------------------- contract


def test_parts_needing_different_structured_positions_are_named():
    with pytest.raises(ValueError, match=r"MRoPE \(item 0\) \[A, T\], AxialRope \(item 2\)"):
        Compose([MRoPE(D), RotaryEmbedding(D), AxialRope(D)])
    nested = Compose([Compose([MRoPE(D)]), PositionTemperature()])
    assert nested.position_shape == "[A, T]"  # a Compose declares its part's shape
    with pytest.raises(ValueError, match=r"Compose \(item 0\) \[A, T\], AxialRope \(item 1\)"):
        Compose([nested, AxialRope(D)])


def test_compose_of_token_encodings_passes_positions_through():
    enc = Compose([RotaryEmbedding(D), PositionTemperature()])
    pos = torch.arange(5)
    token, rotary = enc.attention_positions(pos, batch=B, length=5)
    assert token is pos and rotary is None and enc.position_shape == "[T]"


def test_compose_holds_each_part_once():
    """The structured part is found again by index, not held twice (state dict, moves)."""
    enc = Compose([PositionTemperature(), MRoPE(D)])
    assert [name for name, _ in enc.named_children()] == ["encodings"]


def test_every_registered_encoding_declares_a_known_position_shape():
    shapes = {name: posenc.info(name).position_shape for name in posenc.available()}
    assert set(shapes.values()) <= set(POSITION_SHAPES), shapes
    assert shapes["mrope"] == "[A, T]" and shapes["axial_rope"] == "[N, A]"
    for name in ("temperature", "mla_rope", "rope"):
        assert shapes[name] == "[T]"
    for name, shape in shapes.items():
        if shape != "[T]":
            assert callable(getattr(posenc.info(name).cls, "attention_positions", None)), name


class _Patches(PositionalEncoding):
    sites = Site.QK
    position_shape = "[N, A]"


def test_register_refuses_an_unknown_or_unusable_position_shape():
    class Grid(PositionalEncoding):
        position_shape = "[H, W]"

    with pytest.raises(ValueError, match=r"Grid.position_shape is '\[H, W\]'; known: \[T\]"):
        posenc.register("grid", paper="-", description="-")(Grid)
    with pytest.raises(ValueError, match=r"_Patches declares positions \[N, A\] but no attention"):
        posenc.register("patches", paper="-", description="-")(_Patches)
    assert "grid" not in posenc.available() and "patches" not in posenc.available()
    with pytest.raises(TypeError, match=r"item 1 \(_Patches\) declares positions \[N, A\]"):
        Compose([RotaryEmbedding(D), _Patches()])


def test_the_lab_trains_token_encodings_and_refuses_patch_encodings():
    """``posenc lab --encodings all``: the structured text encodings (M-RoPE reads token
    positions as text) but not axial RoPE, which needs image coordinates."""
    names = resolve_encodings(["all"])
    assert {"mrope", "mla_rope", "temperature", "rope"} <= set(names)
    assert "axial_rope" not in names
    with pytest.raises(ValueError, match="'axial_rope' takes image patch coordinates"):
        resolve_encodings(["rope,axial_rope"])
