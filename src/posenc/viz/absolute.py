"""Figures of absolute encodings (tables ``PE [L, C]`` added to the token embeddings).

Shapes: ``L`` positions, ``C`` d_model. Every function takes a *source*: a registered
encoding name acting at the input site (``"sinusoidal"``, ``"learned"``), a ``[L, C]``
tensor or array, or the path of a saved table or lab checkpoint (see
``posenc.viz.load_table``).

* ``absolute_panel``: the four views of Vaswani et al. 2017's section 3.5 encoding as
  usually drawn — the matrix, a few positions across dimensions, a few dimensions across
  positions, and the similarity of every pair of positions;
* ``similarity_figure``: ``PE PE^T`` and the cosine similarity, with the mean similarity
  by distance ``|p1 - p2|`` (constant along diagonals = Toeplitz = relative);
* ``relative_figure``: how far ``PE[p + k]`` is from the sinusoidal rotation ``M_k PE[p]``
  and how consistent the step ``PE[p + k] - PE[p]`` is, against the offset ``k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from posenc import analysis
from posenc.viz._common import absolute_table, heatmap, new_figure, series_styles

#: One colour range for cosine similarity in every panel and figure (it lies in [-1, 1]).
COSINE = {"cmap": "RdBu_r", "label": "cosine", "limits": (-1.0, 1.0)}

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["absolute_panel", "relative_figure", "similarity_figure"]

Source = str | Path | Tensor | np.ndarray

POSITIONS = (0, 10, 20, 50, 99)


def _dims(d_model: int) -> list[int]:
    """A fast, a middle and a slow (sin, cos) pair: 0/1, 10/11, 50/51 at C = 128."""
    pairs = sorted({0, round(d_model * 10 / 128) // 2 * 2, round(d_model * 50 / 128) // 2 * 2})
    return [d for p in pairs for d in (p, p + 1) if d < d_model]


def absolute_panel(
    source: Source = "sinusoidal",
    *,
    d_model: int = 128,
    length: int = 100,
    key: str | None = None,
    title: str | None = None,
) -> Figure:
    """The 2x2 panel of an absolute encoding's table.

    Top left: the table (positions x dimensions). Top right: the encodings of positions
    0/10/20/50/99 over the first 50 dimensions. Bottom left: dimensions 0/1, 10/11, 50/51
    (scaled with ``C``) over positions. Bottom right: cosine similarity of every pair.

    Args:
        source: encoding name, table, or file (module docstring).
        d_model: ``C`` of a built encoding.
        length: ``L`` of a built encoding.
        key: state-dict key of the table when ``source`` is a file.
        title: figure title (default: the source and the table's shape).

    Raises:
        ValueError: see ``posenc.viz.absolute_table``.
    """
    table, label = absolute_table(source, d_model=d_model, length=length, key=key)
    length, d_model = table.shape
    fig = new_figure(12, 7.8)
    (ax_map, ax_pos), (ax_dim, ax_sim) = fig.subplots(2, 2)
    fig.suptitle(title or f"{label}: {length} positions x {d_model} dimensions", fontsize=14)

    heatmap(ax_map, table, cmap="RdBu_r", label="value", symmetric=True)
    ax_map.set(
        title="encoding matrix (the table added to the embeddings)",
        xlabel="dimension",
        ylabel="position",
    )

    shown = min(50, d_model)
    rows = [(f"pos {p}", table[p, :shown]) for p in POSITIONS if p < length]
    _stacked(ax_pos, np.arange(shown), rows, xlabel="dimension")
    ax_pos.set_title(f"encoding of a few positions (first {shown} dims)")
    kinds = ("sin", "cos") if label == "sinusoidal" else ("", "")
    rows = [(f"dim {d} {kinds[d % 2]}", table[:, d]) for d in _dims(d_model)]
    _stacked(ax_dim, np.arange(length), rows, xlabel="position")
    ax_dim.set_title("a few dimensions across positions")

    heatmap(ax_sim, analysis.cosine_similarity_matrix(table), **COSINE)
    ax_sim.set(title="cosine similarity of positions", xlabel="position", ylabel="position")
    return fig


def _stacked(ax: Axes, x: np.ndarray, rows: list[tuple[str, np.ndarray]], *, xlabel: str) -> None:
    """Curves one below the other (first on top); each row's zero line is a y tick."""
    scale = max(float(np.abs(y).max()) for _, y in rows) or 1.0
    step = 2.4 * scale
    for i, ((_, y), look) in enumerate(zip(rows, series_styles(len(rows)), strict=True)):
        ax.axhline(-i * step, color="0.75", lw=0.8)
        ax.plot(x, y - i * step, lw=1.4, color=look["color"], marker=look["marker"], ms=3,
                markevery=max(1, len(x) // 12))  # fmt: skip
    ax.set_yticks([-i * step for i in range(len(rows))], [label for label, _ in rows])
    ax.set(xlabel=xlabel, ylabel=f"value (each row spans ±{scale:.2g})")
    ax.grid(axis="x", alpha=0.3)


def similarity_figure(
    sources: Sequence[Source] = ("sinusoidal", "learned"),
    *,
    d_model: int = 128,
    length: int = 100,
) -> Figure:
    """Dot-product and cosine-similarity matrices, one row per source.

    The third column is the mean cosine similarity of pairs ``|p1 - p2| = k`` with its
    spread (min to max over the pairs): a band of zero width means the matrix is
    Toeplitz, i.e. the similarity depends on the offset only.

    Raises:
        ValueError: an empty ``sources``; see ``posenc.viz.absolute_table``.
    """
    if not sources:
        raise ValueError("similarity_figure needs at least one source, got none")
    tables = [absolute_table(s, d_model=d_model, length=length) for s in sources]
    fig = new_figure(14, 3.9 * len(tables))
    axes = fig.subplots(len(tables), 3, squeeze=False)
    fig.suptitle("similarity of positions: PE PE^T and cosine", fontsize=14)
    for (table, label), (ax_dot, ax_cos, ax_k) in zip(tables, axes, strict=True):
        heatmap(ax_dot, analysis.dot_product_distance(table), cmap="magma", label="dot product")
        ax_dot.set(xlabel="position", ylabel="position")
        ax_dot.set_title(f"{label}: PE PE^T", fontsize=11)
        cos = analysis.cosine_similarity_matrix(table)
        heatmap(ax_cos, cos, **COSINE)
        ax_cos.set(xlabel="position", ylabel="position")
        ax_cos.set_title(f"{label}: cosine similarity", fontsize=11)
        offsets = np.arange(table.shape[0])
        diags = [np.diagonal(cos, k) for k in offsets]
        mean = np.array([d.mean() for d in diags])
        (look,) = series_styles(1)
        ax_k.fill_between(offsets, [d.min() for d in diags], [d.max() for d in diags],
                          color=look["color"], alpha=0.3, label="min-max")  # fmt: skip
        ax_k.plot(offsets, mean, lw=1.6, label="mean", color=look["color"])
        ax_k.set(xlabel="distance |p1 - p2|", ylabel="cosine similarity")
        ax_k.set_title(f"{label}: cosine by distance", fontsize=11)
        ax_k.legend(loc="upper right", fontsize=9)
        ax_k.grid(alpha=0.3)
    return fig


def relative_figure(
    sources: Sequence[Source] = ("sinusoidal", "learned"),
    *,
    d_model: int = 128,
    length: int = 100,
    max_offset: int = 50,
) -> Figure:
    """M_k reconstruction error and difference consistency against the offset ``k``.

    Left: ``max_p ||M_k PE[p] - PE[p + k]||`` (``posenc.analysis.relative_position_matrix``;
    log scale), rounding-level for the sinusoidal table, large for anything else. Right:
    mean and minimum cosine similarity of successive steps ``PE[p + k] - PE[p]``
    (``posenc.analysis.difference_consistency``).

    Raises:
        ValueError: an empty ``sources``, ``max_offset`` < 1; see ``absolute_table``.
    """
    if not sources:
        raise ValueError("relative_figure needs at least one source, got none")
    if max_offset < 1:
        raise ValueError(f"max_offset must be >= 1, got {max_offset}")
    fig = new_figure(13, 4.8)
    ax_err, ax_cons = fig.subplots(1, 2)
    fig.suptitle("relative position: PE[p + k] from PE[p]", fontsize=14)
    for source, look in zip(sources, series_styles(len(sources)), strict=True):
        table, label = absolute_table(source, d_model=d_model, length=length)
        offsets = np.arange(1, min(max_offset, table.shape[0] - 2) + 1)
        errors = [analysis.relative_position_matrix(table, int(k))[1] for k in offsets]
        every = max(1, len(offsets) // 12)
        ax_err.semilogy(offsets, np.maximum(errors, 1e-17), label=label, ms=4, **look)
        consistency = [analysis.difference_consistency(table, int(k)) for k in offsets]
        ax_cons.plot(offsets, [c["mean"] for c in consistency], label=label, ms=4,
                     markevery=every, **look)  # fmt: skip
        ax_cons.plot(offsets, [c["min"] for c in consistency], ls="--", lw=1, ms=4,
                     markevery=every, **look)  # fmt: skip
    ax_err.set(
        title="M_k reconstruction error (sinusoidal M_k)",
        xlabel="offset k",
        ylabel="max_p ||M_k PE[p] - PE[p+k]||",
    )
    ax_cons.set(
        title="consistency of PE[p+k] - PE[p] across p (solid mean, dashed min)",
        xlabel="offset k",
        ylabel="cosine of successive differences",
        ylim=(-1.05, 1.05),
    )
    for ax, where in ((ax_err, "center right"), (ax_cons, "lower right")):
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc=where, fontsize=9)
    return fig
