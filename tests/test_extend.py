"""posenc extend end to end on a tiny saved checkpoint with a byte-level tokenizer (nothing
downloaded): its numbers against a plain full forward, the report, resume after an
interruption, and bad inputs (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import math
import pickle
import shutil
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.cli import main  # noqa: E402
from posenc.extend import byte_tokenizer  # noqa: E402
from posenc.extend import evaluate as extend_evaluate  # noqa: E402
from posenc.extend.config import config_hash  # noqa: E402

TRAINED = 32
ARGS = ["--eval-lens", "24", "64", "--scalings", "linear", "yarn", "--factors", "2",
        "--windows", "2", "--depths", "--chunk", "32", "--no-progress"]  # fmt: skip


def _tiny_config(**extra):
    options = dict(
        vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=TRAINED,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return transformers.LlamaConfig(**{**options, **extra})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(_tiny_config()).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def _windows(results, length):
    """The held-out windows the run scored at ``length`` (as ``run_extend`` cuts them)."""
    from posenc.extend.runner import _text_tokens, _windows
    from posenc.lab.corpus import load_corpus

    tokens = _text_tokens(load_corpus(None), byte_tokenizer())
    return _windows(tokens, length, results["config"]["windows"])


def _full_nll(model, window):
    with torch.no_grad():
        logits = model(window[None]).logits[0]
    return torch.nn.functional.cross_entropy(logits[:-1], window[1:]).item()


def test_extend_end_to_end_matches_a_full_forward(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["extend", str(checkpoint), *ARGS, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    config = json.loads((checkpoint / "config.json").read_text())
    assert results["status"] == "complete"
    assert results["model"]["config_sha256"] == config_hash(config)
    assert results["settings"] == ["original", "linear x2", "yarn x2"]
    assert results["scalings"]["yarn x2"]["original_max_position_embeddings"] == TRAINED
    # chunked reading through the KV cache (chunk 32) equals one full forward, for the
    # original model and for linear x2 against the model built with it in its config
    original = transformers.LlamaForCausalLM.from_pretrained(checkpoint).eval()
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    linear = transformers.LlamaForCausalLM.from_pretrained(
        checkpoint, config=transformers.LlamaConfig(**config)
    ).eval()
    for length in (24, 64):
        windows = _windows(results, length)
        for label, model in (("original", original), ("linear x2", linear)):
            cell = results["cells"][label][str(length)]
            expected = [_full_nll(model, w) for w in windows]
            assert cell["window_nll"] == pytest.approx(expected, rel=1e-5)
    report = (out / "report.md").read_text()
    for length in (24, 64):
        assert f"- At {length}: " in report
    assert all(label in report for label in results["settings"])
    assert (out / "extend.png").stat().st_size > 0
    assert "original" in capsys.readouterr().err  # the rich table


SHORT = ["--eval-lens", "24", "64", "--scalings", "linear", "--factors", "2",
         "--windows", "1", "--depths", "--chunk", "32", "--no-progress"]  # fmt: skip


def test_extend_resumes_after_an_interruption_or_a_failure(checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "out"
    partial = tmp_path / "out.partial"
    calls = {"n": 0}
    real = extend_evaluate.window_nll

    def breaks(error):
        def window_nll(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 3:
                raise error
            return real(*args, **kwargs)

        return window_nll

    monkeypatch.setattr("posenc.extend.runner.window_nll", breaks(KeyboardInterrupt))
    assert main(["extend", str(checkpoint), *SHORT, "--out", str(out)]) == 130
    assert not out.exists()  # --out appears only when the run is complete
    held = json.loads((partial / "results.json").read_text())
    assert held["status"] == "interrupted"
    finished = {(s, n) for s, row in held["cells"].items() for n in row}
    assert finished == {("original", "24"), ("original", "64")}
    assert not {"report.md", "extend.png"} & {p.name for p in partial.iterdir()}
    kept = (partial / "cells" / "original-24.json").stat().st_mtime_ns
    calls["n"] = 1  # a failure (not Ctrl-C) in the second cell left: the same, marked failed
    monkeypatch.setattr("posenc.extend.runner.window_nll", breaks(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        main(["extend", str(checkpoint), *SHORT, "--out", str(out)])
    assert not out.exists()
    assert json.loads((partial / "results.json").read_text())["status"] == "failed"
    assert not {"report.md", "extend.png"} & {p.name for p in partial.iterdir()}
    monkeypatch.setattr("posenc.extend.runner.window_nll", real)
    assert main(["extend", str(checkpoint), *SHORT, "--out", str(out)]) == 0
    assert not partial.exists()
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "complete"
    assert (out / "cells" / "original-24.json").stat().st_mtime_ns == kept
    assert results["cells"]["original"]["24"] == held["cells"]["original"]["24"]
    assert len(list((out / "cells").glob("*.json"))) == 4
    assert {"report.md", "extend.png"} <= {p.name for p in out.iterdir()}
    other = ["--eval-lens", "24", "--no-progress", "--out", str(out)]
    assert main(["extend", str(checkpoint), *other]) == 2  # another configuration


def test_extend_refuses_to_resume_after_the_weights_or_tokenizer_changed(
    checkpoint, tmp_path, capsys
):
    model_dir = tmp_path / "model"
    shutil.copytree(checkpoint, model_dir)
    args = ["--eval-lens", "24", "--scalings", "linear", "--factors", "2",
            "--windows", "1", "--depths", "--chunk", "32", "--no-progress"]  # fmt: skip
    out = tmp_path / "out"
    assert main(["extend", str(model_dir), *args, "--out", str(out)]) == 0
    before = (out / "results.json").read_bytes()
    capsys.readouterr()
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    model.save_pretrained(model_dir)  # config.json unchanged, weights changed
    capsys.readouterr()
    assert main(["extend", str(model_dir), *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "weights_sha256" in err
    assert (out / "results.json").read_bytes() == before  # the old run is left as it was
    fresh = tmp_path / "fresh"
    assert main(["extend", str(model_dir), *args, "--out", str(fresh)]) == 0
    tokenizer_config = model_dir / "tokenizer_config.json"
    settings = json.loads(tokenizer_config.read_text())
    tokenizer_config.write_text(json.dumps({**settings, "model_max_length": 77}))
    capsys.readouterr()
    assert main(["extend", str(model_dir), *args, "--out", str(fresh)]) == 2
    err = capsys.readouterr().err
    assert "tokenizer_sha256" in err and "weights_sha256" not in err


def _bad(tmp_path, capsys, folder, *args):
    out = tmp_path / "bad-out"
    status = main(["extend", str(folder), "--out", str(out), "--no-progress", *args])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and err.startswith("posenc: error: ")
    assert not out.exists()
    return err


def test_extend_bad_inputs_name_the_problem_and_write_nothing(checkpoint, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in _bad(tmp_path, capsys, empty)
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(gpt2)
    assert "gpt2" in _bad(tmp_path, capsys, gpt2, "--eval-lens", "8")
    assert "gpt2" in _bad(tmp_path, capsys, gpt2)  # the default lengths need L0 first
    narrow = tmp_path / "narrow"  # head_dim 2: one rotated pair, which NTK cannot stretch
    _tiny_config(hidden_size=4, num_attention_heads=2, num_key_value_heads=2).save_pretrained(
        narrow
    )
    err = _bad(tmp_path, capsys, narrow, "--scalings", "ntk", "--eval-lens", "8")
    assert "ntk x2" in err and "rotary dim >= 4" in err
    err = _bad(tmp_path, capsys, checkpoint, "--scalings", "longrope", "--eval-lens", "8")
    assert "'longrope'" in err
    err = _bad(tmp_path, capsys, checkpoint, "--eval-lens", str(10**12))
    assert f"evaluation length {10**12} needs about" in err and "GiB" in err
    small = tmp_path / "small.txt"
    small.write_text("only a few bytes of text\n")
    err = _bad(tmp_path, capsys, checkpoint, "--corpus", str(small), "--eval-lens", "4096")
    assert "fewer than evaluation length 4096" in err
    assert "--factors" in _bad(tmp_path, capsys, checkpoint, "--factors", "two")
    assert "factor must be >= 1" in _bad(tmp_path, capsys, checkpoint, "--factors", "0.5")


class _RunsCode:
    """A pickle that would create ``path`` if it were ever unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _edit_config(**fields):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **fields}))

    return edit


def _write(name, data):
    def edit(folder):
        (folder / name).write_bytes(data(folder) if callable(data) else data)

    return edit


def _truncate(folder):
    with open(folder / "model.safetensors", "r+b") as handle:
        handle.truncate(5000)


def _pickled_bin(folder):
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_RunsCode(folder / "ran")))


HOSTILE = {
    "deep config.json": (_write("config.json", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                         "nests too deeply"),
    "zero heads": (_edit_config(num_attention_heads=0), "num_attention_heads must be >= 1"),
    "zero kv heads": (_edit_config(num_key_value_heads=0), "num_key_value_heads must be >= 1"),
    "heads not divisible": (_edit_config(num_key_value_heads=3), "not a multiple of 3"),
    "hidden not divisible": (_edit_config(hidden_size=30), "hidden size (30)"),
    "heads a string": (_edit_config(num_attention_heads="four"), "num_attention_heads must be"),
    "rope_parameters a list": (_edit_config(rope_parameters=[1, 2]), "rope_parameters must be"),
    "rope_parameters a string": (_edit_config(rope_parameters="yarn"), "rope_parameters must"),
    "vocabulary mismatch": (_edit_config(vocab_size=100), "shapes do not match config.json"),
    "truncated safetensors": (_truncate, "cannot load its weights"),
    "garbage safetensors": (_write("model.safetensors", bytes(range(256)) * 16),
                            "cannot load its weights"),
    "huge safetensors header": (_write("model.safetensors", (2**62).to_bytes(8, "little") + b"{}"),
                                "cannot load its weights"),
    "garbage tokenizer.json": (_write("tokenizer.json", b'{"x": 1}'), "cannot load its tokenizer"),
    "pickled .bin": (_pickled_bin, "never unpickles"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_extend_hostile_checkpoints_are_one_line_errors(case, checkpoint, tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(checkpoint, folder)
    edit, expected = HOSTILE[case]
    edit(folder)
    err = _bad(tmp_path, capsys, folder, "--eval-lens", "24", "--scalings", "linear")
    assert expected in err
    assert "weights_only=False" not in err and "Traceback" not in err
    assert not (tmp_path / "bad-out.partial").exists() and not (folder / "ran").exists()


def test_extend_decides_support_before_any_cell(checkpoint, tmp_path, capsys, monkeypatch):
    from posenc.extend import runner

    real = runner.patch

    def patch(model, *, scaling=None, **kwargs):
        if scaling["rope_type"] == "yarn":  # accepted on paper, fails on the model
            raise KeyError("forward")
        return real(model, scaling=scaling, **kwargs)

    scored = []
    monkeypatch.setattr("posenc.extend.runner.patch", patch)
    monkeypatch.setattr("posenc.extend.runner.window_nll", lambda *a, **k: scored.append(a))
    err = _bad(tmp_path, capsys, checkpoint, "--eval-lens", "24", "--scalings", "linear", "yarn")
    assert "setting 'yarn x2'" in err and "forward" in err
    assert scored == [] and not (tmp_path / "bad-out.partial").exists()


def test_extend_never_writes_into_a_foreign_folder(checkpoint, tmp_path, capsys):
    mine = tmp_path / "bad-out"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    (mine / ".draft.tmp").write_text("mine")
    status = main(["extend", str(checkpoint), *SHORT, "--out", str(mine)])
    assert status == 2 and "no posenc run record" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == [".draft.tmp", "report.md"]
    assert (mine / "report.md").read_text() == "my notes"


def test_passkey_prompt_has_the_length_and_the_key_at_its_depth():
    tokenizer = byte_tokenizer()
    for depth in (0.0, 0.5, 1.0):
        ids = extend_evaluate.passkey_prompt(tokenizer, 600, depth, "12345")
        text = tokenizer.decode(ids)
        assert len(ids) == 600 and text.count("12345") == 2
        where = text.index("The pass key is 12345")
        intro, question = text.index("\n") + 1, text.rindex("\nWhat is")
        filler = (
            question - intro - len("The pass key is 12345. Remember it. 12345 is the pass key. ")
        )
        assert math.isclose(where - intro, depth * filler, abs_tol=1)
    with pytest.raises(ValueError, match="at least"):
        extend_evaluate.passkey_prompt(tokenizer, 50, 0.5, "12345")


def test_passkey_trial_decodes_greedily_after_the_prompt(checkpoint):
    model = transformers.LlamaForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = byte_tokenizer()
    with warnings.catch_warnings():  # the cache is passed by the name forward takes
        warnings.simplefilter("error", FutureWarning)
        trial = extend_evaluate.passkey(model, tokenizer, 300, 0.5, seed=3, chunk=128)
        again = extend_evaluate.passkey(model, tokenizer, 300, 0.5, seed=3, chunk=300)
    assert trial == again  # chunking the prompt does not change the greedy answer
    assert len(trial["key"]) == 5 and trial["key"].isdigit()
    ids = torch.tensor(extend_evaluate.passkey_prompt(tokenizer, 300, 0.5, trial["key"]))
    with torch.no_grad():
        first = int(model(ids[None]).logits[0, -1].argmax())
    assert trial["answer"].encode()[:1] == bytes([first])  # the full forward's next byte
    digits = "".join(c for c in trial["answer"] if c.isdigit())
    assert trial["ok"] == digits.startswith(trial["key"])


def test_ranking_orders_by_perplexity_and_marks_ties_and_disagreements():
    from posenc.extend.report import ranking

    def cell(*nll):
        return {"window_nll": list(nll), "mean_nll": sum(nll) / len(nll)}

    cells = {
        "a": {"8": cell(1.0, 2.0)},
        "b": {"8": cell(1.0 + 1e-7, 2.0)},  # a's rounding twin
        "c": {"8": cell(1.5, 2.5)},  # worse in every window
        "d": {"8": cell(1.4, 4.0)},  # better in one window, worse in the other
    }
    results = {"settings": ["d", "c", "b", "a"], "cells": cells}
    assert ranking(results, 8) == "a (4.48) = b (4.48) < c (7.39) ≈ d (14.9)"
    assert ranking(results, 16) == ""
