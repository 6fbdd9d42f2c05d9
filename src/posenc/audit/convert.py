"""The rotary GGUF fields llama.cpp's converter writes for a config.json, and a GGUF's diff.

``converter_fields`` follows ``convert_hf_to_gguf.py`` in ggml-org/llama.cpp:
``TextModel.set_gguf_parameters`` (``max_position_embeddings`` -> ``context_length``, heads,
``rope_theta`` -> ``rope.freq_base``, a ``sliding_attention`` base -> ``rope.freq_base_swa``,
``head_dim`` -> ``attention.key_length``; a ``linear`` or ``yarn`` scaling with a factor ->
``rope.scaling.type`` / ``factor``, YaRN's ``original_max_position_embeddings``,
``extrapolation_factor``, ``attention_factor``, ``beta_fast``, ``beta_slow``; ``mrope_section``
padded to 4 -> ``rope.dimension_sections``); ``LlamaModel`` (``rope.dimension_count`` =
head_dim; Llama 3's scaling as the ``rope_freqs`` factors of ``generate_extra_tensors``);
``StableLMModel`` / ``GPTNeoXModel`` / ``Phi2Model`` / ``Phi3MiniModel`` (partial rotary as
``rope.dimension_count``; Phi-3's LongRoPE as the ``rope_factors_long`` / ``_short`` tensors,
its original length and ``rope.scaling.attn_factor = sqrt(1 + ln s / ln L0)``, ``s`` the
trained over the original length); ``DeepseekV2Model`` (``rope.scaling.yarn_log_multiplier =
0.1 mscale_all_dim``; MLA as MQA over the latent: ``attention.key_length = kv_lora_rank +
qk_rope_head_dim``, ``value_length = kv_lora_rank``, the per-head widths as
``attention.key_length_mla = qk_nope_head_dim + qk_rope_head_dim`` and
``value_length_mla = v_head_dim``). ``gguf_diff`` names every such field a GGUF holds differently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["ARCH", "INT_KEYS", "converter_fields", "gguf_diff", "llama3_factors"]

#: config.json ``model_type`` -> (GGUF architecture, how its converter class writes
#: ``rope.dimension_count``: "head" (LlamaModel), "partial" (partial rotary), "mla"
#: (``qk_rope_head_dim``, with ``attention.kv_lora_rank``), None (not written))
ARCH: dict[str, tuple[str, str | None]] = {
    "llama": ("llama", "head"),
    "mistral": ("llama", "head"),
    "granite": ("granite", "head"),
    "qwen2": ("qwen2", None),
    "qwen2_moe": ("qwen2moe", None),
    "qwen3": ("qwen3", None),
    "qwen3_moe": ("qwen3moe", None),
    "qwen2_vl": ("qwen2vl", None),
    "gemma": ("gemma", None),
    "olmo2": ("olmo2", None),
    "falcon": ("falcon", None),
    "stablelm": ("stablelm", "partial"),
    "gpt_neox": ("gptneox", "partial"),
    "phi": ("phi2", "partial"),
    "phi3": ("phi3", "partial"),
    "deepseek_v2": ("deepseek2", "mla"),
}

#: keys (after the architecture prefix) the converter writes as unsigned integers
INT_KEYS = frozenset(
    (
        "block_count",
        "context_length",
        "embedding_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "attention.kv_lora_rank",
        "attention.key_length_mla",
        "attention.value_length_mla",
        "rope.dimension_count",
        "rope.scaling.original_context_length",
    )
)

_YARN_OPTIONAL = {
    "extrapolation_factor": "rope.scaling.yarn_ext_factor",
    "attention_factor": "rope.scaling.yarn_attn_factor",
    "beta_fast": "rope.scaling.yarn_beta_fast",
    "beta_slow": "rope.scaling.yarn_beta_slow",
}


def _rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params = dict(params.get("full_attention", params))
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    for key in ("rope_theta", "rotary_emb_base"):
        if key in config and "rope_theta" not in params:
            params["rope_theta"] = config[key]
    return params


def _head_dim(config: Mapping[str, Any]) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def llama3_factors(params: Mapping[str, Any], dim: int) -> np.ndarray:
    """``LlamaModel.generate_extra_tensors``: the ``[dim/2]`` ``rope_freqs`` factors, float32."""
    base = params["rope_theta"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = params.get("factor", 8.0)
    low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old = params.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _scaling(params: Mapping[str, Any]) -> dict[str, Any]:
    rope_type, factor = params.get("rope_type"), params.get("factor")
    if rope_type not in ("linear", "yarn") or factor is None:
        return {}
    out: dict[str, Any] = {"rope.scaling.type": rope_type, "rope.scaling.factor": factor}
    if rope_type == "yarn":
        out["rope.scaling.original_context_length"] = params["original_max_position_embeddings"]
        out.update({key: params[name] for name, key in _YARN_OPTIONAL.items() if name in params})
    return out


def converter_fields(config: Mapping[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(architecture, {key: value}, {tensor name: [R/2] values})`` as the converter writes
    ``config``'s position fields (keys without the architecture prefix).

    Raises:
        ValueError: a ``model_type`` posenc's copy of the converter rules does not cover.
    """
    model_type = config.get("model_type")
    if model_type not in ARCH:
        raise ValueError(
            f"model_type {model_type!r}: posenc follows llama.cpp's converter for "
            f"{sorted(ARCH)} only"
        )
    arch, dims = ARCH[model_type]
    params = _rope_parameters(config)
    kv: dict[str, Any] = {
        "block_count": config["num_hidden_layers"],
        "context_length": config["max_position_embeddings"],
        "embedding_length": config["hidden_size"],
        "attention.head_count": config["num_attention_heads"],
        "attention.head_count_kv": config.get("num_key_value_heads", config["num_attention_heads"]),
        **_scaling(params),
    }
    if "mrope_section" in params:
        kv["rope.dimension_sections"] = [*params["mrope_section"], 0, 0, 0, 0][:4]
    if params.get("rope_theta") is not None:
        kv["rope.freq_base"] = params["rope_theta"]
    sliding = (config.get("rope_parameters") or {}).get("sliding_attention") or {}
    if sliding.get("rope_theta") is not None:
        kv["rope.freq_base_swa"] = sliding["rope_theta"]
    if config.get("head_dim") is not None:
        kv["attention.key_length"] = kv["attention.value_length"] = config["head_dim"]
    partial = float(config.get("partial_rotary_factor", config.get("rotary_pct", 1.0)))
    if dims == "head":
        kv["rope.dimension_count"] = _head_dim(config)
    elif dims == "partial":
        kv["rope.dimension_count"] = int(partial * _head_dim(config))
    elif dims == "mla":
        kv["rope.dimension_count"] = config["qk_rope_head_dim"]
        kv["attention.kv_lora_rank"] = rank = config["kv_lora_rank"]
        # MLA runs as MQA over the latent: the cached key row is the latent and the rope
        # part; the per-head widths (which set llama.cpp's kq_scale) under the _mla keys
        kv["attention.key_length"] = rank + config["qk_rope_head_dim"]
        kv["attention.value_length"] = rank
        kv["attention.key_length_mla"] = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
        kv["attention.value_length_mla"] = config["v_head_dim"]
        if params.get("rope_type") == "yarn" and "mscale_all_dim" in params:
            kv["rope.scaling.yarn_log_multiplier"] = 0.1 * params["mscale_all_dim"]
    tensors = {}
    if params.get("rope_type") == "llama3":
        tensors["rope_freqs.weight"] = llama3_factors(params, _head_dim(config))
    if model_type == "phi3" and params.get("long_factor"):
        kv.update(_phi3_longrope(config, params))
        for kind in ("long", "short"):
            tensors[f"rope_factors_{kind}.weight"] = np.asarray(
                params[f"{kind}_factor"], dtype=np.float32
            )
    return arch, kv, tensors


def _phi3_longrope(config: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """``Phi3MiniModel``: the original length and LongRoPE's attention factor."""
    original = config.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings"
    )
    scale = config["max_position_embeddings"] / original
    factor = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    return {"rope.scaling.original_context_length": original, "rope.scaling.attn_factor": factor}


def _rotary(key: str) -> bool:
    """A key or tensor that decides positions (rope.*, rope tensors, context length, the
    key length and MLA's rank, which decide the rotated head width, and MLA's per-head key
    width, which decides DeepSeek-V2's softmax scale)."""
    return key.startswith("rope") or key in (
        "context_length",
        "attention.key_length",
        "attention.kv_lora_rank",
        "attention.key_length_mla",
    )


def _default(name: str, fields: Mapping[str, Any], arch: Any) -> Any:
    """What llama.cpp's loader takes when the GGUF lacks key ``name`` (load_hparams)."""
    get = fields.get
    heads = get(f"{arch}.attention.head_count")
    head_dim = None
    if heads and get(f"{arch}.embedding_length"):
        head_dim = get(f"{arch}.embedding_length") // heads
    key_length = get(f"{arch}.attention.key_length", head_dim)
    return {
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "attention.key_length_mla": key_length,
        "rope.dimension_count": key_length,
        "rope.freq_base": 10000.0,
        "rope.scaling.original_context_length": get(f"{arch}.context_length"),
        "rope.scaling.yarn_beta_fast": 32.0,
        "rope.scaling.yarn_beta_slow": 1.0,
        "rope.scaling.yarn_attn_factor": 1.0,
        "rope.scaling.attn_factor": 1.0,
    }.get(name)


def _same(expected: Any, found: Any) -> bool:
    if found is None:
        return False
    if isinstance(expected, str) or isinstance(found, str):
        return str(expected) == str(found)
    a = np.asarray(expected, dtype=np.float64).reshape(-1)
    b = np.asarray(found, dtype=np.float64).reshape(-1)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=2.0**-20, atol=0.0))


def gguf_diff(config: Mapping[str, Any], fields: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, converter's value, GGUF's value)`` for every rotary field the converter
    writes for ``config`` and the GGUF (``fields`` as ``posenc.audit.ggufread`` reads them)
    holds differently, or lacks where llama.cpp's default differs from the converter's
    value, and every rotary key or tensor the GGUF holds that the converter would not
    write (None: absent)."""
    arch, kv, tensors = converter_fields(config)
    expected = {f"{arch}.{k}": v for k, v in kv.items() if _rotary(k)}
    expected.update({k: v.tolist() for k, v in tensors.items()})
    found_arch = fields.get("general.architecture")
    out = [] if found_arch == arch else [("general.architecture", arch, found_arch)]
    for key, value in expected.items():
        found = fields.get(key.replace(f"{arch}.", f"{found_arch}.", 1))
        default = _default(key.removeprefix(f"{arch}."), fields, found_arch)
        if not _same(value, found) and (found is not None or not _same(value, default)):
            out.append((key, value, found))
    prefix = f"{found_arch}."
    for key, value in fields.items():
        name = key.removeprefix(prefix)
        if _rotary(name) and f"{arch}.{name}" not in expected and key not in expected:
            out.append((f"{arch}.{name}" if key.startswith(prefix) else key, None, value))
    return out
