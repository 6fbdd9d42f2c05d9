"""Float64 NumPy reference for the content-dependent position terms: Shaw and CoPE.

Shapes: ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim; ``q [H, Tq, D]``,
``k, v [H, Tk, D]``, positions 1-D integer arrays ``i = q_pos``, ``j = k_pos``.

* Shaw et al. 2018 (eqs. 3-5): ``a^K_ij = w^K[clip(j - i, -K, K) + K]`` (and ``a^V``),
  logits ``e_ij = q_i . (k_j + a^K_ij) / sqrt(D)``, output
  ``z_i = sum_j alpha_ij (v_j + a^V_ij)``. Every ``a_ij`` vector is materialized.
* CoPE (Golovneva et al. 2024, eqs. 3-6): gates ``g_ij = sigmoid(q_i . k_j / sqrt(D))``
  over the visible keys ``j <= i``, positions ``p_ij = min(sum_{t=j..i} g_it, P - 1)``,
  embeddings interpolated between ``floor p`` and ``ceil p``, bias
  ``q_i . e[p_ij] / sqrt(D)``; summed with explicit loops.

Independent of ``posenc.encodings``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["cope_bias", "shaw_attention", "shaw_logits"]


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _relative_vectors(table: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    """``a_ij = table[clip(j - i, -K, K) + K]`` as ``[Tq, Tk, D]``."""
    clip = (table.shape[0] - 1) // 2
    i = np.asarray(q_pos, dtype=np.int64)[:, None]
    j = np.asarray(k_pos, dtype=np.int64)[None, :]
    return np.asarray(table, dtype=np.float64)[np.clip(j - i, -clip, clip) + clip]


def shaw_logits(
    q: np.ndarray, k: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, key_table: np.ndarray
) -> np.ndarray:
    """Shaw's eq. 5, ``e_ij = q_i . (k_j + a^K_ij) / sqrt(D)``, ``[H, Tq, Tk]``."""
    a = _relative_vectors(key_table, q_pos, k_pos)  # [Tq, Tk, D]
    keys = np.asarray(k, np.float64)[:, None, :, :] + a[None]  # [H, Tq, Tk, D]
    return np.einsum("hid,hijd->hij", np.asarray(q, np.float64), keys) / math.sqrt(q.shape[-1])


def shaw_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    key_table: np.ndarray,
    value_table: np.ndarray,
    *,
    causal: bool = True,
) -> np.ndarray:
    """Shaw's eqs. 3-5 end to end, ``[H, Tq, D]`` (causal: keys ``j <= i`` only)."""
    logits = shaw_logits(q, k, q_pos, k_pos, key_table)
    if causal:
        hidden = np.asarray(k_pos)[None, :] > np.asarray(q_pos)[:, None]
        logits = np.where(hidden[None], -np.inf, logits)
    alpha = _softmax(logits)  # [H, Tq, Tk]
    values = np.asarray(v, np.float64)[:, None] + _relative_vectors(value_table, q_pos, k_pos)
    return np.einsum("hij,hijd->hid", alpha, values)


def cope_bias(
    q: np.ndarray, k: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, pos_emb: np.ndarray
) -> np.ndarray:
    """CoPE's bias ``q_i . e[p_ij] / sqrt(D)`` (0-position embedding for hidden keys)."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    pos_emb = np.asarray(pos_emb, np.float64)
    heads, tq, dim = q.shape
    tk, npos = k.shape[1], pos_emb.shape[0]
    scale = 1.0 / math.sqrt(dim)
    out = np.zeros((heads, tq, tk))
    for h in range(heads):
        for a in range(tq):
            visible = [t for t in range(tk) if k_pos[t] <= q_pos[a]]
            gates = {t: 1.0 / (1.0 + math.exp(-(q[h, a] @ k[h, t]) * scale)) for t in visible}
            for b in range(tk):
                p = sum(g for t, g in gates.items() if t >= b)
                p = min(p, npos - 1)
                low, high = math.floor(p), math.ceil(p)
                e = pos_emb[low] + (p - low) * (pos_emb[high] - pos_emb[low])
                out[h, a, b] = (q[h, a] @ e) * scale
    return out
