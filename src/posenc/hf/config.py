"""Hugging Face interop: posenc's RoPE from a model's ``config.json`` or ``PretrainedConfig``.

Shapes: ``D`` head_dim, ``R`` rotary dim. The fields read, as transformers reads them:

* ``model_type`` picks the family (``posenc.hf.families``): pair layout, head-dim source,
  partial-rotary rule, the family's own position fields. A config without ``model_type``
  (a hand-written dict) reads as Llama-style; a composite model's config (``text_config``)
  is read through its text sub-config;
* ``rope_parameters`` (transformers v5) or ``rope_scaling`` (v4, most ``config.json``
  files): ``rope_type`` (legacy ``type``) and the scaling's keys; per-layer-type dicts
  (e.g. ``{"full_attention": {...}, "sliding_attention": {...}}``) need ``layer_type``;
  a v4 Gemma 3 ``rope_local_base_freq`` is the default-RoPE base of sliding layers;
* ``rope_theta`` (inside the dict in v5; GPT-NeoX: ``rotary_emb_base``), default 10000;
* ``partial_rotary_factor`` (GPT-NeoX: ``rotary_pct``): ``R = int(D * factor)``; GPT-J and
  CodeGen: ``R = rotary_dim``;
* HunYuan (``Family.ntk_alpha``): ``dynamic`` with an ``alpha`` is the fixed NTK-alpha base
  (rope type ``ntk_alpha``), whatever the dict's ``factor``;
* ``max_position_embeddings``: the dynamic-NTK original length, and the default of
  ``original_max_position_embeddings`` (yarn, llama3, longrope), whose top-level value
  takes priority over the dict's (Phi-3); yarn/longrope without ``factor`` use
  ``max_position_embeddings / original_max_position_embeddings``.

A field that changes positions and that the family's entry does not list raises
``ValueError`` (never ignored): see ``posenc.hf.families.check_position_fields``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc._checks import check_bool, check_int
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.encodings.rotary.ntk_alpha import ntk_alpha_parameters
from posenc.encodings.rotary.scaling import DEFAULT_BASE, RopeScaling, resolve_scaling
from posenc.hf import normalize
from posenc.hf.families import FAMILIES, Family, check_position_fields, family

__all__ = [
    "HFRopeConfig",
    "as_config_dict",
    "config_family",
    "layer_types_of",
    "parse_hf_rope_config",
    "rope_from_hf_config",
]

_ORIGINAL = "original_max_position_embeddings"
SUB_CONFIGS = ("text_config", "thinker_config")  # where a composite keeps its text model


@dataclass(frozen=True)
class HFRopeConfig:
    """The RoPE settings of a Hugging Face config, in posenc's terms."""

    head_dim: int
    rotary_dim: int
    base: float
    scaling: RopeScaling
    interleaved: bool = False
    clockwise: bool = False  # rotate by -theta (NanoChat)

    def __post_init__(self) -> None:
        check_bool("interleaved", self.interleaved)
        check_bool("clockwise", self.clockwise)

    def build(
        self,
        *,
        interleaved: bool | None = None,
        max_len: int = 2048,
        length_policy: str = "transformers",
    ) -> RotaryEmbedding:
        """The ``RotaryEmbedding`` with these settings (``interleaved=None``: the family's)."""
        return RotaryEmbedding(
            self.head_dim,
            base=self.base,
            scaling=self.scaling,
            rotary_dim=self.rotary_dim,
            interleaved=self.interleaved if interleaved is None else interleaved,
            max_len=max_len,
            length_policy=length_policy,
            clockwise=self.clockwise,
        )


def as_config_dict(config: object) -> dict[str, Any]:
    """``config`` (a ``config.json`` dict or a ``PretrainedConfig``) as a plain dict, read as
    transformers reads it.

    A dict with a ``model_type`` that the installed transformers knows goes through that
    family's config class first (``posenc.hf.normalize``): the class's defaults for every
    field the file leaves out, legacy fields migrated (``rope_scaling`` -> ``rope_parameters``,
    ``sliding_window_pattern`` -> ``layer_types``, per-layer-type parameters), so a raw
    ``config.json`` and the ``PretrainedConfig`` built from it read alike. Without
    transformers, for a family it does not know, or for a dict its class refuses (a partial,
    hand-written dict) the dict is read as written. The class's ``attribute_map`` names
    (GPT-J's ``n_layer`` as ``num_hidden_layers``) are added beside the family's own.

    A path (``str`` or ``os.PathLike``) to a ``config.json``, or to the folder holding one
    (a checkpoint's), is read as that file's dict.

    Raises:
        TypeError: ``config`` of another type, or a file that is not a JSON object.
        ValueError: a path to no file, or to a file that is not JSON.
    """
    if isinstance(config, (str, os.PathLike)):
        return as_config_dict(_read_json(Path(config)))
    if isinstance(config, Mapping):
        return normalize.through_config_class(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return normalize.with_attribute_map(dict(to_dict()), type(config))
    raise TypeError(
        f"config must be a dict (config.json), a path to a config.json or its folder, or a "
        f"transformers PretrainedConfig, got {type(config).__name__}"
    )


def _read_json(path: Path) -> object:
    """The object in ``path`` (a ``config.json``, or a folder holding one)."""
    file = path / "config.json" if path.is_dir() else path
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        reason = (err.strerror or str(err)).lower()
        raise ValueError(f"config path {str(file)!r}: {reason}") from None
    try:
        found = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"config path {str(file)!r} is not JSON: {err}") from None
    if not isinstance(found, dict):
        raise TypeError(f"config path {str(file)!r} holds a {type(found).__name__}, not an object")
    return found


def config_family(config: object) -> tuple[dict[str, Any], Family]:
    """The config dict whose positions are read (a composite's text part) and its family.

    Raises:
        ValueError: unknown ``model_type`` (see ``posenc.hf.families.family``).
        TypeError: ``config`` of another type.
    """
    cfg = as_config_dict(config)
    while "model_type" in cfg and cfg["model_type"] not in FAMILIES:
        sub = next((cfg[k] for k in SUB_CONFIGS if cfg.get(k) is not None), None)
        if sub is None:
            break
        cfg = as_config_dict(sub)
    if "model_type" not in cfg:
        return cfg, Family()  # a hand-written dict: Llama-style
    fam = family(cfg["model_type"])
    return (_attention_blocks(cfg) if fam.mlp_blocks else cfg), fam


def _attention_blocks(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config listing each layer as (attention, ``"mlp"``) blocks read as its config class
    reads it: the attention blocks' types, half of ``num_hidden_layers`` (``Family.mlp_blocks``).

    Raises:
        ValueError: ``layer_types`` that do not alternate attention and ``"mlp"`` blocks.
    """
    kinds = cfg.get("layer_types")
    if not kinds or "mlp" not in kinds:
        return cfg  # already one entry per layer, as the class keeps it
    attention, mlp = list(kinds[::2]), list(kinds[1::2])
    if len(attention) != len(mlp) or set(mlp) != {"mlp"} or "mlp" in attention:
        raise ValueError(
            f"model_type {cfg['model_type']!r} lists each layer as an attention block then an "
            f"'mlp' block; layer_types {kinds!r:.120} do not alternate so"
        )
    layers = cfg.get("num_hidden_layers", len(kinds))
    if layers != len(kinds):
        raise ValueError(
            f"num_hidden_layers={layers!r} does not count the {len(kinds)} blocks of layer_types"
        )
    return {**cfg, "layer_types": attention, "num_hidden_layers": len(attention)}


def _first(*values: object) -> Any:
    return next((v for v in values if v is not None), None)


def _head_dim(cfg: Mapping[str, Any], fam: Family) -> int:
    for name in fam.head_dim:
        if cfg.get(name) is not None:
            return check_int(name, cfg[name])
    hidden, heads = cfg.get(fam.hidden), cfg.get(fam.heads)
    if hidden is None or heads is None:
        direct = " or ".join(fam.head_dim) or "a head dim field"
        raise ValueError(
            f"config has neither {direct} nor {fam.hidden} and {fam.heads}, "
            f"got {fam.hidden}={hidden}, {fam.heads}={heads}"
        )
    head_dim = check_int(fam.hidden, hidden) // check_int(fam.heads, heads)
    if head_dim % 2:
        raise ValueError(
            f"{fam.hidden}={hidden} // {fam.heads}={heads} gives head_dim {head_dim}, "
            "which must be even"
        )
    return head_dim


def layer_types_of(cfg: Mapping[str, Any]) -> list[str] | None:
    """``layer_types``, or those of a v4 Gemma 3 ``sliding_window_pattern`` (every
    ``pattern``-th layer full attention, the others sliding), or None."""
    kinds = cfg.get("layer_types")
    if kinds:
        return list(kinds)
    pattern, layers = cfg.get("sliding_window_pattern"), cfg.get("num_hidden_layers")
    if pattern and layers:
        return [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(layers)
        ]
    return None


def _rope_parameters(cfg: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    params = _first(cfg.get("rope_parameters") or None, cfg.get("rope_scaling") or None) or {}
    if not isinstance(params, Mapping):
        raise TypeError(f"rope parameters must be a dict, got {type(params).__name__}")
    nested = bool(params) and all(v is None or isinstance(v, Mapping) for v in params.values())
    if not nested:
        local = cfg.get("rope_local_base_freq")
        if layer_type == "sliding_attention" and local is not None:  # Gemma 3 (v4 form)
            return {"rope_type": "default", "rope_theta": local}
        kinds = sorted(set(layer_types_of(cfg) or ()))
        if layer_type is not None and layer_type not in kinds:
            raise ValueError(
                f"layer_type={layer_type!r} given, but the config has one set of rope "
                f"parameters and layer types {kinds}"
            )
        return dict(params)
    if layer_type not in params:
        raise ValueError(
            f"the config has rope parameters per layer type {sorted(params)}; "
            f"pass one of them as layer_type (got {layer_type!r})"
        )
    if params[layer_type] is None:
        raise ValueError(f"layer type {layer_type!r} has no rope parameters (no RoPE there)")
    return dict(params[layer_type])


def _max_positions(cfg: Mapping[str, Any], rope_type: str) -> int:
    value = cfg.get("max_position_embeddings")
    if value is None:
        raise ValueError(f"rope_type {rope_type!r} needs max_position_embeddings in the config")
    return check_int("max_position_embeddings", value)


def _interleaved(cfg: Mapping[str, Any], fam: Family) -> bool:
    if fam.layout == "rope_interleave":
        return bool(cfg.get("rope_interleave", True))
    return fam.layout == "interleaved"


def parse_hf_rope_config(config: object, *, layer_type: str | None = None) -> HFRopeConfig:
    """Read the RoPE settings of a Hugging Face config (see the module docstring).

    Args:
        config: a ``config.json`` dict, a path to one (or to its folder), or a
            ``transformers.PretrainedConfig``.
        layer_type: which per-layer-type rope parameters to read, when there are several.

    Returns:
        The parsed ``HFRopeConfig``.

    Raises:
        ValueError: unknown ``model_type``, a position field the family does not read,
            missing head size fields, unknown ``rope_type`` (listing the known ones),
            missing or invalid scaling keys, an odd rotary dim.
        TypeError: ``config`` of another type.
    """
    cfg, fam = config_family(config)
    if fam.scheme is not None:
        raise ValueError(
            f"model_type {cfg['model_type']!r} uses the {fam.scheme!r} scheme, not plain RoPE; "
            "use posenc.from_hf_config"
        )
    check_position_fields(cfg, fam)
    head_dim = _head_dim(cfg, fam)
    params = _rope_parameters(cfg, layer_type)
    theta = _first(
        params.pop("rope_theta", None), cfg.get("rope_theta"), cfg.get("rotary_emb_base")
    )
    fraction = _first(
        params.pop("partial_rotary_factor", None),
        cfg.get("partial_rotary_factor"),
        cfg.get("rotary_pct"),
    )
    if fam.ntk_alpha:  # HunYuan: "dynamic" with an alpha is a fixed NTK base
        params = ntk_alpha_parameters(params) or params
    rope_type = _first(params.get("rope_type"), params.get("type"), "default")
    if rope_type in ("longrope", "su"):  # only Phi-3.5-MoE's module reads its mscales
        mscales = {key: params.pop(key, None) for key in ("short_mscale", "long_mscale")}
        if fam.mscales:
            params.update(mscales, long_factor=params.get("short_factor"))
    if rope_type in ("yarn", "llama3", "longrope", "su"):
        original = _first(cfg.get(_ORIGINAL), params.get(_ORIGINAL))
        params[_ORIGINAL] = original if original is not None else _max_positions(cfg, rope_type)
        if rope_type != "llama3" and params.get("factor") is None:
            params["factor"] = _max_positions(cfg, rope_type) / params[_ORIGINAL]
    elif rope_type == "dynamic":
        length = _max_positions(cfg, rope_type)
        if params.setdefault(_ORIGINAL, length) != length:
            raise ValueError(
                f"dynamic rope parameters have {_ORIGINAL}={params[_ORIGINAL]}, but transformers "
                f"uses max_position_embeddings={length} for dynamic NTK; remove one of them"
            )
    spec = {**params, "rope_theta": _first(theta, DEFAULT_BASE)}
    rotary_dim = None
    if fam.rotary != "fraction":
        rotary_dim = cfg.get(fam.rotary)
        rotary_dim = head_dim if rotary_dim is None else check_int(fam.rotary, rotary_dim)
    elif fraction is not None:
        spec["partial_rotary_factor"] = fraction
    scaling, base, rotary_dim = resolve_scaling(
        spec, head_dim=head_dim, base=DEFAULT_BASE, rotary_dim=rotary_dim
    )
    return HFRopeConfig(head_dim, rotary_dim, base, scaling, _interleaved(cfg, fam), fam.clockwise)


def rope_from_hf_config(
    config: object,
    *,
    layer_type: str | None = None,
    interleaved: bool | None = None,
    max_len: int = 2048,
    length_policy: str = "transformers",
) -> RotaryEmbedding:
    """Build the ``RotaryEmbedding`` a Hugging Face model uses (RoPE families only).

    In a model whose layers differ (NoPE layers, per-layer bases), this is the rotation of
    the layers that rotate with the config's own parameters; ``posenc.hf.layer_plan``
    says which layers those are, and ``posenc.from_hf_config`` refuses to guess.

    Args:
        config: a ``config.json`` dict, a path to one (or to its folder), or a
            ``transformers.PretrainedConfig``.
        layer_type: which per-layer-type rope parameters to use, when there are several.
        interleaved: pair layout; None (default) takes the family's from ``model_type``.
        max_len: cos/sin cache length built up front.
        length_policy: ``"transformers"`` (a drop-in: dynamic NTK / LongRoPE follow each
            call's length) or ``"monotone"`` (KV-cache consistent); see ``RotaryEmbedding``.

    Returns:
        A ``RotaryEmbedding`` giving transformers' ``inv_freq``, attention factor and layout.

    Raises:
        ValueError, TypeError: see ``parse_hf_rope_config``.
    """
    parsed = parse_hf_rope_config(config, layer_type=layer_type)
    return parsed.build(interleaved=interleaved, max_len=max_len, length_policy=length_policy)
