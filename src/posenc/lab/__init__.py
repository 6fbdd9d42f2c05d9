"""The lab: train tiny causal transformers per positional encoding on short windows and
evaluate them on longer ones ("train short, test long", Press et al. 2022, section 4).

``posenc lab`` on the command line; from Python::

    from posenc.lab import LabConfig, run_lab
    results = run_lab(LabConfig(encodings=("rope", "alibi"), steps=200), out=Path("runs/x"))

Modules: ``config`` (the sweep), ``corpus`` (byte text, no download), ``tasks`` (copy,
reverse, recall), ``model`` (``TinyLM``), ``train``, ``evaluate``, ``variants`` (rotary
scalings, interpolated tables), ``distributed`` (DDP), ``results`` (output folder),
``report`` (table and plot), ``runner`` (the sweep).

The names below are imported on first use (PEP 562), so that the command line's parser,
which needs only ``posenc.lab.config``, does not load the training loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["Corpus", "LabConfig", "Task", "TinyLM", "load_corpus", "run_lab"]

_HOMES = {
    "Corpus": "posenc.lab.corpus",
    "LabConfig": "posenc.lab.config",
    "Task": "posenc.lab.tasks",
    "TinyLM": "posenc.lab.model",
    "load_corpus": "posenc.lab.corpus",
    "run_lab": "posenc.lab.runner",
}

if TYPE_CHECKING:
    from posenc.lab.config import LabConfig
    from posenc.lab.corpus import Corpus, load_corpus
    from posenc.lab.model import TinyLM
    from posenc.lab.runner import run_lab
    from posenc.lab.tasks import Task


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module 'posenc.lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
