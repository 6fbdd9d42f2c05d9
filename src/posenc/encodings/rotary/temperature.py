"""Attention temperature by position: queries scaled up logarithmically with their position
(Meta 2025, Llama 4 "attention temperature tuning"; Mistral AI 2025, Ministral 3 /
Mistral 4 ``llama_4_scaling_beta``), as a QK-site encoding.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim. A query at position ``m``
is multiplied by

    s(m) = 1 + beta * ln(1 + floor((m + offset) / length))

which is 1 for ``m + offset < length`` and grows by ``beta ln 2`` at ``length``, sharpening
the softmax over long contexts; keys are unchanged. Transformers' forms:

* Ministral 3 / Mistral 4 (every layer, with RoPE): ``beta = llama_4_scaling_beta``,
  ``length = original_max_position_embeddings`` of ``rope_parameters``, ``offset = 0``;
* Llama 4 (its NoPE layers, when ``attn_temperature_tuning``): ``beta = attn_scale``,
  ``length = floor_scale``, ``offset = 1``.

Which position: posenc scales a query by the position it is given (``q_pos``), as it
rotates it. transformers' Llama 4 takes the token index instead (the cache length plus
``0..T-1``), whatever ``position_ids`` the model gets. The two agree when the positions are
the token indices (transformers' default); otherwise they differ wherever the position and
the index lie in different steps of ``length`` (``position_ids`` ahead by 6 with Llama 4's
``floor_scale`` 8192 and ``attn_scale`` 0.1: by ``0.1 ln 2 = 0.069`` from token 8186). To
reproduce transformers under other positions, pass the token indices as ``q_pos``.
``posenc.hf.patch`` replaces only a model's rotation and leaves this scale to the model's
own attention code, so a patched Llama 4 equals the model under any ``position_ids``.

A scalar per query commutes with any rotation, so ``Compose([rope, temperature])`` gives
the same queries in either order. The scale is computed in float64 and the product
rounded once to the query's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import (
    check_float,
    check_int,
    check_tensor,
    float_positions,
    resolve_positions,
)
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register

__all__ = ["PositionTemperature", "position_temperature"]


def position_temperature(positions: Tensor, *, beta: float, length: int, offset: int = 0) -> Tensor:
    """``1 + beta * ln(1 + floor((positions + offset) / length))``, float64, ``positions``' shape.

    Raises:
        ValueError: ``length < 1``, non-finite ``beta``, negative ``offset``; a position
            below ``-offset`` (the logarithm of a negative count of steps).
            An integer position beyond +-2**53 (not exact in float64).
    """
    beta = check_float("beta", beta)
    length = check_int("length", length)
    offset = check_int("offset", offset, minimum=0)
    shifted = float_positions(positions, torch.float64) + offset
    if shifted.numel() and not torch.compiler.is_compiling() and float(shifted.min()) < 0:
        raise ValueError(
            f"position temperature needs positions >= {-offset}, got {float(positions.min()):g}"
        )
    return 1.0 + beta * torch.log1p(torch.floor(shifted / length))


@register(
    "temperature",
    paper="Meta 2025, Llama 4 (attention temperature tuning)",
    description="queries scaled by 1 + beta ln(1 + floor(pos / length)); composes with RoPE",
)
class PositionTemperature(PositionalEncoding):
    """Scale queries by ``s(position)`` (see the module docstring); keys pass through.

    Args:
        beta: the growth ``beta`` (``llama_4_scaling_beta``, Llama 4's ``attn_scale``;
            default 0.1, as both).
        length: the step length (``original_max_position_embeddings``, ``floor_scale``;
            default Llama 4's 8192).
        offset: added to the position before flooring (Llama 4: 1).

    Raises:
        ValueError: ``length < 1``, non-finite ``beta``, negative ``offset``; in ``rotate``,
            a position below ``-offset``.
    """

    sites = Site.QK

    def __init__(self, beta: float = 0.1, length: int = 8192, *, offset: int = 0) -> None:
        super().__init__()
        self.beta = check_float("beta", beta)
        self.length = check_int("length", length)
        self.offset = check_int("offset", offset, minimum=0)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(q * s(q_pos), k)`` for ``q [B, H, Tq, D]`` at ``q_pos [Tq] | [B, Tq]``.

        Raises:
            ValueError: ``q`` not 4-D or positions not of length ``Tq``.
        """
        check_tensor("q", q, ndim=4)
        check_tensor("k", k, ndim=4)
        q_pos = resolve_positions(q_pos, q.shape[-2], batch=q.shape[0], name="q_pos")
        scale = position_temperature(
            q_pos.to(q.device), beta=self.beta, length=self.length, offset=self.offset
        )  # [Tq] | [B, Tq]
        scale = scale[..., None] if scale.dim() == 1 else scale[:, None, :, None]
        compute = compute_dtype(q.dtype)
        return (q.to(compute) * scale.to(compute)).to(q.dtype), k

    def extra_repr(self) -> str:
        return f"beta={self.beta}, length={self.length}, offset={self.offset}"
