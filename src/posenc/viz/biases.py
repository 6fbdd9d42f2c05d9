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
  ``posenc.attention.backends``, ``softmax(q k^T / sqrt(D) + b + mask)``).

Parts above the diagonal are grey: causal models never use them. Each panel has its own
colour scale (heads differ by orders of magnitude): a sequential map for a one-signed
bias (ALiBi, KERPLE, Sandwich are <= 0), a diverging map centred on zero otherwise.
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
from posenc.viz._common import build_encoding, encodings_at, line_positions, new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
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


def colour_scale(values: np.ndarray, *, centred: bool = False) -> dict[str, object]:
    """``imshow`` keywords (``cmap``, ``vmin``, ``vmax``) that fit ``values`` (NaN ignored).

    All <= 0: a sequential map, white at 0 and darkest at the minimum; all >= 0: white at
    0 and darkest at the maximum; both signs, or ``centred``: a diverging map symmetric
    about 0. The range is the data's own, so nothing saturates.
    """
    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    if low < 0 < high or (centred and (low or high)):
        lim = max(-low, high)
        return {"cmap": _masked_cmap("RdBu_r"), "vmin": -lim, "vmax": lim}
    if low < 0:
        return {"cmap": _masked_cmap("Blues_r"), "vmin": low, "vmax": 0.0}
    if high > 0:
        return {"cmap": _masked_cmap("Reds"), "vmin": 0.0, "vmax": high}
    return {"cmap": _masked_cmap("Greys"), "vmin": 0.0, "vmax": 1.0}  # all zero: white


def _panel(
    ax: Axes,
    values: np.ndarray,
    *,
    title: str,
    label: str | None,
    centred: bool = False,
    flat: str = "zero at\ninitialisation",
) -> None:
    """One ``[T, T]`` map with its own colour bar (labelled when ``label`` is given).

    A map that is zero up to rounding (``< 1e-9``) is drawn white with the note ``flat``
    and no colour bar: a scale stretched over rounding noise would draw a pattern.
    """
    length = values.shape[-1]
    if not np.nanmax(np.abs(values)) > 1e-9:
        values = np.where(np.isnan(values), np.nan, 0.0)
    image = ax.imshow(values, interpolation="nearest", **colour_scale(values, centred=centred))
    ax.set_title(title, fontsize=10)
    ax.set_xticks([0, length - 1])
    ax.set_yticks([0, length - 1])
    if not np.nanmax(np.abs(values)) > 0:
        ax.text(length / 2, length * 0.7, flat, ha="center")
        return
    bar = ax.figure.colorbar(image, ax=ax, shrink=0.8, pad=0.02)
    bar.ax.tick_params(labelsize=8)
    if label:
        bar.set_label(label, fontsize=9)


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
    fig = new_figure(max(8.0, 3.0 * num_heads + 0.6), 2.5 * len(names) + 1.2)  # title fits
    axes = fig.subplots(len(names), num_heads, squeeze=False)
    fig.suptitle(
        f"Attention-logit bias b[i, j] per head, T = {length}, at initialisation (seed 0)\n"
        "query i (rows) x key j (columns); grey: masked by causality;\n"
        "each panel has its own colour scale",
        fontsize=12,
    )
    for row, name in zip(axes, names, strict=True):
        bias, content = score_biases(name, num_heads=num_heads, length=length)
        bias = _causal(bias)
        for h, ax in enumerate(row):
            label = "bias" if h == num_heads - 1 else None
            _panel(ax, bias[h], title=f"{name}, head {h}", label=label)
            ax.set_xlabel("key j", fontsize=9)
        row[0].set_ylabel("query i" + ("\n(random q, k)" if content else ""))
    return fig


def attention_probs(mha: MultiHeadAttention, x: Tensor, positions: Tensor | None = None) -> Tensor:
    """Attention probabilities ``[B, H, T, T]`` of ``mha`` over ``x [B, T, C]``.

    The formula of the eager backend: ``softmax(rotate(q) rotate(k)^T / sqrt(D) + bias)``
    with the causal mask when ``mha.causal``; ``probs @ v`` then gives the module's
    output before ``out_proj`` (plus the value term of VALUE-site encodings).
    ``positions`` are token positions ``[T]`` / ``[B, T]`` (default ``0..T-1``); an axial
    (patch) encoding rotates at the patches along one row (``line_positions``).
    """
    batch, length, _ = x.shape
    heads, kv_heads, dim = mha.num_heads, mha.num_kv_heads, mha.head_dim
    pos = torch.arange(length) if positions is None else positions
    q = mha.q_proj(x).view(batch, length, heads, dim).transpose(1, 2)  # [B, H, T, D]
    k = mha.k_proj(x).view(batch, length, kv_heads, dim).transpose(1, 2)  # [B, Hkv, T, D]
    enc = mha.position
    if enc.sites & Site.QK:
        q, k = enc.rotate(q, k, line_positions(enc, pos), line_positions(enc, pos))
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
    fig = new_figure(max(8.0, 3.3 * columns + 0.4), 2.9 * rows + 0.9)  # the title fits
    axes = fig.subplots(rows, columns, squeeze=False)
    fig.suptitle(
        f"Attention of an untrained MultiHeadAttention (seed 1), all {length} positions holding "
        "the same token:\nlog2(p / uniform), 0 (white) = uniform over the visible keys; "
        "grey: masked; each panel has its own colour scale",
        fontsize=12,
    )
    token = torch.randn(d_model, generator=torch.Generator().manual_seed(0))
    x = token.expand(1, length, d_model).double()
    visible = np.arange(1, length + 1)[:, None]  # keys a causal query i sees
    for i, (ax, (name, head)) in enumerate(zip(axes.ravel(), panels, strict=False)):
        embed, mha = _attention_model(name, d_model, num_heads, length)
        with torch.no_grad():
            h = x if embed is None else embed.embed(x)
            probs = attention_probs(mha.double(), h)[0, head].numpy()
        ratio = _causal(np.log2(np.maximum(probs * visible, 1e-30)))
        last_column = i % columns == columns - 1 or i == len(panels) - 1
        label = "log2(p / uniform)" if last_column else None
        title = f"{name}, head {head}"
        _panel(ax, ratio, title=title, label=label, centred=True, flat="uniform")
        ax.set_xlabel("key j", fontsize=9)
        if i % columns == 0:
            ax.set_ylabel("query i")
    for ax in axes.ravel()[len(panels) :]:
        ax.axis("off")
    return fig
