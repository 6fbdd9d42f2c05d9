"""The diffusion transformers' positions: one table, one row per family of diffusers model
classes (``posenc.diffusers.image``, ``.tables``, ``.video``, ``.audio``).

A row says which posenc module a model's config gives and where its image/video tokens
sit. The RoPE families are all ``AxialRope`` with one feature block per axis and
``f = theta ** (-2i / S_b)`` in block ``b`` of ``S_b`` features (Su et al. 2021,
RoFormer, eq. 34, per axis); they differ in their block sizes, ``theta``, pair layout and
positions. The sin-cos families are ``GridSinCos`` tables; the audio models' 1-D RoPE is
``RotaryEmbedding``.
"""

from __future__ import annotations

from posenc.diffusers._common import Family
from posenc.diffusers.audio import AUDIO_FAMILIES
from posenc.diffusers.image import IMAGE_FAMILIES
from posenc.diffusers.tables import TABLE_FAMILIES
from posenc.diffusers.video import VIDEO_FAMILIES

__all__ = ["FAMILIES", "Family", "family_of"]

FAMILIES: tuple[Family, ...] = IMAGE_FAMILIES + TABLE_FAMILIES + VIDEO_FAMILIES + AUDIO_FAMILIES


def family_of(class_name: str) -> Family:
    """The row of a diffusers model class.

    Raises:
        ValueError: a class that is not in the table (the message lists them).
    """
    for family in FAMILIES:
        if class_name in family.classes:
            return family
    known = sorted(name for family in FAMILIES for name in family.classes)
    raise ValueError(
        f"no positions known for diffusers class {class_name!r}; known: {', '.join(known)}"
    )
