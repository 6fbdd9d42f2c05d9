"""Learning curves: the training loss of each encoding against the step, and how much it
was still falling when the budget ran out.

Each run records its training loss at up to 50 steps (``posenc.lab.train``, the loss of
that step's batch). ``learning.png`` draws the mean over seeds per encoding; the report
states the budget and, per encoding, the *late slope*: the least-squares slope of the
loss over the last third of the recorded steps, in nats per 100 steps, mean over seeds.
A clearly negative slope means the run was still learning, so a ranking at the training
length also measures how fast each encoding learns, not only where it ends.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from posenc.lab.results import write_bytes
from posenc.palette import styles

__all__ = ["LEARNING", "STILL", "budget_sentence", "curves", "draw_learning", "late_slope"]

#: The file name of the figure.
LEARNING = "learning.png"
#: A late slope below ``-STILL`` nats per 100 steps counts as still learning.
STILL = 0.01


def curves(results: dict) -> dict[str, list[list[tuple[int, float]]]]:
    """``{encoding: [curve of each finished seed]}``, each curve ``[(step, loss)]``."""
    out: dict[str, list[list[tuple[int, float]]]] = {}
    for run in results["runs"]:
        curve = (run.get("train") or {}).get("curve") if run["status"] == "ok" else None
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
    stop = (
        f"a fixed budget of {config['steps']} steps (no plateau stopping)"
        if config["task"] == "lm"
        else f"until learned, at most {config.get('max_steps') or 4 * config['steps']} steps"
    )
    each = ", ".join(f"{name} {round(slope, 3) + 0.0:+.3f}" for name, slope in slopes.items())
    still = sum(s < -STILL for s in slopes.values())
    return (
        f"Training: {stop}. Late slope of the training loss (last third of the steps, nats "
        f"per 100 steps, mean over seeds; `{LEARNING}`): {each}. {still} of {len(slopes)} "
        f"encodings were still falling faster than {STILL:g} nats per 100 steps at the end"
        + (", so rankings at the training length partly measure learning speed." if still else ".")
    )


def draw_learning(results: dict, out: Path, plt) -> Path | None:
    """Draw ``learning.png`` (mean training loss over seeds per encoding) into ``out``."""
    found = curves(results)
    if not found:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    looks = styles(found)  # a colour and a marker of its own per encoding
    for name, each in found.items():
        length = min(len(c) for c in each)
        steps = [s for s, _ in each[0][:length]]
        mean = np.mean([[v for _, v in c[:length]] for c in each], axis=0)
        look = looks[name]
        ax.plot(steps, mean, color=look.color, marker=look.marker, markevery=max(1, length // 8),
                markersize=4, label=f"{name} ({len(each)} seeds)")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats per token)")
    ax.set_title("Learning curves: mean over seeds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    buffer = io.BytesIO()  # rendered in memory: a full disk is an OSError naming the file
    fig.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(fig)
    write_bytes(out / LEARNING, buffer.getvalue())
    return out / LEARNING
