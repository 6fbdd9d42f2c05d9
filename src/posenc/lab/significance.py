"""Paired tests, corrected p-values and intervals that include the sampling of the text.

Shapes: ``S`` seeds, ``J`` units per seed (evaluation segments of text, each a mean
per-byte loss; or task examples, each 1 when solved and 0 otherwise), ``R`` random
sign flips, ``B`` bootstrap resamples.

* **Paired permutation test** (Fisher 1935; Good 2005, "Permutation, Parametric and
  Bootstrap Tests of Hypotheses", section 3.6): for two rows at one length the
  differences ``d[s, j] = a[s, j] - b[s, j]`` of the same seed and unit; under the null
  hypothesis that the two rows are exchangeable on each unit the signs of the ``d`` are
  free, so ``p`` is the share of sign flips whose ``|mean|`` reaches the observed one.
  Exact (every flip) for up to ``EXACT_UNITS`` units, else ``R`` random flips with
  ``p = (1 + hits) / (1 + R)`` (Phipson & Smyth 2010, eq. 2), a valid p-value. It takes
  the trained models as given: it measures how far the evaluation text could move the
  comparison, not how far another training seed could.
* **Holm's step-down correction** (Holm 1979, "A simple sequentially rejective multiple
  test procedure") over every comparison of a report: ``p_(i) * (m - i + 1)``, made
  monotone, capped at 1.
* **Bootstrap intervals** (Efron & Tibshirani 1993, ch. 13, percentile interval) that
  resample seeds *and* units, so they include both the training seed and the text: for
  text the seeds and segments are crossed (every seed is scored on the same segments)
  and are resampled independently; for tasks every seed has its own examples, resampled
  inside each resampled seed (nested).
* **Wilson's score interval** for a proportion (Wilson 1927, eq. for ``p`` with
  ``z``), which never leaves ``[0, 1]``.

Every random draw comes from a generator with a fixed seed, so a report recomputes
exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "EXACT_UNITS",
    "PERMUTATIONS",
    "RESAMPLES",
    "Z975",
    "bootstrap",
    "holm",
    "sign_flip_test",
    "sign_flip_tests",
    "sign_patterns",
    "wilson_interval",
]

#: Two-sided 95 % standard normal quantile.
Z975 = 1.959963984540054
#: Up to this many units the permutation test enumerates every sign flip.
EXACT_UNITS = 16
#: Random sign flips beyond ``EXACT_UNITS`` (smallest p: ``1 / (1 + PERMUTATIONS)``).
PERMUTATIONS = 20000
#: Bootstrap resamples of an interval.
RESAMPLES = 2000
_SEED = 20260101
_CHUNK = 4000


def wilson_interval(successes: int, trials: int, *, z: float = Z975) -> tuple[float, float]:
    """Wilson's score interval ``(low, high)`` of a proportion ``successes / trials``:
    ``(p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)``.

    Raises:
        ValueError: ``trials < 1`` or ``successes`` outside ``[0, trials]``.
    """
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, trials >= 1; got {successes}/{trials}")
    p, n, z2 = successes / trials, trials, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends: 0 and 1
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


@functools.lru_cache(maxsize=8)
def sign_patterns(units: int, flips: int) -> np.ndarray:
    """``[R, n]`` signs ``+-1``: every flip when ``n <= EXACT_UNITS``, else ``flips`` random
    ones (float32: the sums are compared with a tolerance)."""
    if units <= EXACT_UNITS:
        codes = np.arange(2**units)[:, None] >> np.arange(units)[None, :]
        return (1 - 2 * (codes & 1)).astype(np.float32)
    gen = np.random.default_rng(_SEED + units)
    return (1 - 2 * gen.integers(0, 2, size=(flips, units), dtype=np.int8)).astype(np.float32)


def sign_flip_test(diffs: Sequence[float] | np.ndarray, *, flips: int = PERMUTATIONS) -> float:
    """Two-sided p-value of the paired permutation (sign-flip) test of mean ``diffs == 0``.

    Exact for up to ``EXACT_UNITS`` differences (the share of all ``2**n`` flips, the
    observed one included), else ``(1 + hits) / (1 + flips)``. Ties with the observed
    ``|sum|`` (within float32 rounding) count as hits, so the test is conservative.

    Raises:
        ValueError: no differences, or a non-finite one.
    """
    return float(
        sign_flip_tests(np.asarray(diffs, dtype=np.float64).reshape(1, -1), flips=flips)[0]
    )


def sign_flip_tests(diffs: np.ndarray, *, flips: int = PERMUTATIONS) -> np.ndarray:
    """``sign_flip_test`` of each row of ``diffs`` ``[K, n]`` (one matrix product for all).

    Raises:
        ValueError: no differences, or a non-finite one.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim != 2 or d.shape[1] == 0 or not np.all(np.isfinite(d)):
        raise ValueError(f"need finite paired differences [K, n], got shape {d.shape}")
    top = np.abs(d).max(1, keepdims=True)  # [K, 1]
    d = d / np.where(top == 0.0, 1.0, top)  # in [-1, 1]: float32 neither under- nor overflows
    observed = np.abs(d.sum(1)) - 1e-5 * np.abs(d).sum(1)  # float32 sums: ~n * 6e-8 off
    signs = sign_patterns(d.shape[1], flips)  # [R, n]
    d32 = d.T.astype(np.float32)  # [n, K]
    hits = np.zeros(len(d), dtype=np.int64)
    for block in np.split(signs, range(_CHUNK, len(signs), _CHUNK)):
        hits += np.count_nonzero(np.abs(block @ d32) >= observed, axis=0)
    exact = d.shape[1] <= EXACT_UNITS
    p = hits / len(signs) if exact else (1 + hits) / (1 + len(signs))
    return np.where(top[:, 0] == 0.0, 1.0, p)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def bootstrap(
    values: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    *,
    crossed: bool,
    resamples: int = RESAMPLES,
) -> tuple[float, float]:
    """95 % percentile interval of ``statistic`` over resampled seeds and units.

    Args:
        values: ``[S, J]``, one row per seed.
        statistic: maps per-seed unit means ``[B, S]`` (each resample's seeds in the
            order drawn) to ``[B]``.
        crossed: the units are the same for every seed (text segments): seeds and units
            are resampled independently; ``False`` (task examples): units are resampled
            inside each drawn seed.

    Returns:
        ``(low, high)``, the 2.5th and 97.5th percentiles.
    """
    values = np.asarray(values, dtype=np.float64)
    seeds, units = values.shape
    drawn, picks = _draws(seeds, units, resamples, crossed)
    if crossed:  # every seed on the same resampled units
        per_seed = values[:, picks].mean(-1).T  # [B, S]
        means = np.take_along_axis(per_seed, drawn, axis=1)
    else:
        means = values[drawn[:, :, None], picks].mean(-1)  # [B, S]
    stat = statistic(means)
    low, high = np.percentile(stat, [2.5, 97.5])
    return float(low), float(high)


@functools.lru_cache(maxsize=8)
def _draws(seeds: int, units: int, resamples: int, crossed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Resampled seed indices ``[B, S]`` and unit indices (``[B, J]`` crossed, ``[B, S, J]``
    nested), from a fixed generator."""
    gen = np.random.default_rng(_SEED)
    drawn = gen.integers(0, seeds, size=(resamples, seeds))
    shape = (resamples, units) if crossed else (resamples, seeds, units)
    return drawn, gen.integers(0, units, size=shape)
