"""``posenc lab``: train tiny causal LMs per encoding short, evaluate them long.

The lab itself (``posenc.lab``, torch training) is imported only when the command runs,
so ``posenc list`` and ``--help`` stay fast. Runs data-parallel under ``torchrun``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from posenc.cli import UsageError

#: Default evaluation lengths as multiples of the training length.
_LM_MULTIPLES = (1, 2, 4, 8, 16)
_QUICK_MULTIPLES = (1, 2, 4)
_TASK_MULTIPLES = (1, 2, 3, 4)


def _ints(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        raise UsageError(f"lab: expected integers, got {text!r}") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    from posenc.lab.config import LabConfig, quick_defaults

    p = sub.add_parser(
        "lab",
        help="train tiny LMs per encoding on short windows, evaluate on longer ones",
        description="Train one tiny causal transformer per encoding on windows of --train-len "
        "tokens and report perplexity (or task accuracy) at longer --eval-lens.",
    )
    p.add_argument(
        "--encodings",
        nargs="+",
        metavar="NAME",
        help="registered names (comma or space separated) or 'all'; "
        "default: nope sinusoidal learned rope alibi t5",
    )
    p.add_argument(
        "--task",
        choices=("copy", "reverse", "recall"),
        help="a synthetic task instead of text (exact-match accuracy)",
    )
    p.add_argument(
        "--corpus",
        metavar="PATH",
        help="UTF-8 text file or folder (default: this Python's stdlib sources)",
    )
    p.add_argument("--train-len", type=int, metavar="N", help="training length (default 64)")
    p.add_argument(
        "--eval-lens",
        nargs="+",
        metavar="N",
        help="evaluation lengths >= --train-len (default: 1, 2, 4, 8, 16 x train "
        "length; tasks: 1-4 x)",
    )
    numbers = [
        ("--steps", "steps", int, "training steps per model"),
        ("--batch-size", "batch_size", int, "windows per step (global)"),
        ("--lr", "lr", float, "peak learning rate"),
        ("--warmup", "warmup", int, "warmup steps"),
        ("--d-model", "d_model", int, "model width"),
        ("--layers", "num_layers", int, "transformer blocks"),
        ("--heads", "num_heads", int, "attention heads"),
        ("--eval-tokens", "eval_tokens", int, "text tokens scored per evaluation length"),
        ("--eval-examples", "eval_examples", int, "task examples per evaluation length"),
        ("--finetune-steps", "finetune_steps", int, "fine-tune steps at the longest length"),
    ]
    quick = quick_defaults("lm")
    for flag, key, kind, text in numbers:
        default = f"default {getattr(LabConfig, key)}"
        if key in quick:
            default += f", --quick {quick[key]}"
        p.add_argument(flag, dest=key, type=kind, metavar="N", help=f"{text} ({default})")
    p.add_argument(
        "--learned-beyond",
        choices=("error", "interpolate"),
        help="'interpolate' adds a row with the learned table stretched",
    )
    p.add_argument(
        "--scalings",
        nargs="*",
        metavar="NAME",
        help="rotary scalings evaluated at longer lengths (default: linear ntk "
        "dynamic yarn; none: give the option without names)",
    )
    p.add_argument("--seed", type=int, metavar="N", help="seed (default 0)")
    p.add_argument("--quick", action="store_true", help="tiny settings, under a minute")
    p.add_argument("--out", metavar="DIR", help="output folder (default runs/lab-<timestamp>)")
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch threads per process (default: cores / processes)",
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    """The ``LabConfig`` the options describe (presets, then explicit options)."""
    from posenc.lab.config import LabConfig, quick_defaults, resolve_encodings

    task = args.task or "lm"
    values: dict[str, object] = {"task": task}
    if args.quick:
        values.update(quick_defaults(task))
    for key in (
        "corpus",
        "train_len",
        "steps",
        "batch_size",
        "lr",
        "warmup",
        "d_model",
        "num_layers",
        "num_heads",
        "eval_tokens",
        "eval_examples",
        "finetune_steps",
        "learned_beyond",
        "seed",
    ):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if args.encodings:
        values["encodings"] = resolve_encodings(args.encodings)
    if args.scalings is not None:
        values["scalings"] = tuple(args.scalings)
    train_len = values.get("train_len", LabConfig.train_len)
    if args.eval_lens:
        values["eval_lens"] = tuple(sorted({n for text in args.eval_lens for n in _ints(text)}))
    else:
        multiples = (
            _TASK_MULTIPLES if task != "lm" else _QUICK_MULTIPLES if args.quick else _LM_MULTIPLES
        )
        values["eval_lens"] = tuple(m * train_len for m in multiples)
    return LabConfig(**values)


def run(args: argparse.Namespace) -> int:
    from posenc.lab.runner import run_lab

    config = config_from_args(args)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads = args.threads or max(1, (os.cpu_count() or 1) // local)
    run_lab(
        config,
        Path(args.out) if args.out else None,
        threads=threads,
        device=args.device,
        progress=not args.no_progress,
    )
    return 0
