"""Clean held-out text: n-gram overlap against a set of byte strings, near-duplicate files
dropped, the warning, and evaluation segments spread over the held-out files."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import cli
from posenc.lab import load_corpus
from posenc.lab.distributed import Context
from posenc.lab.evaluate import perplexity, segment_starts, window_starts
from posenc.lab.heldout import (
    DUPLICATE,
    NGRAM,
    WARN,
    allocate_segments,
    clean_split,
    ngram_hashes,
    overlap_fraction,
)


def _words(rng: random.Random, count: int) -> bytes:
    vocab = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta", "zeta"]
    return " ".join(rng.choice(vocab) + str(rng.randrange(100)) for _ in range(count)).encode()


def _exact_overlap(held: bytes, train: bytes, n: int) -> float:
    """The reference: byte strings in a set, no hashing."""
    known = {train[i : i + n] for i in range(len(train) - n + 1)}
    windows = [held[i : i + n] for i in range(len(held) - n + 1)]
    return sum(w in known for w in windows) / len(windows) if windows else 0.0


@settings(max_examples=30, deadline=None)
@given(
    train=st.binary(min_size=0, max_size=200).map(lambda b: bytes(x % 3 for x in b)),
    held=st.binary(min_size=0, max_size=120).map(lambda b: bytes(x % 3 for x in b)),
    n=st.sampled_from([8, 16]),
)
def test_overlap_matches_a_set_of_byte_strings(train, held, n):
    # a 3-letter alphabet makes shared windows common
    known = np.sort(ngram_hashes(train, n))
    assert overlap_fraction(ngram_hashes(held, n), known) == pytest.approx(
        _exact_overlap(held, train, n), abs=1e-12
    )


def test_hashes_are_one_per_window_and_bad_lengths_are_refused():
    data = bytes(range(100))
    assert ngram_hashes(data, NGRAM).shape == (101 - NGRAM,)
    assert ngram_hashes(data[: NGRAM - 1]).size == 0
    assert len(set(ngram_hashes(data, 8).tolist())) == 93  # distinct windows, distinct hashes
    for bad in (0, 12):
        with pytest.raises(ValueError, match=str(bad)):
            ngram_hashes(data, bad)


def _corpus(folder, *, copy_of=None, share=0.0, seed=0):
    """20 files of random words; held-out files are 05 and 15. ``copy_of``: file 15 is
    that training file with one word changed; ``share``: file 05 repeats that fraction of
    file 00 at its start."""
    rng = random.Random(seed)
    texts = [_words(rng, 900) for _ in range(20)]
    if copy_of is not None:
        texts[15] = texts[copy_of].replace(b"alpha", b"ALPHA", 1)
    if share:
        cut = int(share * len(texts[5]))
        texts[5] = texts[0][:cut] + texts[5][cut:]
    folder.mkdir()
    for i, text in enumerate(texts):
        (folder / f"doc{i:02d}.txt").write_bytes(text)
    return folder


def test_a_near_duplicate_held_out_file_is_dropped_and_counted(tmp_path):
    corpus = load_corpus(_corpus(tmp_path / "c", copy_of=3))
    clean = corpus.describe()["heldout"]
    assert corpus.heldout_files == ("doc05.txt",)
    assert list(clean["dropped"]) == ["doc15.txt"] and clean["dropped"]["doc15.txt"] >= DUPLICATE
    assert clean["overlap_before"] > 0.4 and clean["overlap"] < WARN
    assert not clean["contaminated"]
    assert corpus.heldout_bounds == ((0, corpus.heldout.numel()),)
    raw = (tmp_path / "c" / "doc05.txt").read_bytes()
    assert bytes(corpus.heldout.tolist()) == raw


def test_all_held_out_files_duplicated_is_refused():
    train = [("a", _words(random.Random(1), 300))]
    with pytest.raises(ValueError, match="every held-out file repeats the training text"):
        clean_split(train, [("b", train[0][1])])


def test_overlap_above_the_threshold_is_flagged_and_reported(tmp_path, capsys):
    folder = _corpus(tmp_path / "c", share=0.3)
    clean = load_corpus(folder).describe()["heldout"]
    assert not clean["dropped"] and clean["contaminated"]
    assert clean["overlap"] == pytest.approx(0.3 / 2, abs=0.02)  # one of two files
    out = tmp_path / "out"
    options = ["--quick", "--encodings", "nope", "--steps", "2", "--d-model", "16", "--heads",
               "2", "--eval-tokens", "256", "--eval-lens", "32,64", "--threads", "1",
               "--no-progress", "--corpus", str(folder), "--out", str(out)]  # fmt: skip
    assert cli.main(["lab", *options]) == 0
    assert "WARNING" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["data"]["heldout"]["contaminated"]
    assert results["runs"][0]["heldout"] == results["data"]["heldout"]
    report = (out / "report.md").read_text()
    assert "**Warning:" in report and "occur verbatim in the training text" in report
    assert "Evaluation text: 4 segments of 64 bytes from 2 held-out files" in report


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=8), st.integers(0, 60))
def test_water_filling_spreads_segments(capacities, count):
    given_ = allocate_segments(capacities, count)
    assert sum(given_) == min(count, sum(capacities))
    assert all(0 <= g <= c for g, c in zip(given_, capacities, strict=True))
    for i, gi in enumerate(given_):  # a file with room never trails another by more than one
        if gi < capacities[i]:
            assert all(gj <= gi + 1 for gj in given_)


def test_segments_stay_inside_their_files():
    bounds = ((0, 5000), (5001, 5300), (5301, 20000))
    starts = segment_starts(bounds, 256, 256 * 12).tolist()
    per_file = [sum(a <= s and s + 257 <= b for s in starts) for a, b in bounds]
    assert per_file == [6, 1, 5]  # the small file has room for one; then in file order
    assert len(starts) == 12 and sorted(starts) == starts
    assert all(b - a >= 256 for a, b in itertools.pairwise(starts))  # segments do not overlap
    one = window_starts(5000, 64, longest=256, max_tokens=2048)
    assert torch.equal(one, window_starts(5000, 64, longest=256, max_tokens=2048,
                                          bounds=((0, 5000),)))  # fmt: skip


def test_segment_losses_average_to_the_loss():
    torch.manual_seed(0)
    table = torch.randn(256, 256)

    class Bigram(torch.nn.Module):
        def forward(self, tokens):
            return table[tokens]

    data = torch.randint(0, 256, (3000,), dtype=torch.uint8)
    bounds = ((0, 1400), (1401, 3000))
    for length in (32, 128):
        out = perplexity(Bigram(), data, length, longest=128, max_tokens=1024,
                         context=Context(), bounds=bounds)  # fmt: skip
        assert len(out["segments"]) == 8  # 5 + 3 fit, 4 + 4 given
        assert np.mean(out["segments"]) == pytest.approx(out["loss"], abs=1e-5)
