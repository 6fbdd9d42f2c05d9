"""Training compute: what each run spent, and the encodings compared at equal compute.

Shapes: ``P`` the model's parameters less the token embedding (a lookup, as in Kaplan
et al.), ``T`` the training length, ``C`` ``d_model``, ``L`` layers, ``N`` tokens
trained on (``steps * batch_size * T``).

* **FLOPs from the model's shape** (Kaplan et al. 2020, "Scaling Laws for Neural
  Language Models", section 2.1, table 1): a forward pass costs ``2 P + 2 L T C`` per
  token (the matrix products, then attention's scores and weighted sum), training
  three times that, so ``flops = 3 * (2 P + 2 L T C) * N``. It leaves out what an
  encoding adds (rotations, biases, PaTH's Householder products, stick-breaking's
  cumulative sums) and every elementwise operation, so it is the same for two
  encodings of one shape: the measured time says what the encoding costs.
* **Measured process time**: each run records the CPU-seconds of its training loop
  (``train.cpu_seconds``, every thread of the process; with tasks it includes the
  checks of exact match during training; a resumed run, the steps since the resume),
  so ``cpu_seconds / steps`` is the cost of a
  step on the machine and load it ran on.
* **Loss at equal compute**: the common budget is the smallest mean training
  CPU-seconds of any encoding in the sweep; each encoding's training loss is read off
  its learning curve (mean over seeds, a running mean of ``SMOOTH`` recorded points,
  interpolated) at the step where it had spent that budget, ``budget / (CPU-s per
  step)``. The cheapest encoding is read at its last step; an expensive one (PaTH,
  stick-breaking: about 3.5x RoPE per step) earlier, before its learning rate had
  decayed, so the comparison favours the cheap encodings slightly. Training loss is
  the loss of each step's batch, not held-out text.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from posenc.lab.curves import curves

__all__ = ["SMOOTH", "compute_lines", "compute_rows", "train_flops"]

#: Recorded curve points averaged before interpolating (batch losses are noisy).
SMOOTH = 3


def train_flops(model: nn.Module, *, steps: int, batch_size: int, train_len: int) -> float:
    """``3 * (2 P + 2 L T C) * N`` (Kaplan et al. 2020, table 1) for ``model``, a
    ``TinyLM`` (its ``shape``) trained ``steps`` steps of ``batch_size`` windows."""
    shape = model.shape
    embedding = shape["vocab_size"] * shape["d_model"]
    matrices = sum(p.numel() for p in model.parameters()) - embedding
    attention = shape["num_layers"] * train_len * shape["d_model"]
    return 3.0 * (2.0 * matrices + 2.0 * attention) * steps * batch_size * train_len


def _smoothed(points: list[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    steps, losses = (np.asarray(v, dtype=np.float64) for v in zip(*points, strict=True))
    width = min(SMOOTH, len(losses))
    kernel = np.ones(width) / width
    return steps[width - 1 :], np.convolve(losses, kernel, mode="valid")


def _mean_curve(runs: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """The mean over seeds at the steps every seed recorded."""
    common = set.intersection(*({s for s, _ in c} for c in runs))
    by_step = [dict(c) for c in runs]
    return [(s, float(np.mean([c[s] for c in by_step]))) for s in sorted(common)]


def compute_rows(results: dict) -> list[dict[str, object]]:
    """Per encoding (finished runs that recorded their training CPU time): mean steps,
    training CPU-seconds, CPU-s per step, FLOPs (model shape) and the ratio of CPU-s per
    step to the cheapest encoding, and its training loss at the common budget (``None``
    where its curve does not reach back that far)."""
    spent: dict[str, list[tuple[int, float, float]]] = {}
    for run in results["runs"]:
        train = run.get("train") or {}
        if run["status"] == "ok" and "cpu_seconds" in train:
            taken = train["steps"] - train.get("resumed_from", 0)  # what cpu_seconds covers
            spent.setdefault(run["encoding"], []).append(
                (taken, train["cpu_seconds"], train.get("flops", float("nan")))
            )
    if not spent:
        return []
    rows = []
    for name, runs in spent.items():
        steps, cpu, flops = (float(np.mean(v)) for v in zip(*runs, strict=True))
        rows.append({"encoding": name, "steps": steps, "cpu_seconds": cpu,
                     "per_step": cpu / steps, "flops": flops})  # fmt: skip
    budget = min(r["cpu_seconds"] for r in rows)
    cheapest = min(r["per_step"] for r in rows)
    learned = curves(results)
    for row in rows:
        row["relative"] = row["per_step"] / cheapest
        row["budget"] = budget
        row["at_step"] = budget / row["per_step"]
        row["loss_at_budget"] = None
        if learned.get(row["encoding"]):
            steps, losses = _smoothed(_mean_curve(learned[row["encoding"]]))
            if steps[0] <= row["at_step"] <= steps[-1] + 1e-9:
                row["loss_at_budget"] = float(np.interp(row["at_step"], steps, losses))
    return rows


def compute_lines(results: dict) -> list[str]:
    """The report's section: a table of each encoding's training compute and its
    training loss at equal CPU-seconds."""
    rows = compute_rows(results)
    if not rows:
        return []
    budget = rows[0]["budget"]
    lines = [
        "Training compute per encoding (mean over seeds): training-loop CPU-seconds as "
        "measured (every thread; load-dependent), per step and relative to the cheapest; "
        "FLOPs from the model's shape (Kaplan et al. 2020: 6 per matrix parameter and "
        "token plus attention; the encoding's own work is not counted). Equal compute: "
        f"each encoding's training loss (learning curve, mean over seeds, running mean of "
        f"{SMOOTH} points) at the step where it had spent {budget:.1f} CPU-s, the "
        "cheapest encoding's whole budget; an expensive encoding is read before its "
        "learning rate decayed.",
        "",
        "| encoding | steps | train CPU-s | CPU-s / step | x cheapest | GFLOPs | "
        f"step at {budget:.1f} CPU-s | train loss there |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        loss = "n/a" if r["loss_at_budget"] is None else f"{r['loss_at_budget']:.3f}"
        lines.append(
            f"| {r['encoding']} | {r['steps']:.0f} | {r['cpu_seconds']:.1f} | "
            f"{r['per_step']:.3f} | {r['relative']:.2f} | {r['flops'] / 1e9:.1f} | "
            f"{r['at_step']:.0f} | {loss} |"
        )
    return [*lines, ""]
