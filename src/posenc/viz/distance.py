"""What the positions of 2024-26 do to attention over distance, for ``posenc show`` and
``posenc explain``.

Shapes: ``L`` length, ``H`` heads, ``D`` head_dim, ``C = H D`` d_model. The query sits at
position ``L - 1`` and the key at distance ``d = 0 .. L - 1`` before it; every number is
computed from the library's own modules (untrained, drawn with a fixed seed) or from
typical constant values:

* FoX (Lin et al. 2025, eq. 6): the logits gain ``D(d) = sum of log f`` over the ``d``
  tokens after the key; shown per head for random inputs ``x ~ N(0, I)`` (what a layer
  norm hands the gates) and for constant gates ``f``, whose decay is ALiBi's ``d log f``.
* stick-breaking (Tan et al. 2025, eq. 1): the key at distance ``d`` gets ``beta_d``
  times the stick the nearer keys left; shown for constant ``beta`` (``beta (1 -
  beta)^(d-1)``) and for random ``q, k ~ N(0, I)``.
* PaTH (Yang et al. 2025, eq. 2): the score ``q^T H_i ... H_(j+1) q / |q|^2`` of one token
  repeated, the product of the Householder-like transforms between query and key; shown
  per head of an untrained module on random inputs, and for constant ``beta`` with random
  unit directions ``w``.
* rotary encodings (p-RoPE, Barbero et al. 2025; FoPE): each feature's ``q.k`` against
  the distance (a zero frequency is a flat row), and their mean, the expected
  ``q_d . k_0 / |q|^2`` of a random token, beside RoPE.

The attention panel is the weight the last query gives each key when every position
holds the same token (``q = k``; FoX: content-neutral, ``q = k = 0``; PaTH and rotary:
a random ``q ~ N(0, I_D)``), so only the position mechanism shapes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from posenc._checks import check_int
from posenc.base import available
from posenc.viz._common import build_encoding, new_figure, series_styles

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DISTANCE_NAMES",
    "Profile",
    "distance_figure",
    "distance_profile",
    "has_distance_figure",
]

#: The encodings with a distance figure (those registered in this install are drawn).
DISTANCE_NAMES = ("fox", "stick_breaking", "path", "p_rope", "fope")
#: Typical constant values drawn beside the untrained modules.
FORGET_GATES = (0.5, 0.9, 0.99)
STICK_BETAS = (0.1, 0.3, 0.7)
PATH_BETAS = (0.5, 1.0, 2.0)
P_FRACTIONS = (1.0, 0.75, 0.25, 0.0)
#: Random draws averaged over (stick-breaking content, PaTH and rotary tokens).
DRAWS = 32
#: Most heads drawn as separate curves.
MAX_CURVES = 6


@dataclass
class Profile:
    """Curves over the distance ``d = 0 .. L - 1`` (float64 ``[L]`` each, NaN: no value).

    Attributes:
        title: what the figure shows.
        score_label: the y label of ``scores``.
        scores: label -> what the mechanism adds to (or makes of) the score at ``d``.
        weights: label -> the last query's attention weight at ``d``.
        features: rotary only, ``[D, L]`` each feature's ``q.k`` (one basis vector).
    """

    title: str
    score_label: str
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    features: np.ndarray | None = None


def distance_profile(
    name: str, *, length: int = 64, num_heads: int = 4, head_dim: int = 16, seed: int = 0
) -> Profile:
    """The curves of ``name`` (one of ``DISTANCE_NAMES``, registered) over distance.

    Raises:
        ValueError: another name, ``length < 2``, ``head_dim`` odd or < 2, ``num_heads < 1``.
    """
    if name not in DISTANCE_NAMES or name not in available():
        known = ", ".join(n for n in DISTANCE_NAMES if n in available())
        raise ValueError(f"no distance profile for {name!r}; known: {known}")
    length = check_int("length", length, minimum=2)
    num_heads, head_dim = check_int("num_heads", num_heads), check_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    gen = torch.Generator().manual_seed(seed)
    shape = {"d_model": num_heads * head_dim, "num_heads": num_heads, "head_dim": head_dim}
    if name == "fox":
        return _fox(build_encoding(name, seed=seed, **shape), length, gen)
    if name == "stick_breaking":
        return _stick(length, head_dim, gen)
    if name == "path":
        return _path(build_encoding(name, seed=seed, **shape), length, head_dim, gen)
    return _rotary(name, length, head_dim, seed, gen)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _fox(enc, length: int, gen: torch.Generator) -> Profile:
    x = torch.randn(1, length, enc.d_model, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        log_f = enc.log_forget(x)[0].numpy()  # [H, L]
    # D(d): the log gates of the d tokens after the key, for the last query
    decay = np.concatenate([np.zeros((log_f.shape[0], 1)), np.cumsum(log_f[:, :0:-1], -1)], -1)
    prof = Profile("FoX: forget-gate decay over distance", "logit contribution D(d) (nats)")
    for h, row in enumerate(decay[:MAX_CURVES]):
        prof.scores[f"head {h} (untrained, mean f {np.exp(log_f[h]).mean():.2f})"] = row
    for f in FORGET_GATES:
        prof.scores[f"constant f = {f:g}"] = np.arange(length) * np.log(f)
    prof.weights = {k: _softmax(v) for k, v in prof.scores.items()}
    return prof


def _stick(length: int, head_dim: int, gen: torch.Generator) -> Profile:
    d = np.arange(length, dtype=np.float64)
    prof = Profile(
        "stick-breaking: the stick the nearer keys leave over distance",
        "stick left after the d - 1 nearer keys",
    )
    q, k = torch.randn(2, DRAWS, 1, length, head_dim, generator=gen, dtype=torch.float64)
    z = (q[..., -1:, :] @ k.transpose(-2, -1))[:, 0, 0].numpy()[:, ::-1] * head_dim**-0.5
    betas = {"random q, k ~ N(0, I)": 1.0 / (1.0 + np.exp(-z))}  # [DRAWS, L] by distance
    betas |= {f"constant beta = {b:g}": np.full((1, length), b) for b in STICK_BETAS}
    for label, beta in betas.items():
        beta = beta.copy()
        beta[:, 0] = 0.0  # a token does not attend to itself (the paper's convention)
        kept = np.cumprod(1.0 - beta, axis=-1)  # after key d breaks
        left = np.concatenate([np.ones_like(kept[:, :1]), kept[:, :-1]], axis=-1)  # before
        prof.scores[label] = np.where(d > 0, left.mean(0), np.nan)
        prof.weights[label] = np.where(d > 0, (beta * left).mean(0), np.nan)
    return prof


def _householder_scores(w: np.ndarray, beta: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``q^T H_(L-1) ... H_(L-d) q / |q|^2`` for ``d = 0 .. L-1``, ``H_t = I - beta_t w_t
    w_t^T``: ``w [L, D]`` unit rows, ``beta [L]``, ``q [N, D]``; returns ``[N, L]``."""
    out = np.empty((q.shape[0], w.shape[0]))
    u = q.copy()
    out[:, 0] = 1.0
    for d in range(1, w.shape[0]):
        t = w.shape[0] - d  # the token after the key at distance d
        u = u - beta[t] * (u @ w[t])[:, None] * w[t]
        out[:, d] = (u * q).sum(-1) / (q * q).sum(-1)
    return out


def _path(enc, length: int, head_dim: int, gen: torch.Generator) -> Profile:
    x = torch.randn(1, length, enc.d_model, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        gates = enc.gates(x)[0].numpy()  # [H, L, D + 2]: w, beta, index
    q = torch.randn(DRAWS, head_dim, generator=gen, dtype=torch.float64).numpy()
    prof = Profile(
        "PaTH: accumulated Householder transforms over distance",
        "score q·H_i…H_(j+1)·q / |q|² (mean of random q)",
    )
    curves = {}
    for h, g in enumerate(gates[:MAX_CURVES]):
        label = f"head {h} (untrained, mean beta {g[:, head_dim].mean():.2f})"
        curves[label] = _householder_scores(g[:, :head_dim], g[:, head_dim], q)
    w = torch.randn(length, head_dim, generator=gen, dtype=torch.float64).numpy()
    w /= np.linalg.norm(w, axis=-1, keepdims=True)
    for b in PATH_BETAS:
        curves[f"constant beta = {b:g}"] = _householder_scores(w, np.full(length, b), q)
    scale = (q * q).sum(-1, keepdims=True) * head_dim**-0.5  # the unrotated q.q / sqrt(D)
    for label, score in curves.items():
        prof.scores[label] = score.mean(0)
        prof.weights[label] = _softmax(score * scale).mean(0)
    return prof


def _feature_scores(enc, length: int, head_dim: int) -> np.ndarray:
    """``[D, L]``: basis vector ``e_f`` rotated at position ``d`` dotted with it at 0."""
    basis = torch.eye(head_dim, dtype=torch.float64)[:, None, None, :]  # [D, 1, 1, D]
    return _token_scores(enc, basis, length)


def _token_scores(enc, tokens: torch.Tensor, length: int) -> np.ndarray:
    """``[N, L]``: ``q_d . q_0 / |q|^2`` of each token ``tokens [N, 1, 1, D]`` rotated at
    positions ``d`` and 0."""
    tokens = tokens.expand(-1, 1, length, -1)  # [N, 1, L, D]
    positions = torch.arange(length)
    with torch.no_grad():
        rotated, _ = enc.rotate(tokens, tokens, positions, positions)
    rotated = rotated[:, 0].double().numpy()  # [N, L, D]
    return np.einsum("nld,nd->nl", rotated, rotated[:, 0]) / (rotated[:, 0] ** 2).sum(-1)[:, None]


def _rotary(name: str, length: int, head_dim: int, seed: int, gen: torch.Generator) -> Profile:
    shape = {"head_dim": head_dim, "num_heads": 1, "d_model": head_dim, "max_len": length}
    compare = {
        name: build_encoding(name, seed=seed, **shape),
        "rope": build_encoding("rope", **shape),
    }
    if name == "p_rope":
        names = {1.0: " (RoPE)", 0.0: " (NoPE)"}
        compare = {
            f"p = {p:g}{names.get(p, '')}": build_encoding(name, seed=seed, fraction=p, **shape)
            for p in P_FRACTIONS
        }
    prof = Profile(
        f"{name}: q·k of one token against distance, by feature and in all",
        "q_d·q_0 / |q|² (mean of random q)",
    )
    prof.features = _feature_scores(build_encoding(name, seed=seed, **shape), length, head_dim)
    q = torch.randn(DRAWS, 1, 1, head_dim, generator=gen, dtype=torch.float64)
    scale = (q * q).sum(-1).reshape(DRAWS, 1).numpy() * head_dim**-0.5  # q.q / sqrt(D)
    for label, enc in compare.items():
        score = _token_scores(enc, q, length)  # [DRAWS, L]
        prof.scores[label] = score.mean(0)
        prof.weights[label] = _softmax(score * scale).mean(0)
    return prof


def distance_figure(
    name: str, *, length: int = 64, num_heads: int = 4, head_dim: int = 16, seed: int = 0
) -> Figure:
    """The figure of ``distance_profile``: the score panel (and, for rotary encodings, the
    per-feature heatmap) and the attention weights (log scale) against the distance.

    Raises:
        ValueError: as ``distance_profile``.
    """
    prof = distance_profile(name, length=length, num_heads=num_heads, head_dim=head_dim, seed=seed)
    panels = 3 if prof.features is not None else 2
    fig = new_figure(6.2 * panels, 4.8)
    axes = fig.subplots(1, panels)
    fig.suptitle(f"{prof.title} (query at position {length - 1}, seed {seed})", fontsize=12)
    d = np.arange(length)
    if prof.features is not None:
        from posenc.viz._common import heatmap

        ax = axes[0]
        heatmap(ax, prof.features, cmap="RdBu_r", label="e_f rotated at d · e_f at 0",
                limits=(-1.0, 1.0))  # fmt: skip
        ax.set(title=f"each feature f of {name} (θ = 0: flat, position-free)",
               xlabel="distance d = m - n", ylabel="feature f")  # fmt: skip
        ax.set_yticks(range(head_dim), _feature_labels(name, head_dim, length))
    score_ax, weight_ax = axes[-2], axes[-1]
    looks = series_styles(len(prof.scores))
    every = max(1, length // 12)
    for (label, score), look, ls in zip(prof.scores.items(), looks, _dashes(prof), strict=True):
        score_ax.plot(d, score, ls=ls, lw=1.8, ms=5, markevery=every, label=label, **look)
        weight_ax.plot(d, prof.weights[label], ls=ls, lw=1.8, ms=5, markevery=every, label=label,
                       **look)  # fmt: skip
    score_ax.set(title="what the position mechanism gives the score", xlabel="distance d",
                 ylabel=prof.score_label)  # fmt: skip
    weight_ax.set(title="attention of the last query, one token everywhere",
                  xlabel="distance d", ylabel="attention weight", yscale="log")  # fmt: skip
    for ax in (score_ax, weight_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    return fig


def _dashes(prof: Profile) -> list[str]:
    """Dashed for the constant references and RoPE (which p = 0.75 covers within short
    distances), solid for the rest."""
    return [
        "--" if label.startswith("constant") or "RoPE" in label else "-" for label in prof.scores
    ]


def _feature_labels(name: str, head_dim: int, length: int) -> list[str]:
    """Feature ``f``, with ``θ = 0`` where its pair has frequency 0 (half-split pairs)."""
    enc = build_encoding(name, head_dim=head_dim, num_heads=1, d_model=head_dim, max_len=length)
    inv_freq = getattr(enc, "inv_freq", None)
    plain = [str(f) for f in range(head_dim)]
    if not isinstance(inv_freq, torch.Tensor) or getattr(enc, "interleaved", False):
        return plain
    pairs = inv_freq.numel()
    if 2 * pairs != head_dim:
        return plain
    return [f"{f} θ = 0" if inv_freq[f % pairs] == 0 else str(f) for f in range(head_dim)]


def has_distance_figure(name: str) -> bool:
    """Whether ``name`` is registered and has a distance figure."""
    return name in DISTANCE_NAMES and name in available()
