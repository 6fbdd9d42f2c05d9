"""Each historical position bug of a converted checkpoint, reproduced as a GGUF with that
defect: ``posenc audit``'s comparison differs on the field it breaks, and the GGUF's diff
against llama.cpp's converter names the GGUF field."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from _gguf_writer import write_gguf
from _released_configs import DEEPSEEK_V2_LITE, RELEASED
from posenc.audit.checkpoint import audit_positions
from posenc.audit.compare import compare
from posenc.audit.convert import gguf_diff
from posenc.audit.ggufread import gguf_rope, read_gguf
from posenc.audit.hfread import read_transformers

QWEN3_MOE_YARN = RELEASED["Qwen/Qwen3-30B-A3B (card's YaRN)"]
QWEN15_72B = {  # Qwen/Qwen1.5-72B's config.json position fields
    "model_type": "qwen2",
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "num_hidden_layers": 80,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
}
V5_FORM = {  # a transformers v5 config.json: rope_theta lives in rope_parameters
    **{k: v for k, v in RELEASED["Qwen/Qwen3-8B"].items() if k != "rope_theta"},
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}


def _drop(*names):
    def edit(arch, kv, tensors):
        for name in names:
            kv.pop(name, None)
            tensors.pop(name, None)

    return edit


def _set(name, value):
    def edit(arch, kv, tensors):
        kv[name] = value

    return edit


def _drop_scaling(arch, kv, tensors):
    for key in [k for k in kv if k.startswith("rope.scaling")]:
        del kv[key]


#: (issue, config, defect, the comparison rows that differ, the GGUF field named)
BUGS = [
    (
        "llama.cpp#2768: CodeLlama's rope_theta not written",
        RELEASED["codellama/CodeLlama-7b-hf"],
        _drop("rope.freq_base"),
        {"frequencies"},
        "llama.rope.freq_base",
    ),
    (
        "llama-cpp-python#1271: Qwen-72B's frequency base 100x off",
        QWEN15_72B,
        _set("rope.freq_base", 10000.0),
        {"frequencies"},
        "qwen2.rope.freq_base",
    ),
    (
        "ik_llama.cpp#402: Llama 3.1's rope_freqs tensor missing",
        RELEASED["meta-llama/Llama-3.1-8B"],
        _drop("rope_freqs.weight"),
        {"frequencies"},
        "rope_freqs.weight",
    ),
    (
        "llama.cpp#13322: Qwen3-MoE's YaRN not written",
        QWEN3_MOE_YARN,
        _drop_scaling,
        {"frequencies", "cos/sin factor"},
        "qwen3moe.rope.scaling.type",
    ),
    (
        "llama.cpp#17945: DeepSeek-V2's yarn_log_multiplier missing",
        DEEPSEEK_V2_LITE,
        _drop("rope.scaling.yarn_log_multiplier"),
        {"cos/sin factor", "softmax_scale"},
        "deepseek2.rope.scaling.yarn_log_multiplier",
    ),
    (
        "llama.cpp#17945: a YaRN attention factor in rope.scaling.attn_factor, which "
        "ggml's rope_yarn applies already (counted twice)",
        QWEN3_MOE_YARN,
        _set("rope.scaling.attn_factor", 0.1 * math.log(4.0) + 1.0),
        {"cos/sin factor"},
        "qwen3moe.rope.scaling.attn_factor",
    ),
    (
        "ik_llama#2003: yarn_ext_factor set to the scaling factor",
        QWEN3_MOE_YARN,
        _set("rope.scaling.yarn_ext_factor", 4.0),
        {"frequencies"},
        "qwen3moe.rope.scaling.yarn_ext_factor",
    ),
    (
        "onnxruntime/mobius#522: Qwen2-VL's sections read as interleaved M-RoPE",
        RELEASED["Qwen/Qwen2-VL-7B-Instruct"],
        "qwen3vl",
        {"extra"},
        "general.architecture",
    ),
    (
        "DeepSpeed#8345: rope_theta read at the top level of a v5 config (it moved into "
        "rope_parameters), so the default base was written",
        V5_FORM,
        _drop("rope.freq_base"),
        {"frequencies"},
        "qwen3.rope.freq_base",
    ),
]


def _write(path, config, defect):
    if isinstance(defect, str):  # the whole file under another architecture
        return write_gguf(path, config, architecture=defect)
    return write_gguf(path, config, edit=defect)


@pytest.mark.parametrize(
    ("issue", "config", "defect", "rows", "field"), BUGS, ids=[b[0][:40] for b in BUGS]
)
def test_historical_bug_is_flagged_with_its_field(issue, config, defect, rows, field, tmp_path):
    path = _write(tmp_path / "bug.gguf", config, defect)
    trained = config["max_position_embeddings"]
    positions = audit_positions(2 * trained)
    readings = [
        read_transformers(config, positions, context=2 * trained),
        read_gguf(path, positions, context=2 * trained),
    ]
    result = compare(readings, [trained, 2 * trained])
    differ = {r.field for r in result.rows if r.agree is False}
    assert differ == rows, issue
    for row in result.rows:
        if row.field in rows and row.field != "extra":
            assert row.score_change[2 * trained] > 1e-3, (issue, row)
    assert field in [k for k, _, _ in gguf_diff(config, gguf_rope(path)[1])], issue


def test_every_bug_fixture_without_its_defect_agrees(tmp_path):
    """The same configs written without the defect agree: the flag is the defect's."""
    for issue, config, *_ in BUGS:
        path = write_gguf(tmp_path / "ok.gguf", config)
        positions = audit_positions(2 * config["max_position_embeddings"])
        context = 2 * config["max_position_embeddings"]
        readings = [
            read_transformers(config, positions, context=context),
            read_gguf(path, positions, context=context),
        ]
        assert compare(readings, [context]).agree, issue
        assert gguf_diff(config, gguf_rope(path)[1]) == [], issue
