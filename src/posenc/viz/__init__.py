"""Figures of positional encodings: functions that return ``matplotlib`` figures.

Shapes: ``L`` positions, ``C`` d_model, ``H`` heads, ``D`` head_dim, ``T`` length.
Nothing here imports matplotlib until a figure is made, and figures never touch
``pyplot`` (headless, no global state): save them with ``save_figure(fig, "x.png")``
or ``.svg``. ``posenc show`` (and ``write_gallery``) reach every figure by name.

=========================== ==================================================
``absolute_panel``          2x2 panel of an absolute table (name, tensor, file)
``similarity_figure``       ``PE PE^T``, cosine similarity, similarity by distance
``relative_figure``         M_k error and step consistency against the offset
``fingerprint_diagram``     sinusoidal clock hands and fingerprints (SVG)
``rope_rotation_diagram``   RoPE's rotation of one feature pair (SVG)
``rope_decay_figure``       RoFormer's long-range decay bound, bases and scalings
``rope_spectrum_figure``    wavelength per pair under each RoPE scaling
``bias_figure``             score bias per head of the score-site encodings
``attention_figure``        attention maps of an untrained layer per encoding
=========================== ==================================================
"""

from posenc.viz._common import absolute_table, load_table, save_figure
from posenc.viz.absolute import absolute_panel, relative_figure, similarity_figure
from posenc.viz.biases import attention_figure, attention_probs, bias_figure, score_biases
from posenc.viz.diagrams import fingerprint_diagram, rope_rotation_diagram
from posenc.viz.gallery import GALLERY, FigureOptions, make_figure, write_gallery
from posenc.viz.rotary import (
    rope_decay_bound,
    rope_decay_figure,
    rope_scalings,
    rope_spectrum_figure,
)

__all__ = [
    "GALLERY",
    "FigureOptions",
    "absolute_panel",
    "absolute_table",
    "attention_figure",
    "attention_probs",
    "bias_figure",
    "fingerprint_diagram",
    "load_table",
    "make_figure",
    "relative_figure",
    "rope_decay_bound",
    "rope_decay_figure",
    "rope_rotation_diagram",
    "rope_scalings",
    "rope_spectrum_figure",
    "save_figure",
    "score_biases",
    "similarity_figure",
    "write_gallery",
]
