"""posenc lab as a research instrument: baselines configured as their papers define them,
statistics over seeds, evaluation (sliding windows, loss by position, passkey), the
second corpus and the fixed plot styles."""

from __future__ import annotations

import itertools
import json
import math
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor, nn

import posenc.lab.runs
import posenc.lab.workload
from posenc import cli, t5_relative_position_bucket
from posenc.lab import LabConfig, Task, TinyLM
from posenc.lab.corpus import FORTUNES, load_corpus
from posenc.lab.distributed import Context
from posenc.lab.evaluate import perplexity, window_starts
from posenc.lab.model import LEARNED_STD, seeded_model
from posenc.lab.runs import CHECK_STREAM
from posenc.lab.stats import Cell, Row, chain, paired_wins, t_quantile
from posenc.lab.tasks import DEPTHS
from posenc.lab.variants import build_encoding, variants
from posenc.palette import ENCODING_STYLES, style

# ----------------------------------------------------------------------------- baselines


@pytest.mark.parametrize("length", [64, 128, 1024])
def test_dynamic_ntk_uses_its_own_factor(length):
    """transformers: base * ((factor * L / L0) - (factor - 1)) ** (d / (d - 2)) once
    L > L0, with factor the configured hyperparameter, not L / L0."""
    config = LabConfig(encodings=("rope",))
    (dynamic,) = [v for v in variants("rope", config) if v.label == "rope +dynamic"]
    rope = build_encoding("rope", config, **dynamic.options(length / config.train_len))
    q = torch.zeros(1, 1, length, config.head_dim)
    rope(q, q)  # dynamic NTK computes its frequencies from the length it sees
    d, base, f, l0 = config.head_dim, 10000.0, config.dynamic_factor, config.train_len
    if length > l0:
        base = base * ((f * length / l0) - (f - 1)) ** (d / (d - 2))
    want = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    got = rope.inv_freq.double().numpy()
    np.testing.assert_allclose(got, want, rtol=torch.finfo(torch.float32).eps)


def test_t5_max_distance_lets_every_bucket_train():
    config = LabConfig(encodings=("t5",))
    t5 = build_encoding("t5", config)
    distances = -torch.arange(config.train_len)  # key before query: what training sees
    buckets = t5_relative_position_bucket(
        distances, bidirectional=False, num_buckets=32, max_distance=config.t5_distance
    )
    assert config.t5_distance == config.train_len
    assert set(buckets.tolist()) == set(range(32))
    assert t5.max_distance == config.train_len


def _shared(model: TinyLM) -> dict[str, torch.Tensor]:
    """Every parameter that is not the encoding's (the encoding is one module shared by
    the blocks, so its parameters are listed once, under ``encoding.``)."""
    own = {id(p) for p in model.encoding.parameters()}
    return {n: p.detach() for n, p in model.named_parameters() if id(p) not in own}


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "rope", "alibi", "t5", "fire", "cope"])
def test_same_seed_same_shared_weights_whatever_the_encoding(name):
    config = LabConfig(encodings=(name,), d_model=32, num_heads=2)
    shape = {"vocab_size": 256, "d_model": 32, "num_layers": 2, "num_heads": 2}
    nope = seeded_model(lambda: build_encoding("nope", config), seed=3, **shape)
    other = seeded_model(lambda: build_encoding(name, config), seed=3, **shape)
    assert list(_shared(nope)) == list(_shared(other))
    for key, value in _shared(nope).items():
        assert torch.equal(value, _shared(other)[key]), key
    seed4 = seeded_model(lambda: build_encoding(name, config), seed=4, **shape)
    assert not torch.equal(_shared(seed4)["embedding.weight"], _shared(other)["embedding.weight"])


def test_learned_table_starts_as_gpt2s():
    config = LabConfig(encodings=("learned",))
    model = seeded_model(lambda: build_encoding("learned", config), seed=0, vocab_size=256,
                         d_model=96, num_layers=1, num_heads=4)  # fmt: skip
    n = model.encoding.weight.numel()
    tolerance = 5 / math.sqrt(2 * n)  # five standard errors of a sample standard deviation
    assert abs(float(model.encoding.weight.detach().std()) / LEARNED_STD - 1.0) < tolerance
    assert abs(float(model.embedding.weight.detach().std()) - 1.0) < 5 / math.sqrt(2 * 256 * 96)


def test_default_sweep_has_seeds_interpolated_learned_and_pi_fine_tune():
    config = LabConfig()
    assert len(config.seeds) >= 3
    assert "learned +interpolate" in [v.label for v in variants("learned", config)]
    assert config.finetune_steps >= 100 and config.finetune_scalings == ("linear",)
    assert config.tuned_len == 4 * config.train_len
    assert config.eval_tokens >= 10 * 16384


# ----------------------------------------------------------------------------- statistics


def _t_cdf(x: float, df: int) -> float:
    """Student's t CDF by Simpson's rule on its density (float64 reference)."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    grid = np.linspace(0.0, x, 20001)
    density = np.exp(log_norm - (df + 1) / 2 * np.log1p(grid**2 / df))
    h = grid[1] - grid[0]
    inner = 4 * density[1:-1:2].sum() + 2 * density[2:-1:2].sum()
    area = h / 3 * (density[0] + density[-1] + inner)
    return 0.5 + float(area)


@pytest.mark.parametrize("df", [1, 2, 5, 10, 11, 30, 200])
def test_t_quantile_matches_the_t_distribution(df):
    assert _t_cdf(t_quantile(df), df) == pytest.approx(0.975, abs=2e-4)


@given(st.lists(st.floats(1.0, 100.0), min_size=1, max_size=8))
def test_cell_mean_and_interval(values):
    cell = Cell(dict(enumerate(values)))
    assert cell.mean == pytest.approx(statistics.fmean(values), rel=1e-12)
    if len(values) == 1:
        assert cell.half_width is None
        return
    want = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    assert cell.half_width == pytest.approx(want, rel=1e-9, abs=1e-12)


@given(
    st.lists(
        st.lists(st.floats(1.0, 10.0), min_size=4, max_size=4).map(tuple), min_size=2, max_size=5
    ),
    st.booleans(),
)
def test_chain_states_an_ordering_only_where_it_holds_in_every_seed(per_row, higher):
    table = [
        Row(f"r{i}", {"64": Cell(dict(enumerate(values)))}) for i, values in enumerate(per_row)
    ]
    ranked = chain(table, "64", higher=higher)
    by_label = {r.label: r for r in table}
    assert sorted(label for label, _ in ranked) == sorted(by_label)
    for (label, holds), (after, _) in itertools.pairwise(ranked):
        a, b = by_label[label].cells["64"], by_label[after].cells["64"]
        wins, both = paired_wins(a, b, higher=higher)
        better = [(x > y) if higher else (x < y) for x, y in zip(a.present, b.present, strict=True)]
        assert wins == sum(better) and both == 4
        assert holds == all(better)


# ----------------------------------------------------------------------------- evaluation


class _Uniformish(nn.Module):
    """Logits that depend on the token and its position only (a fixed random table)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))

    def forward(self, tokens: Tensor) -> Tensor:
        return self.table[tokens] * 0.1


@pytest.mark.parametrize("stride", [8, 16, 32])
def test_sliding_windows_score_the_same_bytes(stride):
    data_len, length, longest = 3000, 32, 64
    plain = window_starts(data_len - longest, length, longest=longest, max_tokens=512)
    slide = window_starts(data_len, length, longest=longest, max_tokens=512, stride=stride)
    scored = {int(s) + 1 + i for s in slide for i in range(length - stride, length)}
    assert len(scored) == slide.numel() * stride  # no byte scored twice
    assert scored == {longest + int(s) + 1 + i for s in plain for i in range(length)}
    assert int(slide.min()) >= 0 and int(slide.max()) + length < data_len


def test_loss_by_position_averages_to_the_loss_and_stride_of_a_window_is_plain():
    data = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(1))
    data = data.to(torch.uint8)
    model, ctx = _Uniformish(), Context()
    out = perplexity(model, data, 64, longest=64, max_tokens=1024, context=ctx, by_position=True)
    assert len(out["position_loss"]) == 64
    assert statistics.fmean(out["position_loss"]) == pytest.approx(out["loss"], rel=1e-12)
    # a position-blind model: every position has about the same loss
    spread = max(out["position_loss"]) - min(out["position_loss"])
    assert spread < 1.0
    full = perplexity(model, data, 64, longest=64, max_tokens=1024, context=ctx, stride=64)
    shifted = perplexity(model, data[64:], 64, longest=64, max_tokens=1024, context=ctx)
    assert full["loss"] == pytest.approx(shifted["loss"], rel=1e-12)


@given(length=st.integers(16, 64), seed=st.integers(0, 1000))
def test_passkey_hides_the_key_at_each_depth(length, seed):
    task = Task("passkey", 64)
    inputs, targets = task.batch(len(DEPTHS), length, torch.Generator().manual_seed(seed),
                                 exact=True)  # fmt: skip
    filler = task.size(length)
    for row, depth in enumerate(DEPTHS):
        seq = inputs[row]
        key = int((seq == task.vocab_size - 2).nonzero()[0])
        assert key == round(depth * filler)
        scored = targets[row] != -100
        assert torch.equal(targets[row][scored], seq[key + 1 : key + 6])


# ----------------------------------------------------------------------------- corpora


@pytest.mark.skipif(not FORTUNES.is_dir(), reason="Debian's fortunes package is not installed")
def test_fortunes_corpus_is_english_prose_named_and_hashed():
    corpus = load_corpus("fortunes")
    assert corpus.source == "fortunes" and len(corpus.sha256) == 64
    assert corpus.heldout.numel() > 165_000  # 160 segments of 1024 bytes
    text = bytes(corpus.train[:20000].tolist()).decode()
    assert text.count(" the ") > 50 and "def " not in text[:2000]
    assert not any(name.endswith((".dat", ".u8")) for name in corpus.train_files)


def test_a_named_corpus_that_is_also_a_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fortunes").mkdir()
    with pytest.raises(ValueError, match="both a named corpus and a path"):
        load_corpus("fortunes")


# ----------------------------------------------------------------------------- plot styles


def test_every_encoding_has_its_own_colour_and_marker():
    pairs = list(ENCODING_STYLES.values())
    assert len(set(pairs)) == len(pairs)
    assert len({c for c, _ in pairs}) == len(pairs)
    labels = ["nope", "sinusoidal", "learned", "learned +interpolate", "rope", "rope +linear",
              "rope +ntk", "rope +dynamic", "rope +yarn", "rope +ft", "rope +linear +ft",
              "alibi", "t5"]  # fmt: skip
    looks = [style(label) for label in labels]
    assert len(set(looks)) == len(looks)  # every row of the default sweep is distinct
    assert style("rope +yarn") == style("rope +yarn")
    assert style("my-encoding") == style("my-encoding")


# ----------------------------------------------------------------------------- bench


def test_bench_lab_measures_every_default_encoding():
    from posenc.bench.lab import lab_groups
    from posenc.lab.config import DEFAULT_ENCODINGS

    groups = lab_groups(quick=True, repeats=1, warmup=0)
    assert [g.suite for g in groups] == ["lab", "lab"]
    bf16 = [f"{name} bf16" for name in DEFAULT_ENCODINGS]
    want = [n for pair in zip(DEFAULT_ENCODINGS, bf16, strict=True) for n in pair]
    for group in groups:  # training step; evaluation forward, each in float32 and bf16
        assert list(group.stats) == want and group.floor == "nope"
        rates = group.info["tokens_per_second"]
        assert set(rates) == set(want) and all(r > 0 for r in rates.values())


def test_stopping_checks_score_their_own_examples(tmp_path, monkeypatch):
    seen: list[tuple[int, int]] = []
    real = posenc.lab.workload.accuracy

    def spy(model, task, length, *, seed, **options):
        seen.append((length, seed))
        return real(model, task, length, seed=seed, **options)

    monkeypatch.setattr(posenc.lab.workload, "accuracy", spy)
    options = ["--task", "copy", "--encodings", "alibi", "--train-len", "8", "--eval-lens", "8",
               "16", "--steps", "8", "--max-steps", "16", "--d-model", "16", "--heads", "2",
               "--eval-examples", "8", "--threads", "1", "--no-progress", "--seeds", "1",
               "--seed", "3"]  # fmt: skip
    assert cli.main(["lab", *options, "--out", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    checks = [seed for length, seed in seen if seed != 3]
    assert checks and set(checks) == {CHECK_STREAM + 3}  # never the reported examples
    assert {length for length, seed in seen if seed == 3} == {8, 16}  # the columns
    assert len(checks) == len(run["train"]["checks"])
    assert run["learned"] == (run["train"]["checks"][-1][1] >= posenc.lab.runs.LEARNED)


def test_chain_of_a_length_without_values_is_empty():
    # every run unlearned: rows exist but no cell has a value
    row = Row("alibi", {"16": Cell({0: None, 1: None})})
    assert chain([row], "16", higher=True) == []
    assert chain([], "16", higher=False) == []
