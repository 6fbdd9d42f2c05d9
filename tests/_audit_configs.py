"""Shared configs of the audit tests: tiny decoders, one per RoPE scaling vLLM has.

Shapes: ``P`` positions, ``R`` rotary dim. Every config has head dim ``D = 16`` and base 1e4;
float32 runtimes are compared with ``rtol = atol = 16 eps32``.
"""

from __future__ import annotations

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
TOL = dict(rtol=16 * EPS32, atol=16 * EPS32)
POSITIONS = np.array([0, 1, 7, 100, 511, 512, 1000, 2047])
CONTEXT = 600  # past LongRoPE's original 512, inside every cache
D, BASE, L0, MAX = 16, 10000.0, 512, 2048
SHORT = [1.0, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, 4.0]
LONG = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]
YARN = {"factor": 4.0, "original_max_position_embeddings": L0, "beta_fast": 32, "beta_slow": 1}
DEEPSEEK_MSCALE = 0.707


def _decoder(arch: str, model_type: str, **extra: object) -> dict:
    return {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 128,
        "max_position_embeddings": MAX,
        "rms_norm_eps": 1e-5,
        "rope_theta": BASE,
        **extra,
    }


def _llama(rope_scaling: dict | None) -> dict:
    return _decoder("LlamaForCausalLM", "llama", rope_scaling=rope_scaling)


CONFIGS = {
    "default": _llama(None),
    "linear": _llama({"rope_type": "linear", "factor": 4.0}),
    "dynamic": _llama({"rope_type": "dynamic", "factor": 4.0}),
    "yarn": _llama({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0}),
    "llama3": _llama(
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": L0,
        }
    ),
    "longrope": _decoder(
        "Phi3ForCausalLM",
        "phi3",
        original_max_position_embeddings=L0,
        rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
    ),
    "deepseek_yarn": _decoder(
        "DeepseekV2ForCausalLM",
        "deepseek_v2",
        num_key_value_heads=4,
        moe_intermediate_size=32,
        kv_lora_rank=32,
        q_lora_rank=None,
        qk_rope_head_dim=D,
        qk_nope_head_dim=D,
        v_head_dim=D,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        moe_layer_freq=1,
        rope_scaling={
            "type": "yarn",
            **YARN,
            "mscale": DEEPSEEK_MSCALE,
            "mscale_all_dim": DEEPSEEK_MSCALE,
        },
    ),
    "dual_chunk": _decoder(
        "Qwen2ForCausalLM",
        "qwen2",
        dual_chunk_attention_config={
            "chunk_size": 256,
            "local_size": 32,
            "original_max_position_embeddings": L0,
        },
    ),
    "hunyuan_ntk_alpha": _decoder(
        "HunYuanDenseV1ForCausalLM",
        "hunyuan_v1_dense",
        head_dim=D,
        use_qk_norm=True,
        rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
    ),
}

GEMMA3 = {  # five sliding layers at base 1e4, a full one at 1e6 with linear scaling 8
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 6,
    "vocab_size": 128,
    "max_position_embeddings": 2048,
    "sliding_window": 128,
    "query_pre_attn_scalar": 16,
    "rope_theta": 1e6,
    "rope_local_base_freq": 1e4,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
}
