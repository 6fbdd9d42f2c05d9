"""Text towers of multimodal Hugging Face models: where a composite config keeps its text
positions.

A multimodal model (CLIP-style dual encoders, BLIP / BLIP-2 / InstructBLIP, GIT, Kosmos-2,
SeamlessM4T, ...) has position tables for images, audio or speech units beside the text
ones. posenc builds text positions only. ``text_tower`` maps a composite's config to the
config whose ``model_type`` picks the text layout in ``posenc.hf.absolute``:

* a sub-config (``text_config``, BLIP-2's ``qformer_config``): its own ``model_type``
  (``"align_text_model"``, ``"blip_2_qformer"``, or the language model of BLIP-2, e.g.
  ``"opt"``);
* ``"."``: the composite's own config (GIT, LXMERT, VisualBERT, ViLT, TVP, SeamlessM4T,
  Perceiver: the text fields sit at the top level).

A family with more than one text tower whose layouts may differ (BLIP-2: the Q-Former and
the language model) needs ``tower=``; so do SpeechT5, whose text encoder posenc does not
build, and Perceiver, whose one config serves its text, image, audio and multimodal
models alike. Asking for a tower that is not text (``"vision_config"``) raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["TEXT_TOWERS", "UNBUILT_TOWERS", "text_tower"]

_TEXT = MappingProxyType({"text_config": "text_config"})
_QFORMER = MappingProxyType({"qformer_config": "qformer_config", "text_config": "text_config"})
_SELF = MappingProxyType({"text": "."})
_ENCODER_DECODER = MappingProxyType({"text_encoder": ".", "text_decoder": "."})

#: composite model_type -> {tower: a sub-config key, or "." for the composite's own config}.
TEXT_TOWERS: dict[str, Mapping[str, str]] = {
    **dict.fromkeys(("align", "altclip", "blip", "bridgetower", "chinese_clip"), _TEXT),
    **dict.fromkeys(("clap", "flava", "kosmos-2", "kosmos-2.5", "tipsv2"), _TEXT),
    **dict.fromkeys(("blip-2", "instructblip", "instructblipvideo"), _QFORMER),
    **dict.fromkeys(("git", "lxmert", "visual_bert", "vilt", "tvp", "perceiver"), _SELF),
    **dict.fromkeys(("seamless_m4t", "seamless_m4t_v2"), _ENCODER_DECODER),
    "speecht5": MappingProxyType({"text_decoder": "."}),
    "pp_formulanet": _TEXT,  # its text decoder: BART's table (offset 2)
}

_PERCEIVER_INPUTS = "positions of a Perceiver's {} preprocessor, not text; not built by posenc"

#: Towers of these families that posenc does not build, with the reason: a text tower with
#: other positions, or the non-text models that share the family's one config.
UNBUILT_TOWERS: dict[str, dict[str, str]] = {
    "speecht5": {
        "text_encoder": "a paper sinusoidal table scaled by a learned alpha plus relative "
        "position embeddings in every encoder attention; not built by posenc",
    },
    "perceiver": {
        kind: _PERCEIVER_INPUTS.format(kind) for kind in ("image", "audio", "multimodal")
    },
}


def text_tower(
    model_type: str, config: Mapping[str, Any], tower: str | None
) -> tuple[str, Mapping[str, Any]] | None:
    """The ``(model_type, config)`` of a composite's text tower, or None for other families.

    Args:
        model_type: the composite's ``model_type``.
        config: its config as a dict (sub-configs as dicts, as ``to_dict`` gives them).
        tower: a key of ``TEXT_TOWERS[model_type]``; None when the family has one text
            layout.

    Raises:
        ValueError: ``tower`` for a family without towers, a tower that is not text or
            that posenc does not build, ``tower=None`` where text towers differ, a
            missing sub-config or one without ``model_type``.
    """
    towers = TEXT_TOWERS.get(model_type)
    if towers is None:
        if tower is not None:
            raise ValueError(
                f"tower={tower!r} applies to the multimodal families "
                f"({', '.join(sorted(TEXT_TOWERS))}), not to model_type {model_type!r}"
            )
        return None
    unbuilt = UNBUILT_TOWERS.get(model_type, {})
    names = sorted(towers) + sorted(unbuilt)
    if tower is None:
        if len(set(towers.values())) > 1 or unbuilt:
            raise ValueError(
                f"{model_type} has positions in several towers ({', '.join(names)}): "
                "pass tower= (posenc.from_hf_config, posenc.hf.build_position_module)"
            )
        tower = next(iter(towers))
    if tower in unbuilt:
        raise ValueError(f"{model_type} tower {tower!r}: {unbuilt[tower]}")
    if tower not in towers:
        raise ValueError(
            f"{model_type} has no text tower {tower!r} (its towers: {', '.join(names)}); "
            "posenc builds text positions only, not image, audio or unit ones"
        )
    key = towers[tower]
    if key == ".":
        return model_type, config
    sub = config.get(key)
    if callable(getattr(sub, "to_dict", None)):  # a PretrainedConfig kept inside a dict
        sub = sub.to_dict()
    if not isinstance(sub, Mapping) or not isinstance(sub.get("model_type"), str):
        raise ValueError(f"{model_type} config has no {key} with a model_type")
    return sub["model_type"], sub
