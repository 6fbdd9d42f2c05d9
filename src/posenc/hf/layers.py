"""Per-layer positional encodings of a Hugging Face model: ``from_hf_config``, ``layer_plan``.

Shapes: ``L`` layers. Models differ by layer in three ways that the family table
(``posenc.hf.families``) names in ``Family.layers``, besides per-layer-type rope parameters
(``rope_parameters[layer_type]``, e.g. Gemma 3's sliding layers with base 1e4 and full
layers with base 1e6 and a scaling):

* ``"no_rope_layers"`` (Llama 4, SmolLM3): ``no_rope_layers[i] == 0`` marks a NoPE layer;
  an empty list means every ``no_rope_layer_interval``-th layer (``(i + 1) % n == 0``).
  Llama 4 scales the queries of its NoPE layers by position (``attn_temperature_tuning``):
  that layer is the ``"temperature"`` scheme of ``posenc.hf.schemes``, a
  ``PositionTemperature`` of the positions it is given, where transformers takes the token
  index (``posenc.encodings.rotary.temperature`` says when they differ);
* ``"sliding_rope"`` (Cohere2): only ``sliding_attention`` layers rotate, the others are NoPE;
* ``"layer_rope_theta"`` (Granite SWA): ``layer_rope_theta[i]`` is layer ``i``'s base, 0 NoPE;
* ``"cross_attention_layers"`` (Llama 3.2 Vision, ``mllama``): the listed layers are
  cross-attention from the text to the image, which transformers never rotates
  (``MllamaTextCrossAttention`` takes no position embeddings; without an image the text
  model skips those layers): NoPE.

Layer types come from ``layer_types``, or (a v4 Gemma 3 ``config.json``) from
``sliding_window_pattern``: layer ``i`` is full attention when ``(i + 1) % pattern == 0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc._checks import check_int
from posenc.base import PositionalEncoding
from posenc.encodings.nope import NoPE
from posenc.hf.absolute import build_position_module
from posenc.hf.config import (
    SUB_CONFIGS,
    as_config_dict,
    config_family,
    layer_types_of,
    parse_hf_rope_config,
)
from posenc.hf.families import Family

__all__ = ["from_hf_config", "layer_plan"]


def _num_layers(cfg: Mapping[str, Any]) -> int:
    # LongCat-Flash counts its layers as num_layers (two attention modules each, one rotary)
    layers = cfg.get("num_hidden_layers", cfg.get("num_layers"))
    if layers is None:
        kinds = layer_types_of(cfg)
        if kinds is None:
            raise ValueError("config has neither num_hidden_layers nor layer_types")
        return len(kinds)
    return check_int("num_hidden_layers", layers)


def _layer_override(cfg: Mapping[str, Any], fam: Family, index: int) -> dict[str, Any] | None:
    """Layer ``index``'s rope-parameter overrides (``{}``: the config's; None: a NoPE layer)."""
    layers = _num_layers(cfg)
    if fam.layers == "no_rope_layers":
        interval = cfg.get("no_rope_layer_interval")
        flags = cfg.get("no_rope_layers") or [
            int((i + 1) % check_int("no_rope_layer_interval", interval) != 0) for i in range(layers)
        ]
        return {} if flags[index] else None
    if fam.layers == "layer_rope_theta" and cfg.get("layer_rope_theta"):
        theta = float(cfg["layer_rope_theta"][index])
        return {"rope_theta": theta} if theta else None
    if fam.layers in ("sliding_rope", "local_rope", "sliding_rope_or_all", "sliding_rope_dense"):
        return {} if _rotates(cfg, fam.layers, index) else None
    if fam.layers == "cross_attention_layers":
        return None if index in _cross_attention_layers(cfg) else {}
    if fam.layers == "rope_scaling_layers" and index not in (cfg.get("rope_scaling_layers") or ()):
        return {"rope_type": "default"}  # the base and partial rotary stay, the scaling goes
    return {}


#: families whose code rotates only when a config field has a value: ``(field, value)``
#: (Zamba2's shared attention with ``use_mem_rope``; Granite 4 hybrids default to NoPE)
ROPE_SWITCHES = {
    "zamba2": ("use_mem_rope", True),
    "granitemoehybrid": ("position_embedding_type", "rope"),
}

#: ``MllamaTextConfig``'s cross-attention layers when the config leaves them out
MLLAMA_CROSS_ATTENTION = (3, 8, 13, 18, 23, 28, 33, 38)


def _cross_attention_layers(cfg: Mapping[str, Any]) -> tuple[int, ...]:
    layers = cfg.get("cross_attention_layers")
    if layers is None:
        return MLLAMA_CROSS_ATTENTION
    if not isinstance(layers, (list, tuple)):
        raise TypeError(
            f"cross_attention_layers must be a list of layer indices, got {layers!r:.80}"
        )
    return tuple(
        check_int(f"cross_attention_layers[{n}]", i, minimum=0) for n, i in enumerate(layers)
    )


def _rotates(cfg: Mapping[str, Any], rule: str, index: int) -> bool:
    """Whether layer ``index`` rotates under a sliding-window rule (module docstring)."""
    sliding = (layer_types_of(cfg) or [])[index] == "sliding_attention"
    window = cfg.get("sliding_window") is not None
    if rule == "local_rope":
        return sliding
    if rule == "sliding_rope_or_all":
        return sliding or not window
    if rule == "sliding_rope_dense":  # Cohere2-MoE: also the dense-MLP prefix layers
        dense = (cfg.get("mlp_layer_types") or [None] * (index + 1))[index] == "dense"
        return (sliding and window) or (
            dense and cfg.get("prefix_dense_sliding_window_pattern") == 1
        )
    return sliding and window


def _scheme(name: str, cfg: dict[str, Any], layer_type: str | None, layer_idx: int | None):
    try:
        from posenc.hf.schemes import build_scheme
    except ImportError as exc:
        raise ValueError(
            f"model_type {cfg.get('model_type')!r} needs the {name!r} scheme, which this "
            "posenc does not provide"
        ) from exc
    return build_scheme(name, cfg, layer_type=layer_type, layer_idx=layer_idx)


_KEPT = ("rope_theta", "partial_rotary_factor")


def _with_override(cfg: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    params = cfg.get("rope_parameters")
    flat = isinstance(params, Mapping) and params and "rope_type" in params
    if override.get("rope_type") == "default":
        kept = {k: v for k, v in (params or {}).items() if k in _KEPT} if flat else {}
        return {**cfg, "rope_parameters": {**kept, **override}, "rope_scaling": None}
    if flat:
        return {**cfg, "rope_parameters": {**params, **override}}
    return {**cfg, **override}


def _resolve_layer(
    cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None
) -> str | None:
    kinds = layer_types_of(cfg)
    if layer_idx is not None:
        layers = _num_layers(cfg)
        layer_idx = check_int("layer_idx", layer_idx, minimum=0)
        if layer_idx >= layers:
            raise ValueError(f"layer_idx={layer_idx} is out of range for {layers} layers")
        implied = kinds[layer_idx] if kinds else None
        if layer_type is not None and layer_type != implied:
            raise ValueError(f"layer {layer_idx} is {implied!r}, not layer_type={layer_type!r}")
        return implied
    if layer_type is not None and kinds is not None and layer_type not in kinds:
        raise ValueError(
            f"layer_type={layer_type!r} is not one of the config's {sorted(set(kinds))}"
        )
    return layer_type


def _position_module(
    config: object, layer_idx: int | None, stack: str | None = None, tower: str | None = None
) -> PositionalEncoding | None:
    """The ALiBi / T5 / absolute-table module of a non-rotary family (``posenc.hf.absolute``)."""
    cfg = as_config_dict(config)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        return None
    return build_position_module(model_type, cfg, layer_idx=layer_idx, stack=stack, tower=tower)


def from_hf_config(
    config: object,
    *,
    layer_type: str | None = None,
    layer_idx: int | None = None,
    stack: str | None = None,
    tower: str | None = None,
) -> PositionalEncoding:
    """The positional encoding a transformers model family uses at one layer.

    Args:
        config: a ``config.json`` dict or a ``transformers.PretrainedConfig`` (a composite
            model's config is read through its ``text_config``).
        layer_type: which per-layer-type parameters to use (``"sliding_attention"`` ...).
        layer_idx: the layer (sets ``layer_type`` from ``layer_types``); needed when layers
            differ otherwise (NoPE layers, per-layer bases).
        stack: ``"encoder"`` or ``"decoder"`` of an encoder-decoder family; needed where
            their positions differ (Whisper: sinusoidal encoder, learned decoder).
        tower: the text tower of a multimodal family where it has several
            (``posenc.hf.composite.TEXT_TOWERS``: BLIP-2's ``"qformer_config"`` or
            ``"text_config"``, its language model, read as that family's config).

    Returns:
        A ``RotaryEmbedding`` (transformers' length policy, the family's layout), a
        ``NoPE``, the scheme's encoding (``posenc.hf.schemes``), or for the ALiBi, T5 and
        absolute-table families their module (``posenc.hf.absolute.build_position_module``;
        for a multimodal family, its text tower's: ``posenc.hf.composite``).

    Raises:
        ValueError: unknown ``model_type`` or ``rope_type``, a position field the family
            does not read, a ``layer_type`` not in the config, ``layer_idx`` out of range,
            per-layer differences without ``layer_idx``.
        TypeError: ``config`` of another type.
    """
    module = _position_module(config, layer_idx, stack, tower)
    if module is not None:
        return module
    if stack is not None:
        raise ValueError(f"stack={stack!r} applies to the non-rotary encoder-decoder families")
    cfg, fam = config_family(config)
    if layer_idx is not None and not _attends(_text_part(cfg), layer_idx):
        return NoPE()  # a linear-attention, recurrent or state-space layer: no q.k scores
    switch = ROPE_SWITCHES.get(str(cfg.get("model_type")))
    if switch is not None and cfg.get(switch[0]) != switch[1]:
        return NoPE()  # the family's own code builds no rotary module
    if fam.scheme is not None:
        return _scheme(fam.scheme, cfg, layer_type, layer_idx)
    layer_type = _resolve_layer(cfg, layer_type, layer_idx)
    if fam.layers is not None:
        if layer_idx is None:
            overrides = [_layer_override(cfg, fam, i) for i in range(_num_layers(cfg))]
            if any(o != overrides[0] for o in overrides):
                raise ValueError(
                    f"model_type {cfg.get('model_type')!r} differs by layer ({fam.layers}); "
                    "pass layer_idx or use posenc.hf.layer_plan(config)"
                )
            layer_idx = 0
        override = _layer_override(cfg, fam, layer_idx)
        if override is None:
            if cfg.get("attn_temperature_tuning"):
                return _scheme("temperature", cfg, layer_type, layer_idx)
            return NoPE()
        cfg = _with_override(cfg, override)
    if layer_type is not None and _no_rope_type(cfg, layer_type):
        return NoPE()  # a layer type without rope parameters (no attention, or NoPE)
    return parse_hf_rope_config(cfg, layer_type=layer_type).build()


#: layer kinds (``layer_types``, ``block_types``) without softmax attention over positions:
#: MiniMax's lightning attention, RecurrentGemma's recurrent blocks, Mamba and other
#: state-space or convolution blocks; transformers calls no rotation there
NON_ATTENTION = frozenset(
    {"linear_attention", "recurrent", "mamba", "mamba2", "ssm", "conv", "short_conv",
     "gated_deltanet", "linear"}
)  # fmt: skip


def _attends(cfg: Mapping[str, Any], index: int) -> bool:
    """Whether layer ``index`` has attention (``block_types`` repeats over the layers; Bamba
    lists its attention layers in ``attn_layer_indices``, the others are Mamba)."""
    indices = cfg.get("attn_layer_indices")
    if isinstance(indices, list):
        return index in indices
    kinds = cfg.get("layer_types") or cfg.get("block_types")
    if not kinds or not isinstance(kinds, list):
        return True
    return kinds[index % len(kinds)] not in NON_ATTENTION


def _no_rope_type(cfg: Mapping[str, Any], layer_type: str) -> bool:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    nested = isinstance(params, Mapping) and all(
        v is None or isinstance(v, Mapping) for v in params.values()
    )
    in_config = layer_type in (cfg.get("layer_types") or ())
    return bool(params) and nested and in_config and params.get(layer_type) is None


def layer_plan(config: object) -> list[PositionalEncoding]:
    """``from_hf_config(config, layer_idx=i)`` for every layer ``i`` (``L`` encodings).

    Raises:
        ValueError, TypeError: see ``from_hf_config``; a config without
            ``num_hidden_layers`` or ``layer_types``.
    """
    if _position_module(config, None) is not None:
        model_type = as_config_dict(config)["model_type"]
        raise ValueError(
            f"model_type {model_type!r} has one position module for the model, not a RoPE "
            "per layer: use posenc.from_hf_config(config, layer_idx=...)"
        )
    cfg, fam = config_family(config)
    source = cfg if fam.scheme is None else as_config_dict(config)  # read once, not per layer
    return [from_hf_config(source, layer_idx=i) for i in range(_num_layers(_text_part(cfg)))]


def _text_part(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The part of a scheme's composite config that holds its text layers (Omni:
    ``thinker_config``, then its ``text_config``); ``cfg`` itself when it has them."""
    while "num_hidden_layers" not in cfg:
        sub = next((cfg[k] for k in SUB_CONFIGS if cfg.get(k) is not None), None)
        if sub is None:
            break
        cfg = as_config_dict(sub)
    return cfg
