"""The lab's figures in panels by family: one axes per family of ``posenc.palette.PANELS``
that has a row (absolute positions, RoPE and its scalings, attention biases, fine-tuned
rows, data-dependent and other), in that order, each with its own legend under it.

A figure with many rows reads at a glance when each panel holds a handful: within a panel
rows differ by colour, marker and line style (``posenc.palette.styles`` over the panel's
rows) and sit slightly apart on the length axis, so their intervals do not merge. The
panels share one y axis where the values span at most ``SHARE_UP_TO`` (a ratio on a log
axis), so a height means the same in every panel.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from posenc.palette import PANELS, panel

__all__ = ["SHARE_UP_TO", "by_panel", "grid", "label_panel", "shares"]

#: The largest high / low of a log-scaled figure whose panels share one y axis.
SHARE_UP_TO = 10.0
_COLUMNS = {1: 1, 2: 2, 3: 3, 4: 2}  # panels -> columns; more than four: three columns


def by_panel(labels: Iterable[str]) -> dict[str, list[str]]:
    """``{panel key: [row labels in their order]}`` in ``PANELS`` order, empty panels left out."""
    groups: dict[str, list[str]] = {key: [] for key in PANELS}
    for label in labels:
        groups[panel(label)].append(label)
    return {key: rows for key, rows in groups.items() if rows}


def shares(low: float, high: float, *, log: bool) -> bool:
    """Whether the panels share one y axis: always on a linear axis, on a log axis while
    ``high / low <= SHARE_UP_TO``."""
    return not log or high / low <= SHARE_UP_TO


def grid(plt, keys: list[str], *, sharey: bool):
    """A figure with one axes per panel key (three columns at most): ``(fig, {key: ax})``."""
    columns = _COLUMNS.get(len(keys), 3)
    rows = math.ceil(len(keys) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.4 * columns, 3.9 * rows + 0.4), dpi=120,
                             sharey=sharey, squeeze=False, layout="constrained")  # fmt: skip
    flat = [ax for line in axes for ax in line]
    for ax in flat[len(keys) :]:
        ax.remove()
    if sharey:
        for ax in flat[: len(keys)]:
            ax.tick_params(labelleft=True)  # every panel reads alone
    return fig, dict(zip(keys, flat, strict=False))


def label_panel(ax, key: str) -> None:
    """The panel's family as its title and its rows' legend under it, two columns."""
    ax.set_title(PANELS[key][0], fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, fontsize=7, ncols=2, loc="upper center",
              bbox_to_anchor=(0.5, -0.16), frameon=False)  # fmt: skip
