"""RoFormer's positions: a sinusoidal table used as a rotary embedding (Su et al. 2021,
"RoFormer: Enhanced Transformer with Rotary Position Embedding", eq. 34).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D = hidden_size / num_attention_heads``.

``RoFormerSinusoidalPositionalEmbedding`` holds ``[sin a_0 .. sin a_{D/2-1} | cos ...]``
with ``a_i = p * 10000 ** (-2 i / D)``; its attention repeats each half's entries twice
(``[a_0, a_0, a_1, a_1, ...]``) and rotates the pairs ``(x_{2i}, x_{2i+1})``: RoPE's
paper form, over interleaved pairs, base 10000, the whole head. Values are rotated too
when the config says ``rotary_value``, which posenc does not build.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc._checks import check_int
from posenc.encodings.rotary.module import RotaryEmbedding

__all__ = ["roformer_rotary"]


def roformer_rotary(config: Mapping[str, Any]) -> RotaryEmbedding:
    """The ``RotaryEmbedding`` (interleaved, base 10000) of a RoFormer config dict.

    Raises:
        ValueError: ``rotary_value=True``, a hidden size the heads do not divide.
        TypeError: non-integer sizes.
    """
    if config.get("rotary_value"):
        raise ValueError(
            "roformer rotary_value=True rotates the values too; posenc rotates q and k only"
        )
    hidden = check_int("hidden_size", config.get("hidden_size"))
    heads = check_int("num_attention_heads", config.get("num_attention_heads"))
    if hidden % heads:
        raise ValueError(f"roformer hidden_size={hidden} is not a multiple of {heads} heads")
    length = check_int("max_position_embeddings", config.get("max_position_embeddings", 1536))
    return RotaryEmbedding(hidden // heads, base=10000.0, interleaved=True, max_len=length)
