"""Hugging Face interop: posenc's RoPE from a model's ``config.json`` or ``PretrainedConfig``.

Shapes: ``D`` head_dim, ``R`` rotary dim. The fields read, as transformers reads them:

* ``rope_parameters`` (transformers v5) or ``rope_scaling`` (v4, most ``config.json``
  files): ``rope_type`` (legacy ``type``) and the scaling's keys; per-layer-type dicts
  (e.g. ``{"full_attention": {...}, "sliding_attention": {...}}``) need ``layer_type``;
* ``rope_theta`` (inside the dict in v5; GPT-NeoX: ``rotary_emb_base``), default 10000;
* ``partial_rotary_factor`` (GPT-NeoX: ``rotary_pct``): ``R = int(D * factor)``;
* ``head_dim``, else ``hidden_size // num_attention_heads``;
* ``max_position_embeddings``: the dynamic-NTK original length, and the default of
  ``original_max_position_embeddings`` (yarn, llama3, longrope), whose top-level value
  takes priority over the dict's (Phi-3); yarn/longrope without ``factor`` use
  ``max_position_embeddings / original_max_position_embeddings``.

Every Hugging Face RoPE model rotates half-split pairs (the Llama conversion permutes
Meta's interleaved weights, see ``rope_weight_to_half_split``), hence
``interleaved=False`` by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posenc._checks import check_int
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.encodings.rotary.scaling import DEFAULT_BASE, RopeScaling, resolve_scaling

__all__ = ["HFRopeConfig", "parse_hf_rope_config", "rope_from_hf_config"]

_ORIGINAL = "original_max_position_embeddings"


@dataclass(frozen=True)
class HFRopeConfig:
    """The RoPE settings of a Hugging Face config, in posenc's terms."""

    head_dim: int
    rotary_dim: int
    base: float
    scaling: RopeScaling

    def build(self, *, interleaved: bool = False, max_len: int = 2048) -> RotaryEmbedding:
        """The ``RotaryEmbedding`` with these settings."""
        return RotaryEmbedding(
            self.head_dim,
            base=self.base,
            scaling=self.scaling,
            rotary_dim=self.rotary_dim,
            interleaved=interleaved,
            max_len=max_len,
        )


def _as_dict(config: object) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise TypeError(
        f"config must be a dict (config.json) or a transformers PretrainedConfig, "
        f"got {type(config).__name__}"
    )


def _first(*values: object) -> Any:
    return next((v for v in values if v is not None), None)


def _head_dim(cfg: Mapping[str, Any]) -> int:
    if cfg.get("head_dim") is not None:
        return check_int("head_dim", cfg["head_dim"])
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    if hidden is None or heads is None:
        raise ValueError(
            "config has neither head_dim nor hidden_size and num_attention_heads, "
            f"got hidden_size={hidden}, num_attention_heads={heads}"
        )
    hidden, heads = check_int("hidden_size", hidden), check_int("num_attention_heads", heads)
    if hidden % heads:
        raise ValueError(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}")
    return hidden // heads


def _rope_parameters(cfg: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    params = _first(cfg.get("rope_parameters") or None, cfg.get("rope_scaling") or None) or {}
    if not isinstance(params, Mapping):
        raise TypeError(f"rope parameters must be a dict, got {type(params).__name__}")
    nested = bool(params) and all(v is None or isinstance(v, Mapping) for v in params.values())
    if not nested:
        if layer_type is not None:
            raise ValueError(
                f"layer_type={layer_type!r} given, but the config has one set of rope parameters"
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


def parse_hf_rope_config(config: object, *, layer_type: str | None = None) -> HFRopeConfig:
    """Read the RoPE settings of a Hugging Face config (see the module docstring).

    Args:
        config: a ``config.json`` dict or a ``transformers.PretrainedConfig``.
        layer_type: which per-layer-type rope parameters to read, when there are several.

    Returns:
        The parsed ``HFRopeConfig``.

    Raises:
        ValueError: missing head size fields, unknown ``rope_type`` (listing the known
            ones), missing or invalid scaling keys, an odd rotary dim.
        TypeError: ``config`` of another type.
    """
    cfg = _as_dict(config)
    head_dim = _head_dim(cfg)
    params = _rope_parameters(cfg, layer_type)
    theta = _first(
        params.pop("rope_theta", None), cfg.get("rope_theta"), cfg.get("rotary_emb_base")
    )
    fraction = _first(
        params.pop("partial_rotary_factor", None),
        cfg.get("partial_rotary_factor"),
        cfg.get("rotary_pct"),
    )
    rope_type = _first(params.get("rope_type"), params.get("type"), "default")
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
    if fraction is not None:
        spec["partial_rotary_factor"] = fraction
    scaling, base, rotary_dim = resolve_scaling(spec, head_dim=head_dim, base=DEFAULT_BASE)
    return HFRopeConfig(head_dim=head_dim, rotary_dim=rotary_dim, base=base, scaling=scaling)


def rope_from_hf_config(
    config: object,
    *,
    layer_type: str | None = None,
    interleaved: bool = False,
    max_len: int = 2048,
) -> RotaryEmbedding:
    """Build the ``RotaryEmbedding`` a Hugging Face model uses.

    Args:
        config: a ``config.json`` dict or a ``transformers.PretrainedConfig``.
        layer_type: which per-layer-type rope parameters to use, when there are several.
        interleaved: pair layout (Hugging Face checkpoints are half-split: False).
        max_len: cos/sin cache length built up front.

    Returns:
        A ``RotaryEmbedding`` giving transformers' ``inv_freq`` and attention factor.

    Raises:
        ValueError, TypeError: see ``parse_hf_rope_config``.
    """
    parsed = parse_hf_rope_config(config, layer_type=layer_type)
    return parsed.build(interleaved=interleaved, max_len=max_len)
