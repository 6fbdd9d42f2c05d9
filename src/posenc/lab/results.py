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
A finished run counts only when its record has the right shape (``posenc.lab.records``)
and its weights load. Every file a sweep reads back (``config.json``, run records,
weights, a run's round snapshot, corpus files) is read by ``read_regular``, so a FIFO or
a device put in the folder is named, never opened for a blocking read.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import stat
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import posenc
from posenc.lab.records import check_header, check_run

__all__ = [
    "FINISHED",
    "check_identity",
    "environment",
    "finished_runs",
    "load_tensors",
    "read_regular",
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


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``, which must be a regular file (a symlink to one will do).

    A FIFO, a device or a folder is never read: the type is checked with ``stat`` before
    the file is opened, and again on the descriptor, which is opened non-blocking, so a
    FIFO put in its place in between cannot make the open wait for a writer forever.

    Raises:
        ValueError: ``path`` is not a regular file (the message names it).
        OSError: it cannot be read (missing, denied).
    """
    refused = ValueError(f"{str(path)!r} is not a regular file; move it away")
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise refused
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise refused
        return handle.read()


def _read_json(path: Path) -> object:
    try:
        return json.loads(read_regular(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{str(path)!r} is not valid JSON ({exc}); move it away") from None


#: An indented JSON array of numbers only: its brackets open and close lines, and a raw
#: newline never occurs inside a JSON string, so no string's text can match.
_NUMBERS = re.compile(r"\[\n\s*([-+0-9.eE,\s]+?)\n\s*\]")


def write_json(path: Path, obj: object) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically, each array of numbers on one
    line (a run's per-segment losses would otherwise take a line per number, doubling a
    record's size)."""
    text = json.dumps(obj, indent=2, sort_keys=False)
    text = _NUMBERS.sub(lambda m: "[" + ", ".join(v.strip() for v in m[1].split(",")) + "]", text)
    write_text(path, text + "\n")


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


def finished_runs(out: Path, identity_hash: str, *, metric: str) -> dict[tuple[str, int], dict]:
    """Runs in ``out/runs`` that finished under ``identity_hash``, by (encoding, seed).

    A run whose saved weights are missing or do not load (a truncated file) is left out,
    so the sweep does it again. ``metric``: the sweep's (``"ppl"`` or ``"accuracy"``),
    which every result of a finished record must hold (``posenc.lab.records``).

    Raises:
        ValueError: a run file is not JSON or not a run record, a finished record is
            damaged (the message names the file and the field), or a file the sweep may
            read back (``*.json``, ``*.pt``, a round snapshot) is not a regular file.
    """
    for path in sorted((out / "runs").glob("*.pt")):  # weights and round snapshots
        if path.exists() and not stat.S_ISREG(path.stat().st_mode):
            raise ValueError(f"{str(path)!r} is not a regular file; move it away")
    runs = {}
    for path in sorted((out / "runs").glob("*.json")):
        record = _read_json(path)
        check_header(record, path)
        if record.get("identity") != identity_hash or record["status"] not in FINISHED:
            continue
        check_run(record, path, metric)
        if record.get("weights") and not _weights_load(out, path, record):
            continue
        runs[record["encoding"], record["seed"]] = record
    return runs


def _weights_load(out: Path, record_path: Path, record: dict) -> bool:
    """Whether the run's weights, which must lie inside ``out``, load.

    Raises:
        ValueError: ``weights`` is not a relative path inside ``out``, or names something
            other than a regular file (a FIFO, a device, a folder).
    """
    weights = record["weights"]
    inside = out.resolve()
    path = (out / weights).resolve()
    if path != inside and inside not in path.parents:
        raise ValueError(
            f"{str(record_path)!r}: weights must be a path inside {str(out)!r}, got {weights!r}"
        )
    try:
        data = read_regular(path)
    except ValueError:
        raise ValueError(
            f"{str(record_path)!r}: weights {weights!r} is not a regular file"
        ) from None
    except OSError:
        return False
    return load_tensors(data) is not None


def load_tensors(data: bytes) -> object | None:
    """``torch.load(weights_only=True)`` of ``data``; ``None`` when it does not load.

    A truncated or garbled file fails in many ways inside the unpickler (``EOFError``,
    ``IndexError`` from its stack, ``UnpicklingError``, ...): each means the same here.
    """
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception:
        return None


def run_environment(context, dtype: torch.dtype) -> dict[str, object]:
    """What one run's numbers depend on besides its configuration: threads, device,
    the resolved precision (``posenc.lab.precision``), process count, context-parallel size
    and library versions."""
    return {
        "torch_threads": torch.get_num_threads(),
        "device": str(context.device),
        "precision": str(dtype).removeprefix("torch."),
        "processes": context.world,
        "context_parallel": context.cp,
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
