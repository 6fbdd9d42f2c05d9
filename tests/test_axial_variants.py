"""Axial RoPE in the layouts of current vision towers (``AxialRope``'s ``axis_order``,
``cyclic``, ``pairs``, ``axis_dim``) against the float64 reference written pair by pair;
relative positions per axis; bad input; the vision families' ``config.json`` dicts.

Shapes: ``B`` batch, ``H`` heads, ``N`` patches, ``D`` head_dim, ``A`` axes.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import AxialRope
from posenc.reference import rope_schemes
from posenc.reference.axial_layouts import axial_layout_rotate

B, H, D = 2, 3, 24
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
# (AxialRope options, the families that use them)
LAYOUTS = [
    {},  # Qwen-VL towers
    {"axis_order": (1, 0)},  # Step3.5
    {"axis_order": (1, 0), "pairs": "interleaved"},  # Inkling2, SAM3, Llama 4
    {"axis_order": (1, 0), "pairs": "per_axis"},  # Gemma 4
    {"axis_order": (1, 0), "cyclic": True},  # Kimi K2.5
    {"axis_order": (0, 1, 2), "axis_dim": 6},  # MiniMax-M3-VL: 2 floor(D / 6) = 8 at D=24
    {"axis_order": (2, 0, 1), "axis_dim": 8, "pairs": "interleaved", "cyclic": True},
    {"frequencies": "alternating", "pairs": "per_axis"},
]


def _qk(dtype, length, *, seed=0, batch=B):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, H, length, D, generator=g, dtype=torch.float64)
    k = torch.randn(batch, 1, length, D, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype)


def _reference(x, pos, layout, prefix=0):
    return axial_layout_rotate(
        x.double().numpy(), pos.numpy(), 100.0,
        axis_order=layout.get("axis_order", (0, 1)), axis_dim=layout.get("axis_dim"),
        cyclic=layout.get("cyclic", False), pairs=layout.get("pairs", "half"),
        alternating=layout.get("frequencies") == "alternating", prefix=prefix,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_axial_layouts_match_the_reference(dtype, layout):
    prefix = 1
    enc = AxialRope(D, base=100.0, num_prefix_tokens=prefix, **layout)
    axes = len(layout.get("axis_order", (0, 1)))
    gen = torch.Generator().manual_seed(1)
    integer = torch.randint(0, 40, (6, axes), generator=gen)
    batched = torch.randint(-40, 40, (B, 6, axes), generator=gen)
    coords = 2 * math.pi * (torch.rand(6, axes, generator=gen, dtype=torch.float64) - 0.5)
    q, k = _qk(dtype, prefix + 6)
    for pos in (integer, batched, coords):
        for got, x in zip(enc.rotate(q, k, pos, pos), (q, k), strict=True):
            want = _reference(x, pos, layout, prefix)
            ops = 8 * (1 + int(pos.abs().max())) if dtype == torch.float64 else 4
            torch.testing.assert_close(
                got.double(), torch.as_tensor(want), **tolerances(dtype, ops=ops)
            )


def test_the_two_references_agree_on_the_default_layout():
    pos = torch.randint(0, 30, (5, 2), generator=torch.Generator().manual_seed(2))
    x, _ = _qk(torch.float64, 5)
    for alternating in (False, True):
        layout = {"frequencies": "alternating"} if alternating else {}
        want = rope_schemes.axial_rotate(x.numpy(), pos.numpy(), D, 100.0, alternating=alternating)
        got = _reference(x, pos, layout)
        torch.testing.assert_close(torch.as_tensor(got), torch.as_tensor(want), rtol=0, atol=1e-12)


@given(
    layout=st.sampled_from(LAYOUTS),
    pos=st.lists(st.integers(-50, 50), min_size=6, max_size=6),
    shift=st.lists(st.integers(-100, 100), min_size=3, max_size=3),
)
def test_axial_layout_scores_depend_on_the_offset_per_axis(layout, pos, shift):
    enc = AxialRope(D, **layout)
    axes = enc.axes
    q, k = _qk(torch.float64, 1, batch=1)
    p_q, p_k = torch.tensor([pos[:axes]]), torch.tensor([pos[3 : 3 + axes]])
    s = torch.tensor([shift[:axes]])
    a_q, a_k = enc.rotate(q, k, p_q, p_k)
    b_q, b_k = enc.rotate(q, k, p_q + s, p_k + s)
    angle = int(max(p.abs().max() for p in (p_q, p_k, p_q + s, p_k + s)))
    torch.testing.assert_close(
        (a_q * a_k).sum(-1), (b_q * b_k).sum(-1), **tolerances(torch.float64, ops=64 * (1 + angle))
    )


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: AxialRope(D, axis_order=(0, 0)), "permutation"),
        (lambda: AxialRope(D, axis_order=()), "permutation"),
        (lambda: AxialRope(D, pairs="diagonal"), "diagonal"),
        (lambda: AxialRope(D, axis_order=(0, 1, 2), axis_dim=7), "axis_dim"),
        (lambda: AxialRope(D, axis_order=(0, 1, 2), axis_dim=10), "axis_dim"),
        (lambda: AxialRope(20, axis_order=(0, 1, 2)), "divisible by 6"),
    ],
)
def test_bad_layouts_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_cyclic_must_be_a_bool():
    with pytest.raises(TypeError, match="cyclic"):
        AxialRope(D, cyclic="yes")


def test_three_axis_rope_refuses_two_axis_positions_and_grids():
    enc = AxialRope(D, axis_order=(0, 1, 2), axis_dim=6)
    q, k = _qk(torch.float64, 4)
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        enc.rotate(q, k, torch.zeros(4, 2), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="3 axes"):
        enc(q, k, grid=(2, 2))


VISION_CONFIGS = {
    "kimi_k25_vision": {"axis_order": (1, 0), "cyclic": True},
    "gemma4_vision": {"axis_order": (1, 0), "pairs": "per_axis"},
    "minimax_m3_vl_vision": {"axis_order": (0, 1, 2), "axis_dim": 2 * (D // 6)},
    "llama4_vision_model": {"axis_order": (1, 0), "pairs": "interleaved"},
}


@pytest.mark.parametrize("model_type", sorted(VISION_CONFIGS))
def test_vision_config_json_builds_the_family_layout(model_type):
    kind = "default" if model_type == "llama4_vision_model" else "axial"
    cfg = {
        "model_type": model_type, "hidden_size": 4 * D, "num_attention_heads": 4,
        "head_dim": D, "rope_parameters": {"rope_type": kind, "rope_theta": 500.0},
    }  # fmt: skip
    enc = posenc.from_hf_config(cfg)
    layout = VISION_CONFIGS[model_type]
    assert (enc.head_dim, enc.base) == (D, 500.0)
    assert (enc.axis_order, enc.pairs) == (layout["axis_order"], layout.get("pairs", "half"))
    assert (enc.cyclic, enc.axis_dim) == (layout.get("cyclic", False), layout.get("axis_dim", 12))
    bad = {**cfg, "rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0}}
    with pytest.raises(ValueError, match="yarn"):
        posenc.from_hf_config(bad)


def test_eomt_query_layers_add_the_queries_to_the_prefix():
    cfg = {
        "model_type": "eomt_dinov3", "hidden_size": 64, "num_attention_heads": 2,
        "num_hidden_layers": 6, "num_blocks": 2, "num_queries": 7, "num_register_tokens": 3,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
    }  # fmt: skip
    plan = posenc.hf.layer_plan(cfg)
    assert [enc.num_prefix_tokens for enc in plan] == [4] * 4 + [11] * 2
    with pytest.raises(ValueError, match="layer_idx=6"):
        posenc.from_hf_config(cfg, layer_idx=6)


def test_tracker_memory_attention_reads_its_own_head_dim():
    cfg = {
        "model_type": "sam2_video", "memory_attention_hidden_size": 256,
        "memory_attention_num_attention_heads": 2, "memory_attention_downsample_rate": 2,
        "rope_parameters": {"rope_type": "axial", "rope_theta": 1000.0},
        "vision_config": {"hidden_size": 96, "num_attention_heads": 1},  # not the memory's
    }  # fmt: skip
    enc = posenc.from_hf_config(cfg)
    assert (enc.head_dim, enc.base, enc.axis_order, enc.pairs) == (
        64,
        1000.0,
        (1, 0),
        "interleaved",
    )
    with pytest.raises(TypeError, match="memory_attention_hidden_size"):
        posenc.from_hf_config({**cfg, "memory_attention_hidden_size": None})


def test_efficientloftr_rotates_the_whole_hidden_vector():
    rope = {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 2.0}
    cfg = {
        "model_type": "efficientloftr", "hidden_size": 64, "num_attention_heads": 4,
        "rope_parameters": rope,
    }  # fmt: skip
    enc = posenc.from_hf_config(cfg)
    assert (enc.head_dim, enc.axis_dim, enc.cyclic, enc.pairs) == (64, 32, True, "interleaved")
    bad = {**cfg, "rope_parameters": {**rope, "partial_rotary_factor": 1.0}}
    with pytest.raises(ValueError, match="must be 32, got 16"):
        posenc.from_hf_config(bad)
