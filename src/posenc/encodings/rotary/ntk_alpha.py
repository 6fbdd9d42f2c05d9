"""NTK-alpha: NTK-aware scaling with a fixed stretch ``alpha`` of the base, as Tencent's
HunYuan models use it (Sun et al. 2024, "Hunyuan-Large", arXiv 2411.02265, long-context
training; the NTK-aware base of bloc97 2023, Peng et al. 2023, "YaRN", sec. 3.1).

Shapes: ``R`` rotary dim, ``inv_freq`` is ``[R/2]``. The base becomes

    base' = base * alpha ** (R / (R - 2)),    theta_i = base' ** (-2i / R),

which divides the lowest frequency by ``alpha`` exactly and keeps the highest (``theta_0 =
1``); unlike dynamic NTK it does not depend on the sequence length, and there is no
attention factor. The checkpoints' ``config.json`` writes it as ``"type": "dynamic"``
with an ``alpha`` (beside ``factor``, ``beta_fast``, ``beta_slow``, ``mscale`` and
``mscale_all_dim``, which it never reads); transformers' HunYuan families (dense, MoE,
VL) give it the rope type ``ntk_alpha`` (``compute_ntk_alpha_rope_parameters``), and so
does posenc (``posenc.hf`` reads the checkpoints' form for the families whose rotary
does, ``Family.ntk_alpha``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from posenc._checks import check_float
from posenc.encodings.rotary.context_scaling import ntk_base
from posenc.encodings.rotary.scaling import RopeScaling, base_inv_freq, register_scaling

__all__ = ["NTK_ALPHA_UNREAD", "NTKAlphaScaling", "ntk_alpha_inv_freq", "ntk_alpha_parameters"]

#: keys of the checkpoints' ``dynamic`` + ``alpha`` dict that the NTK-alpha frequencies
#: never read (transformers ignores them there too)
NTK_ALPHA_UNREAD = (
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
)


@dataclass(frozen=True)
class NTKAlphaScaling(RopeScaling):
    """NTK-alpha (HunYuan): ``base * alpha ** (R / (R - 2))`` with a fixed ``alpha >= 1``."""

    rope_type: ClassVar[str] = "ntk_alpha"
    alpha: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", check_float("ntk_alpha alpha", self.alpha, minimum=1.0))


@register_scaling(NTKAlphaScaling)
def ntk_alpha_inv_freq(
    dim: int, base: float, params: NTKAlphaScaling, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """NTK-alpha frequencies (any ``seq_len``); attention scale 1."""
    return base_inv_freq(dim, ntk_base(dim, base, params.alpha, "ntk_alpha")), 1.0


def ntk_alpha_parameters(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``ntk_alpha`` form of a checkpoint's ``dynamic`` dict that carries an ``alpha``
    (the keys in ``NTK_ALPHA_UNREAD`` dropped, any other kept for the scaling's own check),
    or None when ``params`` is not one (another rope type, or no or a zero ``alpha``), as
    HunYuan's rotary modules in transformers decide."""
    kind = params.get("rope_type", params.get("type"))
    if kind != "dynamic" or not params.get("alpha"):
        return None
    kept = {k: v for k, v in params.items() if k not in ("rope_type", "type", *NTK_ALPHA_UNREAD)}
    return {**kept, "rope_type": "ntk_alpha"}
