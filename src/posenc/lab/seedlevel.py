"""Inference whose unit is the training run: seeds are the replicates, and the text
(segments, nested in files) or the task examples are nested within each seed.

Shapes: ``K`` comparisons, ``S`` seeds, ``J`` units per seed (segments or examples),
``F`` files (clusters of segments), ``B`` bootstrap resamples, ``R`` sign patterns.

Training variance lives in the seed: two rows compared on the same text can differ in
every one of hundreds of segments while the sign of the difference changes from one
seed to the next. ``posenc.lab.significance``'s test over (seed, segment) pairs then
calls the pair significant although another seed could reverse it. The two tests here
treat the seed as the unit:

* **Exact sign-flip test over seeds** (Fisher 1935; Good 2005, "Permutation, Parametric
  and Bootstrap Tests of Hypotheses", section 3.6, applied to per-seed mean differences
  ``D_s = mean_j d[s, j]``): under the null hypothesis that the two rows are exchangeable
  within each training run, the sign of each ``D_s`` is free, so ``p`` is the share of
  all ``2**S`` sign patterns whose ``|sum|`` reaches the observed one. Enumerated for up
  to ``EXACT_SEEDS`` seeds (no Monte Carlo floor); the observed pattern and its mirror
  always count, so **the smallest two-sided p with S seeds is ``2 / 2**S``** (0.25 with
  3 seeds; ``S >= 6`` is needed for ``p < 0.05``; ``seeds_needed``). Beyond
  ``EXACT_SEEDS``, ``SEED_FLIPS`` random patterns with ``p = (1 + hits) / (1 + R)``
  (Phipson & Smyth 2010, eq. 2); ``floor`` says the smallest p it can give.
* **Hierarchical (two-stage) bootstrap** (Davison & Hinkley 1997, "Bootstrap Methods
  and their Application", section 3.8; Saravanan et al. 2020, "Application of the
  hierarchical bootstrap to multi-level data in neuroscience"): each resample draws
  ``S`` seeds with replacement, then inside each drawn seed the files (clusters of
  segments; a task's examples are their own clusters) with replacement; the per-seed
  effect is the mean over the drawn files' segments. The 95 % percentile interval of
  the effect therefore includes the training seed and which files were sampled.

Every random draw comes from a generator with a fixed seed, so a report recomputes
exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from posenc.lab.significance import EXACT_UNITS, RESAMPLES, sign_patterns

__all__ = [
    "EXACT_SEEDS",
    "SEED_FLIPS",
    "floor",
    "hierarchical_bootstrap",
    "seed_sign_flip_tests",
    "seeds_needed",
]

#: Up to this many seeds the sign-flip test enumerates all ``2**S`` patterns (the
#: patterns are ``posenc.lab.significance``'s, which enumerates up to the same count).
EXACT_SEEDS = EXACT_UNITS
#: Random sign patterns beyond ``EXACT_SEEDS`` (smallest p: ``1 / (1 + SEED_FLIPS)``).
SEED_FLIPS = 200_000
_SEED = 20260102  # the bootstrap's generator
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


def hierarchical_bootstrap(
    diff: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    *,
    groups: np.ndarray | None = None,
    resamples: int = RESAMPLES,
) -> tuple[float, float]:
    """95 % percentile interval of ``statistic`` over seeds, then files within seeds.

    Args:
        diff: ``[S, J]`` paired differences, one row per seed.
        statistic: maps per-seed means ``[B, S]`` to ``[B]``.
        groups: ``[J]`` the file (cluster) of each unit, ``0 .. F-1``; ``None``: each
            unit its own cluster (task examples).

    Returns:
        ``(low, high)``, the 2.5th and 97.5th percentiles.

    Raises:
        ValueError: ``groups`` is not one label per unit.
    """
    diff = np.asarray(diff, dtype=np.float64)
    seeds, units = diff.shape
    labels = np.arange(units) if groups is None else np.asarray(groups)
    if labels.shape != (units,):
        raise ValueError(f"need one file label per unit ({units}), got shape {labels.shape}")
    _, labels = np.unique(labels, return_inverse=True)
    files = int(labels.max()) + 1
    sums = np.zeros((seeds, files))
    np.add.at(sums, (slice(None), labels), diff)  # [S, F]
    counts = np.bincount(labels, minlength=files).astype(np.float64)  # [F]
    gen = np.random.default_rng(_SEED)
    drawn = gen.integers(0, seeds, size=(resamples, seeds))  # [B, S]
    picked = gen.integers(0, files, size=(resamples, seeds, files))  # [B, S, F]
    means = sums[drawn[:, :, None], picked].sum(-1) / counts[picked].sum(-1)  # [B, S]
    low, high = np.percentile(statistic(means), [2.5, 97.5])
    return float(low), float(high)
