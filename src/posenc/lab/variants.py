"""Models beyond their training length without (or with little) training.

A *variant* evaluates a trained model with its encoding rebuilt under other options,
keeping every weight (``TinyLM.with_encoding``):

* a rotary encoding under a context-extension scaling with ``factor = L / train_len`` at
  evaluation length ``L``: linear position interpolation (Chen et al. 2023, "Extending
  Context Window of Large Language Models via Positional Interpolation", eq. 4),
  NTK-aware (bloc97 2023), dynamic NTK (emozilla 2023; Hugging Face's definition, which
  at a full window of ``L`` stretches the base by ``f**2 - f + 1``, so more than static
  NTK) and YaRN (Peng et al. 2023, "YaRN", eq. 20) with the training length as the
  original context;
* a learned table stretched by interpolation beyond its length.

At ``L <= train_len`` a variant is the trained model itself (``factor`` 1).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from posenc.base import PositionalEncoding, build, info
from posenc.lab.config import LabConfig

__all__ = ["Variant", "build_encoding", "scaling_spec", "variants"]


@dataclass(frozen=True)
class Variant:
    """A row derived from a trained model.

    Attributes:
        label: the row's name in the table.
        kind: ``"scaling"`` or ``"interpolate"`` (the plot's line style).
        options: extra constructor keywords of the encoding for a factor ``L / train_len``.
    """

    label: str
    kind: str
    options: Callable[[float], dict[str, object]]


def build_encoding(name: str, config: LabConfig, **options: object) -> PositionalEncoding:
    """The encoding ``name`` for the lab's model shape (trained at ``train_len``)."""
    return build(
        name,
        d_model=config.d_model,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        max_len=config.train_len,
        causal=True,
        **options,
    )


def scaling_spec(kind: str, factor: float, original: int) -> dict[str, object]:
    """The Hugging Face style ``rope_scaling`` dict of ``kind`` for ``factor``."""
    spec: dict[str, object] = {"rope_type": kind, "factor": factor}
    if kind in ("dynamic", "yarn"):
        spec["original_max_position_embeddings"] = original
    return spec


def _accepts(name: str, keyword: str) -> bool:
    return keyword in inspect.signature(info(name).cls.__init__).parameters


def variants(name: str, config: LabConfig) -> list[Variant]:
    """The evaluation-time variants of a model trained with encoding ``name``."""
    out = []
    if _accepts(name, "scaling"):
        for kind in config.scalings:
            out.append(
                Variant(
                    f"{name} +{kind}",
                    "scaling",
                    lambda f, kind=kind: {"scaling": scaling_spec(kind, f, config.train_len)},
                )
            )
    if config.learned_beyond == "interpolate" and _accepts(name, "beyond"):
        out.append(
            Variant(f"{name} +interpolate", "interpolate", lambda f: {"beyond": "interpolate"})
        )
    return out
