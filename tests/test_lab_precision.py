"""posenc lab's arithmetic (``LabConfig.precision``, ``posenc.lab.precision``): which dtype
``auto`` picks, ``MultiHeadAttention(attention_dtype=)``, bfloat16 logits and gradients
against a float64 model for every encoding the lab can train, perplexity and accuracy
against float32, and the option on the command line and in sweep files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import posenc.attention
from posenc import MultiHeadAttention, cli
from posenc.lab import LabConfig, TinyLM
from posenc.lab.config import resolve_encodings
from posenc.lab.distributed import Context
from posenc.lab.evaluate import accuracy, perplexity
from posenc.lab.precision import autocast, resolve_precision
from posenc.lab.tasks import Task
from posenc.lab.variants import build_encoding

EPS_BF16 = torch.finfo(torch.bfloat16).eps
EPS_FP32 = torch.finfo(torch.float32).eps
CPU = torch.device("cpu")
TINY = ["--quick", "--steps", "4", "--d-model", "16", "--heads", "2", "--eval-tokens", "128",
        "--threads", "1", "--no-progress", "--encodings", "nope"]  # fmt: skip


def _model(name: str, *, dtype: torch.dtype = torch.float32) -> TinyLM:
    config = LabConfig(encodings=(name,), d_model=32, num_heads=2)
    options = {"beyond": "interpolate"} if name == "learned" else {}
    torch.manual_seed(0)
    model = TinyLM(build_encoding(name, config, **options), vocab_size=256, d_model=32,
                   num_layers=2, num_heads=2)  # fmt: skip
    return model.to(dtype)


def _tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------ the dtype chosen


@pytest.mark.parametrize("flags", [(True, False), (False, True), (False, False)])
def test_auto_is_bfloat16_only_where_the_cpu_has_it(monkeypatch, flags):
    avx512_bf16, amx = flags
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    want = torch.bfloat16 if any(flags) else torch.float32
    assert resolve_precision("auto", CPU) == want
    assert resolve_precision("float32", CPU) == torch.float32
    assert resolve_precision("bfloat16", CPU) == torch.bfloat16


def test_auto_is_float32_where_no_check_exists(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert resolve_precision("auto", CPU) == torch.float32
    assert resolve_precision("auto", torch.device("meta")) == torch.float32


def test_unknown_precisions_are_refused_by_name():
    with pytest.raises(ValueError, match="'float16'"):
        resolve_precision("float16", CPU)
    with pytest.raises(ValueError, match=r"precision.*'half'"):
        LabConfig(precision="half")


# -------------------------------------------------------------- attention_dtype, in posenc


@pytest.mark.parametrize("bad", [torch.int32, "float32", 32])
def test_attention_dtype_must_be_a_floating_dtype(bad):
    with pytest.raises(TypeError, match="attention_dtype"):
        MultiHeadAttention(16, 2, attention_dtype=bad)


@pytest.mark.parametrize("position", ["rope", "alibi", "shaw"])
def test_attention_core_runs_in_attention_dtype_under_autocast(monkeypatch, position):
    """With ``attention_dtype=float32`` under a bfloat16 autocast, ``attend`` gets float32
    queries, keys and values while the projections multiply in bfloat16; the result
    is within bfloat16 roundings of a float64 layer."""
    seen = []
    attend = posenc.attention.attend

    def spy(q, k, v, **options):
        seen.append((q.dtype, k.dtype, v.dtype, torch.is_autocast_enabled("cpu")))
        return attend(q, k, v, **options)

    monkeypatch.setattr(posenc.attention.module, "attend", spy)
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 2, position=position, attention_dtype=torch.float32)
    reference = MultiHeadAttention(32, 2, position=position).double()
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(2, 40, 32, generator=torch.Generator().manual_seed(3))
    proj = []
    layer.q_proj.register_forward_hook(lambda module, args, out: proj.append(out.dtype))
    with torch.no_grad():
        want = reference(x.double())
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = layer(x)
    assert seen == [(torch.float32, torch.float32, torch.float32, False)]
    assert proj == [torch.bfloat16]  # the projections did multiply in bfloat16
    scale = float(want.abs().max())
    torch.testing.assert_close(got.double(), want, rtol=0.0, atol=4 * EPS_BF16 * scale)


def test_attention_dtype_float64_on_a_float32_layer():
    """Without autocast: the core in float64, the output back in ``x``'s dtype, equal to
    the float64 layer within float32 roundings."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 2, position="rope", attention_dtype=torch.float64)
    reference = MultiHeadAttention(32, 2, position="rope").double()
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(2, 40, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = layer(x), reference(x.double())
    assert got.dtype == torch.float32
    scale = float(want.abs().max())
    torch.testing.assert_close(got.double(), want, rtol=0.0, atol=16 * EPS_FP32 * scale)
    assert "attention_dtype=torch.float64" in repr(layer)


# -------------------------------------------------------------------- the lab's model in bf16


def test_the_lab_model_sets_the_core_dtype_per_pass(monkeypatch):
    """float32 attention core under the bfloat16 autocast; the weights' own dtype (float64
    here) otherwise, so a float64 model stays a float64 reference."""
    seen = []
    attend = posenc.attention.attend
    monkeypatch.setattr(
        posenc.attention.module,
        "attend",
        lambda q, k, v, **o: seen.append(q.dtype) or attend(q, k, v, **o),
    )
    model, wide = _model("rope"), _model("rope", dtype=torch.float64)
    tokens = _tokens(1, 16)
    with torch.no_grad():
        with autocast(torch.bfloat16, CPU):
            model(tokens)
        assert {b.attn.attention_dtype for b in model.blocks} == {torch.float32}
        model(tokens)
        assert {b.attn.attention_dtype for b in model.blocks} == {None}
        wide(tokens)
    assert seen == [torch.float32] * 4 + [torch.float64] * 2


@pytest.mark.parametrize("name", resolve_encodings(["all"]))
def test_bfloat16_logits_match_a_float64_forward(name):
    """Every encoding the lab can train runs under the lab's bfloat16 autocast with float32
    logits; the error is a few bfloat16 roundings of the logits' scale, and the
    projections really multiplied in bfloat16 (the error exceeds the float32 path's)."""
    model = _model(name).eval()
    reference = _model(name, dtype=torch.float64).eval()
    tokens = _tokens(2, 200)
    seen = []
    model.blocks[0].attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.inference_mode():
        want = reference(tokens)
        exact = model(tokens)
        with autocast(torch.bfloat16, CPU):
            fast = model(tokens)
    assert seen == [torch.float32, torch.bfloat16]
    assert fast.dtype == torch.float32  # logits never rounded to bfloat16
    scale = float(want.abs().max())
    torch.testing.assert_close(fast.double(), want, rtol=0.0, atol=4 * EPS_BF16 * scale)
    error = float((fast.double() - want).abs().max())
    assert error > float((exact.double() - want).abs().max())


@pytest.mark.parametrize("name", ["nope", "sinusoidal", "learned", "rope", "alibi", "t5"])
def test_mixed_precision_gradients_match_float64(name):
    """One training step's gradients under the bfloat16 autocast: every parameter's
    gradient is within four bfloat16 roundings of its float64 value (scaled by the
    largest gradient of that tensor); the loss within one bfloat16 epsilon."""
    model, reference = _model(name), _model(name, dtype=torch.float64)
    tokens = _tokens(4, 65, seed=4)
    with autocast(torch.bfloat16, CPU):
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    want_loss = F.cross_entropy(reference(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    want_loss.backward()
    assert abs(loss.item() - want_loss.item()) < EPS_BF16 * want_loss.item()
    grads = dict(reference.named_parameters())
    for key, param in model.named_parameters():
        want = grads[key].grad
        if want is None or not float(want.abs().max()):
            continue
        scale = float(want.abs().max())
        torch.testing.assert_close(
            param.grad.double(), want, rtol=0.0, atol=4 * EPS_BF16 * scale, msg=key
        )


def test_bfloat16_perplexity_and_accuracy_stay_within_bfloat16_rounding():
    """The mean loss moves by less than one bfloat16 epsilon of itself; a task's accuracy
    runs its products in the dtype asked for, and exact match and per-token accuracy
    agree up to one example in a hundred."""
    model = _model("rope").eval()
    seen = []
    model.blocks[0].attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    data = _tokens(1, 5000, seed=2).flatten().to(torch.uint8)
    options = {"longest": 256, "max_tokens": 4096, "context": Context()}
    scores = {
        d: perplexity(model, data, 64, dtype=d, **options) for d in (torch.float32, torch.bfloat16)
    }
    exact, fast = scores[torch.float32]["loss"], scores[torch.bfloat16]["loss"]
    assert exact != fast  # the products did change
    assert abs(fast - exact) < EPS_BF16 * exact
    task = Task("copy", 32)
    right = {}
    for dtype in (torch.float32, torch.bfloat16):
        seen.clear()
        right[dtype] = accuracy(
            model, task, 32, examples=200, seed=0, context=Context(), dtype=dtype
        )
        assert set(seen) == {dtype}
    for key in ("accuracy", "token_accuracy"):
        assert abs(right[torch.float32][key] - right[torch.bfloat16][key]) <= 0.01


# -------------------------------------------------------------------- command line, files


def test_the_option_reaches_the_runs_and_the_report(tmp_path: Path):
    assert cli.main(["lab", *TINY, "--out", str(tmp_path / "a"), "--precision", "float32"]) == 0
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    assert results["config"]["precision"] == "float32"
    assert {r["environment"]["precision"] for r in results["runs"]} == {"float32"}
    assert "Precision: float32 throughout." in (tmp_path / "a" / "report.md").read_text()
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('precision = "bfloat16"\n')
    assert cli.main(["lab", *TINY, "--out", str(tmp_path / "b"), "--config", str(sweep)]) == 0
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert {r["environment"]["precision"] for r in results["runs"]} == {"bfloat16"}
    assert "bfloat16 mixed precision" in (tmp_path / "b" / "report.md").read_text()


def test_bad_values_are_one_line_and_exit_2(tmp_path: Path, capsys):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('precision = "half"\n')
    assert cli.main(["lab", *TINY, "--out", str(tmp_path / "a"), "--config", str(sweep)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'half'" in err and "Traceback" not in err, err
    assert cli.main(["lab", *TINY, "--out", str(tmp_path / "b"), "--precision", "fp8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'fp8'" in err and "Traceback" not in err, err
