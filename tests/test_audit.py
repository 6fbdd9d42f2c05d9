"""posenc.audit: the per-layer reading, llama.cpp's rules, the comparer, and 25 released
configs written to GGUF as llama.cpp's converter writes them (all runtimes agree)."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from hypothesis import given, settings
from hypothesis import strategies as st

from _gguf_writer import write_gguf
from _released_configs import RELEASED
from posenc.audit.checkpoint import audit_positions
from posenc.audit.compare import RTOL, compare
from posenc.audit.convert import converter_fields, gguf_diff
from posenc.audit.ggufread import gguf_rope, read_gguf
from posenc.audit.hfread import read_posenc, read_transformers
from posenc.audit.llamacpp import LlamaCppRope, layer_positions, rope_layout
from posenc.audit.reading import LayerPositions, Reading, no_rotation


def _layer(thetas, scale=1.0, pairs="half", positions=(0, 1, 5, 9)) -> LayerPositions:
    pos = np.asarray(positions, dtype=np.float64)
    thetas = np.asarray(thetas, dtype=np.float64)
    return LayerPositions(
        rotates=True,
        head_dim=2 * len(thetas),
        rotary_dim=2 * len(thetas),
        pairs=pairs,
        angles=pos[:, None] * thetas[None, :],
        scale=np.full(len(pos), scale),
    )


def _reading(name, *layers, positions=(0, 1, 5, 9), **fields) -> Reading:
    return Reading(name, np.asarray(positions), 10, layers, fields)


# ---------------------------------------------------------------- the reading


def test_reading_round_trips_through_json():
    import json

    r = _reading("x", _layer([1.0, 0.25], 1.5), no_rotation(4, 4, sliding_window=8), a=[1, 2])
    back = Reading.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.runtime == "x" and back.fields == {"a": [1, 2]}
    np.testing.assert_array_equal(back.layers[0].angles, r.layers[0].angles)
    assert back.layers[1].angles.shape == (4, 0) and back.layers[1].sliding_window == 8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pairs": "interleaved"}, "pairs must be one of"),
        ({"rotary_dim": 3}, "rotary_dim must be even"),
        ({"rotary_dim": 6}, "rotary_dim must be even"),
        ({"rotates": False}, "disagrees with pairs"),
        ({"angles": np.zeros((4, 1))}, "angles must be"),
        ({"scale": np.ones(3)}, "scale must be"),
    ],
)
def test_layer_positions_refuses_inconsistent_fields(kwargs, match):
    fields = {
        "rotates": True,
        "head_dim": 4,
        "rotary_dim": 4,
        "pairs": "half",
        "angles": np.zeros((4, 2)),
        "scale": np.ones(4),
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        LayerPositions(**fields)


def test_reading_without_layers_must_say_why():
    with pytest.raises(ValueError, match="must say why"):
        Reading("x", np.arange(3), 3)
    assert not Reading("x", np.arange(3), 3, note="not installed").ran


# ---------------------------------------------------------------- llama.cpp's rules


def test_rope_layout_by_architecture():
    assert rope_layout("llama") == "norm" and rope_layout("qwen2") == "neox"
    assert rope_layout("qwen2vl") == "mrope" and rope_layout("bloom") == "none"
    with pytest.raises(ValueError, match="'not-an-arch'"):
        rope_layout("not-an-arch")


def _transformers_yarn(base, dim, factor, orig, fast, slow):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=dim * 2,
        num_attention_heads=2,
        max_position_embeddings=int(orig * factor),
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": base,
            "factor": factor,
            "original_max_position_embeddings": orig,
            "beta_fast": fast,
            "beta_slow": slow,
        },
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS["yarn"](config, None)
    return inv_freq.double().numpy(), scale


@settings(max_examples=25, deadline=None)
@given(
    base=st.sampled_from([1e4, 1e5, 5e5, 1e6]),
    dim=st.sampled_from([32, 64, 128]),
    factor=st.floats(1.5, 40.0),
    orig=st.sampled_from([2048, 4096, 32768]),
    betas=st.sampled_from([(32.0, 1.0), (16.0, 2.0), (64.0, 1.0)]),
)
def test_llamacpp_yarn_equals_transformers_yarn(base, dim, factor, orig, betas):
    """ggml's rope_yarn with llama-context's defaults (ext_factor 1, the attention factor
    cancelled and restored) is YaRN as transformers computes it (Peng et al., 2023)."""
    rope = LlamaCppRope(
        architecture="qwen2",
        n_layer=1,
        head_dim=dim,
        n_rot=dim,
        freq_base=base,
        scaling_type="yarn",
        factor=factor,
        n_ctx_orig=orig,
        beta_fast=betas[0],
        beta_slow=betas[1],
    )
    layer = layer_positions(rope, 0, [0, 1], context=orig)
    inv_freq, scale = _transformers_yarn(base, dim, factor, orig, *betas)
    # transformers computes inv_freq in float32 (a power, a division, the ramp's mix): within
    # 8 float32 epsilons, the comparer's RTOL
    np.testing.assert_allclose(layer.angles[1], inv_freq, rtol=RTOL)
    assert math.isclose(layer.scale[0], scale, rel_tol=1e-12)


def test_llamacpp_linear_and_factors_from_the_formula():
    """Without YaRN's ramp: theta_j = freq_scale base^(-2j/R) / ff_j, cos/sin times attn_factor."""
    ff = np.array([1.0, 2.0, 4.0, 8.0])
    rope = LlamaCppRope(
        architecture="llama",
        n_layer=1,
        head_dim=8,
        n_rot=8,
        freq_base=100.0,
        factor=4.0,
        attn_factor=1.25,
        freq_factors=ff,
    )
    layer = layer_positions(rope, 0, [3], context=10)
    want = 3 * 0.25 * 100.0 ** (-np.arange(4) / 4) / ff
    np.testing.assert_allclose(layer.angles[0], want, rtol=1e-15)
    assert layer.scale[0] == 1.25 and layer.pairs == "adjacent"
    none = LlamaCppRope(**{**rope.__dict__, "scaling_type": "none"})
    np.testing.assert_allclose(layer_positions(none, 0, [3], 10).angles[0], want * 4, rtol=1e-15)


def test_longrope_factors_by_context():
    """get_rope_factors: long factors when the context exceeds the original length."""
    base = {"architecture": "phi3", "n_layer": 1, "head_dim": 4, "n_rot": 4, "freq_base": 1e4}
    rope = LlamaCppRope(
        **base, n_ctx_orig=100, factors_long=np.array([2.0, 3.0]), factors_short=np.ones(2)
    )
    short = layer_positions(rope, 0, [1], context=100).angles[0]
    long = layer_positions(rope, 0, [1], context=101).angles[0]
    np.testing.assert_allclose(short / long, [2.0, 3.0], rtol=1e-15)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scaling_type": "dynamic"}, "rope.scaling.type 'dynamic'"),
        ({"n_rot": 5}, "rope.dimension_count 5"),
        ({"freq_base": 0.0}, "rope.freq_base must be > 0"),
    ],
)
def test_llamacpp_refuses_what_llamacpp_refuses(kwargs, match):
    base = {"architecture": "llama", "n_layer": 1, "head_dim": 8, "n_rot": 8, "freq_base": 1e4}
    with pytest.raises(ValueError, match=match):
        LlamaCppRope(**{**base, **kwargs})


# ---------------------------------------------------------------- the comparer


def test_score_change_is_the_documented_bound():
    """frequencies: max over offsets and pairs of |cos(m t1) - cos(m t2)|; factor: |s1^2 - s2^2|."""
    a = _reading("a", _layer([1.0, 0.5], 1.0))
    b = _reading("b", _layer([1.0, 0.25], 1.1))
    rows = {r.field: r for r in compare([a, b], [6, 10]).rows}
    m = np.array([0.0, 1.0, 5.0, 9.0])
    for n in (6, 10):
        keep = m < n
        want = np.max(np.abs(np.cos(m[keep] * 0.5) - np.cos(m[keep] * 0.25)))
        assert math.isclose(rows["frequencies"].score_change[n], want, rel_tol=1e-12)
        assert math.isclose(rows["cos/sin factor"].score_change[n], 0.21, rel_tol=1e-12)
    assert rows["frequencies"].agree is False and rows["rotates"].agree is True
    assert rows["frequencies"].layers == "0"


def test_frequencies_agree_within_float32_rounding_only():
    a = _reading("a", _layer([1.0, 0.5]))
    assert compare([a, _reading("b", _layer([1.0, 0.5 * (1 + RTOL / 2)]))], [10]).agree
    assert not compare([a, _reading("b", _layer([1.0, 0.5 * (1 + 4 * RTOL)]))], [10]).agree


def test_half_and_adjacent_pairs_agree_only_for_a_permuting_gguf():
    half = _reading("hf", _layer([1.0]))
    adjacent = _layer([1.0], pairs="adjacent")
    assert compare([half, _reading("g", adjacent, **{"general.architecture": "llama"})], [9]).agree
    assert not compare(
        [half, _reading("g", adjacent, **{"general.architecture": "qwen2"})], [9]
    ).agree


def test_compare_shows_a_runtime_that_did_not_run_without_counting_it():
    a = _reading("a", _layer([1.0]))
    gone = Reading("vllm", np.asarray([0, 1, 5, 9]), 10, note="not installed")
    result = compare([a, gone, _reading("b", _layer([1.0]))], [10])
    assert result.agree and all(r.values["vllm"] == "not run" for r in result.rows)


def test_compare_refuses_readings_at_other_positions():
    a = _reading("a", _layer([1.0]))
    b = _reading("b", _layer([1.0], positions=(0, 1, 5, 8)), positions=(0, 1, 5, 8))
    with pytest.raises(ValueError, match="other positions"):
        compare([a, b], [10])
    with pytest.raises(ValueError, match="at least one length"):
        compare([a], [])


def test_audit_positions_cover_every_short_offset_and_the_longest():
    pos = audit_positions(10_000)
    assert pos[:64].tolist() == list(range(64)) and pos[-1] == 9_999
    assert np.all(np.diff(pos) > 0)


# ---------------------------------------------------------------- released configs


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_released_config_agrees_in_every_runtime(name, tmp_path):
    """transformers' rotary module, posenc's plan and llama.cpp on the GGUF the converter
    writes give every layer the same positions; the GGUF holds the converter's fields."""
    config = RELEASED[name]
    path = write_gguf(tmp_path / "m.gguf", config)
    trained = config["max_position_embeddings"]
    positions = audit_positions(2 * trained)
    readings = [
        read_transformers(config, positions, context=2 * trained),
        read_posenc(config, positions, context=2 * trained),
        read_gguf(path, positions, context=2 * trained),
    ]
    result = compare(readings, [trained, 2 * trained])
    assert result.agree, [(r.field, r.values, r.layers) for r in result.rows if not r.agree]
    assert len(readings[2].layers) == config["num_hidden_layers"]
    assert gguf_diff(config, gguf_rope(path)[1]) == []


def test_converter_fields_refuse_an_unknown_family():
    with pytest.raises(ValueError, match="model_type 'bert'"):
        converter_fields({"model_type": "bert"})


# ---------------------------------------------------------------- ALiBi and sliding windows


def _raw_gguf(path, arch, **kv):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        name = f"{arch}.{key.replace('__', '.')}"
        if isinstance(value, list):
            writer.add_array(name, value)
        elif isinstance(value, float):
            writer.add_float32(name, value)
        else:
            writer.add_uint32(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


BLOOM = {  # bigscience/bloom-560m's position fields
    "model_type": "bloom",
    "hidden_size": 1024,
    "n_head": 16,
    "n_layer": 24,
}


@pytest.mark.parametrize(("max_bias", "agree"), [(8.0, True), (16.0, False)])
def test_alibi_model_reads_alike_and_a_wrong_max_bias_differs(tmp_path, max_bias, agree):
    sizes = {"block_count": 24, "embedding_length": 1024, "attention__head_count": 16}
    path = _raw_gguf(tmp_path / "b.gguf", "bloom", **sizes, attention__max_alibi_bias=max_bias)
    pos = audit_positions(2048)
    readings = [
        read_transformers(BLOOM, pos, context=2048),
        read_posenc(BLOOM, pos, context=2048),
        read_gguf(path, pos, context=2048),
    ]
    rows = {r.field: r for r in compare(readings, [2048]).rows}
    assert not any(layer.rotates for r in readings for layer in r.layers)
    assert rows["alibi_max_bias"].agree is agree and rows["rotates"].agree
    assert all(r.agree for name, r in rows.items() if name != "alibi_max_bias")


def test_sliding_window_layers_take_the_swa_base(tmp_path):
    sizes = {"block_count": 2, "embedding_length": 64, "attention__head_count": 4}
    path = _raw_gguf(
        tmp_path / "s.gguf",
        "qwen2",
        **sizes,
        rope__freq_base=1e6,
        rope__freq_base_swa=1e4,
        attention__sliding_window=512,
        attention__sliding_window_pattern=[True, False],
    )
    reading = read_gguf(path, [0, 1], context=10)
    swa, full = reading.layers
    assert (swa.sliding_window, full.sliding_window) == (512, None) and reading.note is None
    np.testing.assert_allclose(swa.angles[1], 1e4 ** (-np.arange(8) / 8), rtol=1e-15)
    np.testing.assert_allclose(full.angles[1], 1e6 ** (-np.arange(8) / 8), rtol=1e-15)
    period = _raw_gguf(
        tmp_path / "p.gguf",
        "qwen2",
        **{**sizes, "block_count": 4},
        attention__sliding_window=8,
        attention__sliding_window_pattern=2,
    )
    windows = [x.sliding_window for x in read_gguf(period, [0], context=1).layers]
    assert windows == [8, None, 8, None]  # layer i slides when i % 2 < 1


def test_a_window_without_its_pattern_is_read_as_full_with_a_note(tmp_path):
    sizes = {"block_count": 2, "embedding_length": 64, "attention__head_count": 4}
    path = _raw_gguf(tmp_path / "g.gguf", "qwen2", **sizes, attention__sliding_window=512)
    reading = read_gguf(path, [0, 1], context=10)
    assert "sliding_window_pattern" in reading.note
    assert all(layer.sliding_window is None for layer in reading.layers)


# ---------------------------------------------------------------- LongRoPE (Phi-3)

_RNG = np.random.default_rng(0)
PHI3_LONGROPE = {  # Phi-3-mini-128k's shape and lengths; the 48 factors are made up here
    "model_type": "phi3",
    "hidden_size": 3072,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 4,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "type": "longrope",
        "long_factor": (1 + np.sort(_RNG.uniform(0, 30, 48))).round(4).tolist(),
        "short_factor": (1 + np.sort(_RNG.uniform(0, 1, 48))).round(4).tolist(),
    },
}


@pytest.mark.parametrize("context", [4096, 131072])
def test_longrope_gguf_agrees_on_both_sides_of_the_original_length(context, tmp_path):
    """Phi3MiniModel's factor tensors and attention factor, read by llama.cpp's
    get_rope_factors, equal transformers' LongRoPE with the short and the long factors."""
    path = write_gguf(tmp_path / "phi3.gguf", PHI3_LONGROPE)
    pos = audit_positions(context)
    readings = [
        read_transformers(PHI3_LONGROPE, pos, context=context),
        read_posenc(PHI3_LONGROPE, pos, context=context),
        read_gguf(path, pos, context=context),
    ]
    assert compare(readings, [context]).agree
    assert gguf_diff(PHI3_LONGROPE, gguf_rope(path)[1]) == []


def test_longrope_factors_swapped_differ_past_the_original_length(tmp_path):
    def swap(arch, kv, tensors):
        long, short = tensors["rope_factors_long.weight"], tensors["rope_factors_short.weight"]
        tensors["rope_factors_long.weight"], tensors["rope_factors_short.weight"] = short, long

    path = write_gguf(tmp_path / "phi3.gguf", PHI3_LONGROPE, edit=swap)
    pos = audit_positions(131072)
    readings = [
        read_transformers(PHI3_LONGROPE, pos, context=131072),
        read_gguf(path, pos, context=131072),
    ]
    rows = {r.field: r for r in compare(readings, [131072]).rows}
    assert rows["frequencies"].agree is False and rows["cos/sin factor"].agree
    names = {k for k, _, _ in gguf_diff(PHI3_LONGROPE, gguf_rope(path)[1])}
    assert names == {"rope_factors_long.weight", "rope_factors_short.weight"}


GEMMA3_4B = {  # google/gemma-3-4b-it's text position fields (v4 form), 12 of its 34 layers
    "model_type": "gemma3_text",
    "num_hidden_layers": 12,
    "sliding_window_pattern": 6,
    "sliding_window": 1024,
    "head_dim": 256,
    "hidden_size": 2560,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
}


@pytest.mark.parametrize("freq_base_swa", [None, 5e4])
def test_gemma3_sliding_layers_as_llamacpp_fixes_them(tmp_path, freq_base_swa):
    """llama.cpp's Gemma 3 loader: every 6th layer full with the file's base and scaling,
    the others base 10000 unscaled, whatever rope.freq_base_swa says; transformers agrees."""
    keys = {
        "block_count": 12,
        "embedding_length": 2560,
        "attention__head_count": 8,
        "attention__key_length": 256,
        "attention__sliding_window": 1024,
        "rope__freq_base": 1e6,
        "rope__scaling__factor": 8.0,
    }
    if freq_base_swa is not None:
        keys["rope__freq_base_swa"] = freq_base_swa
    path = _raw_gguf(tmp_path / "g3.gguf", "gemma3", **keys)
    pos = audit_positions(2048)
    readings = [
        read_transformers(GEMMA3_4B, pos, context=2048),
        read_posenc(GEMMA3_4B, pos, context=2048),
        read_gguf(path, pos, context=2048),
    ]
    result = compare(readings, [2048])
    assert result.agree, [(r.field, r.values, r.layers) for r in result.rows if not r.agree]
    windows = [layer.sliding_window for layer in readings[2].layers]
    assert windows == [1024] * 5 + [None] + [1024] * 5 + [None]
