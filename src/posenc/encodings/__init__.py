"""One module per encoding family; importing this package registers all of them."""

from posenc.encodings.alibi import ALiBi, alibi_bias, alibi_slopes
from posenc.encodings.cope import CoPE, cope_bias, cope_positions
from posenc.encodings.data_dependent import (
    DAPE,
    ForgettingAttention,
    PaTH,
    StickBreakingAttention,
    dape_bias,
    fox_weights,
    path_weights,
    stick_breaking_weights,
)
from posenc.encodings.disentangled import (
    DisentangledAttention,
    RelativeEmbeddingTable,
    disentangled_bias,
    disentangled_relative_index,
    log_bucket_position,
)
from posenc.encodings.dual_chunk import DualChunkAttention, dual_chunk_indices
from posenc.encodings.fire import FIRE, fire_bias, fire_normalized_distance
from posenc.encodings.kerple import KERPLE, KERPLE_KERNELS, kerple_bias
from posenc.encodings.learned import LearnedPositionalEncoding
from posenc.encodings.nope import NoPE
from posenc.encodings.rotary.apply import apply_rope
from posenc.encodings.rotary.axial import AxialRope, axial_positions, dinov3_positions
from posenc.encodings.rotary.context_scaling import (
    DynamicNTKScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    YarnScaling,
)
from posenc.encodings.rotary.fourier import FourierRope, fope_frequencies
from posenc.encodings.rotary.functional import (
    rerotate_keys,
    rope_cos_sin,
    rope_weight_to_half_split,
    rope_weight_to_interleaved,
)
from posenc.encodings.rotary.lie import ComRoPE, LieRE, lie_rotation
from posenc.encodings.rotary.mla import MLARope
from posenc.encodings.rotary.module import FrequencyChange, RotaryEmbedding
from posenc.encodings.rotary.mrope import MRoPE, mrope_decode_positions, mrope_position_ids
from posenc.encodings.rotary.ntk_alpha import NTKAlphaScaling
from posenc.encodings.rotary.p_rope import PRoPE
from posenc.encodings.rotary.proportional import ProportionalScaling
from posenc.encodings.rotary.scaling import (
    DefaultRope,
    LinearScaling,
    RopeScaling,
    rope_inv_freq,
    scaling_from_dict,
    scaling_types,
)
from posenc.encodings.rotary.temperature import PositionTemperature
from posenc.encodings.rotary.video_rope import VideoRoPE, videorope_position_ids
from posenc.encodings.rotary.xpos import XPos, xpos_scale
from posenc.encodings.sandwich import Sandwich, sandwich_bias
from posenc.encodings.shaw import (
    ShawRelativePosition,
    shaw_relative_index,
    shaw_score_bias,
    shaw_value_term,
)
from posenc.encodings.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table
from posenc.encodings.t5 import T5RelativeBias, t5_relative_bias, t5_relative_position_bucket

__all__ = [
    "DAPE",
    "FIRE",
    "KERPLE",
    "KERPLE_KERNELS",
    "ALiBi",
    "AxialRope",
    "CoPE",
    "ComRoPE",
    "DefaultRope",
    "DisentangledAttention",
    "DualChunkAttention",
    "DynamicNTKScaling",
    "ForgettingAttention",
    "FourierRope",
    "FrequencyChange",
    "LearnedPositionalEncoding",
    "LieRE",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "MLARope",
    "MRoPE",
    "NTKAlphaScaling",
    "NTKScaling",
    "NoPE",
    "PRoPE",
    "PaTH",
    "PositionTemperature",
    "ProportionalScaling",
    "RelativeEmbeddingTable",
    "RopeScaling",
    "RotaryEmbedding",
    "Sandwich",
    "ShawRelativePosition",
    "SinusoidalPositionalEncoding",
    "StickBreakingAttention",
    "T5RelativeBias",
    "VideoRoPE",
    "XPos",
    "YarnScaling",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "axial_positions",
    "cope_bias",
    "cope_positions",
    "dape_bias",
    "dinov3_positions",
    "disentangled_bias",
    "disentangled_relative_index",
    "dual_chunk_indices",
    "fire_bias",
    "fire_normalized_distance",
    "fope_frequencies",
    "fox_weights",
    "kerple_bias",
    "lie_rotation",
    "log_bucket_position",
    "mrope_decode_positions",
    "mrope_position_ids",
    "path_weights",
    "rerotate_keys",
    "rope_cos_sin",
    "rope_inv_freq",
    "rope_weight_to_half_split",
    "rope_weight_to_interleaved",
    "sandwich_bias",
    "scaling_from_dict",
    "scaling_types",
    "shaw_relative_index",
    "shaw_score_bias",
    "shaw_value_term",
    "sinusoidal_table",
    "stick_breaking_weights",
    "t5_relative_bias",
    "t5_relative_position_bucket",
    "videorope_position_ids",
    "xpos_scale",
]
