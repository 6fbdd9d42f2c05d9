"""Audit one checkpoint: find its parts, read them with every runtime, compare.

Shapes: ``P`` audited positions.

A checkpoint is a folder with a ``config.json`` (and a ``.gguf`` beside it, or one given),
or a GGUF file alone. The readings:

* transformers (``posenc.audit.hfread``) on the ``config.json``; for a GGUF alone, on the
  config transformers' own GGUF loader makes of it (``load_gguf_checkpoint``), which is how
  ``from_pretrained(..., gguf_file=...)`` runs it;
* posenc's plan (``posenc.hf.layer_plan``) on the same config;
* the paper's formulas (``posenc.audit.paper``, float64) on the same config, so that where
  runtimes disagree the table shows which one departs from the paper;
* llama.cpp on the GGUF (``posenc.audit.ggufread``), and the GGUF's rotary fields against
  those llama.cpp's converter writes for the ``config.json`` (``posenc.audit.convert``);
* vLLM (``posenc.audit.vllm``) on the ``config.json``, in its own environment; where that
  is absent the reading says so and counts neither way.

Positions: every offset below 64, then 200 geometric steps to the longest audited length
(default: the original context, the trained context and twice it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posenc.audit.compare import Comparison, compare
from posenc.audit.reading import Reading

__all__ = ["Audit", "audit", "audit_positions"]


@dataclass(frozen=True)
class Audit:
    """The comparison, the GGUF fields that differ from the converter's, the inputs."""

    comparison: Comparison
    gguf_fields: list[tuple[str, Any, Any]] = field(default_factory=list)
    config_path: Path | None = None
    gguf_path: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        """Whether every runtime that ran agrees and the GGUF holds the converter's fields."""
        return self.comparison.agree and not self.gguf_fields

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "config": None if self.config_path is None else str(self.config_path),
            "gguf": None if self.gguf_path is None else str(self.gguf_path),
            **self.comparison.to_dict(),
            "agree": self.agree,
            "notes": self.notes,
            "gguf_fields": [
                {"field": k, "converter": _plain(a), "gguf": _plain(b)}
                for k, a, b in self.gguf_fields
            ],
        }


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def audit_positions(longest: int) -> np.ndarray:
    """``[P]`` offsets 0..63, then 200 geometric steps up to ``longest - 1``."""
    if longest < 2:
        raise ValueError(f"the longest audited length must be >= 2, got {longest}")
    grid = np.geomspace(64, max(longest - 1, 64), 200).astype(np.int64)
    return np.unique(np.concatenate([np.arange(min(64, longest)), grid, [longest - 1]]))


def _find(path: Path, gguf: Path | None) -> tuple[Path | None, Path | None]:
    if not path.exists():
        raise ValueError(f"no such file or folder: {path}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{path}: expected a checkpoint folder or a .gguf file")
        return None, path
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"{path} has no config.json")
    if gguf is None:
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise ValueError(f"{path} holds several GGUF files ({names}); pick one with --gguf")
        gguf = found[0] if found else None
    return config, gguf


def _load_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable config.json: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object")
    return config


def _gguf_config(path: Path) -> dict[str, Any]:
    """The config transformers' GGUF loader makes of ``path`` (its ``config`` part)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        loaded = load_gguf_checkpoint(str(path), return_tensors=False)
    except (ValueError, KeyError, RuntimeError) as err:
        raise ValueError(f"transformers' GGUF loader refuses {path}: {err}") from None
    return dict(loaded["config"])


def _lengths(config: dict[str, Any] | None, rope_fields: dict[str, Any]) -> list[int]:
    arch = rope_fields.get("general.architecture")
    trained = (config or {}).get("max_position_embeddings") or rope_fields.get(
        f"{arch}.context_length"
    )
    if not trained:
        raise ValueError("cannot tell the trained length: give --lengths")
    scaling = (config or {}).get("rope_parameters") or (config or {}).get("rope_scaling") or {}
    original = scaling.get("original_max_position_embeddings") or rope_fields.get(
        f"{arch}.rope.scaling.original_context_length"
    )
    return sorted({int(original or trained), int(trained), 2 * int(trained)})


def audit(
    path: str | Path,
    *,
    gguf: str | Path | None = None,
    lengths: Sequence[int] | None = None,
    vllm: bool = True,
) -> Audit:
    """Read the checkpoint at ``path`` with every runtime and compare (module docstring).

    Raises:
        ValueError: no config.json or GGUF there, an unreadable file, or a config or GGUF
            a runtime refuses (named).
    """
    from posenc.audit.ggufread import gguf_rope, read_gguf
    from posenc.audit.hfread import read_posenc, read_transformers
    from posenc.audit.paper import read_paper

    config_path, gguf_path = _find(Path(path), None if gguf is None else Path(gguf))
    config = None if config_path is None else _load_config(config_path)
    rope_fields = {} if gguf_path is None else gguf_rope(gguf_path)[1]
    if lengths is not None and (not lengths or min(lengths) < 2):
        raise ValueError(f"--lengths must be integers >= 2, got {list(lengths)}")
    lengths = sorted(set(lengths or _lengths(config, rope_fields)))
    context = lengths[-1]
    positions = audit_positions(context)
    hf_config = config if config is not None else _gguf_config(gguf_path)
    readings: list[Reading] = [read_transformers(hf_config, positions, context=context)]
    if config is None:
        readings[0] = _renamed(readings[0], "transformers (GGUF loader)")
    readings.append(read_posenc(hf_config, positions, context=context))
    readings.append(read_paper(hf_config, positions, context=context))
    if gguf_path is not None:
        readings.append(read_gguf(gguf_path, positions, context=context))
    if vllm and config is not None:
        readings.append(_vllm(config, positions, context))
    fields, notes = [], [f"{r.runtime}: {r.note}" for r in readings if r.note]
    if config is not None and gguf_path is not None:
        from posenc.audit.convert import ARCH, gguf_diff

        if config.get("model_type") in ARCH:
            fields = gguf_diff(config, rope_fields)
        else:
            notes.append(
                f"GGUF fields not checked: posenc follows llama.cpp's converter for "
                f"model_type {', '.join(sorted(ARCH))} only"
            )
    return Audit(compare(readings, lengths), fields, config_path, gguf_path, notes)


def _vllm(config: dict[str, Any], positions: np.ndarray, context: int) -> Reading:
    if not config.get("architectures"):
        return Reading(
            "vllm", positions, context, note="config.json names no architectures to build"
        )
    from posenc.audit.vllm import read_vllm

    return read_vllm(config, positions, context=context)


def _renamed(reading: Reading, runtime: str) -> Reading:
    return Reading(
        runtime, reading.positions, reading.context, reading.layers, reading.fields, reading.note
    )
