"""The gallery: every figure by name, for ``posenc show`` and ``docs/gallery.md``.

Shapes: ``L`` positions, ``C`` d_model, ``H`` heads, ``D`` head_dim. ``make_figure(what)``
draws one figure, by gallery name (``"rope-spectrum"``) or by encoding name (an input
encoding gets its 2x2 panel, a score encoding its bias per head, the positions of
2024-26 their effect over distance (``posenc.viz.distance``), any other its attention
maps per head); ``write_gallery(folder)`` writes them all, with the file
names ``docs/gallery.md`` links to.
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from posenc._checks import check_int
from posenc.base import Site, available, info
from posenc.viz import absolute, biases, diagrams, distance, rotary
from posenc.viz._common import save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "GALLERY",
    "FigureOptions",
    "GalleryItem",
    "figure_options",
    "make_figure",
    "write_gallery",
]


@dataclass(frozen=True)
class FigureOptions:
    """What ``posenc show`` lets a user change; ``None`` keeps each figure's default.

    Attributes:
        dim: ``C`` of absolute encodings, ``D`` of rotary/bias ones, ``C`` of diagrams.
        length: positions ``L`` (or ``T``).
        heads: number of heads ``H``.
        table: a saved learned table or lab checkpoint (see ``posenc.viz.load_table``).
    """

    dim: int | None = None
    length: int | None = None
    heads: int | None = None
    table: str | None = None

    def __post_init__(self) -> None:
        for name in ("dim", "length", "heads"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name))

    def kw(self, **names: str) -> dict[str, int]:
        """Keyword arguments ``{figure_arg: value}`` for the options that are set."""
        return {a: getattr(self, o) for a, o in names.items() if getattr(self, o) is not None}


@dataclass(frozen=True)
class GalleryItem:
    """One figure of the gallery: its ``posenc show`` name, file name and maker, and the
    ``FigureOptions`` fields it reads (the others do not change it)."""

    name: str
    filename: str
    caption: str
    make: Callable[[FigureOptions], Figure]
    options: frozenset[str] = frozenset()


def _panel(source: str, o: FigureOptions) -> Figure:
    return absolute.absolute_panel(source, **o.kw(d_model="dim", length="length"))


GALLERY: dict[str, GalleryItem] = {
    item.name: item
    for item in (
        GalleryItem("sinusoidal", "sinusoidal_panel.png",
                    "The sinusoidal table: matrix, positions, dimensions, similarity",
                    lambda o: _panel("sinusoidal", o),
                    frozenset({"dim", "length"})),
        GalleryItem("learned", "learned_panel.png",
                    "A learned table (at initialisation unless --table is given)",
                    lambda o: _panel(o.table or "learned", o),
                    frozenset({"dim", "length", "table"})),
        GalleryItem("fingerprint", "sinusoidal_encoding.svg",
                    "Sinusoidal fingerprints: one clock hand per dimension pair",
                    lambda o: diagrams.fingerprint_diagram(**o.kw(d_model="dim")),
                    frozenset({"dim"})),
        GalleryItem("rope-rotation", "rope_rotation.svg",
                    "RoPE: rotations by m theta and n theta; q.k depends on m - n only",
                    lambda o: diagrams.rope_rotation_diagram()),
        GalleryItem("similarity", "similarity.png",
                    "Dot-product and cosine similarity of positions; similarity by distance",
                    lambda o: absolute.similarity_figure(**o.kw(d_model="dim", length="length")),
                    frozenset({"dim", "length"})),
        GalleryItem("relative", "relative_position.png",
                    "M_k reconstruction error and step consistency against the offset k",
                    lambda o: absolute.relative_figure(**o.kw(d_model="dim", length="length")),
                    frozenset({"dim", "length"})),
        GalleryItem("rope-decay", "rope_decay.png",
                    "RoPE long-range decay (RoFormer 3.4.3) for bases and scalings",
                    lambda o: rotary.rope_decay_figure(**o.kw(head_dim="dim")),
                    frozenset({"dim"})),
        GalleryItem("rope-spectrum", "rope_scalings.png",
                    "Wavelength per pair under PI, NTK, dynamic NTK, YaRN and Llama 3",
                    lambda o: rotary.rope_spectrum_figure(**o.kw(head_dim="dim")),
                    frozenset({"dim"})),
        GalleryItem("biases", "bias_patterns.png",
                    "Attention-logit bias per head of every score-site encoding",
                    lambda o: biases.bias_figure(**o.kw(num_heads="heads", length="length")),
                    frozenset({"heads", "length"})),
        GalleryItem("attention", "attention_maps.png",
                    "Attention of an untrained layer per encoding, one token everywhere",
                    lambda o: biases.attention_figure(**o.kw(num_heads="heads", length="length")),
                    frozenset({"heads", "length"})),
    )
}  # fmt: skip


def figure_options(what: str) -> frozenset[str]:
    """The ``FigureOptions`` fields the figure ``what`` (gallery or encoding name) reads.

    Raises:
        ValueError: ``what`` is neither a gallery figure nor a registered encoding.
    """
    if what in GALLERY:
        return GALLERY[what].options
    if distance.has_distance_figure(what):
        gated = what in ("fox", "path")  # one curve per head of an untrained module
        return frozenset({"heads", "length"} if gated else {"length"})
    sites = info(what).sites
    if sites & Site.INPUT:
        return frozenset({"dim", "length", "table"})
    return frozenset({"heads", "length"})


def make_figure(what: str, options: FigureOptions | None = None) -> Figure:
    """The figure named ``what``: a gallery name or a registered encoding.

    Raises:
        ValueError: ``what`` is neither (the message lists both), or a bad option.
    """
    options = options or FigureOptions()
    if what in GALLERY:
        return GALLERY[what].make(options)
    if what not in available():
        raise ValueError(
            f"unknown figure or encoding {what!r}; figures: {', '.join(GALLERY)}; "
            f"encodings: {', '.join(available())}"
        )
    if distance.has_distance_figure(what):
        return distance.distance_figure(what, **options.kw(num_heads="heads", length="length"))
    sites = info(what).sites
    if sites & Site.INPUT:
        return _panel(options.table or what, options)
    if sites & Site.SCORE:
        return biases.bias_figure([what], **options.kw(num_heads="heads", length="length"))
    heads = options.heads or 4
    return biases.attention_figure(
        [what], heads=range(heads), num_heads=heads, **options.kw(length="length")
    )


def write_gallery(
    out: str | Path, options: FigureOptions | None = None, *, dpi: int = 100
) -> list[Path]:
    """Write every gallery figure into the folder ``out`` (created if its parent exists);
    return the paths written.

    With ``options.table`` the learned table of that file is drawn as well, to
    ``learned_trained_panel.png``.
    """
    options = options or FigureOptions()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(out))
    out.mkdir(exist_ok=True)  # one level: a missing parent is the user's typo
    plain = dataclasses.replace(options, table=None)
    written = [
        save_figure(item.make(plain), out / item.filename, dpi=dpi) for item in GALLERY.values()
    ]
    if options.table:
        fig = _panel(options.table, options)
        written.append(save_figure(fig, out / "learned_trained_panel.png", dpi=dpi))
    return written
