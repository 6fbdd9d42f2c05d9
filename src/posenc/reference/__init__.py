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
from posenc.reference.biases import (
    alibi_bias,
    alibi_slopes,
    fire_bias,
    kerple_bias,
    sandwich_bias,
    t5_bias,
    t5_relative_position_bucket,
)
from posenc.reference.content_biases import cope_bias, shaw_attention, shaw_logits
from posenc.reference.data_dependent import (
    dape_bias,
    fox_attention,
    fox_log_forget,
    path_attention,
    path_householder,
    stick_breaking_attention,
)
from posenc.reference.dual_chunk import dual_chunk_attention, dual_chunk_query_index
from posenc.reference.lie import lie_rotate, skew_expm
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
from posenc.reference.sinks import sink_attention

__all__ = [
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "alibi_bias",
    "alibi_slopes",
    "cope_bias",
    "dape_bias",
    "dual_chunk_attention",
    "dual_chunk_query_index",
    "dynamic_ntk_frequencies",
    "fire_bias",
    "fox_attention",
    "fox_log_forget",
    "interpolate_table",
    "kerple_bias",
    "lie_rotate",
    "linear_frequencies",
    "llama3_frequencies",
    "longrope_attention_factor",
    "longrope_frequencies",
    "ntk_frequencies",
    "path_attention",
    "path_householder",
    "rope_frequencies",
    "rope_rotate",
    "rope_rotation_matrix",
    "sandwich_bias",
    "shaw_attention",
    "shaw_logits",
    "sink_attention",
    "sinusoidal_frequencies",
    "sinusoidal_positional_encoding",
    "sinusoidal_positional_encoding_at",
    "skew_expm",
    "stick_breaking_attention",
    "t5_bias",
    "t5_relative_position_bucket",
    "xpos_rotate",
    "yarn_attention_factor",
    "yarn_frequencies",
]
