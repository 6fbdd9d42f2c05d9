"""A ``config.json``'s positions as transformers runs them, and as posenc's plan builds them.

Shapes: ``P`` positions, ``R`` rotary dims, ``L`` layers.

* ``read_transformers``: the angles and the cos/sin factor come from transformers' own
  rotary module of the family (``<Family>RotaryEmbedding`` in its modeling file, built on
  transformers' config class; per layer type where the module keeps one table per type),
  after its ``forward`` has seen a ``context``-token sequence (so dynamic NTK and LongRoPE
  choose their frequencies as they would); which layers rotate and the pair layout are
  posenc's family table (``posenc.hf.layer_plan``), checked against transformers' modeling
  code layer by layer in the ``posenc.hf`` tests.
* ``read_posenc``: ``posenc.hf.layer_plan``'s modules, their ``inv_freq`` and
  ``attention_scale`` after ``observe_length(context)``.

For an MLA config (``posenc.audit.mla``) each rotating layer also states its softmax scale:
transformers' attention module's ``scaling`` (the model built on the meta device), posenc's
``mla_softmax_scale``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from posenc.audit.mla import mla_width, transformers_scales
from posenc.audit.reading import LayerPositions, Reading, no_rotation

__all__ = ["read_posenc", "read_transformers"]

_FIELDS = (
    "model_type",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "head_dim",
    "max_position_embeddings",
    "sliding_window",
    "layer_types",
    "no_rope_layers",
)


def _raw_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    text = config.get("text_config") or config
    return {k: text[k] for k in _FIELDS if k in text}


def _plan(config: Mapping[str, Any]) -> list[Any]:
    """``layer_plan``; for a family with one position module for the whole model (ALiBi,
    absolute embeddings), which ``layer_plan`` refuses, that module at every layer."""
    from posenc.hf import from_hf_config, layer_plan
    from posenc.hf.config import as_config_dict

    try:
        return layer_plan(dict(config))
    except ValueError:
        read = as_config_dict(dict(config))
        layers = read.get("num_hidden_layers") or read.get("n_layer")
        if not layers:
            raise
        return [from_hf_config(read, layer_idx=i) for i in range(int(layers))]


def _layer(
    module: Any,
    positions: np.ndarray,
    context: int,
    window: int | None,
    head_dim: int,
    mla: int | None = None,
) -> LayerPositions:
    """A plan module's ``LayerPositions``: RoPE (or M-RoPE around one), or no rotation for
    an encoding that does not touch queries and keys (NoPE, ALiBi, biases); ``mla``, the
    MLA query/key width, gives the layer posenc's MLA softmax scale (``mla_softmax_scale``)."""
    from posenc.base import Site
    from posenc.encodings.rotary.mla import mla_softmax_scale
    from posenc.encodings.rotary.module import RotaryEmbedding

    if not module.sites & Site.QK:
        alibi = getattr(module, "max_bias", None) if type(module).__name__ == "ALiBi" else None
        return no_rotation(head_dim, len(positions), sliding_window=window, alibi_max_bias=alibi)
    rope, extra = module, {}
    if hasattr(module, "mrope_section") and isinstance(
        getattr(module, "rope", None), RotaryEmbedding
    ):
        rope = module.rope
        extra = {
            "sections": [*module.mrope_section, 0, 0, 0, 0][:4],
            "mrope_interleaved": bool(module.mrope_interleaved),
        }
    if type(rope) is not RotaryEmbedding:
        raise ValueError(f"posenc audit does not describe {type(module).__name__} layers yet")
    rope.observe_length(context)
    inv_freq = rope.inv_freq.double().numpy()  # [R/2]
    return LayerPositions(
        rotates=True,
        head_dim=rope.head_dim,
        rotary_dim=rope.rotary_dim,
        pairs="adjacent" if rope.interleaved else "half",
        angles=positions[:, None].astype(np.float64) * inv_freq[None, :],
        scale=np.full(len(positions), float(rope.attention_scale)),
        softmax_scale=None if mla is None else mla_softmax_scale(mla, rope.scaling),
        sliding_window=window,
        extra=extra,
    )


def _config_head_dim(config: Mapping[str, Any]) -> int:
    """The attention head width (``head_dim``, else ``hidden_size / num_attention_heads``)."""
    from posenc.hf.config import as_config_dict

    read = as_config_dict(dict(config))
    text = read.get("text_config") or read
    return int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])


def _windows(config: Mapping[str, Any], layers: int) -> list[int | None]:
    from posenc.hf.config import as_config_dict, layer_types_of

    read = as_config_dict(dict(config))
    text = read.get("text_config") or read
    kinds = layer_types_of(text)
    window = text.get("sliding_window")
    if not kinds:
        return [None] * layers
    return [window if kind == "sliding_attention" else None for kind in kinds]


def read_posenc(
    config: Mapping[str, Any], positions: Sequence[int] | np.ndarray, *, context: int
) -> Reading:
    """posenc's plan for ``config`` (``posenc.hf.layer_plan``) at ``positions`` (``[P]``)."""
    pos = np.asarray(positions)
    plan = _plan(config)
    windows = _windows(config, len(plan))
    head_dim = _config_head_dim(config)
    width = mla_width(config)
    layers = [
        _layer(module, pos, context, window, head_dim, width)
        for module, window in zip(plan, windows, strict=True)
    ]
    return Reading("posenc", pos, context, tuple(layers), _raw_fields(config))


def _rotary_class(config: Any) -> type:
    """The family's rotary module: the modeling file beside the config class's file."""
    model_type = config.model_type
    module = importlib.import_module(
        type(config).__module__.replace(".configuration_", ".modeling_")
    )
    found = [
        obj
        for name, obj in inspect.getmembers(module, inspect.isclass)
        if name.endswith("RotaryEmbedding")
        and obj.__module__ == module.__name__
        and not any(word in name for word in ("Vision", "Audio", "Image"))
    ]
    if not found:
        raise ValueError(f"transformers' {model_type} modeling file has no rotary module")
    return min(found, key=lambda cls: len(cls.__name__))


def _built_config(config: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig

    fields = dict(config)
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ValueError("config.json has no model_type: transformers cannot pick a class")
    try:
        built = AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"transformers refuses this {model_type} config: {err}") from None
    return built


def read_transformers(
    config: Mapping[str, Any], positions: Sequence[int] | np.ndarray, *, context: int
) -> Reading:
    """transformers' rotary module for ``config`` at ``positions`` (``[P]``), per layer."""
    import torch

    pos = np.asarray(positions)
    built = _built_config(config)
    text = built.get_text_config()
    kinds = getattr(text, "layer_types", None) or []
    plan = _plan(config)
    windows = _windows(config, len(plan))
    head_dim = _config_head_dim(config)
    ids = torch.tensor([[context - 1]])
    softmax, note = [None] * len(plan), None
    if mla_width(config) is not None:
        softmax, note = transformers_scales(built, len(plan))
    layers, rotary, per_type = [], None, False
    for i, (module, window) in enumerate(zip(plan, windows, strict=True)):
        planned = _layer(module, pos, context, window, head_dim)
        if not planned.rotates:
            layers.append(planned)
            continue
        if rotary is None:  # a family without rotary layers (ALiBi, NoPE) has no such module
            rotary = _rotary_class(text)(config=text)
            per_type = isinstance(getattr(rotary, "rope_type", None), dict)
        kind = kinds[i] if per_type else None
        prefix = f"{kind}_" if per_type else ""
        axes = ids.expand(3, 1, 1) if "sections" in planned.extra else ids  # M-RoPE: t, h, w
        with torch.no_grad():
            args = {"layer_type": kind} if per_type else {}
            rotary(torch.zeros(1, dtype=torch.float32), axes, **args)
        inv_freq = getattr(rotary, f"{prefix}inv_freq").double().numpy()  # [R/2]
        scale = float(getattr(rotary, f"{prefix}attention_scaling"))
        layers.append(
            LayerPositions(
                rotates=True,
                head_dim=planned.head_dim,
                rotary_dim=2 * len(inv_freq),
                pairs=planned.pairs,
                angles=pos[:, None].astype(np.float64) * inv_freq[None, :],
                scale=np.full(len(pos), scale),
                softmax_scale=softmax[i],
                sliding_window=window,
                extra=planned.extra,
            )
        )
    return Reading("transformers", pos, context, tuple(layers), _raw_fields(config), note)
