"""The position fields of released config.json files (the model each is from is its key).

Only what decides positions (and the sizes the converters write) is kept; the layer counts
are the released ones. YaRN entries a model card tells users to add are marked so.
"""

from __future__ import annotations

from typing import Any


def _c(model_type: str, hidden: int, heads: int, kv: int, layers: int, max_pos: int, **kw):
    return {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": layers,
        "max_position_embeddings": max_pos,
        **kw,
    }


_LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

DEEPSEEK_V2_LITE = _c(
    "deepseek_v2",
    2048,
    16,
    16,
    27,
    163840,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    kv_lora_rank=512,
    q_lora_rank=None,
    rope_theta=10000,
    rope_scaling={
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
)

RELEASED: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-2-7b-hf": _c("llama", 4096, 32, 32, 32, 4096, rope_theta=10000.0),
    "codellama/CodeLlama-7b-hf": _c("llama", 4096, 32, 32, 32, 16384, rope_theta=1000000),
    "meta-llama/Meta-Llama-3-8B": _c("llama", 4096, 32, 8, 32, 8192, rope_theta=500000.0),
    "meta-llama/Llama-3.1-8B": _c(
        "llama", 4096, 32, 8, 32, 131072, rope_theta=500000.0, rope_scaling=_LLAMA31
    ),
    "meta-llama/Llama-3.2-1B": _c(
        "llama",
        2048,
        32,
        8,
        16,
        131072,
        head_dim=64,
        rope_theta=500000.0,
        rope_scaling={**_LLAMA31, "factor": 32.0},
    ),
    "mistralai/Mistral-7B-Instruct-v0.2": _c(
        "mistral", 4096, 32, 8, 32, 32768, rope_theta=1000000.0, sliding_window=None
    ),
    "mistralai/Mistral-Nemo-Base-2407": _c(
        "mistral", 5120, 32, 8, 40, 1024000, head_dim=128, rope_theta=1000000.0
    ),
    "01-ai/Yi-6B": _c("llama", 4096, 32, 4, 32, 4096, rope_theta=5000000.0),
    "deepseek-ai/deepseek-llm-7b-base": _c("llama", 4096, 32, 32, 30, 4096, rope_theta=10000.0),
    "HuggingFaceTB/SmolLM2-135M": _c("llama", 576, 9, 3, 30, 8192, rope_theta=100000),
    "HuggingFaceTB/SmolLM2-1.7B": _c("llama", 2048, 32, 32, 24, 8192, rope_theta=130000),
    "ibm-granite/granite-3.0-2b-base": _c("granite", 2048, 32, 8, 40, 4096, rope_theta=10000.0),
    "Qwen/Qwen1.5-7B": _c("qwen2", 4096, 32, 32, 32, 32768, rope_theta=1000000.0),
    "Qwen/Qwen2-7B-Instruct": _c("qwen2", 3584, 28, 4, 28, 32768, rope_theta=1000000.0),
    # the YaRN its model card tells users to add for long inputs
    "Qwen/Qwen2.5-7B-Instruct (card's YaRN)": _c(
        "qwen2",
        3584,
        28,
        4,
        28,
        32768,
        rope_theta=1000000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    ),
    "Qwen/Qwen3-8B": _c("qwen3", 4096, 32, 8, 36, 40960, head_dim=128, rope_theta=1000000),
    "Qwen/Qwen3-30B-A3B (card's YaRN)": _c(
        "qwen3_moe",
        2048,
        32,
        4,
        48,
        40960,
        head_dim=128,
        rope_theta=1000000.0,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    ),
    "google/gemma-2b": _c("gemma", 2048, 8, 1, 18, 8192, head_dim=256, rope_theta=10000.0),
    "google/gemma-7b": _c("gemma", 3072, 16, 16, 28, 8192, head_dim=256, rope_theta=10000.0),
    "allenai/OLMo-2-1124-7B": _c("olmo2", 4096, 32, 32, 32, 4096, rope_theta=500000),
    "microsoft/Phi-3-mini-4k-instruct": _c("phi3", 3072, 32, 32, 32, 4096, rope_theta=10000.0),
    "microsoft/phi-2": _c(
        "phi", 2560, 32, 32, 32, 2048, rope_theta=10000.0, partial_rotary_factor=0.4
    ),
    "stabilityai/stablelm-2-1_6b": _c(
        "stablelm", 2048, 32, 32, 24, 4096, rope_theta=10000, partial_rotary_factor=0.25
    ),
    "EleutherAI/pythia-160m": _c(
        "gpt_neox", 768, 12, 12, 12, 2048, rotary_pct=0.25, rotary_emb_base=10000
    ),
    "Qwen/Qwen2-VL-7B-Instruct": _c(
        "qwen2_vl",
        3584,
        28,
        4,
        28,
        32768,
        rope_theta=1000000.0,
        rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
    ),
    "deepseek-ai/DeepSeek-V2-Lite": DEEPSEEK_V2_LITE,
    "tiiuae/falcon-7b": _c("falcon", 4544, 71, 1, 32, 2048, rope_theta=10000.0),
}
