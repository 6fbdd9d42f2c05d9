"""posenc: positional encodings for transformers, exact, fast and explained.

Public API re-exports only; see each module for shapes, formulas and citations.
"""

from posenc.attention import MultiHeadAttention
from posenc.base import Compose, PositionalEncoding, Site, available, build, info, register
from posenc.encodings import (
    LearnedPositionalEncoding,
    NoPE,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)
from posenc.kv_cache import KVCache

__version__ = "0.1.0"

__all__ = [
    "Compose",
    "KVCache",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "NoPE",
    "PositionalEncoding",
    "SinusoidalPositionalEncoding",
    "Site",
    "__version__",
    "available",
    "build",
    "info",
    "register",
    "sinusoidal_table",
]
