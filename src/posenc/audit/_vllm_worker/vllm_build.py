"""vLLM's own model class for a ``config.json``, built with dummy weights on one CPU rank.

vLLM reads the config (``ModelConfig``) and the architecture's model file calls ``get_rope``
as it does when serving; each decoder layer's ``rotary_emb`` and its attention facts (the
model file's softmax scale, the sliding window) are collected per layer.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: sizes that do not reach positions, cut so that a released model builds in seconds with
#: dummy weights (a Llama 3 8B in float32 would take 32 GB): widths, vocabulary, experts
_SMALL = {
    "vocab_size": 256,
    "intermediate_size": 32,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_routed_experts": 4,
    "num_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
}


def shrunk(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the sizes of ``_SMALL`` cut (text config too) and two query heads.

    The head width, the rotary fields, the layers and their types stay: the head dim is
    written out (``head_dim``, unless an MLA config names its rope head) before
    ``hidden_size`` becomes two heads wide.
    """
    out = dict(config)
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = shrunk(out["text_config"])
    for key, small in _SMALL.items():
        if isinstance(out.get(key), int) and out[key] > small:
            out[key] = small
    heads, kv = out.get("num_attention_heads"), out.get("num_key_value_heads")
    if isinstance(heads, int) and heads > 2 and isinstance(out.get("hidden_size"), int):
        head_dim = out.get("head_dim") or out["hidden_size"] // heads
        if "qk_rope_head_dim" not in out:
            out["head_dim"] = head_dim
        out["num_attention_heads"] = 2
        out["num_key_value_heads"] = 2 if kv in (None, heads) else 1
        out["hidden_size"] = 2 * head_dim
    return out


def model_layers(config: dict[str, Any], max_model_len: int) -> tuple[list[tuple[Any, Any]], str]:
    """``(rotary module or None, attention facts)`` per decoder layer of vLLM's model.

    Served with ``--max-model-len max_model_len`` (LongRoPE's factors follow it).
    """
    from vllm.config import LoadConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.model_loader.utils import get_model_architecture

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(shrunk(config), f)
        model_config = ModelConfig(
            model=folder, skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len
        )
        vllm_config = VllmConfig(
            model_config=model_config, load_config=LoadConfig(load_format="dummy")
        )
        if not model_parallel_is_initialized():  # one rank; no model: every group, MoE's too
            with set_current_vllm_config(VllmConfig()):
                init_distributed_environment(
                    world_size=1,
                    rank=0,
                    local_rank=0,
                    backend="gloo",
                    distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                )
                initialize_model_parallel(1, 1)
        cls, arch = get_model_architecture(model_config)
        if cls.__name__.startswith("Transformers"):
            raise NotImplementedError(
                f"vLLM runs {arch} through its transformers backend ({cls.__name__}): "
                "the positions are transformers' own, no vLLM rotary class"
            )
        with set_current_vllm_config(vllm_config):
            model = cls(vllm_config=vllm_config, prefix="")
    ropes: dict[int, Any] = {}
    attns: dict[int, dict[str, Any]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        found = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
        if found is None or "vision" in name or "visual" in name:
            continue
        i = int(found.group(1))
        facts = attns.setdefault(i, {})
        if name.endswith("rotary_emb") and not name.endswith("apply_rotary_emb"):
            ropes.setdefault(i, module)
        elif isinstance(module, Attention):
            facts.setdefault("sliding_window", module.sliding_window)
        if isinstance(getattr(module, "scaling", None), float):  # the model file's q.k scale
            facts.setdefault("softmax_scale", module.scaling)
    count = int(getattr(model_config.hf_text_config, "num_hidden_layers", 0)) or len(attns)
    return [(ropes.get(i), attns.get(i)) for i in range(count)], arch
