"""The model-family table: how each transformers ``model_type`` places positions.

Shapes: ``D`` head_dim, ``R`` rotary dim. One ``Family`` per ``model_type`` says

* ``layout``: ``"half"`` pairs ``(i, i + R/2)`` (``rotate_half``, GPT-NeoX, HF Llama),
  ``"interleaved"`` pairs ``(2i, 2i + 1)`` (``repeat_interleave`` or complex ``freqs_cis``:
  Cohere, GLM, Helium, ERNIE 4.5, Llama 4, GPT-J), or ``"rope_interleave"``: the config
  field of that name decides (DeepSeek-V3 and the other MLA models, default interleaved);
* ``head_dim``: the fields giving ``D`` directly, first one set wins, else
  ``hidden // heads`` (floor, as transformers' attention modules compute it) with the
  family's ``hidden`` and ``heads`` field names (GPT-J/CodeGen ``n_embd``/``n_head``, DBRX
  ``d_model``/``n_heads``, JetMoE ``kv_channels``, Zamba2 ``attention_head_dim``, MLA
  ``qk_rope_head_dim``: the rotated part of each head, which is its last features);
* ``rotary``: ``"fraction"`` (``R = int(D * f)``, ``f`` from ``partial_rotary_factor`` or
  GPT-NeoX's ``rotary_pct``) or the field that holds ``R`` itself (GPT-J/CodeGen
  ``rotary_dim``; dots.llm ``qk_rope_head_dim``); the rotated features are the first ``R``;
* ``scheme``: built by ``posenc.hf.schemes.build_scheme`` instead (M-RoPE, 2-D axial,
  proportional p-RoPE, position temperature);
* ``layers``: the per-layer rule of ``posenc.hf.layer_plan``: ``"no_rope_layers"`` (Llama 4,
  SmolLM3: 0 marks a NoPE layer), ``"sliding_rope"`` (Cohere2, Flint: only sliding-window
  layers rotate), ``"local_rope"`` (AFMoE, Lara Mini), ``"sliding_rope_or_all"`` (EXAONE 4),
  ``"sliding_rope_dense"`` (Cohere2-MoE), ``"layer_rope_theta"`` (Granite SWA: a base per
  layer, 0 for NoPE), ``"rope_scaling_layers"`` (Molmo 2: the scaling only on the listed
  layers), ``"cross_attention_layers"`` (Llama 3.2 Vision: the listed layers attend to the
  image, unrotated); ``posenc.hf.layers`` says each rule, written from the family's
  attention code (which layers call the rotation) and checked layer by layer against the
  real model;
* ``fields``: the family's own position fields that posenc reads. Any other config field
  whose name mentions rope/rotary/positions with a value set raises ``ValueError``;
* ``clockwise``: pairs rotate by ``-theta`` (NanoChat's ``rotate_half`` flips the signs;
  ``RotaryEmbedding(clockwise=True)``);
* ``ntk_alpha``: a ``dynamic`` rope type with an ``alpha`` is HunYuan's fixed NTK-alpha
  base (``posenc.encodings.rotary.ntk_alpha``), as the family's rotary module reads it;
* ``mscales``: LongRoPE as Phi-3.5-MoE's rotary module computes it: the short factors at
  every length (it never passes the length to them), the attention scale ``short_mscale``
  up to ``L0`` and ``long_mscale`` beyond; other families' modules ignore those two keys;
* ``mlp_blocks``: the config lists each decoder layer as two blocks, attention then
  ``"mlp"`` (Dory's released ``config.json``, and what its config class's ``to_dict``
  writes): ``layer_types`` and the layer counts are read as its config class reads them,
  every second entry and half the count (``posenc.hf.config.config_family``).

``FAMILIES`` is the table; ``family(model_type)`` looks it up and names the way out (pass
the layout explicitly to ``posenc.RotaryEmbedding``) for a ``model_type`` it lacks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posenc._checks import check_bool
from posenc.hf.normalize import transformers_reads

__all__ = ["FAMILIES", "LAYOUTS", "Family", "check_position_fields", "family"]

LAYOUTS = ("half", "interleaved", "rope_interleave")


@dataclass(frozen=True)
class Family:
    """How one model family places positions (see the module docstring)."""

    layout: str = "half"
    head_dim: tuple[str, ...] = ("head_dim",)
    hidden: str = "hidden_size"
    heads: str = "num_attention_heads"
    rotary: str = "fraction"
    scheme: str | None = None
    layers: str | None = None
    fields: frozenset[str] = frozenset()
    clockwise: bool = False
    ntk_alpha: bool = False
    mscales: bool = False
    mlp_blocks: bool = False

    def __post_init__(self) -> None:
        check_bool("clockwise", self.clockwise)
        check_bool("mlp_blocks", self.mlp_blocks)
        check_bool("ntk_alpha", self.ntk_alpha)
        check_bool("mscales", self.mscales)
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def summary(self) -> str:
        """One line for ``posenc list --models``: the scheme or the layout and its rules."""
        if self.scheme:
            return self.scheme
        parts = [{"rope_interleave": "rope_interleave field"}.get(self.layout, self.layout)]
        if self.rotary != "fraction":
            parts.append(self.rotary)
        if self.layers:
            parts.append(self.layers)
        if self.clockwise:
            parts.append("clockwise")
        if self.ntk_alpha:
            parts.append("ntk_alpha")
        if self.mscales:
            parts.append("mscales")
        if self.mlp_blocks:
            parts.append("mlp_blocks")
        return ", ".join(parts)


HALF = Family()
INTERLEAVED = Family(layout="interleaved")
MLA = Family(
    layout="rope_interleave",
    head_dim=("qk_rope_head_dim",),
    fields=frozenset({"qk_rope_head_dim", "rope_interleave"}),
)
GPTJ = Family(
    layout="interleaved",
    head_dim=(),
    hidden="n_embd",
    heads="n_head",
    rotary="rotary_dim",
    fields=frozenset({"rotary_dim"}),
)

_HALF_SPLIT = """
apertus arcee aria_text bamba bitnet chameleon csm cwm deepseek_ocr2_text diffllama
doge dots1 dots3_note_audio_encoder eurobert falcon apertus1p5_text
falcon_h1 flex_olmo gemma gemma2 gpt_neox gpt_neox_japanese gradium_phonon_tts
granite
granite4_vision_text granite_docling_text granitemoe granitemoeshared gte
higgs_audio_v2 hrm_text hy_v3 hyperclovax idefics jais2
jina_embeddings_v3 exaone internlm3 iquestcoder sarvam_moe kyutai_speech_to_text laguna
lasr_encoder lfm2 lfm2_moe llama
mellum mimi mimo_v2_flash minimax ministral mistral mixtral
modernbert modernbert-decoder molmo2_text moshi muse_glimmer_assistant nemotron
nemotron3_5_transcribe_asr_audio neucodec nomic_bert olmo olmo2 olmo3 olmo_hybrid olmoe
persimmon phi phi3 phi4_multimodal pocket_tts pocket_tts_audio_tokenizer qwen2
qwen2_5_omni_dit qwen2_moe qwen3 qwen3_moe qwen3_next recurrent_gemma seed_oss solar_open
stablelm starcoder2 t5gemma2_text timesfm2_5 ultrabert unlimited_ocr_text vaultgemma xcodec2
zaya lfm3 beam glm4_moe esmc gpt_oss emu3_text_model step3p5 voxtral_realtime_text
qwen3_omni_moe_talker_code_predictor dia_encoder dia_decoder t5_gemma_module
deepseek_ocr2_encoder nemotron3_diarization_audio
"""
_INTERLEAVED = """
cohere ernie4_5 ernie4_5_moe glm glm4 helium moonshine_streaming
pe_audio_encoder pe_audio_video_encoder pe_video_encoder openai_privacy_filter
blt_local_encoder blt_local_decoder blt_global_transformer blt_patcher
"""
_MLA = """
axk1 axk2 bailing_hybrid deepseek_v2 deepseek_v3 deepseek_v32 glm4_moe_lite glm_moe_dsa
longcat_flash youtu sarvam_mla
"""
# M-RoPE and 2-D axial schemes (posenc.hf.schemes), each checked against the family's own
# rotary at 3-axis / [N, 2] positions (the parity walk, tests/_hf_walk.py)
_MROPE = """
qwen2_vl qwen2_vl_text qwen2_5_vl qwen2_5_vl_text paddleocr_vl paddleocr_vl_text qwen2_5_omni
qwen2_5_omni_thinker qwen2_5_omni_text qwen2_5_omni_talker
"""
_MROPE_INTERLEAVED = """
qwen3_vl qwen3_vl_text qwen3_vl_moe qwen3_vl_moe_text cosmos3_edge cosmos3_edge_text
qwen3_omni_moe qwen3_omni_moe_thinker qwen3_omni_moe_text qwen3_omni_moe_talker_text
cohere_compass cohere_compass_text
"""
_QWEN3_5_MROPE = "qwen3_5 qwen3_5_text qwen3_5_moe qwen3_5_moe_text qwen4_exp qwen4_exp_text"
_GLM4V_MROPE = "glm4v glm4v_text glm_ocr glm_ocr_text"
_GLM_MROPE = "glm4v_moe glm4v_moe_text glm_image glm_image_text"
_AXIAL = """
qwen2_vl_vision qwen2_5_vl_vision qwen3_vl_vision qwen3_vl_moe_vision qwen3_5_vision
qwen3_5_moe_vision qwen4_exp_vision glm4v_vision glm4v_moe_vision glm_ocr_vision
glm5_next_vision mlcd_vision_model lfm3_vl_vision muse_glimmer_vision muse_spark_vision
paddleocr_vl_vision video_llama_3_vision dots3_note_vision_encoder exaone4_5_vision
ernie4_5_vl_moe_vision qwen2_5_omni_vision_encoder qwen3_omni_moe_vision_encoder
cohere_compass_vision
"""
# the axial variants of posenc.hf.schemes (column-first blocks, adjacent pairs, ...)
_AXIAL_VARIANTS = {
    "step3p5_vision": "axial_xy",
    "inkling2_vision": "axial_xy_adjacent",
    "sam3_vit_model": "axial_xy_adjacent",
    "llama4_vision_model": "axial_xy_llama4",
    "gemma4_vision": "axial_xy_per_axis",
    "kimi_k25_vision": "axial_xy_cyclic",
    "minimax_m3_vl_vision": "axial_thw",
    "eomt_dinov3": "dinov3",
    **dict.fromkeys(("sam2_video", "sam3_tracker_video", "edgetam_video"), "memory_axial"),
    "efficientloftr": "loftr_axial",
}
# per-layer-type rope parameters and per-layer head dims (per_layer_config), as Gemma 4
_PROPORTIONAL = """
gemma4 gemma4_text gemma4_unified gemma4_unified_text diffusion_gemma_text embedding_gemma2
embedding_gemma2_text
"""
_TEMPERATURE = "ministral3 mistral4"

FAMILIES: dict[str, Family] = {
    **dict.fromkeys(_HALF_SPLIT.split(), HALF),
    **dict.fromkeys(_INTERLEAVED.split(), INTERLEAVED),
    **dict.fromkeys(_MLA.split(), MLA),
    **{name: Family(scheme="mrope") for name in _MROPE.split()},
    **{name: Family(scheme="mrope_interleaved") for name in _MROPE_INTERLEAVED.split()},
    **{name: Family(scheme="qwen3_5_mrope") for name in _QWEN3_5_MROPE.split()},
    **{name: Family(scheme="glm4v_mrope") for name in _GLM4V_MROPE.split()},
    **{name: Family(scheme="glm_mrope") for name in _GLM_MROPE.split()},
    **dict.fromkeys(("ernie4_5_vl_moe", "ernie4_5_vl_moe_text"), Family(scheme="ernie_mrope")),
    "neomme": Family(scheme="neomme_mrope"),
    # XD-RoPE: 3 or 4 axes over feature blocks of the [cos | cos] layout
    **dict.fromkeys(("hunyuan_vl", "hunyuan_vl_text"), Family(scheme="hunyuan_xdrope")),
    **{name: Family(scheme="axial") for name in _AXIAL.split()},
    "pixtral": Family(scheme="axial_alternating"),
    "dinov3_vit": Family(scheme="dinov3"),
    **{name: Family(scheme=scheme) for name, scheme in _AXIAL_VARIANTS.items()},
    **{name: Family(scheme="proportional") for name in _PROPORTIONAL.split()},
    **{name: Family(scheme="temperature") for name in _TEMPERATURE.split()},
    "gptj": GPTJ,
    "codegen": GPTJ,
    "cohere2": Family(layout="interleaved", layers="sliding_rope"),
    "cohere2_moe": Family(layout="interleaved", layers="sliding_rope_dense"),
    "flint": Family(layers="sliding_rope"),
    **dict.fromkeys(("afmoe", "lara_mini"), Family(layers="local_rope")),
    "mllama_text_model": Family(
        layers="cross_attention_layers", fields=frozenset({"cross_attention_layers"})
    ),
    **dict.fromkeys(("exaone4", "exaone_moe", "kolibri1"), Family(layers="sliding_rope_or_all")),
    "dbrx": Family(head_dim=(), hidden="d_model", heads="n_heads"),
    "jetmoe": Family(head_dim=("kv_channels",), fields=frozenset({"kv_channels"})),
    "granitemoehybrid": Family(fields=frozenset({"position_embedding_type"})),
    "zamba2": Family(head_dim=("attention_head_dim",), fields=frozenset({"use_mem_rope"})),
    "moonshine": Family(layout="interleaved", heads="encoder_num_attention_heads"),
    "dots3_note_text": Family(
        layout="interleaved", rotary="qk_rope_head_dim", fields=frozenset({"qk_rope_head_dim"})
    ),
    # transformers rotates the whole head; its rotary_dim field is not read by the model
    "minimax_m3_vl_text": Family(fields=frozenset({"rotary_dim"})),
    # its config class turns rotary_dim into rope_parameters' partial_rotary_factor (read)
    "minimax_m2": Family(fields=frozenset({"rotary_dim"})),
    "phimoe": Family(mscales=True),
    "hy_v4": Family(head_dim=("qk_rope_head_dim",), fields=frozenset({"qk_rope_head_dim"})),
    # Hy4-VL's text tower: Qwen3-VL's cyclic M-RoPE on adjacent pairs (GLM's rotation), over
    # the rotated part of its MLA heads (head_dim, which its rotary module reads)
    "hy_v4_vl_text": Family(scheme="hy_v4_mrope", fields=frozenset({"qk_rope_head_dim"})),
    "molmo2_text": Family(layers="rope_scaling_layers", fields=frozenset({"rope_scaling_layers"})),
    "minicpm3": Family(head_dim=("qk_rope_head_dim",), fields=frozenset({"qk_rope_head_dim"})),
    "mistral_large4_text": Family(
        layout="interleaved",
        head_dim=("qk_rope_head_dim",),
        layers="no_rope_layers",
        fields=frozenset({"qk_rope_head_dim", "no_rope_layers", "no_rope_layer_interval"}),
    ),
    **dict.fromkeys(
        ("gemma3_text", "gemma3n_text", "t5gemma2_text"),
        Family(fields=frozenset({"rope_local_base_freq"})),
    ),
    "smollm3": Family(
        layers="no_rope_layers", fields=frozenset({"no_rope_layers", "no_rope_layer_interval"})
    ),
    "llama4_text": Family(
        layout="interleaved",
        layers="no_rope_layers",
        fields=frozenset({"no_rope_layers", "no_rope_layer_interval", "attn_temperature_tuning"}),
    ),
    **dict.fromkeys(
        ("granite_swa", "granitemoe_swa", "muse_glimmer_text", "muse_spark_text"),
        Family(layers="layer_rope_theta", fields=frozenset({"layer_rope_theta"})),
    ),
    "esm": Family(fields=frozenset({"position_embedding_type"})),
    "deepseek_v4": Family(scheme="deepseek_v4"),
    "dory": Family(mlp_blocks=True),  # nGPT, looped: every layer rotates, by its layer type
    "nanochat": Family(clockwise=True),  # rotate_half with flipped signs: by -theta
    **dict.fromkeys(("hunyuan_v1_dense", "hunyuan_v1_moe"), Family(ntk_alpha=True)),
    "evolla": Family(fields=frozenset({"position_embedding_type"})),
}


#: models whose stacks keep their own rope settings in sub-configs: the sub-configs to pass
STACKS = {
    "dia": ("encoder_config", "decoder_config"),
    "t5gemma": ("encoder", "decoder"),
    "blt": ("encoder_config", "global_config", "decoder_config", "patcher_config"),
    # DeepSeek-OCR2's vision tower: a SAM encoder (no RoPE), then a 1-D RoPE decoder over
    # patch and query tokens
    "deepseek_ocr2_vision": ("encoder_config",),
    "nemotron3_diarization": ("audio_config",),  # the RoPE of its audio encoder
}


def family(model_type: object) -> Family:
    """The table entry of ``model_type``.

    Raises:
        ValueError: a ``model_type`` the table does not know (or none), naming it and
            saying how to build the rotation explicitly; the whole config of a model of
            stacks with their own rope settings (``STACKS``), naming the sub-configs to pass.
    """
    if isinstance(model_type, str) and model_type in STACKS:
        parts = ", ".join(f"config.{name}" for name in STACKS[model_type])
        raise ValueError(
            f"model_type {model_type!r} keeps its rope settings in the config of each stack; "
            f"pass one of them: {parts}"
        )
    found = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if found is None and _non_rotary(model_type):
        raise ValueError(
            f"model_type {model_type!r} has no RoPE (its positions are an attention bias or "
            "a position table): use posenc.from_hf_config(config)"
        )
    if found is None:
        raise ValueError(
            f"unknown model_type {model_type!r}: posenc does not know this family's rotary "
            "layout; build it explicitly with posenc.RotaryEmbedding(head_dim, base=..., "
            "rotary_dim=..., interleaved=True|False, scaling=...), or drop model_type from "
            "the dict to read it as a Llama-style (half-split) config"
        )
    return found


def _non_rotary(model_type: object) -> bool:
    """Whether posenc builds ``model_type``'s positions as a bias or a table (BLOOM, GPT-2)."""
    from posenc.hf.absolute import ABSOLUTE_FAMILIES  # the bias and table families
    from posenc.hf.biases import ALIBI_FAMILIES, T5_FAMILIES
    from posenc.hf.deberta import DEBERTA_FAMILIES

    tables = (ALIBI_FAMILIES, T5_FAMILIES, ABSOLUTE_FAMILIES, DEBERTA_FAMILIES)
    return isinstance(model_type, str) and any(model_type in table for table in tables)


_POSITION_FIELD = re.compile(r"rope|rotary|pos_emb|position_embedding_type|theta|scaling_beta")
_READ = frozenset(
    {"rope_parameters", "rope_scaling", "rope_theta", "rotary_emb_base", "partial_rotary_factor",
     "rotary_pct"}
)  # fmt: skip
_NESTED = ("attn_config",)  # a dict of attention settings inside the config


def check_position_fields(cfg: Mapping[str, Any], fam: Family) -> None:
    """Raise on a set field that changes positions and that ``fam`` does not read.

    A field is position-changing when its name mentions rope, rotary, pos_emb,
    position_embedding_type, theta or scaling_beta; None, False and empty values are unset;
    a field that the installed transformers' code of the family never names is ignored, as
    transformers ignores it (``posenc.hf.normalize.transformers_reads``).
    DBRX's and MPT's nested ``attn_config`` is searched too (``attn_config.rope_theta``).

    Raises:
        ValueError: naming the field, its value and the model_type.
    """
    _check_fields(cfg, fam, cfg.get("model_type"), "")
    kind = cfg.get("position_embedding_type")
    if "position_embedding_type" in fam.fields and kind not in (None, "rotary", "rope"):
        raise ValueError(f"position_embedding_type={kind!r} is not rotary; this config has no RoPE")


def _check_fields(cfg: Mapping[str, Any], fam: Family, model_type: object, prefix: str) -> None:
    for key, value in cfg.items():
        name = str(key)
        if prefix + name in _READ or prefix + name in fam.fields:
            continue
        if isinstance(value, Mapping) and name in _NESTED and not prefix:
            _check_fields(value, fam, model_type, f"{name}.")
            continue
        if value is None or value is False or value == [] or value == {}:
            continue
        if _POSITION_FIELD.search(name) and transformers_reads(model_type, name) is not False:
            raise ValueError(
                f"config field {prefix}{name}={value!r} changes positions, and posenc does not "
                f"read it for model_type {model_type!r}; build the encoding explicitly"
            )
