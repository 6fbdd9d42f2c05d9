"""The softmax scale of a multi-head latent attention (MLA) checkpoint, per reading.

Shapes: ``L`` layers.

DeepSeek-V2 (sec. 2.1.3) rotates only ``qk_rope_head_dim`` features of each head, but scales
``q . k`` by ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times ``mscale**2`` under
YaRN with ``mscale_all_dim`` (the YaRN magnitude, Peng et al., 2023, eq. 22, moved from
cos/sin onto the score). A layer's ``head_dim`` in the audit is the rotated head, so
``1 / sqrt(head_dim)`` is never MLA's scale: every reading of an MLA config states its
softmax scale on each rotating layer.

* ``mla_width``: whether a config is MLA, and its query/key head width;
* ``transformers_scales``: transformers' own attention modules' ``scaling`` by
  ``layer_idx``, from the model built on the meta device (no weights allocated).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["mla_width", "transformers_scales"]

#: what a family's model may raise when it does not build on the meta device
_BUILD_ERRORS = (ValueError, TypeError, RuntimeError, NotImplementedError, AttributeError)


def mla_width(config: Mapping[str, Any]) -> int | None:
    """``qk_nope_head_dim + qk_rope_head_dim`` of an MLA config (with ``kv_lora_rank``);
    None for any other config."""
    from posenc.hf.config import as_config_dict

    read = as_config_dict(dict(config))
    text = read.get("text_config") or read
    if text.get("kv_lora_rank") is None or not text.get("qk_rope_head_dim"):
        return None
    return int(text.get("qk_nope_head_dim") or 0) + int(text["qk_rope_head_dim"])


def transformers_scales(built: Any, layers: int) -> tuple[list[float | None], str | None]:
    """``(scale of each of the L layers, note)``: transformers' attention module of layer
    ``i`` has ``scaling`` (its ``q . k`` factor); built from the transformers config object
    ``built`` on the meta device. A family that does not build there: ``[None] * L`` and a
    note saying so (its layers are then compared at ``1 / sqrt(head_dim)``)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(built)
    except _BUILD_ERRORS as err:
        note = (
            f"transformers' {built.model_type} model does not build on the meta device "
            f"({type(err).__name__}: {err}); its softmax scale is not read"
        )
        return [None] * layers, note
    found: dict[int, float] = {}
    for module in model.modules():
        scaling, index = getattr(module, "scaling", None), getattr(module, "layer_idx", None)
        if isinstance(scaling, float) and isinstance(index, int):
            found.setdefault(index, scaling)
    return [found.get(i) for i in range(layers)], None
