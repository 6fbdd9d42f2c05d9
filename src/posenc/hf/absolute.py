"""Absolute position tables of Hugging Face checkpoints and their offsets, for every
non-rotary family posenc builds from a config (weights: ``posenc.hf.weights``).

Shapes: ``B`` batch, ``T`` length, ``C`` d_model, ``P`` table rows.

Learned tables (Gehring et al. 2017; BERT; GPT-2) are read at ``row = position + offset``:
0 for GPT-2 and the BERT-likes, 2 for OPT, BioGPT and BART / mBART / PLBart / MVP / TrOCR
and PP-FormulaNet's decoder (fairseq's ``padding_idx + 1``; their tables have
``max_position_embeddings + 2`` rows),
``padding_idx + 1`` for RoBERTa / XLM-R and the families that copy their
``create_position_ids_from_input_ids`` (those count real tokens only: padding is
skipped). posenc keeps the rows from the offset on, so its position ``p`` is the
``p``-th real token and ``LearnedPositionalEncoding(C, P - offset)`` holds them;
``positions_skipping_padding`` gives the positions of padded batches the way RoBERTa, OPT
and fairseq count them. Sinusoidal families get a ``SinusoidalLayout`` (the ``[sin | cos]``
halves, tensor2tensor spacing, fairseq's offset of 2; TrOCR's when its config says
``use_learned_position_embeddings=False``), FSMT's from ``padding_idx + 1``.

Whisper's stacks differ: the encoder adds a fixed ``[sin | cos]`` table of tensor2tensor
spacing over its audio frames, the decoder a learned table from row 0; ``stack=`` picks
one and the whole-model request is refused. MPNet adds a learned table (offset 2: its
``padding_idx`` is always 1, whatever ``pad_token_id`` says) and T5 buckets in attention:
a ``Compose`` of both (``posenc.hf.biases``). TAPAS reads a plain table at positions that
restart in every table cell (``posenc.hf.tapas``). The layout models (BROS, LayoutLMv2,
LayoutLMv3, LiLT) read an ordinary 1-D table; their bounding-box embeddings (and BROS's
box-distance term in attention) are input features posenc does not build, and LayoutLMv2
/ v3 configs with the 1-D or 2-D attention biases (``has_relative_attention_bias``,
``has_spatial_attention_bias``) are refused.
LiLT's layout stream reads a second, narrower table (``box_position_embeddings``) at the
same positions; posenc builds the text stream's. RoFormer's sinusoidal table is a rotary
embedding (``posenc.hf.roformer``).

Multimodal families keep their text table in a text tower (``posenc.hf.composite``):
CLIP- and BERT-style text models count from 0 (ALIGN, Chinese-CLIP, FLAVA, BLIP's text
model, the Q-Formers of BLIP-2 / InstructBLIP, GIT, LXMERT, VisualBERT, ViLT, TVP and
Perceiver's text preprocessor; TIPSv2's is a fixed ``[sin | cos]`` table of tensor2tensor
spacing), RoBERTa-style ones from ``padding_idx + 1`` skipping padding (AltCLIP,
BridgeTower, CLAP), and Kosmos-2, Kosmos-2.5, SeamlessM4T and SpeechT5's text decoder use
M2M100's sinusoidal table from ``padding_idx + 1`` (tensor2tensor spacing, padding
skipped; with a cache they count on from the cache's length, padding included:
``positions_skipping_padding(new_mask, past=cache_length)``). Kosmos-2.5 adds a learned
segment embedding (image or text token) to that table: a token-type input, not built
here. GIT reads row ``past_key_values_length + i`` with a cache, and its cache counts the
image tokens too. Image, audio and speech-unit positions of these models are not built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posenc._checks import check_int
from posenc.base import Compose, PositionalEncoding
from posenc.encodings.learned import LearnedPositionalEncoding
from posenc.encodings.sinusoidal_layouts import SinusoidalLayout
from posenc.hf.biases import bias_module, mpnet_bias_from_hf
from posenc.hf.composite import text_tower
from posenc.hf.deberta import DEBERTA_FAMILIES, deberta_from_hf
from posenc.hf.roformer import roformer_rotary
from posenc.hf.weights import load_hf_weights

__all__ = [
    "ABSOLUTE_FAMILIES",
    "AbsoluteSpec",
    "build_position_module",
    "load_hf_weights",
    "positions_skipping_padding",
]


@dataclass(frozen=True)
class AbsoluteSpec:
    """How one family lays out its absolute positions.

    kind: "learned" or "sinusoidal". offset: rows (learned) or angle positions
    (sinusoidal) before position 0; "padding" means ``padding_idx + 1``. extra_rows:
    table rows beyond ``max_position_embeddings``. skips_padding: positions count real
    tokens only. layout / spacing: as in ``SinusoidalLayout``.
    """

    kind: str
    offset: int | str = 0
    extra_rows: int = 0
    skips_padding: bool = False
    layout: str = "sin|cos"
    spacing: str = "paper"


_PLAIN = AbsoluteSpec("learned")
_FAIRSEQ = AbsoluteSpec("learned", offset=2, extra_rows=2)
_ROBERTA = AbsoluteSpec("learned", offset="padding", skips_padding=True)
_MARIAN = AbsoluteSpec("sinusoidal")
_T2T = AbsoluteSpec("sinusoidal", offset=2, skips_padding=True, spacing="tensor2tensor")
_T2T_PAD = AbsoluteSpec("sinusoidal", "padding", skips_padding=True, spacing="tensor2tensor")
_T2T_FROM_0 = AbsoluteSpec("sinusoidal", spacing="tensor2tensor")

#: model_type -> layout, for the families whose layout is tested against their own module.
ABSOLUTE_FAMILIES: dict[str, AbsoluteSpec] = {
    **dict.fromkeys(("gpt2", "gpt_bigcode", "gpt_neo", "blenderbot", "blenderbot-small"), _PLAIN),
    **dict.fromkeys(("led", "bigbird_pegasus", "bert", "albert", "bert-generation"), _PLAIN),
    **dict.fromkeys(("big_bird", "convbert", "distilbert", "electra", "ernie"), _PLAIN),
    **dict.fromkeys(("flaubert", "fnet", "layoutlm", "megatron-bert"), _PLAIN),
    **dict.fromkeys(("mobilebert", "mra", "nystromformer", "rembert", "roc_bert"), _PLAIN),
    **dict.fromkeys(("splinter", "squeezebert", "xlm", "yoso"), _PLAIN),
    **dict.fromkeys(("bart", "mbart", "plbart", "mvp", "trocr"), _FAIRSEQ),
    **dict.fromkeys(("opt", "biogpt"), AbsoluteSpec("learned", 2, 2, skips_padding=True)),
    **dict.fromkeys(("roberta", "xlm-roberta", "camembert", "data2vec-text"), _ROBERTA),
    **dict.fromkeys(("longformer", "luke", "markuplm", "roberta-prelayernorm"), _ROBERTA),
    **dict.fromkeys(("xlm-roberta-xl", "xmod", "esm", "layoutlmv3", "lilt"), _ROBERTA),
    **dict.fromkeys(("bros", "layoutlmv2", "tapas"), _PLAIN),
    "pp_formulanet_text": _FAIRSEQ,
    "mpnet": AbsoluteSpec("learned", offset=2, skips_padding=True),
    "fsmt": _T2T_PAD,
    **dict.fromkeys(("marian", "pegasus"), _MARIAN),
    **dict.fromkeys(("m2m_100", "nllb-moe", "speech_to_text"), _T2T),
    **dict.fromkeys(("pegasus_x", "tipsv2_text_model"), _T2T_FROM_0),
    "xglm": AbsoluteSpec("sinusoidal", offset=2, spacing="tensor2tensor"),
    # the text towers of multimodal families (``posenc.hf.composite``)
    **dict.fromkeys(("align_text_model", "chinese_clip_text_model", "flava_text_model"), _PLAIN),
    **dict.fromkeys(("blip_text_model", "git", "lxmert", "visual_bert"), _PLAIN),
    **dict.fromkeys(("vilt", "tvp", "perceiver"), _PLAIN),
    **dict.fromkeys(
        ("blip_2_qformer", "instructblip_qformer", "instructblipvideo_qformer"), _PLAIN
    ),
    **dict.fromkeys(("altclip_text_model", "bridgetower_text_model", "clap_text_model"), _ROBERTA),
    **dict.fromkeys(("kosmos_2_text_model", "kosmos_2_5_text_model", "speecht5"), _T2T_PAD),
    **dict.fromkeys(("seamless_m4t", "seamless_m4t_v2"), _T2T_PAD),
    **dict.fromkeys(
        ("musicgen", "musicgen_decoder", "musicgen_melody", "musicgen_melody_decoder"),
        AbsoluteSpec("sinusoidal", layout="cos|sin", spacing="tensor2tensor"),
    ),
}

#: Families whose encoder and decoder lay out positions differently: ``stack=`` picks one.
STACKS: dict[str, dict[str, AbsoluteSpec]] = {
    "whisper": {"encoder": _T2T_FROM_0, "decoder": _PLAIN},
}

#: Attention biases posenc does not build, by the config flag that turns them on
#: (transformers' default for both is True).
_REFUSED_FLAGS = ("has_relative_attention_bias", "has_spatial_attention_bias")

#: The table's width: the embedding size where it differs from the hidden size (ALBERT).
_WIDTH = (
    "embedding_size",
    "input_embedding_size",
    "d_model",
    "hidden_size",
    "n_embd",
    "dim",
    "emb_dim",
    "embed_dim",
)
_LENGTH = ("max_position_embeddings", "n_positions", "max_target_positions")


def _field(cfg: Mapping[str, Any], names: tuple[str, ...], model_type: str) -> int:
    for name in names:
        if cfg.get(name) is not None:
            return check_int(name, cfg[name])
    raise ValueError(f"{model_type} config has none of {', '.join(names)}")


def _offset(spec: AbsoluteSpec, cfg: Mapping[str, Any]) -> int:
    if spec.offset != "padding":
        return int(spec.offset)
    return check_int("pad_token_id", cfg.get("pad_token_id", 1), minimum=0) + 1


def build_position_module(
    model_type: str,
    config: Mapping[str, Any],
    *,
    layer_idx: int | None = None,
    tower: str | None = None,
    stack: str | None = None,
) -> PositionalEncoding | None:
    """The non-rotary positional encoding of a family, or None when it is not one of them.

    Args:
        model_type: the config's ``model_type``.
        config: the config as a dict (``config.json``'s fields).
        layer_idx: the layer (UMT5 has one T5 table per layer; the others share one).
        tower: for a multimodal family, which text tower
            (``posenc.hf.composite.TEXT_TOWERS``: ``"qformer_config"`` or
            ``"text_config"`` of BLIP-2, ``"text_decoder"`` of SpeechT5); None where the
            family has one text layout.
        stack: ``"encoder"`` or ``"decoder"`` of an encoder-decoder model; needed where
            they differ (``STACKS``: Whisper), and it picks a T5 family's bidirectional or
            causal buckets over the config's ``is_decoder``.

    Returns:
        An ``ALiBi`` (BLOOM, MPT, Falcon with ``alibi``), a ``T5RelativeBias`` (the T5
        family, the decoder's when ``is_decoder``), a ``LearnedPositionalEncoding`` of
        ``P - offset`` rows, or a ``SinusoidalLayout``; None for any other family (and
        for a tower whose family is rotary: use ``from_hf_config`` on its sub-config).
        MPNet gives a ``Compose`` of its table and its T5 buckets, RoFormer a
        ``RotaryEmbedding`` over interleaved pairs, DeBERTa / DeBERTa-v2 their table
        and ``DisentangledAttention`` (either alone, a ``Compose``, or ``NoPE``).
        A multimodal family gives its text tower's table, never an image or audio one.
        Load a checkpoint's tables with ``load_hf_weights``.

    Raises:
        ValueError: missing width/length fields, a ``position_embedding_type`` other
            than "absolute" (relative-key BERTs), XLM's ``sinusoidal_embeddings``, a
            multimodal family with several text towers and no ``tower``, a ``tower``
            that is not text, Whisper without ``stack``, ``stack`` for a model without
            two stacks, a LayoutLMv2 / v3 config with attention biases on; see
            ``posenc.hf.biases``, ``posenc.hf.composite`` and ``posenc.hf.roformer``.
    """
    found = text_tower(model_type, config, tower)
    if found is not None:
        model_type, config = found
    config = _with_stack(model_type, config, stack)
    if model_type == "roformer":
        return roformer_rotary(config)
    if model_type in DEBERTA_FAMILIES:  # table and disentangled attention (posenc.hf.deberta)
        return deberta_from_hf(model_type, config)
    bias = bias_module(model_type, config, layer_idx=layer_idx)
    if bias is not None:
        return bias
    spec = STACKS[model_type][stack] if model_type in STACKS else ABSOLUTE_FAMILIES.get(model_type)
    if model_type == "trocr" and not config.get("use_learned_position_embeddings", True):
        spec = _T2T
    if spec is None:
        return None
    kind = config.get("position_embedding_type") or "absolute"
    if model_type == "esm" and kind == "rotary":
        return None  # ESM-2: the rotary families' path (posenc.hf.families)
    if kind != "absolute":
        raise ValueError(
            f"{model_type} position_embedding_type={kind!r}: posenc builds only the "
            "'absolute' table of this family"
        )
    if config.get("sinusoidal_embeddings"):
        raise ValueError(f"{model_type} sinusoidal_embeddings=True is not supported")
    for flag in _REFUSED_FLAGS if model_type in ("layoutlmv2", "layoutlmv3") else ():
        if config.get(flag, True):
            raise ValueError(
                f"{model_type} {flag}=True: its attention adds a bias posenc does not build "
                "(1-D buckets and 2-D box distances); posenc builds the table of configs "
                "with both off"
            )
    width = _field(config, _WIDTH, model_type)
    if spec.kind == "sinusoidal":
        return SinusoidalLayout(
            width, layout=spec.layout, spacing=spec.spacing, offset=_offset(spec, config)
        )
    rows = _field(config, _LENGTH, model_type) + spec.extra_rows
    usable = rows - _offset(spec, config)
    if usable < 1:
        raise ValueError(f"{model_type} table of {rows} rows has none after the offset")
    table = LearnedPositionalEncoding(width, usable)
    return Compose([table, mpnet_bias_from_hf(config)]) if model_type == "mpnet" else table


def _with_stack(model_type: str, config: Mapping[str, Any], stack: str | None) -> Mapping[str, Any]:
    """``config`` with ``is_decoder`` set by ``stack``; checks ``stack`` for the family."""
    if stack is None:
        if model_type in STACKS:
            raise ValueError(
                f"{model_type} lays out its encoder and decoder positions differently: "
                "pass stack='encoder' or stack='decoder'"
            )
        return config
    if stack not in ("encoder", "decoder"):
        raise ValueError(f"stack must be 'encoder' or 'decoder', got {stack!r}")
    if model_type not in STACKS and not config.get("is_encoder_decoder"):
        raise ValueError(f"stack={stack!r}: model_type {model_type!r} has no encoder-decoder")
    return {**config, "is_decoder": stack == "decoder"}


def positions_skipping_padding(mask: Tensor, *, past: int = 0) -> Tensor:
    """Positions ``[B, T]`` that count real tokens only (RoBERTa, OPT, fairseq).

    Args:
        mask: ``[B, T]``, nonzero (or True) at real tokens, e.g. ``input_ids != pad``.
        past: real tokens already in the cache before these.

    Returns:
        int64 ``past + (number of real tokens before it)`` at real tokens, 0 at padding
        (whose outputs the attention mask discards).

    Raises:
        ValueError: ``mask`` not 2-D, a negative ``past``.
    """
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a [B, T] tensor, got {shape}")
    past = check_int("past", past, minimum=0)
    real = (mask != 0).to(torch.int64)
    return (real.cumsum(-1) - 1 + past) * real
