"""Attention with learned sinks in float64 NumPy (GPT-OSS, OpenAI 2025, "gpt-oss-120b &
gpt-oss-20b Model Card", sec. 2.1), written from the formula.

Shapes: ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim. Head ``h`` adds
``exp(s_h)`` to every row's softmax denominator::

    out_i = sum_j exp(l_ij) v_j / (exp(s_h) + sum_j exp(l_ij)),   l_ij = q_i . k_j / sqrt(D)

over the visible keys ``j`` (causal: ``k_pos <= q_pos``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["sink_attention"]


def sink_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    sinks: np.ndarray,
    *,
    q_pos: np.ndarray | None = None,
    k_pos: np.ndarray | None = None,
    causal: bool = True,
) -> np.ndarray:
    """``[H, Tq, D]`` attention of ``q [H, Tq, D]`` over ``k, v [H, Tk, D]`` with the sink
    logits ``sinks [H]``; positions default to ``0..Tk-1`` for the keys and the last ``Tq``
    of them for the queries."""
    q, k, v, sinks = (np.asarray(a, dtype=np.float64) for a in (q, k, v, sinks))
    num_q, num_k, dim = q.shape[1], k.shape[1], q.shape[2]
    k_pos = np.arange(num_k) if k_pos is None else np.asarray(k_pos)
    q_pos = k_pos[num_k - num_q :] if q_pos is None else np.asarray(q_pos)
    out = np.zeros_like(q)
    for h in range(q.shape[0]):
        for i in range(num_q):
            seen = [j for j in range(num_k) if not causal or k_pos[j] <= q_pos[i]]
            logits = np.array([q[h, i] @ k[h, j] / np.sqrt(dim) for j in seen])
            top = max(logits.max(initial=-np.inf), sinks[h])
            weights = np.exp(logits - top)
            total = weights.sum() + np.exp(sinks[h] - top)
            out[h, i] = sum(
                (w / total * v[h, j] for w, j in zip(weights, seen, strict=True)), np.zeros(dim)
            )
    return out
