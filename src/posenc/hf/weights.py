"""One-call loading of a checkpoint's position weights into the module
``posenc.hf.absolute.build_position_module`` built: learned tables (after their offset
rows), T5 bucket tables (the stack's, the layer's), and each part of a ``Compose``.

Shapes: ``P`` table rows, ``C`` d_model, ``N`` buckets, ``H`` heads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from posenc._checks import check_tensor
from posenc.base import Compose, PositionalEncoding
from posenc.encodings.alibi import ALiBi
from posenc.encodings.disentangled import DisentangledAttention
from posenc.encodings.learned import LearnedPositionalEncoding
from posenc.encodings.nope import NoPE
from posenc.encodings.sinusoidal_layouts import SinusoidalLayout
from posenc.encodings.t5 import T5RelativeBias
from posenc.hf.deberta import load_deberta_weights

__all__ = ["load_hf_weights"]

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
    if any(".relative_bias.biases." in k for k in keys):  # UDOP: the encoder's 1-D bias module
        used = "encoder.relative_bias.biases.0." if enc.bidirectional else "decoder.block."
        keys = [k for k in keys if used in k]
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
            block's, which any ``layer_idx`` reads), or DeBERTa's position projections.
        prefix: keep only keys starting with it (``"model.decoder."`` for BART's decoder
            table). T5 tables pick the encoder's or the decoder's stack from
            ``encoding.bidirectional``.

    Returns:
        ``encoding``. ALiBi, sinusoidal and NoPE encodings have no weights: returned as
        is; a ``Compose`` (MPNet, DeBERTa) loads each part.

    Raises:
        ValueError: no table or several candidates, a table whose width or rows do not
            fit (a learned table keeps its last ``max_len`` rows: the offset comes first).
        TypeError: an encoding with no checkpoint counterpart, a bad ``source``.
    """
    if isinstance(encoding, (ALiBi, SinusoidalLayout, NoPE)):
        return encoding
    if isinstance(encoding, Compose):  # MPNet: its table and its buckets
        for part in encoding.encodings:
            load_hf_weights(part, source, layer_idx=layer_idx, prefix=prefix)
        return encoding
    state = _state(source)
    if isinstance(encoding, DisentangledAttention):  # DeBERTa: posenc.hf.deberta
        return load_deberta_weights(encoding, state, layer_idx=layer_idx, prefix=prefix)
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
