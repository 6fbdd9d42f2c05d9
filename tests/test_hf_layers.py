"""Every decoder family of the installed transformers, layer by layer, in the real model.

``_hf_model_walk`` builds a tiny random model of each family from its own config class and
records which layers rotate q/k and how; ``posenc.hf.layer_plan`` (from the config object
and from its ``config.json``) must agree at every layer, at positions ``0..6`` and
``1000..1006``, and ``posenc.hf.patch`` must give the model's logits and greedy tokens, or
refuse the family by name. A family the walk cannot build tiny is listed in ``NOT_BUILT``
with the reason (not counted as matched). The default run checks ``SAMPLE`` (one family per
per-layer rule and layout); ``pytest -m slow`` walks them all.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="builds tiny transformers models")

import transformers
from packaging.version import Version

import _hf_model_walk as walk

_FLA = "its linear-attention layers run flash-linear-attention's Triton kernels, which need a GPU"
_MLA_INDEXER = "the tiny MLA sizes do not fit its sparse-attention indexer"
NOT_BUILT = {
    "bamba": "Mamba head sizes tied to the hidden size",
    "zaya": "needs num_experts_per_tok=1 and its own expert layout",
    "granitemoehybrid": "Mamba head sizes tied to the hidden size",
    "blt": "its byte-patch encoder takes over a minute to build on a CPU",
    "cohere_compass_text": "its default config lacks rope parameters for one layer type",
    "dbrx": "its nested attn_config is not shrunk by the walk",
    "dots1": "its default config leaves the MoE sizes unset",
    "dots3_note_text": "query and key heads must be equal",
    "gemma3n_text": "its KV-sharing layers must keep their full pattern",
    "lfm2_moe": "its default config leaves the MoE layout unset",
    "qwen4_exp_text": "its default config leaves the head sizes unset",
    "zamba2": "Mamba head sizes tied to the hidden size",
    "dory": "not in posenc's table (new in transformers 5.24): refused by name",
    **dict.fromkeys(
        ("bailing_hybrid", "lara_mini", "olmo_hybrid", "qwen3_5_text", "qwen3_5_moe_text",
         "qwen3_next"),
        _FLA,
    ),
    **dict.fromkeys(
        ("axk1", "axk2", "beam", "deepseek_v32", "glm_moe_dsa", "longcat_flash"), _MLA_INDEXER
    ),
    "hrm_text": "its recurrent cache does not take transformers' generate loop",
}  # fmt: skip
# families whose positions differ from one rotary table per layer type: patch refuses them
# by name (their layer plans are still checked)
PATCH_REFUSED = {
    "granite_swa": "a RoPE base per layer (layer_rope_theta)",
    "granitemoe_swa": "a RoPE base per layer (layer_rope_theta)",
    "deepseek_v4": "main and compressed-attention rotations per layer",
    "moshi": "two rotary modules (the depth decoder has its own)",
}
# refused only on older releases (the reason): GPT-J and CodeGen rotate inside their
# attention modules, without a rotary_emb, before transformers 5.24
REFUSED_BEFORE_5_24 = {"gptj", "codegen"}
SAMPLE = [
    "llama", "gemma3_text", "exaone4", "afmoe", "smollm3", "cohere2", "minimax", "gptj",
    "deepseek_v3", "nanochat",
]  # fmt: skip
FAMILIES = sorted(walk.families())


def _marks(model_type: str) -> list:
    return [] if model_type in SAMPLE else [pytest.mark.slow]


@pytest.mark.parametrize("model_type", [pytest.param(f, marks=_marks(f)) for f in FAMILIES])
def test_layers_and_patch_match_the_real_model(model_type):
    if model_type in NOT_BUILT:
        pytest.skip(NOT_BUILT[model_type])
    model = walk.build(model_type)
    try:
        problems = walk.check_family(model_type, model)
    except walk.Refused as exc:  # refused by name: never a wrong encoding
        pytest.skip(f"layer_plan refuses {model_type}: {exc}")
    assert problems == [], problems
    older = Version(transformers.__version__) < Version("5.24")
    if model_type in PATCH_REFUSED or (older and model_type in REFUSED_BEFORE_5_24):
        with pytest.raises(walk.Refused, match=r"not supported by posenc\.hf\.patch"):
            walk.check_patch(model_type, model)
        return
    assert walk.check_patch(model_type, model) == []


def test_the_lists_name_walked_families():
    if Version(transformers.__version__) < Version("5.24"):
        pytest.skip("the lists name the families of transformers 5.24 and later")
    assert set(NOT_BUILT) <= set(FAMILIES), sorted(set(NOT_BUILT) - set(FAMILIES))
    assert set(PATCH_REFUSED) <= set(FAMILIES), sorted(set(PATCH_REFUSED) - set(FAMILIES))
    assert set(SAMPLE) <= set(FAMILIES), sorted(set(SAMPLE) - set(FAMILIES))
