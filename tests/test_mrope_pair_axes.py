"""M-RoPE with an explicit axis per pair (``MRoPE(pair_axes=...)``) against a float64
reference written from the formula, and the family builders that use it: ERNIE 4.5-VL
(height and width pairs alternate, then time; adjacent pairs), NeoMME (two axes, row and
column pairs alternate; half-split, partial rotary), Qwen2.5-Omni / Qwen3-Omni / Cohere
Compass / GLM-OCR / Qwen4-Exp (the existing section layouts, read from their configs); and
HunYuan-VL's XD-RoPE (``XDRoPE``: axes over feature blocks, so a pair's two features may
follow different axes).

Pair ``p`` rotates by ``pos[axis(p)] * base ** (-2p / R)``. The families' own modules are
compared in ``test_hf_families`` (the walk); here the formula and the config reading.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``A`` axes, ``D`` head_dim, ``R`` rotary
dim, ``P = R/2`` pairs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import posenc
from conftest import tolerances
from posenc import MRoPE, NoPE, NTKAlphaScaling
from posenc.encodings.rotary.mrope_xd import XDRoPE
from posenc.reference import rope_frequencies
from posenc.reference import rope_schemes as ref

B, H, T = 2, 3, 9
SPAN = 300
DTYPES = [torch.float64, torch.float32, torch.bfloat16]

# name: (MRoPE keywords, head_dim, rotary_dim, pair axes written out, axes)
CASES = {
    "ernie": (
        {"interleaved": True, "pair_axes": [1, 2, 1, 2, 1, 2, 0, 0]},
        16,
        16,
        [1, 2, 1, 2, 1, 2, 0, 0],
        3,
    ),
    "neomme_partial": (
        {"rotary_dim": 8, "pair_axes": [0, 1, 0, 1], "num_axes": 2},
        16,
        8,
        [0, 1, 0, 1],
        2,
    ),
    "neomme_full": (
        {"pair_axes": [0, 1] * 4, "num_axes": 2},
        16,
        16,
        [0, 1] * 4,
        2,
    ),
}


def _reference(x, positions, axes, rotary_dim, *, interleaved, base=10000.0):
    """Pair ``p`` of ``x [B, H, T, D]`` rotated by ``positions[axes[p]] * theta_p``."""
    theta = rope_frequencies(rotary_dim, base)  # [P], float64
    pos = np.asarray(positions, dtype=np.float64)  # [A, B, T]
    angles = np.stack([pos[a] for a in axes], axis=-1) * theta  # [B, T, P]
    return ref.rotate_by_angles(x.double().numpy(), angles[:, None], interleaved=interleaved)


def _qk(dtype, head_dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(B, 1, T, head_dim, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype)


def _check(got, want, dtype, angle):
    ops = 8 * math.ceil(1.0 + angle) if dtype == torch.float64 else 4
    torch.testing.assert_close(got.double(), torch.as_tensor(want), **tolerances(dtype, ops=ops))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_pair_axes_match_the_reference(case, dtype):
    kwargs, head_dim, rotary_dim, axes, count = CASES[case]
    enc = MRoPE(head_dim, **kwargs)
    assert enc.num_axes == count and sum(enc.mrope_section) == rotary_dim // 2
    q, k = _qk(dtype, head_dim)
    g = torch.Generator().manual_seed(1)
    q_pos = torch.randint(0, SPAN, (count, B, T), generator=g)
    k_pos = torch.randint(0, SPAN, (count, B, T), generator=g)
    got_q, got_k = enc.rotate(q, k, q_pos, k_pos)
    interleaved = kwargs.get("interleaved", False)
    for got, x, pos in ((got_q, q, q_pos), (got_k, k, k_pos)):
        _check(got, _reference(x, pos, axes, rotary_dim, interleaved=interleaved), dtype, SPAN)


@pytest.mark.parametrize("case", CASES)
def test_pair_axes_of_text_positions_are_plain_rope(case):
    kwargs, head_dim, rotary_dim, _, _ = CASES[case]
    enc = MRoPE(head_dim, **kwargs)
    plain = posenc.RotaryEmbedding(
        head_dim, rotary_dim=rotary_dim, interleaved=kwargs.get("interleaved", False)
    )
    q, k = _qk(torch.float64, head_dim)
    text = torch.arange(T) + 40
    pairs = zip(enc.rotate(q, k, text, text), plain.rotate(q, k, text, text), strict=True)
    for got, want in pairs:
        torch.testing.assert_close(got, want, **tolerances(torch.float64, ops=64))


def test_two_axis_positions_take_two_rows():
    enc = MRoPE(16, pair_axes=[0, 1] * 4, num_axes=2)
    q, k = _qk(torch.float64, 16)
    with pytest.raises(ValueError, match=r"\[2, B, T\]"):
        enc.rotate(q, k, torch.zeros(3, B, T, dtype=torch.long), torch.zeros(3, B, T))
    with pytest.raises(ValueError, match="ambiguous with batch 2"):
        enc.rotate(q, k, torch.zeros(2, T, dtype=torch.long), torch.zeros(2, T, dtype=torch.long))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"pair_axes": [0, 1, 2]}, "each of the 8 pairs"),
        ({"pair_axes": [0, 3] * 4}, r"an axis in \[0, 3\)"),
        ({"pair_axes": [0, 1] * 4, "mrope_section": [4, 2, 2]}, "either pair_axes"),
        ({"pair_axes": [0, 1] * 4, "mrope_interleaved": True}, "either pair_axes"),
        ({"mrope_section": [4, 2, 2], "num_axes": 2}, "num_axes=2 needs pair_axes"),
        ({"pair_axes": "0101"}, "pair_axes must be a list"),
        ({"pair_axes": [0, 1] * 4, "num_axes": 1}, "num_axes"),
    ],
)
def test_bad_pair_axes_raise_naming_the_value(kwargs, fragment):
    with pytest.raises((ValueError, TypeError), match=fragment):
        MRoPE(16, **kwargs)


# --------------------------------------------------------------------------- builders


def _text(model_type, rope, **fields):
    return {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 2, **fields,
            "rope_parameters": rope}  # fmt: skip


def test_ernie_reads_height_width_time_sections():
    rope = {"rope_type": "default", "rope_theta": 5e5, "mrope_section": [22, 22, 20]}
    enc = posenc.from_hf_config(_text("ernie4_5_vl_moe_text", rope))
    assert isinstance(enc, MRoPE) and enc.rope.interleaved and enc.rope.base == 5e5
    want = [1, 2] * 22 + [0] * 20
    assert enc._axes.tolist() == want and enc.mrope_section == (20, 22, 22)


@pytest.mark.parametrize(
    ("rope", "fragment"),
    [
        ({"rope_type": "default", "mrope_section": [20, 24, 20]}, "needs h == w"),
        ({"rope_type": "linear", "factor": 2.0}, "rope_type='linear'"),
        ({"rope_type": "default", "partial_rotary_factor": 0.5}, "rotary_dim=64"),
        ({"rope_type": "default", "mrope_section": [22, 22]}, "3 entries"),
    ],
)
def test_ernie_refuses_what_it_does_not_compute(rope, fragment):
    with pytest.raises(ValueError, match=fragment):
        posenc.from_hf_config(_text("ernie4_5_vl_moe_text", {"rope_theta": 1e4, **rope}))


def test_neomme_layers_alternate_row_and_column_per_layer_type():
    full = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
    rope = {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    cfg = _text("neomme", rope, head_dim=64, layer_types=["sliding_attention", "full_attention"])
    plan = posenc.hf.layer_plan({**cfg, "num_hidden_layers": 2})
    assert [type(p) for p in plan] == [MRoPE, MRoPE] and [p.num_axes for p in plan] == [2, 2]
    assert [p.rope.rotary_dim for p in plan] == [64, 16]
    assert plan[1]._axes.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="mrope_section"):
        bad = {**rope, "sliding_attention": {**rope["sliding_attention"], "mrope_section": [8, 8]}}
        posenc.from_hf_config({**cfg, "rope_parameters": bad}, layer_type="sliding_attention")


def test_nope_layer_type_of_an_mrope_family():
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e4},
        "full_attention": None,
    }
    cfg = _text("cohere_compass_text", rope, layer_types=["sliding_attention", "full_attention"])
    assert isinstance(posenc.from_hf_config(cfg, layer_idx=1), NoPE)
    enc = posenc.from_hf_config(cfg, layer_idx=0)
    assert isinstance(enc, MRoPE) and enc.mrope_interleaved and enc.mrope_section == (24, 20, 20)


@pytest.mark.parametrize(
    ("model_type", "cyclic", "interleaved"),
    [
        ("qwen2_5_omni_text", False, False),
        ("qwen2_5_omni_talker", False, False),
        ("qwen3_omni_moe_text", True, False),
        ("qwen3_omni_moe_talker_text", True, False),
        ("glm_ocr_text", False, True),
    ],
)
def test_omni_and_ocr_text_models_read_their_sections(model_type, cyclic, interleaved):
    section = [24, 20, 20] if cyclic else [16, 24, 24]
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section}
    if cyclic:  # Qwen3-Omni writes both flags
        rope.update(interleaved=True, mrope_interleaved=True)
    enc = posenc.from_hf_config(_text(model_type, rope))
    assert isinstance(enc, MRoPE) and enc.mrope_section == tuple(section)
    assert (enc.mrope_interleaved, enc.rope.interleaved) == (cyclic, interleaved)
    if cyclic:
        with pytest.raises(ValueError, match="interleaved=False contradicts"):
            posenc.from_hf_config(_text(model_type, {**rope, "interleaved": False}))


def test_an_omni_config_is_read_through_its_thinker():
    text = _text("qwen2_5_omni_text", {"rope_type": "default", "rope_theta": 1e6},
                 num_hidden_layers=3)  # fmt: skip
    config = {"model_type": "qwen2_5_omni", "thinker_config": {
        "model_type": "qwen2_5_omni_thinker", "text_config": text}}  # fmt: skip
    enc = posenc.from_hf_config(config)
    assert isinstance(enc, MRoPE) and enc.mrope_section == (16, 24, 24)
    assert len(posenc.hf.layer_plan(config)) == 3


# --------------------------------------------------------------------------- XD-RoPE


def _xd_reference(x, positions, sections, base=10000.0):
    """HunYuan's XD-RoPE of ``x [B, H, T, D]`` at ``positions [A, B, T]``, from the formula:
    feature ``f`` takes the angle ``pos[block(f)] * theta_{f mod P}``."""
    x = x.double().numpy()
    pairs = x.shape[-1] // 2
    block = np.repeat(np.arange(len(sections)), 2 * np.asarray(sections))  # [D]
    theta = rope_frequencies(2 * pairs, base)
    pos = np.asarray(positions, dtype=np.float64)
    alpha = pos[block[:pairs]].transpose(1, 2, 0) * theta  # [B, T, P]
    beta = pos[block[pairs:]].transpose(1, 2, 0) * theta
    alpha, beta = alpha[:, None], beta[:, None]
    first, second = x[..., :pairs], x[..., pairs:]
    out1 = first * np.cos(alpha) - second * np.sin(alpha)
    out2 = second * np.cos(beta) + first * np.sin(beta)
    return np.concatenate([out1, out2], axis=-1)


XD_SECTIONS = {"four_axes": [2, 2, 3, 1], "three_axes": [3, 3, 2]}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sections", XD_SECTIONS)
def test_xdrope_matches_the_reference(sections, dtype):
    sections = XD_SECTIONS[sections]
    enc = XDRoPE(16, sections=sections)
    assert enc.num_axes == len(sections)
    q, k = _qk(dtype, 16)
    g = torch.Generator().manual_seed(2)
    q_pos = torch.randint(0, SPAN, (len(sections), B, T), generator=g)
    k_pos = torch.randint(0, SPAN, (len(sections), B, T), generator=g)
    for got, x, pos in zip(enc.rotate(q, k, q_pos, k_pos), (q, k), (q_pos, k_pos), strict=True):
        _check(got, _xd_reference(x, pos, sections), dtype, SPAN)


def test_xdrope_of_text_positions_is_plain_rope_and_images_are_not_rotations():
    enc = XDRoPE(16, sections=[2, 2, 3, 1])
    plain = posenc.RotaryEmbedding(16)
    q, k = _qk(torch.float64, 16)
    text = torch.arange(T) + 7
    pairs = zip(enc.rotate(q, k, text, text), plain.rotate(q, k, text, text), strict=True)
    for got, want in pairs:
        torch.testing.assert_close(got, want, **tolerances(torch.float64, ops=64))
    image = torch.stack([text, text + 3, text + 5, text * 0]).unsqueeze(1).expand(4, B, T)
    got_q, _ = enc.rotate(q, k, image, image)
    assert not torch.allclose(got_q.norm(dim=-1), q.norm(dim=-1))  # as in the model
    assert enc.cos_sin(text, dtype=torch.float64)[0].shape == (T, 8)
    with pytest.raises(ValueError, match="two angles"):
        enc.cos_sin(image, dtype=torch.float64)


@pytest.mark.parametrize(
    ("sections", "fragment"),
    [([4, 4], "sum to 8, but the head has 16"), ([8], "at least 2"), ("44", "list of integers")],
)
def test_bad_xdrope_sections_raise(sections, fragment):
    with pytest.raises((ValueError, TypeError), match=fragment):
        XDRoPE(32 if sections == [4, 4] else 16, sections=sections)


def test_hunyuan_reads_the_checkpoint_rope_dict():
    rope = {
        "type": "xdrope", "rope_theta": 1e4, "alpha": 1000.0, "factor": 1.0, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "xdrope_section": [16] * 4,
    }  # fmt: skip
    enc = posenc.from_hf_config(_text("hunyuan_vl_text", rope, head_dim=128))
    assert isinstance(enc, XDRoPE) and enc.sections == (16, 16, 16, 16)
    assert enc.rope.scaling == NTKAlphaScaling(1000.0)  # base 1e4 * 1000 ** (128 / 126)
    want = rope_frequencies(128, 1e4 * 1000.0 ** (128 / 126))
    got = enc.rope.inv_freq
    torch.testing.assert_close(got, torch.from_numpy(want), **tolerances(torch.float64, ops=256))
    plain = posenc.from_hf_config(
        _text("hunyuan_vl_text", {"rope_theta": 1e4, "mrope_section": [16, 16, 32]})
    )
    assert plain.rope.base == 1e4 and plain.num_axes == 3


@pytest.mark.parametrize(
    ("rope", "fragment"),
    [
        ({"rope_type": "default"}, "needs one mrope_section"),
        ({"mrope_section": [16] * 4, "xdrope_section": [8, 24, 16, 16]}, "needs one"),
        ({"rope_type": "dynamic", "factor": 2.0, "mrope_section": [16] * 4}, "'dynamic'"),
        ({"rope_type": "linear", "factor": 2.0, "mrope_section": [16] * 4}, "'linear'"),
    ],
)
def test_hunyuan_refuses_what_it_does_not_compute(rope, fragment):
    with pytest.raises(ValueError, match=fragment):
        posenc.from_hf_config(_text("hunyuan_vl_text", {"rope_theta": 1e4, **rope}))


def test_interleaved_sections_of_another_sum_are_refused():
    """Qwen4-Exp's default config rotates the whole 256-feature head with Qwen3.5's
    [11, 11, 10] sections: transformers lets the remaining pairs follow time, posenc refuses
    a section list that does not sum to the rotary half instead of guessing."""
    rope = {"rope_type": "default", "rope_theta": 1e4}
    with pytest.raises(ValueError, match=r"sums to 32, but the rotary half has 128"):
        posenc.from_hf_config(_text("qwen4_exp_text", rope, head_dim=256))
    enc = posenc.from_hf_config(
        _text("qwen4_exp_text", {**rope, "partial_rotary_factor": 0.25}, head_dim=256)
    )
    assert enc.rope.rotary_dim == 64 and enc.mrope_section == (11, 11, 10)
