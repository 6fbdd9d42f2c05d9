"""``TrailingRope`` (RoPE on the last ``R`` features of each head, DeepSeek-V4) against the
float64 reference; DeepSeek-V4's per-layer rope parameters (``main`` / ``compress`` with
YaRN) against transformers' own module; bad input.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from conftest import tolerances
from posenc.encodings.rotary.trailing import TrailingRope
from posenc.reference import rope_frequencies, rope_rotate

B, H, T, D, R = 2, 3, 7, 24, 8
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
EPS32 = torch.finfo(torch.float32).eps


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_trailing_rope_matches_the_reference(dtype, interleaved):
    enc = TrailingRope(D, R, base=300.0, interleaved=interleaved)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(B, 1, T, D, generator=gen, dtype=torch.float64).to(dtype)
    positions = torch.randint(0, 500, (B, T), generator=gen)
    theta = rope_frequencies(R, 300.0)
    for got, x in zip(enc.rotate(q, k, positions, positions), (q, k), strict=True):
        want = x.double().numpy().copy()
        want[..., D - R :] = rope_rotate(
            want[..., D - R :], positions.numpy(), theta, interleaved=interleaved
        )
        ops = 8 * 500 if dtype == torch.float64 else 4
        torch.testing.assert_close(
            got.double(), torch.as_tensor(want), **tolerances(dtype, ops=ops)
        )
    for got, want in zip(
        enc(q, k), enc.rotate(q, k, torch.arange(T), torch.arange(T)), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: TrailingRope(8, 10), "exceeds"),
        (lambda: TrailingRope(8, 7), "even"),
        (
            lambda: TrailingRope(
                8, 4, scaling={"rope_type": "dynamic", "factor": 2.0,
                               "original_max_position_embeddings": 8}
            ),
            "length-dependent",
        ),
    ],
)  # fmt: skip
def test_bad_trailing_ropes_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def _v4_config(**fields):
    transformers = pytest.importorskip("transformers")
    kinds = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
    return transformers.DeepseekV4Config(
        num_hidden_layers=3, layer_types=kinds, mlp_layer_types=["moe"] * 3, **fields
    )


def test_deepseek_v4_yarn_compress_layers_match_transformers():
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    yarn = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64,
            "beta_fast": 32.0, "beta_slow": 1.0}  # fmt: skip
    config = _v4_config(rope_parameters=yarn, max_position_embeddings=1024)
    rotary = m.DeepseekV4RotaryEmbedding(config)
    gen = torch.Generator().manual_seed(1)
    for layer_idx, key in ((0, "main"), (1, "compress"), (2, "compress")):
        ours = posenc.from_hf_config(config, layer_idx=layer_idx)
        assert isinstance(ours, TrailingRope) and ours.rotary_dim == config.qk_rope_head_dim
        positions = torch.arange(900, 900 + T).expand(B, T)
        q = torch.randn(B, H, T, config.head_dim, generator=gen)
        k = torch.randn(B, 1, T, config.head_dim, generator=gen)
        cos, sin = rotary(q, positions, layer_type=key)
        tol = EPS32 * (8 + (900 + T) * (1 + math.log(ours.base)))
        for got, x in zip(ours.rotate(q, k, positions, positions), (q, k), strict=True):
            want = m.apply_rotary_pos_emb(x, cos, sin)
            torch.testing.assert_close(got, want, rtol=0, atol=tol * float(x.abs().max()))


def test_deepseek_v4_layers_differ_and_bad_configs_are_refused(monkeypatch):
    config = _v4_config()
    with pytest.raises(ValueError, match="pass layer_idx"):
        posenc.from_hf_config(config)
    bases = [enc.base for enc in posenc.hf.layer_plan(config)]
    assert bases == [config.rope_theta, config.compress_rope_theta, config.compress_rope_theta]
    raw = config.to_dict()
    flat = {**raw, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    # transformers' config class spreads a flat rope_parameters over 'main' and 'compress'
    built = type(config).from_dict(flat)
    assert repr(posenc.from_hf_config(flat, layer_idx=0)) == repr(
        posenc.from_hf_config(built, layer_idx=0)
    )
    with monkeypatch.context() as read_as_written:  # no config class: refused by name
        read_as_written.setattr(posenc.hf.normalize, "config_class", lambda model_type: None)
        with pytest.raises(ValueError, match="'main' and 'compress'"):
            posenc.from_hf_config(flat, layer_idx=0)
        # fields that contradict the rope parameters (the class would rewrite them)
        with pytest.raises(ValueError, match="compress_rope_theta=5"):
            posenc.from_hf_config({**raw, "compress_rope_theta": 5.0}, layer_idx=1)
        with pytest.raises(ValueError, match="qk_rope_head_dim=32"):
            posenc.from_hf_config({**raw, "qk_rope_head_dim": 32}, layer_idx=1)
