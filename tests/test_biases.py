"""Shaw, KERPLE, Sandwich, FIRE and CoPE against their float64 references, plus shift
invariance of every offset bias (ALiBi and T5 too), query blocks, positivity, gradients,
score_mod and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import posenc
from conftest import tolerances
from posenc import FIRE, KERPLE, CoPE, Sandwich, ShawRelativePosition
from posenc.encodings.cope import cope_positions
from posenc.encodings.fire import _grid_score_mod, fire_bias
from posenc.reference import cope_bias as ref_cope
from posenc.reference import fire_bias as ref_fire
from posenc.reference import kerple_bias as ref_kerple
from posenc.reference import sandwich_bias as ref_sandwich
from posenc.reference import shaw_attention as ref_shaw_attention
from posenc.reference import shaw_logits as ref_shaw_logits

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
POSITIONS = [
    (torch.arange(9), torch.arange(9)),
    (torch.arange(6, 9), torch.arange(9)),  # a block of queries
    (torch.tensor([[0, 1, 2, 3], [20, 21, 22, 23]]), torch.tensor([[0, 1, 2, 3], [4, 9, 21, 23]])),
    (torch.tensor([30, 2, 17]), torch.tensor([0, 5, 9, 30])),  # arbitrary
]


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _qk(batch, heads, tq, tk, dim=8, dtype=torch.float64):
    return _randn(batch, heads, tq, dim, seed=1).to(dtype), _randn(
        batch, heads, tk, dim, seed=2
    ).to(dtype)


def _rows(fn, q_pos, k_pos, *tensors):
    """Stack ``fn(q_row, k_row, *tensor_rows)`` over the batch (positions may be shared)."""
    qs, ks = q_pos.reshape(-1, q_pos.shape[-1]), k_pos.reshape(-1, k_pos.shape[-1])
    rows = max(len(qs), len(ks), *(len(t) for t in tensors))
    out = [
        fn(
            qs[b % len(qs)].numpy(),
            ks[b % len(ks)].numpy(),
            *(t[b].double().numpy() for t in tensors),
        )
        for b in range(rows)
    ]
    return torch.from_numpy(np.stack(out))


def _position_only(enc, q_pos, k_pos, dtype=torch.float32):
    batch = max(p.shape[0] if p.dim() == 2 else 1 for p in (q_pos, k_pos))
    q, k = _qk(batch, enc.num_heads, q_pos.shape[-1], k_pos.shape[-1], dtype=dtype)
    return enc.score_bias(q, k, q_pos, k_pos)


def _check_shift_invariance(enc, q, k, shift):
    q_pos, k_pos = torch.tensor(q), torch.tensor(k)
    base = _position_only(enc, q_pos, k_pos)
    torch.testing.assert_close(
        _position_only(enc, q_pos + shift, k_pos + shift), base, rtol=0, atol=0
    )


def _check_block_rows(enc, q, k, positions, start, stop, **kw):
    full = enc.score_bias(q, k, positions, positions, **kw)
    block = enc.score_bias(q[:, :, start:stop], k, positions[start:stop], positions, **kw)
    torch.testing.assert_close(block, full[:, :, start:stop], **tolerances(q.dtype, ops=2))


def _check_score_mod(enc, length=16, heads=None, dim=8):
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    heads = heads or enc.num_heads
    q, k, v = (_randn(1, heads, length, dim, seed=s, dtype=torch.float32) for s in range(3))
    with torch.no_grad():
        try:
            out = flex.flex_attention(q, k, v, score_mod=enc.score_mod())
        except Exception as err:  # pragma: no cover - depends on the torch build
            pytest.skip(f"flex_attention does not run here: {err}")
        bias = enc.score_bias(q, k, torch.arange(length), torch.arange(length))
    dense = torch.softmax(q @ k.transpose(-1, -2) / dim**0.5 + bias, -1) @ v
    torch.testing.assert_close(out, dense, **tolerances(torch.float32, ops=64))


shifts = st.integers(-(10**6), 10**6)
position_lists = st.lists(st.integers(0, 300), min_size=1, max_size=5)
flex_warning = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.mark.parametrize("name", ["alibi", "t5", "shaw", "kerple", "sandwich", "fire", "cope"])
def test_registry_builds_with_model_context(name):
    enc = posenc.build(name, d_model=32, num_heads=4, head_dim=8, max_len=16, causal=True)
    assert enc.sites & posenc.Site.SCORE
    q, k = _qk(2, 4, 5, 5, dtype=torch.float32)
    assert enc.score_bias(q, k, torch.arange(5), torch.arange(5)).shape[1:] == (4, 5, 5)


# ----------------------------------------------------------------------------- Shaw


def _shaw(clip=3, dim=8):
    enc = ShawRelativePosition(dim, max_relative_position=clip).double()
    with torch.no_grad():
        enc.key_table.copy_(_randn(2 * clip + 1, dim, seed=5))
        enc.value_table.copy_(_randn(2 * clip + 1, dim, seed=6))
    return enc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_pos, k_pos", POSITIONS)
def test_shaw_logits_and_attention_match_reference(dtype, q_pos, k_pos):
    enc = _shaw()
    q, k = _qk(2, 3, q_pos.shape[-1], k_pos.shape[-1], dtype=dtype)
    v = _randn(*k.shape, seed=3).to(dtype)
    logits = q @ k.transpose(-1, -2) * 8**-0.5 + enc.score_bias(q, k, q_pos, k_pos)
    tables = (enc.key_table.detach().numpy(),)
    expected = _rows(
        lambda a, b, qq, kk: ref_shaw_logits(qq, kk, a, b, *tables), q_pos, k_pos, q, k
    )
    torch.testing.assert_close(logits.double(), expected, **tolerances(dtype, ops=16))

    visible = q_pos.unsqueeze(-1) >= k_pos.unsqueeze(-2)  # the reference is causal
    visible = visible.view(-1, 1, *visible.shape[-2:])
    work = torch.float64 if dtype == torch.float64 else torch.float32
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), -1, dtype=work).to(dtype)
    out = probs @ v + enc.value_term(probs, q_pos, k_pos)
    tables = (enc.key_table.detach().numpy(), enc.value_table.detach().numpy())
    expected = _rows(
        lambda a, b, qq, kk, vv: ref_shaw_attention(qq, kk, vv, a, b, *tables),
        q_pos,
        k_pos,
        q,
        k,
        v,
    )
    torch.testing.assert_close(out.double(), expected, **tolerances(dtype, ops=32))


@given(shift=shifts, q=position_lists, k=position_lists)
def test_shaw_shift_invariance(shift, q, k):
    enc = _shaw()
    qt, kt = _qk(1, 2, len(q), len(k))
    probs = torch.softmax(_randn(1, 2, len(q), len(k), seed=4), -1)
    q_pos, k_pos = torch.tensor(q), torch.tensor(k)
    for hook, args in ((enc.score_bias, (qt, kt)), (enc.value_term, (probs,))):
        base = hook(*args, q_pos, k_pos)
        torch.testing.assert_close(hook(*args, q_pos + shift, k_pos + shift), base, rtol=0, atol=0)


def test_shaw_query_block_and_gradients():
    enc = _shaw()
    q, k = _qk(2, 3, 12, 12)
    _check_block_rows(enc, q, k, torch.arange(12), 4, 9)
    probs = torch.softmax(_randn(2, 3, 12, 12, seed=4), -1)
    full = enc.value_term(probs, torch.arange(12), torch.arange(12))
    block = enc.value_term(probs[:, :, 4:9], torch.arange(4, 9), torch.arange(12))
    torch.testing.assert_close(block, full[:, :, 4:9])
    (enc.score_bias(q, k, torch.arange(12), torch.arange(12)).sum() + full.sum()).backward()
    assert enc.key_table.grad.abs().sum() > 0 and enc.value_table.grad.abs().sum() > 0


def test_shaw_bad_input_raises():
    with pytest.raises(ValueError, match="head_dim must be >= 1, got 0"):
        ShawRelativePosition(0)
    with pytest.raises(ValueError, match="max_relative_position must be >= 1, got 0"):
        ShawRelativePosition(8, max_relative_position=0)
    enc = _shaw()
    q, k = _qk(1, 2, 3, 3, dim=4)
    with pytest.raises(ValueError, match="head_dim 4, expected 8"):
        enc.score_bias(q, k, torch.arange(3), torch.arange(3))
    q, k = _qk(1, 2, 3, 3)
    with pytest.raises(TypeError, match="integer positions"):
        enc.score_bias(q, k, torch.arange(3.0), torch.arange(3))
    with pytest.raises(ValueError, match=r"probs must have 4 dimensions, got shape \(3, 3\)"):
        enc.value_term(torch.ones(3, 3), torch.arange(3), torch.arange(3))
    with pytest.raises(ValueError, match="5 keys"):
        enc.value_term(torch.ones(1, 2, 3, 5), torch.arange(3), torch.arange(4))


# --------------------------------------------------------------------------- KERPLE


def _kerple(kernel):
    enc = KERPLE(3, kernel=kernel).double()
    with torch.no_grad():
        enc.rho1.copy_(_randn(3, seed=7))
        enc.rho2.copy_(_randn(3, seed=8))
    return enc


@pytest.mark.parametrize("kernel", ["log", "power"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "q_pos, k_pos", [*POSITIONS, (torch.tensor([0.5, 7.25]), torch.arange(4.0))]
)
def test_kerple_matches_reference(kernel, dtype, q_pos, k_pos):
    enc = _kerple(kernel)
    r1, r2 = enc.r1.detach().numpy(), enc.r2.detach().numpy()
    expected = _rows(lambda a, b: ref_kerple(a, b, r1, r2, kernel=kernel), q_pos, k_pos)
    torch.testing.assert_close(
        _position_only(enc, q_pos, k_pos, dtype).double(), expected, **tolerances(dtype)
    )


OFFSET_BIASES = {  # biases of q_pos - k_pos alone (FIRE, Shaw, CoPE: their own tests)
    "alibi-causal": lambda: posenc.ALiBi(3),
    "alibi-symmetric": lambda: posenc.ALiBi(3, causal=False),
    "t5-bidirectional": lambda: posenc.T5RelativeBias(2),
    "t5-causal": lambda: posenc.T5RelativeBias(2, bidirectional=False),
    "kerple-log": lambda: _kerple("log"),
    "kerple-power": lambda: _kerple("power"),
    "sandwich": lambda: Sandwich(3, dim=16),
}


@pytest.mark.parametrize("name", sorted(OFFSET_BIASES))
@given(shift=shifts, q=position_lists, k=position_lists)
def test_offset_biases_are_shift_invariant(name, shift, q, k):
    _check_shift_invariance(OFFSET_BIASES[name](), q, k, shift)


@pytest.mark.parametrize("kernel, high1, high2", [("log", 2.0, 1.0), ("power", 1.0, 2.0)])
def test_kerple_initialisation_follows_the_paper(kernel, high1, high2):
    enc = KERPLE(64, kernel=kernel)
    assert enc.r1.min() >= 0.01 and enc.r1.max() <= high1
    assert enc.r2.min() >= 0.01 and enc.r2.max() <= high2
    fixed = KERPLE(2, kernel=kernel, r1=0.5, r2=high2)
    torch.testing.assert_close(fixed.r1, torch.full((2,), 0.5))
    torch.testing.assert_close(fixed.r2, torch.full((2,), high2))


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_parameters_stay_in_range_and_get_gradients(kernel):
    enc = KERPLE(4, kernel=kernel)
    opt = torch.optim.SGD(enc.parameters(), lr=1e4)
    bias = _position_only(enc, torch.arange(10), torch.arange(10))
    bias.sum().neg().backward()  # push every penalty, hence r1 and r2, down hard
    assert torch.isfinite(enc.rho1.grad).all() and enc.rho1.grad.abs().min() > 0
    assert torch.isfinite(enc.rho2.grad).all() and enc.rho2.grad.abs().min() > 0
    opt.step()
    assert (enc.r1 >= 0.01).all() and (enc.r2 >= 0.01).all()  # the paper's floor
    if kernel == "power":
        assert (enc.r2 <= 2).all()
    assert torch.isfinite(_position_only(enc, torch.arange(10), torch.arange(10))).all()


@flex_warning
@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_score_mod(kernel):
    _check_score_mod(KERPLE(2, kernel=kernel))


def test_kerple_bad_input_raises():
    with pytest.raises(ValueError, match="'gauss'"):
        KERPLE(2, kernel="gauss")
    with pytest.raises(ValueError, match=r"got 2\.5"):
        KERPLE(2, kernel="power", r2=2.5)
    with pytest.raises(ValueError, match=r"r2 must be >= 0\.01, got 0\.0"):
        KERPLE(2, r2=0.0)
    with pytest.raises(ValueError, match=r"r1 must be >= 0\.01, got -1\.0"):
        KERPLE(2, r1=-1.0)
    with pytest.raises(ValueError, match="num_heads must be >= 1, got 0"):
        KERPLE(0)


# ------------------------------------------------------------------------- Sandwich


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "q_pos, k_pos",
    [
        *POSITIONS,
        (torch.arange(100000, 100004), torch.arange(99990, 100004)),
        (torch.tensor([1.5]), torch.arange(3.0)),
    ],
)
def test_sandwich_matches_reference(dtype, q_pos, k_pos):
    enc = Sandwich(4, dim=32)
    expected = _rows(lambda a, b: ref_sandwich(a, b, 4, dim=32), q_pos, k_pos)
    torch.testing.assert_close(
        _position_only(enc, q_pos, k_pos, dtype).double(), expected, **tolerances(dtype)
    )


@given(q=position_lists, k=position_lists)
def test_sandwich_bias_is_never_positive(q, k):
    bias = _position_only(Sandwich(3, dim=16), torch.tensor(q), torch.tensor(k))
    assert (bias <= 0).all()  # p_i . p_j <= d'/2, equality on the diagonal


def test_sandwich_general_path_in_frequency_chunks_equals_toeplitz():
    enc = Sandwich(2)  # 64 frequencies; 300 x 300 offsets are summed in two chunks
    positions = torch.arange(300)
    fast = _position_only(enc, positions, positions)
    per_row = positions.repeat(2, 1)  # elementwise path
    torch.testing.assert_close(_position_only(enc, per_row, per_row), fast.expand(2, -1, -1, -1))


@flex_warning
def test_sandwich_score_mod():
    _check_score_mod(Sandwich(2, dim=16))


def test_sandwich_bad_input_raises():
    with pytest.raises(ValueError, match="dim must be even, got 127"):
        Sandwich(2, dim=127)
    with pytest.raises(ValueError, match="num_heads must be >= 1, got -2"):
        Sandwich(-2)


# ----------------------------------------------------------------------------- FIRE


def _fire(init_L=6.0):
    enc = FIRE(3, hidden=5, init_c=0.3, init_L=init_L).double()
    with torch.no_grad():
        for i, p in enumerate(enc.mlp.parameters()):
            p.copy_(_randn(*p.shape, seed=10 + i))
    return enc


def _fire_reference(enc, q_pos, k_pos):
    lin1, lin2 = enc.mlp[0], enc.mlp[2]
    weights = {
        "c": enc.c.item(),
        "threshold": enc.threshold.item(),
        "w1": lin1.weight.detach().numpy(),
        "b1": lin1.bias.detach().numpy(),
        "w2": lin2.weight.detach().numpy(),
        "b2": lin2.bias.detach().numpy(),
    }
    return _rows(lambda a, b: ref_fire(a, b, **weights), q_pos, k_pos)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "q_pos, k_pos", [*POSITIONS, (torch.tensor([2.5, 9.0]), torch.arange(4.0))]
)
def test_fire_matches_reference(dtype, q_pos, k_pos):
    enc = _fire()
    expected = _fire_reference(enc, q_pos, k_pos)
    torch.testing.assert_close(
        _position_only(enc, q_pos, k_pos, dtype).double(), expected, **tolerances(dtype, ops=16)
    )
    float_module = _position_only(_fire().float(), q_pos, k_pos, torch.float32)
    torch.testing.assert_close(float_module.double(), expected, **tolerances(torch.float32, ops=64))
    pure = fire_bias(q_pos, k_pos, enc.mlp, c=enc.c.detach(), threshold=enc.threshold.detach())
    torch.testing.assert_close(pure, expected)


@given(shift=st.integers(-50, 50), q=st.lists(st.integers(50, 400), min_size=1, max_size=5))
def test_fire_shift_invariant_below_threshold_only(shift, q):
    enc = _fire(init_L=1000.0)  # every position below L: a function of i - j only
    _check_shift_invariance(enc, q, [50, 51, 300], shift)


def test_fire_progressive_normalization_depends_on_the_query_position():
    enc = _fire(init_L=4.0)
    near = _position_only(enc, torch.tensor([10]), torch.tensor([5]))
    far = _position_only(enc, torch.tensor([1010]), torch.tensor([1005]))
    assert not torch.allclose(near, far)


def test_fire_query_block_and_gradients():
    enc = _fire(init_L=100.0)
    q, k = _qk(1, 3, 12, 12)
    _check_block_rows(enc, q, k, torch.arange(12), 3, 7)
    _position_only(enc, torch.arange(12), torch.arange(12)).square().sum().backward()
    for name, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@flex_warning
def test_fire_score_mod():
    _check_score_mod(_fire().float())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_heads": 0}, "num_heads must be >= 1, got 0"),
        ({"hidden": 0}, "hidden must be >= 1, got 0"),
        ({"init_c": 0.0}, "init_c must be > 0, got 0.0"),
        ({"init_L": -1.0}, "init_L must be > 0, got -1.0"),
        ({"eps": -1.0}, "eps must be >= 0.0, got -1.0"),
    ],
)
def test_fire_bad_input_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FIRE(**{"num_heads": 2, **kwargs})


# ----------------------------------------------------------------------------- CoPE


def _cope(npos_max=4, dim=8):
    enc = CoPE(dim, npos_max=npos_max).double()
    with torch.no_grad():
        enc.pos_emb.copy_(_randn(npos_max, dim, seed=9))
    return enc


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "q_pos, k_pos",
    [
        (torch.arange(7), torch.arange(7)),
        (torch.tensor([6]), torch.arange(7)),  # one decoding step against the cache
        (torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]]), torch.tensor([[0, 1, 2, 3], [2, 5, 7, 8]])),
    ],
)
def test_cope_matches_reference(dtype, q_pos, k_pos):
    enc = _cope()
    q, k = _qk(2, 2, q_pos.shape[-1], k_pos.shape[-1], dtype=dtype)
    emb = enc.pos_emb.detach().numpy()
    expected = _rows(lambda a, b, qq, kk: ref_cope(qq, kk, a, b, emb), q_pos, k_pos, q, k)
    bias = enc.score_bias(q, k, q_pos, k_pos)
    assert bias.dtype == dtype
    torch.testing.assert_close(bias.double(), expected, **tolerances(dtype, ops=32))


def test_cope_counts_keys_when_every_gate_is_open():
    # q . k -> +inf: every gate is 1, so p_ij = number of visible keys j..i, clipped
    q = torch.full((1, 1, 6, 4), 100.0, dtype=torch.float64)
    p = cope_positions(q, q, torch.arange(6), torch.arange(6), npos_max=4)[0, 0]
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    expected = torch.where(j <= i, (i - j + 1).clamp(max=3), 0).double()
    torch.testing.assert_close(p, expected)


def test_cope_query_block_decoding_and_gradients():
    enc = _cope()
    q, k = _qk(1, 2, 9, 9)
    _check_block_rows(enc, q, k, torch.arange(9), 3, 7)
    _check_block_rows(enc, q, k, torch.arange(9), 8, 9)  # Tq = 1 against every cached key
    q.requires_grad_(True)
    enc.score_bias(q, k, torch.arange(9), torch.arange(9)).square().sum().backward()
    assert enc.pos_emb.grad.abs().sum() > 0 and q.grad.abs().sum() > 0


def test_cope_bad_input_raises():
    with pytest.raises(ValueError, match="causal=False"):
        CoPE(8, causal=False)
    with pytest.raises(ValueError, match="causal=False"):
        posenc.MultiHeadAttention(16, 2, position="cope", causal=False)
    with pytest.raises(ValueError, match="npos_max must be >= 1, got 0"):
        CoPE(8, npos_max=0)
    enc = CoPE(8)
    q, k = _qk(1, 2, 3, 3, dim=4)
    with pytest.raises(ValueError, match="head_dim=4"):
        enc.score_bias(q, k, torch.arange(3), torch.arange(3))
    q, k = _qk(1, 2, 3, 3)
    with pytest.raises(ValueError, match=r"q \(1, 2, 3, 8\) and k \(1, 1, 3, 8\)"):
        enc.score_bias(q, k[:, :1], torch.arange(3), torch.arange(3))
    assert isinstance(enc.pos_emb, nn.Parameter)


@given(
    hidden=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
    tie=st.booleans(),
    flat=st.booleans(),
)
def test_fire_piecewise_form_equals_the_mlp(hidden, seed, tie, flat):
    """``FIRE.piecewise``: the ReLU MLP of a scalar as slopes and intercepts between its
    breaks, equal to the MLP everywhere (ties between units and units with no slope
    included), in float64."""
    enc = FIRE(3, hidden=hidden).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
        w1, b1 = enc.mlp[0].weight[:, 0], enc.mlp[0].bias
        if tie and hidden > 1:  # two units turning at the same input
            w1[1], b1[1] = 2 * w1[0], 2 * b1[0]
        if flat:
            w1[-1] = 0.0
    breaks, slopes, intercepts = enc.piecewise()
    u = torch.cat((torch.linspace(-4, 4, 401, dtype=torch.float64), breaks))
    piece = torch.searchsorted(breaks, u)  # breaks[piece - 1] < u <= breaks[piece]
    got = slopes[:, piece] * u + intercepts[:, piece]  # [H, N]
    want = enc.mlp(u[:, None]).T
    torch.testing.assert_close(got, want, **tolerances(torch.float64, ops=64 * hidden))


@pytest.mark.parametrize("length", [16, 700])
@pytest.mark.parametrize("causal", [True, False])
def test_fire_grid_score_mod_equals_the_bias(length, causal):
    """``FIRE.score_mod(length)`` (the MLP read piece by piece through a grid of its
    input) adds the float64 bias at every index pair below ``length``."""
    enc = FIRE(3, hidden=32, init_L=64.0)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    idx = torch.arange(length)
    q_idx, kv_idx = (t.reshape(-1) for t in torch.meshgrid(idx, idx, indexing="ij"))
    if causal:
        keep = kv_idx <= q_idx
        q_idx, kv_idx = q_idx[keep], kv_idx[keep]
    c, threshold = enc.c.detach(), enc.threshold.detach()
    assert _grid_score_mod(enc, length, c, threshold, torch.float32) is not None  # no fallback
    mods = {"grid": enc.score_mod(length), "mlp": enc.score_mod()}
    for h in range(3):
        want = enc.double()._bias(q_idx.double(), kv_idx.double())[:, h]
        enc.float()
        for mod in mods.values():
            got = _score_mod_bias(mod, h, q_idx, kv_idx)
            torch.testing.assert_close(got.double(), want, **tolerances(torch.float32, ops=64))


def _score_mod_bias(mod, head: int, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """What ``mod`` adds to a zero score at head ``head`` for each index pair."""
    zero, h = torch.zeros(()), torch.tensor(head)
    return torch.vmap(lambda a, b: mod(zero, zero, h, a, b))(q_idx, kv_idx)


def test_fire_grid_falls_back_to_the_mlp_when_breaks_crowd():
    """Two breaks closer than the finest grid's cell: the MLP form, still exact."""
    enc = FIRE(2, hidden=4)
    with torch.no_grad():
        enc.mlp[0].weight.copy_(torch.tensor([[1.0], [1.0], [-1.0], [2.0]]))
        enc.mlp[0].bias.copy_(torch.tensor([-0.5, -0.5 - 1e-7, 0.25, -0.2]))
    c, threshold = enc.c.detach(), enc.threshold.detach()
    assert _grid_score_mod(enc, 64, c, threshold, torch.float32) is None
    q_idx, kv_idx = torch.arange(64), torch.arange(64).flip(0) // 2
    want = enc.double()._bias(q_idx.double(), kv_idx.double())
    got = _score_mod_bias(enc.float().score_mod(64), 1, q_idx, kv_idx)
    torch.testing.assert_close(got.double(), want[:, 1], **tolerances(torch.float32, ops=64))
