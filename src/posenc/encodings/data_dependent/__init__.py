"""Data-dependent attention: positions that come from the content (2024-25).

FoX's forget gates, stick-breaking and PaTH's Householder products compute the attention
weights themselves (WEIGHTS site, ``posenc.base``); DAPE is a SCORE-site bias computed
from the logits.
"""

from posenc.encodings.data_dependent.dape import DAPE, dape_bias
from posenc.encodings.data_dependent.fox import ForgettingAttention, fox_weights
from posenc.encodings.data_dependent.path import PaTH, path_weights
from posenc.encodings.data_dependent.stick_breaking import (
    StickBreakingAttention,
    stick_breaking_weights,
)

__all__ = [
    "DAPE",
    "ForgettingAttention",
    "PaTH",
    "StickBreakingAttention",
    "dape_bias",
    "fox_weights",
    "path_weights",
    "stick_breaking_weights",
]
