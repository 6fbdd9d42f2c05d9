"""`posenc explain`: the tour prints the numbers of a known case, computed here again.

The expected values come from the formulas (Vaswani et al. 2017 section 3.5 for the
sinusoidal table, RoFormer eq. 34 for the rotation, Press et al. 2022 for ALiBi's
slopes), written in NumPy in this file, never from posenc.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import posenc
from posenc.cli import main
from posenc.explain import word_vectors

DIM, LEN = 16, 20


def sinusoidal(length: int, dim: int) -> np.ndarray:
    pe = np.zeros((length, dim))
    for p in range(length):
        for i in range(dim // 2):
            angle = p / 10000.0 ** (2 * i / dim)
            pe[p, 2 * i], pe[p, 2 * i + 1] = np.sin(angle), np.cos(angle)
    return pe


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def run(capsys, *argv: str) -> str:
    assert main(["explain", *argv]) == 0
    return capsys.readouterr().out


def table_row(out: str, first: str) -> list[float]:
    """The numbers of the rich table row whose first cell is ``first``."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) > 1 and cells[0] == first:
            return [float(c) for c in cells[1:]]
    raise AssertionError(f"no table row {first!r} in the output")


def test_sinusoidal_tour_numbers(capsys):
    out = run(capsys, "sinusoidal", "--dim", str(DIM), "--len", str(LEN))
    pe = sinusoidal(LEN, DIM)
    row = next(line for line in out.splitlines() if line.split()[:1] == ["1"])
    np.testing.assert_allclose([float(v) for v in row.split()[1:]], pe[1, :8], atol=5e-4)
    for k in (1, 2, 3, 5, 10):
        error, mean, low = table_row(out, str(k))
        deltas = pe[k:] - pe[:-k]
        sims = [cos(deltas[p], deltas[p + 1]) for p in range(len(deltas) - 1)]
        assert error < 1e-12  # M_k PE[p] = PE[p + k] exactly, up to rounding
        assert f"{mean:.4f}" == f"{np.mean(sims):.4f}" and f"{low:.4f}" == f"{min(sims):.4f}"
        assert mean == low  # one rotation maps every step to the next
    word = np.full(DIM, 0.5)
    assert f"with PE {cos(word + pe[3], word + pe[7]):.4f}" in out
    a, b = np.random.default_rng(0).uniform(0.0, 1.0, (2, DIM))
    np.testing.assert_array_equal(word_vectors(DIM), np.stack([a, b]))
    assert f"{cos(a + pe[5], b + pe[5]):.4f}   (without PE {cos(a, b):.4f})" in out
    assert f"positions 5 and 15:        {cos(a + pe[5], a + pe[15]):.4f}" in out
    assert "▁ = -1   █ = 1" in out  # the heatmap's scale


def test_distance_matrix(capsys):
    out = run(capsys, "sinusoidal", "--dim", "8", "--len", "12")
    pe = sinusoidal(12, 8)
    dist = np.linalg.norm(pe[:8, None] - pe[None, :8], axis=-1)
    start = out.index("pairwise L2 distances")
    lines = out[start:].splitlines()[2:10]
    shown = np.array([[float(v) for v in line.split()[1:]] for line in lines])
    np.testing.assert_allclose(shown, dist, atol=5e-3)


def test_learned_table_is_not_a_rotation(capsys):
    out = run(capsys, "learned", "--dim", "8", "--len", "12")
    assert "initialisation" in out
    assert table_row(out, "1")[0] > 1e-3  # the sinusoidal M_k does not fit a random table


def test_rope_tour_rotated_dot_product(capsys):
    dim = 8
    out = run(capsys, "rope", "--dim", str(dim), "--len", "12")
    gen = torch.Generator().manual_seed(0)  # the tour's documented inputs
    q, k = torch.randn(2, 1, 1, 1, dim, generator=gen, dtype=torch.float64).numpy()
    q, k = q.reshape(dim), k.reshape(dim)
    theta = 10000.0 ** (-2 * np.arange(dim // 2) / dim)
    qc = q[: dim // 2] + 1j * q[dim // 2 :]  # half-split pairs as complex numbers
    kc = k[: dim // 2] + 1j * k[dim // 2 :]
    for r in (0, 1, 2, 3, 5, 8):
        score = float(np.real(np.sum(qc * np.conj(kc) * np.exp(1j * r * theta))))
        assert table_row(out, str(r))[:3] == pytest.approx([score] * 3, abs=6e-5)
    spread = float(re.search(r"differ by\s+at most ([\d.e+-]+)", out).group(1))
    assert spread < 1e-10
    assert re.search(r"at equal\s+positions the rotations cancel", out)


def test_fope_tour_says_its_transforms_do_not_cancel(capsys):
    out = " ".join(run(capsys, "fope").split())  # rich wraps lines
    assert "not only on m - n" in out and "the transforms do not cancel" in out


def test_alibi_tour_bias_and_attention(capsys):
    out = run(capsys, "alibi", "--len", "12", "--heads", "4")
    slope = 2.0 ** (-8.0 / 4)  # head 0 of 4
    rows = [line.split() for line in out.splitlines() if line.startswith("  3 ")]
    assert [float(v) for v in rows[0][1:5]] == pytest.approx([-3 * slope, -2 * slope, -slope, 0])
    weights = np.exp(-slope * np.arange(12))
    attn = table_row(out.replace("%", ""), "0 attn")
    assert attn[0] == pytest.approx(100 * weights[0] / weights.sum(), abs=0.05)


@pytest.mark.parametrize("name", posenc.available())
def test_every_encoding_has_a_tour(capsys, name):
    entry = posenc.info(name)  # only the options that apply to it (the others are refused)
    positional = entry.sites == posenc.Site.SCORE and (
        entry.cls.offset_only or entry.cls.positional_bias
    )
    options = ([] if positional else ["--dim", "8"]) + ["--len", "12"]
    options += ["--heads", "2"] if entry.sites & posenc.Site.SCORE else []
    out = run(capsys, name, *options)
    assert name in out.splitlines()[0]
    assert len(out.splitlines()) > 5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nosuch"], "unknown encoding 'nosuch'"),
        (["sinusoidal", "--dim", "7"], "dim must be even, got 7"),
        (["sinusoidal", "--dim", "2"], "dim must be >= 4, got 2"),
        (["rope", "--len", "5"], "--len must be >= 12, got 5"),
        (["alibi", "--heads", "0"], "--heads must be >= 1, got 0"),
        (["sinusoidal", "--dim", "x"], "invalid int value"),
    ],
)
def test_bad_input_one_line_exit_2(capsys, argv, message):
    assert main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
