"""Run a loaded transformers model on posenc's RoPE: ``patch(model)`` and ``unpatch(model)``.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim. Rotary
models in transformers 5 share one wiring: the base model's ``rotary_emb`` turns
``position_ids [B, T]`` into ``position_embeddings = (cos, sin)`` once per forward (one pair
per layer type, e.g. Gemma 3's sliding and full layers), every decoder layer hands them to
its attention module, and that module calls its modeling file's ``apply_rotary_pos_emb(q, k,
cos, sin)`` before ``past_key_values.update``. ``patch`` changes only that model, in four
places, and ``unpatch`` puts each back:

* ``rotary_emb`` becomes a ``PatchedRotary`` holding one ``posenc.RotaryEmbedding`` per
  layer type (``posenc.rope_from_hf_config``): angles ``position * inv_freq`` in float64,
  any scaling (``scaling={"rope_type": "yarn", "factor": 4}``) without editing the config;
  it returns posenc's tables ``(cos, sin) [B, T, R/2]``;
* each attention module gets its own ``forward``: the class's code with a globals dict in
  which ``apply_rotary_pos_emb`` is ``posenc.apply_rope`` in the family's layout (Su et al.
  2021, "RoFormer", eq. 34), so nothing global changes and other models are untouched;
* forward hooks on the base model let ``PatchedRotary`` see the KV cache
  (``patch_cache.CacheTracker``);
* its ``save_pretrained`` writes the rope parameters the patch runs (``patch_save``).

Length policy (dynamic NTK, LongRoPE; Peng et al. 2023 sec. 3.2, Ding et al. 2024):
``"transformers"`` (default: a drop-in gives the model's own outputs) reproduces
transformers (frequencies from each call's length, cached keys left as they were rotated);
``"monotone"`` (opt-in) starts each sequence (an empty or absent cache) from the original
frequencies and follows the longest length so far; when a cached forward changes the
frequencies, the cache is recomputed with the new ones first (``patch_cache``), so every
decoding step equals a full forward over the sequence, for any number of layers.

Numerics: posenc forms the angles and cos/sin in float64 and rotates float32 inputs in
float32 (bf16 and fp16 inputs in float32, rounded once), where transformers forms ``position
* inv_freq`` in float32 and rotates in the model's dtype. The tables are handed out in the
original's width and dtype (bf16 in a bf16 model, as transformers' own), so that a forward
running in another thread while ``patch``/``unpatch`` swaps the modules stays consistent. In
float32 a patched model's logits equal the original's to float32 rounding (a tolerance
growing with the length and the layers) and its greedy tokens are identical in the tests. In
bfloat16 they are not identical: each model rounds differently at every layer, so the
patched and the original bf16 models are about equally far from the float32 model (the tests
bound the patched one's error by twice the original's) and greedy tokens may differ where
two logits are within bf16 rounding.
"""

from __future__ import annotations

import copy
import functools
import inspect
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc._checks import check_bool
from posenc.encodings.rotary.module import LENGTH_POLICIES, RotaryEmbedding
from posenc.encodings.rotary.temperature import PositionTemperature
from posenc.hf.config import as_config_dict, config_family, rope_from_hf_config
from posenc.hf.layers import from_hf_config
from posenc.hf.normalize import ReadConfig
from posenc.hf.patch_cache import NOT_PICKLED, CacheTracker, TrackerPostHook, TrackerPreHook
from posenc.hf.patch_rotation import (
    Rotation,
    TableFormat,
    measure_rotation,
    measure_tables,
    rebind,
    rotation_methods,
)
from posenc.hf.patch_save import PatchedSave

__all__ = ["PatchedRotary", "patch", "patch_encodings", "unpatch"]

_STATE = "_posenc_patch"
PROBE_LENGTH = 8
# per-layer rules whose layers need tables of their own (the others only say which layers
# rotate, which the model's own attention code decides)
_PER_LAYER_TABLES = ("layer_rope_theta", "rope_scaling_layers")
# schemes whose layers still take one rotary table per layer type
_ONE_TABLE_SCHEMES = ("proportional", "temperature")
_HOOKS = (TrackerPreHook, TrackerPostHook)
_KEEP = ("rope_theta", "partial_rotary_factor")
_ORIGINAL = "original_max_position_embeddings"


class PatchedRotary(nn.Module):
    """Stands in for a transformers ``rotary_emb``: posenc's cos/sin per layer type.

    Args:
        encodings: ``{layer_type: RotaryEmbedding}`` (key None for a single type).
        tracker: the KV-cache tracker of the length policy.
        original: the module replaced (kept as a child, so it follows ``.to()``).
        arrangement: how the original hands out its tables, which the attention modules
            unpack: ``"cos_sin"``, ``"sin_cos"`` (GPT-J) or ``"complex"`` (``freqs_cis``).
        tables: the width and dtype of the original's cos/sin tables (measured), which
            this module's tables take, so that an attention module gets the same format
            before, during and after a patch.
    """

    def __init__(
        self,
        encodings: dict[str | None, RotaryEmbedding],
        tracker: CacheTracker,
        original: nn.Module,
        arrangement: str = "cos_sin",
        tables: TableFormat | None = None,
    ) -> None:
        super().__init__()
        self.encodings = nn.ModuleDict({str(k): v for k, v in encodings.items()})
        self.tracker = tracker
        self.original = original
        self.arrangement = arrangement
        self.tables = TableFormat() if tables is None else tables

    def __getattr__(self, name: str) -> Any:
        """Attributes the model reads from its rotary module (``layer_types`` ...) come
        from the original."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["original"], name)

    def forward(
        self, x: Tensor, position_ids: Tensor, layer_type: str | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The tables of ``position_ids [B, T]`` in the original's arrangement, width and
        dtype (``[B, T, R/2]`` or ``[B, T, R]``; ``x``'s dtype for most families), after the
        length policy ran; angles and cos/sin in float64, rounded once."""
        if str(layer_type) not in self.encodings:
            raise ValueError(
                f"layer_type={layer_type!r} has no rotary embedding; patched types: "
                f"{sorted(self.encodings)}"
            )
        encoding = self.encodings[str(layer_type)]
        self.tracker.observe(encoding, layer_type, position_ids)
        cos, sin = encoding.cos_sin(position_ids.to(x.device), dtype=x.dtype)
        if self.arrangement == "complex":
            return torch.complex(cos, sin)
        cos, sin = self.tables.expand(cos, x.dtype), self.tables.expand(sin, x.dtype)
        return (sin, cos) if self.arrangement == "sin_cos" else (cos, sin)


@dataclass
class _Patch:
    parent: nn.Module
    original: nn.Module
    methods: list[tuple[nn.Module, str]]


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
    if not isinstance(params, Mapping):
        raise ValueError(
            f"rope_parameters must be a dict (or a dict per layer type), got "
            f"{type(params).__name__} {params!r:.80}"
        )
    nested = bool(params) and all(v is None or isinstance(v, Mapping) for v in params.values())
    if not nested:
        return [None]
    types_ = sorted(k for k, v in params.items() if v is not None)
    used = cfg.get("layer_types")
    if isinstance(used, list) and set(used) & set(types_):
        # the model builds tables for its layers' types only (Gemma 3 all sliding)
        types_ = [t for t in types_ if t in used]
    return types_


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
    cfg = ReadConfig({**cfg, "rope_parameters": new_params, "rope_scaling": None})
    if not per_type and scaling.get(_ORIGINAL) is not None and cfg.get(_ORIGINAL) is not None:
        cfg[_ORIGINAL] = scaling[_ORIGINAL]  # read before the dict's (Phi-3): the user's wins
    return cfg


def patch_encodings(
    config: object,
    *,
    scaling: Mapping[str, Any] | None = None,
    length_policy: str = "transformers",
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
    if fam.scheme not in (None, *_ONE_TABLE_SCHEMES) or fam.layers in _PER_LAYER_TABLES:
        raise ValueError(
            f"model_type {model_type!r} is not supported by posenc.hf.patch: its positions "
            f"differ from one rotary table per layer type ({fam.scheme or fam.layers})"
        )
    types_ = _layer_types(cfg)
    cfg = _with_scaling(cfg, types_, scaling)
    try:
        if fam.scheme is None:
            encodings = {
                t: rope_from_hf_config(cfg, layer_type=t, length_policy=length_policy)
                for t in types_
            }
        else:
            encodings = {t: _scheme_rotary(cfg, t, length_policy) for t in types_}
    except ValueError as exc:
        raise ValueError(f"model_type {model_type!r}: {exc}") from exc
    return encodings, model_type, cfg


def _scheme_rotary(cfg: dict[str, Any], layer_type: str | None, policy: str) -> RotaryEmbedding:
    """The rotary table of a one-table scheme's layer type: proportional RoPE (Gemma 4), or
    the rotation of a query-temperature scheme (Ministral 3: its attention code scales the
    queries itself, outside the rotation that patch replaces)."""
    encoding = from_hf_config(cfg, layer_type=layer_type)
    parts = getattr(encoding, "encodings", None) or [encoding]
    rotary = [p for p in parts if isinstance(p, RotaryEmbedding)]
    others = [p for p in parts if not isinstance(p, (RotaryEmbedding, PositionTemperature))]
    if len(rotary) != 1 or others:
        raise ValueError(f"layer type {layer_type!r} has no single rotary table ({encoding})")
    if rotary[0].scaling.length_dependent and rotary[0].length_policy != policy:
        raise ValueError(
            f"the {rotary[0].scaling.rope_type} scaling of this scheme follows the "
            f"{rotary[0].length_policy!r} length policy, not {policy!r}"
        )
    return rotary[0]


def _text_config(model: nn.Module) -> Any:
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _refuse_nested(model: nn.Module) -> None:
    for name, module in model.named_modules():
        if hasattr(module, _STATE):
            where = f"its submodule {name!r} is" if name else "model is"
            raise ValueError(
                f"{where} already patched by posenc; call posenc.hf.unpatch on it first"
            )
        if isinstance(module.__dict__.get("forward"), _PatchedMethod):
            raise ValueError(
                "model is part of a model patched by posenc (its attention modules run "
                "posenc's rotation); call posenc.hf.unpatch on that model first"
            )


class _PatchedMethod:
    """A module's method rebuilt on posenc's rotation, bound to that module.

    A deep copy binds the copy's module; pickling is refused by name (the rebuilt code has
    no importable name): unpatch first, or save weights with ``save_pretrained``. Under
    ``torch.compile`` these methods run eagerly (a graph break around each patched
    attention module; the rest of the model compiles), since dynamo's guards assume a
    function's globals are its module's."""

    def __init__(self, function: types.FunctionType, module: nn.Module) -> None:
        self.function, self.module = function, module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # eager under compile: see below
        return self.function(self.module, *args, **kwargs)

    def __deepcopy__(self, memo: dict) -> _PatchedMethod:
        return _PatchedMethod(self.function, copy.deepcopy(self.module, memo))

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(NOT_PICKLED)


def _arrangement(
    original: nn.Module, encodings: dict, width_x: int
) -> tuple[str, Any, str, Tensor | None]:
    """How ``original`` hands out its tables, what it gives for positions ``[[0, 1, 2]]``,
    the layer type measured, and its cos table for a bfloat16 input (None: complex)."""
    layer_type = next(iter(encodings))
    tensor = next(iter(original.buffers()), None)
    device = tensor.device if tensor is not None else torch.device("cpu")
    x = torch.zeros(1, 3, width_x, device=device)
    positions = torch.arange(3, device=device)[None]

    def tables(x: Tensor) -> Any:
        return original(x, positions) if layer_type is None else original(x, positions, layer_type)

    real = tables(x)
    if isinstance(real, Tensor) and real.is_complex():
        return "complex", real, str(layer_type), None
    if not (isinstance(real, tuple) and len(real) == 2):
        raise ValueError(f"rotary_emb returned {type(real).__name__}, not (cos, sin)")
    zero = [bool((table[..., 0, :] == 0).all()) for table in real]  # sin(0) = 0
    arrangement = "sin_cos" if zero == [True, False] else "cos_sin"
    cos_16bit = tables(x.to(torch.bfloat16))[int(arrangement == "sin_cos")]
    return arrangement, real, str(layer_type), cos_16bit


def _rotations(
    attentions: dict[nn.Module, dict[str, tuple[str, ...]]],
    original: nn.Module,
    encodings: dict[str | None, RotaryEmbedding],
    model_type: str,
) -> tuple[str, TableFormat, dict[tuple[str, str], Rotation]]:
    """The arrangement and format of the tables and a measured ``Rotation`` per rotation
    function."""
    some = next(iter(encodings.values()))
    try:
        arrangement, real, layer_type, cos_16bit = _arrangement(original, encodings, some.head_dim)
        encoding = encodings[None if layer_type == "None" else layer_type]
        cos, sin = encoding.cos_sin(torch.arange(3)[None], dtype=torch.float32)
        tables = TableFormat()
        if cos_16bit is not None:
            tables = measure_tables(real[int(arrangement == "sin_cos")].cpu(), cos, cos_16bit)
    except Exception as exc:
        raise ValueError(
            f"model_type {model_type!r} is not supported by posenc.hf.patch: its rotary_emb "
            f"could not be measured ({type(exc).__name__}: {exc})"
        ) from exc
    floating = [b.dtype for b in original.buffers() if b.is_floating_point()]
    precision = max(floating, key=lambda d: torch.finfo(d).eps, default=torch.float32)
    found: dict[tuple[str, str], Rotation] = {}
    for module, methods in attentions.items():
        for method, names in methods.items():
            namespace = inspect.unwrap(getattr(type(module), method)).__globals__
            for name in names:
                key = (namespace["__name__"], name)
                if key in found:
                    continue
                try:
                    found[key] = measure_rotation(
                        namespace[name],
                        real,
                        cos,
                        sin,
                        arrangement=arrangement,
                        precision=precision,
                        table_format=tables,
                    )
                except ValueError as exc:
                    raise ValueError(
                        f"model_type {model_type!r} is not supported by posenc.hf.patch: "
                        f"its rotation {exc}"
                    ) from exc
    return arrangement, tables, found


@functools.cache
def _run_eagerly_under_compile() -> None:
    """Mark ``_PatchedMethod.__call__`` for dynamo to run eagerly (it cannot guard on rebuilt
    globals); done by the first patch, not at import: ``torch.compiler.disable`` imports
    ``torch._dynamo``, which costs about as much CPU time as ``import torch``."""
    _PatchedMethod.__call__ = torch.compiler.disable(_PatchedMethod.__call__)


def _install(
    attentions: dict[nn.Module, dict[str, tuple[str, ...]]],
    rotations: dict[tuple[str, str], Rotation],
) -> list[tuple[nn.Module, str]]:
    _run_eagerly_under_compile()
    rebuilt: dict[tuple[type, str], types.FunctionType] = {}
    installed = []
    for module, methods in attentions.items():
        for method, names in methods.items():
            key = (type(module), method)
            if key not in rebuilt:
                function = getattr(type(module), method)
                module_name = inspect.unwrap(function).__globals__["__name__"]
                replacements = {name: rotations[(module_name, name)] for name in names}
                rebuilt[key] = rebind(function, replacements)
            module.__dict__[method] = _PatchedMethod(rebuilt[key], module)
            installed.append((module, method))
    return installed


def _output(result: Any) -> Tensor:
    for name in ("logits", "last_hidden_state"):
        value = getattr(result, name, None)
        if isinstance(value, Tensor):
            return value
    return result[0]


def _probe_ids(model: nn.Module) -> Tensor:
    """``[1, PROBE_LENGTH]`` token ids spread over the model's vocabulary."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embedding, "weight", None)
    vocab = weight.shape[0] if weight is not None else 2
    device = weight.device if weight is not None else torch.device("cpu")
    return (torch.arange(PROBE_LENGTH, device=device) * 7 % vocab)[None]


def _probe(model: nn.Module, ids: Tensor) -> Tensor:
    with torch.no_grad():
        return _output(model(input_ids=ids, use_cache=False)).float()


def _verify(
    model: nn.Module, ids: Tensor, expected: Tensor, rotations: dict, model_type: str
) -> None:
    """Raise unless the patched model rotated and reproduced the original's output."""
    try:
        got = _probe(model, ids)
    except Exception as exc:
        raise ValueError(
            f"model_type {model_type!r} is not supported by posenc.hf.patch: the patched model "
            f"fails a probe forward ({type(exc).__name__}: {exc})"
        ) from exc
    if not any(rotation.calls for rotation in rotations.values()):
        raise ValueError(
            f"model_type {model_type!r} is not supported by posenc.hf.patch: the probe forward "
            "called none of posenc's rotations"
        )
    dtype = next(model.parameters()).dtype
    layers = getattr(_text_config(model), "num_hidden_layers", 1) or 1
    eps = torch.finfo(dtype if dtype.is_floating_point else torch.float32).eps
    tolerance = min(16 * (PROBE_LENGTH + layers) * eps, 0.1) * max(float(expected.abs().max()), 1.0)
    error = float((got - expected).abs().max())
    if not error <= tolerance:  # NaN fails too
        raise ValueError(
            f"model_type {model_type!r} is not supported by posenc.hf.patch: the patched "
            f"model's probe output differs from the original's by {error:.3g} "
            f"(tolerance {tolerance:.3g})"
        )


def patch(
    model: nn.Module,
    *,
    scaling: Mapping[str, Any] | None = None,
    length_policy: str | None = None,
    verify: bool = True,
) -> nn.Module:
    """Replace the positional machinery of a loaded transformers model with posenc's.

    Args:
        model: a transformers RoPE model (``LlamaForCausalLM``, ``Gemma3ForCausalLM`` ...).
        scaling: None keeps the config's scaling; an HF-style dict (``{"rope_type":
            "yarn", "factor": 4}``; ``original_max_position_embeddings`` defaults to the
            config's ``max_position_embeddings``) replaces it for every layer type, or a
            dict per layer type (``{"full_attention": {...}}``) for those named. The
            config's ``rope_theta`` and ``partial_rotary_factor`` are kept.
        length_policy: ``"transformers"`` (None: the default, the model's own outputs) or
            ``"monotone"`` (module docstring); only dynamic NTK and LongRoPE depend on it.
        verify: run a probe forward of ``PROBE_LENGTH`` tokens before and after patching
            with the config's own scaling: the patched model must call posenc's rotation
            and give the original's output (to a tolerance from the model's dtype), or it
            is unpatched and refused. ``False`` skips it (a model too large to run twice).

    Returns:
        ``model``, patched in place.

    Raises:
        ValueError: a model (or a part of it) already patched; an unsupported family
            (named, with the reason), a model without one ``rotary_emb`` or without
            attention modules calling a rotation function, one whose probe fails; a
            scaling the family's config cannot take (the model_type and the bad value
            named); an unknown ``length_policy``.
        TypeError: ``model`` not an ``nn.Module`` with a config; ``scaling`` not a dict.
    """
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers model, got {type(model).__name__}")
    check_bool("verify", verify)
    policy = "transformers" if length_policy is None else length_policy
    if policy not in LENGTH_POLICIES:
        raise ValueError(f"length_policy must be one of {LENGTH_POLICIES}, got {length_policy!r}")
    _refuse_nested(model)
    config = as_config_dict(_text_config(model))
    encodings, model_type, run = patch_encodings(config, scaling=scaling, length_policy=policy)
    own, _, _ = patch_encodings(config, length_policy=policy) if scaling else (encodings, 0, 0)
    parent = _find_rotary(model, model_type)
    attentions = {m: found for m in parent.modules() if (found := rotation_methods(type(m)))}
    if not attentions:
        raise ValueError(
            f"model_type {model_type!r} is not supported by posenc.hf.patch: no attention "
            "module calls a rotation function (apply_rotary_pos_emb or a variant)"
        )
    original = parent.rotary_emb
    arrangement, tables, rotations = _rotations(attentions, original, own, model_type)
    ids = _probe_ids(model) if verify else None
    expected = _probe(model, ids) if verify else None
    dependent = any(e.scaling.length_dependent for e in (*encodings.values(), *own.values()))
    tracker = CacheTracker(policy, dependent)
    rotary = PatchedRotary(own, tracker, original, arrangement, tables)
    methods = _install(attentions, rotations)
    parent.rotary_emb = rotary
    signature = inspect.signature(parent.forward)
    parent.register_forward_pre_hook(TrackerPreHook(tracker, signature, rotary), with_kwargs=True)
    parent.register_forward_hook(TrackerPostHook(tracker), always_call=True)
    object.__setattr__(model, _STATE, _Patch(parent, original, methods))
    monotone = policy == "monotone" and any(e.scaling.length_dependent for e in encodings.values())
    saver = PatchedSave(model, run, scaled=scaling is not None, monotone=monotone)
    object.__setattr__(model, "save_pretrained", saver)  # the patch's rope config (patch_save)
    if verify:
        try:
            _verify(model, ids, expected, rotations, model_type)
        except ValueError:
            unpatch(model)
            raise
    rotary.encodings = nn.ModuleDict({str(k): v for k, v in encodings.items()})
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo ``patch``: the original ``rotary_emb``, methods and no hooks.

    Raises:
        ValueError: ``model`` is not patched.
    """
    state = getattr(model, _STATE, None)
    if state is None:
        raise ValueError("model is not patched by posenc (posenc.hf.patch was not called)")
    hooks = (state.parent._forward_pre_hooks, state.parent._forward_hooks)
    for registry in hooks:
        for key in [k for k, h in registry.items() if isinstance(h, _HOOKS)]:
            del registry[key]
            state.parent._forward_hooks_with_kwargs.pop(key, None)
            state.parent._forward_pre_hooks_with_kwargs.pop(key, None)
    for module, method in state.methods:
        module.__dict__.pop(method, None)
    state.parent.rotary_emb = state.original
    object.__delattr__(model, _STATE)
    model.__dict__.pop("save_pretrained", None)
    return model
