"""One colour and one marker per encoding, the same in every figure, run and document.

The lab's plots (``posenc.lab.plots``) and the figures of ``posenc.viz`` draw every
encoding with ``style(label)``. Rows derived from an encoding (``"rope +yarn"``,
``"learned +interpolate"``, ``"rope +linear +ft"``) take the colour and marker of their
variant and a line style by kind: solid for a trained model, dashed for a scaling
applied at evaluation time, dotted for an interpolated table, dash-dot for a fine-tune.
Every further modifier (``+ft``, ``+decoded``, ``+hf``) darkens the colour one step and
moves the marker along ``MARKERS`` and, on a scaling, draws a dash-dot-dot line with a
hollow marker, so ``rope +ft`` never looks like ``rope`` nor ``rope +ntk +hf`` like
``rope +ntk``; ``styles`` resolves what a figure's rows would still share. Every colour
keeps a contrast of at least ``MIN_CONTRAST`` against a white background (WCAG 2.1's 3:1
for graphics): no pale line vanishes.

``panel(label)`` names the family a row is drawn with in the lab's figures (``PANELS``):
absolute positions, RoPE and its scalings, attention biases, fine-tuned rows, and
data-dependent or other encodings (an unknown name goes to the last).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, replace

__all__ = [
    "ENCODING_STYLES",
    "MARKERS",
    "MIN_CONTRAST",
    "PANELS",
    "VARIANT_STYLES",
    "Style",
    "contrast",
    "panel",
    "style",
    "styles",
]

#: ``name: (colour, marker)`` of each registered encoding.
ENCODING_STYLES: dict[str, tuple[str, str]] = {
    "nope": ("#7f7f7f", "o"),
    "sinusoidal": ("#d95f02", "s"),
    "learned": ("#8c564b", "P"),
    "rope": ("#1f77b4", "o"),
    "xpos": ("#0f7f8a", "h"),
    "alibi": ("#238b23", "^"),
    "t5": ("#d62728", "v"),
    "shaw": ("#c2378f", "<"),
    "kerple": ("#7a7a00", ">"),
    "sandwich": ("#9467bd", "d"),
    "fire": ("#393b79", "*"),
    "cope": ("#637939", "X"),
    "p_rope": ("#08519c", "D"),
    "fox": ("#a63603", "P"),
    "stick_breaking": ("#6a3d9a", "h"),
    "path": ("#8e0152", "p"),
}
#: ``modifier: (colour, marker)`` of the rows derived from a trained model.
VARIANT_STYLES: dict[str, tuple[str, str]] = {
    "linear": ("#5e3c99", "s"),
    "ntk": ("#00796b", "D"),
    "dynamic": ("#b8500b", "p"),
    "yarn": ("#c51b4a", "*"),
    "interpolate": ("#6d4c41", "X"),
}
#: The markers, in the order a further modifier moves along.
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "p", "<", ">", "d", "H", "8")
#: The least contrast of a colour against white (WCAG 2.1, non-text graphics).
MIN_CONTRAST = 3.0
_FALLBACK = ("#843c39", "#7b4173", "#5f7a1f", "#8a6d00", "#ad494a", "#2166ac")
_FALLBACK_MARKERS = ("o", "s", "^", "v", "D", "P")
_LINES = {"trained": "-", "scaling": "--", "interpolate": ":", "finetune": "-."}
_FURTHER_LINE = (0, (5, 1.5, 1, 1.5, 1, 1.5))  # dash-dot-dot: a scaling as a runtime reads it
_ROTARY = "rope xpos p_rope fope axial_rope comrope liere mla_rope mrope video_rope temperature"
#: ``panel: (title, encodings)`` in the order the lab's figures draw them; fine-tuned rows
#: (``+ft``) go to ``"finetuned"`` whatever their encoding, unknown names to ``"other"``.
PANELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "absolute": ("absolute positions and NoPE", ("nope", "sinusoidal", "learned")),
    "rope": ("RoPE and its training-free scalings", tuple(_ROTARY.split())),
    "bias": (
        "attention biases",
        ("alibi", "t5", "shaw", "kerple", "sandwich", "fire", "cope", "disentangled"),
    ),
    "finetuned": ("fine-tuned at a longer length (+ft)", ()),
    "other": (
        "data-dependent and other positions",
        ("fox", "stick_breaking", "path", "dape", "dual_chunk"),
    ),
}


def contrast(color: str) -> float:
    """The WCAG 2.1 contrast ratio of ``#rrggbb`` against white (1 to 21)."""
    channels = [int(color.lstrip("#")[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return 1.05 / (luminance + 0.05)


def _darker(color: str, steps: int) -> str:
    """``color`` with each channel scaled by 0.72 per step (darker keeps the contrast)."""
    channels = [int(color.lstrip("#")[i : i + 2], 16) for i in (0, 2, 4)]
    return "#" + "".join(f"{round(c * 0.72**steps):02x}" for c in channels)


def _shifted(marker: str, steps: int) -> str:
    at = MARKERS.index(marker) if marker in MARKERS else 0
    return MARKERS[(at + steps) % len(MARKERS)]


@dataclass(frozen=True)
class Style:
    """How one row is drawn: matplotlib colour, marker and line style."""

    color: str
    marker: str
    linestyle: str | tuple
    fill: str = "full"  # matplotlib's fillstyle: "none" draws the marker hollow


def panel(label: str) -> str:
    """The key of ``PANELS`` that draws the row ``"<encoding> [+<variant>] [+ft]"``."""
    parts = label.split()
    if "+ft" in parts[1:]:
        return "finetuned"
    name = parts[0] if parts else label
    return next((key for key, (_, names) in PANELS.items() if name in names), "other")


def style(label: str) -> Style:
    """The style of a row label ``"<encoding> [+<variant>] [+ft]"``.

    An encoding not in ``ENCODING_STYLES`` (registered by a user) gets a colour and marker
    derived from a hash of its name, so it too is the same in every run.
    """
    parts = label.split()
    name = parts[0] if parts else label
    mods = [p.lstrip("+") for p in parts[1:]]
    variant = next((m for m in mods if m in VARIANT_STYLES), None)
    further = len(mods) - (variant is not None)  # +ft, +decoded, +hf, ...
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
    line, fill = _LINES[kind], "full"
    if further:
        color, marker = _darker(color, further), _shifted(marker, further)
        if kind == "scaling":
            line, fill = _FURTHER_LINE, "none"
    return Style(color, marker, line, fill)


def styles(labels: Iterable[str]) -> dict[str, Style]:
    """``style`` of each label of one figure, made distinct: a row whose colour and
    marker an earlier row already has takes a darker shade and the next marker."""
    out: dict[str, Style] = {}
    seen: set[tuple[str, str]] = set()
    for label in labels:
        look = style(label)
        steps = 0
        while (look.color, look.marker) in seen:
            steps += 1
            base = style(label)
            look = replace(
                base, color=_darker(base.color, steps), marker=_shifted(base.marker, steps)
            )
        seen.add((look.color, look.marker))
        out[label] = look
    return out
