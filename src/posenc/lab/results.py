"""The lab's output folder: atomic writes, finished runs, resume checks, provenance.

Layout of ``--out``::

    config.json           the sweep's identity (what a rerun in this folder must match)
    sweep.toml            the sweep file, when the sweep came from ``--config``
    runs/<enc>-s<seed>.json, .pt   one finished run (and its weights) per encoding and seed
    results.json          every run merged, with configuration, environment and corpus
    report.md, *.png      the tables and figures (``posenc.lab.report``, ``.plots``)

Every file is written to a temporary file in the same folder and moved into place with
``os.replace``, so an interrupted sweep never leaves a half-written file behind; the
temporary files an interrupted writer left (``.*.tmp``) are removed when a sweep resumes.
A finished run counts only when its record has the right shape and its weights load.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import platform
import stat
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
    "remove_stale",
    "run_environment",
    "write_json",
    "write_text",
    "write_weights",
]

#: Statuses of runs a rerun skips (a NaN run fails again with the same seed).
FINISHED = ("ok", "failed")
_UMASK = os.umask(0)
os.umask(_UMASK)


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + ``os.replace``).

    Raises:
        OSError: the folder cannot be created or written (full disk, read-only, denied);
            its ``filename`` is ``path`` when the system named none (a failed write).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the usual mode
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, UTF-8."""
    write_bytes(path, text.encode("utf-8"))


def write_weights(path: Path, model: torch.nn.Module) -> None:
    """Save ``model.state_dict()`` to ``path`` atomically (load: ``weights_only=True``);
    serialised in memory first, so a file-system error is an ``OSError`` naming it."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    write_bytes(path, buffer.getvalue())


def remove_stale(out: Path) -> list[Path]:
    """Delete the temporary files an interrupted writer left in ``out`` and ``out/runs``."""
    stale = [p for folder in (out, out / "runs") for p in folder.glob(".*.tmp*") if p.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def _regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (checked with ``stat``, so a FIFO is never
    opened: opening one would wait for a writer forever)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _read_json(path: Path) -> object:
    if not _regular(path):
        raise ValueError(f"{str(path)!r} is not a regular file; move it away")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{str(path)!r} is not valid JSON ({exc}); move it away") from None


def write_json(path: Path, obj: object) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def check_identity(out: Path, identity: dict[str, object]) -> None:
    """Record ``identity`` in ``out/config.json``, or check it matches the one there.

    A folder that holds files but no ``config.json`` is someone else's: it is refused,
    never written into (nothing of it is overwritten or deleted).

    Raises:
        ValueError: ``out`` holds a run with another configuration (the message names
            the differing fields), holds files but no run record, or is a file.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a folder")
    path = out / "config.json"
    if not path.exists() and out.is_dir() and any(out.iterdir()):
        raise ValueError(
            f"--out {str(out)!r} holds files but no posenc run record (config.json); "
            "nothing in it is touched: use a new or empty folder"
        )
    if path.exists():
        previous = _read_json(path)
        if not isinstance(previous, dict):
            raise ValueError(
                f"{str(path)!r} is not a lab configuration (a JSON object); move it away"
            )
        differ = sorted(
            k for k in set(previous) | set(identity) if previous.get(k) != identity.get(k)
        )
        if differ:
            raise ValueError(
                f"--out {str(out)!r} holds a run with a different configuration "
                f"(differs in {', '.join(differ)}); use another --out or the same options"
            )
        return
    write_json(path, identity)


_RUN_FIELDS = {"encoding": str, "seed": int, "status": str, "rows": list}


def finished_runs(out: Path, identity_hash: str) -> dict[tuple[str, int], dict]:
    """Runs in ``out/runs`` that finished under ``identity_hash``, by (encoding, seed).

    A run whose saved weights are missing or do not load (a truncated file) is left out,
    so the sweep does it again.

    Raises:
        ValueError: a run file is not JSON or not a run record (the message names it).
    """
    runs = {}
    for path in sorted((out / "runs").glob("*.json")):
        record = _read_json(path)
        wrong = not isinstance(record, dict) or any(
            not isinstance(record.get(key), kind) for key, kind in _RUN_FIELDS.items()
        )
        if wrong:
            fields = ", ".join(f"{k} ({t.__name__})" for k, t in _RUN_FIELDS.items())
            raise ValueError(
                f"{str(path)!r} is not a lab run record (needs {fields}); move it away"
            )
        if record.get("identity") != identity_hash or record["status"] not in FINISHED:
            continue
        if record.get("weights") and not _weights_load(_weights_path(out, path, record)):
            continue
        runs[record["encoding"], record["seed"]] = record
    return runs


def _weights_path(out: Path, record_path: Path, record: dict) -> Path:
    """The run's weights file, which must lie inside ``out``.

    Raises:
        ValueError: ``weights`` is not a relative path inside ``out``, or names something
            other than a regular file (a FIFO, a device, a folder).
    """
    weights = record["weights"]
    inside = out.resolve()
    path = (out / weights).resolve() if isinstance(weights, str) else None
    if path is None or (path != inside and inside not in path.parents):
        raise ValueError(
            f"{str(record_path)!r}: weights must be a path inside {str(out)!r}, got {weights!r}"
        )
    if path.exists() and not _regular(path):
        raise ValueError(f"{str(record_path)!r}: weights {weights!r} is not a regular file")
    return path


def _weights_load(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
        return False
    return True


def run_environment(context, dtype: torch.dtype) -> dict[str, object]:
    """What one run's numbers depend on besides its configuration: threads, device,
    the resolved precision (``posenc.lab.precision``), process count and library versions."""
    return {
        "torch_threads": torch.get_num_threads(),
        "device": str(context.device),
        "precision": str(dtype).removeprefix("torch."),
        "processes": context.world,
        "torch": torch.__version__,
        "posenc": posenc.__version__,
    }


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
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
