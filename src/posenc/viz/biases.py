"""Figures of what encodings do inside attention: score biases and attention maps.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C = H * D`` d_model.

* ``bias_figure``: the ``[T, T]`` logit bias ``b_ij`` of every head of the score-site
  encodings — ALiBi (Press et al. 2022, eq. 1: ``-m_h (i - j)``), T5 buckets (Raffel et
  al. 2020, section 2.1), KERPLE (Chi et al. 2022, eq. 8-9), Sandwich (Chi et al. 2023,
  eq. 3), FIRE (Li et al. 2024, eq. 4), CoPE and Shaw et al. 2018 (content-dependent:
  drawn for random ``q``, ``k``) — one row per encoding, as small multiples.
* ``attention_figure``: the softmax probabilities of a ``posenc.MultiHeadAttention``
  holding each encoding, at its (seeded) initialisation, when every position holds the
  same token: with the content equal everywhere, the pattern is the encoding's alone.
* ``attention_probs``: those probabilities for any input (the eager formula of
  ``posenc.attention_backends``, ``softmax(q k^T / sqrt(D) + b + mask)``).

Parts above the diagonal are grey: causal models never use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from posenc._checks import check_int
from posenc.attention import MultiHeadAttention, repeat_kv
from posenc.base import PositionalEncoding, Site, available, info
from posenc.viz._common import build_encoding, encodings_at, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["attention_figure", "attention_probs", "bias_figure", "score_biases"]


def score_biases(
    name: str, *, num_heads: int = 4, head_dim: int = 16, length: int = 32, seed: int = 0
) -> tuple[np.ndarray, bool]:
    """The bias ``[H, T, T]`` of a score-site encoding at its seeded initialisation.

    Returns:
        ``(bias, content)``: ``content`` is True when the bias changes with ``q`` and
        ``k`` (it is then the bias for random ``q``, ``k`` drawn from ``seed``).

    Raises:
        ValueError: ``name`` unknown or not a score-site encoding.
    """
    encodings_at(Site.SCORE, [name])
    length = check_int("length", length)
    enc = build_encoding(name, num_heads=num_heads, head_dim=head_dim,
                         d_model=num_heads * head_dim, max_len=length, seed=seed)  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    q, k, q2, k2 = torch.randn(4, 1, num_heads, length, head_dim, generator=gen)
    pos = torch.arange(length)
    with torch.no_grad():
        bias = enc.score_bias(q, k, pos, pos)
        other = enc.score_bias(q2, k2, pos, pos)
    if bias is None:
        return np.zeros((num_heads, length, length)), False
    bias = bias.expand(1, num_heads, length, length)[0].double().numpy()
    content = not torch.allclose(bias if other is None else other[0].double(),
                                 torch.from_numpy(bias))  # fmt: skip
    return bias, content


def _masked_cmap(name: str):
    """Colormap ``name`` drawing NaN (masked) cells light grey, apart from white = 0."""
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="0.82")


def _causal(values: np.ndarray) -> np.ndarray:
    """``values [..., T, T]`` with the entries above the diagonal set to NaN (blank)."""
    length = values.shape[-1]
    return np.where(np.triu(np.ones((length, length), dtype=bool), 1), np.nan, values)


def bias_figure(
    names: Sequence[str] | None = None, *, num_heads: int = 4, length: int = 32
) -> Figure:
    """Small multiples of the bias per head (columns) and encoding (rows).

    Args:
        names: score-site encodings (default: every registered one).
        num_heads: heads built and drawn.
        length: ``T``.

    Raises:
        ValueError: a name that is unknown or not a score-site encoding; none at all.
    """
    names = encodings_at(Site.SCORE, None if names is None else list(names))
    if not names:
        raise ValueError("no score-site encoding is registered or named")
    num_heads = check_int("num_heads", num_heads)
    fig = new_figure(2.6 * num_heads + 1.2, 2.5 * len(names) + 0.6)
    axes = fig.subplots(len(names), num_heads, squeeze=False)
    fig.suptitle(
        f"Attention-logit bias b[i, j] per head, query i (rows) x key j (columns), T = {length}"
        " (initialisation, seed 0; grey: masked by causality)",
        fontsize=12,
    )
    for row, name in zip(axes, names, strict=True):
        bias, content = score_biases(name, num_heads=num_heads, length=length)
        bias = _causal(bias)
        lim = float(np.nanmax(np.abs(bias))) or 1.0
        for h, ax in enumerate(row):
            image = ax.imshow(
                bias[h], cmap=_masked_cmap("RdBu_r"), vmin=-lim, vmax=lim, interpolation="nearest"
            )
            ax.set_title(f"{name}, head {h}", fontsize=10)
            ax.set_xticks([0, length - 1])
            ax.set_yticks([0, length - 1])
        row[0].set_ylabel("query i" + ("\n(random q, k)" if content else ""))
        if not np.nanmax(np.abs(bias)) > 0:
            for ax in row:
                ax.text(length * 0.3, length * 0.75, "zero at\ninitialisation", ha="center")
        row[-1].figure.colorbar(image, ax=list(row), label="bias", shrink=0.85)
    for ax in axes[-1]:
        ax.set_xlabel("key j")
    return fig


def attention_probs(mha: MultiHeadAttention, x: Tensor, positions: Tensor | None = None) -> Tensor:
    """Attention probabilities ``[B, H, T, T]`` of ``mha`` over ``x [B, T, C]``.

    The formula of the eager backend: ``softmax(rotate(q) rotate(k)^T / sqrt(D) + bias)``
    with the causal mask when ``mha.causal``; ``probs @ v`` then gives the module's
    output before ``out_proj`` (plus the value term of VALUE-site encodings).
    """
    batch, length, _ = x.shape
    heads, kv_heads, dim = mha.num_heads, mha.num_kv_heads, mha.head_dim
    pos = torch.arange(length) if positions is None else positions
    q = mha.q_proj(x).view(batch, length, heads, dim).transpose(1, 2)  # [B, H, T, D]
    k = mha.k_proj(x).view(batch, length, kv_heads, dim).transpose(1, 2)  # [B, Hkv, T, D]
    enc = mha.position
    if enc.sites & Site.QK:
        q, k = enc.rotate(q, k, pos, pos)
    k = repeat_kv(k, heads)
    logits = q @ k.transpose(-2, -1) * dim**-0.5  # [B, H, T, T]
    bias = enc.score_bias(q, k, pos, pos) if enc.sites & Site.SCORE else None
    if bias is not None:
        logits = logits + bias
    if mha.causal:
        future = pos.view(-1, length, 1) < pos.view(-1, 1, length)  # [B|1, T, T]
        logits = logits.masked_fill(future.unsqueeze(1), float("-inf"))
    return torch.softmax(logits.double(), dim=-1)


def _attention_model(name: str, d_model: int, num_heads: int, length: int):
    """``(input encoding or None, MultiHeadAttention)`` for ``name``, seeded."""
    enc = build_encoding(name, d_model=d_model, num_heads=num_heads,
                         head_dim=d_model // num_heads, max_len=length, causal=True)  # fmt: skip
    inner: PositionalEncoding | None = None if enc.sites & Site.INPUT else enc
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        mha = MultiHeadAttention(d_model, num_heads, position=inner, causal=True).eval()
    return (enc if enc.sites & Site.INPUT else None), mha


def attention_figure(
    names: Sequence[str] | None = None,
    *,
    heads: Sequence[int] = (0,),
    d_model: int = 64,
    num_heads: int = 4,
    length: int = 32,
) -> Figure:
    """Attention maps of a seeded, untrained ``MultiHeadAttention`` per encoding.

    Every position holds the same token (a fixed random vector), so the maps show what
    the encoding alone does; input-site encodings are added to that token first.

    Args:
        names: encodings (default: every registered one).
        heads: the heads drawn, one column each.
        d_model: ``C``; ``num_heads`` must divide it.
        num_heads: ``H``.
        length: ``T``.

    Raises:
        ValueError: unknown names, heads outside ``[0, num_heads)``, ``d_model`` not
            divisible by ``num_heads``.
    """
    names = available() if names is None else [info(n).name for n in names]
    bad = [h for h in heads if not 0 <= h < num_heads]
    if bad or not heads:
        raise ValueError(f"heads must be a non-empty list in [0, {num_heads}), got {list(heads)}")
    columns = len(heads) if len(heads) > 1 else min(4, len(names))
    panels = [(n, h) for n in names for h in heads]
    rows = -(-len(panels) // columns)
    fig = new_figure(3.1 * columns + 1.0, 2.9 * rows + 0.7)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    fig.suptitle(
        "Attention of an untrained MultiHeadAttention (seed 1) when all "
        f"{length} positions hold the same token:\nlog2(probability x visible keys), "
        "0 = uniform over the visible keys (grey: masked); query (rows) x key (columns)",
        fontsize=12,
    )
    token = torch.randn(d_model, generator=torch.Generator().manual_seed(0))
    x = token.expand(1, length, d_model).double()
    visible = np.arange(1, length + 1)[:, None]  # keys a causal query i sees
    image = None
    for ax, (name, head) in zip(axes, panels, strict=False):
        embed, mha = _attention_model(name, d_model, num_heads, length)
        with torch.no_grad():
            h = x if embed is None else embed.embed(x)
            probs = attention_probs(mha.double(), h)[0, head].numpy()
        ratio = _causal(np.log2(np.maximum(probs * visible, 1e-30)))
        image = ax.imshow(
            ratio, cmap=_masked_cmap("PuOr_r"), vmin=-1.5, vmax=1.5, interpolation="nearest"
        )
        ax.set_title(f"{name}, head {head}", fontsize=10)
        ax.set_xticks([0, length - 1])
        ax.set_yticks([0, length - 1])
    for ax in axes[len(panels) :]:
        ax.axis("off")
    fig.colorbar(image, ax=list(axes), label="log2(p / uniform)", shrink=0.6, extend="both")
    return fig
