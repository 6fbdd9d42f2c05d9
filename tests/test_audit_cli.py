"""``posenc audit``: exit status 0 / 1 / 2, the JSON, a GGUF alone, and the docs' example run
(docs/audit.md shows exactly what the command prints)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from _gguf_writer import write_gguf
from _released_configs import RELEASED
from posenc.cli import main

ROOT = Path(__file__).resolve().parents[1]
CODELLAMA = RELEASED["codellama/CodeLlama-7b-hf"]
LLAMA31 = RELEASED["meta-llama/Llama-3.1-8B"]


def _drop_base(arch, kv, tensors):
    kv.pop("rope.freq_base")


def _folder(tmp_path: Path, config, edit=None, name="m.gguf") -> Path:
    folder = tmp_path / "codellama"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    write_gguf(folder / name, config, edit=edit)
    return folder


def _run(capsys, *args: str) -> tuple[int, str, str]:
    status = main(["audit", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_docs_example_is_what_the_command_prints(tmp_path, capsys):
    folder = _folder(tmp_path, CODELLAMA, _drop_base, "codellama-7b.gguf")
    status, out, _ = _run(capsys, str(folder), "--no-vllm", "--lengths", "4096", "16384")
    page = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    shown = re.search(r"<!-- audit-example -->\n```text\n(.*?)```", page, re.S)
    assert shown is not None and status == 1
    assert out == shown.group(1)


def test_an_agreeing_checkpoint_exits_0_and_json_says_so(tmp_path, capsys):
    folder = _folder(tmp_path, LLAMA31)
    status, out, _ = _run(capsys, str(folder), "--no-vllm", "--json")
    result = json.loads(out)
    assert status == 0 and result["agree"] is True and result["gguf_fields"] == []
    assert {r["field"] for r in result["rows"]} >= {"frequencies", "pairs", "cos/sin factor"}
    assert result["lengths"] == [8192, 131072, 262144]


def test_a_difference_exits_1_and_names_the_field_in_json(tmp_path, capsys):
    folder = _folder(tmp_path, CODELLAMA, _drop_base)
    status, out, _ = _run(capsys, str(folder), "--no-vllm", "--json", "--lengths", "4096")
    result = json.loads(out)
    assert status == 1 and not result["agree"]
    assert [f["field"] for f in result["gguf_fields"]] == ["llama.rope.freq_base"]
    frequencies = next(r for r in result["rows"] if r["field"] == "frequencies")
    assert frequencies["agree"] is False and frequencies["layers"] == "0-31"


def test_vllm_without_its_environment_is_shown_as_not_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POSENC_VLLM_PYTHON", str(tmp_path / "no-python"))
    config = {**LLAMA31, "architectures": ["LlamaForCausalLM"]}
    status, out, _ = _run(capsys, str(_folder(tmp_path, config)), "--json")
    result = json.loads(out)
    vllm = next(r for r in result["runtimes"] if r["runtime"] == "vllm")
    assert status == 0 and vllm["ran"] is False and vllm["note"]


def test_a_gguf_alone_is_read_by_transformers_gguf_loader(tmp_path, capsys):
    """transformers' GGUF loader drops the rope_freqs tensor (RUNTIMES.md): Llama 3.1's
    scaling is lost, and the audit says so."""
    path = write_gguf(tmp_path / "llama31.gguf", LLAMA31)
    status, out, _ = _run(capsys, str(path), "--lengths", "8192", "131072")
    assert status == 1
    assert re.search(r"^frequencies .* DIFFER", out, re.M)
    assert "transformers (GGUF loader)" in out


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (lambda p: p / "missing", (), "no such file or folder"),
        (lambda p: p, (), "has no config.json"),
        (lambda p: _file(p / "x.txt", b""), (), "a .gguf file"),
        (lambda p: _file(p / "x.gguf", b"not a gguf"), (), "not a readable GGUF"),
        (lambda p: _two_ggufs(p), (), "several GGUF files"),
        (lambda p: _folder(p, CODELLAMA), ("--lengths", "1"), "--lengths"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, args, message):
    path = make(tmp_path)
    status = main(["audit", str(path), "--no-vllm", *args])
    err = capsys.readouterr().err
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _two_ggufs(tmp_path: Path) -> Path:
    folder = _folder(tmp_path, CODELLAMA)
    write_gguf(folder / "other.gguf", CODELLAMA)
    return folder
