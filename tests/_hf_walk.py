"""The rotary embeddings of the installed transformers, found by walking its model packages.

Every ``transformers.models.<family>.modeling_*`` module that defines a class named
``*RotaryEmbedding`` contributes one ``RotaryCase`` per such class, keyed by the
``model_type`` of the config class the rotary module takes (its ``__init__`` annotation).
``run_case`` builds that config with its defaults (tiny tensors only: the rotary module
holds ``inv_freq``, nothing sized by ``hidden_size``), and compares
``posenc.from_hf_config`` with the family's own module and rotation function, at the
positions the encoding takes:

* RoPE: q/k at text positions ``0..T-1`` and ``OFFSET + 0..T-1``; with a query
  temperature (``Compose``, Ministral 3 / Mistral 4) the family's
  ``get_llama_4_attn_scale`` scales its queries, as its attention does, and the norms are
  compared too (free of the angles' float32 error); Mistral 4's ``MLARope`` against the
  rotation of the last ``qk_rope_head_dim`` features; a layer without rotation (NoPE,
  Llama 4's NoPE-layer temperature: ``test_schemes_transformers``) is not compared here;
* M-RoPE (``posenc.MRoPE``, ``A`` axes): q/k at text positions (equal on every axis), at
  random axis positions ``[A, B, T]`` (0..299, and ``OFFSET`` + that) and at the positions
  of a text + image + text sequence (``posenc.mrope_position_ids``);
* 2-D axial (``posenc.AxialRope``, vision towers): cos/sin at random patch positions
  ``[N, 2]``, and q/k through ``apply_rotary_pos_emb_vision`` where the module has it.

It returns the largest error relative to the dtype-derived tolerance.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``N`` patches, ``A`` axes, ``D`` head_dim,
``R`` rotary dim.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
import random
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

import posenc
from posenc.hf.config import config_family

OFFSET = 100_000
LENGTH = 8
EPS32 = torch.finfo(torch.float32).eps
_ORIGINAL = "original_max_position_embeddings"
SPAN = 300  # random M-RoPE axis positions 0..SPAN-1 (an image grid's range)
PATCHES = 64  # random axial patch positions 0..PATCHES-1
DINO_GRID = (4, 3)  # EoMT-DINOv3's patch grid, EfficientLoFTR's aggregated grid
#: a text + image (2 frames of 4 x 6 patches, merged 2 x 2) + text sequence
MIXED = ([3, (2, 4, 6), 3], 2)
#: GLM-4V's default sections ([8, 12, 12]) assume the half-rotated 128-feature heads of the
#: releases
HALF_ROTARY = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
#: Qwen3-Omni's text models (thinker, talker): 128-feature heads, interleaved sections
QWEN3_OMNI_TEXT = {
    "head_dim": 128,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        "mrope_section": [24, 20, 20],
        "interleaved": True,
        "mrope_interleaved": True,
    },
}
#: HunYuan dense / MoE checkpoints' rope dict: a fixed NTK-alpha base written as "dynamic"
#: (transformers' ntk_alpha reads head_dim, which the checkpoints set)
HUNYUAN_ALPHA = {
    "head_dim": 128,
    "rope_parameters": {
        "rope_type": "dynamic",
        "alpha": 1000.0,
        "factor": 1.0,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "rope_theta": 10000.0,
    },
}
# default configs that do not describe a buildable model: the fields of a real checkpoint,
# by case id or by family (every case of it)
CONFIG_FIELDS = {
    **dict.fromkeys(("hunyuan_v1_dense", "hunyuan_v1_moe"), HUNYUAN_ALPHA),
    "glm4_moe": {"head_dim": 128},  # GLM-4.5: 4096 / 96 heads is not its head dim
    "esm": {"position_embedding_type": "rotary"},  # ESM-2 (the default is absolute)
    "zamba2": {"use_mem_rope": True},  # its rotary module runs only with use_mem_rope
    # Granite 4 hybrid: the default is all Mamba layers (no attention to rotate) and NoPE;
    # one of each, with RoPE
    "granitemoehybrid": {
        "layer_types": ["mamba", "attention"],
        "num_hidden_layers": 2,
        "position_embedding_type": "rope",
    },
    # GPT-J and CodeGen keep a sin/cos table of n_positions rows: room for the offset
    **{name: {"n_positions": OFFSET + 2 * LENGTH} for name in ("gptj", "codegen")},
    "llama4/Llama4VisionRotaryEmbedding": {"image_size": 56, "patch_size": 14},  # 4 x 4 patches
    # DeepSeek-V4 with each of its layer types (the default has no sliding-window layer)
    "deepseek_v4": {
        "num_hidden_layers": 3,
        "layer_types": [
            "sliding_attention",
            "compressed_sparse_attention",
            "heavily_compressed_attention",
        ],
        "mlp_layer_types": ["moe"] * 3,
    },
    "glm4v/Glm4vTextRotaryEmbedding": {"rope_parameters": HALF_ROTARY},
    "glm_image/GlmImageTextRotaryEmbedding": {"rope_parameters": HALF_ROTARY},
    "glm4v_moe/Glm4vMoeTextRotaryEmbedding": {"head_dim": 128},
    "qwen3_omni_moe/Qwen3OmniMoeThinkerTextRotaryEmbedding": QWEN3_OMNI_TEXT,
    "qwen3_omni_moe/Qwen3OmniMoeTalkerRotaryEmbedding": {
        "talker_config": {"text_config": QWEN3_OMNI_TEXT}
    },
    # Qwen3.5-style: a quarter of the 256-feature head rotates, 11 + 11 + 10 pairs
    "qwen4_exp/Qwen4ExpTextRotaryEmbedding": {
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        }
    },
    # HunyuanOCR: 4 axes over 128-feature heads, the fixed-NTK "xdrope" frequencies
    "hunyuan_vl/HunYuanVLRotaryEmbedding": {
        "head_dim": 128,
        "rope_parameters": {
            "type": "xdrope",
            "rope_theta": 10000.0,
            "alpha": 1000.0,
            "factor": 1.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "xdrope_section": [16, 16, 16, 16],
        },
    },
    # North (Cohere Compass): M-RoPE on the sliding-window layers, NoPE on the full ones
    "cohere_compass/CohereCompassRotaryEmbedding": {
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "rope_parameters": {
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": 50000.0,
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
            "full_attention": None,
        },
    },
}
# the configs a rotary module really receives where its __init__ annotation names another
# (an Omni model's talker and code predictor): the package's config class and the paths of
# the sub-configs handed to the module (None: the text config, posenc reading the whole)
RECEIVES = {
    "qwen2_5_omni/Qwen2_5OmniRotaryEmbedding": ("Qwen2_5OmniConfig", (None, ("talker_config",))),
    "qwen3_omni_moe/Qwen3OmniMoeRotaryEmbedding": (
        "Qwen3OmniMoeConfig",
        (("talker_config", "code_predictor_config"),),
    ),
    "qwen3_omni_moe/Qwen3OmniMoeTalkerRotaryEmbedding": (
        "Qwen3OmniMoeConfig",
        (("talker_config", "text_config"),),
    ),
    # models of several stacks: each stack's rotary gets its own sub-config (the whole is
    # refused)
    "dia/DiaRotaryEmbedding": ("DiaConfig", (("encoder_config",), ("decoder_config",))),
    "t5gemma/T5GemmaRotaryEmbedding": ("T5GemmaConfig", (("encoder",), ("decoder",))),
    "deepseek_ocr2/DeepseekOcr2VisionRotaryEmbedding": (
        "DeepseekOcr2VisionConfig",
        (("encoder_config",),),
    ),
    "nemotron3_diarization/Nemotron3DiarizationRotaryEmbedding": (
        "Nemotron3DiarizationConfig",
        (("audio_config",),),
    ),
    "blt/BltRotaryEmbedding": (
        "BltConfig",
        (("encoder_config",), ("global_config",), ("decoder_config",), ("patcher_config",)),
    ),
}
#: rotaries keyed by a rope name, not by the layer type: the name of each layer type
ROPE_KEYS = {
    "deepseek_v4/DeepseekV4RotaryEmbedding": {
        "sliding_attention": "main",
        "compressed_sparse_attention": "compress",
        "heavily_compressed_attention": "compress",
    },
}
_ROTARY = re.compile(r"^class (\w*RotaryEmbedding)\(", re.M)


@dataclass(frozen=True)
class RotaryCase:
    """One rotary module class of one family."""

    family: str  # the transformers.models sub-package
    module: str  # the modeling module's dotted name
    rotary: str  # the class name
    config: str  # the config class name its __init__ takes

    @property
    def model_type(self) -> str:
        return self.config_class().model_type

    @property
    def id(self) -> str:
        return f"{self.family}/{self.rotary}"

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def config_class(self, name: str | None = None) -> type:
        """The config class ``name`` (default: the one the rotary's ``__init__`` names)."""
        name = name or RECEIVES.get(self.id, (self.config,))[0]
        found = getattr(self.load(), name, None)
        if found is None:
            package = importlib.import_module(self.module.rsplit(".", 1)[0])
            found = getattr(package, name)
        return found


#: modeling modules the walk could not import (a dependency transformers does not require
#: is missing) -> the error; their rotary embeddings are not walked
UNIMPORTABLE: dict[str, str] = {}


@functools.cache
def discover() -> tuple[RotaryCase, ...]:
    """Every ``*RotaryEmbedding`` class of the installed transformers (cached per process)."""
    import transformers.models

    root = Path(transformers.models.__file__).parent
    cases = []
    for path in sorted(root.glob("*/modeling_*.py")):
        names = _ROTARY.findall(path.read_text(encoding="utf-8"))
        if not names:
            continue
        dotted = f"transformers.models.{path.parent.name}.{path.stem}"
        try:
            module = importlib.import_module(dotted)
        except ModuleNotFoundError as exc:  # an optional dependency (torchvision in 5.0's SAM 3)
            UNIMPORTABLE[dotted] = str(exc)
            continue
        for name in names:
            params = list(inspect.signature(getattr(module, name).__init__).parameters.values())
            annotation = params[1].annotation if len(params) > 1 else None
            config = getattr(annotation, "__name__", str(annotation))
            cases.append(RotaryCase(path.parent.name, dotted, name, config))
    return tuple(cases)


def case_ids() -> list[str]:
    """``family/RotaryClass`` for each case (stable test ids)."""
    return [c.id for c in discover()]


def _attention_classes(case: RotaryCase, config_class: type) -> list[type]:
    """The module's ``*Attention`` classes, those built from ``config_class`` first."""
    module = case.load()
    found = []
    for name, cls in sorted(vars(module).items()):
        if not (isinstance(cls, type) and name.endswith("Attention")):
            continue
        if cls.__module__ == module.__name__:
            params = list(inspect.signature(cls.__init__).parameters.values())
            annotation = params[1].annotation if len(params) > 1 else None
            own = getattr(annotation, "__name__", str(annotation)) == config_class.__name__
            found.append((not own, name, cls))
    return [cls for *_, cls in sorted(found)]


def hf_head_dim(case: RotaryCase, config, layer_idx: int = 0) -> int | None:
    """The head dim of the family's attention module at ``layer_idx`` (on the meta device)."""
    for cls in _attention_classes(case, type(config)):
        try:
            with torch.device("meta"):
                attention = cls(config, layer_idx)
        except Exception:  # another signature or config: try the next class
            continue
        for attr in ("head_dim", "attention_head_size", "head_size"):
            value = getattr(attention, attr, None)
            if isinstance(value, int):
                return value
    return None


def hf_configs(case: RotaryCase) -> list[tuple]:
    """``[(config for posenc, config the family's rotary module receives)]``.

    The family's default config (with ``CONFIG_FIELDS``), with a random base
    ``10 ** U(3, 7)`` (seeded by the case) where its ``rope_parameters`` are one flat dict
    that the config class accepts. A composite model's rotary module gets its text (decoder)
    sub-config, as the model passes it; posenc gets the whole config and has to find that
    part itself. The sub-configs of ``RECEIVES`` go to both.
    """
    cls = case.config_class()
    fields = CONFIG_FIELDS.get(case.id, CONFIG_FIELDS.get(case.family, {}))
    config = cls(**fields)
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get("rope_theta"), float):
        rng = random.Random(zlib.crc32(case.rotary.encode()))
        theta = round(10 ** rng.uniform(3, 7))
        with contextlib.suppress(TypeError, ValueError):  # else the class's own default
            rope = {**params, "rope_theta": float(theta)}
            config = cls(**{**fields, "rope_parameters": rope})
    pairs = []
    for path in RECEIVES.get(case.id, (None, (None,)))[1]:
        if path is None:
            pairs.append((config, config.get_text_config(decoder=True)))
            continue
        sub = config
        for name in path:
            sub = getattr(sub, name)
        pairs.append((sub, sub))
    return pairs


def hf_config(case: RotaryCase):
    """The first ``(config for posenc, config the rotary module receives)`` of the case."""
    return hf_configs(case)[0]


def readme_coverage(text: str, pattern: str) -> dict[str, tuple[int, int]]:
    """``{transformers version: (matched, total)}`` stated in ``text``: every match of
    ``pattern`` (groups matched, total, version), the version's trailing punctuation and
    emphasis dropped."""
    return {m[3].rstrip(".,;)*"): (int(m[1]), int(m[2])) for m in re.finditer(pattern, text)}


def check_stated_coverage(pages, pattern: str, matched: int, total: int) -> None:
    """Each page states ``(matched, total)`` for the installed transformers (``pattern`` as
    for ``readme_coverage``); a version no page states is reported and skipped."""
    import pytest
    import transformers

    version = transformers.__version__
    for page in pages:
        stated = readme_coverage(page.read_text(encoding="utf-8"), pattern)
        assert stated, f"{page.name} must state the coverage"
        if version not in stated:
            pytest.skip(
                f"{page.name} states the coverage of transformers {sorted(stated)}; this run "
                f"measures {matched} of {total} on {version}"
            )
        assert stated[version] == (matched, total), (
            f"{page.name} says {stated[version]}; this run measures {(matched, total)}"
        )


def not_in_table(case: RotaryCase) -> str | None:
    """The case's ``model_type`` when posenc's family table lacks it (a family new in the
    installed release: ``from_hf_config`` refuses it by name), else None."""
    config = hf_config(case)[0]
    try:
        config_family(config)
    except ValueError as exc:
        if "unknown model_type" in str(exc):
            return str(getattr(config, "model_type", None))
    return None


_CALL = re.compile(r"\b(apply_\w*rot\w*)\(")


def _calls(case: RotaryCase, config) -> tuple[str, ...]:
    """The rotation functions the attention module for ``config`` calls (cached per class)."""
    return _calls_of(case, type(config))


@functools.cache
def _calls_of(case: RotaryCase, config_class: type) -> tuple[str, ...]:
    module = case.load()
    classes = _attention_classes(case, config_class)[:1]
    found = (n for cls in classes for n in _CALL.findall(inspect.getsource(cls)))
    return tuple(n for n in found if hasattr(module, n))


def _apply(case: RotaryCase, config):
    """The rotation function that the family's attention module (for ``config``) calls.

    ``apply_rotary_pos_emb_interleave`` beside ``apply_rotary_pos_emb`` is picked by the
    config's ``rope_interleave`` (DeepSeek-V3), else it is the main attention's and the
    plain one serves a sparse-attention indexer; complex ``freqs_cis`` models (Llama 4,
    DeepSeek-V2) call ``apply_rotary_emb``.
    """
    module = case.load()
    names = list(_calls(case, config))
    names = names or [n for n in ("apply_rotary_pos_emb", "apply_rotary_emb") if hasattr(module, n)]
    interleave = "apply_rotary_pos_emb_interleave"
    if interleave in names and getattr(config, "rope_interleave", True):
        return getattr(module, interleave)
    if hasattr(module, interleave) and not names:
        return getattr(module, interleave)
    return getattr(module, names[0]) if names else getattr(module, interleave)


def hf_rotate(case: RotaryCase, config, q, k, positions, layer_type):
    """The family's own rotation of ``q``, ``k`` ``[B, H, T, D]`` at ``positions [B, T]``."""
    module = case.load()
    rotary = getattr(module, case.rotary)(config)
    kwargs = {}
    if layer_type is not None and "layer_type" in inspect.signature(rotary.forward).parameters:
        kwargs["layer_type"] = ROPE_KEYS.get(case.id, {}).get(layer_type, layer_type)
    out = rotary(q, positions, **kwargs)
    apply = _apply(case, config)
    if not isinstance(out, tuple):  # complex freqs_cis [B, T, R/2]
        if "[:, :, None, :]" in inspect.getsource(apply):  # expects [B, T, H, D]
            q_hf, k_hf = apply(q.transpose(1, 2), k.transpose(1, 2), out)
            return q_hf.transpose(1, 2), k_hf.transpose(1, 2)
        return apply(q, k, out)
    if list(inspect.signature(apply).parameters) == ["tensor", "sin", "cos"]:
        return _rotate_gptj(apply, q, k, *out)  # GPT-J, CodeGen (transformers >= 5.24)
    cos, sin = out
    if len(inspect.signature(apply).parameters) == 4:  # one tensor at a time (Gemma 3n)
        return apply(q, cos, sin), apply(k, cos, sin)
    try:
        return apply(q, k, cos, sin)
    except RuntimeError:  # a partial rotary: the attention module passes the rotated part
        width = cos.shape[-1]
        q_rot, k_rot = apply(q[..., :width], k[..., :width], cos, sin)
        return torch.cat([q_rot, q[..., width:]], -1), torch.cat([k_rot, k[..., width:]], -1)


def _rotate_gptj(apply, q, k, sin, cos):
    """GPT-J's ``apply_rotary_pos_emb(tensor [B, T, H, R], sin, cos)`` on the first ``R``
    features (its attention module passes the rotated part), tables ``[B, T, R/2]``."""
    width = 2 * sin.shape[-1]

    def rotate(x):
        part = apply(x[..., :width].transpose(1, 2), sin, cos).transpose(1, 2)
        return torch.cat([part, x[..., width:]], -1)

    return rotate(q), rotate(k)


@dataclass
class Outcome:
    """How posenc compares with the family's module (``error`` in tolerances; <= 1 passes)."""

    error: float
    detail: str


def permuted(case: RotaryCase, config, x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` in the feature order the family's rotation returns.

    ``apply_rotary_pos_emb_interleave`` (DeepSeek-V3 and the other MLA models) rotates
    interleaved pairs but returns them half-split, ``(x0, x2, ..) | (x1, x3, ..)``: the
    same permutation of q and k (of the first ``width`` rotated features), so the scores
    are those of the interleaved rotation.
    """
    if _apply(case, config).__name__ != "apply_rotary_pos_emb_interleave":
        return x
    rotated = x[..., :width].unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
    return torch.cat([rotated, x[..., width:]], -1)


def _layers(config, sub) -> list[tuple]:
    """``(layer_type, posenc encoding, layer index)`` of each distinct rotating layer."""
    kinds = getattr(sub, "layer_types", None)
    per_layer = kinds or config_family(config)[1].layers
    plan = posenc.hf.layer_plan(config) if per_layer else None
    layers = {}
    for index, encoding in enumerate(plan or [posenc.from_hf_config(config)]):
        # a NoPE layer, or Llama 4's NoPE-layer query temperature alone (no rotation; it is
        # compared with the family's attention in test_schemes_transformers)
        if not isinstance(encoding, (posenc.NoPE, posenc.PositionTemperature)):
            kind = kinds[index] if kinds and plan else None
            key = (kind, getattr(encoding, "base", None), type(encoding))
            layers.setdefault(key, (kind, encoding, index))
    return list(layers.values())


def _positions(ours, first: int, gen: torch.Generator):
    """``(name, positions for posenc, positions for the family's module)`` from ``first``."""
    text = first + torch.arange(LENGTH).expand(2, LENGTH)  # [B, T]
    axes = getattr(ours, "num_axes", None)
    if axes is None:
        yield "text", text, text
        return
    # posenc: text positions [T]; transformers: the same on every axis
    yield "text", text[0], text.expand(axes, 2, LENGTH)
    random_axes = first + torch.randint(0, SPAN, (axes, 2, LENGTH), generator=gen)
    yield "random axes", random_axes, random_axes
    # (t, h, w) rows; NeoMME takes (h, w), HunYuan's 4 axes (position, w, h, image) the
    # sequence position first
    rows = [0] * (axes - 3) + [0, 1, 2][3 - min(axes, 3) :]
    mixed = posenc.mrope_position_ids(MIXED[0], spatial_merge_size=MIXED[1])[0][rows]
    mixed = first + mixed[:, None].expand(axes, 2, -1)
    yield "text+image", mixed, mixed


def _temperature(case, sub, ours, positions):
    """The family's query scale ``[B, 1, T, 1]`` for a ``Compose([rope, temperature])``
    (Ministral 3: ``get_llama_4_attn_scale``, as its attention calls it), else 1."""
    if not isinstance(ours, posenc.Compose):
        return 1.0
    params = sub.rope_parameters
    scale = case.load().get_llama_4_attn_scale
    return scale(positions, params["llama_4_scaling_beta"], params[_ORIGINAL])


def _compare_rotary(case, sub, ours, layer_type, index, seed):
    """Errors (in tolerances) of posenc's q/k against the family's own rotation."""
    rope = ours.encodings[0] if isinstance(ours, posenc.Compose) else ours
    dim = hf_head_dim(case, sub, index) or rope.head_dim
    if rope.head_dim == getattr(sub, "qk_rope_head_dim", None):
        dim = rope.head_dim  # MLA: posenc rotates the rotary part of the head alone
    # Mistral 4's MLARope takes the whole head; transformers rotates its last features
    # and returns interleaved pairs half-split, as MLARope does
    nope = rope.head_dim - rope.rope_head_dim if isinstance(rope, posenc.MLARope) else 0
    dim = rope.head_dim if nope else dim
    base = float(getattr(rope, "base", getattr(getattr(rope, "rope", None), "base", 1e4)))
    scale = max(float(getattr(rope, "attention_scale", 1.0)), 1.0)
    gen = torch.Generator().manual_seed(seed)
    for first in (0, OFFSET):
        for name, mine_pos, hf_pos in _positions(ours, first, gen):
            length = mine_pos.shape[-1]
            q = torch.randn(2, 4, length, dim, generator=gen)
            k = torch.randn(2, 2, length, dim, generator=gen)
            q_hf, k_hf = hf_rotate(case, sub, q[..., nope:], k[..., nope:], hf_pos, layer_type)
            q_hf, k_hf = torch.cat([q[..., :nope], q_hf], -1), torch.cat([k[..., :nope], k_hf], -1)
            q_hf = q_hf * _temperature(case, sub, ours, hf_pos)
            width = getattr(rope, "rotary_dim", dim)
            rotated = ours.rotate(q, k, mine_pos, mine_pos)  # MLARope: transformers' order
            q_ours, k_ours = rotated if nope else (permuted(case, sub, x, width) for x in rotated)
            # transformers forms inv_freq and angles in float32: an angle carries about
            # |angle| (1 + ln base) eps32, the rotated value that times |x| (8 roundings floor)
            angle = float(mine_pos.max()) + 1
            tol = EPS32 * (8 + angle * (1 + math.log(base))) * scale
            for mine, theirs, x in ((q_ours, q_hf, q), (k_ours, k_hf, k)):
                error = float((mine - theirs).abs().max()) / (tol * float(x.abs().max()))
                yield error, f"layer_type={layer_type} {name} positions, first={first}"
                if isinstance(ours, posenc.Compose):  # the temperature, free of angle error
                    norms = (mine.norm(dim=-1) - theirs.norm(dim=-1)).abs().max()
                    error = float(norms) / (64 * EPS32 * float(x.norm(dim=-1).max()) * scale)
                    yield error, f"query scale at {name} positions, first={first}"


def _compare_axial(case, sub, ours):
    """Errors (in tolerances) of posenc's axial cos/sin and q/k at random patch positions."""
    module = case.load()
    rotary = getattr(module, case.rotary)(sub)
    pos = torch.randint(0, PATCHES, (24, 2), generator=torch.Generator().manual_seed(0))
    cos, sin = rotary(torch.zeros(1), pos)  # [N, D]: the pair angles, twice
    tol = EPS32 * (8 + PATCHES * (1 + math.log(ours.base)))
    ours_cos, ours_sin = ours.cos_sin(pos, dtype=torch.float32)  # [N, D/2]
    for theirs, mine in ((cos, ours_cos), (sin, ours_sin)):
        yield float((theirs.float() - mine.repeat(1, 2)).abs().max()) / tol, "patch cos/sin"
    apply = getattr(module, "apply_rotary_pos_emb_vision", None)
    if apply is not None:
        gen = torch.Generator().manual_seed(1)
        q = torch.randn(1, 3, 24, ours.head_dim, generator=gen)
        k = torch.randn(1, 3, 24, ours.head_dim, generator=gen)
        want = apply(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)  # [N, H, D]
        for got, theirs in zip(ours.rotate(q, k, pos, pos), want, strict=True):
            error = float((got[0] - theirs.transpose(0, 1)).abs().max()) / (4 * tol)
            yield error, "patch q/k"


# ------------------------------------------------------------- axial variants
# Each family's own rotation of q, k [1, H, T, D] at posenc's patch positions [N, A] ((y, x)
# or (t, y, x)): how its tower calls its rotary module and its apply function.


def _plain_axial(ours) -> bool:
    """The layout ``_compare_axial`` reads from cos/sin: half-split blocks, (y, x)."""
    layout = (ours.axis_order, ours.cyclic, ours.pairs, ours.num_prefix_tokens)
    return layout == ((0, 1), False, "half", 0) and ours.rotary_dim == ours.head_dim


def axial_variant_positions(module, config, ours, gen: torch.Generator) -> torch.Tensor:
    """posenc's positions for the family's rotation: Llama 4's fixed grid (1-based, class
    token last at (0, 0)); EoMT-DINOv3's patch centers of a 4 x 3 grid; else random."""
    if hasattr(module, "vision_apply_rotary_emb"):
        side = config.image_size // config.patch_size
        ones = torch.zeros(1, 2, dtype=torch.long)
        return torch.cat((posenc.axial_positions((side, side)) + 1, ones))
    if hasattr(module, "get_patches_center_coordinates"):
        return posenc.dinov3_positions(DINO_GRID)
    if hasattr(module, "compute_embeddings"):  # EfficientLoFTR: 1-based rows and columns
        return posenc.axial_positions(DINO_GRID) + 1
    return torch.randint(0, PATCHES, (24, ours.axes), generator=gen)


def hf_axial_rotate(module, rotary, q, k, pos):
    """The family's rotation of ``q``, ``k`` ``[1, H, T, D]`` at posenc's ``pos [N, A]``."""
    if hasattr(module, "vision_apply_rotary_emb"):  # Llama 4: complex freqs_ci of its grid
        got = module.vision_apply_rotary_emb(q.transpose(1, 2), k.transpose(1, 2), rotary(q))
        return tuple(x.transpose(1, 2) for x in got)
    if hasattr(module, "get_patches_center_coordinates"):  # EoMT-DINOv3 (eval: no jitter)
        size = rotary.eval().config.patch_size
        cos, sin = rotary(torch.zeros(1, 3, DINO_GRID[0] * size, DINO_GRID[1] * size))
        return module.apply_rotary_pos_emb(q, k, cos, sin)
    if hasattr(module, "compute_embeddings"):  # EfficientLoFTR: the aggregated feature grid
        stride, kernel = rotary.config.q_aggregation_stride, rotary.config.q_aggregation_kernel_size
        fmap = torch.zeros(1, 1, *((n - 1) * stride + kernel for n in DINO_GRID))
        cos, sin = (x.reshape(1, -1, x.shape[-1]) for x in rotary(fmap))  # [1, N, hidden]
        got = module.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 2)
        return tuple(x.transpose(1, 2) for x in got)
    xy = pos.flip(-1)  # Gemma 4, SAM3 and the trackers take (x, y)
    if hasattr(module, "apply_multidimensional_rope"):  # Gemma 4: [B, N, 2], [B, N, H, D]
        cos, sin = rotary(q, xy[None])
        got = (
            module.apply_multidimensional_rope(x.transpose(1, 2), cos, sin, xy[None])
            for x in (q, k)
        )
        return tuple(x.transpose(1, 2) for x in got)
    apply_2d = getattr(module, "apply_rotary_pos_emb_2d", None) or getattr(
        module, "apply_rotary_pos_emb_2d_self_attn", None
    )  # SAM3 ViT, the SAM2-style trackers (EdgeTAM's self-attention): cos/sin [1, N, D]
    if apply_2d is not None:
        cos, sin = rotary(q, xy)
        return apply_2d(q, k, cos=cos, sin=sin)
    cos, sin = rotary(q, pos)  # the Qwen-VL style: cos/sin [N, D], q/k [N, H, D]
    got = module.apply_rotary_pos_emb_vision(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)
    return tuple(x.transpose(0, 1)[None] for x in got)


def _compare_axial_variant(case, sub, ours):
    """Errors (in tolerances) of posenc's rotated q/k against the family's own rotation."""
    module, gen = case.load(), torch.Generator().manual_seed(0)
    rotary = getattr(module, case.rotary)(sub)
    pos = axial_variant_positions(module, sub, ours, gen)
    length = ours.num_prefix_tokens + len(pos)
    q = torch.randn(1, 3, length, ours.head_dim, generator=gen)
    k = torch.randn(1, 3, length, ours.head_dim, generator=gen)
    want = hf_axial_rotate(module, rotary, q, k, pos)
    tol = 4 * EPS32 * (8 + (float(pos.abs().max()) + 1) * (1 + math.log(ours.base)))
    for got, theirs, x in zip(ours.rotate(q, k, pos, pos), want, (q, k), strict=True):
        yield float((got - theirs.float()).abs().max()) / (tol * float(x.abs().max())), "patch q/k"


def run_case(case: RotaryCase, *, seed: int = 0) -> Outcome:
    """Compare posenc with the family's own rotation on every distinct layer of the config
    (of each config in ``RECEIVES``), at the positions its encoding takes."""
    worst = Outcome(math.inf, "no layer with positions compared")
    for config, sub in hf_configs(case):
        for layer_type, ours, index in _layers(config, sub):
            worst.error = 0.0 if worst.error == math.inf else worst.error
            if isinstance(ours, posenc.AxialRope):
                compare = _compare_axial if _plain_axial(ours) else _compare_axial_variant
                found = compare(case, sub, ours)
            else:
                found = _compare_rotary(case, sub, ours, layer_type, index, seed)
            for error, detail in found:
                if error >= worst.error:
                    worst = Outcome(error, f"{type(ours).__name__} {detail}")
    return worst
