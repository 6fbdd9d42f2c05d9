"""``save_pretrained`` of a model patched by ``posenc.hf.patch``: the patch's rope config.

``patch(model, scaling=...)`` leaves the model's config untouched, so transformers'
``save_pretrained`` would write the original rope parameters and a reload would run
another model than the patched one. While a model is patched, its ``save_pretrained`` is
this module's ``PatchedSave``: transformers' own, then ``config.json`` rewritten (atomically)
with the rope parameters the patch runs (``rope_parameters``, per layer type where the
config has types, and ``original_max_position_embeddings`` where the patch set it), so
that ``from_pretrained`` without posenc gives the patched outputs. What a config cannot
say is refused by name before anything is written: a rope type transformers does not
implement (posenc's ``ntk``), and the monotone length policy with a length-dependent
scaling (a config holds no policy; transformers would follow its own).
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["PatchedSave"]

_ORIGINAL = "original_max_position_embeddings"


class PatchedSave:
    """``model.save_pretrained`` while ``model`` is patched (module docstring).

    Args:
        model: the patched transformers model.
        config: the config dict the patch runs (``patch_encodings``' third value).
        scaled: whether ``patch`` was given a scaling (else the model's config is written
            as it is).
        monotone: the patch follows the monotone length policy with a length-dependent
            scaling, which a saved config cannot reproduce.
    """

    def __init__(
        self, model: nn.Module, config: Mapping[str, Any], *, scaled: bool, monotone: bool
    ) -> None:
        self.model, self.scaled, self.monotone = model, scaled, monotone
        self.rope = {
            k: copy.deepcopy(config[k]) for k in ("rope_parameters", _ORIGINAL) if k in config
        }

    def __deepcopy__(self, memo: dict) -> PatchedSave:
        copied = copy.copy(self)
        copied.model = copy.deepcopy(self.model, memo)
        return copied

    def __call__(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        """transformers' ``save_pretrained(save_directory, ...)``, then the patch's rope
        parameters in ``config.json``.

        Raises:
            ValueError: the monotone policy with a length-dependent scaling; a rope type
                transformers does not implement; ``push_to_hub=True`` (the upload would
                carry the original config: save, then push the folder).
        """
        if self.monotone:
            raise ValueError(
                "the model is patched with length_policy='monotone' and a length-dependent "
                "scaling, which a saved config cannot reproduce (transformers follows its own "
                "policy); unpatch it, or patch with length_policy='transformers', to save"
            )
        if kwargs.get("push_to_hub"):
            raise ValueError(
                "save_pretrained(push_to_hub=True) of a patched model would upload the "
                "original rope config; save it to a folder, then push that folder"
            )
        if self.scaled:
            _check_representable(self.rope.get("rope_parameters"))
        result = type(self.model).save_pretrained(self.model, save_directory, *args, **kwargs)
        path = Path(save_directory) / "config.json"
        if self.scaled and kwargs.get("is_main_process", True) and path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            data.pop("rope_scaling", None)
            for key, value in self.rope.items():
                old = data.get(key)
                nested = isinstance(old, dict) and all(isinstance(v, dict) for v in value.values())
                data[key] = {**old, **value} if nested and key == "rope_parameters" else value
            _write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
        return result


def _check_representable(params: object) -> None:
    """Raise ``ValueError`` for a rope type that transformers does not implement."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if not isinstance(params, Mapping):
        return
    per_type = all(isinstance(v, Mapping) for v in params.values()) and bool(params)
    for entry in params.values() if per_type else [params]:
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(
                f"the patch's rope_type {rope_type!r} has no transformers implementation, so "
                "a saved config cannot reproduce it; transformers implements "
                f"{sorted(ROPE_INIT_FUNCTIONS)}"
            )


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777)  # the mode transformers' file had
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
