"""A terminal tour of one encoding: its numbers, and what they do to attention.

Shapes: ``L`` positions, ``C`` d_model, ``H`` heads, ``D`` head_dim. ``explain(name)``
prints, for an encoding acting at the input site (Vaswani et al. 2017, section 3.5),
the first positions x dimensions, a Unicode heatmap, the pairwise distances of the
positions, the relative-position numbers (the error of the sinusoidal rotation ``M_k``,
``PE[p + k] ~ M_k PE[p]``, and the cosine similarity of successive steps
``PE[p + k] - PE[p]``) and the effect on attention (one word at two positions, two words
at one position). Rotary encodings (Su et al. 2021, RoFormer, section 3.4) get the
rotated dot product against the offset; bias encodings get the bias of a few heads and
the attention it alone produces. Every number is computed, none is quoted.
"""

from __future__ import annotations

import numpy as np
import torch
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from posenc import analysis
from posenc._checks import check_int
from posenc.base import PositionalEncoding, Site, info
from posenc.viz._common import build_encoding, line_positions
from posenc.viz.distance import distance_profile, has_distance_figure

__all__ = ["explain", "word_vectors"]

_BARS = "▁▂▃▄▅▆▇█"
OFFSETS = (1, 2, 3, 5, 10)

#: The largest tour: its tables and analyses grow with positions x dims (x heads).
MAX_LENGTH, MAX_DIM, MAX_HEADS = 4096, 1024, 16

#: Rows and columns of the Unicode heatmap (a terminal shows no more).
HEATMAP_ROWS, HEATMAP_COLUMNS = 64, 64

#: First positions n of the rotated dot-product table; the last is past Llama 4's 8192,
#: where a position temperature starts to scale the queries.
STARTS = (0, 10, 100, 10_000)


def word_vectors(dim: int, count: int = 2, *, seed: int = 0) -> np.ndarray:
    """``count`` stand-in word embeddings ``[count, dim]``, uniform in [0, 1) (seeded)."""
    return np.random.default_rng(seed).uniform(0.0, 1.0, size=(count, dim))


def explain(
    name: str,
    *,
    dim: int = 16,
    length: int = 20,
    num_heads: int = 4,
    console: Console | None = None,
) -> None:
    """Print the tour of the registered encoding ``name``.

    Args:
        name: a name from ``posenc.available()``.
        dim: ``C`` for input encodings, ``D`` (per head) for the others; even, >= 4.
        length: number of positions ``L`` shown and analysed (>= 12).
        num_heads: heads of bias encodings.
        console: where to print (default: a new ``rich`` console on stdout).

    Raises:
        ValueError: unknown ``name``; ``dim`` odd or outside 4..``MAX_DIM``, ``length``
            outside 12..``MAX_LENGTH``, ``num_heads`` outside 1..``MAX_HEADS``.
    """
    entry = info(name)
    dim, length = check_int("dim", dim, minimum=4), check_int("length", length, minimum=12)
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    num_heads = check_int("num_heads", num_heads)
    for label, value, limit in (
        ("dim", dim, MAX_DIM),
        ("length", length, MAX_LENGTH),
        ("num_heads", num_heads, MAX_HEADS),
    ):
        if value > limit:
            raise ValueError(f"{label} must be <= {limit}, got {value}")
    out = console or Console()
    sites = " + ".join(entry.sites.names()) or "none"
    body = Text.assemble(entry.description, "\n", (f"{entry.paper}\nacts at: {sites}", "dim"))
    _say(out, Panel(body, title=Text(name, style="bold"), expand=False))
    if entry.sites & Site.INPUT:
        enc = build_encoding(name, d_model=dim, max_len=length)
    else:
        shape = {"d_model": dim * num_heads, "head_dim": dim, "num_heads": num_heads}
        enc = build_encoding(name, **shape, max_len=length)
    if any(True for _ in enc.parameters()):
        _say(out, "Learned parameters are shown at their initialisation (seed 0).\n")
    if entry.sites & Site.INPUT:
        _absolute_tour(out, enc, dim, length)
    if entry.sites & Site.QK:
        _rotary_tour(out, enc, dim, length)
    if entry.sites & Site.SCORE:
        _bias_tour(out, enc, dim, length, num_heads, name=name)
    if entry.sites & Site.VALUE:
        _say(out, "It also adds a learned term to the attention output (the value site).\n")
    if entry.sites & Site.WEIGHTS:
        _say(
            out,
            "It computes the attention weights itself (the weights site): from the queries,\n"
            "the keys and per-token gates that the layer computes from its input and the KV\n"
            "cache keeps; no softmax over q.k plus a bias. What it does over distance\n"
            "depends on the content: below for random inputs and for typical constant values.\n",
        )
    if has_distance_figure(name):
        _distance_tour(out, name, dim, length, num_heads)
    if not entry.sites:
        _no_position_tour(out, dim)


# --------------------------------------------------------------------------- helpers


def _say(out: Console, *objects: object) -> None:
    """Print without rich markup: the tour's text is full of brackets (``PE[p + k]``)."""
    out.print(*objects, markup=False, highlight=False)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _num(value: float, spec: str) -> str:
    """``format(value, spec)`` without the sign of a value that rounds to zero (no -0.00)."""
    text = format(value, spec)
    return text[1:] if text.startswith("-") and not any(c in "123456789" for c in text) else text


def _titled(out: Console, title: str, table: Table) -> None:
    """Print ``title`` on its own line (wrapped at words, never to the table's width)."""
    _say(out, Text(title, style="bold"))
    _say(out, table)


def _table(columns: list[str]) -> Table:
    table = Table()
    for col in columns:
        table.add_column(col, justify="right")
    return table


def _matrix(values: np.ndarray, *, spec: str = ".2f", row: str = "") -> Table:
    table = Table(box=None, pad_edge=False)
    table.add_column(row, justify="right", style="dim")
    for j in range(values.shape[1]):
        table.add_column(str(j), justify="right")
    for i, line in enumerate(values):
        table.add_row(str(i), *("·" if np.isnan(v) else _num(v, spec) for v in line))
    return table


def _heatmap(values: np.ndarray) -> Text:
    """One glyph per value, ``▁`` (most negative) to ``█`` (most positive), coloured;
    at most ``HEATMAP_ROWS`` x ``HEATMAP_COLUMNS`` of them (the first)."""
    values = values[:HEATMAP_ROWS, :HEATMAP_COLUMNS]
    scale = float(np.abs(values).max()) or 1.0
    text = Text()
    for i, line in enumerate(values):
        text.append(f"{i:>4} ", style="dim")
        for v in line / scale:
            level = min(len(_BARS) - 1, int((v + 1) / 2 * len(_BARS)))
            text.append(_BARS[level], style="red" if v > 0 else "blue")
        text.append("\n")
    text.append(f"     {_BARS[0]} = {-scale:.3g}   {_BARS[-1]} = {scale:.3g}", style="dim")
    return text


# --------------------------------------------------------------------------- input site


def _absolute_tour(out: Console, enc: PositionalEncoding, dim: int, length: int) -> None:
    with torch.no_grad():
        pe = enc.embed(torch.zeros(1, length, dim, dtype=torch.float64))[0].numpy()  # [L, C]
    shown = min(8, dim)
    title = f"Encoding values (first 10 positions x {shown} dims)"
    _titled(out, title, _matrix(pe[:10, :shown], spec=".3f", row="pos"))
    rows, cols = min(length, HEATMAP_ROWS), min(dim, HEATMAP_COLUMNS)
    shape = f"{rows} positions x {cols} dims" + (
        f" (the first of {length} x {dim})" if (rows, cols) != (length, dim) else ""
    )
    _say(out, Text(f"\nHeatmap ({shape})", style="bold"))
    _say(out, _heatmap(pe))
    stats = analysis.encoding_statistics(pe)
    _say(
        out,
        f"norms {stats['norms'].min():.4f} .. {stats['norms'].max():.4f}, values "
        f"{stats['min']:.4f} .. {stats['max']:.4f}\n",
    )
    dist = np.linalg.norm(pe[:8, None] - pe[None, :8], axis=-1)
    _titled(out, "Position uniqueness (pairwise L2 distances)", _matrix(dist, row="pos"))
    _say(out, f"closest two positions of {length}: distance {analysis.uniqueness(pe):.4f}\n")

    table = _table(["k", "M_k max error", "cos(step_p, step_p+1) mean", "min"])
    for k in [k for k in OFFSETS if k <= length - 2]:
        err = analysis.relative_position_matrix(pe, k)[1]
        cons = analysis.difference_consistency(pe, k)
        table.add_row(str(k), f"{err:.3e}", _num(cons["mean"], ".4f"), _num(cons["min"], ".4f"))
    _titled(out, "Relative position: PE[p+k] from PE[p]", table)
    _say(
        out,
        "M_k is the sinusoidal encoding's block-diagonal rotation (error ~1e-16 only for "
        "a sinusoidal table). step_p = PE[p+k] - PE[p]; for sinusoids step_p+1 = M_1 step_p, "
        "so its cosine is one number for every p (min = mean). A spread between min and "
        "mean means the step depends on p.\n",
    )

    word = np.full(dim, 0.5)
    a, b = word_vectors(dim)
    _say(out, Text("Effect on attention (cosine similarity of word + PE[p])", style="bold"))
    _say(
        out,
        f"  same word (all 0.5) at positions 3 and 7: without PE "
        f"{_cos(word, word):.4f}, with PE {_cos(word + pe[3], word + pe[7]):.4f}",
    )
    _say(
        out,
        f"  different words a, b at position 5:        {_cos(a + pe[5], b + pe[5]):.4f}"
        f"   (without PE {_cos(a, b):.4f})",
    )
    late = min(15, length - 1)
    _say(
        out, f"  same word a at positions 5 and {late}:        {_cos(a + pe[5], a + pe[late]):.4f}"
    )
    _say(out, "  (a, b: uniform [0, 1) vectors, seed 0)\n")


# --------------------------------------------------------------------------- QK site


def _rotated_scores(
    enc: PositionalEncoding, q: torch.Tensor, k: torch.Tensor, q_pos: list[int], k_pos: list[int]
) -> np.ndarray:
    """``rotate(q at q_pos[t]) . rotate(k at k_pos[t])`` for every t, float64 ``[T]``."""
    count = len(q_pos)
    qs = q.expand(1, 1, count, -1)  # [B, H, T, D]
    ks = k.expand(1, 1, count, -1)
    q_pos, k_pos = (line_positions(enc, torch.tensor(p)) for p in (q_pos, k_pos))
    with torch.no_grad():
        rq, _ = enc.rotate(qs, ks, q_pos, q_pos)
        _, rk = enc.rotate(qs, ks, k_pos, k_pos)
    return (rq * rk).sum(-1).reshape(count).double().numpy()


def _rotary_tour(out: Console, enc: PositionalEncoding, dim: int, length: int) -> None:
    inv_freq = getattr(enc, "inv_freq", None)
    if isinstance(inv_freq, torch.Tensor) and bool((inv_freq > 0).any()):
        freqs = inv_freq.double().cpu().numpy()
        moving = freqs[freqs > 0]
        flat = freqs.size - moving.size
        _say(
            out,
            f"{moving.size} rotated pairs; angle per position theta_i from "
            f"{moving.max():.4g} to {moving.min():.4g} rad, wavelengths "
            f"{2 * np.pi / moving.max():.4g} .. {2 * np.pi / moving.min():.4g} positions"
            + (f"; {flat} pairs at frequency 0 (position-free)" if flat else "")
            + "\n",
        )
    if enc.position_shape == "[N, A]":
        _say(out, "Positions m, n below are image patches along one row: (0, m), (0, n).\n")
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 1, dim, generator=gen, dtype=torch.float64)
    offsets = [r for r in (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89) if r < length]
    table = _table(["m - n", *(f"n = {n}" for n in STARTS), "same x: x_m.x_n / |x|^2"])
    scores = np.array(
        [[_rotated_scores(enc, q, k, [n + r], [n])[0] for n in STARTS] for r in offsets]
    )  # [offsets, starts]
    for r, row in zip(offsets, scores, strict=True):
        same = _rotated_scores(enc, q, q, [r], [0])[0] / float((q * q).sum())
        table.add_row(str(r), *(_num(v, ".4f") for v in row), _num(same, ".4f"))
    title = "Rotated dot product q_m . k_n against the offset m - n (random q, k; seed 0)"
    _titled(out, title, table)
    spread = float(np.ptp(scores, axis=1).max())
    # float64 rounding of angles up to ~1e4 rad: far below any change the eye can see
    relative = bool(spread <= 1e-9 * max(float(np.abs(scores).max()), 1.0))
    verdict = (
        "only m - n matters."
        if relative
        else "the scores depend on the positions themselves, not only on m - n."
    )
    _say(
        out,
        f"Across the columns (the same offset at different positions) the scores differ "
        f"by at most {spread:.2e}: {verdict}",
    )
    _say(out, f"Without rotation q . k = {float((q * k).sum()):.4f} at every offset.")
    a, b = torch.randn(2, 1, 1, 1, dim, generator=gen, dtype=torch.float64)
    both, plain = _rotated_scores(enc, a, b, [7], [7])[0], float((a * b).sum())
    cancel = abs(both - plain) <= 1e-9 * max(abs(plain), 1.0)  # float64 rounding only
    verdict = "the rotations cancel" if cancel else "the transforms do not cancel"
    _say(
        out,
        f"Different tokens at one position (7): {both:.4f}, unrotated "
        f"{plain:.4f}: at equal positions {verdict}.\n",
    )


# --------------------------------------------------------------------------- SCORE site


def _bias_tour(
    out: Console, enc: PositionalEncoding, dim: int, length: int, heads: int, *, name: str
) -> None:
    # only the rows shown: the first 8 queries x keys, and the last query x every key
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, heads, length, dim, generator=gen)
    pos, last, corner = torch.arange(length), length - 1, min(8, length)
    with torch.no_grad():
        top = enc.score_bias(q[:, :, :corner], k[:, :, :corner], pos[:corner], pos[:corner])
        row = enc.score_bias(q[:, :, last:], k, pos[last:], pos)
        other = enc.score_bias(
            torch.randn_like(q[:, :, last:]), torch.randn_like(k), pos[last:], pos
        )
    if top is None or row is None:
        _say(out, "This encoding adds no bias to the scores.\n")
        return
    top = top.expand(1, heads, corner, corner)[0].double().numpy()  # [H, 8, 8]
    row = row.expand(1, heads, 1, length)[0, :, 0].double().numpy()  # [H, L]
    if not (np.any(top) or np.any(row)):
        _say(
            out,
            "Untrained, this bias is exactly zero for every head and distance: its learned "
            "parameters start at zero, so attention is uniform until the model is trained "
            f"(`posenc lab --encodings {name}` trains one).\n",
        )
        return
    other_row = other.expand(1, heads, 1, length)[0, :, 0].double().numpy()
    content = other is not None and not np.allclose(row, other_row)
    if content:
        _say(out, "The bias depends on the content: shown for random q, k (seed 0).")
    causal = getattr(enc, "causal", True)
    future = np.triu(np.ones((corner, corner), dtype=bool), 1)
    for h in sorted({0, heads - 1}):
        shown = np.where(future & causal, np.nan, top[h])
        title = f"Bias of head {h} (query row, key column; · = masked)"
        _titled(out, title, _matrix(shown, row="q\\k"))
    dists = [d for d in (0, 1, 2, 4, 8, 16, 32) if d <= last]
    table = _table(["head", *(f"d={d}" for d in dists)])
    visible = row  # the last query sees every key, causal or not
    probs = np.exp(visible - visible.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    for h in range(heads):
        table.add_row(f"{h} bias", *(_num(row[h, last - d], ".3f") for d in dists))
        table.add_row(f"{h} attn", *(f"{probs[h, last - d]:.1%}" for d in dists), style="cyan")
    title = f"Last query ({last}): bias at distance d, and the attention the bias alone gives"
    _titled(out, title, table)
    _say(out, f"Without a bias every visible key gets {1 / probs.shape[-1]:.1%}.\n")


def _distance_tour(out: Console, name: str, dim: int, length: int, num_heads: int) -> None:
    """The numbers of ``posenc show NAME``'s figure (``posenc.viz.distance``)."""
    prof = distance_profile(name, length=length, num_heads=num_heads, head_dim=dim)
    dists = [d for d in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256) if d < length]
    for what, curves, spec in (
        (prof.score_label, prof.scores, ".3f"),
        ("attention of the last query, one token everywhere", prof.weights, ".2e"),
    ):
        table = _table(["", *(f"d={d}" for d in dists)])
        for label, row in curves.items():
            cells = ("·" if np.isnan(row[d]) else _num(row[d], spec) for d in dists)
            table.add_row(label, *cells)
        _titled(out, f"{prof.title}: {what}, at distance d", table)
    _say(out, f"`posenc show {name}` draws these curves over every distance.\n")


def _no_position_tour(out: Console, dim: int) -> None:
    word = word_vectors(dim, 1)[0]
    _say(
        out,
        "No positional signal: the same word at positions 3 and 7 is the same vector "
        f"(cosine {_cos(word, word):.4f}).",
    )
    _say(
        out,
        "Without a mask, attention is permutation equivariant: shuffling the tokens "
        "shuffles the outputs (error "
        f"{analysis.permutation_equivariance_error(seq_len=8, d_model=dim):.1e}).",
    )
    _say(
        out,
        "Under a causal mask the query at position p sees p + 1 keys; over identical "
        "tokens it attends 1/(p + 1) to each, which is all the order it can infer.\n",
    )
