"""FoX, stick-breaking, PaTH and DAPE against their float64 references (``posenc.reference``)
and against flash-linear-attention's kernels (``fla-core``, Triton interpreted on CPU).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import reference
from posenc.attention_backends import Masking, attend
from posenc.encodings import (
    DAPE,
    ForgettingAttention,
    PaTH,
    StickBreakingAttention,
    stick_breaking_weights,
)

C, H = 16, 4
D = C // H
B, T = 2, 7
OPS = 2 * C + 4 * T  # roundings along the longest chain: projections, logits, sums


def _layer(position, *, dtype=torch.float64, **kwargs) -> posenc.MultiHeadAttention:
    """A layer holding ``position`` with seeded weights moved off their initial values."""
    torch.manual_seed(0)
    mha = posenc.MultiHeadAttention(C, H, position=position, **kwargs)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in mha.position.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return mha.to(dtype).eval()


def _x(dtype=torch.float64, seed=0) -> torch.Tensor:
    return torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _heads(mha, x) -> list[np.ndarray]:
    """q, k, v ``[B, H, T, D]`` of the layer's projections, as float64 arrays."""
    out = []
    for proj in (mha.q_proj, mha.k_proj, mha.v_proj):
        t = proj(x).view(B, T, H, D).transpose(1, 2)
        out.append(t.detach().double().numpy())
    return out


def _project_out(mha, heads_out: np.ndarray) -> torch.Tensor:
    """``out_proj`` of a reference ``[B, H, T, D]`` output, in float64."""
    merged = torch.from_numpy(heads_out).transpose(1, 2).reshape(B, T, C)
    return torch.nn.functional.linear(merged, mha.out_proj.weight.detach().double())


def _fox_reference(mha, x: torch.Tensor) -> torch.Tensor:
    q, k, v = _heads(mha, x)
    gate = mha.position.gate
    w, b = gate.weight.detach().double().numpy(), gate.bias.detach().double().numpy()
    xs = x.detach().double().numpy()
    out = [
        reference.fox_attention(q[i], k[i], v[i], reference.fox_log_forget(xs[i], w, b))
        for i in range(B)
    ]
    return _project_out(mha, np.stack(out))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["auto", "eager"])
def test_fox_layer_matches_the_reference(dtype, backend):
    mha = _layer("fox", dtype=dtype, backend=backend, block_size=3)
    x = _x(dtype)
    want = _fox_reference(mha, x)
    torch.testing.assert_close(mha(x).double(), want, **tolerances(dtype, ops=OPS))


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_stick_breaking_layer_matches_the_reference(attend_current, dtype):
    enc = StickBreakingAttention(attend_current=attend_current)
    mha = _layer(enc, dtype=dtype, block_size=3)
    x = _x(dtype)
    q, k, v = _heads(mha, x)
    ref = [reference.stick_breaking_attention(q[i], k[i], v[i], attend_current=attend_current)
           for i in range(B)]  # fmt: skip
    want = _project_out(mha, np.stack(ref))
    torch.testing.assert_close(mha(x).double(), want, **tolerances(dtype, ops=OPS))
    if not attend_current:  # the first token has no earlier key: nothing but the bias
        torch.testing.assert_close(mha(x)[:, 0], torch.zeros(B, C, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_path_layer_matches_the_reference(dtype):
    mha = _layer("path", dtype=dtype, block_size=3)
    x = _x(dtype)
    q, k, v = _heads(mha, x)
    enc = mha.position
    params = [enc.direction.weight, enc.strength.weight, enc.strength.bias]
    params = [t.detach().double().numpy() for t in params]
    xs = x.detach().double().numpy()
    ref = []
    for i in range(B):
        w, beta = reference.path_householder(xs[i], *params)
        ref.append(reference.path_attention(q[i], k[i], v[i], w, beta))
    want = _project_out(mha, np.stack(ref))
    torch.testing.assert_close(mha(x).double(), want, **tolerances(dtype, ops=OPS))


def test_path_with_vanishing_strength_is_nope():
    """``beta = 0``: every ``H_t`` is the identity, plain causal attention."""
    path, nope = _layer("path"), _layer("nope")
    with torch.no_grad():
        path.position.strength.weight.zero_()
        path.position.strength.bias.fill_(-1e4)  # 2 sigmoid(-1e4) = 0 in float64
    nope.load_state_dict({k: v for k, v in path.state_dict().items() if "position" not in k})
    x = _x()
    torch.testing.assert_close(path(x), nope(x), **tolerances(torch.float64, ops=OPS))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dape_bias_matches_the_reference(dtype):
    enc = _layer("dape", dtype=dtype).position
    gen = torch.Generator().manual_seed(2)
    q, k = (torch.randn(B, H, T, D, generator=gen).to(dtype) for _ in range(2))
    pos = torch.arange(T)
    got = enc.score_bias(q, k, pos, pos)
    static = enc.static.score_bias(q, k, pos, pos).detach().double().numpy()[0]
    logits = (q.double() @ k.double().transpose(-2, -1)).numpy() / math.sqrt(D)
    first, last = enc.mlp[0], enc.mlp[2]
    params = [
        t.detach().double().numpy() for t in (first.weight, first.bias, last.weight, last.bias)
    ]
    want = np.stack([reference.dape_bias(logits[i], static, *params) for i in range(B)])
    torch.testing.assert_close(got.double(), torch.from_numpy(want), **tolerances(dtype, ops=OPS))


def test_fox_with_constant_gates_is_alibi():
    """``f = exp(-m_h)`` for every token: ``D_ij = -m_h (i - j)``, ALiBi's bias (Lin et al.
    2025, sec. 3)."""
    slopes = posenc.alibi_slopes(H).double()
    fox, alibi = _layer("fox"), _layer("alibi")
    with torch.no_grad():
        fox.position.gate.weight.zero_()
        fox.position.gate.bias.copy_(torch.log(torch.expm1(slopes).reciprocal()))  # logit e^-m
    alibi.load_state_dict({k: v for k, v in fox.state_dict().items() if "position" not in k})
    x = _x()
    torch.testing.assert_close(fox(x), alibi(x), **tolerances(torch.float64, ops=OPS))


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    length=st.integers(1, 9),
    spread=st.floats(0.1, 30.0),
    attend_current=st.booleans(),
)
def test_stick_breaking_weights_break_one_stick(seed, length, spread, attend_current):
    """Weights are in ``[0, 1]``, sum to at most 1 per query, and vanish on hidden keys."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (spread * torch.randn(1, 2, length, D, generator=gen).double() for _ in range(2))
    pos = torch.arange(length)
    w = stick_breaking_weights(q, k, pos, pos, attend_current=attend_current)
    assert torch.isfinite(w).all() and (w >= 0).all()
    assert (w.sum(-1) <= 1 + 4 * length * torch.finfo(w.dtype).eps).all()
    hidden = pos[None, :] > pos[:, None] if attend_current else pos[None, :] >= pos[:, None]
    assert (w[..., hidden] == 0).all()


def test_fox_gates_continue_the_cached_sum():
    enc = _layer("fox").position
    x = _x()
    whole = enc.gates(x)
    first = enc.gates(x[:, :3])
    torch.testing.assert_close(torch.cat((first, enc.gates(x[:, 3:], first)), -2), whole)


# ---------------------------------------------------------------- flash-linear-attention


@pytest.fixture
def fla_ops(monkeypatch):
    """fla's ops with Triton interpreted on the CPU; its autotuner cannot time configs
    without a GPU driver, so each kernel keeps its first config."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("einops")
    autotuner = pytest.importorskip("triton.runtime.autotuner")
    monkeypatch.setattr(
        autotuner.Autotuner, "_bench", lambda self, *a, config=None, **k: [0.0, 0.0, 0.0]
    )
    forgetting = pytest.importorskip("fla.ops.forgetting_attn")
    stick = pytest.importorskip("fla.ops.stickbreaking_attn")
    return forgetting, stick


def _bthd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous()  # [B, H, T, D] -> fla's [B, T, H, D]


def _qkv(seed: int, length: int = 16, dim: int = 16) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, length, dim, generator=gen) for _ in range(3)]


def _attend(enc, q, k, v, gates):
    pos = torch.arange(q.shape[-2])
    masking = Masking(True, pos, pos)
    return attend(q, k, v, position=enc, masking=masking, block_size=8, gates=gates)


def test_fox_matches_fla_forgetting_attention(fla_ops):
    forgetting, _ = fla_ops
    q, k, v = _qkv(0)
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, H, 16) + 2.0)
    cum = log_f.cumsum(-1).unsqueeze(-1)  # what ForgettingAttention.gates returns
    got = _attend(ForgettingAttention(C, H), q, k, v, cum)
    args = (_bthd(q), _bthd(k), _bthd(v), log_f.transpose(1, 2).contiguous())
    fla = forgetting.parallel_forgetting_attn(*args).transpose(1, 2)
    naive = forgetting.naive.naive_forgetting_attn(*args).transpose(1, 2)
    tol = tolerances(torch.float32, ops=64)
    torch.testing.assert_close(got, fla, **tol)
    torch.testing.assert_close(got, naive, **tol)


def test_path_matches_fla_path_attention(fla_ops):
    path_ops = pytest.importorskip("fla.ops.path_attn")
    q, k, v = _qkv(3)
    gen = torch.Generator().manual_seed(4)
    w = torch.nn.functional.normalize(torch.randn(B, H, 16, 16, generator=gen), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(B, H, 16, generator=gen))
    index = torch.arange(16.0).expand(B, H, 16)
    gates = torch.cat((w, beta[..., None], index[..., None]), dim=-1)
    got = _attend(PaTH(C, H, head_dim=16), q, k, v, gates)
    args = (_bthd(q), _bthd(k), _bthd(v), _bthd(w), beta.transpose(1, 2).contiguous())
    zero_g = torch.zeros(B, 16, H)
    naive = path_ops.naive_path_attn(*args, zero_g, 16**-0.5, chunk_size=8).transpose(1, 2)
    fla, _ = path_ops.parallel_path_attn(*args, g=zero_g, scale=16**-0.5)
    tol = tolerances(torch.float32, ops=64)
    torch.testing.assert_close(got, naive, **tol)
    torch.testing.assert_close(got, fla.transpose(1, 2), **tol)


@pytest.mark.parametrize("attend_current", [False, True])
def test_stick_breaking_matches_fla(fla_ops, attend_current):
    _, stick = fla_ops
    q, k, v = _qkv(1)
    enc = StickBreakingAttention(attend_current=attend_current)
    got = _attend(enc, q, k, v, q.new_zeros(B, 1, 16, 0))
    args = (_bthd(q), _bthd(k), _bthd(v))
    fla, _ = stick.parallel_stickbreaking_attn(*args, attend_current=attend_current)
    naive, _ = stick.naive.naive_stickbreaking_attn(*args, attend_current=attend_current)
    tol = tolerances(torch.float32, ops=64)
    torch.testing.assert_close(got, fla.transpose(1, 2), **tol)
    torch.testing.assert_close(got, naive.transpose(1, 2), **tol)


# ------------------------------------------------------------------------- bad input


def test_weights_encodings_refuse_bidirectional_attention_and_composition():
    for name in ("fox", "stick_breaking", "path"):
        with pytest.raises(ValueError, match="causal=False"):
            posenc.build(name, d_model=C, num_heads=H, causal=False)
        with pytest.raises(ValueError, match="cannot be composed"):
            posenc.Compose([posenc.ALiBi(H), posenc.build(name, d_model=C, num_heads=H)])


def test_weights_attention_without_gates_names_the_shape():
    q, k, v = _qkv(2, length=5, dim=D)
    with pytest.raises(ValueError, match=r"Tk=5"):
        _attend(ForgettingAttention(C, H), q, k, v, None)


def test_bad_constructor_and_gate_inputs_raise():
    with pytest.raises(TypeError, match="SCORE"):
        DAPE(H, bias=posenc.RotaryEmbedding(D))
    with pytest.raises(ValueError, match="width"):
        DAPE(H, width=0)
    with pytest.raises(ValueError, match="d_model=16"):
        ForgettingAttention(C, H).gates(torch.randn(B, T, C + 1))
    with pytest.raises(TypeError, match="attend_current"):
        StickBreakingAttention(attend_current=1)
