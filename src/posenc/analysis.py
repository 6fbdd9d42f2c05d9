"""Analysis of positional-encoding tables: what makes an absolute encoding useful.

Shapes: ``L`` positions, ``d`` d_model. Every function takes a table ``pe [L, d]`` as a
NumPy array or a torch tensor (converted to float64 NumPy once) and returns NumPy.

* ``relative_position_matrix``: the block-diagonal rotation ``M_k`` with
  ``PE[p + k] = M_k PE[p]`` for the sinusoidal encoding (Vaswani et al. 2017, section
  3.5: "PE_{pos+k} can be represented as a linear function of PE_pos"), and how well it
  reconstructs a given table;
* ``dot_product_distance`` / ``cosine_similarity_matrix``: ``PE PE^T``, which for
  sinusoids depends only on ``p1 - p2`` (``sum_i cos(w_i (p1 - p2))``, Toeplitz);
* ``encoding_statistics``, ``uniqueness``, ``difference_consistency``: norms, ranges,
  the closest pair of positions, and whether ``PE[p + k] - PE[p]`` points the same way
  for every ``p``;
* ``permutation_equivariance_error``: self-attention without positions is permutation
  equivariant, ``Attn(P X) = P Attn(X)``; an added encoding breaks it.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from posenc._checks import check_int
from posenc.reference import sinusoidal_frequencies

__all__ = [
    "cosine_similarity_matrix",
    "difference_consistency",
    "dot_product_distance",
    "encoding_statistics",
    "permutation_equivariance_error",
    "relative_position_matrix",
    "uniqueness",
]

#: Rows with a norm below this count as zero vectors (their cosine similarity is 0).
_ZERO_NORM = 1e-10


def _as_table(pe: object, name: str = "pe") -> np.ndarray:
    """``pe`` as a float64 ``[L, d]`` array (torch tensors are detached and copied)."""
    if isinstance(pe, torch.Tensor):
        pe = pe.detach().to(device="cpu", dtype=torch.float64).numpy()
    if not isinstance(pe, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or torch tensor, got {type(pe).__name__}")
    if pe.ndim != 2 or pe.shape[0] < 1 or pe.shape[1] < 1:
        raise ValueError(f"{name} must have shape [L, d] with L, d >= 1, got shape {pe.shape}")
    if not np.issubdtype(pe.dtype, np.number) or np.issubdtype(pe.dtype, np.complexfloating):
        raise TypeError(f"{name} must hold real numbers, got dtype {pe.dtype}")
    return pe.astype(np.float64, copy=False)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of ``a [N, d]`` and ``b [N, d]``; 0 for zero rows."""
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    ok = (na > _ZERO_NORM) & (nb > _ZERO_NORM)
    dots = np.einsum("nd,nd->n", a, b)
    return np.where(ok, dots / np.where(ok, na * nb, 1.0), 0.0)


def relative_position_matrix(
    pe: object, offset: int, *, base: float = 10000.0
) -> tuple[np.ndarray, float]:
    """The rotation ``M_k`` mapping sinusoidal ``PE[p]`` to ``PE[p + k]``, and its error.

    ``M_k = diag(R_0(k), ..., R_{d/2-1}(k))`` with
    ``R_i(k) = [[cos(w_i k), sin(w_i k)], [-sin(w_i k), cos(w_i k)]]`` and
    ``w_i = base ** (-2i / d)``, for the interleaved (sin at ``2i``, cos at ``2i + 1``)
    layout.

    Args:
        pe: the table ``[L, d]`` to check (``d`` even).
        offset: ``k``; negative offsets map to earlier positions. ``|k| < L``.
        base: the frequency base of the encoding.

    Returns:
        ``(M_k [d, d], max_error)``: the largest ``||M_k PE[p] - PE[p + k]||_2`` over every
        ``p`` with both positions in the table.

    Raises:
        ValueError: ``pe`` not 2-D, ``d`` odd, ``|offset| >= L``, ``base`` <= 0.
        TypeError: a non-integer ``offset``.
    """
    table = _as_table(pe)
    length, d_model = table.shape
    omega = sinusoidal_frequencies(d_model, base=base)
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral):
        raise TypeError(f"offset must be an integer, got {offset!r}")
    offset = int(offset)
    if abs(offset) >= length:
        raise ValueError(f"offset {offset} leaves no pair of positions in a table of L={length}")
    cos, sin = np.cos(omega * offset), np.sin(omega * offset)
    even = np.arange(0, d_model, 2)
    rotation = np.zeros((d_model, d_model))
    rotation[even, even] = cos
    rotation[even, even + 1] = sin
    rotation[even + 1, even] = -sin
    rotation[even + 1, even + 1] = cos
    source = table[max(0, -offset) : length - max(0, offset)]  # PE[p]
    target = table[max(0, offset) : length + min(0, offset)]  # PE[p + k]
    errors = np.linalg.norm(source @ rotation.T - target, axis=-1)
    return rotation, float(errors.max())


def dot_product_distance(pe: object) -> np.ndarray:
    """``D = PE PE^T`` ``[L, L]``: the inner product of every pair of positions.

    Raises:
        ValueError: ``pe`` not 2-D.
    """
    table = _as_table(pe)
    return table @ table.T


def cosine_similarity_matrix(pe: object) -> np.ndarray:
    """Cosine similarity of every pair of positions, ``[L, L]`` (0 where a row is zero).

    Raises:
        ValueError: ``pe`` not 2-D.
    """
    table = _as_table(pe)
    norms = np.linalg.norm(table, axis=-1)
    unit = table / np.where(norms > _ZERO_NORM, norms, np.inf)[:, None]
    return unit @ unit.T


def encoding_statistics(pe: object) -> dict[str, np.ndarray | float]:
    """Summary statistics of a table.

    Returns:
        ``{"norms": [L] L2 norm per position, "mean": [d] and "var": [d] per dimension
        (over positions, population variance), "min": float, "max": float}``.

    Raises:
        ValueError: ``pe`` not 2-D.
    """
    table = _as_table(pe)
    return {
        "norms": np.linalg.norm(table, axis=-1),
        "mean": table.mean(axis=0),
        "var": table.var(axis=0),
        "min": float(table.min()),
        "max": float(table.max()),
    }


def uniqueness(pe: object) -> float:
    """The smallest L2 distance between two distinct positions (0: two coincide).

    Computed from the differences themselves (not from norms and dot products), so a
    tiny distance is not lost to cancellation.

    Raises:
        ValueError: ``pe`` not 2-D or with fewer than two positions.
    """
    table = _as_table(pe)
    length, d_model = table.shape
    if length < 2:
        raise ValueError(f"uniqueness needs at least 2 positions, got L={length}")
    block = max(1, (1 << 22) // (length * d_model))  # bounds the [block, L, d] temporary
    best = np.inf
    for start in range(0, length - 1, block):
        rows = table[start : start + block]  # [b, d]
        dist = np.linalg.norm(rows[:, None, :] - table[None, :, :], axis=-1)  # [b, L]
        later = np.arange(length)[None, :] > np.arange(start, start + len(rows))[:, None]
        best = min(best, float(dist[later].min()))
    return best


def difference_consistency(pe: object, k: int) -> dict[str, np.ndarray | float]:
    """Whether the step ``PE[p + k] - PE[p]`` points the same way for every ``p``.

    The difference vectors ``delta_p = PE[p + k] - PE[p]`` (``0 <= p < L - k``) are
    compared with their successors: ``s_p = cos(delta_p, delta_{p+1})``. For sinusoids
    ``delta_{p+1} = M_1 delta_p``, so every ``s_p`` is the same number.

    Returns:
        ``{"similarities": [L - k - 1] the s_p, "mean": float, "min": float}``.

    Raises:
        ValueError: ``pe`` not 2-D, ``k`` < 1, or ``L - k < 2`` (fewer than two steps).
    """
    table = _as_table(pe)
    k = check_int("k", k)
    length = table.shape[0]
    if length - k < 2:
        raise ValueError(f"k={k} leaves fewer than two difference vectors in L={length}")
    deltas = table[k:] - table[:-k]  # [L - k, d]
    sims = _cosine(deltas[:-1], deltas[1:])
    return {"similarities": sims, "mean": float(sims.mean()), "min": float(sims.min())}


def permutation_equivariance_error(
    pe: object | None = None,
    *,
    seq_len: int | None = None,
    d_model: int | None = None,
    seed: int = 0,
) -> float:
    """``max |Attn(P X + PE) - P Attn(X + PE)|`` for a random input and permutation.

    ``Attn`` is one head of unmasked softmax self-attention,
    ``softmax(Q K^T / sqrt(d)) V`` with random projections. Without an encoding
    (``pe=None``) the error is rounding-level: attention is permutation equivariant.
    With one the positions stay in place while the tokens move, and the error is large.

    Args:
        pe: the table ``[L, d]`` added to the input, or ``None``.
        seq_len: ``L`` (taken from ``pe`` when given; must agree with it).
        d_model: ``d`` (likewise).
        seed: seed of the input, the projections and the permutation.

    Raises:
        ValueError: missing sizes without ``pe``, sizes that disagree with ``pe``,
            ``L`` < 2.
    """
    table = None if pe is None else _as_table(pe)
    sizes = {"seq_len": seq_len, "d_model": d_model}
    for axis, (name, value) in enumerate(sizes.items()):
        if table is not None and value is not None and value != table.shape[axis]:
            raise ValueError(f"{name}={value} disagrees with pe of shape {table.shape}")
        if table is None and value is None:
            raise ValueError(f"{name} is required when pe is None")
    length = check_int("seq_len", table.shape[0] if table is not None else seq_len, minimum=2)
    width = check_int("d_model", table.shape[1] if table is not None else d_model)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((length, width))
    w_q, w_k, w_v = rng.standard_normal((3, width, width)) / np.sqrt(width)
    perm = rng.permutation(length)
    if np.array_equal(perm, np.arange(length)):
        perm = np.roll(perm, 1)
    offset = 0.0 if table is None else table

    def attend(h: np.ndarray) -> np.ndarray:
        h = h + offset
        scores = (h @ w_q) @ (h @ w_k).T / np.sqrt(width)  # [L, L]
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return (probs / probs.sum(axis=-1, keepdims=True)) @ (h @ w_v)

    return float(np.abs(attend(x[perm]) - attend(x)[perm]).max())
