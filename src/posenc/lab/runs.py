"""One run of the lab: an encoding and a seed, trained short and evaluated long.

A run trains a ``TinyLM`` (the seed fixes the initialisation and the data order, the same
for every encoding), evaluates it at every evaluation length, evaluates its variants
(rotary scalings, the interpolated learned table; ``posenc.lab.variants``) and, for
rotary encodings with ``finetune_steps``, the fine-tuned rows of Chen et al. 2023's
protocol: the model fine-tuned at ``finetune_len`` unscaled (``+ft``) and under each of
``finetune_scalings`` at the fixed factor ``finetune_len / train_len`` (``+linear +ft``),
every row evaluated at every length.

A synthetic task trains until it is learned in distribution: past ``steps``, in rounds of
``steps / ROUNDS`` steps, until its exact match at the training length reaches
``LEARNED``, or until ``max_steps``. The check scores its own examples (seed
``CHECK_STREAM + seed``), never those of the report's columns nor the training batches,
so the decision to stop is not made on the numbers reported. The record keeps
``steps_to_learn`` (``None`` at the cap) and every check in ``train.checks``; a task whose
last check is below ``LEARNED`` is marked ``"learned": false`` and reported as such,
never as a result. After
each round the training state is saved atomically to ``runs/<stem>.round.pt`` (removed
when the run finishes), so an interrupted run resumes from its last round, bit for bit.

With ``val_every`` the validation loss (``posenc.lab.plateau``) is measured every
``val_every`` steps of the first training, in eval mode, without touching the training
batches or weights (a task's numbers are those of a run without it; text trains on its
training text less the validation blocks); text with
``plateau`` trains past ``steps`` in rounds of ``val_every`` steps until the validation
losses plateau or ``max_steps``. ``train.stop`` says why training ended: ``"fixed"``
(exactly ``steps``), ``"plateau"``, ``"learned"`` or ``"budget"`` (the cap came first).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.progress import Progress
from torch import nn

from posenc.lab.compute import train_flops
from posenc.lab.config import LEARNED, LabConfig
from posenc.lab.distributed import Context
from posenc.lab.model import TinyLM, seeded_model
from posenc.lab.plateau import plateaued, validation_loss
from posenc.lab.results import (
    load_tensors,
    read_regular,
    run_environment,
    write_bytes,
    write_weights,
)
from posenc.lab.tasks import IGNORE
from posenc.lab.train import NonFiniteLoss, Until, train
from posenc.lab.variants import Variant, build_encoding, is_rotary, variants
from posenc.lab.workload import Workload

__all__ = ["CHECK_STREAM", "LEARNED", "ROUNDS", "Runner", "run_name"]

#: Past ``steps``, a task's exact match is checked every ``steps // ROUNDS`` steps.
ROUNDS = 4
#: The stopping checks score the examples of seed ``CHECK_STREAM + seed``.
CHECK_STREAM = 1 << 20


def run_name(encoding: str, seed: int) -> str:
    """The file stem of a run (``runs/<stem>.json`` and ``.pt``)."""
    return f"{encoding}-s{seed}"


class Runner:
    """Trains and evaluates single runs of one sweep (its config, data, context, folder)."""

    def __init__(
        self,
        config: LabConfig,
        work: Workload,
        context: Context,
        out: Path,
        progress: Progress,
        identity: str,
    ) -> None:
        self.config, self.work, self.context = config, work, context
        self.out, self.progress, self.identity = out, progress, identity

    def _train(self, model: nn.Module, label: str, length: int, steps: int, seed: int,
               validate=None, **opts):  # fmt: skip
        config = self.config
        batch = max(1, config.batch_size * config.train_len // length)
        total = opts["until"].max_steps if opts.get("until") else steps
        task = self.progress.add_task(label, total=total, loss=float("nan"))

        def on_step(step: int, loss: float) -> None:
            self.progress.update(task, completed=step, loss=loss)
            if validate is not None:
                validate(step)

        return train(
            model,
            self.work.sampler(length, 2 * seed + (length != config.train_len)),
            steps=steps,
            batch_size=max(self.context.dp, batch - batch % self.context.dp),
            weight_decay=config.weight_decay,
            context=self.context,
            dtype=self.work.dtype,
            on_step=on_step,
            **opts,
        )

    def _row(
        self, label: str, kind: str, model_at: Callable[[int], nn.Module], seed: int, base=None
    ) -> dict:
        results, notes = {}, {}
        for length in self.config.eval_lens:
            if base is not None and length <= self.config.train_len:
                results[str(length)] = base["results"][str(length)]
                continue
            try:
                results[str(length)] = self.work.evaluate(model_at(length), length, seed)
            except ValueError as exc:
                results[str(length)], notes[str(length)] = None, _in_lab_words(str(exc))
        return {"label": label, "kind": kind, "results": results, "notes": notes}

    def _finetuned(self, name: str, model: TinyLM, label: str, options, seed: int) -> dict:
        config = self.config
        factor = config.tuned_len / config.train_len
        label = f"{label} +ft"
        try:
            tuned = model.with_encoding(build_encoding(name, config, **options(factor)))
            self._train(
                tuned,
                f"{label} s{seed}",
                config.tuned_len,
                config.finetune_steps,
                seed,
                lr=config.lr / 10,
                warmup=max(1, config.finetune_steps // 10),
            )
        except (ValueError, NonFiniteLoss) as exc:
            results = {str(n): None for n in config.eval_lens}
            notes = {str(n): f"fine-tuning failed: {exc}" for n in config.eval_lens}
            return {"label": label, "kind": "finetune", "results": results, "notes": notes}
        return self._row(label, "finetune", lambda length: tuned, seed)

    def _rounds(self, name: str, seed: int) -> Path:
        """Where a task run's training state is kept between rounds (until it finishes)."""
        return self.out / "runs" / f"{run_name(name, seed)}.round.pt"

    def run(self, name: str, seed: int) -> dict:
        """Train and evaluate ``name`` with ``seed``; the run's record (status ``ok``,
        ``failed`` for a non-finite loss, ``error`` for anything else but file errors).

        Raises:
            OSError: writing the weights failed (a full disk ends the sweep).
        """
        config, context = self.config, self.context
        record: dict[str, object] = {
            "encoding": name,
            "seed": seed,
            "identity": self.identity,
            "environment": run_environment(context, self.work.dtype),
        }
        if "heldout" in self.work.data:  # the overlap of its evaluation text (text only)
            record["heldout"] = self.work.data["heldout"]
        start = time.perf_counter(), time.process_time()
        try:
            model = seeded_model(
                lambda: build_encoding(name, config),
                seed=seed,
                vocab_size=self.work.vocab_size,
                d_model=config.d_model,
                num_layers=config.num_layers,
                num_heads=config.num_heads,
            ).to(context.device)
            record["parameters"] = sum(p.numel() for p in model.parameters())
            return self._evaluate_trained(name, seed, model, record, start)
        except NonFiniteLoss as exc:
            if context.is_main:  # final: a rerun skips failed runs
                self._rounds(name, seed).unlink(missing_ok=True)
            return {**record, "status": "failed", "error": str(exc), "rows": []}
        except OSError:
            raise
        except Exception as exc:  # a broken encoding must not end the sweep; rerun later
            message = f"{type(exc).__name__}: {exc}"
            return {**record, "status": "error", "error": message, "rows": []}

    def _evaluate_trained(
        self, name: str, seed: int, model: TinyLM, record: dict, start: tuple[float, float]
    ) -> dict:
        config = self.config
        checks: list[list[float]] = []  # [step, exact match at the training length]
        losses: list[list[float]] = []  # [step, validation loss]
        held = self.work.validation(seed) if self.work.validation is not None else None

        def validate(step: int) -> None:
            if held is not None and step % config.val_every == 0:
                losses.append([step, validation_loss(model, *held, dtype=self.work.dtype)])

        def check(step: int) -> bool:
            if self.work.metric != "accuracy":  # text with a plateau rule
                return _plateau(losses, config)
            score = self.work.evaluate(model, config.train_len, CHECK_STREAM + seed)
            checks.append([step, score["accuracy"]])
            return checks[-1][1] >= LEARNED

        def save(snapshot: dict) -> None:
            if self.context.is_main:
                kept = {"checks": checks, "validation": losses, "identity": self.identity}
                _write_round(rounds, {**snapshot, **kept})

        stem = run_name(name, seed)
        rounds = self._rounds(name, seed)
        until = resume = None
        if config.step_cap is not None:
            resume = _read_round(rounds, self.identity)
            checks += resume["checks"] if resume else []
            losses += resume.get("validation", []) if resume else []
            every = config.val_every if config.plateau else max(1, config.steps // ROUNDS)
            until = Until(check, config.step_cap, every, save=save, resume=resume)
        cpu = time.process_time()
        result = self._train(
            model,
            f"{name} s{seed}",
            config.train_len,
            config.steps,
            seed,
            validate,
            lr=config.lr,
            warmup=config.warmup,
            until=until,
        )
        here = result.steps - (resume["step"] if resume else 0)  # steps this process took
        record["train"] = {
            "steps": result.steps,
            "seconds": round(result.seconds, 2),
            "tokens_per_second": round(
                here * config.batch_size * config.train_len / max(result.seconds, 1e-9)
            ),
            "final_loss": result.final_loss,
            "cpu_seconds": round(time.process_time() - cpu, 2),  # the steps this process took
            "flops": train_flops(
                model, steps=result.steps, batch_size=config.batch_size, train_len=config.train_len
            ),
            "curve": result.curve,
            "stop": _stop(config, checks, losses),
        }
        if held is not None:
            record["train"]["validation"] = {
                "every": config.val_every,
                "tokens": int((held[1] != IGNORE).sum()),
                "curve": losses,
            }
        if until is not None:
            record["train"].update(max_steps=until.max_steps, check_every=until.every)
            if self.work.metric == "accuracy":
                record["train"].update(learned_at=LEARNED, checks=checks)
            if resume is not None:
                record["train"]["resumed_from"] = resume["step"]
        if self.context.is_main:  # the trained weights, e.g. for `posenc show --table`
            write_weights(self.out / "runs" / f"{stem}.pt", model)
            record["weights"] = f"runs/{stem}.pt"
        base = self._row(name, "trained", lambda length: model, seed)
        rows = [base]
        for variant in variants(name, config):

            def at(length, variant=variant):
                factor = length / config.train_len
                return model.with_encoding(variant.encoding(name, config, factor))

            rows.append(self._row(variant.label, variant.kind, at, seed, base))
        if config.finetune_steps and is_rotary(name):
            rows.append(self._finetuned(name, model, name, lambda f: {}, seed))
            rows += [
                self._finetuned(name, model, v.label, v.options, seed) for v in _tuned(name, config)
            ]
        if self.work.metric == "accuracy":
            record["learned"] = bool(checks) and checks[-1][1] >= LEARNED  # the check set
            record["steps_to_learn"] = result.steps if record["learned"] else None
        record.update(
            status="ok",
            error=None,
            rows=rows,
            seconds=round(time.perf_counter() - start[0], 2),
            cpu_seconds=round(time.process_time() - start[1], 2),  # this process, all threads
        )
        if self.context.is_main:
            rounds.unlink(missing_ok=True)
        return record


def _plateau(losses: list[list[float]], config: LabConfig) -> bool:
    return plateaued([loss for _, loss in losses], config.plateau, config.plateau_eps)


def _stop(config: LabConfig, checks: list, losses: list) -> str:
    """Why training ended: ``fixed``, ``plateau``, ``learned`` or ``budget``."""
    if config.step_cap is None:
        return "fixed"
    if config.task != "lm":
        return "learned" if checks and checks[-1][1] >= LEARNED else "budget"
    return "plateau" if _plateau(losses, config) else "budget"


def _write_round(path: Path, snapshot: dict) -> None:
    """Save a round's training state atomically (``torch.save``)."""
    buffer = io.BytesIO()
    torch.save(snapshot, buffer)
    write_bytes(path, buffer.getvalue())


def _read_round(path: Path, identity: str) -> dict | None:
    """The training state saved after a round of this sweep's run, if one loads."""
    try:  # never a blocking read: a FIFO there is refused when the sweep starts
        snapshot = load_tensors(read_regular(path))
    except (OSError, ValueError):
        return None  # none, or not a file: the run starts over (the same numbers)
    return snapshot if isinstance(snapshot, dict) and snapshot.get("identity") == identity else None


def _in_lab_words(message: str) -> str:
    """A library message with its Python advice put as the lab's option."""
    return message.replace(
        "use beyond='interpolate' or a larger max_len",
        "the row `learned +interpolate` (--learned-beyond interpolate) stretches the table",
    )


def _tuned(name: str, config: LabConfig) -> list[Variant]:
    """The scaling variants of ``name`` fine-tuned under Chen et al.'s protocol."""
    tuned = config.replace(scalings=config.finetune_scalings)
    return [v for v in variants(name, tuned) if v.kind == "scaling" and v.tunable]
