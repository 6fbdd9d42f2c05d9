"""posenc: positional encodings for transformers, exact, fast and explained.

Public API re-exports only; see each module for shapes, formulas and citations.
"""

from posenc.attention import MultiHeadAttention
from posenc.base import Compose, PositionalEncoding, Site, available, build, info, register
from posenc.encodings import (
    DefaultRope,
    DynamicNTKScaling,
    FrequencyChange,
    LearnedPositionalEncoding,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NoPE,
    NTKScaling,
    RopeScaling,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    XPos,
    YarnScaling,
    apply_rope,
    rerotate_keys,
    rope_cos_sin,
    rope_inv_freq,
    rope_weight_to_half_split,
    rope_weight_to_interleaved,
    scaling_types,
    sinusoidal_table,
)
from posenc.hf import rope_from_hf_config
from posenc.kv_cache import KVCache

__version__ = "0.1.0"

__all__ = [
    "Compose",
    "DefaultRope",
    "DynamicNTKScaling",
    "FrequencyChange",
    "KVCache",
    "LearnedPositionalEncoding",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "MultiHeadAttention",
    "NTKScaling",
    "NoPE",
    "PositionalEncoding",
    "RopeScaling",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "Site",
    "XPos",
    "YarnScaling",
    "__version__",
    "apply_rope",
    "available",
    "build",
    "info",
    "register",
    "rerotate_keys",
    "rope_cos_sin",
    "rope_from_hf_config",
    "rope_inv_freq",
    "rope_weight_to_half_split",
    "rope_weight_to_interleaved",
    "scaling_types",
    "sinusoidal_table",
]
