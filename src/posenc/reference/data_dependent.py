"""Data-dependent attention in float64 NumPy, written from the papers' formulas.

Shapes: ``H`` heads, ``T`` length (queries and keys are the same tokens, causal), ``D``
head_dim, ``C`` d_model, ``W`` an MLP's width. Every sum and product is written out over
its index range (no cumulative sums), so the torch code's log-space algebra is checked,
not repeated.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "dape_bias",
    "fox_attention",
    "fox_log_forget",
    "path_attention",
    "path_householder",
    "stick_breaking_attention",
]


def _f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def fox_log_forget(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """FoX's ``log f_t = log sigmoid(w_h . x_t + b_h)`` (Lin et al. 2025, eq. (4)):
    ``x [T, C]``, ``weight [H, C]``, ``bias [H]`` -> ``[H, T]``."""
    x, weight, bias = _f64(x, weight, bias)
    pre = weight @ x.T + bias[:, None]  # [H, T]
    return -np.logaddexp(0.0, -pre)


def fox_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, log_f: np.ndarray, *, scale: float | None = None
) -> np.ndarray:
    """Forgetting attention (Lin et al. 2025, eqs. (5)-(6)), causal.

    ``o_i = sum_{j <= i} exp(s_ij) v_j / sum_{j <= i} exp(s_ij)`` with
    ``s_ij = scale q_i . k_j + sum_{l = j+1..i} log f_l``.

    Args:
        q: ``[H, T, D]`` queries.
        k: ``[H, T, D]`` keys.
        v: ``[H, T, D]`` values.
        log_f: ``[H, T]`` log forget gates.
        scale: ``1 / sqrt(D)`` when None.

    Returns:
        ``[H, T, D]``.
    """
    q, k, v, log_f = _f64(q, k, v, log_f)
    heads, length, dim = q.shape
    scale = dim**-0.5 if scale is None else scale
    out = np.zeros_like(v)
    for h in range(heads):
        for i in range(length):
            s = np.array(
                [scale * q[h, i] @ k[h, j] + log_f[h, j + 1 : i + 1].sum() for j in range(i + 1)]
            )
            w = np.exp(s - s.max())
            out[h, i] = (w / w.sum()) @ v[h, : i + 1]
    return out


def stick_breaking_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, attend_current: bool = False
) -> np.ndarray:
    """Stick-breaking attention (Tan et al. 2025, eqs. (1)-(2)), causal.

    ``beta_ij = sigmoid(q_i . k_j / sqrt(D))``, ``A_ij = beta_ij prod_{j<l<i} (1 - beta_il)``
    for ``j < i``; with ``attend_current`` ``j <= i`` and ``j < l <= i``. ``o_i = sum_j A_ij v_j``.

    Args:
        q: ``[H, T, D]`` queries.
        k: ``[H, T, D]`` keys.
        v: ``[H, T, D]`` values.

    Returns:
        ``[H, T, D]``.
    """
    q, k, v = _f64(q, k, v)
    heads, length, dim = q.shape
    out = np.zeros_like(v)
    for h in range(heads):
        for i in range(length):
            last = i if attend_current else i - 1  # the last key the query sees
            beta = 1.0 / (1.0 + np.exp(-(k[h, : last + 1] @ q[h, i]) * dim**-0.5))
            for j in range(last + 1):
                weight = beta[j] * np.prod(1.0 - beta[j + 1 : last + 1])
                out[h, i] += weight * v[h, j]
    return out


def path_householder(
    x: np.ndarray, direction: np.ndarray, strength: np.ndarray, offset: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """PaTH's ``w_t = W_w x_t / |W_w x_t|`` per head and ``beta_t = 2 sigmoid(u . x_t + b)``
    (Yang et al. 2025, sec. 3): ``x [T, C]``, ``direction [H * D, C]``, ``strength [H, C]``,
    ``offset [H]`` -> ``w [H, T, D]``, ``beta [H, T]``."""
    x, direction, strength, offset = _f64(x, direction, strength, offset)
    heads = strength.shape[0]
    w = (x @ direction.T).reshape(x.shape[0], heads, -1).transpose(1, 0, 2)  # [H, T, D]
    w = w / np.linalg.norm(w, axis=-1, keepdims=True)
    beta = 2.0 / (1.0 + np.exp(-(strength @ x.T + offset[:, None])))
    return w, beta


def path_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, w: np.ndarray, beta: np.ndarray
) -> np.ndarray:
    """PaTH attention (Yang et al. 2025, eq. (3)), causal, with the matrices written out.

    ``s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(D)``, ``H_t = I - beta_t w_t w_t^T``,
    ``o_i = sum_{j <= i} softmax_j(s_ij) v_j``.

    Args:
        q: ``[H, T, D]`` queries.
        k: ``[H, T, D]`` keys.
        v: ``[H, T, D]`` values.
        w: ``[H, T, D]`` unit vectors ``w_t`` of ``H_t``.
        beta: ``[H, T]``.

    Returns:
        ``[H, T, D]``.
    """
    q, k, v, w, beta = _f64(q, k, v, w, beta)
    heads, length, dim = q.shape
    out = np.zeros_like(v)
    for h in range(heads):
        house = [np.eye(dim) - beta[h, t] * np.outer(w[h, t], w[h, t]) for t in range(length)]
        for i in range(length):
            s = np.empty(i + 1)
            for j in range(i + 1):
                product = np.eye(dim)
                for t in range(i, j, -1):  # H_i H_{i-1} ... H_{j+1}
                    product = product @ house[t]
                s[j] = q[h, i] @ product @ k[h, j] / np.sqrt(dim)
            p = np.exp(s - s.max())
            out[h, i] = (p / p.sum()) @ v[h, : i + 1]
    return out


def dape_bias(
    logits: np.ndarray,
    bias: np.ndarray,
    w1: np.ndarray,
    b1: np.ndarray,
    w2: np.ndarray,
    b2: np.ndarray,
    *,
    negative_slope: float = 0.01,
) -> np.ndarray:
    """DAPE's bias ``B + f(A, B)`` (Zheng et al. 2024, eq. (4)), per ``(i, j)`` across heads.

    ``f(a, b) = w2 LeakyReLU(w1 [a; b] + b1) + b2``.

    Args:
        logits: ``A [H, Tq, Tk]``, the scaled dot products.
        bias: ``B [H, Tq, Tk]``.
        w1: ``[W, 2H]``; b1: ``[W]``; w2: ``[H, W]``; b2: ``[H]``.

    Returns:
        ``[H, Tq, Tk]``.
    """
    logits, bias, w1, b1, w2, b2 = _f64(logits, bias, w1, b1, w2, b2)
    out = np.array(bias)
    _, t_q, t_k = logits.shape
    for i in range(t_q):
        for j in range(t_k):
            hidden = w1 @ np.concatenate((logits[:, i, j], bias[:, i, j])) + b1
            hidden = np.where(hidden > 0, hidden, negative_slope * hidden)
            out[:, i, j] += w2 @ hidden + b2
    return out
