"""Models beyond their training length without (or with little) training.

A *variant* evaluates a trained model with its encoding rebuilt under other options,
keeping every weight (``TinyLM.with_encoding``):

* a rotary encoding under a context-extension scaling, with the training length as the
  original context: linear position interpolation (Chen et al. 2023, "Extending Context
  Window of Large Language Models via Positional Interpolation", eq. 4), NTK-aware
  (bloc97 2023) and YaRN (Peng et al. 2023, "YaRN", eq. 20) at ``factor = L /
  train_len`` for evaluation length ``L`` (the usual protocol for static scalings);
  dynamic NTK (emozilla 2023) at its own fixed ``factor`` (``LabConfig.dynamic_factor``),
  because it already stretches its base from the length it sees (passing ``L /
  train_len`` too would stretch the base by ``f**2 - f + 1``, not ``f``);
* a learned table stretched by interpolation beyond its length.

At ``L <= train_len`` a variant is the trained model itself (``factor`` 1). A
``Variant``'s options at a fixed factor also build the fine-tuned rows (Chen et al.'s
protocol: fine-tune at ``finetune_len`` with ``factor = finetune_len / train_len``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from posenc.base import PositionalEncoding, build, info
from posenc.lab.config import LabConfig

__all__ = ["Variant", "build_encoding", "is_rotary", "scaling_spec", "variants"]


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
    """The encoding ``name`` for the lab's model shape (trained at ``train_len``; T5 with
    ``max_distance = config.t5_distance``)."""
    if _accepts(name, "max_distance"):
        options.setdefault("max_distance", config.t5_distance)
    return build(
        name,
        d_model=config.d_model,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        max_len=config.train_len,
        causal=True,
        **options,
    )


def scaling_spec(
    kind: str, factor: float, original: int, *, dynamic_factor: float = 2.0
) -> dict[str, object]:
    """The Hugging Face style ``rope_scaling`` dict of ``kind`` at stretch ``factor``.

    Dynamic NTK ignores ``factor`` and takes ``dynamic_factor``, its own hyperparameter
    (it computes the stretch from the sequence length itself).
    """
    if kind == "dynamic":
        factor = dynamic_factor
    spec: dict[str, object] = {"rope_type": kind, "factor": float(factor)}
    if kind in ("dynamic", "yarn"):
        spec["original_max_position_embeddings"] = original
    return spec


def _accepts(name: str, keyword: str) -> bool:
    return keyword in inspect.signature(info(name).cls.__init__).parameters


def is_rotary(name: str) -> bool:
    """Whether encoding ``name`` takes a rotary ``scaling``."""
    return _accepts(name, "scaling")


def variants(name: str, config: LabConfig) -> list[Variant]:
    """The evaluation-time variants of a model trained with encoding ``name``."""
    out = []
    if is_rotary(name):
        for kind in config.scalings:
            out.append(
                Variant(
                    f"{name} +{kind}",
                    "scaling",
                    lambda f, kind=kind: {
                        "scaling": scaling_spec(
                            kind, f, config.train_len, dynamic_factor=config.dynamic_factor
                        )
                    },
                )
            )
    if config.learned_beyond == "interpolate" and _accepts(name, "beyond"):
        out.append(
            Variant(f"{name} +interpolate", "interpolate", lambda f: {"beyond": "interpolate"})
        )
    return out
