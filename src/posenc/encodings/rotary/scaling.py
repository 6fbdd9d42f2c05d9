"""RoPE frequency scalings: each maps ``(dim, base, params)`` to ``(inv_freq, attention_scale)``.

Shapes: ``R`` rotary dim (even), ``inv_freq`` is ``[R/2]``. The unscaled frequencies are
``theta_i = base ** (-2i / R)``, ``i < R/2`` (Su et al. 2021, "RoFormer", eq. 15). A
scaling changes them to reach beyond the trained length ``L0``:

=========== ======================================================== ==================
rope_type   inv_freq                                                 attention_scale
=========== ======================================================== ==================
default     ``theta_i``                                              1
linear      ``theta_i / s`` (Chen et al. 2023, position interp.)     1
ntk         ``theta_i`` with ``base * s ** (R / (R - 2))`` (bloc97)  1
dynamic     ntk with ``s' = s n / L0 - (s - 1)``, ``n = max(len, L0)``  1
yarn        ramp between ``theta_i`` and ``theta_i / s`` (Peng 2023)   ``0.1 ln s + 1``
llama3      wavelength bands, smoothed (Meta 2024, Llama 3.1)        1
longrope    ``theta_i / lambda_i``, short or long list (Ding 2024)   ``sqrt(1 + ln s / ln L0)``
=========== ======================================================== ==================

NTK, dynamic NTK, YaRN, Llama 3 and LongRoPE live in ``rope_context_scaling``; this
module holds the parameter base class, default and linear, the registry and the front
door (``rope_inv_freq``, HF-style dicts). Every
function computes in float64 from the float64 ``theta_i``; ``rope_inv_freq`` rounds once
to the requested dtype (float32 by default, the values transformers computes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from posenc._checks import check_even, check_float, check_float_dtype

__all__ = [
    "DEFAULT_BASE",
    "DefaultRope",
    "LinearScaling",
    "RopeScaling",
    "ScalingSpec",
    "base_inv_freq",
    "register_scaling",
    "resolve_scaling",
    "rope_inv_freq",
    "scaling_from_dict",
    "scaling_types",
]

DEFAULT_BASE = 10000.0

ScalingFn = Callable[..., tuple[Tensor, float]]


@dataclass(frozen=True)
class RopeScaling:
    """Base of the frozen parameter dataclasses; each validates itself on construction.

    Class attributes:
        rope_type: the registry name (the ``rope_type`` of Hugging Face configs).
        length_dependent: True when the frequencies depend on the current length.
        rotates_full_head: True when ``partial_rotary_factor`` is a parameter of the
            frequencies (proportional RoPE) rather than a rotary dim.
    """

    rope_type: ClassVar[str] = ""
    length_dependent: ClassVar[bool] = False
    rotates_full_head: ClassVar[bool] = False

    def inv_freq(
        self, dim: int, base: float, *, seq_len: int | None = None
    ) -> tuple[Tensor, float]:
        """``(inv_freq [dim/2] float64, attention_scale)`` of this scaling for ``seq_len``."""
        return _REGISTRY[self.rope_type][1](dim, base, self, seq_len=seq_len)

    def _factor(self, value: object, *, minimum: float = 1.0) -> float:
        return check_float(f"{self.rope_type} factor", value, minimum=minimum)


_REGISTRY: dict[str, tuple[type[RopeScaling], ScalingFn]] = {}


def register_scaling(params: type[RopeScaling]) -> Callable[[ScalingFn], ScalingFn]:
    """Decorator: register ``fn(dim, base, params, *, seq_len=None)`` for ``params.rope_type``."""

    def deco(fn: ScalingFn) -> ScalingFn:
        _REGISTRY[params.rope_type] = (params, fn)
        return fn

    return deco


def scaling_types() -> list[str]:
    """Names of the registered scalings (``rope_type`` values), sorted."""
    return sorted(_REGISTRY)


def base_inv_freq(dim: int, base: float) -> Tensor:
    """Unscaled ``theta_i = base ** (-2i / dim)``, ``i < dim/2``, float64 ``[dim/2]``."""
    dim = check_even("rotary dim", dim)
    base = check_float("base", base, positive=True)
    if base == 1.0:
        raise ValueError("base must differ from 1 (every frequency would be 1), got 1.0")
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return torch.tensor(base, dtype=torch.float64) ** -exponent


# --------------------------------------------------------------------------- scalings


@dataclass(frozen=True)
class DefaultRope(RopeScaling):
    """No scaling: the RoFormer frequencies."""

    rope_type: ClassVar[str] = "default"


@dataclass(frozen=True)
class LinearScaling(RopeScaling):
    """Position interpolation (Chen et al. 2023): positions divided by ``factor >= 1``."""

    rope_type: ClassVar[str] = "linear"
    factor: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", self._factor(self.factor))


@register_scaling(DefaultRope)
def default_inv_freq(
    dim: int, base: float, params: DefaultRope, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """RoFormer frequencies ``theta_i``; attention scale 1."""
    return base_inv_freq(dim, base), 1.0


@register_scaling(LinearScaling)
def linear_inv_freq(
    dim: int, base: float, params: LinearScaling, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """Position interpolation: ``theta_i / factor`` (same as positions ``/ factor``)."""
    return base_inv_freq(dim, base) / params.factor, 1.0


# --------------------------------------------------------------------------- front door

ScalingSpec = RopeScaling | Mapping[str, Any] | None

#: Legacy ``type`` names found in released configs.
_ALIASES = {"su": "longrope"}


def scaling_from_dict(spec: Mapping[str, Any]) -> RopeScaling:
    """Build the parameter dataclass from an HF-style dict (``rope_scaling`` entry).

    ``rope_type`` (or the legacy ``type``) selects the scaling, default ``"default"``;
    ``None`` values count as absent (JSON ``null``). Keys that only concern the module
    (``rope_theta``, ``partial_rotary_factor``) must be removed first (``resolve_scaling``
    does that).

    Raises:
        ValueError: unknown ``rope_type`` (listing the known ones), missing required or
            unexpected keys (named), invalid values.
    """
    spec = {k: v for k, v in spec.items() if v is not None}
    names = {spec.pop(key) for key in ("rope_type", "type") if key in spec}
    if len(names) > 1:
        raise ValueError(f"rope_type and type disagree: {sorted(names)}")
    name = names.pop() if names else "default"
    name = _ALIASES.get(name, name)
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown rope_type {name!r}; known rope types: {', '.join(scaling_types())}"
        )
    cls = _REGISTRY[name][0]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unexpected = sorted(set(spec) - set(fields))
    if unexpected:
        raise ValueError(
            f"unexpected keys {unexpected} for rope_type {name!r}; accepted: {sorted(fields)}"
        )
    required = [
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [n for n in required if n not in spec]
    if missing:
        raise ValueError(f"missing required keys {missing} for rope_type {name!r}")
    return cls(**spec)


def resolve_scaling(
    scaling: ScalingSpec, *, head_dim: int, base: float, rotary_dim: int | None = None
) -> tuple[RopeScaling, float, int]:
    """Normalize ``scaling`` (None, dataclass or HF dict) to ``(params, base, rotary_dim)``.

    A dict may carry ``rope_theta`` and ``partial_rotary_factor`` (transformers v5
    ``rope_parameters``): they set ``base`` (when ``base`` is left at its default 10000)
    and ``rotary_dim = int(head_dim * partial_rotary_factor)``.

    Raises:
        ValueError: odd ``head_dim``; ``rotary_dim`` odd or ``> head_dim``; a dict whose
            ``rope_theta`` / ``partial_rotary_factor`` contradicts ``base`` / ``rotary_dim``.
        TypeError: ``scaling`` of another type.
    """
    head_dim = check_even("head_dim", head_dim)
    base = check_float("base", base, positive=True)
    if scaling is None:
        params: RopeScaling = DefaultRope()
    elif isinstance(scaling, RopeScaling):
        params = scaling
    elif isinstance(scaling, Mapping):
        spec = dict(scaling)
        theta = spec.pop("rope_theta", None)
        if theta is not None:
            theta = check_float("rope_theta", theta, positive=True)
            if base not in (DEFAULT_BASE, theta):
                raise ValueError(f"scaling has rope_theta={theta} but base={base} was given")
            base = theta
        fraction = None if _rotates_full_head(spec) else spec.pop("partial_rotary_factor", None)
        if fraction is not None:
            implied = _partial_rotary_dim(head_dim, fraction)
            if rotary_dim is not None and rotary_dim != implied:
                raise ValueError(
                    f"partial_rotary_factor={fraction} implies rotary_dim={implied}, "
                    f"but rotary_dim={rotary_dim} was given"
                )
            rotary_dim = implied
        params = scaling_from_dict(spec)
    else:
        raise TypeError(
            f"scaling must be None, a RopeScaling dataclass or a dict, got {type(scaling).__name__}"
        )
    rotary_dim = head_dim if rotary_dim is None else check_even("rotary_dim", rotary_dim)
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim={rotary_dim} exceeds head_dim={head_dim}")
    return params, base, rotary_dim


def _rotates_full_head(spec: Mapping[str, Any]) -> bool:
    """Whether the dict's rope type keeps ``partial_rotary_factor`` as its own parameter."""
    name = spec.get("rope_type") or spec.get("type") or "default"
    entry = _REGISTRY.get(_ALIASES.get(name, name))
    return entry is not None and entry[0].rotates_full_head


def _partial_rotary_dim(head_dim: int, fraction: object) -> int:
    fraction = check_float("partial_rotary_factor", fraction, positive=True)
    if fraction > 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {fraction}")
    rotary_dim = int(head_dim * fraction)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"partial_rotary_factor={fraction} with head_dim={head_dim} gives rotary dim "
            f"{rotary_dim}, which must be even and >= 2"
        )
    return rotary_dim


def rope_inv_freq(
    head_dim: int,
    *,
    base: float = DEFAULT_BASE,
    scaling: ScalingSpec = None,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, float]:
    """Inverse frequencies and attention scale of a (scaled) RoPE.

    Args:
        head_dim: the head dimension (rotary dim when no ``partial_rotary_factor``).
        base: the RoPE base ``theta`` (``rope_theta``).
        scaling: None, a scaling dataclass, or an HF-style dict such as
            ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}``.
        seq_len: the current length, for the length-dependent scalings (dynamic,
            longrope); ``None`` means "not beyond the original length".
        dtype: dtype of the returned ``inv_freq`` (computed in float64, rounded once).

    Returns:
        ``(inv_freq [R/2], attention_scale)``; ``attention_scale`` multiplies cos and sin.

    Raises:
        ValueError: see ``resolve_scaling`` and ``scaling_from_dict``.
    """
    dtype = check_float_dtype("dtype", dtype)
    params, base, rotary_dim = resolve_scaling(scaling, head_dim=head_dim, base=base)
    inv_freq, scale = params.inv_freq(rotary_dim, base, seq_len=seq_len)
    return inv_freq.to(dtype), float(scale)
