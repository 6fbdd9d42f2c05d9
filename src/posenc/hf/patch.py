"""Run a loaded transformers model on posenc's RoPE: ``patch(model)`` and ``unpatch(model)``.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim. Rotary
models in transformers 5 share one wiring: the base model's ``rotary_emb`` turns
``position_ids [B, T]`` into ``position_embeddings = (cos, sin)`` once per forward (one pair
per layer type, e.g. Gemma 3's sliding and full layers), every decoder layer hands them to
its attention module, and that module calls its modeling file's ``apply_rotary_pos_emb(q, k,
cos, sin)`` before ``past_key_values.update``. ``patch`` changes only that model, in three
places, and ``unpatch`` puts each back:

* ``rotary_emb`` becomes a ``PatchedRotary`` holding one ``posenc.RotaryEmbedding`` per
  layer type (``posenc.rope_from_hf_config``): angles ``position * inv_freq`` in float64,
  any scaling (``scaling={"rope_type": "yarn", "factor": 4}``) without editing the config;
  it returns posenc's tables ``(cos, sin) [B, T, R/2]``;
* each attention module gets its own ``forward``: the class's code with a globals dict in
  which ``apply_rotary_pos_emb`` is ``posenc.apply_rope`` in the family's layout (Su et al.
  2021, "RoFormer", eq. 34), so nothing global changes and other models are untouched;
* forward hooks on the base model let ``PatchedRotary`` see the KV cache
  (``patch_cache.CacheTracker``).

Length policy (dynamic NTK, LongRoPE; Peng et al. 2023 sec. 3.2, Ding et al. 2024):
``"monotone"`` (default) starts each sequence (an empty or absent cache) from the original
frequencies, follows the longest length so far, and re-rotates the cached keys of every
``DynamicCache`` layer (``posenc.rerotate_keys``) when the frequencies change, so decoding
stays consistent with the keys it attends to; ``"transformers"`` reproduces transformers
(frequencies from each call's length, cached keys left as they were rotated).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from posenc.encodings.rotary.apply import apply_rope
from posenc.encodings.rotary.module import LENGTH_POLICIES, RotaryEmbedding
from posenc.hf.config import as_config_dict, config_family, rope_from_hf_config
from posenc.hf.patch_cache import CacheTracker

__all__ = ["PatchedRotary", "patch", "patch_encodings", "unpatch"]

_STATE = "_posenc_patch"
_ROTATE = "apply_rotary_pos_emb"
_KEEP = ("rope_theta", "partial_rotary_factor")
_ORIGINAL = "original_max_position_embeddings"


class PatchedRotary(nn.Module):
    """Stands in for a transformers ``rotary_emb``: posenc's cos/sin per layer type.

    Args:
        encodings: ``{layer_type: RotaryEmbedding}`` (key None for a single type).
        tracker: the KV-cache tracker of the length policy.
        original: the module replaced (kept as a child, so it follows ``.to()``).
    """

    def __init__(
        self,
        encodings: dict[str | None, RotaryEmbedding],
        tracker: CacheTracker,
        original: nn.Module,
    ) -> None:
        super().__init__()
        self.encodings = nn.ModuleDict({str(k): v for k, v in encodings.items()})
        self.tracker = tracker
        self.original = original

    def forward(
        self, x: Tensor, position_ids: Tensor, layer_type: str | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` of ``position_ids [B, T]``, each ``[B, T, R/2]`` (float32, or
        float64 for a float64 ``x``), after the length policy has run."""
        if str(layer_type) not in self.encodings:
            raise ValueError(
                f"layer_type={layer_type!r} has no rotary embedding; patched types: "
                f"{sorted(self.encodings)}"
            )
        encoding = self.encodings[str(layer_type)]
        self.tracker.observe(encoding, layer_type, position_ids)
        return encoding.cos_sin(position_ids.to(x.device), dtype=x.dtype)


@dataclass
class _Patch:
    parent: nn.Module
    original: nn.Module
    attentions: list[nn.Module]
    handles: list[Any]


def _rotate_qk(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1, *, interleaved: bool
) -> tuple[Tensor, Tensor]:
    """``apply_rotary_pos_emb`` on posenc's tables: q, k ``[B, H, T, D]`` (or ``[B, T, H, D]``
    with ``unsqueeze_dim=2``), cos/sin ``[B, T, R/2]``."""
    if unsqueeze_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    q, k = (
        apply_rope(q, cos, sin, interleaved=interleaved),
        apply_rope(k, cos, sin, interleaved=interleaved),
    )
    return (q.transpose(1, 2), k.transpose(1, 2)) if unsqueeze_dim == 2 else (q, k)


def _patched_forward(cls: type, interleaved: bool) -> types.FunctionType:
    """``cls.forward`` with ``apply_rotary_pos_emb`` bound to posenc's rotation."""
    fn = cls.forward
    namespace = dict(fn.__globals__)
    namespace[_ROTATE] = functools.partial(_rotate_qk, interleaved=interleaved)
    new = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    return new


def _rotating(module: nn.Module) -> bool:
    fn = getattr(type(module), "forward", None)
    return isinstance(fn, types.FunctionType) and _ROTATE in fn.__code__.co_names


def _find_rotary(model: nn.Module, model_type: str) -> nn.Module:
    """The module whose ``rotary_emb`` child computes the model's cos/sin."""
    found = [name for name, _ in model.named_modules() if name.rsplit(".", 1)[-1] == "rotary_emb"]
    if len(found) != 1:
        raise ValueError(
            f"model_type {model_type!r} is not supported by posenc.hf.patch: expected one "
            f"rotary_emb module in the model, found {len(found)}"
        )
    return model.get_submodule(found[0].rpartition(".")[0])


def _layer_types(cfg: Mapping[str, Any]) -> list[str | None]:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    nested = bool(params) and all(v is None or isinstance(v, Mapping) for v in params.values())
    return sorted(k for k, v in params.items() if v is not None) if nested else [None]


def _with_scaling(
    cfg: dict[str, Any], types_: list[str | None], scaling: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``cfg`` whose rope parameters are replaced by ``scaling`` (theta and partial kept)."""
    if scaling is None:
        return cfg
    if not isinstance(scaling, Mapping):
        raise TypeError(
            "scaling must be a dict such as {'rope_type': 'yarn', 'factor': 4}, "
            f"got {type(scaling).__name__}"
        )
    per_type = types_ != [None] and set(scaling) <= set(types_) and bool(scaling)
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}

    def merged(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
        kept = {k: old[k] for k in _KEEP if old.get(k) is not None}
        for key in _KEEP:
            if key not in kept and cfg.get(key) is not None:
                kept[key] = cfg[key]
        return {**kept, **new}

    if types_ == [None]:
        new_params: dict[str, Any] = merged(params, scaling)
    else:
        new_params = {
            t: merged(params[t], scaling[t] if per_type else scaling)
            if (not per_type or t in scaling)
            else params[t]
            for t in types_
        }
    cfg = {**cfg, "rope_parameters": new_params, "rope_scaling": None}
    if not per_type and scaling.get(_ORIGINAL) is not None and cfg.get(_ORIGINAL) is not None:
        cfg[_ORIGINAL] = scaling[_ORIGINAL]  # read before the dict's (Phi-3): the user's wins
    return cfg


def patch_encodings(
    config: object, *, scaling: Mapping[str, Any] | None = None, length_policy: str = "monotone"
) -> tuple[dict[str | None, RotaryEmbedding], str, dict[str, Any]]:
    """The rotary tables ``patch`` would install, without a model (to check a scaling).

    Args:
        config: a ``config.json`` dict or a ``PretrainedConfig``.
        scaling: as for ``patch``.
        length_policy: ``"monotone"`` or ``"transformers"``.

    Returns:
        ``({layer_type or None: RotaryEmbedding}, model_type, config dict with the scaling)``.

    Raises:
        ValueError: an unsupported family, or a scaling it cannot take (both named).
        TypeError: ``scaling`` not a dict.
    """
    cfg, fam = config_family(config)
    model_type = str(cfg.get("model_type"))
    if fam.scheme is not None or fam.layers is not None:
        raise ValueError(
            f"model_type {model_type!r} is not supported by posenc.hf.patch: its positions "
            f"differ from one rotary table per layer type ({fam.scheme or fam.layers})"
        )
    types_ = _layer_types(cfg)
    cfg = _with_scaling(cfg, types_, scaling)
    try:
        encodings = {
            t: rope_from_hf_config(cfg, layer_type=t, length_policy=length_policy) for t in types_
        }
    except ValueError as exc:
        raise ValueError(f"model_type {model_type!r}: {exc}") from exc
    return encodings, model_type, cfg


def patch(
    model: nn.Module,
    *,
    scaling: Mapping[str, Any] | None = None,
    length_policy: str | None = None,
) -> nn.Module:
    """Replace the positional machinery of a loaded transformers model with posenc's.

    Args:
        model: a transformers RoPE model (``LlamaForCausalLM``, ``Gemma3ForCausalLM`` ...).
        scaling: None keeps the config's scaling; an HF-style dict (``{"rope_type":
            "yarn", "factor": 4}``; ``original_max_position_embeddings`` defaults to the
            config's ``max_position_embeddings``) replaces it for every layer type, or a
            dict per layer type (``{"full_attention": {...}}``) for those named. The
            config's ``rope_theta`` and ``partial_rotary_factor`` are kept.
        length_policy: ``"monotone"`` (None: the default) or ``"transformers"`` (module
            docstring); only dynamic NTK and LongRoPE depend on it.

    Returns:
        ``model``, patched in place.

    Raises:
        ValueError: a model already patched; an unsupported family (named), a model
            without one ``rotary_emb`` or without attention modules calling
            ``apply_rotary_pos_emb``; a scaling the family's config cannot take (the
            model_type and the bad value named); an unknown ``length_policy``.
        TypeError: ``model`` not an ``nn.Module`` with a config; ``scaling`` not a dict.
    """
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers model, got {type(model).__name__}")
    if hasattr(model, _STATE):
        raise ValueError("model is already patched by posenc; call posenc.hf.unpatch(model) first")
    policy = "monotone" if length_policy is None else length_policy
    if policy not in LENGTH_POLICIES:
        raise ValueError(f"length_policy must be one of {LENGTH_POLICIES}, got {length_policy!r}")
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    encodings, model_type, cfg = patch_encodings(
        as_config_dict(config), scaling=scaling, length_policy=policy
    )
    parent = _find_rotary(model, model_type)
    attentions = [m for m in model.modules() if _rotating(m)]
    if not attentions:
        raise ValueError(
            f"model_type {model_type!r} is not supported by posenc.hf.patch: no attention "
            f"module calls {_ROTATE}"
        )
    interleaved = next(iter(encodings.values())).interleaved
    tracker = CacheTracker(None if None in encodings else cfg.get("layer_types"), policy)
    original = parent.rotary_emb
    rotary = PatchedRotary(encodings, tracker, original)
    forwards: dict[type, types.FunctionType] = {}
    for module in attentions:
        cls = type(module)
        forwards.setdefault(cls, _patched_forward(cls, interleaved))
        module.forward = types.MethodType(forwards[cls], module)
    parent.rotary_emb = rotary
    signature = inspect.signature(parent.forward)
    handles = [
        parent.register_forward_pre_hook(tracker.pre_hook(signature, rotary), with_kwargs=True),
        parent.register_forward_hook(tracker.post_hook(rotary)),
    ]
    object.__setattr__(model, _STATE, _Patch(parent, original, attentions, handles))
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo ``patch``: the original ``rotary_emb``, attention forwards and no hooks.

    Raises:
        ValueError: ``model`` is not patched.
    """
    state = getattr(model, _STATE, None)
    if state is None:
        raise ValueError("model is not patched by posenc (posenc.hf.patch was not called)")
    for handle in state.handles:
        handle.remove()
    for module in state.attentions:
        del module.__dict__["forward"]
    state.parent.rotary_emb = state.original
    object.__delattr__(model, _STATE)
    return model
