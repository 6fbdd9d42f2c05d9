"""The lab's sweep: one model per encoding, trained short and evaluated long.

For each encoding of a ``LabConfig`` the runner trains a ``TinyLM`` (same seed, same
data order for every encoding), evaluates it at every evaluation length, evaluates its
variants (rotary scalings, interpolated learned table; ``posenc.lab.variants``) and,
with ``finetune_steps``, fine-tunes each at the longest length. Each finished run is
written at once (``runs/<name>.json``) and merged into ``results.json`` and
``report.md``; a rerun in the same folder skips finished runs; Ctrl-C keeps them and
writes the report and plot of what finished. A run whose loss becomes NaN is recorded
as failed and the sweep goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn

from posenc.lab import report
from posenc.lab.config import LabConfig
from posenc.lab.distributed import Context, init_context
from posenc.lab.model import TinyLM
from posenc.lab.results import (
    check_identity,
    environment,
    finished_runs,
    write_json,
    write_text,
    write_weights,
)
from posenc.lab.train import NonFiniteLoss, train
from posenc.lab.variants import build_encoding, variants
from posenc.lab.workload import Workload, make_workload

__all__ = ["run_lab"]


class _Sweep:
    """One sweep's state: its configuration, data, process context and output folder."""

    def __init__(
        self, config: LabConfig, work: Workload, context: Context, out: Path, progress: Progress
    ) -> None:
        self.config, self.work, self.context = config, work, context
        self.out, self.progress = out, progress
        self.identity = config.identity_hash(work.sha256)

    def _train(self, model: nn.Module, label: str, length: int, steps: int, **opts: object):
        config = self.config
        batch = max(1, config.batch_size * config.train_len // length)
        task = self.progress.add_task(label, total=steps, loss=float("nan"))
        return train(
            model,
            self.work.sampler(
                length, config.seed if length == config.train_len else config.seed + 1
            ),
            steps=steps,
            batch_size=max(self.context.world, batch - batch % self.context.world),
            weight_decay=config.weight_decay,
            context=self.context,
            on_step=lambda step, loss: self.progress.update(task, completed=step, loss=loss),
            **opts,
        )

    def _row(self, label: str, kind: str, model_at: Callable[[int], nn.Module], base=None):
        results, notes = {}, {}
        for length in self.config.eval_lens:
            if base is not None and length <= self.config.train_len:
                results[str(length)] = base["results"][str(length)]
                continue
            try:
                results[str(length)] = self.work.evaluate(model_at(length), length)
            except ValueError as exc:
                results[str(length)], notes[str(length)] = None, str(exc)
        return {"label": label, "kind": kind, "results": results, "notes": notes}

    def _finetuned(self, name: str, model: TinyLM, label: str, options) -> dict:
        config = self.config
        longest = max(config.eval_lens)
        try:
            tuned = model.with_encoding(
                build_encoding(name, config, **options(longest / config.train_len))
            )
            self._train(
                tuned,
                f"{label} +ft",
                longest,
                config.finetune_steps,
                lr=config.lr / 10,
                warmup=max(1, config.finetune_steps // 10),
            )
        except (ValueError, NonFiniteLoss) as exc:
            results = {str(n): None for n in config.eval_lens}
            notes = {str(n): f"fine-tuning failed: {exc}" for n in config.eval_lens}
            return {"label": f"{label} +ft", "kind": "finetune", "results": results, "notes": notes}
        return self._row(f"{label} +ft", "finetune", lambda length: tuned)

    def run_one(self, name: str) -> dict:
        config, context = self.config, self.context
        record: dict[str, object] = {"encoding": name, "identity": self.identity}
        start = time.perf_counter()
        torch.manual_seed(config.seed)
        try:
            model = TinyLM(
                build_encoding(name, config),
                vocab_size=self.work.vocab_size,
                d_model=config.d_model,
                num_layers=config.num_layers,
                num_heads=config.num_heads,
            ).to(context.device)
            record["parameters"] = sum(p.numel() for p in model.parameters())
            return self._evaluate_trained(name, model, record, start)
        except NonFiniteLoss as exc:
            return {**record, "status": "failed", "error": str(exc), "rows": []}
        except Exception as exc:  # a broken encoding must not end the sweep; rerun later
            message = f"{type(exc).__name__}: {exc}"
            return {**record, "status": "error", "error": message, "rows": []}

    def _evaluate_trained(self, name: str, model: TinyLM, record: dict, start: float) -> dict:
        config = self.config
        result = self._train(
            model, name, config.train_len, config.steps, lr=config.lr, warmup=config.warmup
        )
        record["train"] = {
            "steps": result.steps,
            "seconds": round(result.seconds, 2),
            "steps_per_second": round(result.steps / max(result.seconds, 1e-9), 2),
            "final_loss": result.final_loss,
            "curve": result.curve,
        }
        if self.context.is_main:  # the trained weights, e.g. for `posenc show --table`
            write_weights(self.out / "runs" / f"{name}.pt", model)
            record["weights"] = f"runs/{name}.pt"
        base = self._row(name, "trained", lambda length: model)
        rows = [base]
        for variant in variants(name, config):

            def at(length, variant=variant):
                factor = length / config.train_len
                return model.with_encoding(build_encoding(name, config, **variant.options(factor)))

            rows.append(self._row(variant.label, variant.kind, at, base))
        if config.finetune_steps:
            rows.append(self._finetuned(name, model, name, lambda f: {}))
            rows += [
                self._finetuned(name, model, v.label, v.options) for v in variants(name, config)
            ]
        record.update(
            status="ok", error=None, rows=rows, seconds=round(time.perf_counter() - start, 2)
        )
        return record

    def merged(self, runs: dict[str, dict], status: str, threads: int) -> dict:
        order = [n for n in self.config.encodings if n in runs]
        order += sorted(n for n in runs if n not in order)
        return {
            "status": status,
            "config": self.config.to_dict(),
            "identity": self.identity,
            "seed": self.config.seed,
            "metric": self.work.metric,
            "environment": environment(
                threads=threads, world=self.context.world, device=self.context.device
            ),
            "data": self.work.data,
            "runs": [runs[n] for n in order],
        }

    def publish(self, results: dict, *, with_plot: bool) -> None:
        write_json(self.out / "results.json", results)
        write_text(self.out / "report.md", report.markdown(results))
        if with_plot:
            report.plot(results, self.out)


def _progress(console: Console, enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description:<22}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        console=console,
        disable=not enabled,
    )


def run_lab(
    config: LabConfig,
    out: Path | None = None,
    *,
    console: Console | None = None,
    threads: int | None = None,
    device: str = "auto",
    progress: bool = True,
) -> dict:
    """Run (or resume) the sweep of ``config``; return the merged results.

    Args:
        config: the sweep.
        out: output folder; ``None``: ``runs/lab-<timestamp>``.
        console: where progress and the table go (rank 0 only).
        threads: torch CPU threads per process (``None``: keep torch's setting).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        progress: show progress bars.

    Raises:
        ValueError: bad corpus, lengths or output folder (one clear message).
        KeyboardInterrupt: after writing what finished.
    """
    console = console or Console()
    context = init_context(device)
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        work = make_workload(config, context)
        out = Path(context.share(str(out or f"runs/lab-{time.strftime('%Y%m%d-%H%M%S')}")))
        sweep = _Sweep(config, work, context, out, _progress(console, progress and context.is_main))
        error = None
        if context.is_main:
            try:
                check_identity(out, config.identity(work.sha256))
            except ValueError as exc:
                error = str(exc)
        error = context.share(error)
        if error:
            raise ValueError(error)
        runs = context.share(finished_runs(out, sweep.identity) if context.is_main else None)
        skipped = [n for n in config.encodings if n in runs]
        if skipped and context.is_main:
            console.print(f"finished earlier, skipped: {', '.join(skipped)}")
        status = "interrupted"
        try:
            with sweep.progress:
                for name in config.encodings:
                    if name in runs:
                        continue
                    runs[name] = sweep.run_one(name)
                    if context.is_main:
                        write_json(out / "runs" / f"{name}.json", runs[name])
                        sweep.publish(
                            sweep.merged(runs, "running", torch.get_num_threads()), with_plot=False
                        )
            status = "complete"
        finally:
            results = sweep.merged(runs, status, torch.get_num_threads())
            if context.is_main:
                sweep.publish(results, with_plot=True)
        if context.is_main:
            report.print_table(results, console)
            console.print(
                f"wrote {out / 'results.json'}, {out / 'report.md'}, "
                f"{out / report.plot_name(results)}"
            )
        return results
    finally:
        context.close()
