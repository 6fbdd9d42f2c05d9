"""FIRE: functional interpolation for relative positions (Li et al. 2024, "Functional
Interpolation for Relative Positions Improves Long Context Transformers", ICLR, eq. (3)
and sec. 3.2).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys. For query position ``i`` and
key position ``j``

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),      psi(x) = log(c * x + 1),

with ``f_theta: R -> R^H`` a small MLP (one hidden ReLU layer of width 32, one output per
head), ``c > 0`` learned (``psi`` takes ``|c x|``, as the paper's code does) and the
threshold ``L`` learned as ``|L_multiplier * init_L|``. The normalization by the *query*
position makes the input lie in ``[0, 1]`` for every causal pair (progressive
interpolation), so ``b`` is not shift invariant once ``i`` exceeds ``L``; below ``L`` it
depends on ``i - j`` only. A small ``eps`` is added to the normalizer (as in the
paper's code). Keys after the query (reached only without a causal mask) use
``|i - j|``.

Negative positions: allowed; ``psi(max(L, i))`` is ``psi(L)`` for every ``i <= L``, so
there the bias depends on ``i - j`` only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from posenc._checks import check_float, check_int
from posenc._dtypes import compute_dtype
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings._relative import (
    ScoreMod,
    check_hook_inputs,
    check_position_pair,
)

__all__ = ["FIRE", "fire_bias", "fire_normalized_distance"]


def _psi(x: Tensor, c: Tensor) -> Tensor:
    """``psi(x) = log(|c x| + 1)``."""
    return torch.log1p((c * x).abs())


def _normalized(q: Tensor, k: Tensor, c: Tensor, threshold: Tensor, eps: float) -> Tensor:
    """``psi(|q - k|) / (psi(max(L, q)) + eps)`` for broadcastable positions ``q``, ``k``."""
    dtype = c.dtype
    integer = not (q.is_floating_point() or k.is_floating_point())
    d = (q.to(torch.int64) - k.to(torch.int64)).to(dtype) if integer else q.to(dtype) - k.to(dtype)
    return _psi(d, c) / (_psi(torch.maximum(q.to(dtype), threshold), c) + eps)


def fire_normalized_distance(
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    c: float | Tensor = 0.1,
    threshold: float | Tensor = 512.0,
    eps: float = 1e-6,
) -> Tensor:
    """FIRE's MLP input ``psi(|i - j|) / (psi(max(L, i)) + eps)``, ``[B|1, Tq, Tk]``.

    Args:
        q_pos: ``[Tq]`` or ``[B, Tq]`` query positions ``i``.
        k_pos: ``[Tk]`` or ``[B, Tk]`` key positions ``j``.
        c: the log-transform scale.
        threshold: ``L``, the smallest normalizing position.
        eps: added to the normalizer.

    Returns:
        float32 (float64 if ``c`` is) ``[B|1, Tq, Tk]``.
    """
    q_pos, k_pos = check_position_pair(q_pos, k_pos)
    c = torch.as_tensor(c, device=q_pos.device)
    c = c.to(compute_dtype(c.dtype) if c.is_floating_point() else torch.float32)
    threshold = torch.as_tensor(threshold, dtype=c.dtype, device=q_pos.device)
    u = _normalized(q_pos.unsqueeze(-1), k_pos.unsqueeze(-2), c, threshold, eps)
    return u if u.dim() == 3 else u.unsqueeze(0)


def fire_bias(
    q_pos: Tensor,
    k_pos: Tensor,
    mlp: Callable[[Tensor], Tensor],
    *,
    c: float | Tensor = 0.1,
    threshold: float | Tensor = 512.0,
    eps: float = 1e-6,
) -> Tensor:
    """The FIRE bias ``mlp(u[..., None])`` moved to ``[B|1, H, Tq, Tk]``.

    Args:
        q_pos, k_pos, c, threshold, eps: as in ``fire_normalized_distance``.
        mlp: maps ``[..., 1]`` to ``[..., H]``.
    """
    u = fire_normalized_distance(q_pos, k_pos, c=c, threshold=threshold, eps=eps)
    return mlp(u.unsqueeze(-1)).permute(0, 3, 1, 2)


@register(
    "fire",
    paper="Li et al. 2024, Functional Interpolation for Relative Positions (FIRE)",
    description="learned MLP of the log-scaled distance normalized by the query position",
)
class FIRE(PositionalEncoding):
    """FIRE as a SCORE-site encoding.

    Args:
        num_heads: ``H``, the MLP's outputs.
        hidden: width of the MLP's hidden layer (32 in the paper).
        init_c: initial ``c`` (0.1 in the paper).
        init_L: initial threshold ``L`` (512 in the paper).
        eps: added to the normalizer.

    Raises:
        ValueError: ``num_heads`` or ``hidden`` < 1, ``init_c`` or ``init_L`` <= 0,
            ``eps`` < 0.
    """

    sites = Site.SCORE
    positional_bias = True

    def __init__(
        self,
        num_heads: int,
        *,
        hidden: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        self.hidden = check_int("hidden", hidden)
        self.init_L = check_float("init_L", init_L, positive=True)
        self.eps = check_float("eps", eps, minimum=0.0)
        self.mlp = nn.Sequential(
            nn.Linear(1, self.hidden), nn.ReLU(), nn.Linear(self.hidden, self.num_heads)
        )
        self.c = nn.Parameter(torch.tensor(check_float("init_c", init_c, positive=True)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))

    @property
    def threshold(self) -> Tensor:
        """The learned threshold ``L = |L_multiplier * init_L|``."""
        return (self.L_multiplier * self.init_L).abs()

    def _bias(self, q: Tensor, k: Tensor) -> Tensor:
        """``[..., H]`` for broadcastable position tensors ``q``, ``k``."""
        work = compute_dtype(self.c.dtype)
        weight_dtype = self.mlp[0].weight.dtype
        u = _normalized(q, k, self.c.to(work), self.threshold.to(work), self.eps)
        return self.mlp(u.to(weight_dtype).unsqueeze(-1))

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``[B|1, H, Tq, Tk]`` bias in ``q``'s dtype."""
        q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos, num_heads=self.num_heads, module=self)
        bias = self._bias(q_pos.unsqueeze(-1), k_pos.unsqueeze(-2)).movedim(-1, -3)
        return (bias if bias.dim() == 4 else bias.unsqueeze(0)).to(q.dtype)  # [B|1, H, Tq, Tk]

    def score_mod(self, length: int | None = None) -> ScoreMod:
        """FlexAttention ``score_mod`` adding this bias (query/key indices as positions),
        with the parameters as they are now (not trained through).

        With ``length`` (every index below it), the MLP is read as the piecewise-linear
        function it is (``piecewise``) through a grid of its input (``_grid_score_mod``):
        per score two table reads for the input, a cell and a comparison for the piece,
        and one multiply-add, where the MLP costs ``hidden`` multiply-adds and ReLUs.
        Without ``length``, or when two breakpoints share a cell of the grid, the MLP is
        written out for head ``h`` (``hidden`` units per score, not ``hidden * H``).
        """
        work = compute_dtype(self.c.dtype)
        c, threshold = self.c.detach().to(work), self.threshold.detach().to(work)
        if length is not None:
            fast = _grid_score_mod(self, length, c, threshold, work)
            if fast is not None:
                return fast
        first, last = self.mlp[0], self.mlp[2]
        w1, b1 = first.weight.detach()[:, 0].to(work), first.bias.detach().to(work)  # [hidden]
        w2, b2 = last.weight.detach().to(work), last.bias.detach().to(work)  # [H, hidden]

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
            u = _normalized(q_idx, kv_idx, c, threshold, self.eps)
            acc = b2[h]
            for unit in range(self.hidden):
                acc = acc + w2[h, unit] * torch.relu(w1[unit] * u + b1[unit])
            return score + acc.to(score.dtype)

        return score_mod

    def piecewise(self) -> tuple[Tensor, Tensor, Tensor]:
        """The MLP ``f: R -> R^H`` as the piecewise-linear function it is (one hidden ReLU
        layer of a scalar input), in float64: ``(breaks [S], slopes [H, S + 1],
        intercepts [H, S + 1])`` with ``f(u) = slopes[:, s] * u + intercepts[:, s]`` for
        ``breaks[s - 1] <= u <= breaks[s]`` (``breaks`` sorted and distinct: the inputs
        ``-b1_k / w1_k`` at which a hidden unit turns on or off; ``f`` is continuous, so
        either piece is exact at a break)."""
        first, last = self.mlp[0], self.mlp[2]
        w1 = first.weight.detach()[:, 0].double()
        b1 = first.bias.detach().double()
        w2, b2 = last.weight.detach().double(), last.bias.detach().double()
        moving = w1 != 0
        at = torch.where(moving, -b1 / torch.where(moving, w1, 1.0), 0.0)  # [hidden]
        breaks = torch.unique(at[moving])  # sorted, distinct
        rank = torch.searchsorted(breaks, at)  # [hidden]: the break of each moving unit
        piece = torch.arange(len(breaks) + 1, device=w1.device)[:, None]  # [S + 1, 1]
        on = torch.where(w1 > 0, rank < piece, rank >= piece)  # [S + 1, hidden]
        on = torch.where(moving, on, b1 > 0).double()  # a constant unit: on iff b1 > 0
        slopes = (w2 * w1) @ on.T  # [H, S + 1]
        intercepts = b2[:, None] + (w2 * b1) @ on.T
        return breaks, slopes, intercepts

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, hidden={self.hidden}, init_L={self.init_L}"


#: Cells of the grid ``_grid_score_mod`` reads the MLP's input through: one size for every
#: parameter value and length, so that a compiled kernel never sees a new shape.
GRID_CELLS = 1 << 14


def _grid_score_mod(
    fire: FIRE, length: int, c: Tensor, threshold: Tensor, work: torch.dtype
) -> ScoreMod | None:
    """FIRE's ``score_mod`` for indices below ``length`` through ``fire.piecewise()``.

    The MLP input ``u = psi(|d|) / n_i`` (``psi`` read from a table of the ``length``
    distances, ``n_i`` from one of the query indices; the same operations as
    ``_normalized``) lies in ``[0, U]``, ``U = psi(length - 1) / (psi(L) + eps)``. That
    range is cut into ``GRID_CELLS`` equal cells; a score's piece is the number of breaks
    up to its cell's start plus one if it is past the cell's break. None when a cell holds
    two breaks. Every table has a shape fixed by ``length``, ``H`` and ``hidden`` and
    every number read is a tensor, so new parameters compile nothing new."""
    breaks, slopes, intercepts = (t.to(c.device) for t in fire.piecewise())
    dist = torch.arange(max(length, 1), dtype=work, device=c.device)
    psi = _psi(dist, c)  # [length]
    norm = _psi(torch.maximum(dist, threshold), c) + fire.eps  # [length]
    top = float((psi[-1] / (_psi(threshold, c) + fire.eps)).item())
    top = max(top, 1e-30) * (1 + 1e-6)  # every reachable u lies below
    edges = torch.arange(GRID_CELLS + 1, dtype=torch.float64, device=c.device)
    edges = edges * (top / GRID_CELLS)
    before = torch.searchsorted(breaks, edges[:-1], right=True)  # breaks <= start
    inside = torch.searchsorted(breaks, edges[1:]) - before  # start < break < end
    if int(inside.max()) > 1:
        return None
    split = torch.full((GRID_CELLS,), float("inf"), dtype=torch.float64, device=c.device)
    split[inside > 0] = breaks[before[inside > 0]]
    split = split.to(work)
    pad = fire.hidden + 1 - slopes.shape[-1]  # pieces never read: one shape for all weights
    slopes, intercepts = (nn.functional.pad(t, (0, pad)).to(work) for t in (slopes, intercepts))
    scale = torch.tensor(GRID_CELLS / top, dtype=work, device=c.device)

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
        u = psi[torch.abs(q_idx - kv_idx)] / norm[q_idx]
        cell = torch.clamp((u * scale).to(torch.int64), 0, GRID_CELLS - 1)
        piece = before[cell] + (u >= split[cell]).to(torch.int64)
        return score + (slopes[h, piece] * u + intercepts[h, piece]).to(score.dtype)

    return score_mod
