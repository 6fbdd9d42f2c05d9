"""The ``flex`` backend (FlexAttention compiled for CPU): float32 against the float64 eager
reference for every encoding it serves, where ``auto`` picks it and where it refuses, and
no recompilation at a length already compiled."""

from __future__ import annotations

import pytest
import torch

import posenc
from conftest import tolerances
from posenc import MultiHeadAttention
from posenc.attention import backends, flex, short
from posenc.attention.backends import Masking, attend, peak_tensor_bytes
from posenc.attention.blocks import offset_table
from posenc.encodings.t5 import t5_relative_position_bucket
from posenc.kv_cache import KVCache

pytest.importorskip("torch.nn.attention.flex_attention")

C, H = 32, 2
D = C // H
T = 200  # not a multiple of FlexAttention's 128-token blocks
OPS = 64
SERVED = ["alibi", "t5", "kerple", "sandwich", "fire", "shaw", "cope"]


def _encoding(name: str, causal: bool = True) -> posenc.PositionalEncoding:
    torch.manual_seed(0)
    position = posenc.build(name, d_model=C, num_heads=H, head_dim=D, causal=causal)
    with torch.no_grad():  # away from the initialisation (T5, Shaw: tiny; FIRE: one scale)
        for p in position.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return position


def _qkv(length: int = T, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(1, H, length, D, generator=gen, dtype=dtype) for _ in range(3)]


def _check_against_reference(
    position: posenc.PositionalEncoding, causal: bool, length: int = T
) -> None:
    q, k, v = _qkv(length)
    pos = torch.arange(length)
    masking = Masking(causal, pos, pos, aligned=True)
    with torch.no_grad():
        got = attend(q, k, v, position=position, masking=masking, backend="flex")
        position.double()
        q, k, v = (t.double() for t in (q, k, v))
        want = attend(q, k, v, position=position, masking=masking, backend="eager")
    torch.testing.assert_close(got.double(), want, **tolerances(torch.float32, ops=OPS))


@pytest.mark.parametrize("name", SERVED)
def test_flex_equals_the_float64_reference_causal(name):
    _check_against_reference(_encoding(name), causal=True)


@pytest.mark.parametrize("name", ["cope", "shaw"])
def test_flex_forms_of_long_sequences_equal_the_float64_reference(name, monkeypatch):
    """CoPE's band and Shaw's phantom key around FlexAttention, which run past
    ``SHORT_MAX`` (here from the first bucket on)."""
    monkeypatch.setattr(short, "SHORT_MAX", {})
    _check_against_reference(_encoding(name), causal=True)


def test_one_graph_only_for_short_sequences_of_few_scores():
    """``runs_short``: up to ``SHORT_MAX`` tokens of its kind and ``SHORT_MAX_SCORES``."""
    for kind, most in short.SHORT_MAX.items():
        assert short.runs_short(torch.empty(1, 8, most, 4), kind)
        assert not short.runs_short(torch.empty(1, 1, 2 * most, 4), kind)
        per_batch = 8 * most * most
        fits = short.SHORT_MAX_SCORES // per_batch
        assert short.runs_short(torch.empty(fits, 8, most, 4), kind)
        assert not short.runs_short(torch.empty(fits + 1, 8, most, 4), kind)
    assert not short.runs_short(torch.empty(1, 1, 128, 4), "score_mod")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "sandwich", "fire"])
def test_flex_equals_the_float64_reference_bidirectional(name):
    _check_against_reference(_encoding(name, causal=False), causal=False)


@pytest.mark.parametrize(("causal", "bidirectional"), [(True, False), (True, True), (False, True)])
def test_t5_past_max_distance_equals_the_float64_reference(causal, bidirectional):
    """Past ``max_distance`` every distance shares T5's last bucket: under a causal mask the
    kernel reads the bias minus that bucket's in a band of offsets, zero beyond (the
    softmax ignores a row constant); without a mask it reads the full table."""
    torch.manual_seed(0)
    position = posenc.build("t5", num_heads=H, max_distance=32, bidirectional=bidirectional)
    with torch.no_grad():
        position.relative_attention_bias.weight.normal_()
    if causal:  # the band ends where the last bucket starts, below T / 2
        q, k, _ = _qkv()
        pos = torch.arange(T)
        bucket = t5_relative_position_bucket(-pos, bidirectional=bidirectional, max_distance=32)
        table = offset_table(position, q, k, Masking(True, pos, pos, aligned=True)).values
        band = flex._constant_tail_band(table[:, T - 1 :].detach())
        assert band.shape[-1] == int((bucket != bucket[-1]).sum()) < T // 2
    _check_against_reference(position, causal)


def test_constant_tail_band_only_for_a_long_finite_tail():
    inf = float("inf")
    causal = torch.tensor([[3.0, 2.0, 1.0, 1.0, 1.0, 1.0], [5.0, 4.0, 4.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(flex._constant_tail_band(causal), causal[:, :3] - causal[:, -1:])
    assert flex._constant_tail_band(causal[:, 1:]).shape[-1] == 2
    assert flex._constant_tail_band(causal[:, :4]) is None  # tail of 1 offset in 4
    assert flex._constant_tail_band(torch.tensor([[0.0, -inf, -inf, -inf]])) is None


def test_cope_band_narrower_than_the_sequence():
    """Few positions (P = 8): the bias is the row constant beyond a band of 16 offsets."""
    position = posenc.build("cope", head_dim=D, npos_max=8)
    with torch.no_grad():
        position.pos_emb.normal_()
        q, k, _ = _qkv()
        band = position.band_bias(q, k, max_width=T)  # [1, H, T, W]
        width = band.shape[-1]
        assert width < T
        bias = position.score_bias(q.double(), k.double(), torch.arange(T), torch.arange(T))
        keys = (torch.arange(T)[:, None] - torch.arange(width)).clamp(min=0)  # i - d
        # beyond the band key 0 sits at position P - 1: its bias is the row's constant
        want = (bias - bias[..., :1]).gather(-1, keys.expand_as(band))
        tol = tolerances(torch.float32, ops=OPS)
        torch.testing.assert_close(band[..., width:, :].double(), want[..., width:, :], **tol)
        assert position.band_bias(q, k, max_width=width // 2) is None


def test_cope_narrow_band_equals_the_float64_reference():
    """A band of 32 offsets in 200 keys: the kernel reads it by a masked load and adds
    nothing beyond it (the row constant there is what the softmax ignores)."""
    position = posenc.build("cope", head_dim=D, npos_max=8)
    with torch.no_grad():
        position.pos_emb.normal_()
        q, k, _ = _qkv()
        assert position.band_bias(q, k, max_width=T).shape[-1] < T
    _check_against_reference(position, causal=True)


@pytest.mark.parametrize(
    ("dtype", "compiled"), [(torch.float32, True), (torch.float32, False), (torch.float64, False)]
)
@pytest.mark.parametrize("npos", [8, 64])  # bands of 32 offsets (7 blocks, padded) and of T
def test_cope_band_equals_the_float64_bias(npos, dtype, compiled):
    """Every band entry ``b_(i, i-d) - c_i`` (``d <= i``), eager and compiled, against the
    float64 bias of eqs. (3)-(6) minus ``c_i = q_i . e[P - 1] / sqrt(D)``."""
    position = posenc.build("cope", head_dim=D, npos_max=npos)
    with torch.no_grad():
        position.pos_emb.normal_()
        q, k, _ = _qkv(dtype=dtype)
        band = position.band_bias(q, k, max_width=T, compiled=compiled)  # [1, H, T, W]
        q, k, emb = q.double(), k.double(), position.pos_emb.double()
        bias = position.double().score_bias(q, k, torch.arange(T), torch.arange(T))
    width = band.shape[-1]
    assert width == min(4 * npos, T)
    rows, offsets = torch.arange(T)[:, None], torch.arange(width)
    keys = (rows - offsets).clamp(min=0)  # i - d
    want = bias.gather(-1, keys.expand_as(band)) - (q @ emb[-1])[..., None] * D**-0.5
    seen = offsets <= rows
    tol = tolerances(dtype, ops=OPS + width)  # the gates' sum: one rounding per offset
    torch.testing.assert_close(band.double()[..., seen], want[..., seen], **tol)


def _layer(name: str, backend: str, dtype=torch.float32) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(C, H, position=name, backend=backend).to(dtype).eval()


def test_layer_with_flex_equals_chunked():
    x = torch.randn(2, T, C)
    with torch.no_grad():
        got = _layer("alibi", "flex")(x)
        want = _layer("alibi", "chunked")(x)
    torch.testing.assert_close(got, want, **tolerances(torch.float32, ops=OPS))


@pytest.fixture
def calls(monkeypatch):
    """Lower ``auto``'s length threshold and count the calls that reach FlexAttention."""
    seen = []
    real = backends.flex_attend
    monkeypatch.setattr(backends, "FLEX_MIN_LENGTH", T)
    monkeypatch.setattr(backends, "flex_attend", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    return seen


def test_auto_picks_flex_for_long_float32_inference(calls):
    x = torch.randn(1, T, C)
    with torch.no_grad():
        _layer("fire", "auto")(x)
        assert calls == [1]
        _layer("fire", "auto")(x[:, : T - 1])  # below the threshold: chunked
    assert calls == [1]


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "sandwich"])
def test_auto_keeps_offset_biases_on_the_table_path(calls, name):
    """An offset-only bias is read as a view of one row per head by SDPA, faster than
    FlexAttention at every length and with nothing to compile."""
    with torch.no_grad():
        _layer(name, "auto")(torch.randn(1, T, C))
    assert calls == []


@pytest.mark.parametrize("case", ["grad", "float64", "cache", "padding", "sinks"])
def test_auto_keeps_the_chunked_path_where_flex_does_not_apply(calls, case):
    torch.manual_seed(0)
    layer = MultiHeadAttention(C, H, position="fire", sinks=case == "sinks").eval()
    layer.to(torch.float64 if case == "float64" else torch.float32)
    x = torch.randn(1, T, C, dtype=torch.float64 if case == "float64" else torch.float32)
    kwargs = {}
    if case == "cache":  # a prefill is aligned (flex may serve it); the next chunk is not
        kwargs["cache"] = KVCache()
        with torch.no_grad():
            layer(x[:, :1], **kwargs)
    if case == "padding":
        kwargs["key_padding_mask"] = torch.ones(1, T, dtype=torch.bool)
    with torch.set_grad_enabled(case == "grad"):
        layer(x, **kwargs)
    assert calls == []


@pytest.mark.parametrize(
    "case,match",
    [
        ("grad", "no CPU backward"),
        ("float64", "float32 CPU"),
        ("cache", "positions 0..T-1"),
        ("dropout", "dropout"),
        ("shaw-bidirectional", "causal attention only"),
    ],
)
def test_forced_flex_says_why_it_does_not_apply(case, match):
    position = _encoding("shaw" if case.startswith("shaw") else "alibi")
    q, k, v = _qkv(8, torch.float64 if case == "float64" else torch.float32)
    pos = torch.arange(8)
    masking = Masking(case != "shaw-bidirectional", pos, pos, aligned=case != "cache")
    if case == "grad":
        q.requires_grad_(True)
    dropout = 0.5 if case == "dropout" else 0.0
    with torch.set_grad_enabled(case == "grad"), pytest.raises(ValueError, match=match):
        attend(q, k, v, position=position, masking=masking, backend="flex", dropout_p=dropout)


@pytest.mark.parametrize("name", ["rope", "fox"])
def test_flex_refuses_encodings_without_a_flex_form(name):
    with pytest.raises(ValueError, match="backend='flex' cannot compute"):
        MultiHeadAttention(C, H, position=name, backend="flex")


@pytest.mark.parametrize("name", ["fire", "cope"])
def test_no_recompilation_at_a_compiled_length(name):
    counters = torch._dynamo.utils.counters
    position = _encoding(name)
    q, k, v = _qkv()
    pos = torch.arange(T)
    masking = Masking(True, pos, pos, aligned=True)
    with torch.no_grad():
        attend(q, k, v, position=position, masking=masking, backend="flex")
        frames = sum(counters["frames"].values())
        for _ in range(2):  # a new score_mod closure each call, same kernel
            attend(q, k, v, position=position, masking=masking, backend="flex")
    assert sum(counters["frames"].values()) == frames


def test_lengths_share_a_bounded_set_of_buckets():
    buckets = [flex.flex_bucket(t) for t in range(1, 8193)]
    assert sorted(set(buckets)) == [128 << i for i in range(7)]  # 128 .. 8192
    assert all(t <= b < max(2 * t, 129) for t, b in enumerate(buckets, 1))


@pytest.mark.parametrize(
    ("name", "change"),
    [(n, "length") for n in ("alibi", "kerple", "shaw", "cope")]
    + [(n, "parameters") for n in ("fire", "shaw", "cope")],
)
def test_a_compiled_bucket_serves_new_lengths_and_parameters(name, change):
    """T = 200 and T = 131 both run padded to 256 tokens: the second length reuses the
    kernel (and CoPE's band step); a trained step changes every parameter (FIRE: its
    breaks, grid scale and pieces) and reuses them too; both still equal the float64
    eager reference."""
    counters = torch._dynamo.utils.counters
    position = _encoding(name)
    with torch.no_grad():
        _check_against_reference(position, causal=True)
        frames = sum(counters["frames"].values())
        position.float()
        if change == "parameters":
            for p in position.parameters():
                p.mul_(0.7).add_(torch.randn_like(p) * 0.3)
        _check_against_reference(position, causal=True, length=131 if change == "length" else T)
    assert sum(counters["frames"].values()) == frames
    kept = flex.flex_kind(position) == "score_mod"  # FIRE's tables, ALiBi's slopes
    assert (position in flex.SCORE_MODS) == kept


@pytest.mark.parametrize(
    ("name", "one_graph"),
    [("fire", False), ("shaw", True), ("shaw", False), ("cope", True), ("cope", False)],
)
def test_non_finite_future_key_reaches_only_later_rows(name, one_graph, monkeypatch):
    if not one_graph:
        monkeypatch.setattr(short, "SHORT_MAX", {})
    position = _encoding(name)
    q, k, v = _qkv()
    pos = torch.arange(T)
    masking = Masking(True, pos, pos, aligned=True)
    poisoned = [t.clone() for t in (k, v)]
    for t in poisoned:
        t[..., 150, :] = float("nan")
    with torch.no_grad():
        got = attend(q, *poisoned, position=position, masking=masking, backend="flex")
        want = attend(q, k, v, position=position, masking=masking, backend="flex")
    torch.testing.assert_close(got[..., :150, :], want[..., :150, :], rtol=0, atol=0)
    assert got[..., 150:, :].isnan().all()


def test_memory_count_runs_the_chunked_path(calls):
    """FlexAttention's operator does not pass through a TorchDispatchMode: ``auto`` keeps
    the chunked path there, and a forced ``flex`` says so."""
    x = torch.randn(1, T, C)
    layer = _layer("alibi", "auto")
    with torch.no_grad():
        peak, _ = peak_tensor_bytes(lambda: layer(x))
        assert calls == [] and peak > 0
        flex_layer = _layer("alibi", "flex")
        with pytest.raises(ValueError, match="TorchDispatchMode"):
            peak_tensor_bytes(lambda: flex_layer(x))
