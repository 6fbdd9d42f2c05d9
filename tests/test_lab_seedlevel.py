"""Seed-level inference: the mixed-effects model against least-squares ANOVA, scipy's
t-test and simulated data (its level and coverage, where the unit-level test fails),
the exact sign-flip test over seeds against enumeration in float64, and the issue's
case where the text says significant and the seeds do not."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from posenc.lab.claims import comparisons_record, pairwise_lines, sentence
from posenc.lab.config import DEFAULT_SEEDS
from posenc.lab.pairwise import compare_all, file_groups
from posenc.lab.seedlevel import (
    EXACT_SEEDS,
    SEED_FLIPS,
    floor,
    mixed_model_test,
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


def _anova_by_least_squares(cells: np.ndarray) -> tuple[float, float, float]:
    """Mean squares of seeds, files and residual of a two-way table, each from the
    residual sums of squares of nested least-squares fits (a route independent of the
    row and column means the library uses)."""
    seeds, files = cells.shape
    y = cells.ravel()
    one = np.ones((y.size, 1))
    seed = np.kron(np.eye(seeds), np.ones((files, 1)))[:, 1:]
    file = np.kron(np.ones((seeds, 1)), np.eye(files))[:, 1:]

    def rss(*parts):
        x = np.hstack(parts)
        return float(np.sum((y - x @ np.linalg.lstsq(x, y, rcond=None)[0]) ** 2))

    full = rss(one, seed, file)
    ms_a = (rss(one, file) - full) / (seeds - 1)
    ms_c = (rss(one, seed) - full) / (files - 1)
    return ms_a, ms_c, full / ((seeds - 1) * (files - 1))


def test_crossed_model_is_the_anova_variance_with_satterthwaite_df():
    rng = np.random.default_rng(11)
    seeds, files = 6, 9
    cells = (
        0.05
        + rng.normal(0, 0.04, (seeds, 1))
        + rng.normal(0, 0.03, (1, files))
        + rng.normal(0, 0.01, (seeds, files))
    )
    diff = np.repeat(cells, 3, axis=1)  # 3 segments per file, equal weights
    groups = np.repeat(np.arange(files), 3)
    ms_a, ms_c, ms_e = _anova_by_least_squares(cells)
    assert ms_a > ms_e and ms_c > ms_e  # no component clamped in this draw
    var = (ms_a + ms_c - ms_e) / (seeds * files)
    df = var**2 / (
        (ms_a / (seeds * files)) ** 2 / (seeds - 1)
        + (ms_c / (seeds * files)) ** 2 / (files - 1)
        + (ms_e / (seeds * files)) ** 2 / ((seeds - 1) * (files - 1))
    )
    got = mixed_model_test(diff, groups=groups, crossed=True)
    assert got.estimate == pytest.approx(cells.mean(), rel=1e-12)
    assert got.se == pytest.approx(math.sqrt(var), rel=1e-10)
    assert got.df == pytest.approx(df, rel=1e-10)
    t = got.estimate / got.se
    assert got.p == pytest.approx(2 * stats.t.sf(abs(t), df), rel=1e-10)
    half = stats.t.ppf(0.975, df) * got.se
    assert (got.low, got.high) == pytest.approx((got.estimate - half, got.estimate + half))


def test_nested_model_is_the_t_test_of_the_seed_means():
    rng = np.random.default_rng(12)
    diff = rng.normal(0.2, 1.0, (6, 40)) + rng.normal(0, 0.3, (6, 1))
    got = mixed_model_test(diff, crossed=False)
    want = stats.ttest_1samp(diff.mean(1), 0.0)
    assert got.p == pytest.approx(want.pvalue, rel=1e-10) and got.df == 5
    interval = want.confidence_interval(0.95)
    assert (got.low, got.high) == pytest.approx((interval.low, interval.high), rel=1e-10)
    one_file = mixed_model_test(diff, groups=np.zeros(40), crossed=True)
    assert one_file.p == pytest.approx(want.pvalue, rel=1e-10)  # one file: no file effect


def test_model_edge_cases():
    one = mixed_model_test(np.full((1, 5), 0.3), crossed=True)
    assert one.p == 1.0 and math.isinf(one.high)  # one seed: no seed-level claim
    assert mixed_model_test(np.zeros((6, 4)), crossed=False).p == 1.0
    same = mixed_model_test(np.full((6, 4), 0.5), crossed=True)
    assert same.p == 0.0 and same.low == same.high == 0.5
    with pytest.raises(ValueError, match="finite"):
        mixed_model_test(np.array([[1.0, math.nan]]), crossed=True)
    with pytest.raises(ValueError, match="one file label per unit"):
        mixed_model_test(np.ones((2, 4)), groups=np.arange(3), crossed=True)


def _simulate(rng, seeds, files, per_file, *, mu, seed_sd, file_sd):
    """Per-segment differences with a seed effect, a file effect shared by every seed
    (the same held-out text), a seed-by-file effect and segment noise."""
    cells = (
        mu
        + rng.normal(0, seed_sd, (seeds, 1))
        + rng.normal(0, file_sd, (1, files))
        + rng.normal(0, 0.02, (seeds, files))
    )
    return np.repeat(cells, per_file, axis=1) + rng.normal(0, 0.05, (seeds, files * per_file))


@pytest.mark.parametrize(("seed_sd", "file_sd"), [(0.03, 0.01), (0.005, 0.04), (0.02, 0.02)])
def test_model_holds_its_level_and_coverage_where_the_text_test_does_not(seed_sd, file_sd):
    rng = np.random.default_rng(13)
    seeds, files, per_file, trials = 6, 12, 4, 1500
    groups = np.repeat(np.arange(files), per_file)
    rejected = covered = naive = 0
    for _ in range(trials):
        d = _simulate(rng, seeds, files, per_file, mu=0.0, seed_sd=seed_sd, file_sd=file_sd)
        got = mixed_model_test(d, groups=groups, crossed=True)
        rejected += got.p < 0.05
        covered += got.low <= 0.0 <= got.high
        naive += stats.ttest_1samp(d.ravel(), 0.0).pvalue < 0.05  # units as independent
    # Satterthwaite's t is an approximation: its level within 0.035-0.075 over 1500 draws
    # (binomial sd 0.0056 at 0.05) and coverage to match; the unit-level test rejects
    # several times as often
    assert 0.035 <= rejected / trials <= 0.075
    assert covered / trials == pytest.approx(1 - rejected / trials)
    assert naive / trials > 3 * rejected / trials


def test_model_finds_a_consistent_difference_below_the_sign_flip_floor():
    rng = np.random.default_rng(14)
    d = _simulate(rng, 6, 12, 4, mu=0.1, seed_sd=0.01, file_sd=0.01)
    got = mixed_model_test(d, groups=np.repeat(np.arange(12), 4), crossed=True)
    (flip,) = seed_sign_flip_tests(d.mean(1)[None])
    assert flip == floor(6) and got.p < floor(6) / 1000  # no floor: claims can be ranked


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
    assert c.p_seed > 0.5 and c.p_flip == 0.75 and not c.separated
    assert c.p_holm < 0.05  # 144 (seed, segment) pairs: the text-sampling test calls it
    assert c.wins == 2 and c.seeds == 3
    assert c.seed_low < 1.0 < c.seed_high  # the model's interval covers no difference
    assert "significant on this text, not across seeds" in sentence(c)
    assert "sign flips: p = 0.75, uncorrected" in sentence(c)
    record = json.loads(json.dumps(comparisons_record([c])))
    assert record[0]["p_seed"] == c.p_seed and record[0]["separated"] is False
    assert record[0]["p_holm"] < 0.05 and record[0]["flip_floor"] == 0.25
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
    assert after.p_flip == before.p_flip == 2 / 2**6
    assert after.p_seed == pytest.approx(before.p_seed, rel=1e-9) and after.p_seed < 0.01
    assert after.separated and before.separated
    assert (after.seed_low, after.seed_high) == pytest.approx((before.seed_low, before.seed_high))
    assert after.p == pytest.approx(before.p)


def test_file_groups_follow_the_recorded_files():
    results = _results([0.01])
    assert file_groups(results, 48).tolist() == np.repeat(np.arange(12), 4).tolist()
    assert file_groups(results, 47) is None  # records that do not match: no clusters
    assert file_groups({**results, "metric": "accuracy"}, 48) is None
