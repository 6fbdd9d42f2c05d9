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
from posenc.reference.rope import (
    dynamic_ntk_frequencies,
    linear_frequencies,
    llama3_frequencies,
    longrope_attention_factor,
    longrope_frequencies,
    ntk_frequencies,
    rope_frequencies,
    rope_rotate,
    rope_rotation_matrix,
    xpos_rotate,
    yarn_attention_factor,
    yarn_frequencies,
)

__all__ = [
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "dynamic_ntk_frequencies",
    "interpolate_table",
    "linear_frequencies",
    "llama3_frequencies",
    "longrope_attention_factor",
    "longrope_frequencies",
    "ntk_frequencies",
    "rope_frequencies",
    "rope_rotate",
    "rope_rotation_matrix",
    "sinusoidal_frequencies",
    "sinusoidal_positional_encoding",
    "sinusoidal_positional_encoding_at",
    "xpos_rotate",
    "yarn_attention_factor",
    "yarn_frequencies",
]
