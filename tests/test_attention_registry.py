"""MultiHeadAttention with every registered encoding (``posenc.available()``).

Each property is checked for whatever is registered: KV-cache decoding equals the full
forward, the backends agree (forward and backward), grouped-query heads equal repeated
k/v weights, padding changes nothing for the real tokens, and every encoding but NoPE
breaks the permutation equivariance of bidirectional attention. Encodings with structured
positions (M-RoPE, axial RoPE) get the positions of their ``position_shape`` for the
same token indices (``_build.positions_for``).
"""

from __future__ import annotations

import pytest
import torch

import posenc
from _build import SHORT, attention_positions
from conftest import tolerances
from posenc import KVCache, MultiHeadAttention, Site

C, H, KV = 16, 4, 2
D = C // H
B, T = 2, 9
OPS = 2 * C + D + 2 * T  # roundings along the longest chain: projections, logits, sums
NAMES = posenc.available()


def _is(name: str, site: Site) -> bool:
    return bool(posenc.info(name).sites & site)


def _causal_only(name: str) -> bool:
    return bool(posenc.info(name).cls.causal_only)


def make(name: str, *, causal: bool = True, num_kv_heads: int = KV, **kwargs) -> MultiHeadAttention:
    """A float64 layer holding ``name`` with its parameters moved off their initial values
    (a zero-initialized bias table would otherwise hide every position effect)."""
    torch.manual_seed(0)
    shape = {"d_model": C, "num_heads": H, "head_dim": D, "max_len": 64, "causal": causal}
    position = posenc.build(name, **shape, **SHORT.get(name, {}))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in position.parameters():
            p.add_(0.1 * torch.rand(p.shape, generator=gen, dtype=p.dtype))
    mha = MultiHeadAttention(
        C, H, position=position, causal=causal, num_kv_heads=num_kv_heads, **kwargs
    )
    return mha.double().eval()


def data(seed: int = 0):
    """x [B, T, C]; shifted per-sequence positions; sequence 1 left-padded by 2."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=gen, dtype=torch.float64)
    pos = torch.stack((torch.arange(T) + 4, (torch.arange(T) - 2).clamp(min=0)))
    kpm = torch.ones(B, T, dtype=torch.bool)
    kpm[1, :2] = False
    return x, pos, kpm


def at(mha: MultiHeadAttention, x: torch.Tensor, index: torch.Tensor | None = None):
    """The positions to give ``mha`` for the tokens of ``x [B, T, C]`` at ``index``."""
    return attention_positions(mha.position, index, x.shape[1])


def modes(names=NAMES):
    """(name, causal) pairs: every encoding causally, and bidirectionally where defined."""
    return [(n, c) for n in names for c in (True, False) if c or not _causal_only(n)]


TIGHT = tolerances(torch.float64, ops=OPS)


@pytest.mark.parametrize("name", NAMES)
def test_decoding_equals_full_forward(name):
    mha = make(name, block_size=2)
    x, pos, kpm = data()
    full = mha(x, at(mha, x, pos), key_padding_mask=kpm)
    cache, steps = KVCache(), []
    for start, stop in [(0, 4), (4, 5), (5, 7), (7, 8), (8, 9)]:
        kwargs = {"key_padding_mask": kpm[:, :stop], "cache": cache}
        steps.append(mha(x[:, start:stop], at(mha, x, pos[:, start:stop]), **kwargs))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TIGHT)


def _forward_backward(mha: MultiHeadAttention, x, pos, kpm) -> list[torch.Tensor]:
    x = x.detach().requires_grad_(True)
    out = mha(x, at(mha, x, pos), key_padding_mask=kpm)
    out.backward(torch.cos(out.detach()))
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in mha.parameters()]
    return [out.detach(), x.grad, *grads]


@pytest.mark.parametrize(("name", "causal"), modes())
def test_backends_agree_forward_and_backward(name, causal):
    backends = ["eager", "chunked"] + ([] if _is(name, Site.VALUE) else ["sdpa"])
    x, pos, kpm = data(seed=1)
    # sequence 1's padding shares position 0: a WEIGHTS encoding needs it masked
    for mask in (kpm,) if _is(name, Site.WEIGHTS) else (None, kpm):
        results = {}
        for backend in backends:
            mha = make(name, causal=causal, backend=backend, block_size=2).float()
            results[backend] = _forward_backward(mha, x.float(), pos, mask)
        for backend in backends[1:]:
            for got, want in zip(results[backend], results["eager"], strict=True):
                torch.testing.assert_close(got, want, **tolerances(torch.float32, ops=OPS))


@pytest.mark.parametrize("name", [n for n in NAMES if not _causal_only(n)])
def test_only_nope_keeps_bidirectional_attention_permutation_equivariant(name):
    mha = make(name, causal=False)
    x, _, _ = data()
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(0))

    def model(inp):  # the model applies the INPUT site to the embeddings, MHA the rest
        return mha(mha.position.embed(inp), at(mha, inp))

    permuted, expected = model(x[:, perm]), model(x)[:, perm]
    if name == "nope":
        torch.testing.assert_close(permuted, expected, **TIGHT)
    else:
        assert not torch.allclose(permuted, expected, **TIGHT), f"{name} ignores order"


@pytest.mark.parametrize(("name", "causal"), modes())
def test_grouped_query_heads_equal_repeated_kv_weights(name, causal):
    gqa = make(name, causal=causal)
    full = MultiHeadAttention(
        C, H, position=gqa.position, causal=causal, num_kv_heads=H
    ).double()  # shares the encoding module
    group = H // KV
    with torch.no_grad():
        full.q_proj.weight.copy_(gqa.q_proj.weight)
        full.out_proj.weight.copy_(gqa.out_proj.weight)
        for proj in ("k_proj", "v_proj"):
            w = getattr(gqa, proj).weight.view(KV, D, C).repeat_interleave(group, dim=0)
            getattr(full, proj).weight.copy_(w.reshape(H * D, C))
    x, pos, kpm = data()
    pos = at(gqa, x, pos)
    torch.testing.assert_close(
        gqa(x, pos, key_padding_mask=kpm), full(x, pos, key_padding_mask=kpm), **TIGHT
    )


@pytest.mark.parametrize("name", [n for n in NAMES if not _causal_only(n)])
def test_padded_keys_change_nothing(name):
    mha = make(name, causal=False)
    x, _, _ = data()
    junk = torch.randn(B, 3, C, dtype=torch.float64)
    kpm = torch.ones(B, T + 3, dtype=torch.bool)
    kpm[:, T:] = False
    both = torch.cat((x, junk), dim=1)
    padded = mha(both, at(mha, both), key_padding_mask=kpm)[:, :T]
    torch.testing.assert_close(padded, mha(x, at(mha, x)), **TIGHT)


@pytest.mark.parametrize(("name", "causal"), modes())
def test_left_padding_with_positions_matches_unpadded(name, causal):
    mha = make(name, causal=causal)
    x, _, _ = data()
    pad = 3
    alone = mha(x[1:, pad:], at(mha, x[1:, pad:]))
    pos = torch.stack((torch.arange(T), (torch.arange(T) - pad).clamp(min=0)))
    kpm = torch.ones(B, T, dtype=torch.bool)
    kpm[1, :pad] = False
    batched = mha(x, at(mha, x, pos), key_padding_mask=kpm)
    torch.testing.assert_close(batched[1:, pad:], alone, **TIGHT)
    torch.testing.assert_close(batched[:1], mha(x[:1], at(mha, x[:1])), **TIGHT)


@pytest.mark.parametrize(("name", "causal"), modes())
def test_position_by_name(name, causal):
    try:
        posenc.build(name, d_model=C, num_heads=H, head_dim=D, causal=causal)
    except TypeError:  # needs more than the model shape, e.g. a table length
        with pytest.raises(TypeError, match="pass an instance"):
            MultiHeadAttention(C, H, position=name, causal=causal)
        return
    mha = MultiHeadAttention(C, H, position=name, causal=causal)
    assert isinstance(mha.position, posenc.info(name).cls)
    x, _, _ = data()
    assert mha(x.float(), at(mha, x)).shape == (B, T, C)


@pytest.mark.parametrize("name", [n for n in NAMES if _is(n, Site.VALUE)])
def test_value_encodings_refuse_the_sdpa_backend(name):
    with pytest.raises(ValueError, match="value"):
        MultiHeadAttention(C, H, position=name, backend="sdpa")


@pytest.mark.parametrize("name", [n for n in NAMES if _causal_only(n)])
def test_causal_only_encodings_refuse_bidirectional_attention(name):
    with pytest.raises(ValueError, match="causal"):
        MultiHeadAttention(
            C, H, position=posenc.build(name, d_model=C, num_heads=H, head_dim=D), causal=False
        )
