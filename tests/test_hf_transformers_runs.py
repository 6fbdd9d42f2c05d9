"""Released configs that transformers runs and posenc once refused, layer by layer.

Each case builds a tiny random model of the family from a config with the field in
question (``_hf_model_walk``): ``layer_plan`` (from the config object and from its
``config.json``) must equal the model's rotation at every layer, at positions ``0..6`` and
``1000..1006``, and ``posenc.hf.patch`` must give its logits and greedy tokens.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="builds tiny transformers models")

import torch
import transformers

import _hf_model_walk as walk
from posenc.encodings.rotary.context_scaling import LongRopeScaling, YarnScaling

HALF = walk.TINY["head_dim"] // 2  # pairs of the tiny heads (16 features)

CASES = {
    # Gemma 3 whose layers are all sliding: no full-attention table in its rotary module
    "gemma3_all_sliding": (
        "gemma3_text", {"layer_types": ["sliding_attention"] * 2, "num_hidden_layers": 2}
    ),
    # MiniMax-M2 states partial rotary as rotary_dim; the config class maps it
    "minimax_m2_rotary_dim": ("minimax_m2", {"rotary_dim": HALF}),
    # Kimi K2: YaRN with beta_fast == beta_slow == 1 (a ramp at most one pair wide)
    "kimi_k2_equal_betas": (
        "deepseek_v3",
        {
            "rope_parameters": {
                "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 64,
                "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                "rope_theta": 50000.0,
            },
        },
    ),
    # Phi-3.5-MoE: LongRoPE with short_mscale / long_mscale (positions 1000.. pass L0 = 64)
    "phimoe_mscales": (
        "phimoe",
        {
            "rope_parameters": {
                "rope_type": "longrope", "original_max_position_embeddings": 64,
                "short_factor": [1.0 + 0.1 * i for i in range(HALF)],
                "long_factor": [2.0 + 0.5 * i for i in range(HALF)],
                "short_mscale": 1.25, "long_mscale": 1.5, "rope_theta": 10000.0,
            },
        },
    ),
}  # fmt: skip


def _model(model_type: str, fields: dict):
    """A tiny random float32 model of ``model_type`` with ``fields`` in its config."""
    values = walk.tiny_config(model_type).to_dict()
    values.update(fields)
    values.pop("transformers_version", None)
    config = type(walk.tiny_config(model_type)).from_dict(values)
    torch.manual_seed(0)
    return getattr(transformers, walk.families()[model_type])(config).float().eval()


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_plan_and_patch_match_the_model(case):
    model_type, fields = CASES[case]
    model = _model(model_type, fields)
    assert walk.check_family(model_type, model) == []
    assert walk.check_patch(model_type, model) == []


def test_the_cases_exercise_their_field():
    """Each case reaches what it names: a partial rotation, a one-pair ramp, both mscales."""
    plan = posenc_plan("minimax_m2_rotary_dim")
    assert plan.rotary_dim == HALF
    yarn = posenc_plan("kimi_k2_equal_betas").scaling
    assert isinstance(yarn, YarnScaling) and yarn.beta_fast == yarn.beta_slow == 1.0
    longrope = posenc_plan("phimoe_mscales").scaling
    assert isinstance(longrope, LongRopeScaling)
    assert (longrope.short_mscale, longrope.long_mscale) == (1.25, 1.5)


def posenc_plan(case: str):
    """The rotary encoding ``layer_plan`` gives the case's first layer."""
    import posenc

    model_type, fields = CASES[case]
    return posenc.hf.layer_plan(_model(model_type, fields).config)[0]


def test_longrope_mscales_come_together():
    with pytest.raises(ValueError, match="short_mscale and long_mscale come together"):
        LongRopeScaling((1.0,), (2.0,), 16, 4.0, short_mscale=1.2)
