"""posenc lab's evaluation precision (``LabConfig.eval_precision``): which dtype ``auto``
picks, bfloat16 logits against a float64 forward for every encoding the lab can train,
perplexity and accuracy against float32, and the option on the command line and in
sweep files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posenc import cli
from posenc.lab import LabConfig, TinyLM
from posenc.lab.config import resolve_encodings
from posenc.lab.distributed import Context
from posenc.lab.evaluate import accuracy, eval_dtype, perplexity
from posenc.lab.tasks import Task
from posenc.lab.variants import build_encoding

EPS_BF16 = torch.finfo(torch.bfloat16).eps
TINY = ["--quick", "--steps", "4", "--d-model", "16", "--heads", "2", "--eval-tokens", "128",
        "--threads", "1", "--no-progress", "--encodings", "nope"]  # fmt: skip


def _model(name: str, *, dtype: torch.dtype = torch.float32) -> TinyLM:
    config = LabConfig(encodings=(name,), d_model=32, num_heads=2)
    options = {"beyond": "interpolate"} if name == "learned" else {}
    torch.manual_seed(0)
    model = TinyLM(build_encoding(name, config, **options), vocab_size=256, d_model=32,
                   num_layers=2, num_heads=2)  # fmt: skip
    return model.to(dtype).eval()


# ------------------------------------------------------------------------ the dtype chosen


@pytest.mark.parametrize("flags", [(True, False), (False, True), (False, False)])
def test_auto_is_bfloat16_only_where_the_cpu_has_it(monkeypatch, flags):
    avx512_bf16, amx = flags
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    want = torch.bfloat16 if any(flags) else torch.float32
    assert eval_dtype("auto", torch.device("cpu")) == want
    assert eval_dtype("float32", torch.device("cpu")) == torch.float32
    assert eval_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_auto_is_float32_where_no_check_exists(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert eval_dtype("auto", torch.device("cpu")) == torch.float32
    assert eval_dtype("auto", torch.device("meta")) == torch.float32


def test_unknown_precisions_are_refused_by_name():
    with pytest.raises(ValueError, match="'float16'"):
        eval_dtype("float16", torch.device("cpu"))
    with pytest.raises(ValueError, match=r"eval_precision.*'half'"):
        LabConfig(eval_precision="half")


# ----------------------------------------------------------------------- numbers in bf16


@pytest.mark.parametrize("name", resolve_encodings(["all"]))
def test_bfloat16_logits_match_a_float64_forward(name):
    """Every encoding the lab can train evaluates under bfloat16 autocast (the blocks'
    products in bfloat16, accumulated in float32) with float32 logits; the error is
    bounded by a few bfloat16 roundings of the logits' scale, and the products really
    ran in bfloat16 (it is at least the float32 path's error)."""
    model = _model(name)
    reference = _model(name, dtype=torch.float64)
    tokens = torch.randint(0, 256, (2, 200), generator=torch.Generator().manual_seed(1))
    seen = []
    model.blocks[0].attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.inference_mode():
        want = reference(tokens)
        exact = model(tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast = model(tokens)
    assert seen == [torch.float32, torch.bfloat16]
    assert fast.dtype == torch.float32  # logits never rounded to bfloat16
    scale = float(want.abs().max())
    torch.testing.assert_close(fast.double(), want, rtol=0.0, atol=4 * EPS_BF16 * scale)
    error = float((fast.double() - want).abs().max())
    assert error > float((exact.double() - want).abs().max())


def test_bfloat16_perplexity_and_accuracy_stay_within_bfloat16_rounding():
    """The mean loss moves by less than one bfloat16 epsilon of itself; exact match and
    per-token accuracy of a task are the same up to one example in a hundred."""
    model = _model("rope")
    data = torch.randint(
        0, 256, (5000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2)
    )
    options = {"longest": 256, "max_tokens": 4096, "context": Context()}
    scores = {
        d: perplexity(model, data, 64, dtype=d, **options) for d in (torch.float32, torch.bfloat16)
    }
    exact, fast = scores[torch.float32]["loss"], scores[torch.bfloat16]["loss"]
    assert exact != fast  # the products did change
    assert abs(fast - exact) < EPS_BF16 * exact
    task = Task("copy", 32)
    right = {
        dtype: accuracy(model, task, 32, examples=200, seed=0, context=Context(), dtype=dtype)
        for dtype in (torch.float32, torch.bfloat16)
    }
    for key in ("accuracy", "token_accuracy"):
        assert abs(right[torch.float32][key] - right[torch.bfloat16][key]) <= 0.01


# -------------------------------------------------------------------- command line, files


def test_the_option_reaches_the_runs_and_their_environment(tmp_path: Path):
    assert (
        cli.main(["lab", *TINY, "--out", str(tmp_path / "a"), "--eval-precision", "float32"]) == 0
    )
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    assert results["config"]["eval_precision"] == "float32"
    assert {r["environment"]["eval_dtype"] for r in results["runs"]} == {"float32"}
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('eval-precision = "bfloat16"\n')
    assert cli.main(["lab", *TINY, "--out", str(tmp_path / "b"), "--config", str(sweep)]) == 0
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert {r["environment"]["eval_dtype"] for r in results["runs"]} == {"bfloat16"}


def test_bad_values_are_one_line_and_exit_2(tmp_path: Path, capsys):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('eval-precision = "half"\n')
    assert cli.main(["lab", *TINY, "--out", str(tmp_path / "a"), "--config", str(sweep)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'half'" in err and "Traceback" not in err, err
    assert cli.main(["lab", *TINY, "--out", str(tmp_path / "b"), "--eval-precision", "fp8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'fp8'" in err and "Traceback" not in err, err
