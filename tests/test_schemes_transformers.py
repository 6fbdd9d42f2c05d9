"""The schemes against each family's own code in the installed transformers (tiny random
configs, nothing downloaded): Gemma 4 proportional RoPE, Qwen2-VL / Qwen2.5-VL / Qwen3-VL /
GLM-4V M-RoPE and their ``get_rope_index``, the Qwen2-VL / Pixtral / DINOv3 vision
rotaries, Ministral 3 / Mistral 4 / Llama 4 query temperature, DeepSeek-V3 MLA.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim; transformers' q/k are
``[B, H, T, D]`` like posenc's (vision towers: ``[N, H, D]``, transposed here).
"""

from __future__ import annotations

import functools
import types

import pytest
import torch

import posenc
from conftest import tolerances
from posenc import (
    MLARope,
    MRoPE,
    PositionTemperature,
    RotaryEmbedding,
    axial_positions,
    dinov3_positions,
    mrope_position_ids,
)
from posenc.base import Compose
from posenc.hf.schemes import build_scheme

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

B, H, T = 2, 2, 9
TOL = tolerances(torch.float32, ops=16)


def _qk(head_dim: int, *, length: int = T, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, length, head_dim, generator=g),
        torch.randn(B, H, length, head_dim, generator=g),
    )


def _positions(shape, seed: int = 1, high: int = 5000):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def _assert_pair(got, want, positions=None):
    """Compare with transformers, which forms the angles ``position * inv_freq`` in float32:
    an angle ``a`` is off by up to ``~2 a eps`` there (posenc's are exact), so the
    tolerance grows with the largest position."""
    tol = TOL
    if positions is not None:
        tol = tolerances(torch.float32, ops=16 + 8 * int(positions.abs().max()))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **tol)


# --------------------------------------------------------------------------- Gemma 4


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_gemma4_layers_match_its_rotary(layer_idx):
    from transformers.models.gemma4 import modeling_gemma4 as m

    config = transformers.Gemma4TextConfig(
        hidden_size=64, num_attention_heads=H, num_key_value_heads=1, head_dim=16,
        global_head_dim=32, num_hidden_layers=4, vocab_size=64, intermediate_size=32,
        hidden_size_per_layer_input=8, layer_types=["sliding_attention", "full_attention"] * 2,
    )  # fmt: skip
    layer_type = config.layer_types[layer_idx]
    enc = build_scheme("proportional", config.to_dict(), layer_idx=layer_idx)
    head_dim = 32 if layer_type == "full_attention" else 16
    assert isinstance(enc, RotaryEmbedding) and enc.rotary_dim == head_dim
    q, k = _qk(head_dim)
    pos = _positions((B, T))
    cos, sin = m.Gemma4TextRotaryEmbedding(config)(q, pos, layer_type)
    want = m.apply_rotary_pos_emb(q, cos, sin), m.apply_rotary_pos_emb(k, cos, sin)
    _assert_pair(enc.rotate(q, k, pos, pos), want, pos)


# --------------------------------------------------------------------------- M-RoPE text

MROPE_FAMILIES = {  # scheme: (module, config class, rotary class, config kwargs)
    "mrope": ("qwen2_vl", "Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding", [2, 3, 3], {}),
    "mrope_interleaved": (
        "qwen3_vl", "Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding", [4, 2, 2], {},
    ),
    "glm4v_mrope": (
        "glm4v", "Glm4vTextConfig", "Glm4vTextRotaryEmbedding", [1, 1, 2],
        {"partial_rotary_factor": 0.5},
    ),
}  # fmt: skip


@pytest.mark.parametrize("scheme", MROPE_FAMILIES)
@pytest.mark.parametrize("text_only", [False, True])
def test_mrope_matches_the_family_rotary(scheme, text_only):
    module, config_cls, rotary_cls, section, extra = MROPE_FAMILIES[scheme]
    m = getattr(transformers.models, module)
    modeling = getattr(m, f"modeling_{module}")
    params = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section, **extra}
    config = getattr(transformers, config_cls)(
        hidden_size=64, num_attention_heads=H, num_key_value_heads=H, head_dim=16,
        rope_parameters=params,
    )  # fmt: skip
    enc = build_scheme(scheme, config.to_dict())
    assert isinstance(enc, MRoPE)
    q, k = _qk(16)
    pos = _positions((B, T)) if text_only else _positions((3, B, T))
    cos, sin = getattr(modeling, rotary_cls)(config)(q, pos)
    want = modeling.apply_rotary_pos_emb(q, k, cos, sin)
    _assert_pair(enc.rotate(q, k, pos, pos), want, pos)


def _mm_inputs(segments):
    """``mm_token_type_ids [1, T]`` and the image/video grids of posenc's segments."""
    types_, images, videos = [], [], []
    for seg in segments:
        if isinstance(seg, int):
            types_ += [0] * seg
            continue
        kind, grid = seg[-1], list(seg[:3])
        (images if kind == "image" else videos).append(grid)
        types_ += [1 if kind == "image" else 2] * (grid[0] * grid[1] * grid[2] // 4)
    grid = lambda g: torch.tensor(g) if g else None  # noqa: E731
    return torch.tensor([types_]), grid(images), grid(videos)


GET_ROPE_INDEX = {
    "qwen2_vl": [4, (1, 4, 6, "image"), 3, (3, 2, 4, "video"), 2],
    "qwen2_5_vl": [2, (2, 4, 4, "video"), 1, (1, 6, 2, "image"), 3],
    "qwen3_vl": [2, (1, 4, 4, "image"), 1, (1, 2, 4, "video"), 2, (1, 2, 4, "video"), 3],
    "glm4v": [3, (1, 2, 6, "image"), 1, (1, 4, 2, "video"), 1, (1, 4, 2, "video"), 2],
}


@pytest.mark.parametrize("family", GET_ROPE_INDEX)
def test_position_ids_match_get_rope_index(family):
    """``mrope_position_ids`` equals the model's own ``get_rope_index`` (merge size 2)."""
    modeling = getattr(getattr(transformers.models, family), f"modeling_{family}")
    model_cls = next(
        getattr(modeling, n) for n in dir(modeling) if n.endswith("VLModel") or n == "Glm4vModel"
    )
    segments = GET_ROPE_INDEX[family]
    vision = types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=2)
    owner = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    owner.get_vision_position_ids = functools.partial(model_cls.get_vision_position_ids, owner)
    token_types, images, videos = _mm_inputs(segments)
    kwargs = {}
    if family == "qwen2_5_vl":
        kwargs["second_per_grid_ts"] = torch.tensor([0.5])
    want, delta = model_cls.get_rope_index(
        owner, torch.zeros_like(token_types), token_types, images, videos, **kwargs
    )
    interval = 2 * 0.5 if family == "qwen2_5_vl" else 1.0
    ours = [
        s if isinstance(s, int) else (*s[:3], interval if s[-1] == "video" else 1.0)
        for s in segments
    ]
    got, rope_delta = mrope_position_ids(ours, spatial_merge_size=2)
    torch.testing.assert_close(got, want[:, 0])
    assert rope_delta == int(delta)


# --------------------------------------------------------------------------- vision


def test_qwen2_vl_vision_rotary():
    from transformers.models.qwen2_vl import modeling_qwen2_vl as m
    from transformers.vision_utils import get_vision_position_ids

    config = transformers.Qwen2VLVisionConfig(embed_dim=64, num_heads=H, depth=1)
    enc = build_scheme("axial", config.to_dict())
    grid = torch.tensor([[1, 4, 6]])
    pos = get_vision_position_ids(grid, 2)  # [N, 2]
    torch.testing.assert_close(pos, axial_positions((4, 6), merge_size=2))
    q, k = _qk(32, length=pos.shape[0])
    cos, sin = m.Qwen2VLVisionRotaryEmbedding(config)(q, pos)
    want = m.apply_rotary_pos_emb_vision(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)
    got = enc.rotate(q, k, pos, pos)
    _assert_pair([g[0] for g in got], [w.transpose(0, 1) for w in want])


def test_pixtral_vision_rotary():
    from transformers.models.pixtral import modeling_pixtral as m

    config = transformers.PixtralVisionConfig(
        hidden_size=64, num_attention_heads=H, head_dim=32, intermediate_size=32
    )
    enc = build_scheme("axial_alternating", config.to_dict())
    pos = axial_positions((5, 3))
    q, k = _qk(32, length=pos.shape[0])
    cos, sin = m.PixtralVisionRotaryEmbedding(config)(q, pos)
    want = m.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    _assert_pair(enc.rotate(q, k, pos, pos), want)


def test_dinov3_patch_rotary_with_prefix_tokens():
    from transformers.models.dinov3_vit import modeling_dinov3_vit as m

    config = transformers.DINOv3ViTConfig(
        hidden_size=64, num_attention_heads=H, patch_size=4, image_size=16,
        num_register_tokens=2, intermediate_size=32,
    )  # fmt: skip
    enc = posenc.from_hf_config(config)
    rope = m.DINOv3ViTRopePositionEmbedding(config).eval()
    cos, sin = rope(torch.zeros(1, 3, 16, 12))  # a 4 x 3 patch grid
    q, k = _qk(32, length=3 + 12)
    want = m.apply_rotary_pos_emb(q, k, cos, sin)
    pos = dinov3_positions((4, 3))
    _assert_pair(enc.rotate(q, k, pos, pos), want)


# --------------------------------------------------------------------------- temperature


def _yarn_params(**extra):
    return {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1, **extra,
    }  # fmt: skip


def test_ministral3_rope_and_temperature():
    from transformers.models.ministral3 import modeling_ministral3 as m

    config = transformers.Ministral3Config(
        hidden_size=64, num_attention_heads=H, num_key_value_heads=H, head_dim=16,
        rope_parameters=_yarn_params(max_position_embeddings=32),
    )  # fmt: skip
    enc = build_scheme("temperature", config.to_dict())
    assert isinstance(enc, Compose)
    q, k = _qk(16, length=40)
    pos = torch.stack((torch.arange(40), torch.arange(40) + 77))
    cos, sin = m.Ministral3RotaryEmbedding(config)(q, pos)
    q_ref, k_ref = m.apply_rotary_pos_emb(q, k, cos, sin)
    q_ref = q_ref * m.get_llama_4_attn_scale(pos, 0.1, 8).to(q.dtype)
    _assert_pair(enc.rotate(q, k, pos, pos), (q_ref, k_ref))


def _llama4_nope_config():
    """A tiny Llama 4 whose last layer is NoPE with a temperature stepping every 4 tokens."""
    return transformers.Llama4TextConfig(
        hidden_size=32, num_attention_heads=H, num_key_value_heads=H, head_dim=16,
        num_hidden_layers=4, attn_temperature_tuning=True, attn_scale=0.3, floor_scale=4,
        no_rope_layers=[1, 1, 1, 0], intermediate_size=16, intermediate_size_mlp=16,
        vocab_size=32, use_qk_norm=False,
    )  # fmt: skip


def test_llama4_nope_layer_temperature():
    """Llama 4's NoPE-layer query scale, read from its attention forward."""
    from transformers.models.llama4 import modeling_llama4 as m

    config = _llama4_nope_config()
    config._attn_implementation = "eager"
    attn = m.Llama4TextAttention(config, layer_idx=3).eval()
    enc = build_scheme("temperature", config.to_dict(), layer_idx=3)
    assert isinstance(enc, PositionTemperature)
    x = torch.randn(B, 12, 32, generator=torch.Generator().manual_seed(0))
    captured = {}

    def eager(module, query, key, value, mask, **kwargs):
        captured["q"], captured["k"] = query, key
        return torch.zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3]), None

    original = m.eager_attention_forward
    m.eager_attention_forward = eager
    try:
        attn(x, position_embeddings=None, attention_mask=None)
    finally:
        m.eager_attention_forward = original
    q = attn.q_proj(x).view(B, 12, H, 16).transpose(1, 2)
    k = attn.k_proj(x).view(B, 12, H, 16).transpose(1, 2)
    _assert_pair(enc.rotate(q, k, torch.arange(12), torch.arange(12)), (captured["q"], k))


def _llama4_nope_temperature_model():
    torch.manual_seed(0)
    return transformers.Llama4ForCausalLM(_llama4_nope_config()).eval()


def test_patched_llama4_equals_the_model_under_explicit_positions():
    """transformers scales Llama 4's NoPE-layer queries by the token index, posenc's
    ``PositionTemperature`` by the positions it is given; ``patch`` keeps the model's own
    scale, so the patched model equals it with ``position_ids`` far from the token index, in
    a forward and in a cached step (where posenc's scale at those positions is not the token
    index's)."""
    model = _llama4_nope_temperature_model()
    ids = (torch.arange(12) * 5 % 32)[None]
    positions = 5000 + 3 * torch.arange(12)[None]  # [1, T]
    temperature = posenc.hf.layer_plan(model.config)[3]
    ones = torch.ones(1, 1, 12, 1)

    def scale(pos):
        return temperature.rotate(ones, ones, pos, pos)[0].flatten()

    assert isinstance(temperature, PositionTemperature)
    assert (scale(positions[0]) - scale(torch.arange(12))).abs().min() > 0.5

    def run():
        with torch.no_grad():
            full = model(input_ids=ids, position_ids=positions).logits
            cache = model(input_ids=ids[:, :8], position_ids=positions[:, :8], use_cache=True)
            step = model(  # past_key_values: the name before transformers 5.24, an alias since
                input_ids=ids[:, 8:9],
                position_ids=positions[:, 8:9],
                past_key_values=cache.past_key_values,
            ).logits
        return full, step

    want = run()
    assert want[1].shape == (1, 1, 32)  # one cached step
    posenc.hf.patch(model)
    try:
        got = run()
    finally:
        posenc.hf.unpatch(model)
    tol = tolerances(torch.float32, ops=16 + 8 * int(positions.max()))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **tol)


# --------------------------------------------------------------------------- MLA


@pytest.mark.parametrize("rope_interleave", [True, False])
def test_deepseek_v3_mla_rope_and_softmax_scale(rope_interleave):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    params = _yarn_params(mscale_all_dim=0.7)
    params.pop("llama_4_scaling_beta")
    config = transformers.DeepseekV3Config(
        hidden_size=64, num_attention_heads=H, num_key_value_heads=H, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=None,
        rope_interleave=rope_interleave, rope_parameters=params,
    )  # fmt: skip
    enc = build_scheme("mla", config.to_dict())
    assert isinstance(enc, MLARope)
    q, k = _qk(24)
    pos = _positions((B, T), high=200)
    cos, sin = m.DeepseekV3RotaryEmbedding(config)(q, pos)
    apply = m.apply_rotary_pos_emb_interleave if rope_interleave else m.apply_rotary_pos_emb
    q_rot, k_rot = apply(q[..., 16:], k[..., 16:], cos, sin)
    want = torch.cat((q[..., :16], q_rot), dim=-1), torch.cat((k[..., :16], k_rot), dim=-1)
    _assert_pair(enc.rotate(q, k, pos, pos), want, pos)
    config._attn_implementation = "eager"
    scaling = m.DeepseekV3Attention(config, layer_idx=0).scaling
    assert enc.softmax_scale == pytest.approx(scaling, rel=1e-12)


def test_mistral4_mla_with_temperature():
    from transformers.models.mistral4 import modeling_mistral4 as m

    config = transformers.Mistral4Config(
        hidden_size=64, num_attention_heads=H, num_key_value_heads=H, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, kv_lora_rank=16, q_lora_rank=None, head_dim=16,
        rope_parameters=_yarn_params(partial_rotary_factor=0.5),
    )  # fmt: skip
    enc = build_scheme("temperature", config.to_dict())
    q, k = _qk(16, length=20)
    pos = torch.arange(20).expand(B, -1)
    cos, sin = m.Mistral4RotaryEmbedding(config)(q, pos)
    q_rot, k_rot = m.apply_rotary_pos_emb_interleave(q[..., 8:], k[..., 8:], cos, sin)
    scale = m.get_llama_4_attn_scale(pos, 0.1, 8)
    want = torch.cat((q[..., :8], q_rot), dim=-1) * scale, torch.cat((k[..., :8], k_rot), dim=-1)
    _assert_pair(enc.rotate(q, k, pos, pos), want)


@pytest.mark.parametrize(
    "rope_scaling",
    [
        {"type": "mrope", "mrope_section": [16, 24, 24]},
        {"type": "mrope", "rope_type": "default", "mrope_section": [16, 24, 24]},
        {"type": "default", "rope_type": "default", "mrope_section": [16, 24, 24]},
    ],
)
def test_qwen2_vl_config_json_forms(rope_scaling):
    """The v4 ``config.json`` forms of Qwen2-VL / Qwen2.5-VL checkpoints."""
    config = {
        "model_type": "qwen2_5_vl", "hidden_size": 1536, "num_attention_heads": 12,
        "rope_theta": 1e6, "rope_scaling": rope_scaling,
    }  # fmt: skip
    enc = posenc.from_hf_config(config)
    assert isinstance(enc, MRoPE) and enc.mrope_section == (16, 24, 24)
    assert enc.rope.base == 1e6 and enc.rope.rotary_dim == 128


def test_unknown_scheme_and_contradicting_fields_raise():
    with pytest.raises(ValueError, match="'spiral'"):
        build_scheme("spiral", {})
    params = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "rope_parameters": params}
    with pytest.raises(ValueError, match="mrope_interleaved=True"):
        build_scheme("mrope", cfg)
    with pytest.raises(ValueError, match="sums to 8"):
        build_scheme("mrope_interleaved", {**cfg, "head_dim": 32})
    params = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_sectoin": 1}
    with pytest.raises(ValueError, match="mrope_sectoin"):
        build_scheme("mrope", {**cfg, "rope_parameters": params})
    with pytest.raises(ValueError, match="layer_type"):
        build_scheme("proportional", {**cfg, "rope_parameters": {"full_attention": {}}})


@pytest.mark.parametrize("global_head_dim", [None, 128])
def test_gemma4_config_json_full_layers_take_the_global_head_dim(global_head_dim):
    """A raw ``config.json`` (no ``per_layer_config``) as transformers reads it."""
    extra = {} if global_head_dim is None else {"global_head_dim": global_head_dim}
    fields = dict(
        hidden_size=64, num_attention_heads=H, num_key_value_heads=1, head_dim=16,
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], **extra,
    )  # fmt: skip
    hf = transformers.Gemma4TextConfig(**fields)
    raw = {
        "model_type": "gemma4_text",
        **fields,
        "rope_parameters": hf.to_dict()["rope_parameters"],
    }
    for layer_idx in (0, 1):
        want = build_scheme("proportional", hf.to_dict(), layer_idx=layer_idx)
        got = posenc.from_hf_config(raw, layer_idx=layer_idx)
        assert got.head_dim == want.head_dim == (16 if layer_idx == 0 else global_head_dim or 512)
        torch.testing.assert_close(got.inv_freq, want.inv_freq, rtol=0, atol=0)
