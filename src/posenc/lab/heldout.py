"""Clean held-out text: verbatim overlap with the training text, near-duplicate files
dropped, and evaluation segments spread over the held-out files.

Overlap is measured on ``NGRAM``-byte windows (64 bytes, every offset): a held-out
window *overlaps* when the same 64 bytes occur anywhere in the training text. The test
is exact up to 64-bit hash collisions (a polynomial hash modulo ``2**64``; with ``n``
training windows a chance collision has probability about ``n / 2**64``, below
``1e-12`` for the corpora here). Measuring n-gram overlap between evaluation and
training text is the contamination check of Brown et al. 2020 ("Language Models are
Few-Shot Learners", appendix C, 13-grams of words); 64 bytes is about that length in
English text.

A held-out file of which at least ``DUPLICATE`` of the windows occur in the training
text is a near-duplicate of training material and is dropped from the held-out set
(it is not moved into training: its text is there already). When the overlap of what
remains is still above ``WARN``, the sweep warns loudly and the report says so.

Segments (``posenc.lab.evaluate``) are allocated to files by water-filling: every file
that can hold one more segment gets one, round by round, so no file supplies more than
one segment beyond any other that still has room; the *cap* is the most any file
supplies.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "DUPLICATE",
    "NGRAM",
    "WARN",
    "allocate_segments",
    "clean_split",
    "ngram_hashes",
    "overlap_fraction",
]

#: Length in bytes of the windows compared between held-out and training text.
NGRAM = 64
#: A held-out file with at least this fraction of its windows in the training text is dropped.
DUPLICATE = 0.5
#: Overlap of the remaining held-out text above which the sweep warns.
WARN = 0.05
_PRIME = np.uint64(1099511628211)  # the 64-bit FNV prime, an odd multiplier
_NONE = np.empty(0, dtype=np.uint64)


def ngram_hashes(data: bytes, n: int = NGRAM) -> np.ndarray:
    """64-bit hashes ``[len(data) - n + 1]`` of every ``n``-byte window of ``data``
    (empty when ``data`` is shorter; ``n`` a multiple of 8).

    Each window is read as ``n / 8`` little-endian 64-bit words ``w_m`` (exact), hashed
    as ``sum_m w_m * P**(n/8 - 1 - m) mod 2**64``.
    """
    if n < 8 or n % 8:
        raise ValueError(f"n-gram length must be a positive multiple of 8, got {n}")
    raw = np.frombuffer(data, dtype=np.uint8).astype(np.uint64)
    count = raw.size - n + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    span = count + n - 8  # 8-byte words starting at every offset a window uses
    words = np.zeros(span, dtype=np.uint64)
    for k in range(8):
        words |= raw[k : k + span] << np.uint64(8 * k)
    out = np.zeros(count, dtype=np.uint64)
    for m in range(0, n, 8):  # Horner's rule over the words (wraps modulo 2**64)
        out *= _PRIME
        out += words[m : m + count]
    return out


def overlap_fraction(hashes: np.ndarray, known: np.ndarray) -> float:
    """The fraction of ``hashes`` found in the sorted array ``known`` (0 when empty)."""
    if hashes.size == 0 or known.size == 0:
        return 0.0
    where = np.minimum(np.searchsorted(known, hashes), known.size - 1)
    return float(np.mean(known[where] == hashes))


def clean_split(
    train: Sequence[tuple[str, bytes]], heldout: Sequence[tuple[str, bytes]], *, drop: bool = True
) -> tuple[list[tuple[str, bytes]], dict[str, object]]:
    """Drop held-out files that duplicate training text; measure what remains.

    Args:
        train: ``(name, content)`` of the training files.
        heldout: ``(name, content)`` of the held-out files.
        drop: drop near-duplicates (``False``: only measure, e.g. a single file split
            by bytes).

    Returns:
        The kept held-out files and a JSON-ready record: ``ngram``, ``overlap_before``
        and ``overlap`` (fractions of held-out windows found in the training text, before
        and after dropping), ``dropped`` (names with their own overlap), ``warn`` (the
        threshold) and ``contaminated`` (``overlap > warn``).

    Raises:
        ValueError: every held-out file duplicates training text.
    """
    known = np.sort(np.concatenate([ngram_hashes(data) for _, data in train] or [_NONE]))
    kept, dropped, hits, total = [], {}, [0.0, 0.0], [0, 0]
    for name, data in heldout:
        hashes = ngram_hashes(data)
        share = overlap_fraction(hashes, known)
        hits[0] += share * hashes.size
        total[0] += hashes.size
        if drop and hashes.size and share >= DUPLICATE:
            dropped[name] = round(share, 4)
            continue
        kept.append((name, data))
        hits[1] += share * hashes.size
        total[1] += hashes.size
    if not kept:
        raise ValueError(
            f"every held-out file repeats the training text ({len(dropped)} files with "
            f"{100 * DUPLICATE:g} % or more of their {NGRAM}-byte windows in it)"
        )
    overlap = hits[1] / max(1, total[1])
    return kept, {
        "ngram": NGRAM,
        "overlap_before": round(hits[0] / max(1, total[0]), 4),
        "overlap": round(overlap, 4),
        "dropped": dropped,
        "duplicate": DUPLICATE,
        "warn": WARN,
        "contaminated": overlap > WARN,
    }


def allocate_segments(capacities: Sequence[int], count: int) -> list[int]:
    """Segments per file: ``count`` (or every one that fits, if fewer) spread by
    water-filling over files that hold ``capacities[i]`` segments each.

    Raises:
        ValueError: a negative capacity or count.
    """
    if count < 0 or any(c < 0 for c in capacities):
        raise ValueError(f"capacities and count must be >= 0, got {list(capacities)}, {count}")
    given = [0] * len(capacities)
    left = min(count, sum(capacities))
    while left:
        for i, room in enumerate(capacities):
            if left and given[i] < room:
                given[i] += 1
                left -= 1
    return given
