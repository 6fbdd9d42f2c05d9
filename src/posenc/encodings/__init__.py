"""One module per encoding family; importing this package registers all of them."""

from posenc.encodings.learned import LearnedPositionalEncoding
from posenc.encodings.nope import NoPE
from posenc.encodings.rope import FrequencyChange, RotaryEmbedding
from posenc.encodings.rope_apply import apply_rope
from posenc.encodings.rope_functional import (
    rerotate_keys,
    rope_cos_sin,
    rope_weight_to_half_split,
    rope_weight_to_interleaved,
)
from posenc.encodings.rope_scaling import (
    DefaultRope,
    LinearScaling,
    RopeScaling,
    rope_inv_freq,
    scaling_from_dict,
    scaling_types,
)
from posenc.encodings.rope_scaling_extended import (
    DynamicNTKScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    YarnScaling,
)
from posenc.encodings.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table
from posenc.encodings.xpos import XPos, xpos_scale

__all__ = [
    "DefaultRope",
    "DynamicNTKScaling",
    "FrequencyChange",
    "LearnedPositionalEncoding",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "NoPE",
    "RopeScaling",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "XPos",
    "YarnScaling",
    "apply_rope",
    "rerotate_keys",
    "rope_cos_sin",
    "rope_inv_freq",
    "rope_weight_to_half_split",
    "rope_weight_to_interleaved",
    "scaling_from_dict",
    "scaling_types",
    "sinusoidal_table",
    "xpos_scale",
]
