"""Every decoder family of the installed transformers, layer by layer, in the real model.

``_hf_model_walk`` builds a tiny random model of each family from its own config class and
records which layers rotate q/k and how; ``posenc.hf.layer_plan`` (from the config object
and from its ``config.json``) must agree at every layer, at positions ``0..6`` and
``1000..1006``, and ``posenc.hf.patch`` must give the model's logits and greedy tokens, or
refuse the family by name. A family the walk cannot build tiny or run is listed in
``NOT_BUILT``, one whose own ``generate`` fails in ``NOT_GENERATED`` (its layer plan still
checked), each with the error it raises, which a test checks (not counted as matched).
Linear-attention layers run transformers' PyTorch path on a CPU. The default run checks
``SAMPLE`` (one family per per-layer rule and layout); ``pytest -m slow`` walks them all.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="builds tiny transformers models")

import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError
from packaging.version import Version

import _hf_model_walk as walk
import posenc
from posenc.hf.patch_rotation import rotation_methods

# families the walk does not build, each with the error that building or running it raises
# (model_type -> exception, message pattern, reason); test_each_exclusion_raises_its_error
# proves every one
NOT_BUILT = {
    "cohere_compass_text": (
        KeyError,
        "full_attention",
        "its default config has no rope parameters for its full-attention layers, which its "
        "own rotary module reads",
    ),
    "qwen4_exp_text": (
        TypeError,
        r"unsupported operand type\(s\) for //: 'NoneType'",
        "its default config leaves the sparse indexer's sizes unset",
    ),
    "dots3_note_text": (
        StrictDataclassClassValidationError,
        "num_key_value_heads must match num_attention_heads",
        "its config class ties the key heads and the sliding layers' head sizes to the full "
        "model's",
    ),
}
# families whose layer plans are checked but whose patched outputs are not compared: the
# error that the model itself raises in the comparison (transformers' generate), and why
NOT_GENERATED = {
    "hrm_text": (IndexError, "list index out of range", "generate fails on its recurrent cache"),
}
# families that patch refuses by name (the reason; their layer plans are still checked):
# positions other than one rotary table per layer type, or no rotary module to replace
PATCH_REFUSED = {
    "granite_swa": "a RoPE base per layer (layer_rope_theta)",
    "granitemoe_swa": "a RoPE base per layer (layer_rope_theta)",
    "deepseek_v4": "main and compressed-attention rotations per layer",
    "moshi": "two rotary modules (the depth decoder has its own)",
    "qwen3_5_text": "M-RoPE over three position axes (qwen3_5_mrope)",
    "qwen3_5_moe_text": "M-RoPE over three position axes (qwen3_5_mrope)",
    "granitemoehybrid": "position_embedding_type None: no rotary_emb",
    "zamba2": "use_mem_rope False: no rotary_emb",
    "lfm2_moe": "its rotary module is named pos_emb, not rotary_emb",
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
        pytest.skip(NOT_BUILT[model_type][2])
    model = walk.build(model_type)
    with walk.pytorch_fallbacks(model):
        try:
            problems = walk.check_family(model_type, model)
        except walk.Refused as exc:  # refused by name: never a wrong encoding
            pytest.skip(f"layer_plan refuses {model_type}: {exc}")
        assert problems == [], problems
        if model_type in NOT_GENERATED:
            error, pattern, _ = NOT_GENERATED[model_type]
            with pytest.raises(error, match=pattern):
                walk.check_patch(model_type, model)
            return
        older = Version(transformers.__version__) < Version("5.24")
        if model_type in PATCH_REFUSED or (older and model_type in REFUSED_BEFORE_5_24):
            with pytest.raises(walk.Refused, match=r"not supported by posenc\.hf\.patch"):
                walk.check_patch(model_type, model)
            return
        assert walk.check_patch(model_type, model) == []


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(NOT_BUILT))
def test_each_exclusion_raises_its_error(model_type):
    if model_type not in FAMILIES:
        pytest.skip(f"{model_type} is not a family of transformers {transformers.__version__}")
    error, pattern, _ = NOT_BUILT[model_type]
    with pytest.raises(error, match=pattern):
        model = walk.build(model_type)
        with walk.pytorch_fallbacks(model):
            walk.check_family(model_type, model)
            walk.check_patch(model_type, model)


def test_the_lists_name_walked_families():
    if Version(transformers.__version__) < Version("5.24"):
        pytest.skip("the lists name the families of transformers 5.24 and later")
    assert set(NOT_BUILT) <= set(FAMILIES), sorted(set(NOT_BUILT) - set(FAMILIES))
    assert set(NOT_GENERATED) <= set(FAMILIES), sorted(set(NOT_GENERATED) - set(FAMILIES))
    assert set(PATCH_REFUSED) <= set(FAMILIES), sorted(set(PATCH_REFUSED) - set(FAMILIES))
    assert set(SAMPLE) <= set(FAMILIES), sorted(set(SAMPLE) - set(FAMILIES))


def _rotating(plan) -> list[int]:
    return [i for i, encoding in enumerate(plan) if not isinstance(encoding, posenc.NoPE)]


def test_mllama_cross_attention_layers_do_not_rotate():
    """Llama 3.2 Vision: the layers of ``cross_attention_layers`` attend to the image and
    call no rotation (the class's methods name none); the others rotate."""
    from transformers.models.mllama import modeling_mllama as m

    assert rotation_methods(m.MllamaTextCrossAttention) == {}
    assert rotation_methods(m.MllamaTextSelfAttention) != {}
    text = transformers.MllamaTextConfig(num_hidden_layers=6, cross_attention_layers=[1, 4])
    raw = {k: v for k, v in text.to_dict().items() if k != "cross_attention_layers"}
    default = transformers.MllamaTextConfig()  # cross-attention at 3, 8, ..., 38 of 40
    for config, cross in (
        (text, [1, 4]),
        (transformers.MllamaConfig(text_config=text.to_dict()), [1, 4]),
        (default, default.cross_attention_layers),
        ({**raw, "num_hidden_layers": 40}, default.cross_attention_layers),
    ):
        plan = posenc.hf.layer_plan(config)
        assert _rotating(plan) == [i for i in range(len(plan)) if i not in cross]


@pytest.mark.parametrize(
    ("layers", "error", "match"),
    [
        ("3", TypeError, "cross_attention_layers must be a list of layer indices, got '3'"),
        ([1, -1], ValueError, r"cross_attention_layers\[1\] must be >= 0, got -1"),
        ([1.5], TypeError, r"cross_attention_layers\[0\] must be an integer"),
    ],
)
def test_mllama_bad_cross_attention_layers_are_refused(layers, error, match):
    config = {
        "model_type": "mllama_text_model",
        "num_hidden_layers": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
        "cross_attention_layers": layers,
    }
    with pytest.raises(error, match=match):
        posenc.hf.layer_plan(config)


def test_lara_mini_rotates_its_sliding_layers_only():
    """Lara Mini: the model hands position embeddings to its sliding-window layers only;
    its full-attention layers are NoPE and its linear-attention layers have no scores."""
    if not hasattr(transformers, "LaraMiniConfig"):
        pytest.skip("Lara Mini is new in transformers 5.24")
    config = transformers.LaraMiniConfig(num_hidden_layers=10)
    sliding = [i for i, kind in enumerate(config.layer_types) if kind == "sliding_attention"]
    assert {"full_attention", "linear_attention"} <= set(config.layer_types)
    assert _rotating(posenc.hf.layer_plan(config)) == sliding
    assert _rotating(posenc.hf.layer_plan(config.to_diff_dict())) == sliding


_GRANITE_HYBRID = {"layer_types": ["mamba", "attention"], "num_hidden_layers": 2}


@pytest.mark.parametrize(
    ("name", "fields", "rotating"),
    [
        ("Qwen3_5TextConfig", {"num_hidden_layers": 4}, [3]),  # gated delta nets, then full
        ("BambaConfig", {"num_hidden_layers": 3, "attn_layer_indices": [1]}, [1]),  # Mamba
        ("Zamba2Config", {}, []),  # use_mem_rope False: no rotary module
        ("GraniteMoeHybridConfig", _GRANITE_HYBRID, []),  # position_embedding_type None
        ("GraniteMoeHybridConfig", {**_GRANITE_HYBRID, "position_embedding_type": "rope"}, [1]),
    ],
)
def test_layers_without_a_rotation_are_nope(name, fields, rotating):
    """Layers whose model code calls no rotation (recurrent and state-space layers, models
    whose config turns RoPE off) are NoPE in the plan, from the config and its dict."""
    config = getattr(transformers, name)(**fields)
    assert _rotating(posenc.hf.layer_plan(config)) == rotating
    assert _rotating(posenc.hf.layer_plan(config.to_diff_dict())) == rotating


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model_type", "interleaved"), [("deepseek_v32", False), ("axk2", False), ("glm_moe_dsa", True)]
)
def test_sparse_indexers_rotate_the_attention_rope_in_their_own_layout(model_type, interleaved):
    """The walk compares the attention's rotation with the layer plan; a sparse-attention
    indexer rotates by the same angles, in its own layout (half-split where DeepSeek-V3.2's
    attention is interleaved): the plan's rotation in that layout gives its scores."""
    if model_type not in FAMILIES:
        pytest.skip(f"{model_type} is not a family of transformers {transformers.__version__}")
    model = walk.build(model_type)
    plan = [
        posenc.RotaryEmbedding(e.head_dim, base=e.base, interleaved=interleaved)
        for e in posenc.hf.layer_plan(model.config)
    ]
    assert all(e.interleaved for e in posenc.hf.layer_plan(model.config))  # the attention's
    for first in (0, walk.OFFSET):
        indexer = walk.record(model, first, indexers=True)
        assert sorted(indexer.layers) == list(range(len(plan)))
        assert walk.compare(plan, indexer) == []
