"""Inference whose unit is the training run: seeds are the replicates, and the text
(segments, nested in files) or the task examples are the units measured in each seed.

Shapes: ``K`` comparisons, ``S`` seeds, ``J`` units per seed (segments or examples),
``F`` files (clusters of segments), ``R`` sign patterns.

Training variance lives in the seed: two rows compared on the same text can differ in
every one of hundreds of segments while the sign of the difference changes from one
seed to the next. ``posenc.lab.significance``'s test over (seed, segment) pairs then
calls the pair significant although another seed could reverse it. The two tests here
treat the seed as the unit:

* **Mixed-effects model** (``mixed_model_test``, the one a claim states). Text: every
  seed is scored on the same held-out files, so seeds and files are *crossed* random
  effects of the per-(seed, file) mean difference ``M[s, f] = mu + a_s + c_f + e_sf``
  (Clark 1973, "The language-as-fixed-effect fallacy", with seeds for subjects and files
  for items; Baayen, Davidson & Bates 2008). The variance components are the ANOVA
  (method-of-moments) estimates of the two-way table (Searle, Casella & McCulloch 1992,
  "Variance Components", section 4.7), negative ones set to zero; the variance of the
  segment-weighted mean ``mu`` combines them, and its degrees of freedom are
  Satterthwaite's (1946). The test therefore generalises to other training seeds *and*
  other files of the same kind. Tasks: each seed draws its own examples (nested), so
  the model's test of ``mu`` is the one-sample t-test of the per-seed means on
  ``S - 1`` degrees of freedom (the summary-statistics approach, exact for a balanced
  nested design; Lazic 2010, "The problem of pseudoreplication in neuroscientific
  studies"). Its p-value comes from Student's t, so it has no floor: with six seeds a
  consistent difference can reach any p. It assumes the seed effects are normal.
* **Exact sign-flip test over seeds** (``seed_sign_flip_tests``; Fisher 1935; Good
  2005, "Permutation, Parametric and Bootstrap Tests of Hypotheses", section 3.6), the
  assumption-free check beside it: under the null hypothesis that the two rows are
  exchangeable within each training run, the sign of each per-seed mean difference is
  free, so ``p`` is the share of all ``2**S`` sign patterns whose ``|sum|`` reaches the
  observed one. The observed pattern and its mirror always count, so **its smallest
  two-sided p with S seeds is ``2 / 2**S``** (``floor``; 0.031 with six seeds): it can
  confirm a direction, not rank claims. Beyond ``EXACT_SEEDS``, ``SEED_FLIPS`` random
  patterns with ``p = (1 + hits) / (1 + R)`` (Phipson & Smyth 2010, eq. 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from posenc.lab.significance import EXACT_UNITS, sign_patterns

__all__ = [
    "EXACT_SEEDS",
    "SEED_FLIPS",
    "SeedTest",
    "floor",
    "mixed_model_test",
    "seed_sign_flip_tests",
    "seeds_needed",
]

#: Up to this many seeds the sign-flip test enumerates all ``2**S`` patterns (the
#: patterns are ``posenc.lab.significance``'s, which enumerates up to the same count).
EXACT_SEEDS = EXACT_UNITS
#: Random sign patterns beyond ``EXACT_SEEDS`` (smallest p: ``1 / (1 + SEED_FLIPS)``).
SEED_FLIPS = 200_000
_CHUNK = 8192
_TIE = 1e-9  # relative: sums of float64 means that are equal in exact arithmetic


def floor(seeds: int) -> float:
    """The smallest p-value the seed-level test can give with ``seeds`` seeds:
    ``2 / 2**S`` exact, ``1 / (1 + SEED_FLIPS)`` beyond ``EXACT_SEEDS``."""
    if seeds < 1:
        raise ValueError(f"need at least one seed, got {seeds}")
    return 2.0 / 2**seeds if seeds <= EXACT_SEEDS else 1.0 / (1 + SEED_FLIPS)


def seeds_needed(comparisons: int = 1, *, alpha: float = 0.05) -> int:
    """The fewest seeds whose exact test can give ``p_Holm < alpha`` for one comparison
    among ``comparisons`` (Holm multiplies the smallest p by their number):
    the least ``S`` with ``comparisons * 2 / 2**S < alpha``."""
    if comparisons < 1 or not 0 < alpha < 1:
        raise ValueError(f"need comparisons >= 1 and 0 < alpha < 1, got {comparisons}, {alpha}")
    return math.floor(math.log2(2 * comparisons / alpha)) + 1


def seed_sign_flip_tests(per_seed: np.ndarray) -> np.ndarray:
    """Two-sided p-values ``[K]`` of the sign-flip test over seeds of each row of
    ``per_seed`` ``[K, S]`` (the per-seed mean differences). Ties with the observed
    ``|sum|`` (to ``1e-9`` relative) count as hits. A row of zeros gets ``p = 1``.

    Raises:
        ValueError: not ``[K, S]`` with ``S >= 1``, or a non-finite value.
    """
    d = np.asarray(per_seed, dtype=np.float64)
    if d.ndim != 2 or d.shape[1] == 0 or not np.all(np.isfinite(d)):
        raise ValueError(f"need finite per-seed differences [K, S], got shape {d.shape}")
    observed = np.abs(d.sum(1)) - _TIE * np.abs(d).sum(1)  # [K]
    signs = sign_patterns(d.shape[1], SEED_FLIPS).astype(np.float64)  # [R, S], exact +-1
    hits = np.zeros(len(d), dtype=np.int64)
    for block in np.split(signs, range(_CHUNK, len(signs), _CHUNK)):
        hits += np.count_nonzero(np.abs(block @ d.T) >= observed, axis=0)
    exact = d.shape[1] <= EXACT_SEEDS
    p = hits / len(signs) if exact else (1 + hits) / (1 + len(signs))
    return np.where(np.abs(d).sum(1) == 0.0, 1.0, p)


@dataclass(frozen=True)
class SeedTest:
    """The mixed model's test of the mean difference ``mu``.

    Attributes:
        estimate: ``mu``, the mean difference over every seed's units.
        se: its standard error (``inf`` with one seed).
        df: degrees of freedom (Satterthwaite's when crossed; ``S - 1`` nested).
        p: two-sided p-value of ``mu = 0`` from Student's t with ``df``.
        low, high: the 95 % interval of ``mu``.
    """

    estimate: float
    se: float
    df: float
    p: float
    low: float
    high: float


def mixed_model_test(
    diff: np.ndarray, *, groups: np.ndarray | None = None, crossed: bool
) -> SeedTest:
    """Test of the mean of ``diff`` ``[S, J]`` with the seed as a random effect.

    Args:
        diff: paired differences, one row per seed, finite.
        groups: ``[J]`` the file of each unit (``crossed``); ``None``: each unit its own.
        crossed: the units are the same in every seed (text: the same held-out files),
            so files are a second random effect; otherwise each seed has its own units
            (tasks) and the test is the t-test of the per-seed means.

    Returns:
        ``SeedTest``; with one seed ``p = 1`` and an unbounded interval, and with no
        variation at all ``p = 1`` for a zero mean and ``0`` otherwise.

    Raises:
        ValueError: ``diff`` is not finite ``[S, J]`` or ``groups`` not one label per unit.
    """
    d = np.asarray(diff, dtype=np.float64)
    if d.ndim != 2 or d.size == 0 or not np.all(np.isfinite(d)):
        raise ValueError(f"need finite differences [S, J], got shape {d.shape}")
    seeds, units = d.shape
    estimate = float(d.mean())
    if seeds < 2:
        return SeedTest(estimate, math.inf, 0.0, 1.0, -math.inf, math.inf)
    labels = np.arange(units) if groups is None else np.asarray(groups)
    if labels.shape != (units,):
        raise ValueError(f"need one file label per unit ({units}), got shape {labels.shape}")
    _, labels = np.unique(labels, return_inverse=True)
    files = int(labels.max()) + 1
    if crossed and files > 1:
        var, df = _crossed_variance(d, labels, files)
    else:
        var, df = d.mean(1).var(ddof=1) / seeds, seeds - 1.0
    if var <= 0.0:
        p = 1.0 if estimate == 0.0 else 0.0
        return SeedTest(estimate, 0.0, df, p, estimate, estimate)
    se = math.sqrt(var)
    p = float(2.0 * stats.t.sf(abs(estimate) / se, df))
    half = float(stats.t.ppf(0.975, df)) * se
    return SeedTest(estimate, se, df, p, estimate - half, estimate + half)


def _crossed_variance(d: np.ndarray, labels: np.ndarray, files: int) -> tuple[float, float]:
    """Variance of the segment-weighted mean of ``d`` ``[S, J]`` under crossed seed and
    file effects, and its Satterthwaite degrees of freedom.

    The two-way table of cell means ``M [S, F]`` gives the mean squares of seeds,
    files and residual, with expectations ``s_e + F s_a``, ``s_e + S s_c`` and ``s_e``.
    With file weights ``w_f`` (their share of the segments) the weighted mean's variance
    is ``s_a / S + (s_c + s_e / S) * sum(w**2)``; each component is its ANOVA estimate,
    zero where that would be negative, and the variance is written back as a linear
    combination of mean squares for Satterthwaite's formula."""
    seeds = d.shape[0]
    counts = np.bincount(labels, minlength=files).astype(np.float64)  # [F]
    sums = np.zeros((seeds, files))
    np.add.at(sums, (slice(None), labels), d)
    cells = sums / counts  # [S, F]
    grand = cells.mean()
    rows, cols = cells.mean(1), cells.mean(0)
    df_a, df_c = seeds - 1.0, files - 1.0
    df_e = df_a * df_c
    ms_a = files * np.sum((rows - grand) ** 2) / df_a
    ms_c = seeds * np.sum((cols - grand) ** 2) / df_c
    ms_e = np.sum((cells - rows[:, None] - cols[None, :] + grand) ** 2) / df_e
    w2 = float(np.sum((counts / counts.sum()) ** 2))
    c_a = c_c = 0.0
    c_e = w2 / seeds  # s_e * sum(w**2) / S
    if ms_a > ms_e:  # s_a / S = (ms_a - ms_e) / (F S)
        c_a, c_e = 1.0 / (files * seeds), c_e - 1.0 / (files * seeds)
    if ms_c > ms_e:  # s_c * sum(w**2) = (ms_c - ms_e) * sum(w**2) / S
        c_c, c_e = w2 / seeds, c_e - w2 / seeds
    var = c_a * ms_a + c_c * ms_c + c_e * ms_e
    terms = (c_a * ms_a) ** 2 / df_a + (c_c * ms_c) ** 2 / df_c + (c_e * ms_e) ** 2 / df_e
    return float(var), float(var**2 / terms) if terms > 0 else df_e
