"""Final logits of tiny random transformers models with their rotation replaced by posenc's.

One family per layout and per-layer rule: Llama (half-split), Cohere (interleaved), Phi
(partial rotary), DeepSeek-V3 (MLA, ``rope_interleave``), Gemma 3 (sliding/full bases),
SmolLM3 (NoPE layers), Cohere2 (RoPE on sliding layers only). Each model runs once as
built, and once with its module's ``apply_rotary_pos_emb`` (or ``_interleave``)
monkeypatched, inside the test, to rotate q/k with ``posenc.hf.layer_plan(config)[layer]``
at the positions the model was given; the logits must agree. Weights are random, sizes
tiny (``C`` 64, ``L`` 4), nothing is downloaded.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from posenc.hf import layer_plan

pytest.importorskip("transformers", reason="runs tiny transformers models")

EPS32 = torch.finfo(torch.float32).eps
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "vocab_size": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
FAMILIES = {  # family: (config class, its fields beyond TINY)
    "llama": ("LlamaConfig", {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}),
    "cohere": ("CohereConfig", {}),
    "phi": ("PhiConfig", {"partial_rotary_factor": 0.5}),
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "first_k_dense_replace": 2,
            "n_group": 1,
            "topk_group": 1,
            "rope_interleave": True,
            "num_key_value_heads": 4,
        },
    ),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 8}),
    "smollm3": ("SmolLM3Config", {"no_rope_layer_interval": 2}),
    "cohere2": ("Cohere2Config", {"sliding_window": 8}),
}


def build(family: str):
    transformers = importlib.import_module("transformers")
    name, fields = FAMILIES[family]
    config = getattr(transformers, name)(**{**TINY, **fields})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    module = importlib.import_module(type(model).__module__)
    return config, model, module


def posenc_rotation(model, plan, positions):
    """A stand-in for the family's rotation function: posenc's, at the current layer."""
    current = {}

    def remember(attention, _args):
        current["layer"] = attention.layer_idx

    handles = [
        m.register_forward_pre_hook(remember)
        for m in model.modules()
        if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")
    ]

    def rotate(q, k, cos, sin, *args, unsqueeze_dim=1, **kwargs):
        encoding = plan[current["layer"]]
        current.setdefault("calls", set()).add(current["layer"])
        if unsqueeze_dim == 2:  # [B, T, H, D]
            q, k = rotate(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            return q.transpose(1, 2), k.transpose(1, 2)
        width = q.shape[-1]  # Phi passes the rotated part alone: pad it to the head
        pad = (0, encoding.head_dim - width)
        q, k = encoding.rotate(
            torch.nn.functional.pad(q, pad), torch.nn.functional.pad(k, pad), positions, positions
        )
        return q[..., :width], k[..., :width]

    return rotate, handles, current


@pytest.mark.parametrize("first", [0, 1000])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_with_posenc_rotation_match(family, first, monkeypatch):
    config, model, module = build(family)
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    positions = first + torch.arange(12).expand(2, 12)  # [B, T]
    with torch.no_grad():
        expected = model(input_ids=ids, position_ids=positions).logits
    plan = layer_plan(config)
    rotate, handles, seen = posenc_rotation(model, plan, positions)
    for name in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave"):
        if not hasattr(module, name):
            continue
        monkeypatch.setattr(module, name, rotate)
    try:
        with torch.no_grad():
            got = model(input_ids=ids, position_ids=positions).logits
    finally:
        for handle in handles:
            handle.remove()
    rotated = {i for i, e in enumerate(plan) if hasattr(e, "rotary_dim")}
    assert seen.get("calls") == rotated, "posenc's rotation must replace every RoPE layer's"
    base = max(getattr(e, "base", 1.0) for e in plan)
    # transformers' float32 angles carry ~|angle| (1 + ln base) eps32 each; through L layers
    bound = EPS32 * (8 + (first + 12) * (1 + math.log(base))) * TINY["num_hidden_layers"]
    torch.testing.assert_close(got, expected, rtol=0, atol=bound * float(expected.abs().max()))
