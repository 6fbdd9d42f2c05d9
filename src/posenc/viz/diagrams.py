"""The two explanatory diagrams: sinusoidal fingerprints and the RoPE rotation.

Shapes: ``C`` d_model, ``D`` head_dim. Both return a ``matplotlib.figure.Figure`` drawn
in data coordinates; saved as ``.svg`` (``posenc.viz.save_figure``) their parts are
``<g>`` elements with stable ids (``clock-p3-i0``, ``hand-p3-i0``, ``cell-p3-d5``;
``m-q``, ``m-k``, ``m-angle``, ``m-dot`` and the same with ``s-`` for the shifted
picture) and their text stays ``<text>``.

* ``fingerprint_diagram``: Vaswani et al. 2017, section 3.5. The pair
  ``(PE[p, 2i], PE[p, 2i + 1]) = (sin(p w_i), cos(p w_i))`` gives the tip
  ``(cos, sin)`` of a clock hand turned ``p w_i`` anticlockwise from 3 o'clock (the way
  the RoPE diagram turns its vectors), ``w_i = base^(-2i/C)``; the hand of pair
  ``i`` goes round once every ``2 pi base^(2i/C)`` positions. A row of clocks is the
  fingerprint of one position.
* ``rope_rotation_diagram``: Su et al. 2021 (RoFormer), section 3.2, eq. 16: the pair of
  ``q`` at position ``m`` is turned by ``m theta`` and that of ``k`` at ``n`` by
  ``n theta``, so ``<R(m theta) q, R(n theta) k> = <q, R((n - m) theta) k>``: shifting
  both positions by ``s`` turns both vectors by ``s theta`` and leaves the dot product.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from posenc._checks import check_even, check_float, check_int
from posenc.encodings.rotary.apply import apply_rope
from posenc.encodings.sinusoidal import sinusoidal_table
from posenc.viz._common import new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["fingerprint_diagram", "rope_rotation_diagram"]

_SPACING = 2.6  # distance between clock centres, in clock radii


def fingerprint_diagram(
    *,
    d_model: int = 16,
    positions: Sequence[int] = (0, 1, 2, 3, 10, 50),
    base: float = 10000.0,
) -> Figure:
    """Clock faces of every dimension pair (columns) for a few positions (rows).

    Each row ends with the position's ``C`` values as a colour strip: the fingerprint.

    Args:
        d_model: ``C`` (even; ``C/2`` clocks per row).
        positions: the positions drawn, one row each.
        base: the frequency base.

    Raises:
        ValueError: odd ``d_model``, no or negative positions, ``base`` <= 0.
    """
    from matplotlib.patches import Circle, Rectangle

    d_model = check_even("d_model", d_model)
    base = check_float("base", base, positive=True)
    if not positions:
        raise ValueError("fingerprint_diagram needs at least one position, got none")
    positions = [check_int("position", p, minimum=0) for p in positions]
    pairs = d_model // 2
    pe = sinusoidal_table(torch.tensor(positions), d_model, base=base, dtype=torch.float64)
    pe = pe.numpy()  # [P, C]
    wavelengths = 2 * math.pi * base ** (2 * np.arange(pairs) / d_model)

    strip_x = pairs * _SPACING - 0.4  # left edge of the fingerprint strip
    cell = min(0.5, 6.0 / d_model)
    xlim = (-3.2, strip_x + cell * d_model + 0.3)
    ylim = (-(len(positions) - 1) * _SPACING - 3.0, 2.2)
    fig = new_figure(max(10.0, 0.4 * (xlim[1] - xlim[0])), 0.4 * (ylim[1] - ylim[0]) + 0.5)
    ax = fig.add_subplot()
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle(
        "Sinusoidal encoding: every dimension pair is a clock hand, every position a fingerprint",
        fontsize=13,
    )
    cmap = _colormap("RdBu_r")
    for i, wavelength in enumerate(wavelengths):
        ax.text(i * _SPACING, 1.55, f"pair {i}\ndims {2 * i},{2 * i + 1}", ha="center", fontsize=8)
        digits = 1 if wavelength < 100 else 0
        ax.text(
            i * _SPACING, 1.25, f"λ = {wavelength:,.{digits}f}", ha="center", fontsize=8, color="C3"
        )
    ax.text(strip_x + cell * d_model / 2, 1.35, f"PE[p]: {d_model} values", ha="center", fontsize=8)
    for row, pos in enumerate(positions):
        y = -row * _SPACING
        ax.text(-1.4, y, f"p = {pos}", ha="right", va="center", fontsize=10, weight="bold")
        for i in range(pairs):
            x = i * _SPACING
            face = Circle((x, y), 1.0, fc="0.97", ec="0.55", lw=1.0)
            face.set_gid(f"clock-p{pos}-i{i}")
            ax.add_patch(face)
            ax.plot([x + 0.85, x + 1.0], [y, y], color="0.55", lw=1.0)  # 3 o'clock: angle 0
            tip = pe[row, 2 * i : 2 * i + 2][::-1]  # (cos, sin) = (x, y): anticlockwise
            (hand,) = ax.plot(
                [x, x + 0.9 * tip[0]],
                [y, y + 0.9 * tip[1]],
                color="C0",
                lw=2.2,
                solid_capstyle="round",
            )
            hand.set_gid(f"hand-p{pos}-i{i}")
            ax.plot([x], [y], "o", color="C0", ms=3)
        for d in range(d_model):
            square = Rectangle(
                (strip_x + d * cell, y - cell),
                cell,
                2 * cell,
                fc=cmap(0.5 + 0.5 * pe[row, d]),
                ec="0.8",
                lw=0.5,
            )
            square.set_gid(f"cell-p{pos}-d{d}")
            ax.add_patch(square)
        ax.add_patch(Rectangle((strip_x, y - cell), cell * d_model, 2 * cell, fc="none", ec="0.4"))
    ax.text(
        -1.4,
        ylim[0] + 1.5,
        "The hand of pair i points at angle p·w_i anticlockwise from 3 o'clock (as RoPE turns), "
        "w_i = base^(-2i/d): its tip is (cos, sin) = (PE[p, 2i+1], PE[p, 2i]).\n"
        "It turns once every λ = 2π·base^(2i/d) "
        "positions. Fast hands (left) tell neighbours apart, slow hands (right) tell distant "
        "positions apart;\ntogether they never repeat. Strip: the values from -1 (blue) to "
        "+1 (red).",
        va="top",
        fontsize=8.5,
        color="0.25",
    )
    ax.set(xlim=xlim, ylim=ylim)
    return fig


def _colormap(name: str):
    import matplotlib

    return matplotlib.colormaps[name]


def rope_rotation_diagram(*, theta: float = 0.3, m: int = 5, n: int = 2, shift: int = 3) -> Figure:
    """One feature pair of ``q`` (position ``m``) and ``k`` (position ``n``), rotated.

    Left: ``q`` turned by ``m theta``, ``k`` by ``n theta``; the angle between them is
    ``(m - n) theta``. Right: both positions shifted by ``shift``; both vectors turn
    further by ``shift theta``, the angle and the dot product stay. The rotations go
    through ``posenc.apply_rope``.

    Raises:
        ValueError: non-positive ``theta``; negative ``m``, ``n`` or ``shift``.
    """
    theta = check_float("theta", theta, positive=True)
    m, n = check_int("m", m, minimum=0), check_int("n", n, minimum=0)
    shift = check_int("shift", shift, minimum=0)
    fig = new_figure(12, 7.0)
    left, right = fig.subplots(1, 2)
    fig.suptitle(
        "RoPE: q at position m turns by mθ, k at position n by nθ; q·k depends only on m - n",
        fontsize=13,
    )
    dots = [
        _rotation_panel(left, theta, m, n, prefix="m", title=f"positions m = {m}, n = {n}"),
        _rotation_panel(
            right,
            theta,
            m + shift,
            n + shift,
            prefix="s",
            title=f"both shifted by s = {shift}: m = {m + shift}, n = {n + shift}",
        ),
    ]
    same = "the same" if math.isclose(dots[0], dots[1], rel_tol=1e-9, abs_tol=1e-12) else "not"
    fig.supxlabel(
        f"θ = {theta} rad for this pair. Unrotated q and k (dashed) point the same way here; "
        f"in general the angle is φ + (m - n)θ, φ their angle before rotation.\n"
        f"Shifting both positions turns both vectors by sθ: the angle (m - n)θ and "
        f"the dot product are {same} ({dots[0]:.4f} and {dots[1]:.4f}).",
        fontsize=9,
        color="0.25",
    )
    return fig


def _rotate(vector: tuple[float, float], angle: float) -> np.ndarray:
    """``vector`` turned by ``angle`` through ``apply_rope`` (a single interleaved pair)."""
    x = torch.tensor(vector, dtype=torch.float64).view(1, 1, 1, 2)  # [B, H, T, D]
    a = torch.tensor([[angle]], dtype=torch.float64)  # [T, 1]
    return apply_rope(x, a.cos(), a.sin(), interleaved=True).view(2).numpy()


def _arc(ax: Axes, radius: float, start: float, stop: float, **style) -> None:
    t = np.linspace(start, stop, 60)
    ax.plot(radius * np.cos(t), radius * np.sin(t), **style)


def _rotation_panel(ax: Axes, theta: float, m: int, n: int, *, prefix: str, title: str) -> float:
    """Draw one picture; return the rotated dot product."""
    q, k = (1.0, 0.0), (0.8, 0.0)
    q_m, k_n = _rotate(q, m * theta), _rotate(k, n * theta)
    ax.set_aspect("equal")
    ax.set(xlim=(-1.35, 1.35), ylim=(-1.35, 1.35), title=title)
    ax.axhline(0, color="0.85", lw=0.8)
    ax.axvline(0, color="0.85", lw=0.8)
    _arc(ax, 1.0, 0, 2 * math.pi, color="0.75", lw=1.0)  # the unit circle
    ax.set_xlabel("feature 2i (first of the pair)")
    ax.set_ylabel("feature 2i + 1")
    for vec, color in ((q, "C0"), (k, "C1")):
        ax.annotate(
            "",
            xy=vec,
            xytext=(0, 0),
            arrowprops={"arrowstyle": "->", "color": color, "ls": "--", "alpha": 0.5},
        )
    for vec, color, name, pos in ((q_m, "C0", "q", m), (k_n, "C1", "k", n)):
        arrow = ax.annotate(
            "",
            xy=tuple(vec),
            xytext=(0, 0),
            arrowprops={"arrowstyle": "-|>", "color": color, "lw": 2.5},
        )
        arrow.arrow_patch.set_gid(f"{prefix}-{name}")
        ax.text(
            *(1.12 * vec),
            f"{name} at {pos}",
            color=color,
            ha="center",
            va="center",
            fontsize=11,
            weight="bold",
        )
    # the turns from the unrotated direction (angle 0); their key sits in the top corner
    box = {"fc": "white", "ec": "none", "alpha": 0.85, "pad": 1.0}
    for radius, angle, text, color, y in (
        (0.38, m * theta, f"outer arc: q turned by mθ = {m}θ", "C0", 1.3),
        (0.24, n * theta, f"inner arc: k turned by nθ = {n}θ", "C1", 1.17),
    ):
        _arc(ax, radius, 0, angle, color=color, lw=1.5)
        ax.text(-1.3, y, text, color=color, fontsize=10, va="top")
    _arc(ax, 0.62, n * theta, m * theta, color="C2", lw=3, gid=f"{prefix}-angle")
    mid = 0.5 * (m + n) * theta
    ax.text(
        0.8 * math.cos(mid),
        0.8 * math.sin(mid),
        f"(m - n)θ = {m - n}θ",
        color="C2",
        fontsize=11,
        weight="bold",
        ha="center",
        va="center",
        bbox=box,
    )
    dot = float(q_m @ k_n)
    label = ax.text(
        0.0,
        -0.7,
        f"q·k = |q||k| cos({m - n}θ) = {dot:.4f}",
        ha="center",
        fontsize=11,
        bbox={"fc": "white", "ec": "C2"},
    )
    label.set_gid(f"{prefix}-dot")
    return dot
