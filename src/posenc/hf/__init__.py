"""Hugging Face interop: posenc encodings from transformers configs and checkpoints."""

from posenc.hf.absolute import build_position_module, load_hf_weights, positions_skipping_padding
from posenc.hf.config import HFRopeConfig, parse_hf_rope_config, rope_from_hf_config
from posenc.hf.families import FAMILIES, Family, family
from posenc.hf.layers import from_hf_config, layer_plan
from posenc.hf.patch import PatchedRotary, patch, unpatch
from posenc.hf.tapas import tapas_positions

__all__ = [
    "FAMILIES",
    "Family",
    "HFRopeConfig",
    "PatchedRotary",
    "build_position_module",
    "family",
    "from_hf_config",
    "layer_plan",
    "load_hf_weights",
    "parse_hf_rope_config",
    "patch",
    "positions_skipping_padding",
    "rope_from_hf_config",
    "tapas_positions",
    "unpatch",
]
