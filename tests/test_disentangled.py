"""DeBERTa's disentangled attention (He et al. 2021, eq. 4): ``DisentangledAttention``
against a float64 reference written from the formula with explicit loops over ``i, j``,
against transformers' own ``DisentangledSelfAttention`` (DeBERTa and DeBERTa-v2), inside
``MultiHeadAttention`` (KV cache, chunked backend), and on bad input.

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim, ``C`` d_model,
``k`` span.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import posenc
from conftest import tolerances
from posenc import Compose, DisentangledAttention, KVCache, MultiHeadAttention
from posenc.encodings.disentangled import RelativeEmbeddingTable, log_bucket_position

B, H, D, C, T = 2, 2, 4, 8, 9
LONGEST, BUCKETS, RANGE = 6, 8, 20  # unbucketed span 6 < T (clipped); 8 buckets over 20


# ------------------------------------------------------------------------ float64 reference


def ref_bucket(r: int, buckets: int, longest: int) -> int:
    """Log bucket of offset ``r`` in exact integer arithmetic: with ``m = buckets // 2``,
    ``|r| <= m`` stays, else ``sign(r) (m + n)`` for the least integer
    ``n >= (m - 1) ln(|r| / m) / ln((longest - 1) / m)``, i.e. the least ``n`` with
    ``|r|^(m-1) m^n <= (longest - 1)^n m^(m-1)``."""
    mid, a = buckets // 2, abs(r)
    if a <= mid:
        return r
    guess = math.ceil((mid - 1) * math.log(a / mid) / math.log((longest - 1) / mid))

    def fits(n: int) -> bool:
        return n >= 0 and a ** (mid - 1) * mid**n <= (longest - 1) ** n * mid ** (mid - 1)

    n = max(guess, 0)
    while fits(n - 1):
        n -= 1
    while not fits(n):
        n += 1
    return int(math.copysign(mid + n, r))


def ref_scores(q, k, table, w_key, b_key, w_query, b_query, kinds, buckets, q_pos, k_pos):
    """``A_ij = (q_i.k_j + q_i.K^r[idx] + k_j.Q^r[idx]) / sqrt(D s)`` (eq. 4), float64.

    ``K^r = P W_k^T + b_k`` and ``Q^r = P W_q^T + b_q`` per head; ``idx = clip(r + k, 0,
    2k - 1)`` with ``r = i - j`` (bucketed when ``buckets``), the row the released code
    reads for both terms. ``q_pos``/``k_pos``: ``[B, Tq]``/``[B, Tk]``.
    """
    span = buckets or LONGEST
    scale = math.sqrt(D * (1 + len(kinds)))
    pos_key = table @ w_key.T + b_key  # [2k, H D]
    pos_query = table @ w_query.T + b_query
    batch, heads, tq, _ = q.shape
    out = np.zeros((batch, heads, tq, k.shape[2]))
    for b in range(batch):
        for h in range(heads):
            cols = slice(h * D, (h + 1) * D)
            for i in range(tq):
                for j in range(k.shape[2]):
                    r = int(q_pos[b, i] - k_pos[b, j])
                    r = ref_bucket(r, buckets, RANGE) if buckets else r
                    idx = min(max(r + span, 0), 2 * span - 1)
                    total = q[b, h, i] @ k[b, h, j]
                    if "c2p" in kinds:
                        total += q[b, h, i] @ pos_key[idx, cols]
                    if "p2c" in kinds:
                        total += k[b, h, j] @ pos_query[idx, cols]
                    out[b, h, i, j] = total / scale
    return out


def _encoding(kinds: str, buckets: int | None) -> DisentangledAttention:
    torch.manual_seed(0)
    longest = RANGE if buckets else LONGEST
    enc = DisentangledAttention(
        C, H, head_dim=D, max_relative_positions=longest, position_buckets=buckets,
        pos_att_type=kinds,
    )  # fmt: skip
    return enc.double()


def _positions(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_pos, k_pos)`` as ``[B, Tq]`` / ``[B, Tk]`` (or shared ``[T]``)."""
    if kind == "arange":
        return torch.arange(T), torch.arange(T)
    if kind == "offset":
        return torch.arange(T) + 1000, torch.arange(T) + 1000
    if kind == "gaps":  # per sequence, reaching the log range and the clipped ends
        pos = torch.tensor([[0, 1, 3, 7, 12, 20, 33, 40, 61], [5, 4, 3, 2, 1, 0, 30, 31, 90]])
        return pos, pos
    return torch.arange(T - 3, T), torch.arange(T)  # decoding: 3 queries over every key


def _full_scores(enc, q, k, q_pos, k_pos):
    """posenc's logits: ``rotate``, ``q.k / sqrt(D)`` (the attention's), ``score_bias``."""
    q2, k2 = enc.rotate(q, k, q_pos, k_pos)
    return q2 @ k2.transpose(-1, -2) / D**0.5 + enc.score_bias(q2, k2, q_pos, k_pos)


def _expand(pos: torch.Tensor) -> np.ndarray:
    return (pos if pos.dim() == 2 else pos.expand(B, -1)).numpy()


@pytest.mark.parametrize("positions", ["arange", "offset", "gaps", "decode"])
@pytest.mark.parametrize("buckets", [None, BUCKETS])
@pytest.mark.parametrize("kinds", ["c2p|p2c", "c2p", "p2c"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_scores_equal_the_float64_reference(dtype, kinds, buckets, positions):
    enc = _encoding(kinds, buckets)
    q_pos, k_pos = _positions(positions)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, H, q_pos.shape[-1], D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, k_pos.shape[-1], D, generator=g, dtype=torch.float64)
    keys = enc.pos_key_proj or enc.pos_query_proj
    queries = enc.pos_query_proj or enc.pos_key_proj
    want = ref_scores(
        q.numpy(), k.numpy(), enc.table.weight.detach().numpy(),
        keys.weight.detach().numpy(), keys.bias.detach().numpy(),
        queries.weight.detach().numpy(), queries.bias.detach().numpy(),
        kinds.split("|"), buckets, _expand(q_pos), _expand(k_pos),
    )  # fmt: skip
    with torch.no_grad():
        got = _full_scores(enc.to(dtype), q.to(dtype), k.to(dtype), q_pos, k_pos)
    assert got.dtype == dtype
    tol = tolerances(dtype, ops=16)  # projection (C terms), dot products (D terms), sums
    torch.testing.assert_close(got.double(), torch.from_numpy(want), **tol)


@pytest.mark.parametrize(("buckets", "longest", "reach"), [(256, 512, 1200), (8, 20, 300)])
def test_log_buckets_equal_exact_arithmetic(buckets, longest, reach):
    """DeBERTa-v3's 256 buckets over 512 and a small range: the float32 formula gives the
    exact integers for every offset up to ``reach`` (past the range's end)."""
    r = torch.arange(-reach, reach + 1)
    want = torch.tensor([ref_bucket(int(x), buckets, longest) for x in r])
    got = log_bucket_position(r, position_buckets=buckets, max_relative_positions=longest)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_log_buckets_equal_transformers_in_float32():
    """posenc evaluates the buckets as transformers does (float32), so a checkpoint's rows
    are read even where float32 and exact arithmetic disagree (e.g. 4 buckets over 11 at
    offset 250, 6 over 16 at 375, whose exact logarithm ratios are integers)."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    r = torch.arange(-700, 701)
    for buckets, longest in [(4, 11), (6, 16), (8, 21), (18, 65), (34, 52), (256, 512)]:
        want = make_log_bucket_position(r, buckets, longest).long()
        got = log_bucket_position(r, position_buckets=buckets, max_relative_positions=longest)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---------------------------------------------------------------------- inside the attention


def _layer(backend: str = "auto", causal: bool = True) -> MultiHeadAttention:
    torch.manual_seed(1)
    enc = DisentangledAttention(C, H, max_relative_positions=RANGE, position_buckets=BUCKETS)
    return MultiHeadAttention(C, H, position=enc, causal=causal, backend=backend).eval()


def test_kv_cache_decoding_equals_a_full_forward():
    layer = _layer()
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = layer(x)
        cache = KVCache()
        steps = [layer(x[:, :4], cache=cache)] + [
            layer(x[:, t : t + 1], cache=cache) for t in range(4, T)
        ]
    torch.testing.assert_close(torch.cat(steps, 1), full, **tolerances(torch.float32))


@pytest.mark.parametrize("causal", [True, False])
def test_chunked_backend_equals_eager(causal):
    eager, chunked = _layer("eager", causal), _layer("chunked", causal)
    chunked.block_size = 4
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(chunked(x), eager(x), **tolerances(torch.float32))


def test_one_table_shared_by_layers():
    table = RelativeEmbeddingTable(C, 20)
    a = DisentangledAttention(C, H, max_relative_positions=20, table=table)
    b = DisentangledAttention(C, H, max_relative_positions=20, table=table)
    assert a.table.weight is b.table.weight
    model = torch.nn.ModuleList([a, b])
    assert sum(p is table.weight for p in model.parameters()) == 1


# ------------------------------------------------------------------------------ transformers

_DEBERTA = [
    ("deberta", {"pos_att_type": "c2p|p2c"}),
    ("deberta", {"pos_att_type": "c2p", "position_biased_input": False}),
    ("deberta", {"pos_att_type": "p2c", "max_relative_positions": -1}),
    ("deberta", {"pos_att_type": "c2p|p2c", "max_relative_positions": 4}),  # clipped: T > 4
]
#: Buckets on/off, shared keys on/off and each term in the default run; every combination
#: under ``-m slow``.
_V2_FAST = [
    {"pos_att_type": "c2p|p2c", "position_buckets": -1, "share_att_key": False},
    {"pos_att_type": "c2p|p2c", "max_relative_positions": 4},  # clipped: T > 4
    {"pos_att_type": "c2p|p2c", "position_buckets": 8, "share_att_key": True},
    {"pos_att_type": "c2p", "position_buckets": 8, "share_att_key": False},
    {"pos_att_type": "p2c", "position_buckets": -1, "share_att_key": True},
    {"pos_att_type": "c2p|p2c", "position_buckets": 8, "share_att_key": True,
     "norm_rel_ebd": "layer_norm"},
]  # fmt: skip
_V2 = [("deberta-v2", f) for f in _V2_FAST] + [
    pytest.param("deberta-v2", f, marks=pytest.mark.slow)
    for f in (
        {"pos_att_type": kinds, "position_buckets": buckets, "share_att_key": share}
        for kinds in ("c2p|p2c", "c2p", "p2c")
        for buckets in (-1, 8)
        for share in (False, True)
    )
    if f not in _V2_FAST
]


@pytest.mark.parametrize(("model_type", "fields"), _DEBERTA + _V2)
def test_attention_equals_transformers_disentangled_self_attention(model_type, fields):
    """Probabilities and context of every layer of a tiny random model; buckets on/off,
    shared keys, c2p / p2c / both, a LayerNorm on the table, offsets clipped at a span
    below the length, positions from 0 and from 100."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from _deberta import compare_with_transformers

    fields = {"relative_attention": True, "max_relative_positions": 20, **fields}
    assert compare_with_transformers(model_type, offsets=(0, 100), **fields) == 2


def test_configs_build_the_parts_they_name():
    pytest.importorskip("transformers", reason="transformers is not installed")
    import transformers

    base = {"hidden_size": C, "num_attention_heads": H, "max_position_embeddings": 32}
    both = transformers.DebertaV2Config(**base, relative_attention=True, pos_att_type="c2p")
    enc = posenc.from_hf_config(both)
    assert isinstance(enc, Compose)
    assert [type(e).__name__ for e in enc.encodings] == [
        "LearnedPositionalEncoding",
        "DisentangledAttention",
    ]
    assert enc.encodings[1].pos_att_type == ("c2p",) and enc.encodings[1].span == 32
    table = transformers.DebertaConfig(**base)  # relative_attention off: BERT's table
    assert isinstance(posenc.from_hf_config(table), posenc.LearnedPositionalEncoding)
    none = {**base, "model_type": "deberta", "position_biased_input": False}
    assert isinstance(posenc.from_hf_config(none), posenc.NoPE)


def test_a_deberta_v3_config_json_builds_its_buckets():
    """The fields of DeBERTa-v3-base's config.json (a raw dict, pos_att_type as a string)."""
    v3 = {
        "model_type": "deberta-v2", "hidden_size": 768, "num_attention_heads": 12,
        "max_position_embeddings": 512, "relative_attention": True,
        "position_biased_input": False, "pos_att_type": "p2c|c2p", "max_relative_positions": -1,
        "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
    }  # fmt: skip
    enc = posenc.from_hf_config(v3)
    assert isinstance(enc, DisentangledAttention)
    assert (enc.span, enc.max_relative_positions, enc.head_dim) == (256, 512, 64)
    assert enc.pos_att_type == ("c2p", "p2c") and enc.table.norm is not None
    assert tuple(enc.table.weight.shape) == (512, 768)


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pos_att_type": "c2p|p2p"}, "p2p"),
        ({"pos_att_type": ["c2p", "c2p"]}, "at most once"),
        ({"pos_att_type": "x2y"}, "x2y"),
        ({"position_buckets": 0}, "position_buckets"),
        ({"position_buckets": -1}, "position_buckets"),
        ({"position_buckets": 64, "max_relative_positions": 20}, "max_relative_positions=20"),
        ({"table": RelativeEmbeddingTable(C, 7)}, "span 7"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DisentangledAttention(C, H, **{"max_relative_positions": 20, **kwargs})


def test_float_positions_and_bad_bucket_offsets_raise():
    enc = DisentangledAttention(C, H, max_relative_positions=20)
    q = torch.zeros(1, H, 3, C // H)
    with pytest.raises(TypeError, match="integer positions"):
        enc.score_bias(q, q, torch.arange(3.0), torch.arange(3.0))
    with pytest.raises(TypeError, match="integer offsets"):
        log_bucket_position(torch.ones(3), position_buckets=8, max_relative_positions=20)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"relative_attention": True, "pos_att_type": "c2p|p2p"}, "p2p"),
        ({"relative_attention": True, "talking_head": True}, "talking_head"),
        ({"relative_attention": False, "pos_att_type": "c2p"}, "relative_attention=False"),
    ],
)
def test_configs_posenc_cannot_build_raise(fields, match):
    config = {"model_type": "deberta", "hidden_size": C, "num_attention_heads": H}
    with pytest.raises(ValueError, match=match):
        posenc.from_hf_config({**config, "max_position_embeddings": 32, **fields})


def test_loading_needs_the_layer_of_a_several_layer_model():
    pytest.importorskip("transformers", reason="transformers is not installed")
    from _deberta import deberta_model, disentangled_part
    from posenc.hf.absolute import build_position_module, load_hf_weights

    model = deberta_model("deberta-v2", relative_attention=True, pos_att_type="c2p")
    enc = disentangled_part(build_position_module("deberta-v2", model.config.to_dict()))
    with pytest.raises(ValueError, match="layer_idx"):
        load_hf_weights(enc, model)
    with pytest.raises(ValueError, match="layer_idx=5"):
        load_hf_weights(enc, model, layer_idx=5)
