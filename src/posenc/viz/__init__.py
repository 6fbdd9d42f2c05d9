"""Figures of positional encodings: functions that return ``matplotlib`` figures.

Shapes: ``L`` positions, ``C`` d_model, ``H`` heads, ``D`` head_dim, ``T`` length.
Nothing here imports matplotlib until a figure is made, and figures never touch
``pyplot`` (headless, no global state): save them with ``save_figure(fig, "x.png")``
or ``.svg``. ``posenc show`` (and ``write_gallery``) reach every figure by name.
"""

from posenc.viz._common import absolute_table, load_table, save_figure
from posenc.viz.absolute import absolute_panel, relative_figure, similarity_figure
from posenc.viz.diagrams import fingerprint_diagram, rope_rotation_diagram

__all__ = [
    "absolute_panel",
    "absolute_table",
    "fingerprint_diagram",
    "load_table",
    "relative_figure",
    "rope_rotation_diagram",
    "save_figure",
    "similarity_figure",
]
