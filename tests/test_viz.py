"""posenc.viz and `posenc show`: every figure renders headless into a real file.

PNGs are read back with matplotlib.image.imread (size, not one colour); SVGs are parsed
with xml.etree and searched for the elements each diagram promises. Numbers drawn in the
figures (RoFormer's decay bound, attention probabilities) are checked against formulas
written here.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.image import imread
from matplotlib.text import Text

import posenc
from posenc import viz
from posenc.cli import main
from posenc.lab import TinyLM
from posenc.viz.biases import attention_probs
from posenc.viz.gallery import GALLERY, FigureOptions, make_figure, write_gallery
from posenc.viz.rotary import rope_decay_bound, rope_decay_figure, rope_spectrum_figure

DPI = 30
SVG = "{http://www.w3.org/2000/svg}"


def check_png(fig, path: Path) -> np.ndarray:
    """Save ``fig`` as PNG; check its pixel size and that it is not a single colour."""
    viz.save_figure(fig, path, dpi=DPI)
    image = imread(path)
    width, height = fig.get_size_inches() * DPI
    assert image.shape[:2] == (round(height), round(width))
    colours = np.unique(image.reshape(-1, image.shape[-1]), axis=0)
    assert len(colours) > 20, f"{path.name} has only {len(colours)} colours"
    return image


def svg_ids(path: Path) -> tuple[set[str], list[str]]:
    """The ``id`` attributes and the texts of an SVG file (which must parse)."""
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    texts = ["".join(el.itertext()) for el in root.iter(f"{SVG}text")]
    return ids, texts


def text_outside_canvas(fig) -> list[str]:
    """Every drawn text (titles, labels, drawn tick labels) not wholly inside the canvas.

    Tick labels are checked through their axis's tight box, which holds only the ticks
    matplotlib draws (the locator also makes labels for ticks outside the view).
    """
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    canvas_box = fig.bbox.padded(1.0)  # one pixel of antialiasing
    ticks = {
        id(label)
        for ax in fig.axes
        for axis in (ax.xaxis, ax.yaxis)
        for tick in axis.get_major_ticks() + axis.get_minor_ticks()
        for label in (tick.label1, tick.label2)
    }
    boxes = [
        (repr(t.get_text()), t.get_window_extent(renderer))
        for t in fig.findobj(Text)
        if id(t) not in ticks and t.get_visible() and t.get_text().strip()
    ]
    boxes += [
        (f"{axis.axis_name} axis of {ax.get_title()!r}", axis.get_tightbbox(renderer))
        for ax in fig.axes
        if ax.axison
        for axis in (ax.xaxis, ax.yaxis)
    ]
    return [
        f"{name} at {box.extents.round().tolist()}"
        for name, box in boxes
        if box is not None
        and not (canvas_box.contains(box.x0, box.y0) and canvas_box.contains(box.x1, box.y1))
    ]


# --------------------------------------------------------------------------- figures


@pytest.mark.parametrize("what", [*GALLERY, "alibi", "rope", "t5"])
def test_no_text_lies_outside_the_canvas(what):
    """Each figure at the size `posenc show` writes it (the README's): nothing clipped."""
    assert text_outside_canvas(make_figure(what)) == []


def test_clipping_check_sees_a_clipped_title():
    fig = viz.absolute_panel("sinusoidal", d_model=8, length=10)
    fig.axes[0].set_title("x" * 400)
    assert any("xxxx" in line for line in text_outside_canvas(fig))


def test_bias_colours_fit_the_sign_and_range_of_each_head():
    fig = viz.bias_figure(["alibi", "shaw"], num_heads=2, length=8)
    bias, _ = viz.score_biases("alibi", num_heads=2, length=8)
    alibi = [ax.get_images()[0] for ax in fig.axes if ax.get_title().startswith("alibi")]
    for h, image in enumerate(alibi):  # all <= 0: sequential, white at 0, darkest at the min
        assert image.get_cmap().name.startswith("Blues_r")
        assert image.get_clim() == pytest.approx((np.tril(bias[h]).min(), 0.0))
    shaw = [ax.get_images()[0] for ax in fig.axes if ax.get_title().startswith("shaw")]
    for image in shaw:  # both signs: diverging, symmetric about 0
        low, high = image.get_clim()
        assert image.get_cmap().name.startswith("RdBu_r") and low == -high


def test_attention_colour_bars_cover_the_data():
    fig = viz.attention_figure(["alibi", "rope", "nope"], d_model=16, num_heads=2, length=8)
    panels = [ax for ax in fig.axes if ax.get_title().endswith("head 0")]
    assert [ax.get_xlabel() for ax in panels] == ["key j"] * 3
    assert panels[0].get_ylabel() == "query i"
    for ax in panels[:2]:
        image = ax.get_images()[0]
        values = np.ma.filled(image.get_array(), np.nan)
        low, high = image.get_clim()
        assert low == -high == -np.nanmax(np.abs(values))  # nothing saturates
    assert "uniform" in [t.get_text() for t in panels[2].texts]


def test_absolute_panel_by_name():
    for source in ("sinusoidal", "learned"):
        fig = viz.absolute_panel(source, d_model=16, length=24)
        assert len(fig.axes) == 6  # four panels and two colorbars
        assert fig.get_suptitle().startswith(source)


def test_absolute_panel_from_tensor_and_lab_checkpoint(tmp_path, monkeypatch):
    torch.manual_seed(0)
    enc = posenc.build("learned", d_model=16, max_len=12)
    model = TinyLM(enc, vocab_size=8, d_model=16, num_layers=2, num_heads=2)
    torch.save(model.state_dict(), tmp_path / "model.pt")  # the table sits under 3 keys
    table = viz.load_table(tmp_path / "model.pt")
    np.testing.assert_array_equal(table, enc.weight.detach().double().numpy())
    assert (
        viz.absolute_panel(enc.weight.detach())
        .get_suptitle()
        .startswith("table: 12 positions x 16")
    )
    monkeypatch.setattr("posenc.viz.gallery.GALLERY", {})  # only the trained table
    options = FigureOptions(table=str(tmp_path / "model.pt"))
    paths = write_gallery(tmp_path, options, dpi=DPI)
    assert [p.name for p in paths] == ["learned_trained_panel.png"]
    image = imread(paths[0])
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20


def test_load_table_forms_and_errors(tmp_path):
    table = torch.randn(5, 4)
    torch.save(table, tmp_path / "t.pt")
    np.testing.assert_array_equal(viz.load_table(tmp_path / "t.pt"), table.double().numpy())
    torch.save({"model": {"a.pos": table, "b.pos": table + 1}}, tmp_path / "two.pt")
    with pytest.raises(ValueError, match="several tables"):
        viz.load_table(tmp_path / "two.pt")
    np.testing.assert_array_equal(viz.load_table(tmp_path / "two.pt", key="b.pos"), table + 1)
    with pytest.raises(ValueError, match="'nope'"):
        viz.load_table(tmp_path / "two.pt", key="nope")
    torch.save({"w": table}, tmp_path / "none.pt")
    with pytest.raises(ValueError, match="no position table"):
        viz.load_table(tmp_path / "none.pt")
    with pytest.raises(FileNotFoundError, match=r"missing\.pt"):
        viz.load_table(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        viz.absolute_panel(torch.zeros(5))
    with pytest.raises(ValueError, match="'rope' does not act at the input site"):
        viz.absolute_panel("rope")


def test_similarity_and_relative_figures():
    fig = viz.similarity_figure(["sinusoidal"], d_model=16, length=20)
    assert [ax.get_title() for ax in fig.axes[:2]] == [
        "sinusoidal: PE PE^T",
        "sinusoidal: cosine similarity",
    ]
    fig = viz.relative_figure(d_model=16, length=20, max_offset=6)
    errors = fig.axes[0].get_lines()[0].get_ydata()  # sinusoidal: rounding level
    assert len(errors) == 6 and max(errors) < 1e-12
    with pytest.raises(ValueError, match="max_offset"):
        viz.relative_figure(max_offset=0)


def test_fingerprint_svg_has_a_hand_per_pair_and_position(tmp_path):
    path = tmp_path / "sinusoidal_encoding.svg"
    viz.save_figure(viz.fingerprint_diagram(d_model=8, positions=(0, 3)), path)
    ids, texts = svg_ids(path)
    for pos in (0, 3):
        for i in range(4):
            assert {f"hand-p{pos}-i{i}", f"clock-p{pos}-i{i}"} <= ids
        assert {f"cell-p{pos}-d{d}" for d in range(8)} <= ids
    assert "p = 3" in texts
    assert "λ = 6.3" in texts  # pair 0: wavelength 2 pi
    with pytest.raises(ValueError, match="d_model must be even, got 7"):
        viz.fingerprint_diagram(d_model=7)


def test_rope_rotation_svg_shows_the_same_dot_product(tmp_path):
    path = tmp_path / "rope_rotation.svg"
    theta, m, n = 0.3, 5, 2
    viz.save_figure(viz.rope_rotation_diagram(theta=theta, m=m, n=n, shift=3), path)
    ids, texts = svg_ids(path)
    assert {f"{p}-{part}" for p in "ms" for part in ("q", "k", "angle", "dot")} <= ids
    expected = f"{1.0 * 0.8 * np.cos((m - n) * theta):.4f}"  # |q| = 1, |k| = 0.8
    dots = [t for t in texts if t.startswith("q·k")]
    assert len(dots) == 2 and all(t.endswith(expected) for t in dots)
    check_png(viz.rope_rotation_diagram(), tmp_path / "rope.png")


def test_rope_decay_bound_matches_roformer_formula():
    theta = 10000.0 ** (-np.arange(8) / 8)  # head_dim 16
    for r in (0, 1, 7, 300):
        partial = [abs(sum(np.exp(1j * r * theta[k]) for k in range(j))) for j in range(1, 9)]
        assert rope_decay_bound(theta, np.array(r)) == pytest.approx(np.mean(partial), rel=1e-12)
    assert rope_decay_bound(theta, np.array(0)) == pytest.approx((8 + 1) / 2)


def test_rope_spectrum_draws_each_scaling():
    fig = rope_spectrum_figure(head_dim=16, original=64, factor=4)
    ratios = {line.get_label(): line.get_ydata() for line in fig.axes[1].get_lines()}
    np.testing.assert_allclose(ratios["default"], 1.0)
    np.testing.assert_allclose(ratios["linear (PI)"], 4.0)  # PI divides every theta by s
    assert ratios["YaRN"][0] == pytest.approx(1.0) and ratios["YaRN"][-1] == pytest.approx(4.0)
    assert rope_decay_figure(head_dim=16, original=64, factor=4).axes[1].get_legend()
    with pytest.raises(ValueError, match="head_dim must be even"):
        rope_spectrum_figure(head_dim=15)


def test_bias_and_attention_figures():
    fig = viz.bias_figure(["alibi", "t5"], num_heads=2, length=8)
    assert [ax.get_title() for ax in fig.axes[:4]] == [
        "alibi, head 0", "alibi, head 1", "t5, head 0", "t5, head 1",
    ]  # fmt: skip
    fig = viz.attention_figure(["nope", "alibi"], d_model=16, num_heads=2, length=8)
    nope = fig.axes[0].get_images()[0].get_array()  # log2(p * visible keys): 0 = uniform
    np.testing.assert_array_equal(np.ma.filled(nope, 0.0), 0.0)
    with pytest.raises(ValueError, match="'rope' does not act at the score site"):
        viz.bias_figure(["rope"])
    with pytest.raises(ValueError, match="heads"):
        viz.attention_figure(["rope"], heads=[4], num_heads=4)


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5", "fire"])
def test_attention_probs_reproduce_the_module_output(name):
    torch.manual_seed(0)
    mha = posenc.MultiHeadAttention(16, 2, position=name, causal=True).double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        probs = attention_probs(mha, x)  # [B, H, T, T]
        v = mha.v_proj(x).view(2, 7, 2, 8).transpose(1, 2)
        out = mha.out_proj((probs @ v).transpose(1, 2).reshape(2, 7, 16))
        expected = mha(x)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, 7, dtype=torch.float64))
    assert probs.triu(1).abs().max() == 0  # causal
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_alibi_bias_is_minus_slope_times_distance():
    bias, content = viz.score_biases("alibi", num_heads=2, length=6)
    slopes = 2.0 ** (-8.0 / 2 * np.arange(1, 3))  # Press et al. 2022: 2^(-8h/H)
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    np.testing.assert_allclose(np.tril(bias), np.tril(-slopes[:, None, None] * (i - j)))
    assert not content


# --------------------------------------------------------------------------- gallery, CLI


def test_make_figure_dispatch_and_errors():
    assert len(make_figure("sinusoidal", FigureOptions(dim=8, length=12)).axes) == 6
    assert "alibi, head 1" in [ax.get_title() for ax in make_figure("alibi").axes]
    titles = [ax.get_title() for ax in make_figure("rope", FigureOptions(heads=2, length=6)).axes]
    assert {"rope, head 0", "rope, head 1"} <= set(titles)
    with pytest.raises(ValueError, match="unknown figure or encoding 'nosuch'"):
        make_figure("nosuch")


def test_show_all_writes_the_gallery(tmp_path, capsys):
    args = ["show", "--all", "--out", str(tmp_path), "--dim", "8", "--len", "12"]
    assert main([*args, "--heads", "2", "--dpi", str(DPI)]) == 0
    written = capsys.readouterr().out.split()
    assert sorted(Path(p).name for p in written) == sorted(i.filename for i in GALLERY.values())
    for item in GALLERY.values():
        path = tmp_path / item.filename
        if path.suffix == ".svg":
            assert len(svg_ids(path)[1]) > 5, item.filename
        else:
            image = imread(path)
            assert min(image.shape[:2]) > 100, item.filename
            assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20, item.filename


def test_show_one_figure_and_errors(tmp_path, capsys):
    assert main(["show", "fingerprint", "--out", str(tmp_path / "f.svg"), "--dim", "4"]) == 0
    assert svg_ids(tmp_path / "f.svg")[0]
    capsys.readouterr()
    bad = [
        (["show", "nosuch"], "unknown figure or encoding 'nosuch'"),
        (["show", "sinusoidal", "--out", str(tmp_path / "x.jpg")], "suffix must be one of"),
        (["show", "sinusoidal", "--all"], "either WHAT"),
        (["show"], "name a figure"),
        (["show", "learned", "--table", str(tmp_path / "no.pt")], "no.pt"),
        (["show", "sinusoidal", "--dim", "7"], "--dim must be even, got 7"),
        (["show", "rope-decay", "--dpi", "0"], "--dpi must be 1 to 600, got 0"),
    ]
    for argv, message in bad:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)


def test_viz_is_headless_and_lazy(tmp_path):
    code = (
        "import sys, posenc.viz as v\n"
        "assert 'matplotlib' not in sys.modules\n"
        f"v.save_figure(v.fingerprint_diagram(d_model=4, positions=[0]), r'{tmp_path}/x.png')\n"
        "print('matplotlib.pyplot' in sys.modules)\n"
    )
    env = {"PATH": "", "MPLBACKEND": "", "DISPLAY": ""}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert imread(tmp_path / "x.png").std() > 0


def test_docs_gallery_shows_every_figure():
    page = (Path(__file__).parents[1] / "docs" / "gallery.md").read_text(encoding="utf-8")
    for item in GALLERY.values():
        assert f"(figures/{item.filename})" in page, item.filename
        assert f"posenc show {item.name}`" in page, item.name
