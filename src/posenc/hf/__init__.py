"""Hugging Face interop: posenc encodings from transformers configs and checkpoints."""

from posenc.hf.config import HFRopeConfig, parse_hf_rope_config, rope_from_hf_config
from posenc.hf.families import FAMILIES, Family, family
from posenc.hf.layers import from_hf_config, layer_plan
from posenc.hf.patch import PatchedRotary, patch, unpatch

__all__ = [
    "FAMILIES",
    "Family",
    "HFRopeConfig",
    "PatchedRotary",
    "family",
    "from_hf_config",
    "layer_plan",
    "parse_hf_rope_config",
    "patch",
    "rope_from_hf_config",
    "unpatch",
]
