"""Positions baked into weights: a GGUF's Q/K rows against the original ones, by scores.

Shapes: ``T`` tokens, ``C`` d_model, ``H`` query heads, ``G`` key/value heads, ``D`` head_dim.

llama.cpp rotates llama-family heads by adjacent pairs (``LLAMA_ROPE_TYPE_NORM``) while a
transformers checkpoint's Q/K rows are ordered for the half split; the converter permutes
each head's rows so the two agree (``convert_hf_to_gguf.py``, ``LlamaModel.permute``:
``w.reshape(n_head, 2, D/2, C).swapaxes(1, 2)``). A missing or wrong permutation leaves
every shape intact and silently scrambles positions, so the check is on what attention
computes: ``scores[h, i, j] = rot(q_i, p_i) . rot(k_j, p_j)`` (Su et al., 2021, eq. 34) for
``q = x Wq^T``, ``k = x Wk^T`` of the same hidden states ``x``, once with the GGUF's weights
and llama.cpp's rotation, once with the original weights and transformers' rotation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posenc.audit.reading import LayerPositions

__all__ = ["ScoreCheck", "attention_scores", "compare_scores", "permute_for_gguf"]


def permute_for_gguf(w: np.ndarray, n_head: int) -> np.ndarray:
    """The converter's ``LlamaModel.permute``: ``[n_head D, C]`` rows from half-split order to
    adjacent pairs (``n_head`` the key/value heads for K)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _rotate(x: np.ndarray, layer: LayerPositions) -> np.ndarray:
    """``x [heads, T, D]`` rotated at the layer's positions (``layer.angles [T, R/2]``)."""
    r = layer.rotary_dim
    cos = np.cos(layer.angles) * layer.scale[:, None]  # [T, R/2]
    sin = np.sin(layer.angles) * layer.scale[:, None]
    out = x.copy()
    if layer.pairs == "adjacent":
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2], out[..., 1:r:2] = a * cos - b * sin, a * sin + b * cos
    elif layer.pairs == "half":
        a, b = x[..., : r // 2], x[..., r // 2 : r]
        out[..., : r // 2], out[..., r // 2 : r] = a * cos - b * sin, a * sin + b * cos
    return out


def attention_scores(
    x: np.ndarray, wq: np.ndarray, wk: np.ndarray, layer: LayerPositions, n_head: int, n_kv: int
) -> np.ndarray:
    """``[H, T, T]`` scores ``rot(q) . rot(k)`` (float64) of hidden states ``x [T, C]``,
    ``wq [H D, C]``, ``wk [G D, C]``, rotated as ``layer`` says (its angles' rows are ``x``'s
    positions)."""
    t = x.shape[0]
    q = (x @ wq.T).reshape(t, n_head, -1).transpose(1, 0, 2)  # [H, T, D]
    k = (x @ wk.T).reshape(t, n_kv, -1).transpose(1, 0, 2)  # [G, T, D]
    q, k = _rotate(q, layer), _rotate(k, layer)
    k = np.repeat(k, n_head // n_kv, axis=0)  # [H, T, D]
    return q @ k.transpose(0, 2, 1)


@dataclass(frozen=True)
class ScoreCheck:
    """``max_error``: the largest ``|s_gguf - s_orig|``; ``scale``: the largest ``|s_orig|``."""

    max_error: float
    scale: float

    @property
    def relative(self) -> float:
        """``max_error / scale``."""
        return self.max_error / self.scale


def compare_scores(
    x: np.ndarray,
    gguf_qk: tuple[np.ndarray, np.ndarray],
    gguf_layer: LayerPositions,
    original_qk: tuple[np.ndarray, np.ndarray],
    original_layer: LayerPositions,
    *,
    n_head: int,
    n_kv: int,
) -> ScoreCheck:
    """The scores of the GGUF's Q/K weights under llama.cpp's rotation against those of the
    original weights under transformers' rotation, for the same hidden states ``x [T, C]``."""
    ours = attention_scores(np.asarray(x, np.float64), *gguf_qk, gguf_layer, n_head, n_kv)
    ref = attention_scores(np.asarray(x, np.float64), *original_qk, original_layer, n_head, n_kv)
    return ScoreCheck(float(np.max(np.abs(ours - ref))), float(np.max(np.abs(ref))))
