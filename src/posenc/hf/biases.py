"""Attention biases of Hugging Face checkpoints: ALiBi (BLOOM, MPT, Falcon) and T5's
relative buckets (T5, mT5, UMT5, LongT5, Switch Transformers, Pop2Piano, Pix2Struct,
MPNet, UDOP).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``N`` buckets.

ALiBi (Press et al. 2022). The three families add ``m_h * j`` for key ``j`` (counted over
the non-padding tokens), a row-shifted form of posenc's ``-m_h (i - j)``: the two differ
by ``m_h * i`` on row ``i``, which the softmax ignores. The slopes are the family's own
float32 values: BLOOM and Falcon raise a float32 base to integer powers, MPT divides by
``2 ** (8 h / H')`` over the next power of two ``H'`` (transformers' ``MptModel`` always
uses ``alibi_bias_max = 8``), and Falcon rounds its slopes to bfloat16 before use. Falcon
and BLOOM then round the product ``m * j`` to the model dtype (bf16 in Falcon); posenc
computes the bias from ``i - j`` in float32 and rounds once, so near the diagonal it is
exact where theirs has lost the low bits.

T5 buckets (Raffel et al. 2020, sec. 2.1). Every attention module with
``relative_attention_bias`` computes ``table[bucket(k_pos - q_pos)]`` with
``bidirectional = not is_decoder`` (always False in Pix2Struct's text decoder). T5, mT5,
LongT5, Switch Transformers and Pop2Piano hold one table in the first block of each stack,
shared by its layers; UMT5 holds one per layer (``layer_idx`` picks it).

MPNet (Song et al. 2020) shares one bidirectional table in its encoder and buckets with
32 buckets and ``max_distance = 128`` whatever its config says (its ``compute_position_bias``
is called with the defaults), over the token indices ``0 .. T-1`` (padding included,
unlike its absolute table). UDOP (Tang et al. 2023): the decoder is T5's causal bias from
the config; the encoder adds the sum of the modules in ``relative_bias_args`` ("1d": T5's
buckets over token indices with that entry's own ``relative_attention_num_buckets`` and
``max_distance``; "horizontal" / "vertical": buckets of scaled bounding-box distances).
posenc builds the 1-D part and refuses configs whose encoder adds the 2-D ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from posenc._checks import check_int
from posenc.encodings.alibi import ALiBi
from posenc.encodings.t5 import T5RelativeBias

__all__ = [
    "ALIBI_FAMILIES",
    "T5_FAMILIES",
    "alibi_from_hf",
    "bias_module",
    "hf_alibi_slopes",
    "mpnet_bias_from_hf",
    "t5_bias_from_hf",
]

#: model_type -> how its slopes are made.
ALIBI_FAMILIES = {"bloom": "bloom", "falcon": "falcon", "mpt": "mpt"}

#: model_type -> True when every layer has its own table (UMT5).
T5_FAMILIES = {
    "t5": False,
    "mt5": False,
    "umt5": True,
    "longt5": False,
    "switch_transformers": False,
    "pop2piano": False,
    "pix2struct_text_model": False,
    "udop": False,
}

_UDOP_DEFAULT_BIASES = ({"type": "1d"}, {"type": "horizontal"}, {"type": "vertical"})


def _powers_of_base(heads: int, start: int, stop: int, step: int) -> Tensor:
    """``base ** arange(start, stop, step)`` in float32, ``base = 2 ** (-8 / heads)``.

    BLOOM's own operations and vector lengths: ``pow`` rounds differently when the same
    powers are taken from a longer vector, so the odd powers are not sliced from all."""
    base = torch.tensor(2 ** (-(2 ** -(math.log2(heads) - 3))), dtype=torch.float32)
    return torch.pow(base, torch.arange(start, stop, step, dtype=torch.int32))


def hf_alibi_slopes(model_type: str, num_heads: int) -> Tensor:
    """The float32 slopes ``[H]`` a family computes (Falcon's rounded to bfloat16).

    Raises:
        ValueError: a ``model_type`` without ALiBi, ``num_heads < 1``.
    """
    num_heads = check_int("num_heads", num_heads)
    kind = ALIBI_FAMILIES.get(model_type)
    if kind is None:
        raise ValueError(
            f"model_type {model_type!r} has no ALiBi builder; known: {sorted(ALIBI_FAMILIES)}"
        )
    if kind == "mpt":
        padded = 2 ** math.ceil(math.log2(num_heads))
        exponent = torch.arange(1, padded + 1, dtype=torch.int64).float() * (8 / padded)
        slopes = 1.0 / torch.pow(2, exponent)
        if padded != num_heads:
            slopes = torch.cat((slopes[1::2], slopes[::2]))[:num_heads]
        return slopes
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = _powers_of_base(closest, 1, 1 + closest, 1)
    if closest != num_heads:
        remaining = min(closest, num_heads - closest)
        slopes = torch.cat((slopes, _powers_of_base(2 * closest, 1, 1 + 2 * remaining, 2)))
    return slopes.bfloat16().float() if kind == "falcon" else slopes


def _get(cfg: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    raise ValueError(f"config has none of {', '.join(names)}")


def alibi_from_hf(model_type: str, cfg: Mapping[str, Any]) -> ALiBi:
    """The causal ``ALiBi`` of a BLOOM / MPT / Falcon config dict, with its own slopes.

    Raises:
        ValueError: no head count; an MPT ``alibi_bias_max`` other than 8 (transformers'
            ``MptModel`` ignores it while MosaicML's code uses it: build
            ``ALiBi(H, max_bias=...)`` for the one you run).
    """
    num_heads = _get(cfg, "n_head", "num_attention_heads", "n_heads")
    if model_type == "mpt":
        attn = cfg.get("attn_config") or {}
        bias_max = attn.get("alibi_bias_max", 8) if isinstance(attn, Mapping) else 8
        if bias_max != 8:
            raise ValueError(
                f"mpt alibi_bias_max={bias_max}: transformers' MptModel uses 8 and MosaicML's "
                "code uses the config's; build posenc.ALiBi(num_heads, max_bias=...) yourself"
            )
    return ALiBi(num_heads, causal=True, slopes=hf_alibi_slopes(model_type, num_heads))


def t5_bias_from_hf(
    model_type: str, cfg: Mapping[str, Any], *, layer_idx: int | None = None
) -> T5RelativeBias:
    """The ``T5RelativeBias`` of a T5-family config dict (weights: ``load_hf_weights``).

    ``is_decoder`` in the config (transformers sets it on the decoder stack's copy)
    selects the causal decoder's one-directional buckets.

    Raises:
        ValueError: a ``model_type`` without T5 buckets, a negative ``layer_idx``.
    """
    if model_type not in T5_FAMILIES:
        known = sorted(T5_FAMILIES)
        raise ValueError(f"model_type {model_type!r} has no T5 buckets; known: {known}")
    if layer_idx is not None:
        check_int("layer_idx", layer_idx, minimum=0)
    decoder = bool(cfg.get("is_decoder", False)) or model_type == "pix2struct_text_model"
    if model_type == "udop" and not decoder:
        return _udop_encoder_bias(cfg)
    return T5RelativeBias(
        _get(cfg, "num_heads", "num_attention_heads"),
        num_buckets=_get(cfg, "relative_attention_num_buckets"),
        max_distance=_get(cfg, "relative_attention_max_distance"),
        bidirectional=not decoder,
    )


def _udop_encoder_bias(cfg: Mapping[str, Any]) -> T5RelativeBias:
    """UDOP's encoder bias when ``relative_bias_args`` is one "1d" entry (T5's buckets)."""
    args = cfg.get("relative_bias_args") or _UDOP_DEFAULT_BIASES
    kinds = [a.get("type") if isinstance(a, Mapping) else a for a in args]
    if kinds != ["1d"]:
        raise ValueError(
            f"udop relative_bias_args types {kinds}: the encoder adds every one of them and "
            "posenc builds only the 1-D one (the horizontal / vertical biases of bounding "
            "boxes are not built); use relative_bias_args=[{'type': '1d'}] or stack='decoder'"
        )
    (entry,) = args
    for name, plain in (("prefix_bucket", False), ("augmentation", False), ("scaling_factor", 1)):
        if entry.get(name, plain) != plain:
            raise ValueError(f"udop relative_bias_args 1d {name}={entry[name]!r} is not built")
    return T5RelativeBias(
        _get(cfg, "num_heads", "num_attention_heads"),
        num_buckets=entry.get("relative_attention_num_buckets", 32),
        max_distance=entry.get("max_distance", 128),
        bidirectional=entry.get("bidirectional", True),
    )


def mpnet_bias_from_hf(cfg: Mapping[str, Any]) -> T5RelativeBias:
    """MPNet's encoder bias: bidirectional T5 buckets, 32 of them, ``max_distance = 128``.

    Raises:
        ValueError: a ``relative_attention_num_buckets`` other than 32 (MPNet buckets
            with 32 whatever the table holds), no head count.
    """
    buckets = cfg.get("relative_attention_num_buckets", 32)
    if buckets != 32:
        raise ValueError(
            f"mpnet relative_attention_num_buckets={buckets}: MPNet's compute_position_bias "
            "always uses 32 buckets; posenc builds configs with 32"
        )
    return T5RelativeBias(_get(cfg, "num_attention_heads", "num_heads"), num_buckets=32)


def bias_module(
    model_type: str, cfg: Mapping[str, Any], *, layer_idx: int | None = None
) -> ALiBi | T5RelativeBias | None:
    """The family's attention bias, or None when ``model_type`` has none of these.

    Falcon uses ALiBi only when its config says ``alibi``; otherwise it is rotary (None).
    """
    if model_type in ALIBI_FAMILIES:
        if model_type == "falcon" and not cfg.get("alibi", False):
            return None
        return alibi_from_hf(model_type, cfg)
    if model_type in T5_FAMILIES:
        return t5_bias_from_hf(model_type, cfg, layer_idx=layer_idx)
    return None
