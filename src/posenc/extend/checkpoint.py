"""Loading a local checkpoint for ``posenc extend``, and the memory an evaluation needs.

Shapes: ``T`` evaluation length, ``C`` chunk (tokens per forward), ``L`` layers, ``Hkv``
key/value heads, ``H`` query heads, ``D`` head_dim, ``V`` vocabulary. Evaluation reads a
window in chunks through a ``DynamicCache``, so memory grows with ``T`` only through the
cache, ``2 L Hkv T D`` values, and through one chunk's scores, ``H C T`` floats (the
eager and the math SDPA paths hold them; SDPA's fused CPU/CUDA kernels hold less), never
through a ``[T, T]`` matrix per head.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from posenc.extend.config import read_config, trained_length
from posenc.hf.patch import patch_encodings

__all__ = [
    "available_memory",
    "check_settings",
    "checkpoint_config",
    "load_checkpoint",
    "needed_memory",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checkpoint_config(model_dir: str) -> tuple[dict[str, Any], int]:
    """``(config.json as a dict, trained length L0)`` of a checkpoint posenc can patch.

    Raises:
        ValueError: no folder or ``config.json``, an unsupported family (named), no
            ``max_position_embeddings``.
    """
    config = read_config(model_dir)
    try:
        patch_encodings(config)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{model_dir!r}: {exc}") from None
    return config, trained_length(config)


def check_settings(config: dict[str, Any], settings) -> str:
    """Raise unless posenc can patch the family with every setting's scaling; returns the
    model_type.

    Raises:
        ValueError: an unsupported family or a scaling its config cannot take (named).
    """
    model_type = str(config.get("model_type"))
    for setting in settings:
        try:
            patch_encodings(config, scaling=setting.scaling)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"setting {setting.label!r}: {exc}") from None
    return model_type


def _head_counts(config: dict[str, Any]) -> tuple[int, int, int, int]:
    text = config.get("text_config") or config
    heads = int(text.get("num_attention_heads") or text.get("n_head") or 1)
    kv = int(text.get("num_key_value_heads") or heads)
    hidden = int(text.get("hidden_size") or text.get("n_embd") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    layers = int(text.get("num_hidden_layers") or text.get("n_layer") or 1)
    return layers, heads, kv, head_dim


def needed_memory(config: dict[str, Any], length: int, chunk: int, dtype: str) -> int:
    """Bytes one window of ``length`` needs beyond the weights: the KV cache (twice, while
    it grows), one chunk's attention scores and logits (float32), activations."""
    layers, heads, kv, head_dim = _head_counts(config)
    size = torch.finfo(_DTYPES[dtype]).bits // 8
    vocab = int((config.get("text_config") or config).get("vocab_size") or 1)
    cache = 2 * 2 * layers * kv * head_dim * length * size
    scores = 4 * heads * min(chunk, length) * length * 2
    logits = 4 * min(chunk, length) * vocab * 3
    return cache + scores + logits


def available_memory(device: torch.device) -> int:
    """Free bytes on ``device``: ``MemAvailable`` of ``/proc/meminfo`` (else the free
    physical pages) for the CPU, ``torch.cuda.mem_get_info`` for CUDA."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def load_checkpoint(model_dir: str, *, device: torch.device, dtype: str):
    """``(model, tokenizer)`` from a ``save_pretrained`` folder, in eval mode.

    Raises:
        ValueError: transformers is missing, or the folder has no loadable weights or
            tokenizer (the message names the folder and the reason).
    """
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ValueError("posenc extend needs transformers: pip install transformers") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{model_dir!r}: cannot load its tokenizer ({exc})") from None
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # posenc's own bar reports progress
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_DTYPES[dtype])
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{model_dir!r}: cannot load its weights ({exc})") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.to(device).eval(), tokenizer
