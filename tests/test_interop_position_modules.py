"""The pieces behind ``build_position_module`` and ``load_hf_weights``, checked against
float64 references written from the formulas and against transformers' own functions.

Shapes: ``B`` batch, ``T`` length, ``C`` d_model, ``H`` heads.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.encodings.sinusoidal_layouts import SinusoidalLayout, sinusoidal_layout_table
from posenc.hf.absolute import build_position_module, load_hf_weights, positions_skipping_padding
from posenc.hf.biases import hf_alibi_slopes

EPS64 = np.finfo(np.float64).eps


def _layout_reference(positions: np.ndarray, d_model: int, layout: str, spacing: str, offset: int):
    """float64 NumPy: angles (p + offset) * base^(-i / steps), laid out as named."""
    half = d_model // 2
    steps = half if spacing == "paper" else half - 1
    inv_freq = 10000.0 ** (-np.arange(half) / steps)
    angles = (positions.astype(np.float64) + offset)[..., None] * inv_freq
    sin, cos = np.sin(angles), np.cos(angles)
    if layout == "interleaved":
        return np.stack((sin, cos), axis=-1).reshape(*positions.shape, d_model)
    return np.concatenate((sin, cos) if layout == "sin|cos" else (cos, sin), axis=-1)


@settings(max_examples=60, deadline=None)
@given(
    half=st.integers(2, 32),
    layout=st.sampled_from(["interleaved", "sin|cos", "cos|sin"]),
    spacing=st.sampled_from(["paper", "tensor2tensor"]),
    offset=st.integers(0, 4),
    start=st.integers(-1000, 10**6),
)
def test_sinusoidal_layouts_equal_the_float64_formula(half, layout, spacing, offset, start):
    positions = torch.arange(start, start + 7)
    got = sinusoidal_layout_table(
        positions, 2 * half, layout=layout, spacing=spacing, offset=offset, dtype=torch.float64
    )
    want = _layout_reference(positions.numpy(), 2 * half, layout, spacing, offset)
    tol = 8 * EPS64 * (abs(start) + 8 + offset)  # argument reduction of |angle|
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=tol)


def test_interleaved_paper_layout_is_posencs_sinusoidal_table():
    positions = torch.arange(0, 300)
    got = sinusoidal_layout_table(positions, 16, layout="interleaved", dtype=torch.float64)
    want = posenc.sinusoidal_table(positions, 16, dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=64 * EPS64 * 300)


def test_sinusoidal_layout_embed_adds_at_the_offset_position():
    enc = SinusoidalLayout(8, spacing="tensor2tensor", offset=2)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    want = x + torch.from_numpy(
        _layout_reference(positions.numpy(), 8, "sin|cos", "tensor2tensor", 2)
    )
    torch.testing.assert_close(enc(x, positions), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"d_model": 7}, "7"),
        ({"d_model": 2, "spacing": "tensor2tensor"}, "too small"),
        ({"d_model": 8, "layout": "cos-sin"}, "cos-sin"),
        ({"d_model": 8, "spacing": "fairseq"}, "fairseq"),
        ({"d_model": 8, "offset": -1}, "-1"),
    ],
)
def test_sinusoidal_layout_rejects_bad_settings(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        SinusoidalLayout(**kwargs)


@pytest.mark.parametrize("max_bias", [8.0, 16.0, 4.5])
@pytest.mark.parametrize("num_heads", [1, 5, 8, 12])
def test_alibi_slopes_max_bias_follows_the_formula(num_heads, max_bias):
    c = 2 ** math.floor(math.log2(num_heads))
    want = [2 ** (-max_bias * h / c) for h in range(1, c + 1)]
    want += [2 ** (-max_bias * h / (2 * c)) for h in range(1, 2 * c, 2)][: num_heads - c]
    got = posenc.alibi_slopes(num_heads, max_bias=max_bias, dtype=torch.float64)
    np.testing.assert_allclose(got.numpy(), want, rtol=4 * EPS64, atol=0)


@pytest.mark.parametrize("num_heads", [1, 3, 8, 12, 20, 112])
def test_family_slopes_are_the_families_bits(num_heads):
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    falcon = pytest.importorskip("transformers.models.falcon.modeling_falcon")
    mpt = pytest.importorskip("transformers.models.mpt.modeling_mpt")
    torch.testing.assert_close(
        hf_alibi_slopes("bloom", num_heads),
        bloom._get_alibi_slopes(num_heads, "cpu"),
        rtol=0,
        atol=0,
    )
    at_one = falcon.build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)[:, 0, 1]
    torch.testing.assert_close(hf_alibi_slopes("falcon", num_heads), at_one, rtol=0, atol=0)
    at_minus_one = mpt.build_mpt_alibi_tensor(num_heads, 2)[:, 0, 0]
    torch.testing.assert_close(hf_alibi_slopes("mpt", num_heads), -at_minus_one, rtol=0, atol=0)


def test_alibi_takes_a_checkpoints_slopes_and_checks_them():
    slopes = hf_alibi_slopes("falcon", 4)
    enc = posenc.ALiBi(4, slopes=slopes)
    torch.testing.assert_close(enc.slopes(), slopes.double(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="3 entries"):
        posenc.ALiBi(4, slopes=slopes[:3])
    with pytest.raises(ValueError, match="finite"):
        posenc.ALiBi(4, slopes=torch.tensor([1.0, math.nan, 1.0, 1.0]))
    with pytest.raises(TypeError, match="int64"):
        posenc.ALiBi(4, slopes=torch.ones(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="meta"):
        posenc.ALiBi(4, slopes=slopes.to("meta"))


@pytest.mark.parametrize(
    ("model_type", "cfg", "fragment"),
    [
        ("mpt", {"n_heads": 4, "attn_config": {"alibi_bias_max": 16}}, "alibi_bias_max=16"),
        ("bert", {"hidden_size": 8, "max_position_embeddings": 16,
                  "position_embedding_type": "relative_key"}, "relative_key"),
        ("xlm", {"emb_dim": 8, "max_position_embeddings": 16, "sinusoidal_embeddings": True},
         "sinusoidal_embeddings"),
        ("gpt2", {"n_embd": 8}, "n_positions"),
        ("t5", {"num_heads": 2}, "relative_attention_num_buckets"),
    ],
)  # fmt: skip
def test_position_fields_posenc_does_not_build_raise(model_type, cfg, fragment):
    with pytest.raises(ValueError, match=fragment):
        build_position_module(model_type, cfg)


def test_families_without_these_positions_get_none():
    assert build_position_module("llama", {"hidden_size": 8}) is None
    assert build_position_module("falcon", {"num_attention_heads": 4, "alibi": False}) is None
    assert isinstance(
        build_position_module("falcon", {"num_attention_heads": 4, "alibi": True}), posenc.ALiBi
    )


def test_learned_tables_keep_the_rows_after_the_offset():
    table = torch.randn(18, 8)  # BART: max_position_embeddings 16 + 2
    enc = build_position_module("bart", {"d_model": 8, "max_position_embeddings": 16})
    load_hf_weights(enc, {"model.encoder.embed_positions.weight": table})
    torch.testing.assert_close(enc.weight.detach(), table[2:], rtol=0, atol=0)
    roberta = build_position_module(
        "roberta", {"hidden_size": 8, "max_position_embeddings": 18, "pad_token_id": 1}
    )
    assert roberta.max_len == 16  # rows 0 and 1 (padding_idx) come before position 0


def test_load_hf_weights_names_what_it_cannot_choose_or_fit():
    enc = posenc.LearnedPositionalEncoding(8, 16)
    both = {
        "encoder.embed_positions.weight": torch.ones(18, 8),
        "decoder.embed_positions.weight": torch.ones(18, 8),
    }
    with pytest.raises(ValueError, match=r"decoder\.embed_positions\.weight"):
        load_hf_weights(enc, both)
    load_hf_weights(enc, both, prefix="decoder.")
    with pytest.raises(ValueError, match=r"\(18, 4\)"):
        load_hf_weights(enc, {"wpe.weight": torch.ones(18, 4)})
    with pytest.raises(ValueError, match="none"):
        load_hf_weights(enc, {"wte.weight": torch.ones(18, 8)})
    per_layer = {
        f"encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight": torch.ones(32, 2)
        for i in range(2)
    }
    with pytest.raises(ValueError, match="layer_idx"):
        load_hf_weights(posenc.T5RelativeBias(2), per_layer)
    load_hf_weights(posenc.T5RelativeBias(2), per_layer, layer_idx=1)
    with pytest.raises(TypeError, match="RotaryEmbedding"):
        load_hf_weights(posenc.RotaryEmbedding(8), {})
    with pytest.raises(TypeError, match="list"):
        load_hf_weights(enc, [])


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(st.lists(st.booleans(), min_size=1, max_size=9), min_size=1, max_size=3).filter(
        lambda r: len({len(x) for x in r}) == 1
    ),
    past=st.integers(0, 50),
    padding_idx=st.integers(0, 3),
)
def test_positions_skipping_padding_follow_roberta(rows, past, padding_idx):
    roberta = pytest.importorskip("transformers.models.roberta.modeling_roberta")
    real = torch.tensor(rows)
    ids = torch.where(real, torch.tensor(padding_idx + 5), torch.tensor(padding_idx))
    theirs = roberta.RobertaEmbeddings.create_position_ids_from_input_ids(ids, padding_idx, past)
    ours = positions_skipping_padding(real, past=past) + padding_idx + 1
    torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=0)
    assert bool((positions_skipping_padding(real, past=past)[~real] == 0).all())


def test_positions_skipping_padding_rejects_bad_masks():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        positions_skipping_padding(torch.ones(3))
    with pytest.raises(ValueError, match="-1"):
        positions_skipping_padding(torch.ones(1, 3), past=-1)


@pytest.mark.parametrize(
    ("config_name", "kwargs", "kind"),
    [
        ("BloomConfig", {"n_head": 6}, posenc.ALiBi),
        ("FalconConfig", {"num_attention_heads": 4, "alibi": True}, posenc.ALiBi),
        ("T5Config", {"num_heads": 4, "is_decoder": True}, posenc.T5RelativeBias),
        (
            "OPTConfig",
            {"hidden_size": 16, "max_position_embeddings": 32},
            posenc.LearnedPositionalEncoding,
        ),
        ("M2M100Config", {"d_model": 16}, SinusoidalLayout),
    ],
)
def test_from_hf_config_returns_these_modules(config_name, kwargs, kind):
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, config_name)(**kwargs)
    enc = posenc.from_hf_config(config)
    assert isinstance(enc, kind)
    if isinstance(enc, posenc.T5RelativeBias):
        assert not enc.bidirectional  # the decoder stack's config
    if isinstance(enc, posenc.ALiBi):
        assert "explicit" in repr(enc)


_HEADS = {"GPT2": "LMHeadModel", "OPT": "ForCausalLM", "T5": "ForConditionalGeneration"}


def _tiny(name: str, **kwargs):
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, f"{name}Config")(vocab_size=99, pad_token_id=1, **kwargs)
    torch.manual_seed(0)
    return config, getattr(transformers, name + _HEADS[name])(config).eval()


def _padded_ids(length: int) -> torch.Tensor:
    ids = torch.randint(3, 99, (2, length), generator=torch.Generator().manual_seed(1))
    ids[1, :3] = 1  # left padding
    return ids


def _assert_float32_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Logits of float32 models that add the same terms in another order: a few roundings
    (64 eps) of the largest logit apart."""
    tol = 64 * torch.finfo(torch.float32).eps * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


@pytest.mark.parametrize("name", ["GPT2", "OPT"])
def test_logits_with_posencs_absolute_table_equal_the_models(name):
    """The model's own table zeroed and posenc's encoding added to the token embeddings:
    the same logits at every real token (OPT counts real tokens only, from row 2)."""
    small = {"n_embd": 16, "n_layer": 2, "n_head": 2, "n_positions": 32}
    if name == "OPT":
        small = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "ffn_dim": 32, "max_position_embeddings": 32}  # fmt: skip
    config, model = _tiny(name, **small)
    ids = _padded_ids(9)
    mask = ids != 1
    enc = posenc.from_hf_config(config)
    load_hf_weights(enc, model)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask.long()).logits
        table = model.get_decoder().embed_positions if name == "OPT" else model.transformer.wpe
        table.weight.zero_()
        positions = positions_skipping_padding(mask) if name == "OPT" else torch.arange(9)
        embeds = model.get_input_embeddings()(ids) + enc.encoding(positions)
        got = model(inputs_embeds=embeds, attention_mask=mask.long()).logits
    rows = mask if name == "OPT" else torch.ones_like(mask)
    _assert_float32_close(got[rows], want[rows])


def test_t5_logits_with_posencs_bias_equal_the_models():
    """Every T5 attention module's compute_bias replaced by posenc's bias (weights loaded
    by load_hf_weights): the same logits, encoder and decoder, also through a KV cache."""
    sizes = {"d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 2, "num_heads": 2}
    buckets = {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 12}
    config, model = _tiny("T5", decoder_start_token_id=0, **sizes, **buckets)
    ids, target = _padded_ids(14)[:1], _padded_ids(14)[1:, 3:]

    def run():  # the full target at once, then its last token through the cache
        full = model(input_ids=ids, decoder_input_ids=target).logits
        first = model(input_ids=ids, decoder_input_ids=target[:, :-1], use_cache=True)
        last = model(
            input_ids=ids, decoder_input_ids=target[:, -1:], past_key_values=first.past_key_values
        )
        return full, last.logits

    with torch.no_grad():
        want = run()
        for module in model.modules():
            if getattr(module, "has_relative_attention_bias", False):
                enc = posenc.from_hf_config({**config.to_dict(), "is_decoder": module.is_decoder})
                load_hf_weights(enc, model)
                module.compute_bias = _posenc_bias(enc)
        got = run()
    for mine, theirs in zip(got, want, strict=True):
        _assert_float32_close(mine, theirs)
    _assert_float32_close(got[1][:, -1], got[0][:, -1])


def _posenc_bias(enc: posenc.T5RelativeBias):
    def compute_bias(query_length, key_length, device=None, past_seen_tokens=0):
        q_pos = torch.arange(past_seen_tokens, past_seen_tokens + query_length)
        k_pos = torch.arange(key_length)
        q = torch.zeros(1, enc.num_heads, query_length, 1)
        return enc.score_bias(q, torch.zeros(1, enc.num_heads, key_length, 1), q_pos, k_pos)

    return compute_bias
