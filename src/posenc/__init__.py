"""posenc: positional encodings for transformers, exact, fast and explained.

Public API re-exports only; see each module for shapes, formulas and citations.
"""

from typing import TYPE_CHECKING

from posenc.attention import MultiHeadAttention
from posenc.base import Compose, PositionalEncoding, Site, available, build, info, register
from posenc.encodings import (
    FIRE,
    KERPLE,
    ALiBi,
    AxialRope,
    CoPE,
    DefaultRope,
    DisentangledAttention,
    DynamicNTKScaling,
    FourierRope,
    FrequencyChange,
    LearnedPositionalEncoding,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    MLARope,
    MRoPE,
    NoPE,
    NTKAlphaScaling,
    NTKScaling,
    PositionTemperature,
    ProportionalScaling,
    RopeScaling,
    RotaryEmbedding,
    Sandwich,
    ShawRelativePosition,
    SinusoidalPositionalEncoding,
    T5RelativeBias,
    VideoRoPE,
    XPos,
    YarnScaling,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    axial_positions,
    dinov3_positions,
    mrope_decode_positions,
    mrope_position_ids,
    rerotate_keys,
    rope_cos_sin,
    rope_inv_freq,
    rope_weight_to_half_split,
    rope_weight_to_interleaved,
    scaling_types,
    sinusoidal_table,
    t5_relative_position_bucket,
    videorope_position_ids,
)
from posenc.kv_cache import KVCache

if TYPE_CHECKING:  # resolved on first use by __getattr__ below; named here for type
    # checkers and the API reference
    from posenc.diffusers import from_diffusers
    from posenc.hf import from_hf_config, rope_from_hf_config

__version__ = "0.1.0"

__all__ = [
    "FIRE",
    "KERPLE",
    "ALiBi",
    "AxialRope",
    "CoPE",
    "Compose",
    "DefaultRope",
    "DisentangledAttention",
    "DynamicNTKScaling",
    "FourierRope",
    "FrequencyChange",
    "KVCache",
    "LearnedPositionalEncoding",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "MLARope",
    "MRoPE",
    "MultiHeadAttention",
    "NTKAlphaScaling",
    "NTKScaling",
    "NoPE",
    "PositionTemperature",
    "PositionalEncoding",
    "ProportionalScaling",
    "RopeScaling",
    "RotaryEmbedding",
    "Sandwich",
    "ShawRelativePosition",
    "SinusoidalPositionalEncoding",
    "Site",
    "T5RelativeBias",
    "VideoRoPE",
    "XPos",
    "YarnScaling",
    "__version__",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "available",
    "axial_positions",
    "build",
    "dinov3_positions",
    "from_diffusers",
    "from_hf_config",
    "info",
    "mrope_decode_positions",
    "mrope_position_ids",
    "register",
    "rerotate_keys",
    "rope_cos_sin",
    "rope_from_hf_config",
    "rope_inv_freq",
    "rope_weight_to_half_split",
    "rope_weight_to_interleaved",
    "scaling_types",
    "sinusoidal_table",
    "t5_relative_position_bucket",
    "videorope_position_ids",
]

#: Submodules reached as attributes after ``import posenc`` (imported on first use: they
#: pull in matplotlib, the lab's training loop, the benchmark harness, transformers or
#: diffusers interop), and the names re-exported from them (``from posenc import
#: from_hf_config`` works as for any other name).
_LAZY_SUBMODULES = frozenset(
    {
        "analysis",
        "bench",
        "diffusers",
        "explain",
        "extend",
        "hf",
        "lab",
        "reference",
        "triton",
        "viz",
    }
)
_LAZY_NAMES = {
    "from_diffusers": "posenc.diffusers",
    "from_hf_config": "posenc.hf",
    "rope_from_hf_config": "posenc.hf",
}


def __getattr__(name: str) -> object:
    """Import ``posenc.viz``, ``posenc.hf``, ``posenc.from_hf_config``, ... on first access."""
    import importlib

    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"posenc.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    raise AttributeError(f"module 'posenc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_SUBMODULES, *_LAZY_NAMES})
