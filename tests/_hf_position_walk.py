"""The non-rotary position code of the installed transformers, found by walking its sources.

A family (a ``transformers.models`` sub-package) enters a group when its modeling file
defines, as source text:

* ``alibi``: ``build_alibi_tensor`` or ``build_mpt_alibi_tensor``;
* ``t5``: ``_relative_position_bucket`` (T5's buckets);
* ``learned_class`` / ``sinusoidal_class``: a ``*LearnedPositionalEmbedding`` or
  ``*SinusoidalPositionalEmbedding`` module;
* ``table``: a position table ``self.{wpe,position_embeddings,embed_positions} =
  nn.Embedding(...)``.

``model_type_of`` maps a family to the ``model_type`` of its config; ``tiny_model`` builds
a one-layer random model from a config with small sizes (nothing is downloaded).

Shapes: ``B`` batch, ``T`` length, ``C`` d_model, ``H`` heads.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType

GROUPS = {
    "alibi": re.compile(r"^def build_(mpt_)?alibi_tensor\(", re.M),
    "t5": re.compile(r"def _relative_position_bucket\("),
    "learned_class": re.compile(r"^class \w*LearnedPositionalEmbedding\(", re.M),
    "sinusoidal_class": re.compile(r"^class \w*SinusoidalPositionalEmbedding\(", re.M),
    "table": re.compile(r"self\.(wpe|position_embeddings|embed_positions) = nn\.Embedding\("),
}

#: Families checked by their own test in test_interop_text_families.py, not a group's.
OWN_TESTS = {
    "whisper": "test_whisper_stacks_equal_the_encoder_and_decoder_tables",
    "udop": "test_udop_biases_equal_the_encoder_and_decoder_ones",
    "roformer": "test_roformer_rotation_equals_its_sinusoidal_rotary",
    "mpnet": "test_mpnet_table_and_buckets_equal_its_own",
    "layoutlmv2": "test_layoutlmv2_text_embeddings_read_posencs_positions",
}

#: Small sizes under every spelling the config classes use.
TINY = {
    "hidden_size": 16,
    "d_model": 16,
    "n_embd": 16,
    "embed_dim": 16,
    "embedding_size": 16,
    "input_embedding_size": 16,
    "dim": 16,
    "emb_dim": 16,
    "hidden_dim": 32,
    "n_heads": 2,
    "n_layers": 1,
    "num_attention_heads": 2,
    "n_head": 2,
    "num_heads": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "num_hidden_layers": 1,
    "n_layer": 1,
    "num_layers": 1,
    "num_decoder_layers": 1,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "intermediate_size": 32,
    "d_ff": 32,
    "d_kv": 8,
    "encoder_ffn_dim": 32,
    "decoder_ffn_dim": 32,
    "ffn_dim": 32,
    "vocab_size": 99,
    "max_position_embeddings": 64,
    "n_positions": 64,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 20,
    "pad_token_id": 1,
}


@functools.cache
def families() -> dict[str, frozenset[str]]:
    """``{family: groups}`` for every family in at least one group (cached)."""
    import transformers.models

    root = Path(transformers.models.__file__).parent
    found: dict[str, set[str]] = {}
    for path in sorted(root.glob("*/modeling_*.py")):
        text = path.read_text(encoding="utf-8")
        for group, pattern in GROUPS.items():
            if pattern.search(text):
                found.setdefault(path.parent.name, set()).add(group)
    return {family: frozenset(groups) for family, groups in found.items()}


def modeling(family: str) -> ModuleType:
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def classes(family: str, suffix: str) -> list[type]:
    """The classes of the family's modeling module whose names end with ``suffix``."""
    module = modeling(family)
    return [
        obj
        for name, obj in vars(module).items()
        if name.endswith(suffix) and isinstance(obj, type) and obj.__module__ == module.__name__
    ]


@functools.cache
def model_type_of(family: str) -> str:
    """The ``model_type`` whose transformers module is ``family``."""
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING_NAMES,
        model_type_to_module_name,
    )

    for model_type in CONFIG_MAPPING_NAMES:
        if model_type_to_module_name(model_type) == family:
            return model_type
    raise LookupError(family)


def tiny_config(model_type: str, **overrides: object):
    """The family's config class with the small sizes of ``TINY`` it accepts."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    defaults = cls().to_dict()
    kwargs = {key: value for key, value in TINY.items() if key in defaults}
    return cls(**{**kwargs, **overrides})


def tiny_composite_config(model_type: str, sub: dict[str, dict] | None = None, **overrides):
    """A multimodal family's config with ``TINY`` sizes in every sub-config too.

    ``sub`` adds fields per sub-config (``{"text_config": {...}}``); a ``text_config`` that
    any model may fill (BLIP-2's language model) gets a tiny OPT, other open sub-configs
    (TVP's backbone) their defaults.
    """
    from transformers import CONFIG_MAPPING, AutoConfig

    cls = CONFIG_MAPPING[model_type]
    kwargs: dict[str, dict] = {}
    for key, sub_cls in getattr(cls, "sub_configs", {}).items():
        if sub_cls is not AutoConfig:
            kwargs[key] = _tiny_fields(sub_cls)
        elif key == "text_config":
            kwargs[key] = {"model_type": "opt", **_tiny_fields(CONFIG_MAPPING["opt"])}
        else:
            continue
        kwargs[key].update((sub or {}).get(key, {}))
    return tiny_config(model_type, **kwargs, **overrides)


def _tiny_fields(cls) -> dict[str, object]:
    """The ``TINY`` sizes that ``cls`` accepts with the same type (CLAP's audio heads are
    a list per stage, for one)."""
    defaults = cls().to_dict()
    return {k: v for k, v in TINY.items() if k in defaults and type(defaults[k]) is type(v)}


def past(module, length: int) -> dict[str, int]:
    """A cached length as the position module's forward names it (``cache_length`` from
    transformers 5.24, ``past_key_values_length`` before)."""
    params = inspect.signature(module.forward).parameters
    return {"cache_length" if "cache_length" in params else "past_key_values_length": length}
