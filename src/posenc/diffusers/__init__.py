"""Diffusion and video transformers' positions, matched to diffusers: a table of families
(``families``), one door for configs (``config``), position builders for image and video
grids (``grids``) and N-D sin-cos tables (``sincos``). Imported by nothing else in posenc.
"""

from posenc.diffusers.config import diffusers_positions, from_diffusers, normalize_config
from posenc.diffusers.families import FAMILIES, Family, family_of
from posenc.diffusers.grids import (
    centred_positions,
    crop_positions,
    grid_positions,
    sincos_positions,
    text_positions,
)
from posenc.diffusers.sincos import GridSinCos

__all__ = [
    "FAMILIES",
    "Family",
    "GridSinCos",
    "centred_positions",
    "crop_positions",
    "diffusers_positions",
    "family_of",
    "from_diffusers",
    "grid_positions",
    "normalize_config",
    "sincos_positions",
    "text_positions",
]
