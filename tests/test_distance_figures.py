"""The tour of the positions of 2024-26 (``posenc.viz.distance``): each figure renders and
compares (distinct looks, labels, ticks over the data), its numbers are the library's own
weights, and ``posenc show`` / ``posenc explain`` reach them and name the paper.

Shapes: ``L`` length, ``H`` heads, ``D`` head_dim.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch

from conftest import tolerances
from posenc import cli
from posenc.base import available, info
from posenc.encodings import fox_weights, path_weights, stick_breaking_weights
from posenc.palette import MIN_CONTRAST, contrast
from posenc.viz._common import build_encoding
from posenc.viz.distance import (
    DISTANCE_NAMES,
    STICK_BETAS,
    _householder_scores,
    distance_profile,
)
from posenc.viz.gallery import FigureOptions, make_figure

matplotlib.use("Agg")

NAMES = [n for n in DISTANCE_NAMES if n in available()]
L, H, D = 24, 2, 8
AUTHORS = {
    "fox": "Lin",
    "stick_breaking": "Tan",
    "path": "Yang",
    "p_rope": "Barbero",
    "fope": "Hua",
}


@pytest.mark.parametrize("name", NAMES)
def test_figure_compares(name):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = make_figure(name, FigureOptions(length=L))
    FigureCanvasAgg(fig).draw()
    for ax in fig.axes:
        lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        if not lines:
            continue
        looks = {(matplotlib.colors.to_hex(ln.get_color()), ln.get_marker()) for ln in lines}
        assert len(looks) == len(lines), ax.get_title()
        assert all(contrast(color) >= MIN_CONTRAST for color, _ in looks)
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
        ys = np.concatenate([np.asarray(ln.get_ydata(), float) for ln in lines])
        low, high = sorted(ax.get_ylim())
        assert low <= np.nanmin(ys) and np.nanmax(ys) <= high


def test_fox_curves_are_the_librarys_weights():
    prof = distance_profile("fox", length=L, num_heads=H, head_dim=D)
    enc = build_encoding("fox", d_model=H * D, num_heads=H, head_dim=D)
    torch.manual_seed(0)
    tol = tolerances(torch.float64, ops=4 * L)
    constants = [label for label in prof.scores if label.startswith("constant")]
    assert constants  # the loop below checks something
    for label in constants:
        decay = prof.scores[label]
        f = float(label.split("= ")[1])
        cum = (torch.arange(1, L + 1, dtype=torch.float64) * math.log(f)).view(1, 1, L, 1)
        zero = torch.zeros(1, 1, L, D, dtype=torch.float64)
        pos = torch.arange(L)
        want = fox_weights(zero, zero, pos, pos, cum, cum)[0, 0, -1].flip(-1).numpy()
        np.testing.assert_allclose(prof.weights[label], want, **tol)
        np.testing.assert_allclose(decay, np.arange(L) * math.log(f), **tol)
    assert sum(not k.startswith("constant") for k in prof.scores) == min(H, 6)
    assert enc.gate.weight.shape == (H, H * D)


def test_stick_curves_are_the_librarys_weights():
    prof = distance_profile("stick_breaking", length=L, head_dim=D)
    pos = torch.arange(L)
    for beta in STICK_BETAS:
        z = math.log(beta / (1 - beta))  # q.k / sqrt(D) = logit(beta)
        q = torch.zeros(1, 1, L, D, dtype=torch.float64)
        q[..., 0] = z * math.sqrt(D)
        k = torch.zeros_like(q)
        k[..., 0] = 1.0
        want = stick_breaking_weights(q, k, pos, pos)[0, 0, -1].flip(-1).numpy()
        got = prof.weights[f"constant beta = {beta:g}"]
        assert np.isnan(got[0]) and want[0] == 0  # no attention to itself
        np.testing.assert_allclose(got[1:], want[1:], **tolerances(torch.float64, ops=4 * L))


def test_path_scores_are_the_chunked_kernels_logits():
    enc = build_encoding("path", d_model=H * D, num_heads=H, head_dim=D)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, L, H * D, generator=gen, dtype=torch.float64)
    q = torch.randn(1, D, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        gates = enc.gates(x)  # [1, H, L, D + 2]
    pos = torch.arange(L)
    tokens = q.view(1, 1, 1, D).expand(1, H, L, D)
    weights = path_weights(tokens, tokens, pos, pos, gates, gates, chunk_size=5)[0, :, -1]
    for h in range(H):
        g = gates[0, h].numpy()
        score = _householder_scores(g[:, :D], g[:, D], q.numpy())[0] * (q @ q.T).item()
        logits = score * D**-0.5
        want = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        got = weights[h].flip(-1).numpy()
        np.testing.assert_allclose(got, want, **tolerances(torch.float64, ops=16 * L))


def test_p_rope_flat_features_and_nope():
    prof = distance_profile("p_rope", length=L, head_dim=D)
    enc = build_encoding("p_rope", head_dim=D, num_heads=1, d_model=D)
    flat = np.concatenate(
        [np.arange(enc.kept_pairs, D // 2), D // 2 + np.arange(enc.kept_pairs, D // 2)]
    )
    np.testing.assert_allclose(prof.features[flat], 1.0, **tolerances(torch.float64))
    assert not np.allclose(prof.features[0], 1.0)  # the fastest pair turns
    np.testing.assert_allclose(prof.scores["p = 0 (NoPE)"], 1.0, **tolerances(torch.float64))
    np.testing.assert_allclose(
        prof.weights["p = 0 (NoPE)"], 1 / L, **tolerances(torch.float64, ops=L)
    )


@pytest.mark.parametrize("name", NAMES)
def test_show_and_explain_reach_it(name, tmp_path, capsys):
    out = tmp_path / f"{name}.png"
    assert cli.main(["show", name, "--len", str(L), "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    assert cli.main(["explain", name, "--len", "16"]) == 0
    text = capsys.readouterr().out
    assert AUTHORS[name] in text and AUTHORS[name] in info(name).paper
    assert "at distance d" in text


def test_bad_requests_are_refused(capsys):
    with pytest.raises(ValueError, match="'rope'"):
        distance_profile("rope")
    with pytest.raises(ValueError, match="length"):
        distance_profile("fox", length=1)
    assert cli.main(["show", "p_rope", "--heads", "2"]) == 2
    assert "--heads does not apply" in capsys.readouterr().err
