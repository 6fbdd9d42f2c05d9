"""The lab: train tiny causal transformers per positional encoding on short windows and
evaluate them on longer ones ("train short, test long", Press et al. 2022, section 4).

``posenc lab`` on the command line; from Python::

    from posenc.lab import LabConfig, run_lab
    results = run_lab(LabConfig(encodings=("rope", "alibi"), steps=200), out=Path("runs/x"))

Modules: ``config`` (the sweep), ``corpus`` (byte text, no download), ``tasks`` (copy,
reverse, recall), ``model`` (``TinyLM``), ``train``, ``evaluate``, ``variants`` (rotary
scalings, interpolated tables), ``distributed`` (DDP), ``results`` (output folder),
``report`` (table and plot), ``runner`` (the sweep).
"""

from posenc.lab.config import LabConfig
from posenc.lab.corpus import Corpus, load_corpus
from posenc.lab.model import TinyLM
from posenc.lab.runner import run_lab
from posenc.lab.tasks import Task

__all__ = ["Corpus", "LabConfig", "Task", "TinyLM", "load_corpus", "run_lab"]
