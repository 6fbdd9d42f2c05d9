"""Worker run inside vLLM's own environment: vLLM's rotary modules read as ``Reading`` dicts.

Run as ``python path/to/_vllm_worker`` (this folder) with a JSON request on stdin; writes one
JSON list of ``posenc.audit.reading.Reading`` dicts on stdout, on the line starting with
``MARKER``. It imports torch, vLLM and its two sibling modules only (Python puts this folder
first on ``sys.path``; nothing of posenc), so it runs where vLLM is and posenc is not. Jobs:

* ``{"config": {...}, "max_model_len": N}``: a ``config.json`` served with ``--max-model-len
  N`` (default: the context); ``vllm_build`` builds vLLM's model class for it.
* ``{"get_rope": {...}, "source": "models/x.py"}``: ``get_rope`` called with the keyword
  arguments that model file passes (a part not built as a decoder here, such as a vision
  tower), inside ``set_current_vllm_config(VllmConfig())``; with ``"rope_class"``, that
  rotary class built with them (a model file that builds its class itself); with
  ``"fope_coefficients": "identity"``, FoPE's learned coefficients set to the identity.

Each rotary module is probed (``vllm_probe``), never reimplemented. Where vLLM does not build
or run a job, its reading has no layers and the note gives vLLM's error.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import traceback
from typing import Any

import torch
from vllm_build import model_layers
from vllm_probe import probe, unrotated

MARKER = "posenc-vllm-readings: "  # starts the result line (vLLM logs to stdout too)


def _reading(job: dict[str, Any], positions: list[int], context: int) -> dict[str, Any]:
    import vllm
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers import rotary_embedding
    from vllm.model_executor.layers.rotary_embedding import get_rope

    rotary_embedding._ROPE_DICT.clear()  # get_rope's cache outlives a job; a server's does not
    fields: dict[str, Any] = {"vllm.version": vllm.__version__}
    notes: list[str] = []
    by_layer: dict[str, list[int]] = {}  # a probe's note and the layers it holds for
    layers = []
    if "config" in job:
        max_model_len = int(job.get("max_model_len", context))
        built, arch = model_layers(job["config"], max_model_len)
        fields["vllm.architecture"] = arch
        fields["vllm.max_model_len"] = max_model_len
    else:
        kwargs = dict(job["get_rope"])
        kwargs["dtype"] = getattr(torch, kwargs.get("dtype", "float32"))
        with set_current_vllm_config(VllmConfig()):
            if "rope_class" in job:  # a model file that constructs the class itself
                module, cls = job["rope_class"].rsplit(".", 1)
                package = rotary_embedding.__name__ + "."
                rope = getattr(importlib.import_module(package + module), cls)(**kwargs)
                built = [(rope, None)]
            else:
                built = [(get_rope(**kwargs), None)]
        if job.get("fope_coefficients") == "identity":  # FoPE's coefficients are weights
            for coef in (built[0][0].cos_coef, built[0][0].sin_coef):
                coef.data.copy_(torch.eye(coef.shape[-1]).expand_as(coef))
            notes.append("FoPE's cos_coef / sin_coef are checkpoint weights: identity here")
        fields["vllm.get_rope"] = {k: str(v) for k, v in kwargs.items()}
        fields["vllm.source"] = job.get("source")
    head_size = next((r.head_size for r, _ in built if r is not None), 0)
    for i, (rope, attn) in enumerate(built):
        if rope is None:  # a NoPE layer: the head size of the rotating ones
            layer = unrotated(int(head_size), len(positions))
        else:
            layer, layer_notes = probe(rope, positions)
            for text in layer_notes:
                by_layer.setdefault(text, []).append(i)
            fields.setdefault("vllm.rotary_class", type(rope).__name__)
        if attn:
            scale = attn.get("softmax_scale")
            if scale is not None and not math.isclose(scale, layer["head_dim"] ** -0.5):
                layer["softmax_scale"] = scale
            layer["sliding_window"] = attn.get("sliding_window")
        layers.append(layer)
    notes += [f"{_layers(ids, len(built))}: {text}" for text, ids in by_layer.items()]
    note = "; ".join(notes) or None
    return dict(
        runtime="vllm",
        positions=positions,
        context=context,
        layers=layers,
        fields=fields,
        note=note,
    )


def _layers(ids: list[int], count: int) -> str:
    """``layers 0-31`` when a note holds for every layer, else the layers named."""
    if len(ids) == count > 1:
        return f"layers 0-{count - 1}"
    return ("layer " if len(ids) == 1 else "layers ") + ", ".join(map(str, ids))


def _failed(positions: list[int], context: int, err: BaseException) -> dict[str, Any]:
    first = (str(err).strip().splitlines() or [""])[0][:300]
    return dict(
        runtime="vllm",
        positions=positions,
        context=context,
        layers=[],
        fields={},
        note=f"vLLM did not build or run it: {type(err).__name__}: {first}",
    )


def main() -> int:
    # the audit reads past a checkpoint's trained length, which vLLM refuses by default
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    request = json.load(sys.stdin)
    positions = [int(p) for p in request["positions"]]
    context = int(request["context"])
    out = []
    for job in request["jobs"]:
        try:
            out.append(_reading(job, positions, context))
        except Exception as err:  # vLLM's own failure is the finding, stated in the note
            traceback.print_exc()
            out.append(_failed(positions, context, err))
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
