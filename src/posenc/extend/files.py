"""What names a checkpoint's bytes, and where ``posenc extend`` writes until a run is done.

A run's identity (``config.json`` of ``--out``) holds, besides the options and the
corpus, the sha256 of the checkpoint's ``config.json``, of its weight files and of its
tokenizer files (names, sizes and bytes), so a rerun into the same ``--out`` after the
weights or the tokenizer changed is refused by name (``weights_sha256``,
``tokenizer_sha256``) instead of reporting the old model's cells.

A new run works in ``<out>.partial`` beside ``--out`` and renames it to ``--out`` only
when every cell is finished and the report is written, so ``--out`` never holds a
half-written run. An interrupted or failed run leaves ``<out>.partial`` (its identity,
finished cells and a ``results.json`` whose ``status`` says what happened), which the
next run with the same options resumes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from pathlib import Path

from posenc.lab.results import check_identity, remove_stale

__all__ = ["PARTIAL", "checkpoint_hashes", "finish", "prepare"]

#: The suffix of the folder a run works in until it is complete.
PARTIAL = ".partial"
#: Files transformers may load weights from (shards and their indexes included).
WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.index.json")
#: Files a transformers tokenizer may be read from.
TOKENIZER = (
    "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
    "*.model", "*.tiktoken", "chat_template.*",
)  # fmt: skip
_BLOCK = 1 << 20


def _digest(files: list[Path]) -> str:
    """sha256 over each file's name, size and bytes, in name order."""
    hasher = hashlib.sha256()
    for path in files:
        hasher.update(f"{path.name}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as handle:
            while block := handle.read(_BLOCK):
                hasher.update(block)
    return hasher.hexdigest()


def checkpoint_hashes(model_dir: str | Path) -> dict[str, str]:
    """``{"weights_sha256": ..., "tokenizer_sha256": ...}`` of a checkpoint folder.

    Raises:
        ValueError: a weight or tokenizer file is not a regular file (a FIFO, a device, a
            folder: never opened), or cannot be read.
    """
    folder = Path(model_dir)
    groups: dict[str, list[Path]] = {"weights_sha256": [], "tokenizer_sha256": []}
    for path in sorted(folder.iterdir()):
        name = path.name
        key = next(
            (k for k, pats in (("weights_sha256", WEIGHTS), ("tokenizer_sha256", TOKENIZER))
             if any(fnmatch.fnmatch(name, p) for p in pats)),
            None,
        )  # fmt: skip
        if key is None:
            continue
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise ValueError(f"{str(path)!r}: cannot be read ({exc.strerror or exc})") from None
        if not stat.S_ISREG(mode):
            raise ValueError(f"{str(path)!r} is not a regular file; move it away")
        groups[key].append(path)
    try:
        return {key: _digest(files) for key, files in groups.items()}
    except OSError as exc:
        raise ValueError(f"{exc.filename!r}: cannot be read ({exc.strerror or exc})") from None


def prepare(out: Path, identity: dict[str, object]) -> Path:
    """The folder this run writes in: ``out`` itself when it holds a finished run with
    this identity, else ``<out>.partial`` (created, or resumed when its identity matches).

    Raises:
        ValueError: ``out`` or ``<out>.partial`` is a file, holds files but no run
            record, or holds a run with another identity (the differing fields named).
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        check_identity(out, identity)  # refuses a foreign folder or another run
        return out
    work = out.with_name(out.name + PARTIAL)
    check_identity(work, identity)
    remove_stale(work)
    for stale in (work / "cells").glob(".*.tmp*"):
        stale.unlink(missing_ok=True)
    return work


def finish(work: Path, out: Path) -> None:
    """Move a complete run from ``work`` to ``out`` (nothing to do when they are one)."""
    if work == out:
        return
    if out.is_dir():
        out.rmdir()  # empty (``prepare`` checked); rename will not replace a folder
    os.replace(work, out)
