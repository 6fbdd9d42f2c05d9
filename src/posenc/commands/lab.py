"""``posenc lab``: train tiny causal LMs per encoding short, evaluate them long.

The lab itself (``posenc.lab``, torch training) is imported only when the command runs,
so ``posenc list`` and ``--help`` stay fast. Runs data-parallel under ``torchrun`` (or
spreads the seeds over the processes). ``--config sweep.toml`` reads the options from a
file (``posenc.lab.sweepfile``); options on the command line win.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from posenc.cli import PREFIX, UsageError

#: The flag of each setting whose name differs from it, for error messages: the lab's
#: checks name the settings (``train_len``), the user typed the flags (``--train-len``).
FLAGS = {
    "lr": "--lr",
    "warmup": "--warmup",
    "seed": "--seed",
    "train_len": "--train-len",
    "eval_lens": "--eval-lens",
    "max_steps": "--max-steps",
    "batch_size": "--batch-size",
    "d_model": "--d-model",
    "num_layers": "--layers",
    "num_heads": "--heads",
    "eval_tokens": "--eval-tokens",
    "eval_examples": "--eval-examples",
    "eval_stride": "--eval-stride",
    "finetune_steps": "--finetune-steps",
    "finetune_len": "--finetune-len",
    "finetune_scalings": "--finetune-scalings",
    "dynamic_factor": "--dynamic-factor",
    "t5_max_distance": "--t5-max-distance",
    "learned_beyond": "--learned-beyond",
    "val_every": "--val-every",
    "val_tokens": "--val-tokens",
    "plateau": "--plateau",
    "plateau_eps": "--plateau-eps",
    "profile": "--profile",
    "passkey_key_len": "--passkey-key-len",
}

#: Options that apply to one kind of sweep only (text is task ``lm``; ``tasks``: every
#: synthetic task); given for another, refused.
_TASK_ONLY = {
    "passkey_key_len": "passkey",
    "eval_examples": "tasks",
    "corpus": "lm",
    "eval_tokens": "lm",
    "eval_stride": "lm",
    "plateau": "lm",
    "plateau_eps": "lm",
}
#: Default evaluation lengths as multiples of the training length.
_LM_MULTIPLES = (1, 2, 4, 8, 16)
_QUICK_MULTIPLES = (1, 2, 4)
_TASK_MULTIPLES = (1, 2, 3, 4)
_PASSKEY_MIN = 16


def _ints(text: object) -> list[int]:
    if isinstance(text, int) and not isinstance(text, bool):
        return [text]
    try:
        return [int(part) for part in str(text).replace(",", " ").split()]
    except ValueError:
        raise UsageError(f"lab: expected integers, got {text!r}") from None


def _names(values: list[object]) -> tuple[str, ...]:
    return tuple(part.strip() for v in values for part in str(v).split(",") if part.strip())


def add_parser(sub: argparse._SubParsersAction) -> None:
    from posenc.lab.config import (
        DEFAULT_ENCODINGS,
        LEARNED,
        PROFILES,
        TASKS,
        LabConfig,
        quick_defaults,
        thorough_defaults,
    )
    from posenc.lab.precision import PRECISIONS

    p = sub.add_parser(
        "lab",
        help="train tiny LMs per encoding on short windows, evaluate on longer ones",
        description="Train one tiny causal transformer per encoding and seed on windows of "
        "--train-len tokens and report perplexity (or task accuracy) at longer --eval-lens: "
        "mean and 95 % interval over seeds and evaluation text, and every pair of rows "
        "compared by a paired permutation test (Holm-corrected), after checking the "
        "held-out text's overlap with the training text.",
    )
    p.add_argument(
        "--config", metavar="FILE",
        help="read options from a sweep file (TOML) or a shipped sweep by name (positions)",
    )  # fmt: skip
    p.add_argument(
        "--encodings",
        nargs="+",
        metavar="NAME",
        help="registered names (comma or space separated) or 'all'; "
        f"default: {' '.join(DEFAULT_ENCODINGS)}",
    )
    p.add_argument(
        "--task",
        choices=TASKS[1:],
        help="a synthetic task instead of text (exact-match and per-token accuracy)",
    )
    p.add_argument(
        "--corpus",
        metavar="PATH",
        help="'stdlib' (default: this Python's standard-library sources), 'fortunes' "
        "(English prose from Debian's fortunes package), or a UTF-8 text file or folder",
    )
    p.add_argument("--train-len", type=int, metavar="N", help="training length (default 64)")
    p.add_argument(
        "--eval-lens",
        nargs="+",
        metavar="N",
        help="evaluation lengths >= --train-len (default: 1, 2, 4, 8, 16 x train "
        "length; tasks: 1-4 x)",
    )
    quick = quick_defaults("lm")
    numbers = [
        ("--steps", "steps", int, "N", "training steps per model"),
        ("--batch-size", "batch_size", int, "N", "windows per step (global)"),
        ("--lr", "lr", float, "RATE", "peak learning rate"),
        ("--warmup", "warmup", int, "N", "warmup steps"),
        ("--d-model", "d_model", int, "N", "model width"),
        ("--layers", "num_layers", int, "N", "transformer blocks"),
        ("--heads", "num_heads", int, "N", "attention heads"),
        ("--eval-tokens", "eval_tokens", int, "N", "text tokens scored per evaluation length"),
        ("--eval-examples", "eval_examples", int, "N", "task examples per evaluation length"),
        ("--finetune-steps", "finetune_steps", int, "N",
         "steps of the rotary fine-tune (Chen et al. 2023's PI protocol; 0: none)"),
        ("--dynamic-factor", "dynamic_factor", float, "F", "dynamic NTK's own factor"),
    ]  # fmt: skip
    for flag, key, kind, metavar, text in numbers:
        default = f"default {getattr(LabConfig, key)}"
        if key in quick:
            default += f", --quick {quick[key]}"
        p.add_argument(flag, dest=key, type=kind, metavar=metavar, help=f"{text} ({default})")
    p.add_argument(
        "--max-steps",
        type=int,
        metavar="N",
        help="tasks: train on past --steps, in rounds, until exact match at the training "
        f"length reaches {100 * LEARNED:g}%% on held-out examples, at most N steps "
        "(default 4 x --steps)",
    )
    thorough = thorough_defaults("lm")
    p.add_argument(
        "--profile",
        choices=PROFILES,
        help="'default': the fixed budget (about 15 minutes on 2 quiet cores); 'thorough': text "
        f"trains {thorough['steps']} steps, then until the validation loss plateaus, at most "
        f"{thorough['max_steps']} (several times the default's cost)",
    )
    p.add_argument(
        "--val-every",
        type=int,
        metavar="N",
        help="validation loss every N steps, on text taken out of the training text "
        f"(default: off; thorough {thorough['val_every']})",
    )
    p.add_argument(
        "--val-tokens",
        type=int,
        metavar="N",
        help=f"tokens of the validation set (default {LabConfig.val_tokens})",
    )
    p.add_argument(
        "--plateau",
        type=int,
        metavar="W",
        help="text: past --steps, train until the last W validation losses improve on the "
        f"best before them by at most --plateau-eps (default: off; thorough {thorough['plateau']})",
    )
    p.add_argument(
        "--plateau-eps",
        type=float,
        metavar="E",
        help=f"relative improvement of the plateau rule (default {LabConfig.plateau_eps})",
    )
    p.add_argument(
        "--passkey-key-len",
        type=int,
        metavar="N",
        help=f"digits of the passkey (default {LabConfig.passkey_key_len})",
    )
    p.add_argument(
        "--eval-stride",
        type=int,
        metavar="N",
        help="also score sliding windows that advance N tokens (default: off)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="'auto' (default: bfloat16 mixed precision where the hardware has bfloat16 "
        "arithmetic, else float32), 'float32' or 'bfloat16'",
    )
    p.add_argument(
        "--finetune-len",
        type=int,
        metavar="N",
        help="length of the rotary fine-tune, at factor N / --train-len (default 4 x train)",
    )
    p.add_argument(
        "--finetune-scalings",
        nargs="*",
        metavar="NAME",
        help="scalings fine-tuned beside the plain rotary model (default: linear)",
    )
    p.add_argument(
        "--t5-max-distance",
        type=int,
        metavar="N",
        help="T5's max_distance (default: --train-len, at least 32, so every bucket trains)",
    )
    p.add_argument(
        "--learned-beyond",
        choices=("error", "interpolate"),
        help="'interpolate' (default) adds a row with the learned table stretched",
    )
    p.add_argument(
        "--scalings",
        nargs="*",
        metavar="NAME",
        help="rotary scalings evaluated at longer lengths (default: linear ntk "
        "dynamic yarn; dynamic adds its decoded row, yarn its row at transformers' "
        "defaults; none: give the option without names)",
    )
    p.add_argument("--seeds", metavar="N", help="number of seeds (default 6, --quick 1)")
    p.add_argument("--seed", type=int, metavar="N", help="first seed (default 0)")
    p.add_argument(
        "--quick", action="store_true", default=None, help="smoke test: tiny settings, one seed"
    )
    p.add_argument("--out", metavar="DIR", help="output folder (default runs/lab-<timestamp>)")
    p.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="worker processes, each training its own runs (default: seeds, at most the "
        "cores; 1 under torchrun)",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch threads per process (default: cores / processes)",
    )
    p.add_argument(
        "--context-parallel",
        type=int,
        metavar="N",
        help="under torchrun, split each training sequence across N processes (ring "
        "attention; N divides the process count; default 1)",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        help="where to train: auto (default) picks CUDA when available",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        default=None,
        help="hide the progress bars of a terminal (the line at each run's start and end, "
        "with the time left, stays)",
    )
    p.set_defaults(func=run)


def _seeds(args: argparse.Namespace, count: int) -> tuple[int, ...] | None:
    """The seeds ``--seeds`` (a count, or a list from a sweep file) and ``--seed`` (the
    first) ask for; ``None`` when neither is given. ``count``: the default count."""
    if args.seeds is None and args.seed is None:
        return None
    if isinstance(args.seeds, list):
        return tuple(_ints(" ".join(str(s) for s in args.seeds)))
    if args.seeds is not None:
        numbers = _ints(args.seeds)
        if len(numbers) != 1 or numbers[0] < 1:
            raise UsageError(f"lab: --seeds takes one count >= 1, got {args.seeds!r}")
        count = numbers[0]
    from posenc.lab.config import check_limit

    check_limit("number of seeds", count)  # before the tuple is built
    first = args.seed or 0
    return tuple(range(first, first + count))


def config_from_args(args: argparse.Namespace):
    """The ``LabConfig`` the options describe (presets, then explicit options)."""
    from posenc.lab.config import (
        DEFAULT_SEEDS,
        LabConfig,
        quick_defaults,
        resolve_encodings,
        thorough_defaults,
    )

    task = args.task or "lm"
    values: dict[str, object] = {"task": task}
    if args.quick and args.profile == "thorough":
        raise UsageError("lab: --quick and --profile thorough exclude each other")
    if args.quick:
        values.update(quick_defaults(task))
    if args.profile == "thorough":
        values.update(thorough_defaults(task))
    keys = ("corpus", "train_len", "steps", "max_steps", "batch_size", "lr", "warmup", "d_model",
            "num_layers", "num_heads", "eval_tokens", "eval_examples", "eval_stride",
            "precision", "finetune_steps", "finetune_len", "learned_beyond", "dynamic_factor",
            "t5_max_distance", "val_every", "val_tokens", "plateau", "plateau_eps",
            "passkey_key_len")  # fmt: skip
    given = {key: getattr(args, key) for key in keys if getattr(args, key) is not None}
    _check_task_options(task, given)
    values.update(given)
    if args.encodings:
        from posenc.base import available
        from posenc.cli import resolve_name

        known = [*available(), "all"]
        names = [resolve_name(n, known, what="encoding") for n in _names(args.encodings)]
        values["encodings"] = resolve_encodings(names)
    for key in ("scalings", "finetune_scalings"):
        if getattr(args, key) is not None:
            values[key] = _names(getattr(args, key))
    seeds = _seeds(args, len(values.get("seeds", DEFAULT_SEEDS)))
    if seeds is not None:
        values["seeds"] = seeds
    train_len = values.get("train_len", LabConfig.train_len)
    if args.eval_lens:
        values["eval_lens"] = tuple(sorted({n for text in args.eval_lens for n in _ints(text)}))
    else:
        multiples = (
            _TASK_MULTIPLES if task != "lm" else _QUICK_MULTIPLES if args.quick else _LM_MULTIPLES
        )
        values["eval_lens"] = tuple(m * train_len for m in multiples)
    return LabConfig(**values)


def _check_task_options(task: str, given: dict[str, object]) -> None:
    """Refuse an option given for a task that does not use it, and name a corpus that is
    neither a named corpus nor a path, with the closest named one.

    Raises:
        UsageError: the option and the tasks it applies to; the corpus.
    """
    from posenc.cli import suggest
    from posenc.lab.config import TASKS
    from posenc.lab.corpus import CORPORA

    kinds = {"lm": ("lm",), "passkey": ("passkey",), "tasks": tuple(t for t in TASKS if t != "lm")}
    for key, kind in _TASK_ONLY.items():
        if key in given and task not in kinds[kind]:
            flag = FLAGS.get(key, f"--{key}")
            where = "text (task lm)" if kind == "lm" else f"--task {', '.join(kinds[kind])}"
            raise UsageError(f"lab: {flag} applies to {where} only, not to task {task!r}")
    corpus = given.get("corpus")
    path = Path(str(corpus))
    if corpus is not None and corpus not in CORPORA and not (path.exists() or path.is_symlink()):
        raise UsageError(
            f"lab: --corpus {corpus!r} does not exist{suggest(corpus, CORPORA)} "
            f"(named corpora: {', '.join(CORPORA)}; or a UTF-8 text file or folder)"
        )


def _settings(args: argparse.Namespace) -> tuple[str | None, list[tuple[str | None, dict]]]:
    """The sweep file's text and settings (``(None, [(None, {})])`` without ``--config``),
    each setting's options applied only where the command line left them unset."""
    if args.config is None:
        return None, [(None, {})]
    from posenc.cli import suggest
    from posenc.lab.sweepfile import load_sweep, shipped_sweeps

    try:
        return load_sweep(args.config)
    except FileNotFoundError as exc:
        if exc.errno is not None:  # the system's: it names its path
            raise
        raise UsageError(f"lab: --config: {exc}{suggest(args.config, shipped_sweeps())}") from None


def _check_context_parallel(size: int) -> None:
    """``--context-parallel N`` needs ``torchrun`` with a multiple of ``N`` processes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1 and world % size:
        raise ValueError(
            f"--context-parallel {size} needs a multiple of {size} processes, got {world}: "
            f"run it as torchrun --nproc_per_node={size} -m posenc lab --context-parallel {size}"
        )


def _check_data(sweeps: list) -> None:
    """Load the corpus (or make the task) of every setting after the first whose data
    differ from the first's, so a missing corpus or a length it cannot fill is refused
    before the first setting trains (the first is checked by ``run_lab`` itself)."""
    import torch

    from posenc.lab.distributed import Context
    from posenc.lab.workload import make_workload

    def key(config) -> tuple:
        return config.task, config.corpus, config.eval_lens, config.tuned_len, config.precision

    checked = {key(sweeps[0][2])} if sweeps else set()
    for name, merged, config in sweeps[1:]:
        if key(config) in checked:
            continue
        checked.add(key(config))
        cuda = merged.device == "cuda" or (
            merged.device in (None, "auto") and torch.cuda.is_available()
        )
        try:
            make_workload(config, Context(device=torch.device("cuda" if cuda else "cpu")))
        except (ValueError, OSError) as exc:
            raise type(exc)(f"setting {name!r}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from posenc.lab.runner import run_lab

    text, settings = _settings(args)
    console = Console()
    statuses = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    sweeps = []  # every setting checked before the first trains
    for name, options in settings:
        merged = argparse.Namespace(**vars(args))
        for dest, value in options.items():
            if getattr(merged, dest, None) is None:
                setattr(merged, dest, value)
        where = f"setting {name!r}: " if name is not None else ""
        try:
            config = config_from_args(merged)
            for flag in ("threads", "jobs", "context_parallel"):
                if getattr(merged, flag) is not None and getattr(merged, flag) < 1:
                    dashed = flag.replace("_", "-")
                    raise ValueError(f"--{dashed} must be >= 1, got {getattr(merged, flag)}")
            _check_context_parallel(merged.context_parallel or 1)
        except (ValueError, TypeError, UsageError) as exc:
            raise type(exc)(f"{where}{exc}") from None
        sweeps.append((name, merged, config))
    _check_data(sweeps)
    for name, merged, config in sweeps:
        cores = os.cpu_count() or 1
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        jobs = merged.jobs or (1 if local > 1 else min(len(config.seeds), cores))
        threads = merged.threads or max(1, cores // (local * jobs))
        out = Path(merged.out) if merged.out else None
        if name is not None:
            out = (out or Path(f"runs/lab-{stamp}")) / name
            console.print(f"setting {name}:")
        results = run_lab(
            config,
            out,
            console=console,
            threads=threads,
            device=merged.device or "auto",
            progress=not merged.no_progress,
            sweep_file=text,
            jobs=jobs,
            context_parallel=merged.context_parallel or 1,
        )
        statuses += [r["status"] for r in results["runs"]]
    if statuses and "ok" not in statuses:
        print(f"{PREFIX}lab: every run failed; see the report's notes", file=sys.stderr)
        return 1
    return 0
