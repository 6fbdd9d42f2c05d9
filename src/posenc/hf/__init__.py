"""Hugging Face interop: posenc encodings from transformers configs and checkpoints."""

from posenc.hf.config import HFRopeConfig, parse_hf_rope_config, rope_from_hf_config

__all__ = ["HFRopeConfig", "parse_hf_rope_config", "rope_from_hf_config"]
