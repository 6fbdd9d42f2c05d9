"""posenc against the text families whose positions need more than one group's check:
Whisper's two stacks, UDOP's encoder and decoder biases, RoFormer's sinusoidal rotary,
TAPAS's per-cell positions, MPNet's buckets, LayoutLMv2's text embeddings, and the
refusals of the parts posenc does not build.

Each family's own module is the reference, built from a small random config (nothing is
downloaded); posenc's side is ``build_position_module`` / ``from_hf_config`` with the
weights copied by ``load_hf_weights``. The walk's ``OWN_TESTS`` names the test of every
family checked here instead of by ``test_interop_positions``' group tests.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``C`` d_model, ``D`` head_dim.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import _hf_position_walk as walk  # noqa: E402
from posenc import (  # noqa: E402
    Compose,
    LearnedPositionalEncoding,
    RotaryEmbedding,
    T5RelativeBias,
    from_hf_config,
)
from posenc.encodings.sinusoidal_layouts import SinusoidalLayout  # noqa: E402
from posenc.hf import tapas_positions  # noqa: E402
from posenc.hf.absolute import build_position_module, load_hf_weights  # noqa: E402

T, OFFSET = 6, 40
EPS32 = torch.finfo(torch.float32).eps


def test_every_own_test_exists():
    assert set(walk.OWN_TESTS) <= set(walk.families())
    missing = [name for name in walk.OWN_TESTS.values() if not callable(globals().get(name))]
    assert not missing


def _bias(enc: T5RelativeBias, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """posenc's bias ``[1, H, Tq, Tk]`` at these positions."""
    q = torch.zeros(1, enc.num_heads, q_pos.numel(), 4)
    with torch.no_grad():
        return enc.score_bias(q, torch.zeros(1, enc.num_heads, k_pos.numel(), 4), q_pos, k_pos)


# ----------------------------------------------------------------------------- Whisper


def test_whisper_stacks_equal_the_encoder_and_decoder_tables():
    torch.manual_seed(0)
    cfg = walk.tiny_config("whisper", max_source_positions=32, max_target_positions=64)
    model = transformers.AutoModel.from_config(cfg).eval()
    config = cfg.to_dict()
    encoder = from_hf_config(cfg, stack="encoder")
    assert isinstance(encoder, SinusoidalLayout)
    seen = []
    hook = model.encoder.embed_positions.register_forward_hook(
        lambda _m, args, out: seen.append((args[0], out))
    )
    features = torch.randn(2, cfg.num_mel_bins, 2 * cfg.max_source_positions)
    with torch.no_grad():
        model.encoder(features)
    hook.remove()
    rows, theirs = seen[0]  # every frame's row: 0 .. max_source_positions - 1
    assert torch.equal(rows, torch.arange(cfg.max_source_positions))
    tol = 4 * EPS32 * cfg.max_source_positions  # their float32 angles: |a| * eps apart
    torch.testing.assert_close(encoder.encoding(rows), theirs, rtol=0, atol=tol)

    decoder = build_position_module("whisper", config, stack="decoder")
    load_hf_weights(decoder, model, prefix="decoder.")  # the encoder holds a table too
    assert isinstance(decoder, LearnedPositionalEncoding)
    ids = torch.randint(3, 99, (2, T))
    with torch.no_grad():
        table = model.decoder.embed_positions
        theirs = table(ids, **walk.past(table, OFFSET))
        ours = decoder.encoding(torch.arange(OFFSET, OFFSET + T))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("model_type", "extra", "stack", "match"),
    [
        ("whisper", {}, None, "pass stack='encoder' or stack='decoder'"),
        ("whisper", {}, "middle", "stack must be 'encoder' or 'decoder', got 'middle'"),
        ("gpt2", {}, "decoder", "model_type 'gpt2' has no encoder-decoder"),
    ],
)
def test_stack_refusals_name_the_value(model_type, extra, stack, match):
    config = {**walk.tiny_config(model_type).to_dict(), **extra}
    with pytest.raises(ValueError, match=match):
        build_position_module(model_type, config, stack=stack)
    with pytest.raises(ValueError, match=match):
        from_hf_config(config, stack=stack)


def test_stack_picks_t5_buckets_and_is_refused_for_rotary_families():
    config = walk.tiny_config("t5").to_dict()
    assert build_position_module("t5", config, stack="encoder").bidirectional
    assert not build_position_module("t5", config, stack="decoder").bidirectional
    with pytest.raises(ValueError, match="stack='encoder' applies to the non-rotary"):
        from_hf_config(walk.tiny_config("moonshine"), stack="encoder")  # rotary, two stacks


# -------------------------------------------------------------------------------- UDOP


def test_udop_biases_equal_the_encoder_and_decoder_ones():
    torch.manual_seed(0)
    cfg = walk.tiny_config("udop", relative_bias_args=[{"type": "1d"}])
    model = transformers.AutoModel.from_config(cfg).eval()
    config = cfg.to_dict()
    encoder = load_hf_weights(build_position_module("udop", config, stack="encoder"), model)
    decoder = load_hf_weights(build_position_module("udop", config, stack="decoder"), model)
    assert encoder.bidirectional and not decoder.bidirectional

    seen = []  # the bias the encoder's first attention is given
    attention = model.encoder.block[0].layer[0].SelfAttention
    hook = attention.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append(kwargs["position_bias"]),
        with_kwargs=True,
    )
    ids = torch.randint(3, 99, (2, T))
    boxes = torch.tensor([0.1, 0.2, 0.5, 0.7]).expand(2, T, 4)
    with torch.no_grad():
        model.encoder(input_ids=ids, bbox=boxes, attention_mask=torch.ones(2, T, dtype=torch.long))
    hook.remove()
    positions = torch.arange(T)
    torch.testing.assert_close(_bias(encoder, positions, positions), seen[0], rtol=0, atol=0)

    module = model.decoder.block[0].layer[0].SelfAttention
    with torch.no_grad():
        theirs = module.compute_bias(T, OFFSET + T, past_seen_tokens=OFFSET)
    ours = _bias(decoder, torch.arange(OFFSET, OFFSET + T), torch.arange(OFFSET + T))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (None, r"types \['1d', 'horizontal', 'vertical'\]"),  # the default: 2-D biases too
        ([{"type": "1d"}, {"type": "vertical"}], r"\['1d', 'vertical'\]"),
        ([{"type": "1d", "prefix_bucket": True}], "prefix_bucket=True"),
        ([{"type": "1d", "augmentation": True}], "augmentation=True"),
    ],
)
def test_udop_encoder_refuses_the_2d_biases(args, match):
    config = walk.tiny_config("udop", relative_bias_args=args).to_dict()
    with pytest.raises(ValueError, match=match):
        build_position_module("udop", config)
    assert isinstance(build_position_module("udop", config, stack="decoder"), T5RelativeBias)


# ---------------------------------------------------------------------------- RoFormer


def test_roformer_rotation_equals_its_sinusoidal_rotary():
    torch.manual_seed(0)
    module = walk.modeling("roformer")
    cfg = walk.tiny_config("roformer", max_position_embeddings=64)
    enc = from_hf_config(cfg)
    assert isinstance(enc, RotaryEmbedding) and enc.interleaved
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    table = module.RoFormerSinusoidalPositionalEmbedding(cfg.max_position_embeddings, head_dim)
    with torch.no_grad():
        table.weight.copy_(table.create_weight())
        sinusoidal_pos = table((1, T), **walk.past(table, OFFSET))[None, None]  # [1, 1, T, D]
    q = torch.randn(2, cfg.num_attention_heads, T, head_dim)
    k = torch.randn(2, cfg.num_attention_heads, T, head_dim)
    apply = module.RoFormerSelfAttention.apply_rotary_position_embeddings
    q_theirs, k_theirs = apply(sinusoidal_pos, q, k)
    positions = torch.arange(OFFSET, OFFSET + T)
    q_ours, k_ours = enc.rotate(q, k, positions, positions)
    # both round angles up to |a| <= OFFSET + T and a few products to float32
    tol = 2 * EPS32 * (OFFSET + T + 4) * float(torch.cat((q, k)).abs().max())
    torch.testing.assert_close(q_ours, q_theirs, rtol=0, atol=tol)
    torch.testing.assert_close(k_ours, k_theirs, rtol=0, atol=tol)


def test_roformer_refuses_rotated_values():
    config = walk.tiny_config("roformer", rotary_value=True).to_dict()
    with pytest.raises(ValueError, match="rotary_value=True"):
        build_position_module("roformer", config)


# ------------------------------------------------------------------------------- TAPAS


def _table_rows(model, table: torch.nn.Embedding, **inputs) -> torch.Tensor:
    """The rows ``[B, T]`` the model reads ``table`` at."""
    rows = []
    hook = table.register_forward_pre_hook(lambda _, args: rows.append(args[0]))
    with torch.no_grad():
        model(**inputs)
    hook.remove()
    return rows[0]


def test_tapas_positions_restart_in_every_cell():
    torch.manual_seed(0)
    cfg = walk.tiny_config("tapas", max_position_embeddings=8)
    assert cfg.reset_position_index_per_cell
    model = transformers.AutoModel.from_config(cfg).eval()
    enc = load_hf_weights(build_position_module("tapas", cfg.to_dict()), model)
    length = 14
    types = torch.zeros(2, length, len(cfg.type_vocab_sizes), dtype=torch.long)
    g = torch.Generator().manual_seed(1)
    types[0, 10:, 1] = torch.randint(1, 3, (4,), generator=g)  # a long question: capped
    types[0, 10:, 2] = torch.randint(0, 3, (4,), generator=g)
    types[1, 3:, 1] = torch.randint(1, 4, (11,), generator=g)  # cells in any order
    types[1, 3:, 2] = torch.randint(0, 4, (11,), generator=g)
    ids = torch.randint(3, 99, (2, length), generator=g)
    read = _table_rows(
        model, model.embeddings.position_embeddings, input_ids=ids, token_type_ids=types
    )
    positions = tapas_positions(types, max_len=enc.max_len)
    torch.testing.assert_close(positions, read, rtol=0, atol=0)
    assert int(positions.max()) == enc.max_len - 1  # the cap was reached
    with torch.no_grad():
        table = model.embeddings.position_embeddings(read)
    torch.testing.assert_close(enc.encoding(positions), table, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (torch.zeros(2, 5, dtype=torch.long), r"\[B, T, K >= 3\], got \(2, 5\)"),
        (torch.zeros(2, 5, 7), r"integers"),
        (torch.full((1, 3, 7), -1), "negative"),
    ],
)
def test_tapas_positions_refuse_bad_ids(ids, match):
    with pytest.raises(ValueError, match=match):
        tapas_positions(ids, max_len=8)


# ------------------------------------------------------------------------------- MPNet


def test_mpnet_table_and_buckets_equal_its_own():
    torch.manual_seed(0)
    cfg = walk.tiny_config("mpnet", relative_attention_num_buckets=32)
    model = transformers.AutoModel.from_config(cfg).eval()
    enc = load_hf_weights(build_position_module("mpnet", cfg.to_dict()), model)
    assert isinstance(enc, Compose)
    table, bias = enc.encodings
    assert isinstance(table, LearnedPositionalEncoding) and isinstance(bias, T5RelativeBias)
    ids = torch.randint(3, 99, (2, T))
    ids[1, :3] = 1  # MPNet's padding id is 1 whatever the config says
    mask = ids != 1
    read = _table_rows(model, model.embeddings.position_embeddings, input_ids=ids)
    positions = torch.where(mask, mask.long().cumsum(-1) - 1, 0)
    torch.testing.assert_close(read[mask], positions[mask] + 2, rtol=0, atol=0)
    with torch.no_grad():
        theirs = model.embeddings.position_embeddings(read)[mask]
    torch.testing.assert_close(table.encoding(positions)[mask], theirs, rtol=0, atol=0)

    # the buckets count token indices 0 .. T-1, padding included, past max_distance = 128
    # (MPNet is an encoder without a cache; its position_ids argument fails in 5.23)
    length = 2 * 128 + 3
    x = torch.zeros(1, length, cfg.hidden_size)
    with torch.no_grad():
        theirs = model.encoder.compute_position_bias(x)
    index = torch.arange(length)
    torch.testing.assert_close(_bias(bias, index, index), theirs, rtol=0, atol=0)


def test_mpnet_refuses_other_bucket_counts():
    config = walk.tiny_config("mpnet", relative_attention_num_buckets=8).to_dict()
    with pytest.raises(ValueError, match="relative_attention_num_buckets=8"):
        build_position_module("mpnet", config)


# ------------------------------------------------------------------------ layout models


def test_layoutlmv2_text_embeddings_read_posencs_positions():
    """LayoutLMv2's visual backbone needs detectron2: its text embeddings are run alone,
    through the model's own ``_calc_text_embeddings``."""
    torch.manual_seed(0)
    module = walk.modeling("layoutlmv2")
    cfg = walk.tiny_config(
        "layoutlmv2",
        coordinate_size=3,
        shape_size=2,
        has_relative_attention_bias=False,
        has_spatial_attention_bias=False,
    )
    embeddings = module.LayoutLMv2Embeddings(cfg).eval()
    enc = load_hf_weights(build_position_module("layoutlmv2", cfg.to_dict()), embeddings)
    ids = torch.randint(3, 99, (2, T))
    boxes = torch.tensor([1, 2, 5, 7]).expand(2, T, 4)
    stand_in = SimpleNamespace(embeddings=embeddings)
    read = _table_rows(
        lambda **kw: module.LayoutLMv2Model._calc_text_embeddings(stand_in, **kw),
        embeddings.position_embeddings,
        input_ids=ids,
        bbox=boxes,
        position_ids=None,
        token_type_ids=None,
    )
    positions = torch.arange(T).expand(2, -1)
    torch.testing.assert_close(read, positions, rtol=0, atol=0)
    with torch.no_grad():
        theirs = embeddings.position_embeddings(read)
    torch.testing.assert_close(enc.encoding(positions), theirs, rtol=0, atol=0)


@pytest.mark.parametrize("model_type", ["layoutlmv2", "layoutlmv3"])
@pytest.mark.parametrize("flag", ["has_relative_attention_bias", "has_spatial_attention_bias"])
def test_layout_attention_biases_are_refused(model_type, flag):
    config = walk.tiny_config(model_type).to_dict()
    config.update(has_relative_attention_bias=False, has_spatial_attention_bias=False)
    assert isinstance(build_position_module(model_type, config), LearnedPositionalEncoding)
    with pytest.raises(ValueError, match=f"{model_type} {flag}=True"):
        build_position_module(model_type, {**config, flag: True})


# ---------------------------------------------------------------- configs, end to end


def test_from_hf_config_builds_the_new_text_families():
    esm = walk.tiny_config("esm", pad_token_id=1)
    table = from_hf_config(esm)
    assert isinstance(table, LearnedPositionalEncoding)
    assert table.max_len == esm.max_position_embeddings - 2  # from padding_idx + 1
    esm_rotary = walk.tiny_config("esm", position_embedding_type="rotary")
    assert isinstance(from_hf_config(esm_rotary), RotaryEmbedding)
    fsmt = from_hf_config(walk.tiny_config("fsmt", pad_token_id=1))
    assert isinstance(fsmt, SinusoidalLayout) and fsmt.offset == 2
    assert fsmt.spacing == "tensor2tensor" and fsmt.layout == "sin|cos"
    text = walk.tiny_config("pp_formulanet_text")
    formula = from_hf_config(text)
    assert formula.max_len == text.max_position_embeddings  # two extra rows, offset 2
