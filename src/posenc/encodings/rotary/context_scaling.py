"""RoPE scalings beyond plain interpolation: NTK-aware, dynamic NTK, YaRN, Llama 3, LongRoPE.

Shapes: ``R`` rotary dim, ``inv_freq`` is ``[R/2]``; ``theta_i = base ** (-2i / R)``; ``s``
the scale factor; ``L0`` the original (pre-training) context length. The wavelength of
pair ``i`` is ``lambda_i = 2 pi / theta_i`` and it turns ``L0 / lambda_i`` times over ``L0``.

* NTK-aware (bloc97 2023; Peng et al. 2023, sec. 3.1): the base becomes
  ``base * s ** (R / (R - 2))``, which divides the lowest frequency by ``s`` exactly and
  leaves the highest one unchanged. Dynamic NTK (emozilla 2023) uses the stretch
  ``s n / L0 - (s - 1)`` at the current length ``n = max(seq_len, L0)``.
* YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
  Models", sec. 3, "NTK-by-parts" and the attention temperature): pairs with fewer
  than ``beta_slow`` turns are interpolated (``theta_i / s``), pairs with more than
  ``beta_fast`` turns keep ``theta_i``, with a linear ramp over the pair index between;
  the index where a pair turns ``r`` times is ``R ln(L0 / (2 pi r)) / (2 ln base)``
  (floored/ceiled when ``truncate``; ``beta_fast == beta_slow``, as in Kimi K2, makes
  the ramp at most one pair wide, as transformers computes it). Attention scale ``0.1 ln s + 1``, or
  ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` (DeepSeek-V2) when both are given.
* Llama 3 (Meta 2024, Llama 3.1 release): ``lambda_i < L0 / high_freq_factor`` keeps
  ``theta_i``; ``lambda_i > L0 / low_freq_factor`` uses ``theta_i / s``; in between
  ``(1 - a) theta_i / s + a theta_i`` with ``a = (L0 / lambda_i - low) / (high - low)``;
  ``low == high`` (Llama 4 Scout: 1, 1) has no band in between.
* LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million
  Tokens", sec. 3): ``theta_i / f_i`` with searched per-pair factors ``f_i``, the short
  list up to ``L0`` and the long list beyond; attention scale ``sqrt(1 + ln s / ln L0)``,
  or Phi-3.5-MoE's ``short_mscale`` up to ``L0`` and ``long_mscale`` beyond.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from posenc._checks import check_float, check_int
from posenc.encodings.rotary.scaling import RopeScaling, base_inv_freq, register_scaling

__all__ = [
    "DynamicNTKScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "YarnScaling",
    "dynamic_ntk_inv_freq",
    "llama3_inv_freq",
    "longrope_inv_freq",
    "ntk_base",
    "ntk_inv_freq",
    "yarn_attention_scale",
    "yarn_correction_range",
    "yarn_inv_freq",
]


def _optional_positive(name: str, value: object) -> float | None:
    return None if value is None else check_float(name, value, positive=True)


@dataclass(frozen=True)
class NTKScaling(RopeScaling):
    """Static NTK-aware scaling: ``base * factor ** (R / (R - 2))`` (bloc97, 2023)."""

    rope_type: ClassVar[str] = "ntk"
    factor: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", self._factor(self.factor))


@dataclass(frozen=True)
class DynamicNTKScaling(RopeScaling):
    """Dynamic NTK (emozilla, 2023): the NTK base recomputed from the current length ``n``.

    ``base' = base * (factor * n / L0 - (factor - 1)) ** (R / (R - 2))`` with
    ``n = max(seq_len, L0)``, so lengths up to ``L0`` keep the default frequencies.
    """

    rope_type: ClassVar[str] = "dynamic"
    length_dependent: ClassVar[bool] = True
    factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", self._factor(self.factor))
        check_int("dynamic original_max_position_embeddings", self.original_max_position_embeddings)


def ntk_base(dim: int, base: float, stretch: float, rope_type: str) -> float:
    """The NTK-aware base ``base * stretch ** (R / (R - 2))`` of rotary dim ``R = dim``.

    Raises:
        ValueError: ``dim < 4`` (named with ``rope_type``).
    """
    if dim < 4:
        raise ValueError(f"{rope_type} scaling needs a rotary dim >= 4, got {dim}")
    return base * stretch ** (dim / (dim - 2))


@register_scaling(NTKScaling)
def ntk_inv_freq(
    dim: int, base: float, params: NTKScaling, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """Static NTK-aware: the lowest frequency is divided by ``factor``, the highest kept."""
    return base_inv_freq(dim, ntk_base(dim, base, params.factor, "ntk")), 1.0


@register_scaling(DynamicNTKScaling)
def dynamic_ntk_inv_freq(
    dim: int, base: float, params: DynamicNTKScaling, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """Dynamic NTK at length ``seq_len`` (``None``: the original length, i.e. no change)."""
    original = params.original_max_position_embeddings
    n = original if seq_len is None else max(check_int("seq_len", seq_len), original)
    stretch = params.factor * n / original - (params.factor - 1.0)
    return base_inv_freq(dim, ntk_base(dim, base, stretch, "dynamic")), 1.0


@dataclass(frozen=True)
class YarnScaling(RopeScaling):
    """YaRN parameters (names as in Hugging Face ``rope_scaling``)."""

    rope_type: ClassVar[str] = "yarn"
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "factor", self._factor(self.factor))
        check_int("yarn original_max_position_embeddings", self.original_max_position_embeddings)
        set_(self, "beta_fast", check_float("yarn beta_fast", self.beta_fast, positive=True))
        set_(self, "beta_slow", check_float("yarn beta_slow", self.beta_slow, positive=True))
        if self.beta_fast < self.beta_slow:
            raise ValueError(
                f"yarn beta_fast must be at least beta_slow, got {self.beta_fast} < "
                f"{self.beta_slow}"
            )
        for name in ("mscale", "mscale_all_dim"):
            value = getattr(self, name)
            if value is not None:
                set_(self, name, check_float(f"yarn {name}", value, minimum=0.0))
        if not isinstance(self.truncate, bool):
            raise TypeError(f"yarn truncate must be a bool, got {self.truncate!r}")
        set_(
            self,
            "attention_factor",
            _optional_positive("yarn attention_factor", self.attention_factor),
        )


@dataclass(frozen=True)
class Llama3Scaling(RopeScaling):
    """Llama 3.1 parameters (8, 1, 4, 8192 in the release)."""

    rope_type: ClassVar[str] = "llama3"
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "factor", self._factor(self.factor))
        low = check_float("llama3 low_freq_factor", self.low_freq_factor, positive=True)
        high = check_float("llama3 high_freq_factor", self.high_freq_factor, positive=True)
        if high < low:  # equal: no smoothed band (Llama 4 Scout)
            raise ValueError(
                "llama3 high_freq_factor must exceed low_freq_factor or equal it, "
                f"got {high} < {low}"
            )
        set_(self, "low_freq_factor", low)
        set_(self, "high_freq_factor", high)
        check_int("llama3 original_max_position_embeddings", self.original_max_position_embeddings)


@dataclass(frozen=True)
class LongRopeScaling(RopeScaling):
    """LongRoPE parameters: per-pair factors for short (``<= L0``) and long lengths.

    ``factor`` is the context extension ratio (Phi-3: ``max_position_embeddings / L0``);
    it only sets the default attention scale. ``short_mscale`` and ``long_mscale`` (both
    or neither; Phi-3.5-MoE) replace the attention scale: the short one up to ``L0``.
    """

    rope_type: ClassVar[str] = "longrope"
    length_dependent: ClassVar[bool] = True
    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    factor: float
    attention_factor: float | None = None
    short_mscale: float | None = None
    long_mscale: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("short_mscale", "long_mscale"):
            set_(self, name, _optional_positive(f"longrope {name}", getattr(self, name)))
        if (self.short_mscale is None) != (self.long_mscale is None):
            raise ValueError(
                "longrope short_mscale and long_mscale come together, got "
                f"short_mscale={self.short_mscale}, long_mscale={self.long_mscale}"
            )
        for name in ("short_factor", "long_factor"):
            set_(self, name, _factor_list(f"longrope {name}", getattr(self, name)))
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError(
                f"longrope short_factor and long_factor differ in length: "
                f"{len(self.short_factor)} vs {len(self.long_factor)}"
            )
        check_int(
            "longrope original_max_position_embeddings", self.original_max_position_embeddings
        )
        set_(self, "factor", self._factor(self.factor))
        set_(
            self,
            "attention_factor",
            _optional_positive("longrope attention_factor", self.attention_factor),
        )


def _factor_list(name: str, values: object) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, Tensor)):
        raise TypeError(f"{name} must be a list of numbers, got {type(values).__name__}")
    out = tuple(check_float(f"{name}[{i}]", float(v), positive=True) for i, v in enumerate(values))
    if not out:
        raise ValueError(f"{name} must not be empty")
    return out


def _log_mscale(factor: float, coefficient: float = 1.0) -> float:
    return 1.0 if factor <= 1.0 else 0.1 * coefficient * math.log(factor) + 1.0


def yarn_attention_scale(params: YarnScaling) -> float:
    """The YaRN attention factor (cos and sin are multiplied by it)."""
    if params.attention_factor is not None:
        return params.attention_factor
    if params.mscale and params.mscale_all_dim:
        return _log_mscale(params.factor, params.mscale) / _log_mscale(
            params.factor, params.mscale_all_dim
        )
    return _log_mscale(params.factor)


def yarn_correction_range(dim: int, base: float, params: YarnScaling) -> tuple[float, float]:
    """Pair indices ``(low, high)`` between which YaRN ramps from keep to interpolate."""

    def index(turns: float) -> float:  # the pair index that turns `turns` times over L0
        length = params.original_max_position_embeddings
        return dim * math.log(length / (2 * math.pi * turns)) / (2 * math.log(base))

    low, high = index(params.beta_fast), index(params.beta_slow)
    if params.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


@register_scaling(YarnScaling)
def yarn_inv_freq(
    dim: int, base: float, params: YarnScaling, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """YaRN: ``theta_i`` below ``low``, ``theta_i / s`` above ``high``, a linear ramp between."""
    theta = base_inv_freq(dim, base)
    low, high = yarn_correction_range(dim, base, params)
    if high == low:
        high += 0.001  # a zero-width ramp becomes a step
    index = torch.arange(dim // 2, dtype=torch.float64)
    ramp = ((index - low) / (high - low)).clamp(0.0, 1.0)  # 0 keep, 1 interpolate
    inv_freq = theta * (1.0 - ramp) + (theta / params.factor) * ramp
    return inv_freq, yarn_attention_scale(params)


@register_scaling(Llama3Scaling)
def llama3_inv_freq(
    dim: int, base: float, params: Llama3Scaling, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """Llama 3.1: keep short wavelengths, divide long ones by ``factor``, smooth between."""
    theta = base_inv_freq(dim, base)
    length = params.original_max_position_embeddings
    low, high = params.low_freq_factor, params.high_freq_factor
    wavelength = 2 * math.pi / theta
    mix = (length / wavelength - low) / (high - low) if high > low else torch.zeros_like(theta)
    smoothed = (1.0 - mix) * theta / params.factor + mix * theta
    inv_freq = torch.where(wavelength > length / low, theta / params.factor, smoothed)
    inv_freq = torch.where(wavelength < length / high, theta, inv_freq)
    return inv_freq, 1.0


@register_scaling(LongRopeScaling)
def longrope_inv_freq(
    dim: int, base: float, params: LongRopeScaling, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """LongRoPE: ``theta_i / lambda_i``, long factors when ``seq_len > L0``."""
    long = seq_len is not None and seq_len > params.original_max_position_embeddings
    factors = params.long_factor if long else params.short_factor
    if len(factors) != dim // 2:
        raise ValueError(
            f"longrope factor lists have {len(factors)} entries, rotary dim {dim} needs {dim // 2}"
        )
    inv_freq = base_inv_freq(dim, base) / torch.tensor(factors, dtype=torch.float64)
    if params.short_mscale is not None and params.long_mscale is not None:
        scale = params.long_mscale if long else params.short_mscale
    elif params.attention_factor is not None:
        scale = params.attention_factor
    elif params.factor <= 1.0:
        scale = 1.0
    else:
        log_l0 = math.log(params.original_max_position_embeddings)
        scale = math.sqrt(1.0 + math.log(params.factor) / log_l0)
    return inv_freq, scale
