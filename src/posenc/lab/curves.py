"""Learning curves: the training (and validation) loss of each encoding against the step,
how much it was still falling when the budget ran out, and why each run stopped.

Each run records its training loss at up to 50 steps (``posenc.lab.train``, the loss of
that step's batch). ``learning.png`` draws the mean over seeds per encoding, one panel
per family (``posenc.lab.panels``) on one y axis; the report states the budget and, per
encoding, the *late slope*: the least-squares slope of the loss over the last third of
the recorded steps, in nats per 100 steps, mean over seeds.
A clearly negative slope means the run was still learning, so a ranking at the training
length also measures how fast each encoding learns, not only where it ends. With a
validation set (``--val-every``, ``--profile thorough``) each family's panel gets one
beside it, the validation loss per encoding (mean over seeds at the steps every seed reached), and
``stop_sentence`` says per run whether it stopped at a plateau or at the budget.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from posenc.lab import panels
from posenc.lab.results import write_bytes
from posenc.palette import styles

__all__ = [
    "LEARNING",
    "STILL",
    "budget_sentence",
    "curves",
    "draw_learning",
    "late_slope",
    "stop_sentence",
]

#: The file name of the figure.
LEARNING = "learning.png"
#: A late slope below ``-STILL`` nats per 100 steps counts as still learning.
STILL = 0.01


def curves(results: dict, *, validation: bool = False) -> dict[str, list[list[tuple[int, float]]]]:
    """``{encoding: [curve of each finished seed]}``, each curve ``[(step, loss)]``: the
    training loss, or with ``validation`` the validation loss (runs that measured it)."""
    out: dict[str, list[list[tuple[int, float]]]] = {}
    for run in results["runs"]:
        train = (run.get("train") or {}) if run["status"] == "ok" else {}
        curve = (train.get("validation") or {}).get("curve") if validation else train.get("curve")
        if curve:
            out.setdefault(run["encoding"], []).append([(int(s), float(v)) for s, v in curve])
    return out


def late_slope(curve: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of the loss over the last third of ``curve``, per 100 steps
    (``None`` with fewer than three points there)."""
    tail = curve[len(curve) - len(curve) // 3 :]
    if len(tail) < 3:
        return None
    steps, losses = (np.asarray(v, dtype=np.float64) for v in zip(*tail, strict=True))
    return 100.0 * float(np.polyfit(steps, losses, 1)[0])


def budget_sentence(results: dict) -> str | None:
    """The training budget and each encoding's late slope (``None`` without curves)."""
    found = curves(results)
    slopes = {}
    for name, each in found.items():
        got = [s for s in (late_slope(c) for c in each) if s is not None]
        if got:
            slopes[name] = sum(got) / len(got)
    if not slopes:
        return None
    config = results["config"]
    cap = config.get("max_steps") or 4 * config["steps"]
    if config["task"] != "lm":
        stop = f"until learned, at most {cap} steps"
    elif config.get("plateau"):
        stop = (
            f"at least {config['steps']} steps, then until the validation loss plateaus, "
            f"at most {cap}"
        )
    else:
        stop = f"a fixed budget of {config['steps']} steps (no plateau stopping)"
    each = ", ".join(f"{name} {round(slope, 3) + 0.0:+.3f}" for name, slope in slopes.items())
    still = sum(s < -STILL for s in slopes.values())
    return (
        f"Training: {stop}. Late slope of the training loss (last third of the steps, nats "
        f"per 100 steps, mean over seeds; `{LEARNING}`): {each}. {still} of {len(slopes)} "
        f"encodings were still falling faster than {STILL:g} nats per 100 steps at the end"
        + (", so rankings at the training length partly measure learning speed." if still else ".")
    )


def stop_sentence(results: dict) -> str | None:
    """Why each run stopped (plateau, learned or budget) and its validation set, for
    runs that trained past ``steps`` or measured a validation loss (``None`` otherwise)."""
    runs = [r for r in results["runs"] if r["status"] == "ok" and "stop" in r.get("train", {})]
    config = results["config"]
    if not runs or (config.get("val_every") is None and config.get("plateau") is None):
        return None
    data = results.get("data", {}).get("validation")
    where = (
        f"{data['tokens']} tokens of the training text taken out before training, never the "
        "evaluation text"
        if data
        else f"{runs[0]['train'].get('validation', {}).get('tokens', 0)} tokens of task examples "
        "of their own stream"
    )
    sentence = f"Validation loss every {config['val_every']} steps on {where}."
    if config.get("plateau"):
        sentence += (
            f" Plateau rule: stop past step {config['steps']} once the best of the last "
            f"{config['plateau']} validation losses is not below {1 - config['plateau_eps']:g} "
            "times the best before them (patience-based early stopping, Goodfellow et al. "
            "2016, algorithm 7.1; window and threshold are the lab's choice)."
        )
    each = ", ".join(
        f"{r['encoding']} s{r['seed']} {r['train']['stop']} at {r['train']['steps']}" for r in runs
    )
    return sentence + f" Stopped (per run): {each}."


def _draw_means(ax, each_curve: dict, names: list[str], looks: dict) -> None:
    """The mean over seeds of each of ``names``' curves, at the steps every seed reached."""
    for name in (n for n in names if n in each_curve):
        each = each_curve[name]
        length = min(len(c) for c in each)
        steps = [s for s, _ in each[0][:length]]
        mean = np.mean([[v for _, v in c[:length]] for c in each], axis=0)
        look = looks[name]
        ax.plot(steps, mean, color=look.color, marker=look.marker,
                markevery=max(1, length // 8), markersize=4,
                label=f"{name} ({len(each)} seed{'s' if len(each) > 1 else ''})")  # fmt: skip
    ax.set_xlabel("step", fontsize=8)
    ax.grid(alpha=0.3)


def draw_learning(results: dict, out: Path, plt) -> Path | None:
    """Draw ``learning.png`` into ``out``: the mean training loss over seeds per encoding
    in one panel per family (``posenc.lab.panels``), and beside each the validation loss
    when measured."""
    found = curves(results)
    if not found:
        return None
    held = curves(results, validation=True)
    groups = panels.by_panel(found)
    looks = styles(found)  # a colour and a marker of its own per encoding
    if held:
        fig, grid = plt.subplots(len(groups), 2, figsize=(10, 3.6 * len(groups) + 0.4),
                                 sharey=True, squeeze=False, layout="constrained")  # fmt: skip
        cells = {key: list(line) for key, line in zip(groups, grid, strict=True)}
    else:
        fig, axes = panels.grid(plt, list(groups), sharey=True)
        cells = {key: [ax] for key, ax in axes.items()}
    for key, names in groups.items():
        kinds = [
            (found, "training loss (nats per token)"),
            (held, "validation loss (nats per token)"),
        ]
        for ax, (each_curve, ylabel) in zip(cells[key], kinds, strict=False):
            _draw_means(ax, each_curve, names, looks)
            ax.set_ylabel(ylabel, fontsize=8)
            panels.label_panel(ax, key)
            if each_curve is held:
                ax.set_title(f"{ax.get_title()}: validation", fontsize=9)
    fig.suptitle("Learning curves: mean over seeds", fontsize=10)
    buffer = io.BytesIO()  # rendered in memory: a full disk is an OSError naming the file
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    write_bytes(out / LEARNING, buffer.getvalue())
    return out / LEARNING
