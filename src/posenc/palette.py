"""One colour and one marker per encoding, the same in every figure, run and document.

The lab's plots (``posenc.lab.plots``) and the figures of ``posenc.viz`` draw every
encoding with ``style(label)``. Rows derived from an encoding (``"rope +yarn"``,
``"learned +interpolate"``, ``"rope +linear +ft"``) take the colour and marker of their
variant and a line style by kind: solid for a trained model, dashed for a scaling
applied at evaluation time, dotted for an interpolated table, dash-dot for a fine-tune.
Colours are the colour-blind-safe Tableau 10 (matplotlib's default cycle) plus greys.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["ENCODING_STYLES", "VARIANT_STYLES", "Style", "style"]

#: ``name: (colour, marker)`` of each registered encoding.
ENCODING_STYLES: dict[str, tuple[str, str]] = {
    "nope": ("#7f7f7f", "o"),
    "sinusoidal": ("#ff7f0e", "s"),
    "learned": ("#8c564b", "P"),
    "rope": ("#1f77b4", "o"),
    "xpos": ("#17becf", "h"),
    "alibi": ("#2ca02c", "^"),
    "t5": ("#d62728", "v"),
    "shaw": ("#e377c2", "<"),
    "kerple": ("#bcbd22", ">"),
    "sandwich": ("#9467bd", "d"),
    "fire": ("#393b79", "*"),
    "cope": ("#637939", "X"),
}
#: ``modifier: (colour, marker)`` of the rows derived from a trained model.
VARIANT_STYLES: dict[str, tuple[str, str]] = {
    "linear": ("#aec7e8", "s"),
    "ntk": ("#9edae5", "D"),
    "dynamic": ("#c5b0d5", "p"),
    "yarn": ("#ff9896", "*"),
    "interpolate": ("#c49c94", "X"),
}
_FALLBACK = ("#843c39", "#7b4173", "#8ca252", "#bd9e39", "#ad494a", "#3182bd")
_FALLBACK_MARKERS = ("o", "s", "^", "v", "D", "P")
_LINES = {"trained": "-", "scaling": "--", "interpolate": ":", "finetune": "-."}


@dataclass(frozen=True)
class Style:
    """How one row is drawn: matplotlib colour, marker and line style."""

    color: str
    marker: str
    linestyle: str


def style(label: str) -> Style:
    """The style of a row label ``"<encoding> [+<variant>] [+ft]"``.

    An encoding not in ``ENCODING_STYLES`` (registered by a user) gets a colour and marker
    derived from a hash of its name, so it too is the same in every run.
    """
    parts = label.split()
    name = parts[0] if parts else label
    mods = [p.lstrip("+") for p in parts[1:]]
    variant = next((m for m in mods if m in VARIANT_STYLES), None)
    if variant is not None:
        color, marker = VARIANT_STYLES[variant]
    elif name in ENCODING_STYLES:
        color, marker = ENCODING_STYLES[name]
    else:
        index = hashlib.sha256(name.encode()).digest()[0]
        color = _FALLBACK[index % len(_FALLBACK)]
        marker = _FALLBACK_MARKERS[index // len(_FALLBACK) % len(_FALLBACK_MARKERS)]
    if "ft" in mods:
        kind = "finetune"
    elif variant == "interpolate":
        kind = "interpolate"
    elif variant is not None:
        kind = "scaling"
    else:
        kind = "trained"
    return Style(color, marker, _LINES[kind])
