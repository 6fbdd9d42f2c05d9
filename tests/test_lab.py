"""posenc lab: the sweep end to end (quick mode, resume, NaN, Ctrl-C, bad input) and its
parts (corpus, tasks, model, schedule, evaluation, variants, output folder)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor, nn

import posenc.base
import posenc.lab.runs
from _lab_helpers import Interrupt, NaNInput, registered
from posenc import cli
from posenc.lab import LabConfig, Task, TinyLM, load_corpus
from posenc.lab.corpus import HELD_OUT_EVERY, stdlib_corpus
from posenc.lab.distributed import Context
from posenc.lab.evaluate import accuracy, perplexity, window_starts
from posenc.lab.results import check_identity, write_json
from posenc.lab.tasks import DEPTHS, IGNORE
from posenc.lab.train import lr_at
from posenc.lab.variants import build_encoding, scaling_spec, variants

#: A tiny model for a task; text also takes ``--eval-tokens`` (a task refuses it).
TINY_MODEL = ["--quick", "--steps", "12", "--d-model", "16", "--heads", "2", "--threads", "1",
              "--no-progress"]  # fmt: skip
TINY = [*TINY_MODEL, "--eval-tokens", "256"]


def lab(out: Path, *options: str, base: list[str] = TINY) -> int:
    return cli.main(["lab", *base, "--out", str(out), *options])


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


# ----------------------------------------------------------------------------- end to end


def test_quick_command_writes_the_three_outputs(tmp_path):
    cmd = [sys.executable, "-m", "posenc", "lab", "--quick", "--no-progress", "--threads", "1"]
    proc = subprocess.run([*cmd, "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    res = results(tmp_path)
    assert [run["encoding"] for run in res["runs"]] == list(res["config"]["encodings"])
    assert res["status"] == "complete" and res["metric"] == "ppl"
    assert res["data"]["sha256"] == stdlib_corpus().sha256
    assert {"torch", "numpy", "posenc", "python"} <= set(res["environment"])
    labels = [row["label"] for run in res["runs"] for row in run["rows"]]
    assert {f"rope +{kind}" for kind in ("linear", "ntk", "dynamic", "yarn")} <= set(labels)
    for run in res["runs"]:
        for row in run["rows"]:
            assert all(math.isfinite(v["ppl"]) for v in row["results"].values())
    report = (tmp_path / "report.md").read_text()
    assert "| rope +yarn |" in report and "perplexity.png" in report
    assert (tmp_path / "perplexity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "rope +yarn" in proc.stdout  # the final table
    shape = {k: res["config"][k] for k in ("d_model", "num_layers", "num_heads")}
    assert "smoke test" in proc.stdout and "smoke test" in report
    assert res["quick"] and res["seeds"] == [0]
    for run in res["runs"]:  # the trained weights load into a fresh model of the same shape
        state = torch.load(tmp_path / run["weights"], weights_only=True)
        config = LabConfig(encodings=(run["encoding"],), train_len=res["config"]["train_len"],
                           d_model=shape["d_model"], num_heads=shape["num_heads"],
                           eval_lens=tuple(res["config"]["eval_lens"]))  # fmt: skip
        model = TinyLM(build_encoding(run["encoding"], config), vocab_size=256, **shape)
        model.load_state_dict(state)


def test_same_seed_same_numbers(tmp_path):
    assert lab(tmp_path / "a", "--encodings", "rope") == 0
    assert lab(tmp_path / "b", "--encodings", "rope") == 0
    first, second = results(tmp_path / "a")["runs"], results(tmp_path / "b")["runs"]
    assert [r["rows"] for r in first] == [r["rows"] for r in second]
    assert first[0]["train"]["curve"] == second[0]["train"]["curve"]


def test_learned_is_na_beyond_its_table_unless_interpolated(tmp_path):
    assert lab(tmp_path, "--encodings", "learned", "--learned-beyond", "interpolate") == 0
    rows = {row["label"]: row for row in results(tmp_path)["runs"][0]["rows"]}
    assert rows["learned"]["results"]["32"] is not None
    assert rows["learned"]["results"]["64"] is None and "max_len" in rows["learned"]["notes"]["64"]
    assert all(v is not None for v in rows["learned +interpolate"]["results"].values())
    assert "| learned | " in (tmp_path / "report.md").read_text()


def test_finetune_rows_follow_chen_et_al(tmp_path):
    """PI is fine-tuned at --finetune-len with the fixed factor finetune_len / train_len,
    beside RoPE fine-tuned the same way; only rotary encodings are fine-tuned."""
    options = ["--encodings", "rope,learned", "--finetune-steps", "2", "--scalings", "yarn",
               "--finetune-len", "64"]  # fmt: skip
    assert lab(tmp_path, *options) == 0
    rows = {row["label"]: row for run in results(tmp_path)["runs"] for row in run["rows"]}
    assert list(rows) == ["rope", "rope +yarn", "rope +yarn +hf", "rope +ft",
                          "rope +linear +ft", "learned", "learned +interpolate"]  # fmt: skip
    for label in ("rope +ft", "rope +linear +ft"):
        assert all(value is not None for value in rows[label]["results"].values())
        assert rows[label]["results"]["32"] != rows["rope"]["results"]["32"]
    assert rows["rope +ft"]["results"]["32"] != rows["rope +linear +ft"]["results"]["32"]


def test_resume_skips_finished_runs_and_refuses_another_config(tmp_path, capsys):
    assert lab(tmp_path, "--encodings", "nope") == 0
    before = (tmp_path / "runs" / "nope-s0.json").read_text()
    assert lab(tmp_path, "--encodings", "nope,alibi") == 0
    assert "skipped: nope-s0" in capsys.readouterr().out
    assert (tmp_path / "runs" / "nope-s0.json").read_text() == before
    assert [r["encoding"] for r in results(tmp_path)["runs"]] == ["nope", "alibi"]
    assert lab(tmp_path, "--encodings", "nope", "--steps", "13") == 2
    err = capsys.readouterr().err.strip()
    assert "different configuration" in err and "steps" in err and len(err.splitlines()) == 1


def test_nan_run_is_failed_and_the_sweep_goes_on(tmp_path, capsys):
    with registered("nan_input", NaNInput):
        assert lab(tmp_path, "--encodings", "nan_input,nope") == 0
        runs = {run["encoding"]: run for run in results(tmp_path)["runs"]}
        assert runs["nan_input"]["status"] == "failed" and "nan" in runs["nan_input"]["error"]
        assert runs["nope"]["status"] == "ok"
        assert "nan_input (seed 0): failed" in (tmp_path / "report.md").read_text()
        capsys.readouterr()
        assert lab(tmp_path, "--encodings", "nan_input,nope") == 0
        assert "skipped: nan_input-s0, nope-s0" in capsys.readouterr().out


def test_ctrl_c_keeps_what_finished(tmp_path):
    with registered("interrupt", Interrupt):
        assert lab(tmp_path, "--encodings", "nope,interrupt,alibi") == 130
        res = results(tmp_path)
        assert res["status"] == "interrupted"
        assert [run["encoding"] for run in res["runs"]] == ["nope"]
        assert (tmp_path / "runs" / "nope-s0.json").exists()
        assert (tmp_path / "perplexity.png").exists()
        assert "interrupted" in (tmp_path / "report.md").read_text()
        assert not list(tmp_path.rglob("*.tmp"))


def test_task_sweep_reports_accuracy(tmp_path, monkeypatch):
    options = ["--task", "copy", "--encodings", "alibi", "--eval-examples", "8"]
    assert lab(tmp_path / "short", *options, base=TINY_MODEL) == 0  # not learned, no result
    short = results(tmp_path / "short")
    assert short["runs"][0]["learned"] is False
    assert "not learned" in (tmp_path / "short" / "report.md").read_text()
    assert not (tmp_path / "short" / "accuracy.png").exists()
    monkeypatch.setattr(posenc.lab.runs, "LEARNED", 0.0)  # count it as learned
    assert lab(tmp_path / "learned", *options, base=TINY_MODEL) == 0
    res = results(tmp_path / "learned")
    assert res["metric"] == "accuracy" and res["config"]["eval_lens"] == [16, 32, 48, 64]
    for value in res["runs"][0]["rows"][0]["results"].values():
        assert 0.0 <= value["accuracy"] <= 1.0 and value["examples"] == 8
        assert 0.0 <= value["token_accuracy"] <= 1.0
    assert (tmp_path / "learned" / "accuracy.png").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--encodings", "nonesuch"], "unknown encoding 'nonesuch'"),
        (["--train-len", "64", "--eval-lens", "32", "64"], "shorter than the training length"),
        (["--corpus", "/nonexistent/text"], "does not exist"),
        (["--steps", "many"], "invalid int value"),
        (["--steps", "0"], "steps must be >= 1"),
        (["--heads", "3"], "not divisible by --heads 3"),
        (["--scalings", "stretch"], "unknown scaling 'stretch'"),
        (["--eval-lens", "32", "1e3"], "expected integers"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, options, message):
    assert lab(tmp_path / "out", *options) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_bad_corpus_is_one_line_and_exit_2(tmp_path, capsys):
    empty, binary, short = tmp_path / "empty.txt", tmp_path / "bin.txt", tmp_path / "short.txt"
    empty.write_text("")
    binary.write_bytes(b"\xff\xfe\x00text")
    short.write_text("tiny text " * 20)
    (tmp_path / "folder").mkdir()
    for path, message in [
        (empty, "is empty"),
        (binary, "not UTF-8"),
        (short, "too few for one window"),
        (tmp_path / "folder", "holds no files"),
    ]:
        assert lab(tmp_path / "out", "--corpus", str(path)) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1


# ----------------------------------------------------------------------------- corpus


def test_stdlib_corpus_is_deterministic_and_split_by_file():
    first, second = stdlib_corpus(), stdlib_corpus()
    assert first.sha256 == second.sha256 and torch.equal(first.train, second.train)
    assert not set(first.train_files) & set(first.heldout_files)
    names = sorted(first.train_files + first.heldout_files)
    assert list(first.heldout_files) == names[HELD_OUT_EVERY // 2 :: HELD_OUT_EVERY]
    assert first.train.dtype == torch.uint8 and first.heldout.numel() > 10_000


def test_folder_and_file_corpora(tmp_path):
    for i in range(12):
        (tmp_path / f"doc{i:02d}.txt").write_text(f"document {i} " * 10)
    (tmp_path / ".hidden").write_bytes(b"\xff")  # hidden entries are skipped
    folder = load_corpus(tmp_path)
    assert folder.heldout_files == ("doc05.txt",)
    assert folder.heldout.numel() == len("document 5 " * 10)
    single = load_corpus(tmp_path / "doc00.txt")
    text = (tmp_path / "doc00.txt").read_bytes()
    assert bytes(single.train.tolist()) + bytes(single.heldout.tolist()) == text
    (tmp_path / "doc00.txt").write_text("changed")
    assert load_corpus(tmp_path).sha256 != folder.sha256


# ----------------------------------------------------------------------------- tasks


def _oracle(task: Task) -> nn.Module:
    """A 'model' whose argmax at every scored position is the right answer."""

    class Oracle(nn.Module):
        def forward(self, tokens: Tensor) -> Tensor:
            answers = torch.stack([_solve(task, seq) for seq in tokens])
            return nn.functional.one_hot(answers, task.vocab_size).float()

    return Oracle()


def _solve(task: Task, seq: Tensor) -> Tensor:
    """The answer token at each position of one padded example, from the task's rules."""
    out = torch.zeros_like(seq)
    if task.name == "passkey":  # K d1..d5 somewhere in the filler, then Q: predict d1..d5
        key = int((seq == task.vocab_size - 2).nonzero()[0])
        query = int((seq == task.vocab_size - 1).nonzero()[0])
        digits = seq[key + 1 : key + 6]
        stop = min(seq.numel(), query + 5)
        out[query:stop] = digits[: stop - query]
        return out
    sep = int((seq == 1).nonzero()[0])
    if task.name == "recall":
        pairs = dict(zip(seq[:sep:2].tolist(), seq[1:sep:2].tolist(), strict=True))
        for i in range(sep + 1, seq.numel(), 2):
            out[i] = pairs.get(int(seq[i]), 0)
        return out
    symbols = seq[:sep]
    answer = symbols.flip(0) if task.name == "reverse" else symbols
    out[sep : sep + answer.numel()] = answer
    return out


@pytest.mark.parametrize("name", ["copy", "reverse", "recall", "passkey"])
@given(length=st.integers(4, 40), seed=st.integers(0, 2**16))
def test_task_examples_follow_their_rule(name, length, seed):
    task = Task(name, 40)
    if name == "passkey" and length < 12:  # K + 5 digits, Q + 5 digits, one filler token
        with pytest.raises(ValueError, match="room for one example"):
            task.batch(3, length, torch.Generator(), exact=False)
        return
    gen = torch.Generator().manual_seed(seed)
    inputs, targets = task.batch(3, length, gen, exact=False)
    assert inputs.shape == targets.shape == (3, length)
    for seq, target in zip(inputs, targets, strict=True):
        scored = target != IGNORE
        assert scored.any()
        assert torch.equal(target[scored], _solve(task, seq)[scored])


@pytest.mark.parametrize("name", ["copy", "reverse", "recall", "passkey"])
def test_exact_match_of_an_oracle_is_one_and_of_a_constant_is_zero(name):
    task = Task(name, 64)
    one = accuracy(_oracle(task), task, 64, examples=10, seed=0, context=Context())
    assert one["accuracy"] == 1.0 and one["token_accuracy"] == 1.0
    if name == "passkey":
        assert one["depths"] == {str(d): 1.0 for d in DEPTHS}

    class Constant(nn.Module):
        def forward(self, tokens: Tensor) -> Tensor:
            return torch.zeros(*tokens.shape, task.vocab_size)  # argmax: token 0 (padding)

    assert accuracy(Constant(), task, 64, examples=10, seed=0, context=Context())["accuracy"] == 0


# ----------------------------------------------------------------------------- model, training


def test_uniform_model_has_perplexity_256():
    class Uniform(nn.Module):
        def forward(self, tokens: Tensor) -> Tensor:
            return torch.zeros(*tokens.shape, 256)

    data = (torch.arange(1000) % 256).to(torch.uint8)
    out = perplexity(Uniform(), data, 64, longest=128, max_tokens=300, context=Context())
    assert out["tokens"] == 2 * 128  # two segments of 128 bytes, each cut in two windows
    # per-byte losses in float32 (one rounding of log 256), summed in float64
    assert math.isclose(out["ppl"], 256.0, rel_tol=4 * torch.finfo(torch.float32).eps)


@given(
    num_bytes=st.integers(2, 5000),
    log_longest=st.integers(0, 9),
    log_ratio=st.integers(0, 9),
    max_tokens=st.integers(1, 3000),
)
def test_eval_windows_score_the_same_bytes_at_every_length(
    num_bytes, log_longest, log_ratio, max_tokens
):
    longest = 2**log_longest
    length = 2 ** max(0, log_longest - log_ratio)
    if num_bytes <= longest:
        with pytest.raises(ValueError, match="too few"):
            window_starts(num_bytes, length, longest=longest, max_tokens=max_tokens)
        return
    starts = window_starts(num_bytes, length, longest=longest, max_tokens=max_tokens)
    segments = window_starts(num_bytes, longest, longest=longest, max_tokens=max_tokens)
    scored = {int(s) + 1 + i for s in starts for i in range(length)}  # target byte indices
    assert scored == {int(s) + 1 + i for s in segments for i in range(longest)}
    assert len(scored) == starts.numel() * length  # non-overlapping
    assert int(starts.max()) + length < num_bytes  # every window's targets exist
    assert starts.numel() * length <= max(max_tokens, longest)


@pytest.mark.parametrize("name", ["nope", "sinusoidal", "learned", "rope", "alibi", "t5"])
def test_tiny_lm_is_causal(name):
    config = LabConfig(encodings=(name,), d_model=16, num_heads=2, train_len=12, eval_lens=(12,))
    torch.manual_seed(0)
    model = TinyLM(build_encoding(name, config), vocab_size=256, d_model=16, num_layers=2,
                   num_heads=2)  # fmt: skip
    tokens = torch.randint(0, 256, (2, 12))
    changed = tokens.clone()
    changed[:, 7:] = torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        a, b = model(tokens), model(changed)
        twin = model.with_encoding(build_encoding(name, config))
        assert torch.equal(twin(tokens), a)
    assert torch.equal(a[:, :7], b[:, :7]) and not torch.equal(a[:, 7:], b[:, 7:])


@given(steps=st.integers(2, 500), warmup=st.integers(0, 50), step=st.integers(0, 600))
def test_lr_schedule_warms_up_then_decays_to_a_tenth(steps, warmup, step):
    warmup = min(warmup, steps - 1)
    lr = lr_at(step, steps=steps, warmup=warmup, peak=1.0)
    assert 0.0 < lr <= 1.0 + 1e-12
    if step >= warmup:  # warmup starts from peak / warmup, which may be below the floor
        assert lr >= 0.1 - 1e-12
    if step < warmup:
        assert math.isclose(lr, (step + 1) / warmup)
    if step >= steps:
        assert math.isclose(lr, 0.1)
    if warmup <= step < steps - 1:
        assert lr >= lr_at(step + 1, steps=steps, warmup=warmup, peak=1.0)


# ----------------------------------------------------------------------------- variants, output


@pytest.mark.parametrize("kind", ["linear", "ntk", "dynamic", "yarn"])
def test_scaling_specs_build_rotary_encodings(kind):
    config = LabConfig(encodings=("rope",), d_model=32, num_heads=2)
    spec = scaling_spec(kind, 4.0, config.train_len, dynamic_factor=config.dynamic_factor)
    rope = build_encoding("rope", config, scaling=spec)
    want = config.dynamic_factor if kind == "dynamic" else 4.0  # dynamic: its own factor
    assert rope.scaling.rope_type == kind and rope.scaling.factor == want


def test_variants_per_encoding():
    config = LabConfig(encodings=("rope",), learned_beyond="interpolate")
    labels = [v.label for v in variants("rope", config)]
    assert [label for label in labels if label.count("+") == 1] == [
        f"rope +{s}" for s in config.scalings
    ]
    assert set(labels) - {f"rope +{s}" for s in config.scalings} == {
        "rope +dynamic +decoded",  # dynamic NTK as decoded through a KV cache
        "rope +ntk +hf",  # NTK-aware at transformers' alpha = factor
        "rope +yarn +hf",  # YaRN at transformers' default betas
    }
    assert [v.label for v in variants("learned", config)] == ["learned +interpolate"]
    assert variants("alibi", config) == []
    assert variants("learned", config.replace(learned_beyond="error")) == []


def test_identity_check_names_the_differences(tmp_path):
    check_identity(tmp_path, {"steps": 10, "seed": 0})
    check_identity(tmp_path, {"steps": 10, "seed": 0})
    with pytest.raises(ValueError, match="differs in seed, steps"):
        check_identity(tmp_path, {"steps": 20, "seed": 1})
    write_json(tmp_path / "runs" / "x.json", {"a": 1})
    assert json.loads((tmp_path / "runs" / "x.json").read_text()) == {"a": 1}
    assert not list(tmp_path.rglob("*.tmp"))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_written_json_reads_back_exactly_with_number_arrays_on_one_line(tmp_path_factory, obj):
    path = tmp_path_factory.mktemp("json") / "x.json"
    write_json(path, {"data": obj, "losses": [0.5, -1e-07, 3]})
    assert json.loads(path.read_text()) == {"data": obj, "losses": [0.5, -1e-07, 3]}
    assert '"losses": [0.5, -1e-07, 3]' in path.read_text()  # one line, not one per number
