"""Seed-level inference: the exact sign-flip test over seeds against enumeration in
float64, its properties, the hierarchical bootstrap against the exactly enumerated
resampling distribution, and the issue's case where the text says significant and the
seeds do not."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.lab.claims import comparisons_record, pairwise_lines, sentence
from posenc.lab.config import DEFAULT_SEEDS
from posenc.lab.pairwise import compare_all, file_groups
from posenc.lab.seedlevel import (
    EXACT_SEEDS,
    SEED_FLIPS,
    floor,
    hierarchical_bootstrap,
    seed_sign_flip_tests,
    seeds_needed,
)

_SEEDS = st.lists(st.integers(-40, 40), min_size=1, max_size=8)


def _enumerated(d: np.ndarray) -> float:
    """Every sign pattern in float64: the share whose |sum| reaches the observed one."""
    observed = abs(d.sum())
    patterns = itertools.product((-1.0, 1.0), repeat=d.size)
    return float(np.mean([abs(np.dot(s, d)) >= observed - 1e-12 for s in patterns]))


@settings(max_examples=40, deadline=None)
@given(_SEEDS)
def test_seed_test_is_the_enumerated_share(values):
    d = np.asarray(values, dtype=np.float64) / 16  # exact in binary: ties are exact ties
    (p,) = seed_sign_flip_tests(d[None, :])
    want = 1.0 if not d.any() else _enumerated(d)
    assert p == want
    assert floor(d.size) <= p <= 1.0  # in (0, 1], never below 2 / 2**S


@settings(max_examples=40, deadline=None)
@given(_SEEDS, st.floats(0.001, 1000.0))
def test_seed_test_is_symmetric_and_scale_free(values, scale):
    d = np.asarray(values, dtype=np.float64) / 16
    p = seed_sign_flip_tests(np.stack([d, -d, scale * d]))
    assert p[0] == p[1] == p[2]  # swapping the rows negates every difference


def test_the_issues_per_seed_differences_give_three_quarters():
    # |sum| = 0.023; of the 8 sign patterns only +-(0.037 - 0.019 - 0.041) stay below it
    p = seed_sign_flip_tests(np.array([[0.037, -0.019, -0.041]]))
    assert p.tolist() == [0.75]
    assert floor(3) == 0.25 and floor(6) == 2 / 64 < 0.05 < floor(5)


def test_seeds_needed_for_a_claim():
    assert seeds_needed() == 6  # 2 / 2**6 = 0.031 < 0.05 <= 2 / 2**5
    assert len(DEFAULT_SEEDS) == seeds_needed()  # the default sweep can make a claim
    for m in (1, 10, 448):
        s = seeds_needed(m)
        assert m * floor(s) < 0.05 <= m * floor(s - 1)
    assert seeds_needed(448) == 15
    with pytest.raises(ValueError, match="comparisons"):
        seeds_needed(0)


def test_beyond_exact_seeds_random_patterns_give_a_valid_p():
    rng = np.random.default_rng(4)
    seeds = EXACT_SEEDS + 2
    shifted = rng.normal(1.0, 0.1, (1, seeds))  # exact p: 2 / 2**18, about 1.5 hits expected
    (p,) = seed_sign_flip_tests(shifted)
    hits = p * (1 + SEED_FLIPS) - 1
    assert hits == pytest.approx(round(hits)) and 0 <= round(hits) <= 8  # Poisson(1.5)
    assert seed_sign_flip_tests(np.r_[np.ones(9), -np.ones(9)][None]).tolist() == [1.0]
    assert floor(seeds) == 1 / (1 + SEED_FLIPS)
    with pytest.raises(ValueError, match="finite"):
        seed_sign_flip_tests(np.array([[1.0, math.inf]]))


def _exact_distribution(diff: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Every equally likely two-stage resample (seeds, then files in each drawn seed):
    the mean over drawn seeds of the mean over drawn files' units, in float64."""
    seeds, files = diff.shape[0], groups.max() + 1
    out = []
    for drawn in itertools.product(range(seeds), repeat=seeds):
        per_seed_choices = []
        for s in drawn:
            choices = []
            for picked in itertools.product(range(files), repeat=files):
                units = np.concatenate([diff[s, groups == f] for f in picked])
                choices.append(units.mean())
            per_seed_choices.append(choices)
        out += [np.mean(c) for c in itertools.product(*per_seed_choices)]
    return np.asarray(out)


def test_hierarchical_bootstrap_draws_the_enumerated_distribution():
    diff = np.array([[0.1, 0.3, -0.2], [0.5, 0.4, 0.9]])  # 2 seeds, files {0, 1} and {2}
    groups = np.array([0, 0, 1])
    exact = _exact_distribution(diff, groups)  # 2**2 seed draws x (2**2)**2 file draws
    seen = []

    def keep(means):
        seen.append(means.mean(1))
        return means.mean(1)

    low, high = hierarchical_bootstrap(diff, keep, groups=groups, resamples=20000)
    drawn = seen[0]
    se = exact.std() / math.sqrt(drawn.size)
    assert drawn.mean() == pytest.approx(exact.mean(), abs=4 * se)
    assert drawn.std() == pytest.approx(exact.std(), rel=0.05)
    assert set(np.round(drawn, 12)) <= set(np.round(exact, 12))
    assert (low, high) == pytest.approx(tuple(np.percentile(exact, [2.5, 97.5])), abs=0.06)


def test_files_are_resampled_whole():
    rng = np.random.default_rng(5)
    per_file = rng.normal(0.0, 1.0, (4, 10))  # 4 seeds, 10 files
    repeated = np.repeat(per_file, 3, axis=1)  # each file: 3 identical segments
    groups = np.repeat(np.arange(10), 3)
    mean = lambda m: m.mean(1)  # noqa: E731
    clustered = hierarchical_bootstrap(repeated, mean, groups=groups)
    assert clustered == pytest.approx(hierarchical_bootstrap(per_file, mean))
    with pytest.raises(ValueError, match="one file label per unit"):
        hierarchical_bootstrap(repeated, mean, groups=groups[:-1])


def _results(per_seed: list[float], *, segments: int = 48, files: int = 12) -> dict:
    """Two rows on the same segments: ``b``'s loss minus ``a``'s is ``per_seed[s]`` plus
    small segment noise; the segments come from ``files`` files."""
    rng = np.random.default_rng(6)
    runs = []
    for seed, offset in enumerate(per_seed):
        a = rng.normal(2.0, 0.3, segments)
        b = a + offset + rng.normal(0.0, 0.005, segments)
        rows = [
            {"label": label, "kind": "trained", "results": {"64": {"segments": units.tolist()}}}
            for label, units in (("a", a), ("b", b))
        ]
        runs.append({"encoding": "x", "seed": seed, "status": "ok", "rows": rows})
    per_file = {f"f{i}.py": segments // files for i in range(files)}
    return {
        "metric": "ppl",
        "config": {"eval_lens": [64], "train_len": 64},
        "runs": runs,
        "seeds": list(range(len(per_seed))),
        "data": {"segments": {"per_file": per_file}},
    }


def test_text_says_significant_where_the_seeds_do_not():
    (c,) = compare_all(_results([0.037, -0.019, -0.041]))
    assert (c.first, c.second) == ("b", "a")  # b's mean loss is lower over all
    assert c.p_seed == 0.75 and not c.separated
    assert c.p_holm < 0.05  # 144 (seed, segment) pairs: the text-sampling test calls it
    assert c.wins == 2 and c.seeds == 3
    assert c.seed_low < 1.0 < c.seed_high  # the hierarchical interval covers no difference
    assert "significant on this text, not across seeds" in sentence(c)
    assert "smallest possible with 3 seeds: 0.25" in sentence(c)
    record = json.loads(json.dumps(comparisons_record([c])))
    assert record[0]["p_seed"] == 0.75 and record[0]["separated"] is False
    assert record[0]["p_holm"] < 0.05 and record[0]["seed_floor"] == 0.25
    text = "\n".join(pairwise_lines(_results([0.037, -0.019, -0.041]), [c]))
    assert "0 of 1 pairs separated across seeds (1 significant on this text)" in text


def test_per_seed_and_per_file_constants_added_to_both_rows_change_nothing():
    results = _results([0.03, 0.02, 0.05, 0.04, 0.01, 0.06])
    (before,) = compare_all(results)
    groups = file_groups(results, 48)
    for seed, run in enumerate(results["runs"]):
        shift = 0.7 * seed + 0.1 * groups  # a seed's and a file's offset, the same in both rows
        for row in run["rows"]:
            units = np.asarray(row["results"]["64"]["segments"])
            row["results"]["64"]["segments"] = (units + shift).tolist()
    (after,) = compare_all(results)
    assert after.p_seed == before.p_seed == 2 / 2**6
    assert after.separated and before.separated
    assert (after.seed_low, after.seed_high) == pytest.approx((before.seed_low, before.seed_high))
    assert after.p == pytest.approx(before.p)


def test_file_groups_follow_the_recorded_files():
    results = _results([0.01])
    assert file_groups(results, 48).tolist() == np.repeat(np.arange(12), 4).tolist()
    assert file_groups(results, 47) is None  # records that do not match: no clusters
    assert file_groups({**results, "metric": "accuracy"}, 48) is None
