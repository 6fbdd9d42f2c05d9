"""``posenc extend MODEL_DIR``: perplexity and passkey retrieval against evaluation length
for a local checkpoint's original positions and each RoPE scaling (no training).

``posenc.extend`` (torch, transformers) is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from posenc.cli import UsageError


def _numbers(values: list[str], kind: type, flag: str) -> tuple:
    try:
        return tuple(kind(part) for v in values for part in v.replace(",", " ").split())
    except ValueError:
        raise UsageError(f"extend: {flag} expects numbers, got {' '.join(values)!r}") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "extend",
        help="measure context extension (RoPE scalings) on a local checkpoint",
        description="Load a transformers checkpoint (a save_pretrained folder with its "
        "tokenizer), patch its RoPE with posenc (posenc.hf.patch) for each scaling and "
        "factor, and report perplexity on held-out text and passkey retrieval at each "
        "--eval-lens, ranking the scalings per length. Resumable; nothing is downloaded.",
    )
    p.add_argument(
        "model_dir", metavar="MODEL_DIR", help="folder with config.json, weights, tokenizer"
    )
    p.add_argument("--scalings", nargs="+", metavar="NAME",
                   help="linear ntk dynamic yarn (default: all four)")  # fmt: skip
    p.add_argument("--factors", nargs="+", metavar="F", help="scaling factors (default 2 4)")
    p.add_argument(
        "--eval-lens", nargs="+", metavar="N", help="lengths (default 1/2, 1, 2, 4 x trained)"
    )
    p.add_argument(
        "--corpus", metavar="PATH", help="'stdlib' (default), 'fortunes', a text file or folder"
    )
    p.add_argument("--windows", type=int, metavar="N", help="text windows per length (default 2)")
    p.add_argument(
        "--depths", nargs="*", metavar="D", help="passkey depths in [0, 1] (default 0.1 0.5 0.9)"
    )
    p.add_argument("--chunk", type=int, metavar="N", help="tokens per forward (default 512)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="default float32")
    p.add_argument("--out", metavar="DIR", help="output folder (default runs/extend-<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.extend import ExtendConfig, run_extend
    from posenc.extend.checkpoint import checkpoint_config

    options: dict[str, object] = {"model_dir": args.model_dir}
    if args.eval_lens:
        options["eval_lens"] = tuple(sorted(set(_numbers(args.eval_lens, int, "--eval-lens"))))
    else:
        trained = checkpoint_config(args.model_dir)[1]
        options["eval_lens"] = tuple(max(2, int(m * trained)) for m in (0.5, 1, 2, 4))
    if args.scalings:
        options["scalings"] = tuple(s for v in args.scalings for s in v.replace(",", " ").split())
    if args.factors:
        options["factors"] = _numbers(args.factors, float, "--factors")
    if args.depths is not None:
        options["passkey_depths"] = _numbers(args.depths, float, "--depths")
    for key in ("corpus", "windows", "chunk", "device", "dtype"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    config = ExtendConfig(**options)
    out = Path(args.out or f"runs/extend-{time.strftime('%Y%m%d-%H%M%S')}")
    run_extend(config, out, progress=not args.no_progress)
    print(f"posenc extend: wrote {out / 'results.json'}, {out / 'report.md'}")
    return 0
