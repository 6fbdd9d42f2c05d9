"""``from_hf_config`` / ``layer_plan`` family by family: raw ``config.json`` dicts against the
transformers configs and modules they describe, per-layer plans, and the refusals.

Configs are built here (tiny sizes), never downloaded. Shapes: ``B`` batch, ``H`` heads,
``T`` length, ``D`` head_dim, ``R`` rotary dim.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from conftest import tolerances
from posenc.hf import FAMILIES, family, from_hf_config, layer_plan, rope_from_hf_config

EPS32 = torch.finfo(torch.float32).eps

SCOUT_ROPE = {  # Llama 4 Scout's config.json rope_scaling
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}
GEMMA3_JSON = {  # the position fields of a Gemma 3 4B config.json (v4 form), 12 layers
    "model_type": "gemma3_text",
    "num_hidden_layers": 12,
    "sliding_window_pattern": 6,
    "head_dim": 256,
    "hidden_size": 2560,
    "num_attention_heads": 8,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
}


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("transformers", reason="compares with transformers' modules")


def inv_freq_tol(base: float) -> dict[str, float]:
    """transformers rounds the exponent to float32, amplified by ln(base) in base ** x."""
    return tolerances(torch.float32, ops=8 + math.ceil(math.log(base)))


def test_gptj_and_codegen_read_n_embd_and_absolute_rotary_dim(tf, gen):
    from transformers.models.gptj import modeling_gptj

    for config in (
        tf.GPTJConfig(n_embd=256, n_head=4, rotary_dim=16),
        tf.CodeGenConfig(n_embd=256, n_head=4, rotary_dim=16),
    ):
        ours = from_hf_config(config)
        assert (ours.head_dim, ours.rotary_dim, ours.interleaved) == (64, 16, True)
        positions = torch.arange(12).expand(2, 12)  # [B, T]
        q = torch.randn(2, 12, 4, 64, generator=gen)  # GPT-J rotates [B, T, H, D]
        sincos = modeling_gptj.create_sinusoidal_positions(64, 16)[positions]
        sin, cos = torch.split(sincos, 8, dim=-1)
        rot = modeling_gptj.apply_rotary_pos_emb(q[..., :16], sin, cos)
        theirs = torch.cat([rot, q[..., 16:]], -1).transpose(1, 2)  # [B, H, T, D]
        mine = ours.rotate(q.transpose(1, 2), q.transpose(1, 2), positions, positions)[0]
        torch.testing.assert_close(mine, theirs, rtol=0, atol=64 * EPS32 * float(q.abs().max()))


def test_llama4_scout_scaling_matches_transformers(tf):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = tf.Llama4TextConfig(
        num_hidden_layers=8, rope_parameters={**SCOUT_ROPE, "rope_theta": 5e5}
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    plan = layer_plan(config)
    rope = plan[0]
    torch.testing.assert_close(rope.inv_freq.float(), inv_freq, **inv_freq_tol(5e5))
    assert rope.attention_scale == scale and rope.interleaved
    # no_rope_layers [1, 1, 1, 0, ...]: every 4th layer is NoPE with the query temperature
    rotary = [isinstance(e, posenc.RotaryEmbedding) for e in plan]
    assert rotary == [bool(flag) for flag in config.no_rope_layers]


def test_llama3_equal_factors_have_no_smoothed_band():
    scaling = posenc.Llama3Scaling(8.0, 1.0, 1.0, 8192)
    inv_freq, _ = posenc.rope_inv_freq(128, base=5e5, scaling=scaling)
    default, _ = posenc.rope_inv_freq(128, base=5e5)
    long = 2 * math.pi / default > 8192  # wavelength beyond the original length
    torch.testing.assert_close(inv_freq[long], default[long] / 8.0, rtol=0, atol=0)
    torch.testing.assert_close(inv_freq[~long], default[~long], rtol=0, atol=0)


def test_gemma3_config_json_plan_equals_transformers_config(tf):
    from transformers.models.gemma3 import modeling_gemma3

    raw = layer_plan(GEMMA3_JSON)
    config = tf.Gemma3TextConfig(**{k: v for k, v in GEMMA3_JSON.items() if k != "model_type"})
    parsed = layer_plan(config)
    rotary = modeling_gemma3.Gemma3RotaryEmbedding(config)
    for index, (a, b) in enumerate(zip(raw, parsed, strict=True)):
        kind = config.layer_types[index]
        assert (a.base, a.scaling) == (b.base, b.scaling), kind
        theirs = getattr(rotary, f"{kind}_inv_freq")
        torch.testing.assert_close(a.inv_freq.float(), theirs, **inv_freq_tol(a.base))
    assert [e.base for e in raw[:6]] == [1e4] * 5 + [1e6]


def _dory_blocks(kinds: list[str]) -> dict:
    """A Dory config.json's position fields: each layer an attention block, then "mlp"."""
    blocks = [block for kind in kinds for block in (kind, "mlp")]
    return {  # one input layer, one output layer, the others looped (counted in blocks)
        "model_type": "dory",
        "num_hidden_layers": len(blocks),
        "layer_types": blocks,
        "n_input_layers": 2,
        "n_recurrent_layers": len(blocks) - 4,
        "n_output_layers": 2,
        "head_dim": 64,
    }


def test_dory_blocks_are_read_as_its_config_class_reads_them(tf):
    modeling_dory = pytest.importorskip(
        "transformers.models.dory.modeling_dory", reason="Dory is new in transformers 5.24"
    )
    kinds = ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 2
    raw = _dory_blocks(kinds)
    config = modeling_dory.DoryConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    assert config.layer_types == kinds  # the class halves what the file lists
    rotary = modeling_dory.DoryRotaryEmbedding(config)
    for plan in (layer_plan(raw), layer_plan(config)):  # the file and the object alike
        assert len(plan) == len(kinds)
        for kind, encoding in zip(kinds, plan, strict=True):
            theirs = getattr(rotary, f"{kind}_inv_freq")
            torch.testing.assert_close(
                encoding.inv_freq.float(), theirs, **inv_freq_tol(encoding.base)
            )


def test_dory_blocks_that_do_not_alternate_are_refused(monkeypatch):
    monkeypatch.setattr(posenc.hf.normalize, "config_class", lambda model_type: None)
    raw = _dory_blocks(["sliding_attention", "full_attention"])
    raw["layer_types"] = ["sliding_attention", "full_attention", "mlp", "mlp"]
    with pytest.raises(ValueError, match=r"'dory' lists each layer as an attention block"):
        layer_plan(raw)
    raw = {**_dory_blocks(["sliding_attention", "full_attention"]), "num_hidden_layers": 2}
    with pytest.raises(ValueError, match=r"num_hidden_layers=2 does not count the 4 blocks"):
        layer_plan(raw)


@pytest.mark.parametrize("interleave", [True, False])
def test_deepseek_rope_interleave_sets_the_layout(interleave):
    config = {
        "model_type": "deepseek_v3",
        "qk_rope_head_dim": 64,
        "head_dim": 64,
        "rope_interleave": interleave,
        "rope_theta": 1e4,
    }
    rope = from_hf_config(config)
    assert (rope.head_dim, rope.interleaved) == (64, interleave)


def test_cohere2_rotates_sliding_layers_only(tf):
    config = tf.Cohere2Config(num_hidden_layers=8)
    plan = layer_plan(config)
    for kind, encoding in zip(config.layer_types, plan, strict=True):
        assert isinstance(encoding, posenc.RotaryEmbedding) == (kind == "sliding_attention")
        assert not isinstance(encoding, posenc.RotaryEmbedding) or encoding.interleaved


def test_smollm3_no_rope_layers_from_the_interval():
    config = {
        "model_type": "smollm3",
        "num_hidden_layers": 8,
        "no_rope_layers": None,  # transformers derives them from the interval
        "no_rope_layer_interval": 4,
        "head_dim": 64,
    }
    kinds = [type(e).__name__ for e in layer_plan(config)]
    assert kinds == ["RotaryEmbedding"] * 3 + ["NoPE"] + ["RotaryEmbedding"] * 3 + ["NoPE"]
    assert isinstance(from_hf_config(config, layer_idx=3), posenc.NoPE)


def test_granite_swa_base_per_layer():
    config = {
        "model_type": "granite_swa",
        "num_hidden_layers": 3,
        "head_dim": 32,
        "layer_rope_theta": [1e4, 0, 5e5],
    }
    plan = layer_plan(config)
    assert (plan[0].base, type(plan[1]).__name__, plan[2].base) == (1e4, "NoPE", 5e5)


def test_composite_config_reads_its_text_config():
    text = {"model_type": "llama", "head_dim": 32, "rope_theta": 5e5}
    config = {"model_type": "some_vlm", "text_config": text, "vision_config": {}}
    assert from_hf_config(config).base == 5e5


def test_non_rotary_families_get_their_position_module(tf):
    from posenc.hf.absolute import build_position_module

    for config in (tf.GPT2Config(), tf.BloomConfig(), tf.T5Config(), tf.FalconConfig(alibi=True)):
        ours = from_hf_config(config)
        theirs = build_position_module(config.model_type, config.to_dict())
        assert type(ours) is type(theirs), config.model_type
        assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert isinstance(from_hf_config(tf.FalconConfig(alibi=False)), posenc.RotaryEmbedding)
    with pytest.raises(ValueError, match="one position module for the model"):
        layer_plan(tf.BloomConfig())


def test_v4_and_v5_forms_agree(tf):
    v5 = tf.LlamaConfig(
        hidden_size=256, num_attention_heads=4, rope_parameters={**SCOUT_ROPE, "rope_theta": 5e5}
    )
    v4 = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "rope_theta": 5e5,
        "rope_scaling": {("type" if k == "rope_type" else k): v for k, v in SCOUT_ROPE.items()},
    }
    a, b = from_hf_config(v5), from_hf_config(v4)
    assert (a.base, a.scaling, a.rotary_dim) == (b.base, b.scaling, b.rotary_dim)


def test_dynamic_ntk_follows_each_call_like_transformers(tf, gen):
    from transformers.models.llama import modeling_llama

    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    config = tf.LlamaConfig(
        hidden_size=64, num_attention_heads=2, max_position_embeddings=64, rope_parameters=rope
    )
    theirs = modeling_llama.LlamaRotaryEmbedding(config)
    ours = from_hf_config(config)
    for length in (32, 100, 80, 200, 20):  # grows, stays, grows, back to the original
        q = torch.randn(1, 2, length, 32, generator=gen)
        positions = torch.arange(length).unsqueeze(0)
        cos, sin = theirs(q, positions)
        q_hf, _ = modeling_llama.apply_rotary_pos_emb(q, q, cos, sin)
        q_ours, _ = ours.rotate(q, q, positions, positions)
        torch.testing.assert_close(ours.inv_freq.float(), theirs.inv_freq, **inv_freq_tol(1e4))
        bound = EPS32 * (8 + length * (1 + math.log(1e4)))
        torch.testing.assert_close(q_ours, q_hf, rtol=0, atol=bound * float(q.abs().max()))


def test_hf_entry_points_default_to_transformers_length_policy():
    config = {"model_type": "llama", "head_dim": 64}
    assert from_hf_config(config).length_policy == "transformers"
    assert rope_from_hf_config(config, length_policy="monotone").length_policy == "monotone"


def test_every_table_entry_is_consistent():
    for model_type, entry in FAMILIES.items():
        assert family(model_type) is entry
        assert entry.summary


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("config", "kwargs", "match"),
    [
        ({"model_type": "mystery"}, {}, r"unknown model_type 'mystery'.*RotaryEmbedding"),
        ({"model_type": "llama", "head_dim": 64, "rope_foo": 2}, {}, "rope_foo=2 changes"),
        ({"model_type": "glm", "head_dim": 64, "rope_interleave": True}, {}, "rope_interleave"),
        (GEMMA3_JSON, {"layer_type": "chunked_attention"}, "'chunked_attention'"),
        (GEMMA3_JSON, {"layer_idx": 12}, "layer_idx=12 is out of range for 12 layers"),
        (GEMMA3_JSON, {"layer_idx": 0, "layer_type": "full_attention"}, "layer 0 is"),
        (
            {"model_type": "smollm3", "num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0]},
            {},
            "differs by layer",
        ),
        (  # ESM's absolute table is built (posenc.hf.absolute); relative ones are not
            {"model_type": "esm", "hidden_size": 64, "position_embedding_type": "relative_key"},
            {},
            "esm position_embedding_type='relative_key'",
        ),
        (  # transformers 5.23 builds DBRX with base 1e4 whatever attn_config says: refuse
            {
                "model_type": "dbrx",
                "d_model": 256,
                "n_heads": 4,
                "attn_config": {"rope_theta": 5e5},
            },
            {},
            r"attn_config.rope_theta=500000.0 changes positions",
        ),
    ],
)
def test_refusals_name_the_value(config, kwargs, match, monkeypatch):
    # posenc's own refusals: as without transformers (which would ignore fields its code
    # never names, as the next test shows)
    monkeypatch.setattr(posenc.hf.families, "transformers_reads", lambda model_type, name: None)
    with pytest.raises(ValueError, match=match):
        from_hf_config(config, **kwargs)


def test_fields_transformers_ignores_are_ignored_alike():
    """Command R7B's config.json says position_embedding_type='rope_gptj', a field that
    Cohere2's code never reads; llama's code never reads a 'rope_foo'."""
    plain = {"model_type": "cohere2", "hidden_size": 64, "num_attention_heads": 4}
    r7b = {**plain, "position_embedding_type": "rope_gptj"}
    assert repr(from_hf_config(r7b, layer_idx=0)) == repr(from_hf_config(plain, layer_idx=0))
    llama = {"model_type": "llama", "head_dim": 64}
    assert repr(from_hf_config({**llama, "rope_foo": 2})) == repr(from_hf_config(llama))
    assert posenc.hf.normalize.transformers_reads("cohere2", "position_embedding_type") is False
    assert posenc.hf.normalize.transformers_reads("glm", "partial_rotary_factor") is True


def test_rope_only_entry_point_refuses_schemes():
    with pytest.raises(ValueError, match="'mrope' scheme"):
        rope_from_hf_config({"model_type": "qwen2_vl", "head_dim": 128})


def test_list_models_prints_the_table(capsys):
    from posenc.cli import main

    assert main(["list", "--models"]) == 0
    out = capsys.readouterr().out
    for expected in ("cohere2", "sliding_rope", "mrope", "alibi", "t5 buckets", "gpt2"):
        assert expected in out


@pytest.mark.parametrize("model_type", ["bloom", "gpt2", "t5"])
def test_rope_entry_point_says_a_bias_or_table_family_has_no_rope(model_type):
    with pytest.raises(ValueError, match=f"'{model_type}' has no RoPE.*from_hf_config"):
        rope_from_hf_config({"model_type": model_type, "hidden_size": 64, "n_head": 4})


def test_a_config_json_without_transformers_is_refused_not_guessed(monkeypatch):
    """Released config.json files leave fields to their config class (Gemma 3's bases and
    layer pattern); without transformers posenc cannot know them, so it refuses."""
    monkeypatch.setattr(posenc.hf.normalize, "_mapping", lambda: None)
    with pytest.raises(ValueError, match=r"model_type 'gemma3_text' needs transformers"):
        from_hf_config({"model_type": "gemma3_text", "head_dim": 128}, layer_idx=0)
    plain = from_hf_config({"hidden_size": 64, "num_attention_heads": 4})  # Llama-style
    assert isinstance(plain, posenc.RotaryEmbedding) and plain.head_dim == 16
