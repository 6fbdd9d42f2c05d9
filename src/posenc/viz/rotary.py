"""Figures of rotary encodings: long-range decay and the frequency spectrum of scalings.

Shapes: ``D`` head_dim, ``R = D`` rotary dim, ``theta_i`` (``inv_freq``) ``[R/2]``.

* ``rope_decay_bound``: Su et al. 2021 (RoFormer), section 3.4.3. With
  ``S_j = sum_{i<j} exp(1j (m - n) theta_i)`` the rotated score obeys
  ``|q^T R_{n-m} k| <= (max_i |h_{i+1} - h_i|) sum_j |S_j|``, and the relative upper bound
  ``(1/(R/2)) sum_{j=1}^{R/2} |S_j|`` decays (with oscillations) as ``|m - n|`` grows.
* ``rope_decay_figure``: that bound for several bases and for every scaling.
* ``rope_spectrum_figure``: the wavelength ``2 pi / theta_i`` of every pair under each
  scaling, and the factor by which each scaling divides ``theta_i``. Position
  interpolation (Chen et al. 2023) divides all by ``s``; NTK-aware scaling (bloc97 2023)
  raises the base, leaving fast pairs and stretching slow ones; YaRN (Peng et al. 2023)
  and Llama 3 (Meta 2024) leave pairs of wavelength well below the trained length ``L0``
  alone and divide those beyond it by ``s``, with a ramp between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from posenc._checks import check_even, check_float, check_int
from posenc.viz._common import new_figure, series_styles

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["rope_decay_bound", "rope_decay_figure", "rope_scalings", "rope_spectrum_figure"]


def rope_decay_bound(inv_freq: Tensor | np.ndarray, distances: np.ndarray) -> np.ndarray:
    """RoFormer's relative upper bound ``(1/(R/2)) sum_j |S_j|`` at each distance.

    Args:
        inv_freq: ``theta_i``, ``[R/2]``, in the order of the pairs (fastest first).
        distances: relative distances ``m - n``, any shape.

    Returns:
        float64 array shaped like ``distances``; ``(R/2 + 1) / 2`` at distance 0.
    """
    theta = np.asarray(inv_freq.cpu() if isinstance(inv_freq, Tensor) else inv_freq, float)
    r = np.asarray(distances, dtype=np.float64)
    partial = np.cumsum(np.exp(1j * r[..., None] * theta), axis=-1)  # S_1 .. S_{R/2}
    return np.abs(partial).mean(axis=-1)


def rope_scalings(factor: float = 8.0, original: int = 4096) -> dict[str, Mapping[str, Any] | None]:
    """The scalings drawn, by label, as Hugging Face style dicts (``None``: default).

    LongRoPE is left out: its per-pair factors are searched for each model, so there is
    no generic curve to draw.
    """
    factor = check_float("factor", factor, minimum=1.0)
    original = check_int("original", original)
    common = {"factor": factor, "original_max_position_embeddings": original}
    return {
        "default": None,
        "linear (PI)": {"rope_type": "linear", "factor": factor},
        "NTK-aware": {"rope_type": "ntk", "factor": factor},
        f"dynamic NTK at {factor:g} L0": {"rope_type": "dynamic", **common},
        "YaRN": {"rope_type": "yarn", **common},
        "Llama 3": {
            "rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0, **common,
        },
    }  # fmt: skip


def _inv_freq(head_dim: int, base: float, scaling, seq_len: int) -> tuple[np.ndarray, float]:
    from posenc import rope_inv_freq

    inv_freq, scale = rope_inv_freq(head_dim, base=base, scaling=scaling, seq_len=seq_len)
    return inv_freq.double().cpu().numpy(), float(scale)


def _label(name: str, scale: float) -> str:
    return name if abs(scale - 1.0) < 1e-12 else f"{name} (attention x{scale:.3f})"


def rope_decay_figure(
    *,
    head_dim: int = 128,
    bases: Sequence[float] = (500.0, 10000.0, 500000.0),
    base: float = 10000.0,
    factor: float = 8.0,
    original: int = 4096,
) -> Figure:
    """RoFormer's long-range decay bound against the relative distance (log axis).

    Left: the default frequencies for each of ``bases``. Right: each scaling of
    ``rope_scalings(factor, original)`` at ``base``, with the trained length ``L0`` and
    the target ``factor * L0`` marked. Each curve is the bound's mean over the integer
    distances within ±25% of each point (the exact bound oscillates too fast to read).

    Raises:
        ValueError: odd ``head_dim``, an empty or non-positive ``bases``, bad scaling
            parameters.
    """
    head_dim = check_even("head_dim", head_dim)
    if not bases:
        raise ValueError("rope_decay_figure needs at least one base, got none")
    target = int(factor * original)
    centres = np.geomspace(1, 4 * target, 90)
    # 65 distances across ±25% of each centre (rounded to integers): the curve is their mean
    spread = np.round(centres[:, None] * np.geomspace(1 / 1.25, 1.25, 65))
    fig = new_figure(14, 5.4)
    ax_base, ax_scale = fig.subplots(1, 2, sharey=True)
    fig.suptitle(
        f"RoPE long-range decay: RoFormer's bound (1/(d/2)) Σ_j |S_j|, head_dim = {head_dim}, "
        "mean over ±25% of the distance",
        fontsize=13,
    )
    panels = [(ax_base, [(f"base {b:g}", b, None) for b in bases])]
    panels += [(ax_scale, [(n, base, sc) for n, sc in rope_scalings(factor, original).items()])]
    for ax, curves in panels:
        looks = series_styles(len(curves))
        for (name, b, scaling), ls, look in zip(
            curves, ["-", "--", "-.", ":"] * 2, looks, strict=False
        ):
            b = check_float("base", b, positive=True)
            theta, scale = _inv_freq(head_dim, b, scaling, target)
            smooth = rope_decay_bound(theta, spread).mean(axis=-1)
            ax.plot(centres, smooth, lw=2, ls=ls, label=_label(name, scale), ms=5, markevery=9,
                    **look)  # fmt: skip
    ax_base.set_title("default frequencies, several bases")
    ax_scale.set_title(
        f"scalings of base {base:g}: factor s = {factor:g}, trained length L0 = {original}"
    )
    for ax in (ax_base, ax_scale):
        ax.set(xscale="log", xlabel="relative distance |m - n|")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", fontsize=9)
    for value, text, ls in (
        (original, f" L0 = {original}", "--"),
        (target, f" s·L0 = {target}", ":"),
    ):
        ax_scale.axvline(value, color="0.3", ls=ls, lw=1)
        ax_scale.text(value, 0.98, text, transform=ax_scale.get_xaxis_transform(), va="top")
    ax_base.set_ylabel("relative upper bound of q·k")
    return fig


def rope_spectrum_figure(
    *, head_dim: int = 128, base: float = 10000.0, factor: float = 8.0, original: int = 4096
) -> Figure:
    """Wavelength per dimension pair under each scaling, and the factor each applies.

    Left: ``2 pi / theta_i`` (log) per pair ``i``, with ``L0`` and ``factor * L0`` marked:
    a pair whose wavelength exceeds ``L0`` never completed a turn in training. Right:
    ``theta_default / theta_scaled`` per pair: 1 = untouched, ``factor`` = fully
    interpolated. Dynamic NTK is drawn at length ``factor * L0``.

    Raises:
        ValueError: odd ``head_dim``, bad scaling parameters.
    """
    head_dim = check_even("head_dim", head_dim)
    target = int(factor * original)
    pairs = np.arange(head_dim // 2)
    fig = new_figure(14, 5.4)
    ax_wave, ax_ratio = fig.subplots(1, 2)
    fig.suptitle(
        f"RoPE scalings: frequency per dimension pair (head_dim {head_dim}, base {base:g}, "
        f"trained length L0 = {original}, factor s = {factor:g})",
        fontsize=13,
    )
    default, _ = _inv_freq(head_dim, base, None, target)
    styles = iter(["-", "--", "-.", ":", "-", "--"])
    scalings = rope_scalings(factor, original)
    looks = iter(series_styles(len(scalings)))
    every = max(1, len(pairs) // 10)
    for name, scaling in scalings.items():
        theta, scale = _inv_freq(head_dim, base, scaling, target)
        style = {"ls": next(styles), "lw": 2.2 if name == "default" else 1.6, "ms": 5,
                 "markevery": every, **next(looks)}  # fmt: skip
        ax_wave.semilogy(pairs, 2 * np.pi / theta, label=_label(name, scale), **style)
        ax_ratio.plot(pairs, default / theta, label=name, **style)
    for value, text, ls in ((original, "L0 (trained)", "--"), (target, "s L0 (target)", ":")):
        ax_wave.axhline(value, color="0.3", ls=ls, lw=1)
        ax_wave.text(pairs[-1], value, f"{text} ", ha="right", va="bottom", fontsize=9)
    ax_wave.set(
        title="wavelength 2π / θ_i", xlabel="dimension pair i", ylabel="wavelength (positions)"
    )
    ax_ratio.axhline(factor, color="0.3", ls=":", lw=1)
    ax_ratio.set(
        title="θ_default / θ_scaled: how much each pair is slowed down",
        xlabel="dimension pair i",
        ylabel="interpolation factor",
        yscale="log",
    )
    ticks = 2.0 ** np.arange(0, int(np.log2(ax_ratio.get_ylim()[1])) + 1)
    ax_ratio.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax_ratio.minorticks_off()
    ax_wave.legend(loc="upper left", fontsize=8)
    ax_ratio.legend(loc="upper left", fontsize=8)
    for ax in (ax_wave, ax_ratio):
        ax.grid(alpha=0.3, which="both")
    return fig
