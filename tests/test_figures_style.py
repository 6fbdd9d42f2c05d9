"""Every figure compares: one colour and marker per row, no pale colour, labels that name
the quantity drawn, ticks that cover the data, and every text inside the canvas.

The lab's figures are drawn from a synthetic ``results.json`` (two seeds, or one for the
``--quick`` title); the gallery's figures at small sizes.
"""

from __future__ import annotations

import itertools
import math

import matplotlib
import matplotlib.lines
import matplotlib.text
import pytest

from posenc.lab import plots
from posenc.palette import ENCODING_STYLES, MIN_CONTRAST, VARIANT_STYLES, contrast, style, styles
from posenc.viz.gallery import GALLERY, FigureOptions, make_figure

matplotlib.use("Agg")

LENS = [32, 64, 128]
LABELS = [
    "nope", "sinusoidal", "learned", "learned +interpolate", "rope", "rope +linear",
    "rope +ntk", "rope +ntk +hf", "rope +dynamic", "rope +dynamic +decoded", "rope +yarn",
    "rope +yarn +hf", "rope +ft", "rope +linear +ft", "alibi", "t5", "fox", "stick_breaking",
]  # fmt: skip
#: The rows each panel of the lab's figures holds, by the panel's title (written out here,
#: not derived from ``posenc.palette.panel``).
FAMILIES = {
    "absolute positions and NoPE": {"nope", "sinusoidal", "learned", "learned +interpolate"},
    "RoPE and its training-free scalings": {
        "rope", "rope +linear", "rope +ntk", "rope +ntk +hf", "rope +dynamic",
        "rope +dynamic +decoded", "rope +yarn", "rope +yarn +hf",
    },
    "attention biases": {"alibi", "t5"},
    "fine-tuned at a longer length (+ft)": {"rope +ft", "rope +linear +ft"},
    "data-dependent and other positions": {"fox", "stick_breaking"},
}  # fmt: skip
BINS = 8


def _results(seeds: int = 2) -> dict:
    """A text sweep: perplexity rising with length (7..60), the learned table without a
    value past its rows at 128, and per-position losses at the longest length."""
    runs = []
    for seed in range(seeds):
        rows = []
        for i, label in enumerate(LABELS):
            results = {}
            for j, n in enumerate(LENS):
                if label == "learned" and n == LENS[-1]:
                    continue
                ppl = 7.0 + 2.5 * i + 8.0 * j + 0.3 * seed
                results[str(n)] = {"ppl": ppl, "loss": math.log(ppl)}
            last = results.get(str(LENS[-1]))
            if last is not None:
                last["position_loss"] = [math.log(6.0 + i + b) for b in range(BINS)]
            kind = "trained" if "+" not in label else "scaling"
            rows.append({"label": label, "kind": kind, "results": results})
        runs.append({"encoding": LABELS[0], "seed": seed, "status": "ok", "rows": rows})
    config = {"eval_lens": LENS, "train_len": 32, "task": "lm"}
    return {"config": config, "metric": "ppl", "seeds": list(range(seeds)), "runs": runs}


@pytest.fixture
def lab_figures(monkeypatch, tmp_path):
    """``draw(results) -> {file name: Figure}``, the figures as ``draw_all`` saves them."""
    drawn = {}
    save = plots._save

    def keep(fig, path):
        fig.canvas.draw()
        drawn[path.name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)

    def draw(results):
        drawn.clear()
        plots.draw_all(results, tmp_path)
        return dict(drawn)

    return draw


def _rows(ax, *, lines: bool = False) -> dict[str, tuple[str, ...]]:
    """Legend entry -> (colour, marker) of its data line; with ``lines`` also its line
    style, dash pattern and marker fill."""
    handles, labels = ax.get_legend_handles_labels()
    out = {}
    for handle, label in zip(handles, labels, strict=True):
        line = handle.lines[0] if hasattr(handle, "lines") else handle
        if isinstance(line, matplotlib.lines.Line2D):  # not a shaded band
            look = (matplotlib.colors.to_hex(line.get_color()), line.get_marker())
            if lines:
                dashes = str(line._unscaled_dash_pattern)  # a dash tuple's style reads "--"
                look += (line.get_linestyle(), dashes, line.get_fillstyle())
            out[label] = look
    return out


def _all_rows(fig) -> dict[str, tuple[str, ...]]:
    """Legend entry -> (colour, marker) over every panel of ``fig``."""
    return {label: look for ax in fig.axes for label, look in _rows(ax).items()}


def _row_name(entry: str) -> str:
    """The row label of a legend entry (``learned (n/a at 128)`` -> ``learned``)."""
    return entry.split(" (n/a")[0].split(":")[0]


def _texts_inside(fig, *, tight: bool) -> None:
    """Every visible text inside the saved canvas: the figure, or with ``tight`` (the lab
    saves with ``bbox_inches="tight"``) the box around its contents."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    canvas = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans) if tight else fig.bbox
    for text in _drawn_texts(fig, renderer):
        box = text.get_window_extent(renderer)
        assert canvas.x0 - 1 <= box.x0 and box.x1 <= canvas.x1 + 1, text.get_text()
        assert canvas.y0 - 1 <= box.y0 and box.y1 <= canvas.y1 + 1, text.get_text()


def _data_range(ax) -> tuple[float, float]:
    """The lowest and highest y of every line in data coordinates (error-bar caps too)."""
    ys = [
        y
        for line in ax.get_lines()
        if line.get_transform().contains_branch(ax.transData)
        for y in line.get_ydata()
    ]
    return min(ys), max(ys)


def test_palette_colours_are_not_pale_and_rows_are_distinct():
    for color, _ in [*ENCODING_STYLES.values(), *VARIANT_STYLES.values()]:
        assert contrast(color) >= MIN_CONTRAST, color
    looks = [style(label) for label in LABELS]
    assert len({(s.color, s.marker) for s in looks}) == len(LABELS)
    assert all(contrast(s.color) >= MIN_CONTRAST for s in looks)
    many = styles([*LABELS, "rope +yarn +hf +ft", "rope +ft +yarn +hf"])  # may collide
    assert len({(s.color, s.marker) for s in many.values()}) == len(many)
    for scaling in ("ntk", "yarn", "dynamic"):  # a runtime's reading: another line, hollow
        plain = style(f"rope +{scaling}")
        other = style(f"rope +{scaling} +{'decoded' if scaling == 'dynamic' else 'hf'}")
        assert plain.linestyle != other.linestyle and (plain.fill, other.fill) == ("full", "none")


def test_lab_length_figure_compares(lab_figures):
    fig = lab_figures(_results())["perplexity.png"]
    rows = _all_rows(fig)
    assert len(rows) == len(LABELS)
    assert all(contrast(color) >= MIN_CONTRAST for color, _ in rows.values())
    assert "learned (n/a at 128)" in rows  # said in the legend ...
    for ax in fig.axes:
        assert not any("n/a" in t.get_text() for t in ax.texts)  # ... not in the data area
        assert "perplexity" in ax.get_ylabel() and "length" in ax.get_xlabel()
        low, high = _data_range(ax)
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert min(ticks) <= low and max(ticks) >= high, (ticks, low, high)
    assert "95% interval over 2 seeds" in fig.get_suptitle()
    _texts_inside(fig, tight=True)


@pytest.mark.parametrize("name", ["perplexity.png", "position.png"])
def test_lab_panels_hold_one_family_each_and_cover_every_row(lab_figures, name):
    fig = lab_figures(_results())[name]
    drawn = set()
    for ax in fig.axes:
        rows = {_row_name(entry) for entry in _rows(ax)}
        assert rows <= FAMILIES[ax.get_title()], (ax.get_title(), rows)
        looks = _rows(ax, lines=True)  # no two series of a panel look alike
        assert len(set(looks.values())) == len(looks), (ax.get_title(), looks)
        drawn |= rows
    expected = set(LABELS) - ({"learned"} if name == "position.png" else set())
    assert drawn == expected  # learned has no value at the longest length
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [t for t in FAMILIES if t in titles]  # panels in one fixed order


def test_lab_panels_share_a_y_axis_where_the_scale_allows(lab_figures):
    figures = lab_figures(_results())
    for name in ("perplexity.png", "position.png"):
        limits = {ax.get_ylim() for ax in figures[name].axes}
        assert len(limits) == 1, (name, limits)
    results = _results()
    for run in results["runs"]:  # one row a hundred times the others: each its own axis
        for cell in run["rows"][LABELS.index("fox")]["results"].values():
            cell["ppl"] *= 100
    axes = lab_figures(results)["perplexity.png"].axes
    assert len({ax.get_ylim() for ax in axes}) == len(axes)


def test_lab_intervals_sit_apart_at_one_length(lab_figures):
    """In a panel, the rows with a point at one length sit at distinct x, at least 0.04
    log2 units apart; a row alone at a length sits on it (rope at the training length)."""
    fig = lab_figures(_results())["perplexity.png"]
    ax = next(a for a in fig.axes if a.get_title().startswith("RoPE"))
    xs = [x for c in ax.containers for x in c.lines[0].get_xdata()]
    for n in LENS:
        near = sorted(math.log2(x) for x in xs if abs(math.log2(x / n)) < 0.5)
        assert all(b - a >= 0.04 for a, b in itertools.pairwise(near)), (n, near)
    assert [x for x in xs if abs(math.log2(x / LENS[0])) < 0.5] == [LENS[0]]


def test_lab_length_figure_draws_seeds_and_names_unlearned_runs(lab_figures):
    results = _results()
    results["metric"], results["config"]["task"] = "accuracy", "copy"
    for run in results["runs"]:
        for row in run["rows"]:
            for cell in row["results"].values():
                cell["accuracy"] = min(1.0, cell["ppl"] / 60)
    failed = {"encoding": "t5", "seed": 1, "status": "ok", "learned": False, "rows": []}
    results["runs"].append(failed)
    axes = lab_figures(results)["accuracy.png"].axes
    biases = next(ax for ax in axes if ax.get_title() == "attention biases")
    rows = _rows(biases)
    assert "t5: not learned (seed 1)" in rows and len(set(rows.values())) == len(rows)
    labels = biases.get_legend_handles_labels()[1]
    assert len(labels) == len(set(labels))  # t5 learned in one seed, not in another: once each
    points = [line for ax in axes for line in ax.get_lines() if line.get_markersize() < 4]
    assert points and all(len(line.get_ydata()) == 2 for line in points)  # seeds' values
    derived = [c for ax in axes for c in ax.containers if c.get_label() == "rope +linear"]
    assert derived
    for container in derived:  # a scaling starts past the training length
        assert min(container.lines[0].get_xdata()) > results["config"]["train_len"]


def test_lab_position_figure_compares(lab_figures):
    fig = lab_figures(_results())["position.png"]
    assert len(_all_rows(fig)) == len(LABELS) - 1  # learned: no value
    title = fig.get_suptitle()
    assert "perplexity" in title and "loss" not in title
    for ax in fig.axes:
        assert "perplexity" in ax.get_ylabel()
        low, high = _data_range(ax)
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert min(ticks) <= low and max(ticks) >= high, (ticks, low, high)
    _texts_inside(fig, tight=True)


@pytest.mark.parametrize("validation", [False, True])
def test_lab_learning_figure_compares(monkeypatch, tmp_path, validation):
    import matplotlib.pyplot as plt

    from posenc.lab import curves

    results = _results()
    for run in results["runs"]:
        curve = [[s, 5.0 / (1 + s / 50) + 0.1 * run["seed"]] for s in range(0, 400, 20)]
        run["train"] = {"curve": curve}
        if validation:
            run["train"]["validation"] = {"curve": [[s, v + 0.2] for s, v in curve[1:]]}
    results["runs"] += [
        dict(run, encoding=name) for name in ("rope", "alibi") for run in results["runs"][:2]
    ]
    closed = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (closed.append(fig), close(fig)))
    curves.draw_learning(results, tmp_path, plt)
    rows = _all_rows(closed[0])
    assert len(rows) == 3 and len(set(rows.values())) == 3
    assert all(marker not in ("None", "", None) for _, marker in rows.values())
    titles = [ax.get_title() for ax in closed[0].axes]
    assert sum(t.endswith(": validation") for t in titles) == (3 if validation else 0)
    for ax in closed[0].axes:  # one family per panel
        names = {entry.split(" (")[0] for entry in _rows(ax)}
        family = FAMILIES[ax.get_title().removesuffix(": validation")]
        assert names and names <= family, (ax.get_title(), names)
        assert "loss" in ax.get_ylabel() and "step" in ax.get_xlabel()
    assert len({ax.get_ylim() for ax in closed[0].axes}) == 1  # one y axis
    _texts_inside(closed[0], tight=True)


def test_one_seed_claims_no_interval(lab_figures):
    figures = lab_figures(_results(seeds=1))
    title = figures["perplexity.png"].get_suptitle()
    assert "one seed, no interval" in title and "95" not in title
    assert "one seed" in figures["position.png"].get_suptitle()


# ----------------------------------------------------------------------------- gallery

SMALL = {"biases": {"length": 12, "heads": 2}, "attention": {"length": 12, "heads": 2}}


def _drawn_texts(fig, renderer):
    """The texts the renderer draws: tick labels only of ticks inside the view."""
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                loc = tick.get_loc()
                if loc is None or not low - 1e-9 * abs(high - low) <= loc <= high * (1 + 1e-9):
                    hidden |= {id(tick.label1), id(tick.label2)}
    return [
        t
        for t in fig.findobj(matplotlib.text.Text)
        if t.get_visible() and t.get_text().strip() and id(t) not in hidden
    ]


@pytest.mark.parametrize("name", sorted(GALLERY))
def test_gallery_figure_compares(name):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = make_figure(name, FigureOptions(**SMALL.get(name, {})))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.canvas.draw()
    for text in _drawn_texts(fig, renderer):  # every text inside the canvas
        box, canvas = text.get_window_extent(renderer), fig.bbox
        inside = canvas.x0 - 1 <= box.x0 and box.x1 <= canvas.x1 + 1
        assert inside and canvas.y0 - 1 <= box.y0 and box.y1 <= canvas.y1 + 1, text.get_text()
    for ax in fig.axes:
        rows = {label: look for label, look in _rows(ax).items() if not label.startswith("_")}
        assert len(set(rows.values())) == len(rows), (ax.get_title(), rows)
        assert all(contrast(color) >= MIN_CONTRAST for color, _ in rows.values()), rows


def test_one_colour_range_for_cosine_similarity():
    fig = make_figure("similarity", FigureOptions(length=16, dim=8))
    ranges = {im.get_clim() for ax in fig.axes for im in ax.images if "cosine" in ax.get_title()}
    assert ranges == {(-1.0, 1.0)}


def test_fingerprint_hands_turn_the_way_rope_turns():
    """Both diagrams turn anticlockwise by the angle: RoPE's pair (1, 0) at angle a is
    (cos a, sin a); the fingerprint hand of pair 0 at position p points at angle p."""
    from posenc.viz import diagrams

    a = 0.7
    rotated = diagrams._rotate((1.0, 0.0), a)
    assert rotated == pytest.approx([math.cos(a), math.sin(a)])
    position = 2  # pair 0 turns by p * w_0 = p radians
    fig = diagrams.fingerprint_diagram(d_model=4, positions=(position,))
    lines = fig.axes[0].get_lines()
    hand = next(line for line in lines if line.get_gid() == f"hand-p{position}-i0")
    (x0, x1), (y0, y1) = hand.get_xdata(), hand.get_ydata()
    angle = math.atan2(y1 - y0, x1 - x0)
    assert angle == pytest.approx(position)


def test_extend_figure_compares(monkeypatch, tmp_path):
    """``extend.png`` of the recorded SmolLM2 run: every setting visible beside the
    others (dynamic equals the original below the trained length), the length axis
    spanning the lengths measured, not the trained length far beyond them."""
    import json
    from pathlib import Path

    import matplotlib.pyplot as plt

    from posenc.extend import report

    recorded = Path(__file__).resolve().parents[1] / "benchmarks/results/extend-smollm2"
    results = json.loads((recorded / "results.json").read_text())
    closed = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (closed.append(fig), close(fig)))
    report.draw(results, tmp_path)
    (fig,) = closed
    top = fig.axes[0]
    rows = _rows(top)
    assert list(rows) == results["settings"] and len(set(rows.values())) == len(rows)
    xs = {line.get_label(): tuple(line.get_xdata()) for line in top.get_lines()}
    assert len(set(xs[s] for s in results["settings"])) == len(results["settings"])  # apart
    lens = results["config"]["eval_lens"]
    low, high = top.get_xlim()
    assert low <= min(lens) and high >= max(lens) and high / low <= 2 * max(lens) / min(lens)
    _texts_inside(fig, tight=True)
