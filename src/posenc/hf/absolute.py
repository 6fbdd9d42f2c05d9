"""Absolute position tables of Hugging Face checkpoints, their offsets, and one-call
weight loading for every non-rotary family posenc builds from a config.

Shapes: ``B`` batch, ``T`` length, ``C`` d_model, ``P`` table rows.

Learned tables (Gehring et al. 2017; BERT; GPT-2) are read at ``row = position + offset``:
0 for GPT-2 and the BERT-likes, 2 for OPT, BioGPT and BART / mBART / PLBart / MVP / TrOCR
(fairseq's ``padding_idx + 1``; their tables have ``max_position_embeddings + 2`` rows),
``padding_idx + 1`` for RoBERTa / XLM-R and the families that copy their
``create_position_ids_from_input_ids`` (those count real tokens only: padding is
skipped). posenc keeps the rows from the offset on, so its position ``p`` is the
``p``-th real token and ``LearnedPositionalEncoding(C, P - offset)`` holds them;
``positions_skipping_padding`` gives the positions of padded batches the way RoBERTa, OPT
and fairseq count them. Sinusoidal families get a ``SinusoidalLayout`` (the ``[sin | cos]``
halves, tensor2tensor spacing, fairseq's offset of 2; TrOCR's when its config says
``use_learned_position_embeddings=False``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc._checks import check_int, check_tensor
from posenc.base import PositionalEncoding
from posenc.encodings.alibi import ALiBi
from posenc.encodings.learned import LearnedPositionalEncoding
from posenc.encodings.sinusoidal_layouts import SinusoidalLayout
from posenc.encodings.t5 import T5RelativeBias
from posenc.hf.biases import bias_module

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
    **dict.fromkeys(("xlm-roberta-xl", "xmod"), _ROBERTA),
    **dict.fromkeys(("marian", "pegasus"), _MARIAN),
    **dict.fromkeys(("m2m_100", "nllb-moe", "speech_to_text"), _T2T),
    "pegasus_x": AbsoluteSpec("sinusoidal", spacing="tensor2tensor"),
    "xglm": AbsoluteSpec("sinusoidal", offset=2, spacing="tensor2tensor"),
    **dict.fromkeys(
        ("musicgen", "musicgen_decoder", "musicgen_melody", "musicgen_melody_decoder"),
        AbsoluteSpec("sinusoidal", layout="cos|sin", spacing="tensor2tensor"),
    ),
}

#: The table's width: the embedding size where it differs from the hidden size (ALBERT).
_WIDTH = (
    "embedding_size",
    "input_embedding_size",
    "d_model",
    "hidden_size",
    "n_embd",
    "dim",
    "emb_dim",
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
    model_type: str, config: Mapping[str, Any], *, layer_idx: int | None = None
) -> PositionalEncoding | None:
    """The non-rotary positional encoding of a family, or None when it is not one of them.

    Args:
        model_type: the config's ``model_type``.
        config: the config as a dict (``config.json``'s fields).
        layer_idx: the layer (UMT5 has one T5 table per layer; the others share one).

    Returns:
        An ``ALiBi`` (BLOOM, MPT, Falcon with ``alibi``), a ``T5RelativeBias`` (the T5
        family, the decoder's when ``is_decoder``), a ``LearnedPositionalEncoding`` of
        ``P - offset`` rows, or a ``SinusoidalLayout``; None for any other family.
        Load a checkpoint's tables with ``load_hf_weights``.

    Raises:
        ValueError: missing width/length fields, a ``position_embedding_type`` other
            than "absolute" (relative-key BERTs), XLM's ``sinusoidal_embeddings``; see
            ``posenc.hf.biases``.
    """
    bias = bias_module(model_type, config, layer_idx=layer_idx)
    if bias is not None:
        return bias
    spec = ABSOLUTE_FAMILIES.get(model_type)
    if model_type == "trocr" and not config.get("use_learned_position_embeddings", True):
        spec = _T2T
    if spec is None:
        return None
    kind = config.get("position_embedding_type") or "absolute"
    if kind != "absolute":
        raise ValueError(
            f"{model_type} position_embedding_type={kind!r}: posenc builds only the "
            "'absolute' table of this family"
        )
    if config.get("sinusoidal_embeddings"):
        raise ValueError(f"{model_type} sinusoidal_embeddings=True is not supported")
    width = _field(config, _WIDTH, model_type)
    if spec.kind == "sinusoidal":
        return SinusoidalLayout(
            width, layout=spec.layout, spacing=spec.spacing, offset=_offset(spec, config)
        )
    rows = _field(config, _LENGTH, model_type) + spec.extra_rows
    usable = rows - _offset(spec, config)
    if usable < 1:
        raise ValueError(f"{model_type} table of {rows} rows has none after the offset")
    return LearnedPositionalEncoding(width, usable)


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


_TABLE = re.compile(r"(^|\.)(wpe|position_embeddings|embed_positions)\.weight$|^weight$")


def _state(source: nn.Module | Mapping[str, Tensor]) -> Mapping[str, Tensor]:
    if isinstance(source, nn.Module):
        return source.state_dict()
    if isinstance(source, Mapping):
        return source
    raise TypeError(f"expected a model or a state dict, got {type(source).__name__}")


def _pick(keys: list[str], what: str, prefix: str | None) -> str:
    if prefix is not None:
        keys = [k for k in keys if k.startswith(prefix)]
    if len(keys) != 1:
        found = ", ".join(keys) or "none"
        raise ValueError(f"expected one {what} (pass prefix= to choose), found: {found}")
    return keys[0]


def _t5_key(enc: T5RelativeBias, state: Mapping[str, Tensor], layer_idx: int | None) -> list[str]:
    keys = [k for k in state if k.endswith("relative_attention_bias.weight") and "global" not in k]
    stacks = {k.split(".", 1)[0] for k in keys}
    if {"encoder", "decoder"} <= stacks:
        keys = [k for k in keys if k.startswith("encoder." if enc.bidirectional else "decoder.")]
    blocks = sorted({int(m.group(1)) for k in keys if (m := re.search(r"block\.(\d+)\.", k))})
    if layer_idx is not None and layer_idx in blocks:
        return [k for k in keys if f"block.{layer_idx}." in k]
    if len(blocks) > 1:
        raise ValueError(f"one T5 table per layer (blocks {blocks}): pass layer_idx")
    return keys


def load_hf_weights(
    encoding: PositionalEncoding,
    source: nn.Module | Mapping[str, Tensor],
    *,
    layer_idx: int | None = None,
    prefix: str | None = None,
) -> PositionalEncoding:
    """Copy a checkpoint's position weights into ``encoding`` (in place) and return it.

    Args:
        encoding: from ``build_position_module`` (or built by hand to match).
        source: a transformers model, one of its modules, or a state dict.
        layer_idx: which layer's T5 table (UMT5; the other T5 families share the first
            block's, which any ``layer_idx`` reads).
        prefix: keep only keys starting with it (``"model.decoder."`` for BART's decoder
            table). T5 tables pick the encoder's or the decoder's stack from
            ``encoding.bidirectional``.

    Returns:
        ``encoding``. ALiBi and sinusoidal encodings have no weights: returned as is.

    Raises:
        ValueError: no table or several candidates, a table whose width or rows do not
            fit (a learned table keeps its last ``max_len`` rows: the offset comes first).
        TypeError: an encoding with no checkpoint counterpart, a bad ``source``.
    """
    if isinstance(encoding, (ALiBi, SinusoidalLayout)):
        return encoding
    state = _state(source)
    if isinstance(encoding, T5RelativeBias):
        key = _pick(_t5_key(encoding, state, layer_idx), "T5 relative_attention_bias", prefix)
        target = encoding.relative_attention_bias.weight
    elif isinstance(encoding, LearnedPositionalEncoding):
        key = _pick([k for k in state if _TABLE.search(k)], "position table", prefix)
        target = encoding.weight
    else:
        raise TypeError(f"{type(encoding).__name__} has no checkpoint weights to load")
    table = check_tensor(key, state[key], ndim=2)
    offset = table.shape[0] - target.shape[0]
    has_offset = isinstance(encoding, LearnedPositionalEncoding)
    if table.shape[1] != target.shape[1] or offset < 0 or (offset and not has_offset):
        raise ValueError(
            f"{key} is {tuple(table.shape)}; {type(encoding).__name__} needs "
            f"{tuple(target.shape)} (after an offset of leading rows)"
        )
    with torch.no_grad():
        target.copy_(table[offset:])
    return encoding
