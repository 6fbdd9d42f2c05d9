"""Float64 NumPy reference implementations, written from the papers' formulas.

The oracle the torch code in ``posenc.encodings`` is tested against; nothing here
imports it. One module per family; this package re-exports their public names.
"""

from posenc.reference.absolute import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    interpolate_table,
    sinusoidal_frequencies,
    sinusoidal_positional_encoding,
    sinusoidal_positional_encoding_at,
)

__all__ = [
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "interpolate_table",
    "sinusoidal_frequencies",
    "sinusoidal_positional_encoding",
    "sinusoidal_positional_encoding_at",
]
