"""DeBERTa and DeBERTa-v2/v3 checkpoints: their positions from a config, their weights in one call.

Shapes: ``C`` hidden size, ``H`` heads, ``D`` head dim, ``k`` span, ``L`` layers.

A DeBERTa config describes up to two position parts (He et al. 2021, sec. 3):

* ``position_biased_input`` (default True): a learned absolute table added to the token
  embeddings, ``embeddings.position_embeddings`` (a ``LearnedPositionalEncoding``);
* ``relative_attention``: disentangled attention (``DisentangledAttention``) with the
  encoder's shared ``rel_embeddings [2k, C]`` (``k = max_relative_positions``, or the
  ``max_position_embeddings`` when that is below 1, or ``position_buckets`` when positive
  in DeBERTa-v2), ``pos_att_type`` ("c2p|p2c"), DeBERTa-v2's ``norm_rel_ebd="layer_norm"``
  and ``share_att_key`` (the position projections are the layer's query/key projections).

Both: a ``Compose`` of the two; neither: ``NoPE``. Per-family differences transformers
encodes: DeBERTa's position-key projection ``pos_proj`` has no bias, its position-query
projection is ``pos_q_proj``, and it has no buckets, no LayerNorm on the table and no
shared keys; DeBERTa-v2 calls them ``pos_key_proj`` / ``pos_query_proj`` (both biased).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from posenc._checks import check_int, check_tensor
from posenc.base import Compose, PositionalEncoding
from posenc.encodings.disentangled import DisentangledAttention, RelativeEmbeddingTable
from posenc.encodings.learned import LearnedPositionalEncoding
from posenc.encodings.nope import NoPE

__all__ = ["DEBERTA_FAMILIES", "deberta_from_hf", "load_deberta_weights"]

#: model_type -> True for DeBERTa-v2's options (buckets, LayerNorm, shared keys).
DEBERTA_FAMILIES = {"deberta": False, "deberta-v2": True}

#: Position projections by checkpoint name, first match wins: DeBERTa-v2, DeBERTa, shared.
_KEY_NAMES = ("pos_key_proj", "pos_proj", "key_proj")
_QUERY_NAMES = ("pos_query_proj", "pos_q_proj", "query_proj")


def _int(cfg: Mapping[str, Any], name: str) -> int:
    if cfg.get(name) is None:
        raise ValueError(f"DeBERTa config has no {name}")
    return check_int(name, cfg[name])


def _size_or_off(cfg: Mapping[str, Any], name: str) -> int | None:
    """A size that transformers switches off with any value below 1 (-1 by default): None."""
    if cfg.get(name) is None:
        return None
    value = check_int(name, cfg[name], minimum=-(2**31))
    return value if value >= 1 else None


def deberta_from_hf(model_type: str, cfg: Mapping[str, Any]) -> PositionalEncoding:
    """The positional encoding of a DeBERTa / DeBERTa-v2 config dict (see the module doc).

    Raises:
        ValueError: another ``model_type``; ``talking_head``; an unknown ``pos_att_type``
            (``"p2p"`` included); ``pos_att_type`` without ``relative_attention`` (the
            content scores are then divided by ``sqrt(D * s)`` with no position term);
            ``position_buckets`` / ``max_relative_positions`` without a log range.
    """
    if model_type not in DEBERTA_FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not one of {sorted(DEBERTA_FAMILIES)}")
    v2 = DEBERTA_FAMILIES[model_type]
    if cfg.get("talking_head"):
        raise ValueError(f"{model_type} talking_head=True mixes heads; posenc does not build it")
    kinds = cfg.get("pos_att_type") or ()
    relative = bool(cfg.get("relative_attention", False))
    if kinds and not relative:
        raise ValueError(
            f"{model_type} pos_att_type={kinds!r} with relative_attention=False scales the "
            "content scores by 1/sqrt(D * s) without position terms; posenc does not build it"
        )
    parts: list[PositionalEncoding] = []
    if cfg.get("position_biased_input", True):
        width = _int(cfg, "embedding_size" if cfg.get("embedding_size") else "hidden_size")
        parts.append(LearnedPositionalEncoding(width, _int(cfg, "max_position_embeddings")))
    if relative:
        hidden, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
        longest = _size_or_off(cfg, "max_relative_positions")
        longest = longest or _int(cfg, "max_position_embeddings")
        buckets = _size_or_off(cfg, "position_buckets") if v2 else None
        norm = str(cfg.get("norm_rel_ebd") or "none").lower().split("|")
        layer_norm = v2 and "layer_norm" in [n.strip() for n in norm]
        head_dim = cfg.get("attention_head_size") if v2 else None
        span = buckets or longest
        eps = float(cfg.get("layer_norm_eps", 1e-7))
        parts.append(
            DisentangledAttention(
                hidden,
                heads,
                head_dim=head_dim or hidden // heads,
                max_relative_positions=longest,
                position_buckets=buckets,
                pos_att_type=kinds,
                table=RelativeEmbeddingTable(hidden, span, layer_norm=layer_norm, eps=eps),
                key_bias=v2,
            )
        )
    if not parts:
        return NoPE()
    return parts[0] if len(parts) == 1 else Compose(parts)


def _key(state: Mapping[str, Tensor], suffix: str, prefix: str | None) -> str | None:
    found = [k for k in state if k.endswith(suffix) and (prefix is None or k.startswith(prefix))]
    if len(found) > 1:
        raise ValueError(f"several {suffix} tensors (pass prefix= to choose): {found}")
    return found[0] if found else None


def _copy(target: Tensor, state: Mapping[str, Tensor], key: str) -> None:
    source = check_tensor(key, state[key])
    if source.shape != target.shape:
        raise ValueError(f"{key} is {tuple(source.shape)}; posenc needs {tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(source)


def _layer(state: Mapping[str, Tensor], layer_idx: int | None) -> str:
    layers = sorted(
        {int(k.split("encoder.layer.")[1].split(".")[0]) for k in state if "encoder.layer." in k}
    )
    if layer_idx is None:
        if len(layers) != 1:
            raise ValueError(
                f"one set of position projections per layer ({layers}): pass layer_idx"
            )
        layer_idx = layers[0]
    if check_int("layer_idx", layer_idx, minimum=0) not in layers:
        raise ValueError(f"layer_idx={layer_idx} is not among the checkpoint's layers {layers}")
    return f"encoder.layer.{layer_idx}.attention.self."


def load_deberta_weights(
    encoding: DisentangledAttention,
    state: Mapping[str, Tensor],
    *,
    layer_idx: int | None = None,
    prefix: str | None = None,
) -> DisentangledAttention:
    """Copy ``rel_embeddings`` (+ its LayerNorm) and one layer's position projections.

    The projections are the layer's ``pos_key_proj`` / ``pos_query_proj`` (DeBERTa-v2),
    ``pos_proj`` / ``pos_q_proj`` (DeBERTa), or with ``share_att_key`` its own
    ``key_proj`` / ``query_proj``, whichever the checkpoint holds, in that order.

    Raises:
        ValueError: a missing or misshapen tensor, several layers without ``layer_idx``.
    """
    table = encoding.table
    weights = {"encoder.rel_embeddings.weight": table.weight}
    if table.norm is not None:
        weights |= {"encoder.LayerNorm.weight": table.norm.weight}
        weights |= {"encoder.LayerNorm.bias": table.norm.bias}
    layer = _layer(state, layer_idx)
    for proj, names in (
        (encoding.pos_key_proj, _KEY_NAMES),
        (encoding.pos_query_proj, _QUERY_NAMES),
    ):
        if proj is None:
            continue
        name = next((n for n in names if _key(state, f"{layer}{n}.weight", prefix)), None)
        if name is None:
            raise ValueError(f"no position projection {' / '.join(names)} under {layer}")
        weights |= {f"{layer}{name}.{p}": t for p, t in proj.named_parameters()}
    for suffix, target in weights.items():
        key = _key(state, suffix, prefix)
        if key is None:
            raise ValueError(f"checkpoint has no {suffix}")
        _copy(target, state, key)
    return encoding
