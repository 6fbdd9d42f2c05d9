"""The lab's output folder: atomic writes, finished runs, resume checks, provenance.

Layout of ``--out``::

    config.json         the sweep's identity (what a rerun in this folder must match)
    runs/<name>.json    one finished run per encoding, written as soon as it completes
    results.json        every run merged, with configuration, environment and corpus
    report.md, *.png    the table and the plot (``posenc.lab.report``)

Every file is written to a temporary file in the same folder and moved into place with
``os.replace``, so an interrupted sweep never leaves a half-written file behind.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import posenc

__all__ = [
    "FINISHED",
    "check_identity",
    "environment",
    "finished_runs",
    "write_json",
    "write_text",
    "write_weights",
]

#: Statuses of runs a rerun skips (a NaN run fails again with the same seed).
FINISHED = ("ok", "failed")
_UMASK = os.umask(0)
os.umask(_UMASK)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file + ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_weights(path: Path, model: torch.nn.Module) -> None:
    """Save ``model.state_dict()`` to ``path`` atomically (load: ``weights_only=True``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(model.state_dict(), tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: object) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def check_identity(out: Path, identity: dict[str, object]) -> None:
    """Record ``identity`` in ``out/config.json``, or check it matches the one there.

    Raises:
        ValueError: ``out`` holds a sweep with another configuration (the message names
            the differing fields), or ``out`` is a file.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a folder")
    path = out / "config.json"
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        differ = sorted(
            k for k in set(previous) | set(identity) if previous.get(k) != identity.get(k)
        )
        if differ:
            raise ValueError(
                f"--out {str(out)!r} holds a sweep with a different configuration "
                f"(differs in {', '.join(differ)}); use another --out or the same options"
            )
        return
    write_json(path, identity)


def finished_runs(out: Path, identity_hash: str) -> dict[str, dict]:
    """Runs in ``out/runs`` that finished under the configuration ``identity_hash``."""
    runs = {}
    for path in sorted((out / "runs").glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if record.get("identity") == identity_hash and record.get("status") in FINISHED:
            runs[record["encoding"]] = record
    return runs


def environment(*, threads: int, world: int, device: torch.device) -> dict[str, object]:
    """Library versions and the compute setup the numbers came from."""
    return {
        "python": sys.version.split()[0],
        "posenc": posenc.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "processes": world,
        "device": str(device),
    }
