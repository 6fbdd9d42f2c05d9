"""Bad input across the public surface, and the documented results at the edges.

1. ``CASES``: one row per (callable, args, kwargs, expected exception, fragment of the
   message that names the bad value) over every public constructor, forward and function:
   wrong ranks and shapes, mismatched lengths, odd and non-positive sizes, integer and
   half-precision dtypes where they are not allowed, unknown names.
2. Every registered encoding (its hooks, and inside ``MultiHeadAttention``) at the edges
   that must *work*: empty sequences (T = 0), one token, non-contiguous and strided
   views, NaN/inf values (propagated to exactly the outputs that read them, never zeroed,
   never a crash), integer inputs (``TypeError``), negative positions (the per-encoding
   decision of docs/guarantees.md).
3. ``CLI_CASES``: each subcommand of ``posenc.cli.COMMANDS`` with unknown names, files and
   bad option values: one line on stderr, exit status 2, no traceback.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import posenc
import posenc.analysis as analysis
from _build import B, C, D, H, apply_hooks, attention_positions, build_encoding, make_inputs
from conftest import tolerances
from posenc import cli, reference
from posenc.encodings import (
    alibi_bias,
    cope_bias,
    cope_positions,
    fire_bias,
    fire_normalized_distance,
    kerple_bias,
    sandwich_bias,
    scaling_from_dict,
    shaw_relative_index,
    shaw_score_bias,
    shaw_value_term,
    t5_relative_bias,
    xpos_scale,
)
from posenc.hf import parse_hf_rope_config
from posenc.reference import fourier_rope

T = 5
_g = torch.Generator().manual_seed(0)
Q = torch.randn(B, H, T, D, generator=_g)
K = torch.randn(B, H, T, D, generator=_g)
X = torch.randn(B, T, C, generator=_g)
POS = torch.arange(T)
COS, SIN = posenc.rope_cos_sin(POS, posenc.rope_inv_freq(D)[0].double())
ROPE = posenc.RotaryEmbedding(D)
ALIBI = posenc.ALiBi(H)
T5 = posenc.T5RelativeBias(H)
SHAW = posenc.ShawRelativePosition(D, max_relative_position=2)
SIN_PE = posenc.SinusoidalPositionalEncoding(C)
LEARNED = posenc.LearnedPositionalEncoding(C, 8)
MHA = posenc.MultiHeadAttention(C, H, position="alibi")
INT_Q = torch.ones(B, H, T, D, dtype=torch.int64)
BF16_POS = POS.to(torch.bfloat16)
TABLE = np.ones((6, 4))


def case(fn, *args, raises: type[Exception], names: str, id: str, **kwargs):
    """A row of the matrix: ``fn(*args, **kwargs)`` raises ``raises`` naming ``names``."""
    return pytest.param(fn, args, kwargs, raises, names, id=id)


V, TE = ValueError, TypeError
CONSTRUCTORS = [
    case(posenc.SinusoidalPositionalEncoding, 7, raises=V, names="7", id="sinusoidal-odd"),
    case(posenc.SinusoidalPositionalEncoding, 0, raises=V, names="0", id="sinusoidal-zero"),
    case(posenc.SinusoidalPositionalEncoding, -4, raises=V, names="-4", id="sinusoidal-neg"),
    case(posenc.SinusoidalPositionalEncoding, 8.0, raises=TE, names="8.0", id="sinusoidal-float"),
    case(posenc.SinusoidalPositionalEncoding, 8, max_len=0, raises=V, names="0", id="sin-max_len"),
    case(posenc.SinusoidalPositionalEncoding, 8, base=-2.0, raises=V, names="-2", id="sin-base"),
    case(posenc.SinusoidalPositionalEncoding, 8, base=math.nan, raises=V, names="nan", id="nan"),
    case(posenc.SinusoidalPositionalEncoding, 8, dropout=1.5, raises=V, names="1.5", id="sin-drop"),
    case(posenc.LearnedPositionalEncoding, 0, 4, raises=V, names="0", id="learned-d_model"),
    case(posenc.LearnedPositionalEncoding, 8, -1, raises=V, names="-1", id="learned-max_len"),
    case(posenc.LearnedPositionalEncoding, 8, 4, beyond="clamp", raises=V, names="clamp", id="bey"),
    case(posenc.LearnedPositionalEncoding, 8, True, raises=TE, names="True", id="learned-bool"),
    case(posenc.RotaryEmbedding, 7, raises=V, names="7", id="rope-odd"),
    case(posenc.RotaryEmbedding, 0, raises=V, names="0", id="rope-zero"),
    case(posenc.RotaryEmbedding, 8, rotary_dim=10, raises=V, names="10", id="rope-rotary>D"),
    case(posenc.RotaryEmbedding, 8, rotary_dim=3, raises=V, names="3", id="rope-rotary-odd"),
    case(posenc.RotaryEmbedding, 8, base=0.0, raises=V, names="0", id="rope-base"),
    case(posenc.RotaryEmbedding, 8, max_len=0, raises=V, names="0", id="rope-max_len"),
    case(posenc.RotaryEmbedding, 8, interleaved=1, raises=TE, names="1", id="rope-interleaved"),
    case(posenc.RotaryEmbedding, 8, scaling="yarn", raises=TE, names="str", id="rope-scaling-str"),
    case(posenc.RotaryEmbedding, 8, scaling={"rope_type": "nosuch"}, raises=V, names="nosuch",
         id="rope-scaling-name"),
    case(posenc.RotaryEmbedding, 8, scaling={"rope_type": "linear", "factor": 0.5}, raises=V,
         names="0.5", id="rope-linear-factor"),
    case(posenc.RotaryEmbedding, 8, scaling={"rope_type": "yarn", "factor": 4.0}, raises=V,
         names="original_max_position_embeddings", id="rope-yarn-missing"),
    case(posenc.LinearScaling, 0.0, raises=V, names="0", id="linear"),
    case(posenc.NTKScaling, -2.0, raises=V, names="-2", id="ntk"),
    case(posenc.DynamicNTKScaling, 2.0, 0, raises=V, names="0", id="dynamic-len"),
    case(posenc.YarnScaling, 0.5, 4096, raises=V, names="0.5", id="yarn-factor"),
    case(posenc.Llama3Scaling, 8.0, 4.0, 1.0, 8192, raises=V, names="4", id="llama3-bands"),
    case(posenc.LongRopeScaling, (), (1.0,), 4096, 2.0, raises=V, names="short_factor",
         id="longrope-empty"),
    case(posenc.XPos, 5, raises=V, names="5", id="xpos-odd"),
    case(posenc.XPos, 8, scale_base=0.0, raises=V, names="0", id="xpos-scale_base"),
    case(posenc.ALiBi, 0, raises=V, names="0", id="alibi-zero"),
    case(posenc.ALiBi, 2.5, raises=TE, names="2.5", id="alibi-float"),
    case(posenc.T5RelativeBias, -1, raises=V, names="-1", id="t5-heads"),
    case(posenc.T5RelativeBias, 4, num_buckets=31, raises=V, names="31", id="t5-odd-buckets"),
    case(posenc.T5RelativeBias, 4, max_distance=0, raises=V, names="0", id="t5-max_distance"),
    case(posenc.ShawRelativePosition, 0, raises=V, names="0", id="shaw-head_dim"),
    case(posenc.ShawRelativePosition, 8, max_relative_position=0, raises=V, names="0", id="shaw-K"),
    case(posenc.KERPLE, 0, raises=V, names="0", id="kerple-heads"),
    case(posenc.KERPLE, 4, kernel="cubic", raises=V, names="cubic", id="kerple-kernel"),
    case(posenc.KERPLE, 4, kernel="power", r2=3.0, raises=V, names="3.0", id="kerple-r2"),
    case(posenc.Sandwich, 4, dim=7, raises=V, names="7", id="sandwich-dim"),
    case(posenc.FIRE, 4, hidden=0, raises=V, names="0", id="fire-hidden"),
    case(posenc.FIRE, 4, init_c=-0.1, raises=V, names="-0.1", id="fire-c"),
    case(posenc.FIRE, 4, eps=-1.0, raises=V, names="-1", id="fire-eps"),
    case(posenc.CoPE, 8, npos_max=0, raises=V, names="0", id="cope-npos"),
    case(posenc.CoPE, 8, causal=False, raises=V, names="causal=False", id="cope-noncausal"),
    case(posenc.Compose, [], raises=V, names="empty", id="compose-empty"),
    case(posenc.Compose, [nn.Linear(2, 2)], raises=TE, names="Linear", id="compose-type"),
    case(posenc.MultiHeadAttention, 30, 4, raises=V, names="30", id="mha-divisible"),
    case(posenc.MultiHeadAttention, 32, 0, raises=V, names="0", id="mha-heads"),
    case(posenc.MultiHeadAttention, 32, 4, num_kv_heads=3, raises=V, names="3", id="mha-kv"),
    case(posenc.MultiHeadAttention, 32, 4, position="nosuch", raises=V, names="nosuch",
         id="mha-position-name"),
    case(posenc.MultiHeadAttention, 32, 4, position=3, raises=TE, names="int", id="mha-position"),
    case(posenc.MultiHeadAttention, 32, 4, backend="flash", raises=V, names="flash", id="backend"),
    case(posenc.MultiHeadAttention, 32, 4, dropout=1.0, raises=V, names="1.0", id="mha-dropout"),
    case(posenc.MultiHeadAttention, 32, 4, causal="yes", raises=TE, names="yes", id="mha-causal"),
    case(posenc.MultiHeadAttention, 12, 4, position="rope", raises=V, names="3", id="mha-rope-odd"),
    case(posenc.MultiHeadAttention, 32, 4, position="cope", causal=False, raises=V,
         names="causal=False", id="mha-cope"),
    case(posenc.MultiHeadAttention, 32, 4, block_size=0, raises=V, names="0", id="mha-block"),
    case(posenc.build, "nosuch", raises=V, names="nosuch", id="build"),
    case(posenc.info, "nosuch", raises=V, names="nosuch", id="info"),
]  # fmt: skip

FUNCTIONS = [
    case(posenc.sinusoidal_table, POS, 7, raises=V, names="7", id="table-odd"),
    case(posenc.sinusoidal_table, [0, 1], 8, raises=TE, names="list", id="table-list"),
    case(posenc.sinusoidal_table, BF16_POS, 8, raises=TE, names="bfloat16", id="table-bf16"),
    case(posenc.apply_rope, Q[0], COS, SIN, raises=V, names="(4, 5, 8)", id="apply-rank"),
    case(posenc.apply_rope, INT_Q, COS, SIN, raises=TE, names="int64", id="apply-int"),
    case(posenc.apply_rope, Q, COS, SIN[:, :2], raises=V, names="(5, 2)", id="apply-cos!=sin"),
    case(posenc.apply_rope, Q, COS[:4], SIN[:4], raises=V, names="4", id="apply-length"),
    case(posenc.apply_rope, Q[..., :6], COS, SIN, raises=V, names="6", id="apply-rotary>D"),
    case(posenc.apply_rope, Q, COS.expand(3, T, 4), SIN.expand(3, T, 4), raises=V, names="3",
         id="apply-batch"),
    case(posenc.apply_rope, Q, COS.long(), SIN.long(), raises=TE, names="int64", id="apply-cos"),
    case(posenc.rope_cos_sin, BF16_POS, torch.ones(4), raises=TE, names="bfloat16", id="cs-bf16"),
    case(posenc.rope_cos_sin, [0, 1], torch.ones(4), raises=TE, names="list", id="cos_sin-list"),
    case(posenc.rope_inv_freq, 7, raises=V, names="7", id="inv_freq-odd"),
    case(posenc.rope_inv_freq, 8, base=1.0, raises=V, names="1", id="inv_freq-base1"),
    case(posenc.rerotate_keys, Q, POS[:4], old=(torch.ones(4), 1.0), new=(torch.ones(4), 1.0),
         raises=V, names="(4,)", id="rerotate-length"),
    case(posenc.rerotate_keys, Q, POS, old=(torch.ones(4), 1.0), new=(torch.ones(3), 1.0),
         raises=V, names="(3,)", id="rerotate-freq"),
    case(posenc.rope_weight_to_interleaved, torch.ones(30, 8), 4, raises=V, names="30",
         id="weight-heads"),
    case(posenc.rope_weight_to_interleaved, torch.ones(12, 8), 4, raises=V, names="3",
         id="weight-odd"),
    case(posenc.rope_weight_to_half_split, torch.ones(32, 8), 4, rotary_dim=10, raises=V,
         names="10", id="weight-rotary"),
    case(scaling_from_dict, {"rope_type": "nosuch"}, raises=V, names="nosuch", id="scaling-dict"),
    case(posenc.rope_from_hf_config, 3, raises=TE, names="int", id="hf-type"),
    case(parse_hf_rope_config, {"hidden_size": 30, "num_attention_heads": 4}, raises=V,
         names="30", id="hf-heads"),
    case(xpos_scale, POS, 7, raises=V, names="7", id="xpos_scale-odd"),
    case(xpos_scale, POS, 8, scale_base=-1.0, raises=V, names="-1", id="xpos_scale-base"),
    case(posenc.alibi_slopes, 0, raises=V, names="0", id="slopes-zero"),
    case(posenc.alibi_slopes, 4.0, raises=TE, names="4.0", id="slopes-float"),
    case(alibi_bias, POS.view(1, 1, T), POS, 4, raises=V, names="(1, 1, 5)", id="alibi_bias-rank"),
    case(alibi_bias, BF16_POS, POS, 4, raises=TE, names="bfloat16", id="alibi_bias-bf16"),
    case(alibi_bias, POS.expand(2, T), POS.expand(3, T), 4, raises=V, names="(3, 5)",
         id="alibi_bias-batches"),
    case(posenc.t5_relative_position_bucket, POS.float(), raises=TE, names="float32", id="bucket"),
    case(posenc.t5_relative_position_bucket, POS, num_buckets=31, raises=V, names="31",
         id="bucket-odd"),
    case(t5_relative_bias, torch.ones(32), POS, POS, raises=V, names="(32,)", id="t5-table"),
    case(t5_relative_bias, torch.ones(32, 4), POS.float(), POS, raises=TE, names="float32",
         id="t5-float-pos"),
    case(shaw_relative_index, POS.float(), POS, 2, raises=TE, names="float32", id="shaw-float"),
    case(shaw_relative_index, POS, POS, 0, raises=V, names="0", id="shaw-K0"),
    case(shaw_score_bias, Q, POS, POS, torch.ones(4, D), raises=V, names="(4, 8)", id="shaw-even"),
    case(shaw_value_term, Q, POS, POS[:3], torch.ones(5, D), raises=V, names="3", id="shaw-keys"),
    case(kerple_bias, POS, POS, torch.ones(4), torch.ones(3), raises=V, names="(3,)", id="kerple"),
    case(kerple_bias, POS, POS, torch.ones(4), torch.ones(4), kernel="exp", raises=V, names="exp",
         id="kerple-kernel-fn"),
    case(sandwich_bias, POS, POS, 0, raises=V, names="0", id="sandwich-heads"),
    case(fire_normalized_distance, BF16_POS, POS, raises=TE, names="bfloat16", id="fire-bf16"),
    case(fire_bias, POS.view(1, 1, T), POS, nn.Identity(), raises=V, names="(1, 1, 5)",
         id="fire-rank"),
    case(cope_positions, Q, K, POS, POS, 0, raises=V, names="0", id="cope-npos-fn"),
    case(cope_bias, Q, K, POS, POS, torch.ones(4, 6), raises=V, names="(4, 6)", id="cope-table"),
    case(analysis.dot_product_distance, np.ones(4), raises=V, names="(4,)", id="dot-rank"),
    case(analysis.encoding_statistics, "table", raises=TE, names="str", id="stats-type"),
    case(analysis.uniqueness, np.ones((1, 4)), raises=V, names="L=1", id="uniqueness"),
    case(analysis.relative_position_matrix, TABLE, 6, raises=V, names="6", id="M_k-offset"),
    case(analysis.relative_position_matrix, TABLE, 1.5, raises=TE, names="1.5", id="M_k-float"),
    case(analysis.difference_consistency, TABLE, 6, raises=V, names="k=6", id="differences"),
    case(analysis.permutation_equivariance_error, raises=V, names="seq_len", id="equivariance"),
    case(reference.sinusoidal_positional_encoding, 4, 7, raises=V, names="7", id="ref-odd"),
]  # fmt: skip

FORWARDS = [
    case(SIN_PE, X[0], raises=V, names="(5, 32)", id="sin-rank"),
    case(SIN_PE, X[..., :6], raises=V, names="6", id="sin-width"),
    case(SIN_PE, X.long(), raises=TE, names="int64", id="sin-int"),
    case(SIN_PE, X, POS[:4], raises=V, names="(4,)", id="sin-positions"),
    case(SIN_PE, X, POS.expand(3, T), raises=V, names="3", id="sin-positions-batch"),
    case(SIN_PE, X, BF16_POS, raises=TE, names="bfloat16", id="sin-bf16-positions"),
    case(SIN_PE.table, -1, raises=V, names="-1", id="sin-table-neg"),
    case(LEARNED, torch.randn(1, 9, C), raises=V, names="9", id="learned-beyond"),
    case(LEARNED, X, POS - 1, raises=V, names="-1", id="learned-negative"),
    case(LEARNED, X, POS.float(), raises=TE, names="float32", id="learned-float-pos"),
    case(LEARNED.table, -2, raises=V, names="-2", id="learned-table-neg"),
    case(ROPE, Q, K[:1], raises=V, names="1", id="rope-batch"),
    case(ROPE, Q, K, POS[:4], raises=V, names="(4,)", id="rope-positions"),
    case(ROPE, Q, K, offset=-1, raises=V, names="-1", id="rope-offset"),
    case(ROPE, Q, K[:, :, :3], raises=V, names="5 > 3", id="rope-q-longer"),
    case(ROPE, INT_Q, INT_Q, raises=TE, names="int64", id="rope-int"),
    case(ROPE.rotate, Q[..., :6], K[..., :6], POS, POS, raises=V, names="6", id="rope-head_dim"),
    case(ROPE.rotate, Q, K, BF16_POS, POS, raises=TE, names="bfloat16", id="rope-bf16-pos"),
    case(ROPE.observe_length, -1, raises=V, names="-1", id="rope-observe"),
    case(ALIBI.score_bias, Q[:, :2], K[:, :2], POS, POS, raises=V, names="2", id="alibi-heads"),
    case(ALIBI.score_bias, Q[0], K[0], POS, POS, raises=V, names="(4, 5, 8)", id="alibi-rank"),
    case(ALIBI.score_bias, Q, K[:1], POS, POS, raises=V, names="(1, 4, 5, 8)", id="alibi-qk"),
    case(ALIBI.score_bias, Q, K, POS, POS[:3], raises=V, names="(3,)", id="alibi-k_pos"),
    case(T5.score_bias, Q, K, POS.float(), POS, raises=TE, names="float32", id="t5-float"),
    case(SHAW.score_bias, Q[..., :4], K[..., :4], POS, POS, raises=V, names="4", id="shaw-D"),
    case(SHAW.value_term, Q.softmax(-1), POS, POS[:2], raises=V, names="2", id="shaw-value"),
    case(MHA, X[0], raises=V, names="(5, 32)", id="mha-rank"),
    case(MHA, X[..., :16], raises=V, names="16", id="mha-width"),
    case(MHA, X.long(), raises=TE, names="int64", id="mha-int"),
    case(MHA, X, POS[:4], raises=V, names="(4,)", id="mha-positions"),
    case(MHA, X, BF16_POS, raises=TE, names="bfloat16", id="mha-bf16-positions"),
    case(MHA, X, key_padding_mask=torch.ones(B, T), raises=TE, names="float32", id="mha-mask"),
    case(MHA, X, key_padding_mask=torch.ones(B, 3, dtype=torch.bool), raises=V, names="3",
         id="mha-mask-shape"),
    case(MHA, X, segment_ids=torch.ones(B, T), raises=TE, names="float32", id="mha-segments"),
    case(MHA, X, cache={}, raises=TE, names="dict", id="mha-cache"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "error", "fragment"), CONSTRUCTORS + FUNCTIONS + FORWARDS
)
def test_bad_input_raises_naming_the_value(fn, args, kwargs, error, fragment):
    with pytest.raises(error) as raised:
        fn(*args, **kwargs)
    assert fragment in str(raised.value)


# ----------------------------------------------------------- every encoding at the edges

NAMES = posenc.available()


def _attention(enc):
    """``x [B, T, C], index [T] | None -> [B, T, C]``: attention holding ``enc``, at the
    positions ``enc`` takes for the tokens at ``index`` (``attention_positions``)."""
    torch.manual_seed(0)
    mha = posenc.MultiHeadAttention(C, H, position=enc)
    return lambda x, index=None: mha(x, attention_positions(enc, index, x.shape[1]))


@pytest.mark.parametrize("name", NAMES)
def test_empty_and_one_token_sequences(name):
    """T = 0 gives empty outputs of the documented shapes; T = 1 is row 0 of a longer run."""
    enc = build_encoding(name)
    mha = _attention(enc)
    x, q, k, pos = make_inputs(T)
    full, full_attn = apply_hooks(enc, x, q, k, pos, pos), mha(x)
    tol = tolerances(torch.float32)
    for length in (0, 1):
        cut = slice(0, length)
        part = apply_hooks(enc, x[:, cut], q[..., cut, :], k[..., cut, :], pos[cut], pos[cut])
        for key, value in part.items():
            rows = full[key][..., cut, :]  # [..., length, *]
            expected = rows[..., cut] if key in ("bias", "weights") else rows
            assert value.shape[-2:] == expected.shape[-2:], key
            torch.testing.assert_close(value, expected.expand_as(value), **tol)
        torch.testing.assert_close(mha(x[:, cut]), full_attn[:, cut], **tol)


@pytest.mark.parametrize("name", NAMES)
def test_strided_views_give_the_contiguous_result(name):
    """Transposed, sliced and expanded inputs (and strided positions) are read correctly."""
    enc = build_encoding(name)
    pos = torch.arange(T)
    g = torch.Generator().manual_seed(2)
    wide = torch.randn(B, 2 * T, C + 3, generator=g)
    xs = wide[:, ::2, 1 : C + 1]  # non-contiguous rows and columns
    qs = torch.randn(B, T, H, D, generator=g).transpose(1, 2)  # [B, H, T, D] view
    ks = torch.randn(B, H, D, T, generator=g).transpose(-1, -2)
    ps = torch.arange(2 * T)[::2] // 2  # strided positions 0..T-1
    got = apply_hooks(enc, xs, qs, ks, ps, ps)
    want = apply_hooks(enc, xs.contiguous(), qs.contiguous(), ks.contiguous(), pos, pos)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0)
    mha = _attention(enc)  # the projections' kernels depend on the layout: not bitwise
    torch.testing.assert_close(mha(xs), mha(xs.contiguous()), **tolerances(torch.float32))


@pytest.mark.parametrize("name", NAMES)
def test_integer_inputs_raise(name):
    enc = build_encoding(name)
    x, q, k, pos = make_inputs(T)
    if enc.sites:
        with pytest.raises(TypeError, match="int64"):
            apply_hooks(enc, x.long(), q.long(), k.long(), pos, pos)
    with pytest.raises(TypeError, match="int64"):
        _attention(enc)(x.long())


def _reads_q(enc, pos) -> bool:
    """Whether the encoding's score bias depends on the query content (Shaw, CoPE)."""
    _, q1, k1, _ = make_inputs(T, seed=3)
    _, q2, _, _ = make_inputs(T, seed=4)
    return not torch.equal(enc.score_bias(q1, k1, pos, pos), enc.score_bias(q2, k1, pos, pos))


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("name", NAMES)
def test_nan_and_inf_propagate_to_the_outputs_that_read_them(name, bad):
    """A bad value reaches exactly the outputs computed from it; the rest is unchanged."""
    enc = build_encoding(name)
    x, q, k, pos = make_inputs(T)
    b, h, t, f = 1, 2, 3, 4
    xb, qb = x.clone(), q.clone()
    xb[b, t, f], qb[b, h, t, f] = bad, bad
    clean, dirty = apply_hooks(enc, x, q, k, pos, pos), apply_hooks(enc, xb, qb, k, pos, pos)
    touched = {
        "embed": (b, t),
        "q": (b, h, t),
        "bias": (b, h, t) if "bias" in clean and _reads_q(enc, pos) else None,
        "value": (b, h, t),  # the probabilities of query t read q[t]
        "weights": (b, slice(None), slice(t, None)),  # FoX: x[t]'s gate reaches later rows
    }
    if name == "dape":  # its MLP mixes the heads of each (query, key) pair
        touched["bias"] = (b, slice(None), t)
    for key, value in dirty.items():
        where = touched.get(key)
        keep = torch.ones_like(value, dtype=torch.bool)
        if where is not None:
            assert not torch.isfinite(value[where]).all(), f"{key}: {bad} was zeroed"
            keep[where] = False
        torch.testing.assert_close(value[keep], clean[key].expand_as(value)[keep], rtol=0, atol=0)
    # attention: every query that sees token t (causal: t and later) turns non-finite;
    # earlier queries of that sequence may too (a masked probability 0 times a NaN value
    # is NaN in the dense product); the other sequence of the batch is untouched
    mha = _attention(enc)
    out_clean, out = mha(x), mha(xb)
    assert not torch.isfinite(out[b, t:]).all(-1).any(), f"attention zeroed a {bad} input"
    torch.testing.assert_close(out[1 - b], out_clean[1 - b], rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_negative_positions(name):
    """Learned tables reject them; every other encoding is defined there (guarantees.md).

    Relative encodings (and RoPE/xPos scores, and attention) are unchanged by a shift of
    all positions below zero; the sinusoidal table follows its formula at ``p < 0``; the
    query temperature (the log of a count of steps) rejects them too.
    """
    enc = build_encoding(name)
    x, q, k, pos = make_inputs(T)
    shift = 100
    if name == "learned":
        with pytest.raises(ValueError, match=f"-{shift}"):
            enc.embed(x, pos - shift)
        return
    if name == "temperature":
        with pytest.raises(ValueError, match=f"-{shift}"):
            enc.rotate(q, k, pos - shift, pos - shift)
        return
    if name == "liere":  # defined at p < 0, but its generators need not commute: not relative
        at = attention_positions(enc, pos - shift, T)
        got, _ = enc.rotate(q, k, at, at)
        gens = enc.generators().detach().double().numpy()
        want = [[reference.lie_rotate(x.double().numpy(), gens, at.numpy()) for x in r] for r in q]
        tol = tolerances(torch.float32, ops=64)
        torch.testing.assert_close(got.double(), torch.from_numpy(np.array(want)), **tol)
        return
    if name == "fope":  # its series are defined at p < 0, but scores depend on more than p - q
        got, _ = enc.rotate(q, k, pos - shift, pos - shift)
        coefs = [c.detach().double().numpy() for c in (enc.cos_coef, enc.sin_coef)]
        at = ((pos - shift).numpy(), enc.inv_freq.numpy(), *coefs)
        want = np.stack([fourier_rope.fope_transform(row.double().numpy(), *at) for row in q])
        tol = tolerances(torch.float32, ops=16 * shift)  # float32 angles up to `shift` rad
        torch.testing.assert_close(got.double(), torch.from_numpy(want), **tol)
        return
    tol = tolerances(torch.float32, ops=64)
    got = apply_hooks(enc, x, q, k, pos - shift, pos - shift)
    want = apply_hooks(enc, x, q, k, pos, pos)
    if "embed" in got:
        table = reference.sinusoidal_positional_encoding_at(np.arange(-shift, T - shift), C)
        expected = x.double() + torch.from_numpy(table)
        torch.testing.assert_close(got["embed"].double(), expected, **tol)
    if "q" in got:  # rotations differ, the scores q_m . k_n do not
        scores = got["q"] @ got["k"].transpose(-2, -1)
        torch.testing.assert_close(scores, want["q"] @ want["k"].transpose(-2, -1), **tol)
    # without a rotation nothing reads a position but through q_pos - k_pos: bit for bit
    exact = {} if "q" in got or "embed" in got else {"rtol": 0.0, "atol": 0.0}
    for key in ("bias", "value", "weights"):
        if key in got:
            torch.testing.assert_close(got[key], want[key], **(exact or tol))
    mha = _attention(enc)
    torch.testing.assert_close(mha(x, pos - shift), mha(x, pos), **(exact or tol))


# ------------------------------------------------------------------------- command line

CLI_CASES = [
    (["nosuch"], "nosuch"),
    (["list", "--bogus"], "--bogus"),
    (["list", "extra"], "extra"),
    (["explain", "nosuch"], "nosuch"),
    (["explain"], "ENCODING"),
    (["explain", "rope", "--dim", "7"], "7"),
    (["explain", "rope", "--dim", "-4"], "-4"),
    (["explain", "alibi", "--heads", "0"], "0"),
    (["explain", "sinusoidal", "--len", "-1"], "-1"),
    (["explain", "sinusoidal", "--dim", "abc"], "abc"),
    (["show", "nosuch"], "nosuch"),
    (["show"], "--all"),
    (["show", "rope", "--out", "{tmp}/x.jpg"], ".jpg"),
    (["show", "rope", "--len", "-3", "--out", "{tmp}/x.png"], "-3"),
    (["show", "rope-decay", "--dim", "7", "--out", "{tmp}/x.png"], "7"),
    (["show", "alibi", "--heads", "0", "--out", "{tmp}/x.png"], "0"),
    (["show", "rope", "--dpi", "0", "--out", "{tmp}/x.png"], "0"),
    (["show", "learned", "--table", "{tmp}/missing.pt", "--out", "{tmp}/x.png"], "missing.pt"),
    (["show", "rope", "--all", "--out", "{tmp}"], "rope"),
    (["lab", "--encodings", "nosuch", "--quick"], "nosuch"),
    (["lab", "--corpus", "{tmp}/missing.txt", "--quick"], "missing.txt"),
    (["lab", "--steps", "-1", "--quick"], "-1"),
    (["lab", "--train-len", "0", "--quick"], "0"),
    (["lab", "--eval-lens", "abc"], "abc"),
    (["lab", "--lr", "-1", "--quick"], "-1"),
    (["lab", "--threads", "0", "--quick"], "0"),
    (["lab", "--task", "nosuch"], "nosuch"),
    (["lab", "--scalings", "nosuch", "--quick"], "nosuch"),
    (["lab", "--d-model", "7", "--quick"], "7"),
    (["bench", "--only", "nosuch"], "nosuch"),
    (["bench", "--threads", "0", "--quick"], "0"),
    (["bench", "--repeats", "-1", "--quick"], "-1"),
    (["bench", "--threads", "abc"], "abc"),
    (["bench", "--quick", "--json", "{tmp}/missing/x.json"], "missing"),
    (["extend", "{tmp}/missing"], "missing"),
    (["audit", "{tmp}/missing"], "no such file or folder"),
]


def test_cli_cases_cover_every_subcommand():
    assert {argv[0] for argv, _ in CLI_CASES if argv} >= set(cli.COMMANDS) | {"nosuch"}


@pytest.mark.parametrize(("argv", "fragment"), CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_errors_are_one_line_with_status_2(argv, fragment, capsys, tmp_path):
    status = cli.main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and fragment in err
    assert not any(tmp_path.iterdir()), "a failing command wrote files"


def test_unknown_subcommand_in_a_real_process():
    done = subprocess.run(
        [sys.executable, "-m", "posenc", "nosuch"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "nosuch" in done.stderr
