"""``posenc audit PATH``: one checkpoint's positions as each runtime reads them, compared.

PATH is a checkpoint folder (``config.json``; a ``.gguf`` beside it or ``--gguf FILE``) or a
GGUF file alone. One table: each compared field, each runtime's value (the first layer
that differs, else layer 0), whether they agree, the layers that differ, and the largest
change of an attention score the difference causes at each length (``posenc.audit.compare``
defines it); then the GGUF fields that differ from what llama.cpp's converter writes for
the ``config.json``, and each runtime's notes. Exit status: 0 when everything agrees, 1 on
any difference, 2 on bad input. ``--json`` prints the whole result as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="compare a checkpoint's positions in transformers, llama.cpp, vLLM",
    )
    p.add_argument("path", metavar="PATH", help="checkpoint folder (config.json) or a .gguf file")
    p.add_argument(
        "--gguf", metavar="FILE", help="the checkpoint's GGUF file (default: the one beside it)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        metavar="N",
        help="sequence lengths to measure score changes at (default: original, trained, 2x)",
    )
    p.add_argument("--no-vllm", action="store_true", help="skip vLLM's reading")
    p.set_defaults(func=run)


def _change(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2g}"


def _status(agree: bool | None) -> str:
    return {True: "agree", False: "DIFFER", None: "-"}[agree]


def format_audit(result: Any) -> str:
    """The plain-text report of an ``Audit`` (the command's output without ``--json``)."""
    comparison = result.comparison
    runtimes = [r.runtime for r in comparison.readings]
    head = [
        "field",
        *runtimes,
        "status",
        "layers",
        *(f"max |dscore| @{n}" for n in comparison.lengths),
    ]
    rows = [
        [
            row.field,
            *(row.values.get(name, "") for name in runtimes),
            _status(row.agree),
            row.layers,
            *(_change(row.score_change[n]) if row.score_change else "" for n in comparison.lengths),
        ]
        for row in comparison.rows
    ]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    ]
    if result.gguf_fields:
        lines += [
            "",
            "GGUF fields that differ from llama.cpp's converter (field: converter -> GGUF):",
        ]
        lines += [f"  {k}: {_short(a)} -> {_short(b)}" for k, a, b in result.gguf_fields]
    lines += ["", *(f"note: {n}" for n in result.notes)] if result.notes else []
    lines += ["", "all runtimes agree" if result.agree else "runtimes DIFFER"]
    return "\n".join(lines)


def _short(value: Any) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, list) and len(value) > 6:
        return f"[{len(value)} values: {value[0]:.6g} .. {value[-1]:.6g}]"
    return str(value)


def run(args: argparse.Namespace) -> int:
    from posenc.audit.checkpoint import audit

    result = audit(args.path, gguf=args.gguf, lengths=args.lengths, vllm=not args.no_vllm)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(format_audit(result))
    return 0 if result.agree else 1
