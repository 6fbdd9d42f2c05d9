"""Parity with Hugging Face transformers' RoPE (inv_freq, attention factor, rotated q/k),
and the parsing of ``config.json`` dicts. Configs are built in the test, never downloaded.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import pytest
import torch

import posenc
from conftest import tolerances
from posenc import RotaryEmbedding, rope_from_hf_config
from posenc.hf import parse_hf_rope_config

EPS32 = torch.finfo(torch.float32).eps
PHI3_SHORT = [1.0 + 0.15 * (i / 47) ** 2 for i in range(48)]
PHI3_LONG = [1.0 + 63.0 * (i / 47) ** 3 for i in range(48)]


@pytest.fixture(scope="module")
def hf():
    """transformers' config classes, rotary modules and rotation functions."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama import modeling_llama
    from transformers.models.phi3 import modeling_phi3

    return {
        "v5": hasattr(transformers.PretrainedConfig, "standardize_rope_params"),
        "llama": (transformers.LlamaConfig, modeling_llama),
        "phi3": (transformers.Phi3Config, modeling_phi3),
        "init": ROPE_INIT_FUNCTIONS,
        "llama_rotary": modeling_llama.LlamaRotaryEmbedding,
    }


@dataclass
class Case:
    family: str  # "llama" or "phi3": whose rotary module and apply_rotary_pos_emb to use
    rope: dict
    theta: float
    fields: dict = field(default_factory=dict)
    first_position: int = 100  # the positions tested are first_position + arange(T)


CASES = {
    "theta-1e6": Case("llama", {"rope_type": "default"}, 1e6, {"head_dim": 64}),
    "linear": Case("llama", {"rope_type": "linear", "factor": 4.0}, 1e4, {"head_dim": 32}),
    "dynamic-short": Case(
        "llama", {"rope_type": "dynamic", "factor": 2.0}, 1e4, {"max_position_embeddings": 64}, 10
    ),
    "dynamic-long": Case(
        "llama", {"rope_type": "dynamic", "factor": 2.0}, 1e4, {"max_position_embeddings": 64}, 190
    ),
    "yarn": Case(
        "llama",
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        1e6,
        {"head_dim": 128, "max_position_embeddings": 131072},
    ),
    "yarn-deepseek": Case(
        "llama",
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
        },
        1e4,
        {"head_dim": 64, "max_position_embeddings": 163840},
    ),
    "llama3.1": Case(
        "llama",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        5e5,
        {"head_dim": 128, "max_position_embeddings": 131072},
    ),
    **{
        f"phi3-longrope-{name}": Case(
            "phi3",
            {"rope_type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG},
            1e4,
            {
                "hidden_size": 3072,
                "num_attention_heads": 32,
                "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096,
            },
            first,
        )
        for name, first in (("short", 100), ("long", 4090))
    },
    "partial-0.25": Case(
        "phi3", {"rope_type": "default"}, 1e4, {"hidden_size": 256, "partial_rotary_factor": 0.25}
    ),
}


def make_config(hf, case: Case):
    cls, _ = hf[case.family]
    fields = {"hidden_size": 256, "num_attention_heads": 2, **case.fields}
    if hf["v5"]:
        return cls(**fields, rope_parameters={**case.rope, "rope_theta": case.theta})
    return cls(**fields, rope_scaling=dict(case.rope), rope_theta=case.theta)


def legacy_json(case: Case) -> dict:
    """The same model as a v4-era ``config.json`` (``rope_scaling`` with ``type``)."""
    rope = {("type" if k == "rope_type" else k): v for k, v in case.rope.items()}
    fields = {"hidden_size": 256, "num_attention_heads": 2, **case.fields}
    return {**fields, "rope_theta": case.theta, "rope_scaling": rope}


def hf_rotate(hf, case: Case, config, q, k, position_ids):
    rotary_cls = getattr(hf[case.family][1], f"{case.family.capitalize()}RotaryEmbedding")
    rotary = rotary_cls(config)
    cos, sin = rotary(q, position_ids)
    q_hf, k_hf = hf[case.family][1].apply_rotary_pos_emb(q, k, cos, sin)
    return rotary, q_hf, k_hf


def inv_freq_tol(base: float) -> dict[str, float]:
    """transformers rounds the exponent to float32, amplified by ln(base) in base ** x."""
    return tolerances(torch.float32, ops=8 + math.ceil(math.log(base)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_inv_freq_and_attention_factor_match(hf, name):
    case = CASES[name]
    config = make_config(hf, case)
    rotary = getattr(hf[case.family][1], f"{case.family.capitalize()}RotaryEmbedding")(config)
    for source in (config, config.to_dict(), legacy_json(case)):
        ours = rope_from_hf_config(source)
        torch.testing.assert_close(
            ours.inv_freq.float(), rotary.inv_freq, **inv_freq_tol(case.theta)
        )
        assert ours.attention_scale == pytest.approx(rotary.attention_scaling, rel=1e-12)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rotated_qk_match(hf, gen, name):
    case = CASES[name]
    config = make_config(hf, case)
    ours = rope_from_hf_config(config)
    batch, t = 2, 12
    q = torch.randn(batch, 4, t, ours.head_dim, generator=gen)
    k = torch.randn(batch, 2, t, ours.head_dim, generator=gen)
    first = torch.tensor([[case.first_position], [case.first_position - 7]])
    position_ids = first + torch.arange(t)  # [B, T], per-sequence offsets
    rotary, q_hf, k_hf = hf_rotate(hf, case, config, q, k, position_ids)
    q_ours, k_ours = ours.rotate(q, k, position_ids, position_ids)
    torch.testing.assert_close(ours.inv_freq.float(), rotary.inv_freq, **inv_freq_tol(case.theta))
    # transformers forms the angles in float32: each carries ~|angle| * (1 + ln base) eps
    max_angle = float(position_ids.max())
    atol = EPS32 * (8 + max_angle * (1 + math.log(case.theta))) * ours.attention_scale
    for mine, theirs, x in ((q_ours, q_hf, q), (k_ours, k_hf, k)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=atol * float(x.abs().max()))


def test_dynamic_growth_matches(hf):
    case = CASES["dynamic-long"]
    config = make_config(hf, case)
    theirs = hf["llama_rotary"](config)
    ours = rope_from_hf_config(config)
    x = torch.zeros(1, 1, 1, ours.head_dim)
    for length in (32, 100, 80, 200):
        position_ids = torch.arange(length).unsqueeze(0)
        theirs(x, position_ids)
        ours.observe_length(length)
        torch.testing.assert_close(ours.inv_freq.float(), theirs.inv_freq, **inv_freq_tol(1e4))
    # below the original length transformers goes back at once; posenc on reset_length()
    theirs(x, torch.arange(32).unsqueeze(0))
    ours.reset_length()
    torch.testing.assert_close(ours.inv_freq.float(), theirs.inv_freq, **inv_freq_tol(1e4))


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "llama3", "longrope"])
def test_partial_rotary_inv_freq_matches_init_functions(hf, rope_type):
    """transformers' init functions honour partial_rotary_factor (default: "partial-0.25")."""
    extra = {
        "linear": {"factor": 2.0},
        "dynamic": {"factor": 2.0},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": 16},
        "llama3": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        "longrope": {"short_factor": [1.5] * 16, "long_factor": [3.0] * 16, "factor": 4.0},
    }[rope_type]
    case = Case(
        "llama",
        {"rope_type": rope_type, **extra},
        5e4,
        {"head_dim": 64, "max_position_embeddings": 64, "partial_rotary_factor": 0.5},
    )
    config = make_config(hf, case)
    inv_freq, scale = hf["init"][rope_type](config, "cpu")
    ours = rope_from_hf_config(config)
    assert ours.rotary_dim == 32
    torch.testing.assert_close(ours.inv_freq.float(), inv_freq, **inv_freq_tol(5e4))
    assert ours.attention_scale == pytest.approx(scale, rel=1e-12)


def test_top_level_original_length_wins_as_in_transformers(hf):
    case = CASES["phi3-longrope-long"]
    config = legacy_json(case)  # top level 4096; the dict disagrees
    config["rope_scaling"] = {**config["rope_scaling"], "original_max_position_embeddings": 2048}
    ours = rope_from_hf_config(config)
    theirs = hf["phi3"][1].Phi3RotaryEmbedding(hf["phi3"][0](**copy.deepcopy(config)))
    assert ours.scaling.original_max_position_embeddings == 4096
    assert ours.attention_scale == pytest.approx(theirs.attention_scaling, rel=1e-12)


def test_known_rope_types_cover_transformers(hf):
    # "proportional" (Gemma 4: zero frequencies past a fraction of head_dim) is not supported
    assert set(hf["init"]) - {"proportional"} <= set(posenc.scaling_types())


# --------------------------------------------------------------------------- config.json parsing


def test_readme_example():
    config = {  # the rope fields of a Llama 3.1 8B config.json
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    rope = posenc.rope_from_hf_config(config)
    q = torch.randn(1, 32, 10, 128)
    k = torch.randn(1, 8, 10, 128)
    q, k = rope(q, k)
    assert (rope.head_dim, rope.rotary_dim, rope.base) == (128, 128, 500000.0)
    assert rope.scaling == posenc.Llama3Scaling(8.0, 1.0, 4.0, 8192)


def test_head_dim_fields():
    assert (
        parse_hf_rope_config({"head_dim": 80, "hidden_size": 64, "num_attention_heads": 2}).head_dim
        == 80
    )
    parsed = parse_hf_rope_config(
        {"hidden_size": 2560, "num_attention_heads": 32, "rotary_pct": 0.25}
    )
    assert (parsed.head_dim, parsed.rotary_dim) == (80, 20)
    gpt_neox = parse_hf_rope_config({"head_dim": 64, "rotary_emb_base": 1e4 * 2})
    assert gpt_neox.base == 2e4


def test_head_dim_floors_as_transformers_attention_does():
    # GLM-4.5-style: 4096 / 96 heads; transformers' attention uses hidden // heads
    parsed = parse_hf_rope_config({"hidden_size": 4096, "num_attention_heads": 96})
    assert parsed.head_dim == 4096 // 96


def test_per_layer_type_parameters():
    config = {
        "head_dim": 64,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    full = rope_from_hf_config(config, layer_type="full_attention")
    sliding = rope_from_hf_config(config, layer_type="sliding_attention")
    assert (full.base, full.scaling, sliding.base) == (1e6, posenc.LinearScaling(8.0), 1e4)
    with pytest.raises(
        ValueError, match=r"per layer type \['full_attention', 'sliding_attention'\]"
    ):
        rope_from_hf_config(config)


def test_original_length_defaults_and_factor():
    yarn = {"head_dim": 64, "max_position_embeddings": 16384, "rope_scaling": {"type": "yarn"}}
    assert parse_hf_rope_config(yarn).scaling == posenc.YarnScaling(1.0, 16384)
    yarn["rope_scaling"]["original_max_position_embeddings"] = 4096
    assert parse_hf_rope_config(yarn).scaling == posenc.YarnScaling(4.0, 4096)
    dynamic = {
        "head_dim": 64,
        "max_position_embeddings": 2048,
        "rope_scaling": {"type": "dynamic", "factor": 2},
    }
    assert parse_hf_rope_config(dynamic).scaling == posenc.DynamicNTKScaling(2.0, 2048)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"hidden_size": 64}, "neither head_dim nor hidden_size and num_attention_heads"),
        ({"hidden_size": 99, "num_attention_heads": 3}, r"hidden_size=99 // .* head_dim 33"),
        ({"head_dim": 64, "rope_scaling": {"type": "mrope"}}, "unknown rope_type 'mrope'.*llama3"),
        (
            {"head_dim": 64, "rope_scaling": {"type": "yarn", "factor": 2.0}},
            "needs max_position_embeddings",
        ),
        (
            {"head_dim": 64, "rope_scaling": {"type": "linear"}},
            r"missing required keys \['factor'\]",
        ),
        ({"head_dim": 64, "rope_scaling": {"type": "linear", "factor": 0.5}}, "got 0.5"),
        ({"head_dim": 64, "partial_rotary_factor": 0.3}, "rotary dim 19"),
        ({"head_dim": 63}, "head_dim must be even, got 63"),
        (
            {
                "head_dim": 64,
                "max_position_embeddings": 2048,
                "rope_scaling": {
                    "type": "dynamic",
                    "factor": 2.0,
                    "original_max_position_embeddings": 1024,
                },
            },
            "uses max_position_embeddings=2048 for dynamic NTK",
        ),
    ],
)
def test_bad_configs_raise(config, match):
    with pytest.raises(ValueError, match=match):
        rope_from_hf_config(config)


def test_bad_config_types_raise():
    with pytest.raises(TypeError, match="config must be a dict"):
        rope_from_hf_config(["head_dim", 64])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layer_type='full_attention' given"):
        rope_from_hf_config({"head_dim": 64}, layer_type="full_attention")
    assert isinstance(rope_from_hf_config({"head_dim": 64}), RotaryEmbedding)
