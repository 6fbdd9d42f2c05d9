"""``run_extend``: every setting at every length on a local checkpoint, resumable.

Layout of ``--out`` (the lab's, ``posenc.lab.results``: atomic writes, identity check)::

    config.json            the run's identity (hashes of the checkpoint's config, weights
                           and tokenizer; every setting; the corpus)
    cells/<setting>-<T>.json   one finished (setting, length): window NLLs, passkey trials
    results.json, report.md, extend.png

Every input is checked before anything is written (a folder without ``config.json``,
bad shape fields, unloadable weights or tokenizer, an unsupported family, a scaling the
family cannot take: each setting is patched into the loaded model and run on a few
tokens first, a length beyond the held-out text or beyond memory), so a bad call leaves
no file. The run works in ``<out>.partial`` and renames it to ``--out`` when complete
(``posenc.extend.files``): an interrupted (Ctrl-C) or failed run leaves only that folder,
with its finished cells and a ``results.json`` whose status says so, and the next run
with the same options resumes from it; a changed checkpoint is refused there by name.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from posenc.extend import report
from posenc.extend.checkpoint import (
    available_memory,
    check_settings,
    checkpoint_config,
    load_checkpoint,
    needed_memory,
)
from posenc.extend.config import ExtendConfig, Setting, config_hash
from posenc.extend.evaluate import passkey, passkey_prompt, window_nll
from posenc.extend.files import checkpoint_hashes, finish, prepare
from posenc.hf.patch import patch, unpatch
from posenc.lab.corpus import load_corpus
from posenc.lab.results import environment, write_json, write_text

__all__ = ["run_extend"]

_GIB = 1 << 30


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, got {name!r}")
    return torch.device(name)


def _check_memory(raw: dict, config: ExtendConfig, device: torch.device) -> None:
    folder = Path(config.model_dir)
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    weights += sum(p.stat().st_size for p in folder.glob("*.bin"))
    free = available_memory(device)
    for n in config.eval_lens:
        need = weights + needed_memory(raw, n, config.chunk, config.dtype)
        if need > free:
            raise ValueError(
                f"evaluation length {n} needs about {need / _GIB:.1f} GiB (weights, KV cache, "
                f"one chunk of {config.chunk}), but {free / _GIB:.1f} GiB is free on "
                f"{device.type}; use shorter --eval-lens or a smaller --chunk"
            )


def _text_tokens(corpus, tokenizer) -> torch.Tensor:
    text = bytes(corpus.heldout.tolist()).decode("utf-8", errors="replace")
    return torch.tensor(tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.long)


def _windows(tokens: torch.Tensor, length: int, count: int) -> list[torch.Tensor]:
    """Up to ``count`` non-overlapping windows of ``length`` tokens, spread evenly."""
    fit = min(count, tokens.numel() // length)
    if fit == 0:
        raise ValueError(
            f"the held-out text has {tokens.numel()} tokens, fewer than evaluation length "
            f"{length}; use a larger --corpus or shorter --eval-lens"
        )
    spacing = (tokens.numel() - length) // max(fit - 1, 1)
    return [tokens[i * spacing : i * spacing + length] for i in range(fit)]


def _cell_path(out: Path, label: str, length: int) -> Path:
    return out / "cells" / f"{label.replace(' ', '-')}-{length}.json"


def _finished(out: Path, identity: str) -> dict[tuple[str, int], dict]:
    done = {}
    for path in sorted((out / "cells").glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue  # written atomically: only a foreign file is unreadable; redo the cell
        if isinstance(record, dict) and record.get("identity") == identity:
            done[record["setting"], record["length"]] = record
    return done


def _passkey_fits(tokenizer, length: int) -> bool:
    try:
        passkey_prompt(tokenizer, length, 0.5, "12345")
    except ValueError:
        return False
    return True


def _measure(model, tokenizer, windows: list[torch.Tensor], depths, config) -> dict:
    """One cell: the mean NLL of each window ``[T]`` and a passkey trial per depth."""
    start = time.perf_counter()
    length = windows[0].numel()
    nll = [window_nll(model, w, chunk=config.chunk) for w in windows]
    trials = [
        passkey(model, tokenizer, length, d, seed=config.seed, chunk=config.chunk) for d in depths
    ]
    return {
        "length": length,
        "window_nll": [float(x.mean()) for x in nll],
        "mean_nll": float(torch.cat(nll).mean()),
        "passkey": trials,
        "seconds": time.perf_counter() - start,
    }


def _results(config, model_info, data, settings, cells, status, identity, notes) -> dict:
    table: dict[str, dict[str, dict]] = {}
    for (label, length), record in cells.items():
        table.setdefault(label, {})[str(length)] = record
        if not math.isfinite(record["mean_nll"]):
            notes = [*notes, f"{label} @ {length}: non-finite loss"]
    return {
        "status": status,
        "identity": identity,
        "config": config.to_dict(),
        "model": model_info,
        "data": data,
        "environment": environment(
            threads=torch.get_num_threads(), world=1, device=torch.device(config.device)
        ),
        "settings": [s.label for s in settings],
        "scalings": {s.label: s.scaling for s in settings},
        "cells": table,
        "notes": notes,
    }


def _publish(out: Path, results: dict) -> None:
    write_json(out / "results.json", results)
    report.draw(results, out)
    write_text(out / "report.md", report.markdown(results))


def _dry_run(model, settings: list[Setting]) -> None:
    """Patch each setting into ``model`` and run a forward on a few tokens, so a family
    that ``posenc.hf.patch`` accepts on paper but cannot run is refused before any cell.

    Raises:
        ValueError: the first setting that fails, named, with the reason in one line.
    """
    device = next(model.parameters()).device
    ids = torch.zeros(1, 4, dtype=torch.long, device=device)
    for setting in settings:
        try:
            if setting.scaling is not None:
                patch(model, scaling=setting.scaling, length_policy="monotone")
            try:
                with torch.no_grad():
                    model(ids)
            finally:
                if setting.scaling is not None:
                    unpatch(model)
        except Exception as exc:  # any failure here means: not supported, say which
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise ValueError(
                f"setting {setting.label!r}: the patched model does not run ({reason})"
            ) from None


def run_extend(
    config: ExtendConfig, out: Path, *, console: Console | None = None, progress: bool = True
) -> dict:
    """Measure perplexity and passkey retrieval per setting and length; returns the results.

    Raises:
        ValueError: see the module docstring (nothing is written then).
        KeyboardInterrupt: after writing the results of the finished cells.
    """
    console = console or Console(stderr=True)
    raw, trained = checkpoint_config(config.model_dir)
    settings = config.settings(trained)
    model_type = check_settings(raw, settings)
    device = _device(config.device)
    _check_memory(raw, config, device)
    corpus = load_corpus(config.corpus)
    hashes = checkpoint_hashes(config.model_dir)
    model, tokenizer = load_checkpoint(config.model_dir, device=device, dtype=config.dtype)
    _dry_run(model, settings)
    tokens = _text_tokens(corpus, tokenizer)
    windows = {n: _windows(tokens, n, config.windows) for n in config.eval_lens}
    keyed = {n: _passkey_fits(tokenizer, n) for n in config.eval_lens}
    identity_fields = {"model_config_sha256": config_hash(raw), **hashes, **config.to_dict()}
    del identity_fields["model_dir"]  # the checkpoint is named by its config, not its path
    identity_fields["corpus_sha256"] = corpus.sha256
    identity_fields = json.loads(json.dumps(identity_fields))  # as config.json holds it
    identity = config_hash(identity_fields)
    notes = [f"passkey: {n} tokens are too few for the prompt" for n, ok in keyed.items() if not ok]
    model_info = {
        "name": Path(config.model_dir).resolve().name,
        "model_type": model_type,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trained_length": trained,
        "config_sha256": config_hash(raw),
        **hashes,
        "attention": getattr(model.config, "_attn_implementation", None),
    }
    data = {"source": corpus.source, "sha256": corpus.sha256, "tokens": int(tokens.numel())}
    out = Path(os.path.abspath(out))  # "." and "dir/" have a name for <out>.partial
    work = prepare(out, identity_fields)
    cells = _finished(work, identity)
    todo = [(s, n) for s in settings for n in config.eval_lens if (s.label, n) not in cells]
    if cells:
        console.print(f"resuming: {len(cells)} cell(s) already finished in {work}")
    status = "failed"
    try:
        with Progress(
            TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console, disable=not progress,
        ) as bar:  # fmt: skip
            task = bar.add_task("posenc extend", total=len(todo))
            for setting in settings:
                mine = [n for s, n in todo if s is setting]
                if not mine:
                    continue
                if setting.scaling is not None:
                    patch(model, scaling=setting.scaling, length_policy="monotone")
                try:
                    for n in mine:
                        bar.update(task, description=f"{setting.label} @ {n}")
                        depths = config.passkey_depths if keyed[n] else ()
                        record = _measure(model, tokenizer, windows[n], depths, config)
                        record = {"identity": identity, "setting": setting.label, **record}
                        write_json(_cell_path(work, setting.label, n), record)
                        cells[setting.label, n] = record
                        bar.advance(task)
                finally:
                    if setting.scaling is not None:
                        unpatch(model)
        status = "complete"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        results = _results(config, model_info, data, settings, cells, status, identity, notes)
        if status == "complete":
            _publish(work, results)
            finish(work, out)
        else:  # only the resumable folder, marked; --out stays untouched
            write_json(work / "results.json", results)
            console.print(
                f"posenc extend: {status}; {len(cells)} finished cell(s) kept in {work}, "
                "which a rerun with the same options resumes"
            )
    report.print_table(results, console)
    return results
