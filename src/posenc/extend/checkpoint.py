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
import pickle
from pathlib import Path
from typing import Any

import torch

from posenc._checks import check_int
from posenc.extend.config import read_config, trained_length
from posenc.hf.patch import patch_encodings

__all__ = [
    "available_memory",
    "check_settings",
    "check_shapes",
    "checkpoint_config",
    "load_checkpoint",
    "needed_memory",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checkpoint_config(model_dir: str) -> tuple[dict[str, Any], int]:
    """``(config.json as a dict, trained length L0)`` of a checkpoint posenc can patch.

    Raises:
        ValueError: no folder or ``config.json``, a bad shape field (``check_shapes``), an
            unsupported family (named), no ``max_position_embeddings``.
    """
    config = read_config(model_dir)
    try:
        check_shapes(config)
    except ValueError as exc:
        raise ValueError(f"{str(Path(model_dir) / 'config.json')!r}: {exc}") from None
    try:
        patch_encodings(config)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{model_dir!r}: {exc}") from None
    return config, trained_length(config)


def _text(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, dict):
        raise ValueError(f"text_config must be a JSON object, got {text!r}")
    return text


def _field(config: dict[str, Any], names: tuple[str, ...], default: int | None = None) -> int:
    """The first of ``names`` the config sets (the family's own spelling), checked >= 1."""
    for name in names:
        if config.get(name) is not None:
            try:
                return check_int(name, config[name])
            except (TypeError, ValueError) as exc:
                raise ValueError(str(exc)) from None  # a TypeError too: one line, exit 2
    if default is None:
        raise ValueError(f"none of {', '.join(names)} is set")
    return default


def check_shapes(config: dict[str, Any]) -> tuple[int, int, int, int]:
    """``(layers, heads, key/value heads, head_dim)`` of the config, checked before
    anything is loaded: positive integers, heads divisible by key/value heads, the hidden
    size by the heads (without an explicit ``head_dim``), rope parameters as JSON objects.

    Raises:
        ValueError: the first bad field, named as the config spells it.
    """
    text = _text(config)
    for where in (config, text):
        for key in ("rope_parameters", "rope_scaling"):
            value = where.get(key)
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{key} must be a JSON object or null, got {value!r}")
    layers = _field(text, ("num_hidden_layers", "n_layer", "num_layers"), 1)
    heads = _field(text, ("num_attention_heads", "n_head", "num_heads"), 1)
    kv = _field(text, ("num_key_value_heads", "num_kv_heads"), heads)
    if heads % kv:
        raise ValueError(f"{heads} attention heads are not a multiple of {kv} key/value heads")
    hidden = _field(text, ("hidden_size", "n_embd", "d_model"), heads)
    if text.get("head_dim") is not None:
        head_dim = _field(text, ("head_dim",))
    elif hidden % heads:
        raise ValueError(f"hidden size {hidden} is not a multiple of {heads} attention heads")
    else:
        head_dim = hidden // heads
    _field(text, ("vocab_size",), 1)
    return layers, heads, kv, head_dim


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


def needed_memory(config: dict[str, Any], length: int, chunk: int, dtype: str) -> int:
    """Bytes one window of ``length`` needs beyond the weights: the KV cache (twice, while
    it grows), one chunk's attention scores and logits (float32), activations."""
    layers, heads, kv, head_dim = check_shapes(config)
    size = torch.finfo(_DTYPES[dtype]).bits // 8
    vocab = _field(_text(config), ("vocab_size",), 1)
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
            tokenizer: missing, truncated or garbage files, shapes that differ from
            config.json, a pickle (the message names the folder and the reason, in one
            line).
    """
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ValueError("posenc extend needs transformers: pip install transformers") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:  # any failure to read the user's files is one line
        raise ValueError(f"{model_dir!r}: cannot load its tokenizer ({_reason(exc)})") from None
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # posenc's own bar reports progress
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_DTYPES[dtype])
    except Exception as exc:
        raise ValueError(f"{model_dir!r}: cannot load its weights ({_reason(exc)})") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.to(device).eval(), tokenizer


def _reason(exc: BaseException) -> str:
    """One line saying why transformers could not load a file. A pickled ``.bin`` that
    ``torch.load(weights_only=True)`` refuses is said as such: its message's advice to
    turn ``weights_only`` off would run the pickle's code."""
    if isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc):
        return (
            "a pickled .bin holding more than tensors, which posenc never unpickles; "
            "convert the weights to safetensors with a tool you trust"
        )
    if "ignore_mismatched_sizes" in str(exc):
        return "the weights' shapes do not match config.json"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines)[:300] if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
