"""The paper's reading of a ``config.json``: its RoPE scaling from the float64 formulas.

Shapes: ``P`` positions, ``R`` rotary dim, ``L`` layers.

Beside the runtimes, the audit reads a config once more with ``posenc.reference`` (plain
NumPy written from each scaling's paper, independent of posenc's torch code and of every
runtime): RoFormer's frequencies (Su et al. 2021, eq. 34), position interpolation (Chen et
al. 2023), NTK-aware and dynamic NTK (bloc97 2023, emozilla 2023; NTK-alpha is NTK with
``alpha``), YaRN with its attention factor (Peng et al. 2023, eq. 22; DeepSeek-V2's mscale
ratio), Llama 3.1's wavelength bands, LongRoPE's short/long factors and attention factor
(Ding et al. 2024). Where two runtimes disagree, the one that differs from this column is the
one that departs from the paper. A config posenc does not read as plain RoPE (M-RoPE and
other schemes) gets a note instead of layers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from posenc.audit.mla import mla_width
from posenc.audit.reading import Reading
from posenc.reference import rope as ref

__all__ = ["read_paper"]

RUNTIME = "paper (float64)"


def _frequencies(scaling: Any, dim: int, base: float, context: int) -> tuple[np.ndarray, float]:
    """``([R/2] theta, cos/sin factor)`` of a posenc scaling dataclass, from the reference."""
    kind = type(scaling).rope_type
    if kind == "default":
        return ref.rope_frequencies(dim, base), 1.0
    if kind == "linear":
        return ref.linear_frequencies(dim, base, scaling.factor), 1.0
    if kind == "ntk":
        return ref.ntk_frequencies(dim, base, scaling.factor), 1.0
    if kind == "ntk_alpha":
        return ref.ntk_frequencies(dim, base, scaling.alpha), 1.0
    original = getattr(scaling, "original_max_position_embeddings", None)
    if kind == "dynamic":
        return ref.dynamic_ntk_frequencies(dim, base, scaling.factor, original, context), 1.0
    if kind == "yarn":
        theta = ref.yarn_frequencies(
            dim,
            base,
            scaling.factor,
            original,
            beta_fast=scaling.beta_fast,
            beta_slow=scaling.beta_slow,
            truncate=scaling.truncate,
        )
        factor = scaling.attention_factor or ref.yarn_attention_factor(
            scaling.factor, mscale=scaling.mscale, mscale_all_dim=scaling.mscale_all_dim
        )
        return theta, factor
    if kind == "llama3":
        theta = ref.llama3_frequencies(
            dim,
            base,
            scaling.factor,
            scaling.low_freq_factor,
            scaling.high_freq_factor,
            original,
        )
        return theta, 1.0
    if kind == "longrope":
        theta = ref.longrope_frequencies(
            dim, base, list(scaling.short_factor), list(scaling.long_factor), original, context
        )
        factor = scaling.attention_factor or ref.longrope_attention_factor(scaling.factor, original)
        return theta, factor
    raise ValueError(f"no float64 reference for rope type {kind!r}")


def read_paper(
    config: Mapping[str, Any], positions: Sequence[int] | np.ndarray, *, context: int
) -> Reading:
    """The paper's reading of ``config`` at ``positions`` (``[P]``) for ``context`` tokens.

    posenc's plan reading (``posenc.audit.hfread.read_posenc``: which layers rotate, pair
    layout, windows) with each rotating layer's angles and cos/sin factor from the formula of
    that layer's rope parameters (per layer type where the config has types).
    """
    from posenc.audit.hfread import read_posenc
    from posenc.hf.config import layer_types_of, parse_hf_rope_config

    pos = np.asarray(positions)
    try:
        plan = read_posenc(config, pos, context=context)
        types = layer_types_of(dict(config)) or [None] * len(plan.layers)
        layers = []
        for layer, kind in zip(plan.layers, types, strict=False):
            if not layer.rotates:
                layers.append(layer)
                continue
            rope = parse_hf_rope_config(dict(config), layer_type=kind)
            if rope.rotary_dim != layer.rotary_dim:
                raise ValueError(
                    f"rotary_dim {rope.rotary_dim} where the plan has {layer.rotary_dim}"
                )
            theta, factor = _frequencies(rope.scaling, rope.rotary_dim, rope.base, context)
            layers.append(
                replace(
                    layer,
                    angles=pos.astype(np.float64)[:, None] * theta[None, :],
                    scale=np.full(len(pos), factor),
                    softmax_scale=_mla_softmax_scale(config, rope.scaling) or layer.softmax_scale,
                )
            )
    except ValueError as err:
        return Reading(RUNTIME, pos, context, note=f"not read as plain RoPE: {err}")
    return Reading(RUNTIME, pos, context, tuple(layers))


def _mla_softmax_scale(config: Mapping[str, Any], scaling: Any) -> float | None:
    """DeepSeek-V2's (MLA, sec. 2.1.3) softmax scale: ``(D_nope + D_rope) ** -0.5``, under
    YaRN with ``mscale_all_dim`` times ``(1 + 0.1 mscale_all_dim ln s) ** 2`` (``s > 1``);
    None for a config that is not MLA."""
    width = mla_width(config)
    if width is None:
        return None
    factor = getattr(scaling, "factor", 1.0)
    mscale_all = getattr(scaling, "mscale_all_dim", None)
    mscale = 1.0 + 0.1 * mscale_all * math.log(factor) if mscale_all and factor > 1.0 else 1.0
    return width**-0.5 * mscale**2
