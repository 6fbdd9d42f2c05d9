"""The lab's statistics: the permutation test against enumeration, Wilson's interval
against the roots of its quadratic, Holm's correction on a worked case, the bootstrap
against normal theory, and the pairwise comparisons of a report."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.lab.claims import sentence
from posenc.lab.pairwise import cell_interval, compare_all
from posenc.lab.significance import (
    EXACT_UNITS,
    PERMUTATIONS,
    Z975,
    bootstrap,
    holm,
    sign_flip_test,
    sign_flip_tests,
    wilson_interval,
)


def _enumerated_p(d: np.ndarray) -> float:
    """Every sign flip, in float64: the share whose |sum| reaches the observed one."""
    observed = abs(d.sum())
    flips = [
        abs(np.dot(s, d)) >= observed - 1e-9 for s in itertools.product((-1, 1), repeat=d.size)
    ]
    return float(np.mean(flips))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(-24, 24), min_size=1, max_size=10))
def test_permutation_p_is_the_enumerated_share(values):
    d = np.asarray(values) / 8  # multiples of 1/8: ties are exact ties in any precision
    if np.abs(d).sum() == 0:
        assert sign_flip_test(d) == 1.0
        return
    assert sign_flip_test(d) == pytest.approx(_enumerated_p(d), abs=1e-12)


def test_permutation_p_on_a_worked_case():
    # five differences of +1 and one of -1, observed sum 4. With a of the five kept +1 the
    # five sum to 2a - 5; |sum| >= 4 needs a in {0, 5} (either sign of the sixth: 4
    # flips) or a in {1, 4} with the sixth of the same sign (5 + 5 flips): 14 of 64.
    d = np.array([1.0, 1.0, 1.0, 1.0, 1.0, -1.0])
    assert sign_flip_test(d) == pytest.approx(14 / 64)


def test_random_flips_give_a_valid_p_value():
    rng = np.random.default_rng(1)
    shifted = rng.normal(0.5, 1.0, 200)
    assert sign_flip_test(shifted) == pytest.approx(1 / (1 + PERMUTATIONS))
    mirror = np.concatenate([shifted, -shifted])  # mean exactly 0
    assert sign_flip_test(mirror) == 1.0
    nulls = sign_flip_tests(rng.normal(0.0, 1.0, (200, 40)))  # 200 tests under the null
    assert 0.02 <= np.mean(nulls <= 0.05) <= 0.10  # level about 5 % (binomial sd 1.5 %)
    rows = rng.normal(0.1, 1.0, (3, EXACT_UNITS + 1))
    assert sign_flip_tests(rows).tolist() == [sign_flip_test(r) for r in rows]
    with pytest.raises(ValueError, match="finite"):
        sign_flip_test([1.0, float("nan")])


@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_is_the_roots_of_its_quadratic(case):
    k, n = case
    p = k / n
    # (p - x)^2 = z^2 x (1 - x) / n  <=>  (1 + z^2/n) x^2 - (2p + z^2/n) x + p^2 = 0
    z2n = Z975**2 / n
    a, b, c = 1 + z2n, -(2 * p + z2n), p * p
    disc = math.sqrt(max(0.0, b * b - 4 * a * c))
    want = ((-b - disc) / (2 * a), (-b + disc) / (2 * a))
    low, high = wilson_interval(k, n)
    assert (low, high) == pytest.approx(want, abs=1e-12)
    assert 0.0 <= low <= p <= high <= 1.0


def test_wilson_interval_refuses_impossible_counts():
    for k, n in ((3, 2), (-1, 4), (0, 0)):
        with pytest.raises(ValueError, match=f"{k}/{n}"):
            wilson_interval(k, n)


def test_holm_on_a_worked_case():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0]


def test_bootstrap_matches_normal_theory_and_includes_the_seeds():
    rng = np.random.default_rng(2)
    one = rng.normal(0.0, 1.0, (1, 400))
    low, high = bootstrap(one, lambda m: m.mean(1), crossed=True)
    assert high - low == pytest.approx(2 * Z975 / math.sqrt(400), rel=0.15)
    assert low < one.mean() < high
    constant = np.full((3, 50), 2.5)
    assert bootstrap(constant, lambda m: m.mean(1), crossed=False) == pytest.approx((2.5, 2.5))
    # seeds that differ widen the interval beyond what the segments alone give
    spread = one[:, :100] * 0.1 + np.array([[-1.0], [0.0], [1.0]])
    low, high = bootstrap(spread, lambda m: m.mean(1), crossed=True)
    assert high - low > 1.0


def _results(rows: dict[str, list[list[float]]], metric: str = "ppl") -> dict:
    key = "segments" if metric == "ppl" else "solved"
    runs = []
    for seed in range(len(next(iter(rows.values())))):
        out = []
        for label, per_seed in rows.items():
            units = per_seed[seed]
            result = {key: units, "ppl": math.exp(np.mean(units)), "accuracy": np.mean(units)}
            out.append({"label": label, "kind": "trained", "results": {"64": result}})
        runs.append({"encoding": "x", "seed": seed, "status": "ok", "rows": out})
    config = {"eval_lens": [64], "train_len": 64}
    return {"metric": metric, "config": config, "runs": runs, "seeds": list(range(len(runs)))}


def test_pairs_are_tested_corrected_and_stated():
    rng = np.random.default_rng(3)
    base = rng.normal(2.0, 0.2, (8, 40))  # 8 seeds: 3 * 2 / 2**8 < 0.05 at the seed level
    results = _results(
        {
            "a": (base - 0.1).tolist(),
            "b": base.tolist(),
            "c": (base + rng.normal(0, 0.01, base.shape)).tolist(),
        }
    )
    found = {(c.first, c.second): c for c in compare_all(results)}
    assert set(found) == {("a", "b"), ("a", "c"), ("b", "c")} or ("c", "b") in found
    ab = found["a", "b"]
    assert ab.separated and ab.effect == pytest.approx(math.exp(-0.1)) and ab.wins == 8
    assert ab.low <= ab.effect <= ab.high < 1.0 and ab.p_holm >= ab.p
    assert ab.p_flip == pytest.approx(2 / 2**8) and ab.p_seed_holm >= ab.p_seed
    assert ab.seed_low <= ab.effect <= ab.seed_high < 1.0
    assert sentence(ab).startswith(f"a better than b (seeds: p_Holm = {ab.p_seed_holm:.2g} (mixed")
    same = found.get(("b", "c")) or found["c", "b"]
    assert not same.separated and "not separated" in sentence(same)


def test_accuracy_cells_stay_inside_zero_and_one():
    units = {0: np.ones(8), 1: np.ones(8), 2: np.r_[np.ones(7), 0.0]}
    low, high = cell_interval(units, "accuracy")
    assert (low, high) == pytest.approx(wilson_interval(23, 24)) and high <= 1.0
    results = _results({"a": [[1, 1, 1, 0]] * 3, "b": [[0, 0, 0, 0]] * 3}, "accuracy")
    (c,) = compare_all(results)
    assert (c.first, c.metric) == ("a", "accuracy") and c.effect == pytest.approx(75.0)
