"""posenc.MultiHeadAttention against a float64 NumPy reference of masked attention.

Four small encodings defined here exercise every hook (QK rotation, a learned relative
SCORE table, a content-dependent causal SCORE bias, a relative VALUE table); the NumPy
reference re-derives each from its formula. Registered encodings are covered by
test_attention_registry.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor, nn

import posenc
from conftest import tolerances
from posenc import Compose, KVCache, MultiHeadAttention, PositionalEncoding, Site
from posenc.attention.backends import DEFAULT_BLOCK_SIZE, Masking, attend, peak_tensor_bytes

C, H, KV, R = 16, 4, 2, 3  # d_model, heads, kv heads, clipping radius of the tables
D = C // H
B, T = 2, 9
OPS = 2 * C + D + 2 * T  # roundings along the longest chain: projections, logits, sums


def _relative(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Clipped ``k_pos - q_pos`` shifted to a table index: ``[Tq, Tk]`` or ``[B, Tq, Tk]``."""
    return (k_pos[..., None, :] - q_pos[..., :, None]).clamp(-R, R) + R


class PairRotation(PositionalEncoding):
    """QK: rotate feature pairs (2i, 2i+1) by ``pos * 10000^(-2i/D)``."""

    sites = Site.QK

    def __init__(self) -> None:
        super().__init__()
        self.inv_freq = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)

    def _turn(self, x: Tensor, pos: Tensor) -> Tensor:
        angle = pos.to(torch.float64)[..., None] * self.inv_freq  # [T, D/2] | [B, T, D/2]
        if angle.dim() == 3:
            angle = angle[:, None]
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)

    def rotate(self, q, k, q_pos, k_pos):
        return self._turn(q, q_pos), self._turn(k, k_pos)


class RelTable(PositionalEncoding):
    """SCORE: a learned bias per head and clipped distance ``k_pos - q_pos``."""

    sites = Site.SCORE

    def __init__(self, heads: int = H) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(heads, 2 * R + 1, dtype=torch.float64))

    def score_bias(self, q, k, q_pos, k_pos):
        bias = self.table[:, _relative(q_pos, k_pos)]  # [H, Tq, Tk] | [H, B, Tq, Tk]
        return bias[None] if bias.dim() == 3 else bias.transpose(0, 1)


class GatedCount(PositionalEncoding):
    """SCORE, causal only: ``-s_h * sum_{j' >= j, visible} sigmoid(q_i . k_j' / sqrt(D))``."""

    sites = Site.SCORE
    causal_only = True

    def __init__(self) -> None:
        super().__init__()
        self.slopes = nn.Parameter(torch.rand(H, dtype=torch.float64) + 0.5)

    def score_bias(self, q, k, q_pos, k_pos):
        visible = k_pos[..., None, :] <= q_pos[..., :, None]
        visible = visible[:, None] if visible.dim() == 3 else visible
        gates = torch.sigmoid(q @ k.transpose(-2, -1) / D**0.5) * visible
        return -self.slopes[:, None, None].to(q.dtype) * gates.flip(-1).cumsum(-1).flip(-1)


class RelValue(PositionalEncoding):
    """VALUE: ``sum_j p_ij E[clip(k_pos_j - q_pos_i)]`` with a learned ``E [2R+1, D]``."""

    sites = Site.VALUE

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(2 * R + 1, D, dtype=torch.float64))

    def value_term(self, probs, q_pos, k_pos):
        emb = self.table[_relative(q_pos, k_pos)].to(probs.dtype)
        pattern = "bhqk,qkd->bhqd" if emb.dim() == 3 else "bhqk,bqkd->bhqd"
        return torch.einsum(pattern, probs, emb)


KINDS = {
    "none": lambda: None,
    "rotation": PairRotation,
    "table": RelTable,
    "gated": GatedCount,
    "value": RelValue,
}


# ------------------------------------------------------------------ float64 reference


def _np_softmax_rows(logits: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Row softmax over visible entries; rows without any visible entry are all zero."""
    out = np.zeros_like(logits)
    for i in range(logits.shape[0]):
        if visible[i].any():
            e = np.exp(logits[i, visible[i]] - logits[i, visible[i]].max())
            out[i, visible[i]] = e / e.sum()
    return out


def reference(x, mha, kind, pos, *, kpm=None, seg=None) -> np.ndarray:
    """Attention written from its definition, one sequence and head at a time."""
    w = {
        n: getattr(mha, n).weight.detach().double().numpy()
        for n in ("q_proj", "k_proj", "v_proj", "out_proj")
    }
    enc = mha.position
    heads = []
    for b in range(x.shape[0]):
        p = pos[b].astype(np.float64)
        visible = np.ones((len(p), len(p)), dtype=bool)
        if mha.causal:
            visible &= p[None, :] <= p[:, None]
        if kpm is not None:
            visible &= kpm[b][None, :]
        if seg is not None:
            visible &= seg[b][None, :] == seg[b][:, None]
        rel = np.clip(p[None, :] - p[:, None], -R, R).astype(int) + R  # [Tq, Tk]
        per_head = []
        for h in range(H):
            g = h // (H // KV)
            q = x[b] @ w["q_proj"][h * D : (h + 1) * D].T
            k = x[b] @ w["k_proj"][g * D : (g + 1) * D].T
            v = x[b] @ w["v_proj"][g * D : (g + 1) * D].T
            if kind == "rotation":
                angle = p[:, None] * 10000.0 ** (-np.arange(0, D, 2) / D)
                for m in (q, k):
                    a, c = m[:, 0::2].copy(), m[:, 1::2].copy()
                    m[:, 0::2] = a * np.cos(angle) - c * np.sin(angle)
                    m[:, 1::2] = a * np.sin(angle) + c * np.cos(angle)
            logits = q @ k.T / np.sqrt(D)
            if kind == "table":
                logits = logits + enc.table.detach().double().numpy()[h][rel]
            if kind == "gated":
                gates = visible / (1.0 + np.exp(-logits))
                count = np.array(
                    [[gates[i, j:].sum() for j in range(len(p))] for i in range(len(p))]
                )
                logits = logits - enc.slopes.detach().double().numpy()[h] * count
            probs = _np_softmax_rows(logits, visible)
            out = probs @ v
            if kind == "value":
                out = out + np.einsum("qk,qkd->qd", probs, enc.table.detach().double().numpy()[rel])
            per_head.append(out)
        heads.append(np.concatenate(per_head, axis=-1) @ w["out_proj"].T)
    return np.stack(heads)


def make(kind: str, *, causal: bool = True, seed: int = 0, **kwargs) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return (
        MultiHeadAttention(C, H, position=KINDS[kind](), causal=causal, num_kv_heads=KV, **kwargs)
        .double()
        .eval()
    )


def inputs(seed: int = 0):
    """x [B, T, C]; per-sequence shifted positions; key padding on the left of sequence 1."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=gen, dtype=torch.float64)
    pos = torch.stack((torch.arange(T) + 3, torch.arange(T) - 2))
    kpm = torch.ones(B, T, dtype=torch.bool)
    kpm[1, :2] = False
    return x, pos, kpm


CASES = [
    (kind, causal, backend)
    for kind in KINDS
    for causal in (True, False)
    for backend in ("eager", "sdpa", "chunked")
    if not (kind == "value" and backend == "sdpa") and not (kind == "gated" and not causal)
]


@pytest.mark.parametrize(("kind", "causal", "backend"), CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_reference(kind, causal, backend, dtype):
    mha = make(kind, causal=causal, backend=backend, block_size=4)
    x, pos, kpm = inputs()
    expected = reference(x.numpy(), mha, kind, pos.numpy(), kpm=kpm.numpy())
    out = mha.to(dtype)(x.to(dtype), pos, key_padding_mask=kpm)
    tol = tolerances(dtype, ops=OPS)
    torch.testing.assert_close(out.double(), torch.from_numpy(expected), **tol)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
def test_bfloat16_matches_reference(backend):
    kind = "table" if backend == "sdpa" else "value"
    mha = make(kind, backend=backend, block_size=4)
    x, pos, kpm = inputs()
    expected = reference(x.numpy(), mha, kind, pos.numpy(), kpm=kpm.numpy())
    out = mha.to(torch.bfloat16)(x.to(torch.bfloat16), pos, key_padding_mask=kpm)
    # bf16 rounds once per stored intermediate (about 8 of them); sums accumulate in fp32
    torch.testing.assert_close(
        out.double(), torch.from_numpy(expected), **tolerances(torch.bfloat16)
    )


def test_default_and_shared_positions_match_reference():
    mha = make("rotation")
    x, _, _ = inputs()
    shared = np.arange(T)[None].repeat(B, 0)
    expected = torch.from_numpy(reference(x.numpy(), mha, "rotation", shared))
    torch.testing.assert_close(mha(x), expected, **tolerances(torch.float64, ops=OPS))
    torch.testing.assert_close(
        mha(x, torch.arange(T)), expected, **tolerances(torch.float64, ops=OPS)
    )
    torch.testing.assert_close(
        mha(x, torch.arange(T)[None]), expected, **tolerances(torch.float64, ops=OPS)
    )


def _grads(mha: MultiHeadAttention, x: Tensor, *args, **kwargs) -> list[Tensor]:
    x = x.detach().requires_grad_(True)
    out = mha(x, *args, **kwargs)
    out.backward(torch.cos(out.detach()))  # a fixed, non-uniform upstream gradient
    return [out.detach(), x.grad, *(p.grad for p in mha.parameters())]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("value", [False, True], ids=["score", "score+value"])
def test_backends_agree_forward_and_backward(value, padded):
    parts = [PairRotation, RelTable, RelValue if value else GatedCount]
    backends = ("eager", "chunked") if value else ("eager", "sdpa", "chunked")
    x, pos, kpm = inputs(seed=1)
    kpm = kpm if padded else None
    results = {}
    for backend in backends:
        torch.manual_seed(0)
        position = Compose([p() for p in parts])
        mha = MultiHeadAttention(
            C, H, position=position, num_kv_heads=KV, backend=backend, block_size=2
        )
        results[backend] = _grads(mha.float(), x.float(), pos, key_padding_mask=kpm)
    for backend in backends[1:]:
        for got, want in zip(results[backend], results["eager"], strict=True):
            torch.testing.assert_close(got, want, **tolerances(torch.float32, ops=OPS))


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
def test_rows_without_visible_keys_are_zero_and_finite(backend):
    kind = "table" if backend == "sdpa" else "value"
    mha = make(kind, backend=backend, block_size=2)
    x, pos, _ = inputs()
    kpm = torch.ones(B, T, dtype=torch.bool)
    kpm[0, :3] = False  # causal: queries 0..2 of sequence 0 see no key
    kpm[1] = False  # sequence 1: nothing at all
    out, dx, *dparams = _grads(mha, x, pos, key_padding_mask=kpm)
    empty = torch.zeros_like(out)
    torch.testing.assert_close(out[0, :3], empty[0, :3], rtol=0, atol=0)
    torch.testing.assert_close(out[1], empty[1], rtol=0, atol=0)
    assert torch.isfinite(dx).all() and all(torch.isfinite(g).all() for g in dparams)
    assert dx[1].abs().max() == 0  # nothing of sequence 1 reaches the output


def test_packed_segments_equal_separate_documents():
    mha = make("table", backend="chunked", block_size=4)
    x, _, _ = inputs()
    split = 4
    pos = torch.cat((torch.arange(split), torch.arange(T - split)))  # positions restart
    seg = torch.tensor([0] * split + [1] * (T - split)).expand(B, -1)
    packed = mha(x, pos, segment_ids=seg)
    apart = torch.cat((mha(x[:, :split]), mha(x[:, split:])), dim=1)
    torch.testing.assert_close(packed, apart, **tolerances(torch.float64, ops=OPS))
    leaked = mha(x, pos)  # without segment ids the documents see each other
    assert not torch.allclose(leaked, apart, **tolerances(torch.float64, ops=OPS))


@pytest.mark.parametrize("whole_mask", [False, True], ids=["new-keys-mask", "all-keys-mask"])
@pytest.mark.parametrize("prefill", [1, 5])
def test_decoding_equals_full_forward(prefill, whole_mask):
    torch.manual_seed(0)
    position = Compose([PairRotation(), RelTable(), GatedCount(), RelValue()])
    mha = MultiHeadAttention(C, H, position=position, num_kv_heads=KV, block_size=2).double()
    x, pos, kpm = inputs()
    full = mha(x, pos, key_padding_mask=kpm)
    cache = KVCache()
    steps = [mha(x[:, :prefill], pos[:, :prefill], key_padding_mask=kpm[:, :prefill], cache=cache)]
    for t in range(prefill, T):
        mask = kpm[:, : t + 1] if whole_mask else kpm[:, t : t + 1]
        steps.append(mha(x[:, t : t + 1], key_padding_mask=mask, cache=cache))
    assert len(cache) == T and torch.equal(cache.positions, pos)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **tolerances(torch.float64, ops=OPS))


def test_chunked_memory_stays_below_one_score_matrix():
    heads, length, block, dim = 8, 2048, DEFAULT_BLOCK_SIZE, 8
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, heads, length, dim, generator=gen).requires_grad_(True) for _ in range(3)
    )
    table = RelTable(heads).float()
    pos = torch.arange(length)
    masking = Masking(True, pos, pos, aligned=True)

    def step():
        out = attend(q, k, v, position=table, masking=masking, backend="chunked", block_size=block)
        out.sum().backward()

    peak, largest = peak_tensor_bytes(step)
    scores = heads * length * length * 4  # one [H, T, T] float32 tensor
    assert largest <= heads * block * length * 8  # one [H, block, T] block (or its int64 index)
    assert peak < scores
    assert torch.isfinite(q.grad).all() and table.table.grad.abs().sum() > 0


def test_memory_tracker_sees_a_materialized_bias():
    heads, length = 8, 512
    q = k = v = torch.zeros(1, heads, length, 4)
    pos = torch.arange(length)
    masking = Masking(True, pos, pos, aligned=True)
    run = lambda: attend(q, k, v, position=RelTable(heads).float(), masking=masking, backend="sdpa")  # noqa: E731
    _, largest = peak_tensor_bytes(run)
    assert largest >= heads * length * length * 4


@given(
    length=st.integers(1, 14),
    block=st.integers(1, 6),
    causal=st.booleans(),
    shift=st.integers(-5, 5),
    data=st.data(),
)
def test_chunked_equals_eager_for_any_blocking(length, block, causal, shift, data):
    kpm = None
    if data.draw(st.booleans()):
        drawn = data.draw(st.lists(st.booleans(), min_size=2 * length, max_size=2 * length))
        kpm = torch.tensor(drawn).view(2, length)
    torch.manual_seed(0)
    position = Compose([PairRotation(), RelTable(), RelValue()])
    eager = MultiHeadAttention(C, H, position=position, causal=causal, backend="eager").double()
    chunked = MultiHeadAttention(C, H, position=position, causal=causal, block_size=block).double()
    chunked.load_state_dict(eager.state_dict())
    x = torch.randn(2, length, C, dtype=torch.float64)
    pos = torch.arange(length) + shift
    want = eager(x, pos, key_padding_mask=kpm)
    torch.testing.assert_close(
        chunked(x, pos, key_padding_mask=kpm), want, **tolerances(torch.float64, ops=OPS)
    )


def test_dropout_acts_in_training_only():
    mha = make("table", dropout=0.5)
    x, pos, _ = inputs()
    torch.testing.assert_close(mha(x, pos), mha(x, pos), rtol=0, atol=0)
    mha.train()
    assert not torch.equal(mha(x, pos), mha(x, pos))


class WrongShape(PositionalEncoding):
    sites = Site.SCORE

    def score_bias(self, q, k, q_pos, k_pos):
        return torch.zeros(q.shape[-2], k.shape[-2])


BAD_CONSTRUCTION = [
    (dict(d_model=10, num_heads=3), ValueError, "num_heads=3"),
    (dict(num_kv_heads=3), ValueError, "num_kv_heads=3"),
    (dict(backend="flash"), ValueError, "'flash'"),
    (dict(position=RelValue(), backend="sdpa"), ValueError, "value"),
    (dict(position=GatedCount(), causal=False), ValueError, "GatedCount"),
    (dict(position=nn.Linear(2, 2)), TypeError, "Linear"),
    (dict(position="no-such-encoding"), ValueError, "no-such-encoding"),
    (dict(causal=1), TypeError, "causal"),
    (dict(dropout=1.0), ValueError, "dropout"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD_CONSTRUCTION)
def test_bad_construction_raises(kwargs, error, match):
    kwargs = {"d_model": C, "num_heads": H} | kwargs
    with pytest.raises(error, match=match):
        MultiHeadAttention(kwargs.pop("d_model"), kwargs.pop("num_heads"), **kwargs)


BAD_CALLS = [
    (dict(x=torch.zeros(T, C)), ValueError, "x must have 3"),
    (dict(x=torch.zeros(B, T, C + 1)), ValueError, "d_model"),
    (dict(positions=torch.arange(T + 1)), ValueError, "positions"),
    (dict(positions=torch.zeros(3, T, dtype=torch.long)), ValueError, "batch size 3"),
    (dict(key_padding_mask=torch.ones(B, T + 1, dtype=torch.bool)), ValueError, "key_padding_mask"),
    (dict(key_padding_mask=torch.ones(B, T)), TypeError, "bool"),
    (dict(segment_ids=torch.zeros(B, T - 1, dtype=torch.long)), ValueError, "segment_ids"),
    (dict(segment_ids=torch.zeros(B, T)), TypeError, "integer"),
    (dict(cache={}), TypeError, "KVCache"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD_CALLS)
def test_bad_call_raises(kwargs, error, match):
    mha = MultiHeadAttention(C, H)
    x = kwargs.pop("x", torch.zeros(B, T, C))
    with pytest.raises(error, match=match):
        mha(x, **kwargs)


def test_cache_of_another_shape_raises():
    mha, cache = MultiHeadAttention(C, H), KVCache()
    mha(torch.zeros(B, T, C), cache=cache)
    with pytest.raises(ValueError, match="batch, kv heads, head_dim"):
        mha(torch.zeros(B + 1, 1, C), cache=cache)
    with pytest.raises(ValueError, match="segment_ids"):
        mha(torch.zeros(B, 1, C), segment_ids=torch.zeros(B, 1, dtype=torch.long), cache=cache)


def test_hook_output_of_wrong_shape_names_the_encoding():
    with pytest.raises(ValueError, match=r"WrongShape\.score_bias"):
        MultiHeadAttention(C, H, position=WrongShape())(torch.zeros(B, T, C))


def test_position_by_name_builds_the_registered_encoding():
    mha = MultiHeadAttention(C, H, position="nope")
    assert isinstance(mha.position, posenc.NoPE)
