"""posenc against the non-rotary position code of every family in the installed transformers.

The families come from ``_hf_position_walk`` (their sources, not a list written here).
Each one is either checked below, group by group, against its own code on positions
``0..T-1`` and at an offset, or named in ``UNSUPPORTED`` with the reason; a family in
neither, or a mismatch, fails. posenc's side is always ``build_position_module`` on the
family's config, with the weights copied by one ``load_hf_weights`` call. The families of
the walk's ``OWN_TESTS`` (two stacks, extra biases, a rotary table) are checked by their
own tests in ``test_interop_text_families.py`` instead of their group's; DeBERTa and
DeBERTa-v2 (``DISENTANGLED``: a table and disentangled attention) by the last test here.

* alibi: the family's own builder; equal up to a constant per query row (what the
  softmax ignores), within the rounding of the family's own product ``m * j``.
* t5: every attention module with a table: its ``compute_bias`` (LongT5's blocked local
  form too) equals posenc's bias bit for bit.
* learned_class / sinusoidal_class: the family's position module on a batch at a cache
  offset, and with left padding where it counts real tokens.
* table: a tiny random model of the family run on a left-padded batch; the rows its
  position table is read at equal posenc's positions plus the family's offset.
* multimodal text towers (``posenc.hf.composite``): the family's tiny random composite
  model, its text tower run on a left-padded batch, and after a cache where it takes one;
  the rows read (or the sinusoidal module's output) equal posenc's, built from the
  composite config.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``C`` d_model.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import _hf_position_walk as walk  # noqa: E402
from posenc import ALiBi, LearnedPositionalEncoding, T5RelativeBias  # noqa: E402
from posenc.encodings.sinusoidal_layouts import SinusoidalLayout  # noqa: E402
from posenc.hf.absolute import (  # noqa: E402
    ABSOLUTE_FAMILIES,
    build_position_module,
    load_hf_weights,
    positions_skipping_padding,
)
from posenc.hf.composite import text_tower  # noqa: E402

T, OFFSET, PAD = 6, 40, 1
EPS32 = torch.finfo(torch.float32).eps

_VISION = "positions of image patches or audio frames, not text"
#: family -> why posenc does not build its positions.
UNSUPPORTED = {
    **dict.fromkeys(("eomt", "videomt", "imagegpt"), _VISION),
    **dict.fromkeys(("qwen2_audio", "voxtral", "audioflamingo3"), _VISION),
    **dict.fromkeys(("moss_transcribe_diarize", "autoformer", "informer"), _VISION),
    **dict.fromkeys(("time_series_transformer", "pp_doclayout_v2"), _VISION),
    "evolla": "protein-sequence positions of its SaProt encoder (rotary unless "
    "position_embedding_type='absolute'); its language model is rotary (from_hf_config)",
    "decision_transformer": "timestep embeddings, not token positions",
}
#: families whose positions are not text positions (what the coverage leaves out)
WITHOUT_TEXT = frozenset(
    f for f, why in UNSUPPORTED.items() if why == _VISION or f in ("evolla", "decision_transformer")
)
#: families whose text positions posenc matches only in part (the rest refused by name or
#: not built): the coverage does not count them as matched
PARTIAL = {
    "layoutlmv2": "released configs add a 1-D relative and a 2-D spatial bias (refused)",
    "layoutlmv3": "released configs add a 1-D relative and a 2-D spatial bias (refused)",
    "udop": "the default encoder adds 2-D layout biases to T5's buckets (refused)",
    "lilt": "the layout stream's second, narrower position table is not built",
    "speecht5": "the text encoder's scaled table and clamped relative embeddings (refused)",
}
#: families whose folder holds several models: the model_type of the one with text positions
TEXT_MODEL_TYPE = {"pp_formulanet": "pp_formulanet_text", "data2vec": "data2vec-text"}


def _text_model_type(family: str) -> str:
    return TEXT_MODEL_TYPE.get(family) or walk.model_type_of(family)


#: Families compared by ``test_deberta_attention_and_table_equal_the_familys_own`` below.
DISENTANGLED = ("deberta", "deberta_v2")


def _cases(group: str) -> list[str]:
    own = {*walk.OWN_TESTS, *DISENTANGLED}
    return sorted(
        f
        for f, groups in walk.families().items()
        if group in groups and f not in UNSUPPORTED and f not in own
    )


@dataclass(frozen=True)
class _Tower:
    """How a multimodal family's text tower is run: ``table`` holds its text positions
    (an ``nn.Embedding`` or the family's sinusoidal module), ``call`` is the sub-module run
    on ``(input_ids, attention_mask)``; ``cache``: it takes ``past_key_values``."""

    table: str
    call: str = ""
    model: str = ""  # a class of the family's modeling module; "": AutoModel
    tower: str | None = None
    cache: bool = False
    sub: dict = field(default_factory=dict)
    prefix: str | None = None  # for load_hf_weights, where the model holds other tables
    top: dict = field(default_factory=dict)  # top-level config fields


_TEXT_MODEL = _Tower("text_model.embeddings.position_embeddings", "text_model")
#: SeamlessM4T's own padding_idx 0: its rows start at 1, not at fairseq's 2
_SEAMLESS = _Tower(
    "text_decoder.embed_positions", "text_decoder", cache=True, top={"pad_token_id": 0}
)
#: InstructBLIP's Q-Former reads the instruction; its language model (OPT here) has a table too
_QFORMER = _Tower(
    "qformer.embeddings.position_embeddings", "qformer", tower="qformer_config", prefix="qformer."
)
_HF_TOWERS = {
    "align": _TEXT_MODEL,
    "altclip": _Tower("text_model.roberta.embeddings.position_embeddings", "text_model"),
    "blip": _Tower(
        "text_decoder.bert.embeddings.position_embeddings",
        "text_decoder",
        "ForConditionalGeneration",
        cache=True,
    ),
    "blip_2": _Tower(
        "embeddings.position_embeddings",
        model="TextModelWithProjection",
        tower="qformer_config",
        sub={"qformer_config": {"use_qformer_text_input": True}},
    ),
    "bridgetower": _Tower(
        "text_model.embeddings.position_embeddings",
        "text_model",
        sub={"vision_config": {"hidden_size": 64}},
    ),
    "chinese_clip": _TEXT_MODEL,
    "clap": _TEXT_MODEL,
    "flava": _TEXT_MODEL,
    "git": _Tower("embeddings.position_embeddings", cache=True),
    **dict.fromkeys(("instructblip", "instructblipvideo"), _QFORMER),
    "kosmos2": _Tower(
        "text_model.model.embed_positions",
        "text_model",
        cache=True,
        sub={"text_config": {"attention_heads": 2, "layers": 1, "ffn_dim": 32}},
    ),
    "kosmos2_5": _Tower("text_model.model.embed_positions", "text_model", cache=True),
    "lxmert": _Tower("embeddings.position_embeddings"),
    "perceiver": _Tower(
        "perceiver.input_preprocessor.position_embeddings",
        model="ForMaskedLM",
        tower="text",
        top={"d_latents": 16, "num_latents": 4, "num_self_attends_per_block": 1},
    ),
    #: TVP's video frames read a second table of the same shape (visual_embeddings.)
    "tvp": _Tower("embeddings.position_embeddings", "embeddings", prefix="embeddings."),
    "vilt": _Tower("embeddings.text_embeddings.position_embeddings", "embeddings.text_embeddings"),
    "tipsv2": _Tower("text_model.embeddings.position_embedding", "text_model"),
    "visual_bert": _Tower("embeddings.position_embeddings"),
    **dict.fromkeys(("seamless_m4t", "seamless_m4t_v2"), _SEAMLESS),
    "speecht5": _Tower(
        "speecht5.decoder.prenet.embed_positions",
        "speecht5.decoder",
        "ForSpeechToText",
        tower="text_decoder",
        cache=True,
    ),
}


def test_every_family_is_checked_or_unsupported_with_a_reason():
    found = set(walk.families())
    assert set(UNSUPPORTED) <= found, f"stale entries: {sorted(set(UNSUPPORTED) - found)}"
    checked = {f for group in walk.GROUPS for f in _cases(group)}
    checked |= {*walk.OWN_TESTS, *DISENTANGLED}
    assert checked | set(UNSUPPORTED) == found
    print(f"matched {len(checked)} / {len(found)} families")  # the README's coverage


# ------------------------------------------------------------------------------- ALiBi


def _row_centered(bias: torch.Tensor) -> torch.Tensor:
    return bias - bias[..., :1]


@pytest.mark.parametrize("num_heads", [1, 3, 8, 12, 20])
@pytest.mark.parametrize("family", _cases("alibi"))
def test_alibi_equals_the_family_builder(family, num_heads):
    module = walk.modeling(family)
    mt = walk.model_type_of(family)
    cfg = {"n_head": num_heads, "num_attention_heads": num_heads, "alibi": True}
    enc = build_position_module(mt, cfg)
    assert isinstance(enc, ALiBi)
    length = OFFSET + T
    if family == "mpt":
        theirs = module.build_mpt_alibi_tensor(num_heads, length)[None]  # [1, H, 1, Tk]
        mask = torch.ones(1, length, dtype=torch.long)
    else:
        mask = torch.ones(2, length, dtype=torch.long)
        mask[1, :3] = 0  # left padding: positions count real tokens
        built = module.build_alibi_tensor(mask, num_heads, torch.float32)
        theirs = built.view(2, num_heads, 1, length)
    k_pos = positions_skipping_padding(mask)
    q_pos = k_pos[:, OFFSET:]
    q = torch.zeros(mask.shape[0], num_heads, T, 4)
    ours = enc.score_bias(q, torch.zeros(mask.shape[0], num_heads, length, 4), q_pos, k_pos)
    real = mask.bool()[:, None, None, :]  # [B, 1, 1, Tk]
    first = real.float().argmax(-1, keepdim=True)  # centre each row on its first real key
    ours_c = ours - ours.gather(-1, first.expand(-1, num_heads, T, 1))
    theirs_c = theirs - theirs.gather(-1, first.expand(-1, num_heads, 1, 1))
    step = torch.finfo(torch.bfloat16 if family == "falcon" else torch.float32).eps
    tol = 2 * step * float(enc.slopes().max()) * length
    diff = (ours_c - theirs_c).abs().masked_fill(~real, 0)
    assert float(diff.max()) <= tol
    assert not torch.equal(_row_centered(ours), torch.zeros_like(ours))


# ---------------------------------------------------------------------------------- T5


def _t5_model(family: str):
    mt = walk.model_type_of(family)
    if family == "pix2struct":
        mt = "pix2struct_text_model"
    cfg = walk.tiny_config(mt)
    if family == "longt5":
        cfg.encoder_attention_type = "transient-global"
    if family == "pix2struct":
        cfg.initializer_range = 0.02  # read from the composite config otherwise
        return mt, walk.classes(family, "TextModel")[0](cfg).eval()
    if family == "pop2piano":
        return mt, walk.classes(family, "ForConditionalGeneration")[0](cfg).eval()
    return mt, transformers.AutoModel.from_config(cfg).eval()


@pytest.mark.parametrize("family", _cases("t5"))
def test_t5_bias_equals_every_attention_modules_compute_bias(family):
    torch.manual_seed(0)
    mt, model = _t5_model(family)
    config = model.config.to_dict()
    seen = 0
    for name, module in model.named_modules():
        if not getattr(module, "has_relative_attention_bias", False):
            continue
        block = int(name.split("block.")[1].split(".")[0]) if "block." in name else 0
        decoder = getattr(module, "is_decoder", True)  # Pix2Struct's text model: a decoder
        enc = build_position_module(mt, {**config, "is_decoder": decoder}, layer_idx=block)
        assert isinstance(enc, T5RelativeBias)
        load_hf_weights(enc, model, layer_idx=block)
        torch.testing.assert_close(
            enc.relative_attention_bias.weight,
            module.relative_attention_bias.weight,
            rtol=0,
            atol=0,
        )
        params = inspect.signature(module.compute_bias).parameters
        if "block_length" in params:  # LongT5 local: queries are the middle block of three
            bl = module.block_len
            theirs = module.compute_bias(bl)[0, 0][None]  # [1, H, bl, 3 bl]
            q_pos, k_pos = torch.arange(bl, 2 * bl), torch.arange(3 * bl)
        else:
            theirs = module.compute_bias(T, OFFSET + T, past_seen_tokens=OFFSET)
            q_pos, k_pos = torch.arange(OFFSET, OFFSET + T), torch.arange(OFFSET + T)
        heads = enc.num_heads
        q = torch.zeros(1, heads, q_pos.numel(), 4)
        with torch.no_grad():
            ours = enc.score_bias(q, torch.zeros(1, heads, k_pos.numel(), 4), q_pos, k_pos)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        seen += 1
    assert seen >= 2 if family != "pix2struct" else seen >= 1


# ----------------------------------------------------------------- absolute: module classes

C, ROWS = 16, 64


def _padded(length: int) -> torch.Tensor:
    """``[2, length]`` token ids, the second row left-padded with three ``PAD``s."""
    ids = torch.randint(3, 99, (2, length), generator=torch.Generator().manual_seed(0))
    ids[1, :3] = PAD
    return ids


def _call(module, ids: torch.Tensor, mask: torch.Tensor):
    """The family's position module on the last ``T`` tokens of ``ids`` after a cache of
    ``OFFSET``; returns its output and posenc's positions of those tokens."""
    params = inspect.signature(module.forward).parameters
    new = ids[:, OFFSET:]
    if "attention_mask" in params:  # OPT, BioGPT: positions count real tokens
        out = module(mask.long(), **walk.past(module, OFFSET))
        return out, positions_skipping_padding(mask)[:, OFFSET:]
    if "input_ids_shape" in params:
        out = module(new.shape, **walk.past(module, OFFSET))
    elif "inputs_embeds" in params and "input_ids" not in params:  # MusicGen melody, PEGASUS-X
        out = module(torch.zeros(*new.shape, C), **walk.past(module, OFFSET))
    elif "position_ids" in params and "input_ids" not in params:  # XGLM: the model's ids
        positions = torch.arange(OFFSET, OFFSET + new.shape[1]).expand(2, -1)
        return module(positions, **walk.past(module, OFFSET)), positions
    elif getattr(module, "padding_idx", None) is not None:  # fairseq: counts real tokens
        out = module(new, **walk.past(module, OFFSET))
        return out, positions_skipping_padding(new != PAD, past=OFFSET)
    elif "musicgen" in type(module).__module__:
        out = module(new[:, None], **walk.past(module, OFFSET))  # [B, codebooks, T]
    else:
        out = module(new, **walk.past(module, OFFSET))
    return out, torch.arange(OFFSET, OFFSET + new.shape[1]).expand(2, -1)


def _construct(cls):
    params = inspect.signature(cls.__init__).parameters
    kwargs = {"padding_idx": PAD} if "padding_idx" in params else {}
    module = cls(C) if "embed_dim" in params else cls(ROWS, C, **kwargs)  # PEGASUS-X: width only
    if hasattr(module, "create_weight"):  # Marian, Pegasus: filled by the model's init
        with torch.no_grad():
            module.weight.copy_(module.create_weight())
    if hasattr(module, "make_weight"):  # FSMT: filled by the model's init
        module.make_weight(ROWS, C, PAD)
    return module


CLASS_CASES = [(f, "learned_class") for f in _cases("learned_class")]
CLASS_CASES += [(f, "sinusoidal_class") for f in _cases("sinusoidal_class") if f not in _HF_TOWERS]


@pytest.mark.parametrize(("family", "group"), CLASS_CASES, ids=["-".join(c) for c in CLASS_CASES])
def test_position_module_classes_equal_posenc(family, group):
    torch.manual_seed(0)
    mt = _text_model_type(family)
    learned = group == "learned_class"
    suffix = "LearnedPositionalEmbedding" if learned else "SinusoidalPositionalEmbedding"
    theirs_module = _construct(walk.classes(family, suffix)[0])
    cfg = {"d_model": C, "max_position_embeddings": ROWS, "pad_token_id": PAD}
    enc = build_position_module(mt, {**cfg, "use_learned_position_embeddings": learned})
    load_hf_weights(enc, theirs_module)
    ids = _padded(OFFSET + T)
    mask = ids != PAD
    with torch.no_grad():
        theirs, positions = _call(theirs_module, ids, mask)
        ours = enc.encoding(positions.to(torch.int64))
    theirs = theirs.expand_as(ours)
    real = (
        positions > 0 if positions.shape[0] == 2 else torch.ones_like(positions, dtype=torch.bool)
    )
    real = real | (positions == torch.arange(positions.shape[1]) + OFFSET)
    if isinstance(enc, SinusoidalLayout):  # their angles are float32: |a| * eps apart
        tol = 4 * EPS32 * (OFFSET + T + enc.offset)
        torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=tol)
    else:
        assert isinstance(enc, LearnedPositionalEncoding)
        torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=0)


# ------------------------------------------------------------------ absolute: whole models


_NO_LAYOUT_BIASES = {"has_relative_attention_bias": False, "has_spatial_attention_bias": False}
TINY_OVERRIDES = {
    "gpt_neo": {"attention_types": [[["global"], 1]]},
    "layoutlmv3": {"coordinate_size": 3, "shape_size": 2, **_NO_LAYOUT_BIASES},  # 4*3+2*2 = C
    "lilt": {"hidden_size": 24},  # its box features are C/6 wide
    "bros": {"hidden_size": 64},  # its box sinusoids are C/32 wide per coordinate
    "tapas": {"reset_position_index_per_cell": False},  # on: test_interop_text_families.py
}
_BOXES = torch.tensor([1, 2, 5, 7]).expand(2, T, 4)  # [B, T, 4], boxes in 0..1000 units
EXTRA_INPUTS = {
    "bros": {"bbox": _BOXES / 10},
    "lilt": {"bbox": _BOXES},
    "layoutlmv3": {"bbox": _BOXES},
}


def _table(model, width: int) -> torch.nn.Embedding:
    names = ("position_embeddings", "wpe", "embed_positions")
    found = [
        m
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Embedding)
        and n.rsplit(".", 1)[-1] in names
        and m.embedding_dim == width
        and not n.startswith("entity_")  # LUKE's entity positions
    ]
    assert len(found) == 1, f"{len(found)} position tables of width {width}"
    return found[0]


@pytest.mark.parametrize("family", [f for f in _cases("table") if f not in _HF_TOWERS])
def test_family_models_read_their_table_at_posencs_positions(family):
    torch.manual_seed(0)
    mt = _text_model_type(family)
    assert mt in ABSOLUTE_FAMILIES, f"{family}: add {mt!r} to ABSOLUTE_FAMILIES or UNSUPPORTED"
    spec = ABSOLUTE_FAMILIES[mt]
    cfg = walk.tiny_config(mt, **TINY_OVERRIDES.get(family, {}))
    model = transformers.AutoModel.from_config(cfg).eval()
    enc = build_position_module(mt, cfg.to_dict())
    assert isinstance(enc, LearnedPositionalEncoding)
    load_hf_weights(enc, model, prefix="embeddings." if family == "luke" else None)
    table = _table(model, enc.d_model)
    if hasattr(model, "set_default_language"):  # X-MOD's adapters
        model.set_default_language(cfg.languages[0])
    rows = []
    hook = table.register_forward_pre_hook(lambda _, args: rows.append(args[0]))
    ids = _padded(T)
    mask = ids != PAD
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask.long(), **EXTRA_INPUTS.get(family, {}))
    hook.remove()
    positions = (
        positions_skipping_padding(mask) if spec.skips_padding else torch.arange(T).expand(2, -1)
    )
    read = rows[0][..., :T].expand(2, -1)  # Longformer pads to its attention window
    offset = table.num_embeddings - enc.max_len
    torch.testing.assert_close(read[mask], positions[mask] + offset, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(enc.encoding(positions)[mask], table(read)[mask], rtol=0, atol=0)


# --------------------------------------------------------- absolute: multimodal text towers


def _tower_model(family: str, spec: _Tower):
    mt = walk.model_type_of(family)
    cfg = walk.tiny_composite_config(mt, spec.sub, **spec.top)
    if spec.model:
        (cls,) = walk.classes(family, spec.model)
        return cfg, cls(cfg).eval()
    return cfg, transformers.AutoModel.from_config(cfg).eval()


def _tower_inputs(module, cfg, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """The arguments of the family's text tower beyond ids and mask (stand-in image or
    speech features: they never reach the text positions)."""
    params = inspect.signature(module.forward).parameters
    name = "input_ids" if "input_ids" in params else "input_values"  # SpeechT5's decoder
    kwargs = {name: ids}
    if "attention_mask" in params:  # ViLT's text embeddings take none
        kwargs["attention_mask"] = mask.long()
    g = torch.Generator().manual_seed(1)
    if "visual_feats" in params:  # LXMERT
        kwargs["visual_feats"] = torch.randn(2, 3, cfg.visual_feat_dim, generator=g)
        kwargs["visual_pos"] = torch.rand(2, 3, cfg.visual_pos_dim, generator=g)
    if "query_embeds" in params:  # InstructBLIP's Q-Former: learned queries before the text
        width = cfg.qformer_config.hidden_size
        kwargs["query_embeds"] = torch.randn(2, 2, width, generator=g)
        kwargs["attention_mask"] = torch.cat([torch.ones(2, 2, dtype=torch.long), mask.long()], 1)
        width = cfg.qformer_config.encoder_hidden_size
        kwargs["encoder_hidden_states"] = torch.randn(2, 3, width, generator=g)
    elif "encoder_hidden_states" in params and "decoder" in type(module).__name__.lower():
        kwargs["encoder_hidden_states"] = torch.randn(2, 3, C, generator=g)
    return kwargs


def _positions_read(spec: _Tower, model, cfg, ids, mask, past: int):
    """Run the tower on ``ids[:, past:]`` after a cache of ``ids[:, :past]``; returns what its
    position module gave (the rows read, or the sinusoidal output) and that module."""
    module = model.get_submodule(spec.call) if spec.call else model
    table = model.get_submodule(spec.table)
    seen = []
    if isinstance(table, torch.nn.Embedding):
        hook = table.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    else:
        # a copy: Kosmos-2.5 adds its segment embedding in place
        hook = table.register_forward_hook(lambda _m, _a, out: seen.append(out.clone()))
    kwargs = {}
    with torch.no_grad():
        if past:
            first = _tower_inputs(module, cfg, ids[:, :past], mask[:, :past])
            kwargs["past_key_values"] = module(**first, use_cache=True).past_key_values
            seen.clear()
        now = _tower_inputs(module, cfg, ids[:, past:], mask[:, past:])
        if past and "attention_mask" in now:
            now["attention_mask"] = mask.long()
        module(**now, **kwargs)
    hook.remove()
    return seen[0], table


TOWER_CASES = [
    (f, past) for f in sorted(_HF_TOWERS) for past in (0, OFFSET) if not past or _HF_TOWERS[f].cache
]


@pytest.mark.parametrize(("family", "past"), TOWER_CASES, ids=[f"{f}-{p}" for f, p in TOWER_CASES])
def test_multimodal_text_towers_read_posencs_positions(family, past):
    torch.manual_seed(0)
    spec = _HF_TOWERS[family]
    cfg, model = _tower_model(family, spec)
    mt = walk.model_type_of(family)
    enc = build_position_module(mt, cfg.to_dict(), tower=spec.tower)
    assert enc is not None
    load_hf_weights(enc, model, prefix=spec.prefix)
    tower_type, tower_cfg = text_tower(mt, cfg.to_dict(), spec.tower)
    ids = _padded(past + T)
    pad = tower_cfg.get("pad_token_id")
    ids[1, :3] = pad = PAD if pad is None else pad  # Perceiver's config has none
    mask = ids != pad
    read, table = _positions_read(spec, model, cfg, ids, mask, past)
    if ABSOLUTE_FAMILIES[tower_type].skips_padding:  # from the cache's length, pads included
        positions = positions_skipping_padding(mask[:, past:], past=past)
    else:
        positions = torch.arange(past, past + T).expand(2, -1)
    real = mask[:, past:]
    with torch.no_grad():
        ours = enc.encoding(positions)
    if isinstance(enc, SinusoidalLayout):  # their angles are float32: |a| * eps apart
        tol = 4 * EPS32 * (past + T + enc.offset)
        read = read.expand_as(ours)  # TIPSv2: one row of positions for the batch
        torch.testing.assert_close(ours[real], read[real], rtol=0, atol=tol)
        return
    assert isinstance(enc, LearnedPositionalEncoding)
    read = read[..., -T:].expand(2, -1)
    offset = table.num_embeddings - enc.max_len
    torch.testing.assert_close(read[real], positions[real] + offset, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(ours[real], table(read)[real], rtol=0, atol=0)


# ------------------------------------------------------- DeBERTa: disentangled attention


@pytest.mark.parametrize("family", DISENTANGLED)
def test_deberta_attention_and_table_equal_the_familys_own(family):
    """The absolute table and every layer's ``DisentangledSelfAttention`` of a tiny random
    model (c2p and p2c; DeBERTa-v2 with log buckets, shared keys and the table's LayerNorm)
    against posenc's ``Compose`` from ``build_position_module``, loaded per layer by one
    ``load_hf_weights`` call; probabilities and context at positions ``0..T-1`` and at an
    offset (more in ``test_disentangled.py``)."""
    from _deberta import compare_with_transformers

    fields = {"relative_attention": True, "pos_att_type": "c2p|p2c", "max_relative_positions": 20}
    if family == "deberta_v2":
        fields |= {"position_buckets": 8, "share_att_key": True, "norm_rel_ebd": "layer_norm"}
    mt = walk.model_type_of(family)
    assert compare_with_transformers(mt, offsets=(0, OFFSET), **fields) == 2
