"""KERPLE: kernelized relative positional embedding (Chi, Fan, Ramadge and Rudnicky 2022,
"KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation", sec. 4.2,
eqs. (3)-(4)).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys. Head ``h`` adds a
conditionally positive definite kernel of the distance ``|i - j|`` to the logits:

    log:    b_h(i, j) = -r1_h * log(1 + r2_h * |i - j|),     r1, r2 > 0
    power:  b_h(i, j) = -r1_h * |i - j| ** r2_h,             r1 > 0, 0 < r2 <= 2

``r1`` and ``r2`` are learned per head. The paper's code keeps them in range by clamping
the parameters in place (``min 1e-2``, and ``max 2`` for the power exponent); an
in-place clamp inside ``forward`` breaks autograd when one module serves several layers,
and a functional clamp has no gradient outside the range, so here they are
reparametrized onto the same ranges instead, smoothly and with a gradient everywhere:

    r = 0.01 + softplus(rho)                    (r1; r2 of the log kernel)
    r2 = 0.01 + 1.99 * sigmoid(rho)             (r2 of the power kernel)

(a bare ``softplus`` underflows to exactly 0 in float32 after a large step). They start
from the paper's uniform initialisation (log: ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``; power:
``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``, each clamped to at least 0.01) unless given.

Negative positions: allowed; the bias depends on ``q_pos - k_pos`` only, so positions
shifted below zero give the same bias.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc._checks import check_float, check_int
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings._relative import (
    ScoreMod,
    check_hook_inputs,
    check_position_pair,
    offset_score_mod,
    per_head,
    toeplitz_bias,
)

__all__ = ["KERPLE", "KERPLE_KERNELS", "kerple_bias"]

KERPLE_KERNELS = ("log", "power")

#: The paper's lower clamp of both parameters (and of their random initialisation).
_EPS = 1e-2

#: The power kernel's largest exponent.
_MAX_POWER = 2.0

#: Initial values are kept this far inside the open ranges of the reparametrizations
#: (an initial value at a bound maps to an infinite ``rho``).
_MARGIN = 2.0**-30


def _check_kernel(kernel: object) -> str:
    if kernel not in KERPLE_KERNELS:
        raise ValueError(f"unknown KERPLE kernel {kernel!r}; known kernels: log, power")
    return str(kernel)


def _check_r2(kernel: str, r2: object) -> float:
    r2 = check_float("r2", r2, minimum=_EPS)
    if kernel == "power" and r2 > _MAX_POWER:
        raise ValueError(f"r2 must be in [{_EPS}, {_MAX_POWER}] for the power kernel, got {r2}")
    return r2


def _kerple_fn(r1: Tensor, r2: Tensor, kernel: str):
    def fn(d: Tensor, dtype: torch.dtype) -> Tensor:
        distance = d.to(dtype).abs()
        a, p = per_head(r1, dtype), per_head(r2, dtype)
        if kernel == "log":
            return -a * torch.log1p(p * distance)
        return -a * distance.pow(p)

    return fn


def kerple_bias(
    q_pos: Tensor,
    k_pos: Tensor,
    r1: Tensor,
    r2: Tensor,
    *,
    kernel: str = "log",
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """KERPLE bias for explicit positions and per-head parameters.

    Args:
        q_pos: ``[Tq]`` or ``[B, Tq]`` positions.
        k_pos: ``[Tk]`` or ``[B, Tk]`` positions.
        r1: ``[H]`` positive scales.
        r2: ``[H]`` positive (log) or in ``(0, 2]`` (power) parameters.
        kernel: ``"log"`` or ``"power"``.
        dtype: output dtype.

    Returns:
        ``[B|1, H, Tq, Tk]``.

    Raises:
        ValueError: an unknown ``kernel``, or ``r1``/``r2`` not matching ``[H]`` shapes.
    """
    kernel = _check_kernel(kernel)
    if r1.dim() != 1 or r1.shape != r2.shape:
        raise ValueError(f"r1 and r2 must both be [H], got {tuple(r1.shape)} and {tuple(r2.shape)}")
    q_pos, k_pos = check_position_pair(q_pos, k_pos)
    return toeplitz_bias(_kerple_fn(r1, r2, kernel), q_pos, k_pos, dtype)


def _positive(rho: Tensor) -> Tensor:
    return _EPS + F.softplus(rho)


def _positive_inverse(r: Tensor) -> Tensor:
    x = (r - _EPS).clamp(min=_MARGIN)
    return x + torch.log(-torch.expm1(-x))


def _exponent(rho: Tensor) -> Tensor:
    return _EPS + (_MAX_POWER - _EPS) * torch.sigmoid(rho)


def _exponent_inverse(r: Tensor) -> Tensor:
    fraction = ((r - _EPS) / (_MAX_POWER - _EPS)).clamp(_MARGIN, 1.0 - _MARGIN)
    return torch.log(fraction) - torch.log1p(-fraction)


@register(
    "kerple",
    paper="Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding",
    description="learned per-head log or power kernel of the distance on the logits",
)
class KERPLE(PositionalEncoding):
    """KERPLE's learned kernel bias (SCORE site).

    Args:
        num_heads: ``H``.
        kernel: ``"log"`` (the paper's best) or ``"power"``.
        r1: initial value of every head's ``r1`` (>= 0.01); None: the paper's random init.
        r2: initial value of every head's ``r2`` (>= 0.01, and <= 2 for ``"power"``);
            None: the paper's random init.

    Attributes:
        r1, r2: the effective per-head parameters ``[H]`` (always in range).

    Raises:
        ValueError: ``num_heads < 1``, an unknown ``kernel``, ``r1 < 0.01``, or ``r2`` out
            of range.
    """

    sites = Site.SCORE
    offset_only = True

    def __init__(
        self,
        num_heads: int,
        *,
        kernel: str = "log",
        r1: float | None = None,
        r2: float | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        self.kernel = _check_kernel(kernel)
        scale1, scale2 = (2.0, 1.0) if self.kernel == "log" else (1.0, 2.0)
        init1 = self._initial(None if r1 is None else check_float("r1", r1, minimum=_EPS), scale1)
        init2 = self._initial(None if r2 is None else _check_r2(self.kernel, r2), scale2)
        self.rho1 = nn.Parameter(_positive_inverse(init1).float())
        inverse2 = _positive_inverse if self.kernel == "log" else _exponent_inverse
        self.rho2 = nn.Parameter(inverse2(init2).float())

    def _initial(self, value: float | None, scale: float) -> Tensor:
        if value is not None:
            return torch.full((self.num_heads,), value, dtype=torch.float64)
        return (torch.rand(self.num_heads, dtype=torch.float64) * scale).clamp(min=_EPS)

    @property
    def r1(self) -> Tensor:
        return _positive(self.rho1.to(compute_dtype(self.rho1.dtype)))

    @property
    def r2(self) -> Tensor:
        rho2 = self.rho2.to(compute_dtype(self.rho2.dtype))
        return _positive(rho2) if self.kernel == "log" else _exponent(rho2)

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``[B|1, H, Tq, Tk]`` bias in ``q``'s dtype."""
        q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos, num_heads=self.num_heads, module=self)
        return toeplitz_bias(_kerple_fn(self.r1, self.r2, self.kernel), q_pos, k_pos, q.dtype)

    def score_mod(self) -> ScoreMod:
        """FlexAttention ``score_mod`` adding this bias (query/key indices as positions);
        for eager ``flex_attention`` (see ``offset_score_mod``)."""
        return offset_score_mod(_kerple_fn(self.r1, self.r2, self.kernel))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, kernel={self.kernel!r}"
