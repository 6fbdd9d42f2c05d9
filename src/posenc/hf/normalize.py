"""A raw ``config.json`` read through its family's transformers config class.

A released ``config.json`` holds only what differs from its config class's defaults (what
``save_pretrained`` writes), and often the legacy form of the position fields: Gemma 3 27B's
file leaves ``rope_theta``, ``rope_local_base_freq`` and the sliding/full layer pattern to
``Gemma3TextConfig``; OLMo 3's gives one flat YaRN ``rope_scaling`` that the class applies to
the full-attention layers only. Reading such a dict as written gives another model than the
one transformers builds, so ``through_config_class`` builds the config class from it (when
transformers is installed and knows the ``model_type``) and returns the class's ``to_dict()``.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ReadConfig",
    "config_class",
    "through_config_class",
    "transformers_reads",
    "with_attribute_map",
]


class ReadConfig(dict):
    """A config dict already read as transformers reads it (not read again): what
    ``posenc.hf.config.as_config_dict`` returns, and what posenc derives from one (a
    scaling applied by ``posenc.hf.patch``, which the family's class may not list)."""


@functools.cache
def _mapping() -> Any:
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return None
    return CONFIG_MAPPING


def config_class(model_type: object) -> type | None:
    """transformers' config class of ``model_type``, or None (transformers missing, or it
    does not know the family)."""
    mapping = _mapping()
    if mapping is None or not isinstance(model_type, str) or model_type not in mapping:
        return None
    return mapping[model_type]


@functools.cache
def _family_source(model_type: str) -> str | None:
    cls = config_class(model_type)
    if cls is None:
        return None
    folder = Path(sys.modules[cls.__module__].__file__).parent
    files = sorted(folder.glob("modeling_*.py")) + sorted(folder.glob("configuration_*.py"))
    return "\n".join(f.read_text(encoding="utf-8") for f in files) if files else None


def transformers_reads(model_type: object, name: str) -> bool | None:
    """Whether the installed transformers' code of ``model_type`` (its modeling and
    configuration files) names the config field ``name``; None when unknown (transformers
    missing, or a family it does not know). A field it never names is ignored when it
    builds the model (Command R7B's ``position_embedding_type``), so posenc ignores it too."""
    source = _family_source(model_type) if isinstance(model_type, str) else None
    if source is None:
        return None
    return re.search(rf"\b{re.escape(name)}\b", source) is not None


def with_attribute_map(cfg: dict[str, Any], cls: type) -> ReadConfig:
    """``cfg`` with the class's standard names (``attribute_map``) beside the family's own,
    where the standard one is absent."""
    for standard, own in getattr(cls, "attribute_map", {}).items():
        if standard not in cfg and own in cfg:
            cfg[standard] = cfg[own]
    return ReadConfig(cfg)


@functools.lru_cache(maxsize=256)
def _normalized(text: str) -> str | None:
    raw = json.loads(text)
    cls = config_class(raw["model_type"])
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        config = cls.from_dict(raw)
    except Exception:  # transformers' own validation, any error type: no model of it exists
        return None
    finally:
        quiet.setLevel(level)
    return json.dumps(with_attribute_map(config.to_dict(), cls))


def through_config_class(config: Mapping[str, Any]) -> ReadConfig:
    """``config`` as its family's transformers config class reads it (module docstring).

    Read as written instead when the installed transformers does not know the family, and
    when the class refuses the dict: no transformers model has such a config (a partial,
    hand-written dict), and posenc's own checks of the fields it reads apply, each raising
    ``ValueError`` by name. A dict without ``model_type`` is read as written (Llama-style).

    Raises:
        ValueError: a ``model_type`` given and transformers not installed: a released
            ``config.json`` leaves most fields to its class (measured: a minimal file of
            about 90 of the table's families reads differently without the class's
            defaults), so posenc refuses rather than guess.
    """
    model_type = config.get("model_type")
    if isinstance(config, ReadConfig):
        return ReadConfig(config)
    if model_type is not None and _mapping() is None:
        raise ValueError(
            f"reading a config.json of model_type {model_type!r} needs transformers (pip "
            "install 'posenc[hf]'): its config class supplies what the file leaves out; or "
            "drop model_type to read a Llama-style dict as written"
        )
    if config_class(model_type) is None:
        return ReadConfig(config)
    try:
        text = json.dumps(config, sort_keys=True)
    except (TypeError, ValueError):  # not a config.json: values JSON cannot hold
        return ReadConfig(config)
    normalized = _normalized(text)
    if normalized is None:
        return ReadConfig(config)
    return ReadConfig(json.loads(normalized))  # fresh objects: the cache holds text
