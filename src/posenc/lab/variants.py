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
* dynamic NTK as deployed, ``+dynamic +decoded``: scored as incremental decoding through
  a KV cache (``posenc.lab.decoded``), beside ``+dynamic`` over whole windows;
* YaRN with its ramp bounds scaled to the training length, and with transformers'
  defaults as the row ``+yarn +hf`` (see ``yarn_betas``);
* NTK-aware with its alpha following the training length, and with transformers'
  convention (alpha = factor) as the row ``+ntk +hf`` (see ``ntk_alpha``);
* a learned table stretched by interpolation beyond its length.

At ``L <= train_len`` a variant is the trained model itself (``factor`` 1). A
``Variant``'s options at a fixed factor also build the fine-tuned rows (Chen et al.'s
protocol: fine-tune at ``finetune_len`` with ``factor = finetune_len / train_len``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

from posenc.base import PositionalEncoding, build, info
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.lab.config import LabConfig
from posenc.lab.decoded import DecodedDynamicNTK

__all__ = [
    "YARN_BETAS",
    "YARN_REFERENCE_LEN",
    "Variant",
    "build_encoding",
    "critical_dim",
    "is_rotary",
    "ntk_alpha",
    "scaling_spec",
    "variants",
    "yarn_betas",
]

#: YaRN's ``(beta_fast, beta_slow)`` for Llama 2 (Peng et al. 2023, section 3.2:
#: ``alpha = 1, beta = 32``), transformers' defaults.
YARN_BETAS = (32.0, 1.0)
#: The original length those values were chosen for (Llama 2: 4096).
YARN_REFERENCE_LEN = 4096


@dataclass(frozen=True)
class Variant:
    """A row derived from a trained model.

    Attributes:
        label: the row's name in the table.
        kind: ``"scaling"`` or ``"interpolate"`` (the plot's line style).
        options: extra constructor keywords of the encoding for a factor ``L / train_len``.
        make: builds the encoding for a factor itself (``None``: ``build_encoding`` with
            ``options``).
        tunable: whether the fine-tuned rows may use it (``False`` for the rows that
            re-evaluate another scaling: decoded, transformers' defaults).
    """

    label: str
    kind: str
    options: Callable[[float], dict[str, object]]
    make: Callable[[float], PositionalEncoding] | None = None
    tunable: bool = True

    def encoding(self, name: str, config: LabConfig, factor: float) -> PositionalEncoding:
        """The encoding of this row for a model trained with ``name``, at ``factor``."""
        if self.make is not None:
            return self.make(factor)
        return build_encoding(name, config, **self.options(factor))


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


def yarn_betas(original: int) -> tuple[float, float]:
    """YaRN's ``(beta_fast, beta_slow)`` for a model trained at ``original`` positions.

    YaRN keeps the rotary pairs that turn more than ``beta_fast`` times over the original
    length and interpolates those that turn fewer than ``beta_slow`` times (Peng et al.
    2023, eq. 17-18), i.e. its bounds are the wavelengths ``original / beta``. Scaling
    both betas by ``original / YARN_REFERENCE_LEN`` keeps those wavelengths (128 and 4096
    positions), so with the same RoPE base the pairs fall into the same three groups as
    for Llama 2 (about a third kept, a quarter interpolated at ``D = 24``). Unscaled, at
    ``original = 64`` no pair turns 32 times (at most ``64 / 2 pi``) and most pairs are
    interpolated fully.
    """
    ratio = original / YARN_REFERENCE_LEN
    return YARN_BETAS[0] * ratio, YARN_BETAS[1] * ratio


def critical_dim(rotary_dim: int, base: float, original: int) -> int:
    """The critical dimension of Liu et al. 2024 ("Scaling Laws of RoPE-based
    Extrapolation", ICLR 2024, eq. 8): ``2 ceil((R / 2) log_base(original / 2 pi))``, the
    rotary dims whose pairs turn at least once over ``original`` positions (pair ``i``
    has wavelength ``2 pi base ** (2i / R)``), kept within ``[2, R - 2]`` (at least one
    pair; at most the last, transformers' NTK-aware convention)."""
    turns = (rotary_dim / 2) * math.log(original / (2 * math.pi)) / math.log(base)
    return min(max(2, 2 * math.ceil(turns)), rotary_dim - 2)


def ntk_alpha(factor: float, original: int, *, rotary_dim: int, base: float) -> float:
    """NTK-aware's alpha for stretch ``factor`` of a model trained at ``original`` positions.

    NTK-aware (bloc97 2023; Peng et al. 2023, section 3.1) sets the base to ``base *
    alpha ** (R / (R - 2))``; transformers takes ``alpha = factor``, which divides the
    frequency of the *last* pair by ``factor``, whatever the training length. Following
    the length instead, the pair divided by ``factor`` is the first one beyond the
    critical dimension ``R_c`` (``critical_dim``), the first whose wavelength the training
    length never covered, as Liu et al. 2024 (section 3.3) extend the context by raising
    the base until that pair's wavelength covers the longer length: ``base' = base *
    factor ** (R / R_c)``, i.e. ``alpha = factor ** ((R - 2) / R_c)``. At ``R = 24``,
    base 10^4 and ``original = 64``, ``R_c = 8``: alpha ``factor ** 2.75``; Peng et al.
    (section 3.1) note that NTK-aware needs an alpha above the stretch in practice.
    """
    return factor ** ((rotary_dim - 2) / critical_dim(rotary_dim, base, original))


def scaling_spec(
    kind: str,
    factor: float,
    original: int,
    *,
    dynamic_factor: float = 2.0,
    hf_defaults: bool = False,
    rotary: tuple[int, float] | None = None,
) -> dict[str, object]:
    """The Hugging Face style ``rope_scaling`` dict of ``kind`` at stretch ``factor``.

    Dynamic NTK ignores ``factor`` and takes ``dynamic_factor``, its own hyperparameter
    (it computes the stretch from the sequence length itself). YaRN's betas follow
    ``original`` (``yarn_betas``) unless ``hf_defaults`` (transformers' 32 and 1);
    NTK-aware's alpha follows ``original`` (``ntk_alpha``) when ``rotary`` (the model's
    ``(rotary_dim, base)``) is given, unless ``hf_defaults`` (alpha = ``factor``).
    """
    if kind == "dynamic":
        factor = dynamic_factor
    if kind == "ntk" and rotary is not None and not hf_defaults:
        factor = ntk_alpha(factor, original, rotary_dim=rotary[0], base=rotary[1])
    spec: dict[str, object] = {"rope_type": kind, "factor": float(factor)}
    if kind in ("dynamic", "yarn"):
        spec["original_max_position_embeddings"] = original
    if kind == "yarn" and not hf_defaults:
        spec["beta_fast"], spec["beta_slow"] = yarn_betas(original)
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
            out.append(_scaled(name, kind, config))
            if kind in ("ntk", "yarn"):
                out.append(_scaled(name, kind, config, hf_defaults=True))
            if kind == "dynamic" and info(name).cls is RotaryEmbedding:
                out.append(_decoded(name, config))
    if config.learned_beyond == "interpolate" and _accepts(name, "beyond"):
        out.append(
            Variant(f"{name} +interpolate", "interpolate", lambda f: {"beyond": "interpolate"})
        )
    return out


def _decoded(name: str, config: LabConfig) -> Variant:
    """Dynamic NTK scored as decoded through a KV cache (``posenc.lab.decoded``)."""
    base = build_encoding(name, config).base

    def make(factor: float) -> PositionalEncoding:
        return DecodedDynamicNTK(
            config.head_dim, factor=config.dynamic_factor, original=config.train_len, base=base
        )

    whole = _scaled(name, "dynamic", config)
    return Variant(f"{whole.label} +decoded", "scaling", whole.options, make=make, tunable=False)


def _scaled(name: str, kind: str, config: LabConfig, *, hf_defaults: bool = False) -> Variant:
    rope = build_encoding(name, config)  # its rotary dim and base, where it has them
    found = (getattr(rope, "rotary_dim", None), getattr(rope, "base", None))
    rotary = None if None in found else found

    def options(factor: float) -> dict[str, object]:
        spec = scaling_spec(kind, factor, config.train_len, dynamic_factor=config.dynamic_factor,
                            hf_defaults=hf_defaults, rotary=rotary)  # fmt: skip
        return {"scaling": spec}

    label = f"{name} +{kind}" + (" +hf" if hf_defaults else "")
    return Variant(label, "scaling", options, tunable=not hf_defaults)
