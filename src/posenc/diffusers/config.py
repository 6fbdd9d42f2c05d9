"""The one door for diffusers configs: normalise, then look the class up in the table.

A config is a diffusers model's ``config.json`` as a dict (its ``_class_name`` names the
model class), a model or its ``.config`` (diffusers ``ConfigMixin`` / ``FrozenDict``), or
just a class name. When diffusers is installed, the class's own ``__init__`` defaults fill
the keys a config leaves out (as ``from_config`` does), so a bare class name gives the
released default; without diffusers every key the family reads must be given.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from posenc._checks import check_int
from posenc.base import PositionalEncoding
from posenc.diffusers.families import family_of

__all__ = ["diffusers_positions", "from_diffusers", "normalize_config"]


def _class_defaults(class_name: str) -> dict[str, Any]:
    """The keyword defaults of ``diffusers.<class_name>.__init__``; empty without diffusers."""
    try:
        import diffusers
    except ImportError:
        return {}
    cls = getattr(diffusers, class_name, None)
    if cls is None:
        return {}
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def normalize_config(config: object, **overrides: Any) -> tuple[str, dict[str, Any]]:
    """``(class_name, config dict)``: defaults, then ``config``'s keys, then ``overrides``.

    Raises:
        TypeError: ``config`` not a class name, mapping or diffusers model / config.
        ValueError: a mapping without ``_class_name``.
    """
    if isinstance(config, str):
        class_name, given = config, {}
    elif isinstance(config, Mapping):
        if "_class_name" not in config:
            raise ValueError(
                "a diffusers config needs '_class_name' (the model class), got keys "
                f"{sorted(config)}"
            )
        class_name, given = str(config["_class_name"]), dict(config)
    elif isinstance(getattr(config, "config", None), Mapping):  # a model: ConfigMixin
        class_name, given = type(config).__name__, dict(config.config)
    else:
        raise TypeError(
            "config must be a diffusers class name, a config.json dict or a diffusers model, "
            f"got {type(config).__name__}"
        )
    merged = {**_class_defaults(class_name), **given, **overrides}
    merged.pop("self", None)
    return class_name, merged


def from_diffusers(config: object, **overrides: Any) -> PositionalEncoding:
    """The posenc module of a diffusers model's positions: ``AxialRope`` for the RoPE
    families, ``MRoPE`` for Ideogram 4, ``GridSinCos`` for N-D sin-cos tables,
    ``SinusoidalPositionalEncoding`` or ``NoPE`` (``posenc.diffusers.families``).

    Args:
        config: a class name (``"FluxTransformer2DModel"``), a ``config.json`` dict with
            ``_class_name``, or a diffusers model.
        **overrides: config keys to replace (``attention_head_dim=64``).

    Raises:
        ValueError: a class not in the table, or a config missing a key the family reads.
        TypeError: see ``normalize_config``.
    """
    class_name, merged = normalize_config(config, **overrides)
    return family_of(class_name).build(merged)


def diffusers_positions(
    config: object, *, frames: int = 1, height: int, width: int, **overrides: Any
) -> Tensor:
    """The positions of a model's image/video tokens on a grid of ``frames x height x
    width`` patches (``N = F H W``), as its pipeline builds them, in the shape its module
    takes: ``[N, A]`` (``AxialRope``, ``GridSinCos``), ``[3, N]`` (Ideogram 4's ``MRoPE``) or
    ``[F]`` (the temporal layers' 1-D table).

    Keys a pipeline takes from the call rather than the config go in ``overrides``:
    ``caption_length`` (Lumina 2, Z-Image, Qwen-Image 2.1), ``rope_offsets`` and
    ``rope_stride`` (Wan-Animate 2), ``scale_factor`` (Kandinsky), ``linear_factor``
    (Lumina-Next; its ``ntk_factor`` goes to ``from_diffusers``).

    Raises:
        ValueError: a size below 1; see ``from_diffusers``.
    """
    sizes = [check_int(n, v) for n, v in (("frames", frames), ("height", height), ("width", width))]
    class_name, merged = normalize_config(config, **overrides)
    return family_of(class_name).positions(merged, *sizes)
