"""The lab's sweep: one run per encoding and seed (``posenc.lab.runs``), merged and reported.

Each finished run is written at once (``runs/<encoding>-s<seed>.json``) and merged into
``results.json`` and ``report.md``; a rerun in the same folder skips finished runs (and
redoes one whose weights are missing or truncated); Ctrl-C keeps them and writes the
report of what finished (a report that says so, and no figure when nothing finished). A
run whose loss becomes NaN is recorded as failed and the sweep goes on.

Under ``torchrun`` with several seeds, the runs are spread over the processes (each
trains its runs alone, one per process at a time); with one seed the processes train
each run together, data-parallel (``posenc.lab.distributed``). Without ``torchrun``,
``jobs > 1`` spreads the runs over that many local worker processes (``posenc.lab.jobs``).
Spread runs are taken longest first (``posenc.lab.jobs.longest_first``); the numbers of a
run do not depend on where or when it runs. Each run's start and end is said in a line
with the time since the start and an estimate of the time left (``posenc.lab.progress``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from posenc.lab import plots, report
from posenc.lab.claims import comparisons_record
from posenc.lab.config import LabConfig
from posenc.lab.distributed import Context, init_context
from posenc.lab.jobs import longest_first, run_cost, run_in_processes
from posenc.lab.pairwise import compare_all
from posenc.lab.progress import RunLog
from posenc.lab.results import (
    check_identity,
    environment,
    finished_runs,
    remove_stale,
    write_json,
    write_text,
)
from posenc.lab.runs import Runner, run_name
from posenc.lab.variants import build_encoding
from posenc.lab.workload import make_workload
from posenc.parallel import check_splittable

__all__ = ["run_lab"]

_ENV_KEYS = ("torch_threads", "device", "precision", "torch", "processes", "context_parallel")


def _progress(console: Console, enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        console=console,
        disable=not enabled,
    )


def merged(
    config: LabConfig, work, context: Context, runs: dict, status: str, identity: str
) -> dict:
    """The sweep's results: the requested runs in (encoding, seed) order, with notes on
    runs whose environment differs (threads, device, precision, torch version, processes)."""
    keys = [(n, s) for n in config.encodings for s in config.seeds if (n, s) in runs]
    chosen = [runs[key] for key in keys]
    notes = []
    for key in _ENV_KEYS:
        seen = sorted({str(r.get("environment", {}).get(key)) for r in chosen})
        if len(seen) > 1:
            notes.append(f"runs differ in {key} ({', '.join(seen)}); their numbers may differ")
    return {
        "status": status if chosen or status != "complete" else "empty",
        "quick": config.quick,
        "config": config.to_dict(),
        "identity": identity,
        "seeds": list(config.seeds),
        "metric": work.metric,
        "environment": environment(
            threads=torch.get_num_threads(), world=context.world, device=context.device
        ),
        "data": work.data,
        "notes": notes,
        "runs": chosen,
    }


def _publish(out: Path, results: dict, *, figures: bool) -> list[Path]:
    """Write ``results.json`` and ``report.md`` (and the figures); once the sweep ends,
    ``results`` gains the pairwise tests (``"comparisons"``, ``posenc.lab.claims``)."""
    comparisons = compare_all(results) if results["status"] != "running" else []
    if comparisons:
        results["comparisons"] = comparisons_record(comparisons)
    write_json(out / "results.json", results)
    write_text(out / "report.md", report.markdown(results, comparisons))
    written = [out / "results.json", out / "report.md"]
    if figures:
        written += plots.draw_all(results, out)
    return written


def _spread(context: Context, config: LabConfig) -> bool:
    return context.world > 1 and context.cp == 1 and len(config.seeds) > 1


def _check_context_parallel(config: LabConfig, context: Context) -> None:
    """Refuse, before any run, what context parallelism cannot split: a training length
    that is not a multiple of ``2N`` (head-tail chunks), an encoding the ring refuses."""
    if context.cp == 1:
        return
    lengths = {"train_len": config.train_len}
    if config.finetune_steps:
        lengths["finetune_len"] = config.tuned_len
    for what, length in lengths.items():
        if length % (2 * context.cp):
            raise ValueError(
                f"{what} {length} is not a multiple of {2 * context.cp}, the head-tail chunks "
                f"of --context-parallel {context.cp}"
            )
    for name in config.encodings:
        try:
            check_splittable(build_encoding(name, config), causal=True)
        except ValueError as exc:
            raise ValueError(f"--context-parallel cannot train {name}: {exc}") from None


def run_lab(
    config: LabConfig,
    out: Path | None = None,
    *,
    console: Console | None = None,
    threads: int | None = None,
    device: str = "auto",
    progress: bool = True,
    sweep_file: str | None = None,
    jobs: int = 1,
    context_parallel: int = 1,
) -> dict:
    """Run (or resume) the sweep of ``config``; return the merged results.

    Args:
        config: the sweep.
        out: output folder; ``None``: ``runs/lab-<timestamp>``.
        console: where progress and the table go (rank 0 only).
        threads: torch CPU threads per process (``None``: keep torch's setting).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        progress: show progress bars on a terminal (each run's start and end is said
            in a line on any output, ``posenc.lab.progress``).
        sweep_file: the text of the ``--config`` file, saved as ``sweep.toml``.
        jobs: local worker processes, each with ``threads`` threads (ignored under
            ``torchrun``).
        context_parallel: processes per training sequence under ``torchrun``
            (``posenc.lab.distributed``); 1: none.

    Raises:
        ValueError: bad corpus, lengths or output folder (one clear message).
        OSError: the output folder cannot be written.
        KeyboardInterrupt: after writing what finished.
    """
    console = console or Console()
    context = init_context(device, context_parallel=context_parallel)
    try:
        _check_context_parallel(config, context)
        if threads is not None:
            torch.set_num_threads(threads)
        work = make_workload(config, context)
        out = Path(context.share(str(out or f"runs/lab-{time.strftime('%Y%m%d-%H%M%S')}")))
        identity = config.identity_hash(work.sha256)
        error, runs = None, {}
        if context.is_main:
            try:
                check_identity(out, config.identity(work.sha256))
                remove_stale(out)
                if sweep_file is not None:
                    write_text(out / "sweep.toml", sweep_file)
                runs = finished_runs(out, identity, metric=work.metric)
            except (ValueError, OSError) as exc:
                error = exc
        error = context.share(error)
        if error:
            raise error
        runs = context.share(runs)
        if context.is_main:
            _say_what_is_held(console, config, runs)
            warning = report.contamination(work.data)
            if warning:
                console.print(f"[bold red]WARNING: {warning}[/bold red]")
        todo = [(n, s) for s in config.seeds for n in config.encodings if (n, s) not in runs]
        local = context
        if _spread(context, config) or jobs > 1:  # parallel: the long runs first
            todo = longest_first(todo, config)
        if _spread(context, config):
            todo, local = todo[context.rank :: context.world], Context(device=context.device)
        bars = _progress(console, progress and context.is_main and console.is_terminal)
        runner = Runner(config, work, local, out, bars, identity)
        workers = jobs > 1 and context.world == 1 and len(todo) > 1
        log = None
        if context.is_main:  # a line at each run's start and end, on any output
            costs = {key: run_cost(key[0], config) for key in todo}
            log = RunLog(console, costs, slots=jobs if workers else 1)
        if workers:
            threads = threads or torch.get_num_threads()
            records = run_in_processes(config, out, identity, todo, jobs=jobs, threads=threads,
                                       device=context.device)  # fmt: skip
        else:
            records = (runner.run(name, seed) for name, seed in todo)
        status = "interrupted"
        try:
            with bars:
                for record in records:
                    key = record["encoding"], record["seed"]
                    runs[key] = record
                    if local.is_main:
                        write_json(out / "runs" / f"{run_name(*key)}.json", record)
                    if context.is_main:
                        partial = merged(config, work, context, runs, "running", identity)
                        _publish(out, partial, figures=False)
                    if log is not None:
                        log.finished(record)
            status = "complete"
        finally:
            if _spread(context, config) and status == "complete":
                dist.barrier()
                runs = finished_runs(out, identity, metric=work.metric) if context.is_main else runs
            results = merged(config, work, context, runs, status, identity)
            if context.is_main:
                written = _publish(out, results, figures=True)
        if context.is_main:
            report.print_table(results, console)
            console.print("wrote " + ", ".join(str(p) for p in written))
        return results
    finally:
        context.close()


def _say_what_is_held(console: Console, config: LabConfig, runs: dict) -> None:
    mine = [run_name(n, s) for n, s in runs if n in config.encodings and s in config.seeds]
    other = sorted(run_name(n, s) for n, s in runs if run_name(n, s) not in mine)
    if mine:
        console.print(f"finished earlier, skipped: {', '.join(sorted(mine))}")
    if other:
        console.print(
            f"this folder also holds finished runs not in this sweep: {', '.join(other)} "
            "(left out of the report)"
        )
