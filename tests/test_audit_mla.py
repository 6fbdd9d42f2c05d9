"""The audit's softmax scale of an MLA checkpoint (DeepSeek-V2-Lite): transformers' attention
modules, posenc's ``mla_softmax_scale``, the paper's float64 formula and llama.cpp's deepseek2
``kq_scale`` from the GGUF agree; a GGUF without ``yarn_log_multiplier`` differs on it; a
plain Llama keeps ``1 / sqrt(head_dim)`` everywhere."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from _gguf_writer import write_gguf
from _released_configs import DEEPSEEK_V2_LITE, RELEASED
from posenc.audit.checkpoint import audit_positions
from posenc.audit.compare import compare
from posenc.audit.ggufread import read_gguf
from posenc.audit.hfread import read_posenc, read_transformers
from posenc.audit.paper import read_paper

EPS32 = 2.0**-23
TRAINED = DEEPSEEK_V2_LITE["max_position_embeddings"]
LENGTHS = [4096, TRAINED]


def _expected_mla_scale(config):
    """DeepSeek-V2 (sec. 2.1.3) with YaRN's magnitude (Peng et al. 2023, eq. 22) on q . k,
    in float64: ``(D_nope + D_rope) ** -0.5 (1 + 0.1 mscale_all_dim ln s) ** 2``."""
    yarn = config["rope_scaling"]
    width = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    mscale = 1.0 + 0.1 * yarn["mscale_all_dim"] * math.log(yarn["factor"])
    return width**-0.5 * mscale**2


@pytest.fixture(scope="module")
def deepseek_readings(tmp_path_factory):
    path = write_gguf(tmp_path_factory.mktemp("mla") / "v2lite.gguf", DEEPSEEK_V2_LITE)
    positions = audit_positions(TRAINED)
    readers = (read_transformers, read_posenc, read_paper)
    readings = [read(DEEPSEEK_V2_LITE, positions, context=TRAINED) for read in readers]
    return [*readings, read_gguf(path, positions, context=TRAINED)]


def test_deepseek_v2_lite_softmax_scale_agrees_in_every_reading(deepseek_readings):
    expected = _expected_mla_scale(DEEPSEEK_V2_LITE)
    for reading in deepseek_readings:
        assert reading.note is None, reading.runtime
        assert len(reading.layers) == DEEPSEEK_V2_LITE["num_hidden_layers"]
        for i, layer in enumerate(reading.layers):
            # float32 in transformers' and llama.cpp's fields (the GGUF stores 0.1 mscale_all_dim
            # as float32): a few float32 roundings of the formula
            assert math.isclose(layer.softmax_scale, expected, rel_tol=8 * EPS32), (
                reading.runtime,
                i,
                layer.softmax_scale,
            )
    result = compare(deepseek_readings, LENGTHS)
    row = next(r for r in result.rows if r.field == "softmax_scale")
    assert row.agree, row
    assert result.agree, [(r.field, r.values) for r in result.rows if r.agree is False]


def test_deepseek_scale_is_not_the_rotary_default(deepseek_readings):
    """The rotated head (64) is the layer's head_dim; MLA's scale is neither its default nor
    the unscaled 192 ** -0.5: the YaRN magnitude is in it."""
    layer = deepseek_readings[0].layers[0]
    assert layer.head_dim == DEEPSEEK_V2_LITE["qk_rope_head_dim"]
    assert not math.isclose(layer.softmax_scale, layer.head_dim**-0.5, rel_tol=1e-3)
    assert layer.softmax_scale > 192**-0.5 * 1.5


def test_gguf_without_yarn_log_multiplier_differs_on_the_softmax_scale(tmp_path):
    """llama.cpp#17945: without the key the deepseek2 graph's kq_scale takes the generic
    YaRN magnitude (1 + 0.1 ln s)^2, not (1 + 0.1 mscale_all_dim ln s)^2."""

    def drop(arch, kv, tensors):
        del kv["rope.scaling.yarn_log_multiplier"]

    path = write_gguf(tmp_path / "bug.gguf", DEEPSEEK_V2_LITE, edit=drop)
    positions = audit_positions(TRAINED)
    gguf = read_gguf(path, positions, context=TRAINED)
    factor = DEEPSEEK_V2_LITE["rope_scaling"]["factor"]
    generic = 192**-0.5 * (1.0 + 0.1 * math.log(factor)) ** 2
    assert math.isclose(gguf.layers[0].softmax_scale, generic, rel_tol=8 * EPS32)
    result = compare(
        [read_transformers(DEEPSEEK_V2_LITE, positions, context=TRAINED), gguf], LENGTHS
    )
    row = next(r for r in result.rows if r.field == "softmax_scale")
    assert row.agree is False and row.layers == f"0-{DEEPSEEK_V2_LITE['num_hidden_layers'] - 1}"
    change = abs(generic - _expected_mla_scale(DEEPSEEK_V2_LITE)) * math.sqrt(64)
    assert math.isclose(row.score_change[TRAINED], change, rel_tol=1e-4)


def test_plain_llama_keeps_the_default_scale_and_agrees(tmp_path):
    config = RELEASED["meta-llama/Llama-2-7b-hf"]
    path = write_gguf(tmp_path / "llama.gguf", config)
    positions = audit_positions(config["max_position_embeddings"])
    context = config["max_position_embeddings"]
    readings = [
        read_transformers(config, positions, context=context),
        read_posenc(config, positions, context=context),
        read_paper(config, positions, context=context),
        read_gguf(path, positions, context=context),
    ]
    for reading in readings:
        assert {layer.softmax_scale for layer in reading.layers} == {None}, reading.runtime
    row = next(r for r in compare(readings, [context]).rows if r.field == "softmax_scale")
    assert row.agree and set(row.values.values()) == {f"{128**-0.5:.6g}"}


def test_a_family_that_does_not_build_on_meta_is_noted(monkeypatch):
    """transformers' scale unread: a note, and the layer falls back to the default, which
    the comparison then shows as a difference from posenc's MLA scale (not hidden)."""
    import transformers

    def refuse(*args, **kwargs):
        raise NotImplementedError("no meta build")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", refuse)
    positions = audit_positions(4096)
    reading = read_transformers(DEEPSEEK_V2_LITE, positions, context=4096)
    assert "does not build on the meta device" in reading.note
    assert "NotImplementedError: no meta build" in reading.note
    assert reading.layers[0].softmax_scale is None
    posenc = read_posenc(DEEPSEEK_V2_LITE, positions, context=4096)
    row = next(r for r in compare([reading, posenc], [4096]).rows if r.field == "softmax_scale")
    assert row.agree is False


def _legacy(arch, kv, tensors):
    """The converter before MLA ran as MQA: per-head widths under the plain keys."""
    for key in ("attention.key_length_mla", "attention.value_length_mla"):
        del kv[key]
    kv["attention.key_length"], kv["attention.value_length"] = 192, 128


def _half_mla(arch, kv, tensors):
    del kv["attention.value_length_mla"]


@pytest.mark.parametrize(
    ("edit", "width"),
    [(None, 192), (_legacy, 192), (_half_mla, 512 + 64)],
    ids=["mla-keys", "legacy-keys", "key_length_mla-alone"],
)
def test_gguf_kq_scale_takes_llamacpps_mla_key_width(edit, width, tmp_path):
    """``n_embd_head_k_mla()``: ``key_length_mla`` when both ``_mla`` lengths are written
    (``is_mla``), else ``key_length`` (src/llama-hparams.cpp)."""
    path = write_gguf(tmp_path / "m.gguf", DEEPSEEK_V2_LITE, edit=edit)
    layer = read_gguf(path, audit_positions(4096), context=4096).layers[0]
    expected = _expected_mla_scale(DEEPSEEK_V2_LITE) * math.sqrt(192 / width)
    assert math.isclose(layer.softmax_scale, expected, rel_tol=8 * EPS32)


@pytest.mark.slow
def test_vllm_states_the_same_mla_scale_as_the_other_readings():
    """vLLM's built DeepseekV2 attention (its own environment) against transformers, posenc
    and the paper: DeepSeek-V2-Lite's config at its own widths and a small YaRN one."""
    from _audit_configs import CONFIGS, CONTEXT, POSITIONS
    from posenc.audit.vllm import read_vllm_jobs, vllm_python

    if vllm_python() is None:
        pytest.skip("vLLM's environment .venv-vllm is absent (bash scripts/setup_vllm.sh)")
    configs = [CONFIGS["deepseek_yarn"], DEEPSEEK_V2_LITE]
    served = read_vllm_jobs([{"config": c} for c in configs], POSITIONS, context=CONTEXT)
    for config, vllm in zip(configs, served, strict=True):
        assert vllm.ran, vllm.note
        readers = (read_transformers, read_posenc, read_paper)
        readings = [read(config, POSITIONS, context=CONTEXT) for read in readers]
        result = compare([*readings, vllm], [CONTEXT])
        row = next(r for r in result.rows if r.field == "softmax_scale")
        assert row.agree, row
        assert vllm.layers[0].softmax_scale not in (None, vllm.layers[0].head_dim ** -0.5)
