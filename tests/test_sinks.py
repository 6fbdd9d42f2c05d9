"""Attention sinks (GPT-OSS) in posenc.MultiHeadAttention: every backend against the float64
reference, against transformers' GptOssAttention with the same weights, gradients, and
KV-cache decoding."""

from __future__ import annotations

import pytest
import torch

from conftest import tolerances
from posenc import KVCache, MultiHeadAttention
from posenc.attention import Masking, attend
from posenc.encodings import NoPE
from posenc.reference import sink_attention

BACKENDS = ("eager", "sdpa", "chunked")
H, TQ, TK, D = 3, 5, 7, 8


def _qkv(gen: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    q = torch.randn(1, H, TQ, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, H, TK, D, generator=gen, dtype=torch.float64) for _ in range(2))
    sinks = 2.0 * torch.randn(H, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (q, k, v, sinks))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_attend_with_sinks_matches_reference(gen, backend, causal, dtype):
    q, k, v, sinks = _qkv(gen, dtype)
    k_pos = torch.arange(TK)
    masking = Masking(causal, k_pos[TK - TQ :], k_pos)
    out = attend(q, k, v, position=NoPE(), masking=masking, backend=backend, block_size=2,
                 sinks=sinks)  # fmt: skip
    want = sink_attention(q[0].double(), k[0].double(), v[0].double(), sinks.double(),
                          causal=causal)  # fmt: skip
    torch.testing.assert_close(
        out[0].double(), torch.from_numpy(want), **tolerances(dtype, ops=4 * D)
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_match_finite_differences_and_eager(gen, backend):
    q, k, v, sinks = _qkv(gen, torch.float64)
    masking = Masking(True, torch.arange(TK - TQ, TK), torch.arange(TK))

    def run(q_, s_, backend_=backend):
        return attend(q_, k, v, position=NoPE(), masking=masking, backend=backend_,
                      block_size=2, sinks=s_)  # fmt: skip

    assert torch.autograd.gradcheck(
        lambda s_: run(q, s_), (sinks.requires_grad_(True),), fast_mode=True
    )
    q.requires_grad_(True)
    grads = [
        torch.autograd.grad(run(q, sinks, b).square().sum(), (q, sinks)) for b in (backend, "eager")
    ]
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, **tolerances(torch.float64, ops=4 * D))


def test_decoding_with_sinks_equals_full_forward(gen):
    torch.manual_seed(0)
    mha = MultiHeadAttention(24, 3, position="rope", num_kv_heads=1, sinks=True).double()
    torch.nn.init.normal_(mha.sinks, std=2.0)
    x = torch.randn(2, 6, 24, generator=gen, dtype=torch.float64)
    cache = KVCache()
    steps = [mha(x[:, :3], cache=cache)]
    steps += [mha(x[:, t : t + 1], cache=cache) for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, 1), mha(x), **tolerances(torch.float64, ops=64))


def test_sinks_change_the_output_and_zero_sinks_minus_inf_equal_plain_attention(gen):
    mha = MultiHeadAttention(24, 3, position="rope", sinks=True).double()
    plain = MultiHeadAttention(24, 3, position="rope").double()
    plain.load_state_dict(mha.state_dict(), strict=False)
    x = torch.randn(1, 5, 24, generator=gen, dtype=torch.float64)
    assert not torch.allclose(mha(x), plain(x))  # a zero sink is one more zero logit
    with torch.no_grad():
        mha.sinks.fill_(float("-inf"))
    torch.testing.assert_close(mha(x), plain(x), **tolerances(torch.float64, ops=64))


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_transformers_gpt_oss_attention(gen, backend, dtype, layer):
    """Layer 1 attends fully, layer 0 over a sliding window of 128 (longer than the input:
    posenc has no sliding-window mask)."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    from transformers import GptOssConfig

    from posenc import from_hf_config

    config = GptOssConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_hidden_layers=2, vocab_size=64, intermediate_size=16, num_local_experts=2,
    )  # fmt: skip
    config._attn_implementation = "eager"
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert config.sliding_window > 9
    torch.manual_seed(0)
    theirs = gpt_oss.GptOssAttention(config, layer_idx=layer).to(dtype).eval()
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ours = MultiHeadAttention(
        32, 4, num_kv_heads=2, bias=True, sinks=True, backend=backend, block_size=4,
        position=from_hf_config(config, layer_idx=layer),
    ).to(dtype)  # fmt: skip
    state = {k.replace("o_proj", "out_proj"): p for k, p in theirs.state_dict().items()}
    ours.load_state_dict(state)
    length = 9
    x = torch.randn(2, length, 32, generator=gen, dtype=torch.float64).to(dtype)
    rotary = gpt_oss.GptOssRotaryEmbedding(config)
    positions = torch.arange(length)[None].expand(2, -1)
    cos_sin = rotary(x, positions)
    causal = torch.full((length, length), float("-inf"), dtype=dtype).triu(1)[None, None]
    with torch.no_grad():
        want, _ = theirs(x, position_embeddings=cos_sin, attention_mask=causal)
        got = ours(x)
    tol_dtype = torch.float32  # theirs computes inv_freq, cos and sin in float32 at most
    torch.testing.assert_close(got, want, **tolerances(tol_dtype, ops=8 * 32))


def test_bad_sinks_raise(gen):
    with pytest.raises(ValueError, match="WEIGHTS"):
        MultiHeadAttention(16, 2, position="fox", sinks=True)
    with pytest.raises(TypeError, match="sinks"):
        MultiHeadAttention(16, 2, sinks=1)
    q, k, v, _ = _qkv(gen, torch.float64)
    masking = Masking(True, torch.arange(TK - TQ, TK), torch.arange(TK))
    with pytest.raises(ValueError, match=r"sinks must be a tensor of shape \[H=3\]"):
        attend(q, k, v, position=NoPE(), masking=masking, sinks=torch.zeros(2))
