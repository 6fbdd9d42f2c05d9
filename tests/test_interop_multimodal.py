"""Multimodal configs: posenc finds the text tower's config, and refuses what is not text.

The positions themselves are checked against each family's own model in
``test_interop_positions.py`` (``test_multimodal_text_towers_read_posencs_positions``);
here: the routing from a composite config (a ``PretrainedConfig`` or its ``config.json``
dict) to that tower, and the refusals.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import _hf_position_walk as walk  # noqa: E402
import posenc  # noqa: E402
from posenc import LearnedPositionalEncoding, from_hf_config  # noqa: E402
from posenc.encodings.sinusoidal_layouts import SinusoidalLayout  # noqa: E402
from posenc.hf import build_position_module, layer_plan, load_hf_weights  # noqa: E402
from posenc.hf.composite import TEXT_TOWERS  # noqa: E402

#: composite -> the sub-config its one text tower is built from (None: the config itself)
SINGLE = {
    "align": "text_config",
    "altclip": "text_config",
    "blip": "text_config",
    "bridgetower": "text_config",
    "chinese_clip": "text_config",
    "clap": "text_config",
    "flava": "text_config",
    "kosmos-2": "text_config",
    "kosmos-2.5": "text_config",
    "tipsv2": "text_config",
    "pp_formulanet": "text_config",
    "git": None,
    "lxmert": None,
    "visual_bert": None,
    "vilt": None,
    "tvp": None,
    "seamless_m4t": None,
    "seamless_m4t_v2": None,
}


def _same(a, b) -> bool:
    """Same class and settings (and the same table size for learned ones)."""
    if type(a) is not type(b) or a.extra_repr() != b.extra_repr():
        return False
    return not isinstance(a, LearnedPositionalEncoding) or a.weight.shape == b.weight.shape


def test_every_composite_is_listed_here_or_needs_a_tower():
    towered = {"blip-2", "instructblip", "instructblipvideo", "speecht5", "perceiver"}
    assert set(SINGLE) | towered == set(TEXT_TOWERS)


@pytest.mark.parametrize("model_type", sorted(SINGLE))
def test_composite_configs_give_their_text_towers_table(model_type):
    config = transformers.CONFIG_MAPPING[model_type]()
    as_json = json.loads(config.to_json_string())
    key = SINGLE[model_type]
    tower = as_json[key] if key else as_json
    expected = build_position_module(tower["model_type"], tower)
    assert isinstance(expected, (LearnedPositionalEncoding, SinusoidalLayout))
    assert _same(build_position_module(model_type, as_json), expected)
    for source in (config, as_json):
        assert _same(from_hf_config(source), expected)
    if key:  # the sub-config alone, as a user may pass it
        assert _same(from_hf_config(getattr(config, key)), expected)


@pytest.mark.parametrize("model_type", ["blip-2", "instructblip", "instructblipvideo"])
def test_qformer_families_need_a_tower_and_route_each(model_type):
    cfg = walk.tiny_composite_config(model_type).to_dict()
    with pytest.raises(ValueError, match="qformer_config, text_config"):
        build_position_module(model_type, cfg)
    with pytest.raises(ValueError, match="tower="):
        from_hf_config(cfg)
    qformer = build_position_module(model_type, cfg, tower="qformer_config")
    assert _same(qformer, from_hf_config(cfg["qformer_config"]))
    assert _same(qformer, from_hf_config(cfg, tower="qformer_config"))
    assert qformer.max_len == cfg["qformer_config"]["max_position_embeddings"]
    language = build_position_module(model_type, cfg, tower="text_config")  # a tiny OPT
    assert _same(language, build_position_module("opt", cfg["text_config"]))
    assert _same(language, from_hf_config(cfg, tower="text_config"))


def test_a_rotary_language_model_tower_reads_as_its_own_family():
    """InstructBLIP-Vicuna: ``tower="text_config"`` gives the Llama RoPE of its language
    model, as ``from_hf_config(config.text_config)`` does."""
    llama = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}
    cfg = transformers.InstructBlipConfig(text_config=llama, qformer_config={}).to_dict()
    assert build_position_module("instructblip", cfg, tower="text_config") is None
    ours = from_hf_config(cfg, tower="text_config")
    theirs = from_hf_config(cfg["text_config"])
    assert isinstance(ours, posenc.RotaryEmbedding) and ours.extra_repr() == theirs.extra_repr()
    torch.testing.assert_close(ours.inv_freq, theirs.inv_freq, rtol=0, atol=0)


def test_speecht5_builds_the_text_decoder_and_refuses_the_text_encoder():
    cfg = transformers.SpeechT5Config(pad_token_id=3).to_dict()
    with pytest.raises(ValueError, match="text_decoder, text_encoder"):
        from_hf_config(cfg)
    decoder = build_position_module("speecht5", cfg, tower="text_decoder")
    assert isinstance(decoder, SinusoidalLayout) and decoder.offset == 4  # padding_idx + 1
    with pytest.raises(ValueError, match="learned alpha plus relative"):
        build_position_module("speecht5", cfg, tower="text_encoder")


def test_perceiver_needs_tower_text_its_config_serves_every_input():
    cfg = transformers.PerceiverConfig(d_model=32, max_position_embeddings=100).to_dict()
    with pytest.raises(ValueError, match="audio, image, multimodal"):
        from_hf_config(cfg)
    with pytest.raises(ValueError, match="image preprocessor, not text"):
        build_position_module("perceiver", cfg, tower="image")
    text = build_position_module("perceiver", cfg, tower="text")
    assert isinstance(text, LearnedPositionalEncoding)
    assert (text.d_model, text.max_len) == (32, 100)


@pytest.mark.parametrize(
    ("model_type", "tower", "match"),
    [
        ("blip-2", "vision_config", "has no text tower"),
        ("clap", "audio_config", "has no text tower"),
        ("seamless_m4t", "t2u_decoder", "has no text tower"),
        ("git", "vision_config", "has no text tower"),
        ("bert", "text_config", "multimodal families"),
    ],
)
def test_towers_that_are_not_text_are_refused(model_type, tower, match):
    cfg = transformers.CONFIG_MAPPING[model_type]().to_dict()
    with pytest.raises(ValueError, match=match):
        build_position_module(model_type, cfg, tower=tower)


def test_a_composite_without_its_text_config_reads_as_transformers_does(monkeypatch):
    """transformers' AlignConfig gives a config.json without text_config its default text
    model, and so does posenc; read as written (no config class), it is refused."""
    raw = {"model_type": "align", "vision_config": {}}
    ours, theirs = from_hf_config(raw), from_hf_config(transformers.AlignConfig())
    assert type(ours) is type(theirs) and repr(ours) == repr(theirs)  # a learned table
    monkeypatch.setattr(posenc.hf.normalize, "config_class", lambda model_type: None)
    with pytest.raises(ValueError, match="no text_config"):
        from_hf_config(raw)
    with pytest.raises(ValueError, match="no qformer_config"):
        build_position_module("blip-2", {"model_type": "blip-2"}, tower="qformer_config")


def test_composites_have_one_module_not_a_layer_plan():
    with pytest.raises(ValueError, match="one position module"):
        layer_plan(transformers.AlignConfig())


def test_load_hf_weights_refuses_two_text_tables_and_takes_a_prefix():
    torch.manual_seed(0)
    cfg = walk.tiny_composite_config("instructblip")
    model = transformers.InstructBlipModel(cfg).eval()
    enc = build_position_module("instructblip", cfg.to_dict(), tower="qformer_config")
    with pytest.raises(ValueError, match=r"qformer\.embeddings.*language_model"):
        load_hf_weights(enc, model)  # the Q-Former's and the language model's tables
    load_hf_weights(enc, model, prefix="qformer.")
    table = model.qformer.embeddings.position_embeddings.weight
    torch.testing.assert_close(enc.weight, table, rtol=0, atol=0)


def test_git_positions_after_a_cache_count_its_image_tokens():
    """GIT reads row ``past_key_values_length + i``; after a prefill with an image the
    cache holds the image tokens too, so decoding continues after them (what the
    docstring of ``posenc.hf.absolute`` tells users to pass)."""
    torch.manual_seed(0)
    sub = {"vision_config": {"image_size": 32, "patch_size": 16}}  # 4 patches + CLS
    cfg = walk.tiny_composite_config("git", sub)
    model = transformers.GitModel(cfg).eval()
    enc = load_hf_weights(from_hf_config(cfg), model)
    table = model.embeddings.position_embeddings
    rows = []
    hook = table.register_forward_pre_hook(lambda _, args: rows.append(args[0]))
    ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids[:, :4], pixel_values=torch.randn(1, 3, 32, 32), use_cache=True)
        past = out.past_key_values.get_seq_length()
        model(input_ids=ids[:, 4:], past_key_values=out.past_key_values)
    hook.remove()
    assert past == 4 + 5
    torch.testing.assert_close(rows[0], torch.arange(4)[None], rtol=0, atol=0)
    positions = past + torch.arange(3)[None]
    torch.testing.assert_close(rows[1], positions, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(enc.encoding(positions), table(rows[1]), rtol=0, atol=0)


def test_list_models_names_the_multimodal_families_and_their_towers(capsys):
    from posenc.cli import main

    assert main(["list", "--models"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "text tower: qformer_config" in rows["blip-2"]
    assert "absolute learned" in rows["blip_2_qformer"]


@pytest.mark.parametrize(
    ("model_type", "key"),
    [
        ("align", "vision_config"),
        ("blip-2", "vision_config"),
        ("clap", "audio_config"),
        ("flava", "image_config"),
        ("git", "vision_config"),
        ("kosmos-2", "vision_config"),
    ],
)
def test_image_and_audio_sub_configs_passed_alone_are_refused(model_type, key):
    sub = getattr(transformers.CONFIG_MAPPING[model_type](), key)
    with pytest.raises(ValueError, match=f"unknown model_type '{sub.model_type}'"):
        from_hf_config(sub)
