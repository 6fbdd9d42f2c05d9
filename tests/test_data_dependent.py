"""FoX, stick-breaking, PaTH and DAPE against their float64 references (``posenc.reference``)
and against flash-linear-attention's kernels (``fla-core``, Triton interpreted on CPU).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import reference
from posenc.attention.backends import Masking, attend
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
@pytest.mark.parametrize("chunk_size", [1, 3, 32])
def test_path_layer_matches_the_reference(dtype, chunk_size):
    """Chunks of 1 (the plain sweep), 3 (several, the last one partial) and 32 (one)."""
    mha = _layer(PaTH(C, H, chunk_size=chunk_size), dtype=dtype, block_size=3)
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


WORKER = Path(__file__).with_name("_fla_worker.py")
FLA_CASES = ["fox", "stick_breaking-False", "stick_breaking-True", "path"]


@pytest.fixture(scope="module")
def fla_results(tmp_path_factory):
    """``tests/_fla_worker.py``'s outputs: posenc's and fla's on the same inputs, computed
    in a process of their own (Triton interpreted on the CPU, see the worker)."""
    for module in ("einops", "triton", "fla.ops.path_attn"):
        pytest.importorskip(module)
    out = tmp_path_factory.mktemp("fla") / "results.pt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [sys.executable, str(WORKER), str(out)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return torch.load(out)


@pytest.mark.parametrize("case", FLA_CASES)
@pytest.mark.parametrize("kernel", ["fla", "naive"])
def test_matches_flash_linear_attention(fla_results, case, kernel):
    """FoX against ``parallel_forgetting_attn``, stick-breaking against
    ``parallel_stickbreaking_attn`` (both ``attend_current``), PaTH against
    ``parallel_path_attn`` (Triton kernels), and each against fla's own naive version."""
    got = fla_results[case]
    torch.testing.assert_close(got["posenc"], got[kernel], **tolerances(torch.float32, ops=64))


# ------------------------------------------------------------------------- bad input


def test_weights_encodings_refuse_bidirectional_attention_and_composition():
    for name in ("fox", "stick_breaking", "path"):
        with pytest.raises(ValueError, match="causal=False"):
            posenc.build(name, d_model=C, num_heads=H, causal=False)
        with pytest.raises(ValueError, match="cannot be composed"):
            posenc.Compose([posenc.ALiBi(H), posenc.build(name, d_model=C, num_heads=H)])


def test_weights_attention_without_gates_names_the_shape():
    q, k, v = (torch.randn(B, H, 5, D) for _ in range(3))
    pos = torch.arange(5)
    with pytest.raises(ValueError, match=r"Tk=5"):
        attend(q, k, v, position=ForgettingAttention(C, H), masking=Masking(True, pos, pos))


def test_bad_constructor_and_gate_inputs_raise():
    with pytest.raises(TypeError, match="SCORE"):
        DAPE(H, bias=posenc.RotaryEmbedding(D))
    with pytest.raises(ValueError, match="width"):
        DAPE(H, width=0)
    with pytest.raises(ValueError, match="d_model=16"):
        ForgettingAttention(C, H).gates(torch.randn(B, T, C + 1))
    with pytest.raises(TypeError, match="attend_current"):
        StickBreakingAttention(attend_current=1)


@pytest.mark.parametrize("name", ["fox", "stick_breaking", "path", "dape"])
def test_gradients_match_finite_differences(name):
    """``gradcheck`` of a small float64 layer with respect to its input and the encoding's
    own parameters (gates, Householder directions, MLP): through the cumulative sums, the
    stick's log-space products and PaTH's sweep over the keys. The eager backend: the
    chunked one recomputes a bias in the backward pass from the module's own parameters,
    which ``functional_call`` has restored by then (its gradients equal the eager ones:
    ``test_attention_registry``)."""
    torch.manual_seed(0)
    small = {"width": 4} if name == "dape" else {}  # few parameters: few perturbations
    position = posenc.build(name, d_model=8, num_heads=2, head_dim=4, **small)
    mha = posenc.MultiHeadAttention(8, 2, position=position, backend="eager").double()
    names = [f"position.{n}" for n, _ in mha.position.named_parameters()]
    assert names or name == "stick_breaking"

    def run(x, *params):
        return torch.func.functional_call(mha, dict(zip(names, params, strict=True)), (x,))

    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    params = [mha.get_parameter(n).detach().clone().requires_grad_(True) for n in names]
    assert torch.autograd.gradcheck(run, (x, *params), eps=1e-6, atol=1e-7)
