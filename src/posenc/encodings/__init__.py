"""One module per encoding family; importing this package registers all of them."""

from posenc.encodings.learned import LearnedPositionalEncoding
from posenc.encodings.nope import NoPE
from posenc.encodings.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table

__all__ = [
    "LearnedPositionalEncoding",
    "NoPE",
    "SinusoidalPositionalEncoding",
    "sinusoidal_table",
]
