"""Position schemes beyond one rotary embedding, built from a transformers (sub-)config.

Shapes: ``D`` head_dim, ``R`` rotary dim. ``build_scheme(scheme, config)`` reads the raw
config dict (``config.to_dict()`` or a ``config.json``; for a composite model, its text or
vision part) the way the family's own modeling code does:

================== ======================================================= ==============
scheme             families (transformers 5.23)                            encoding
================== ======================================================= ==============
proportional       Gemma 4 (``rope_type: proportional`` full layers),      RotaryEmbedding
                   EmbeddingGemma 2 (a base per layer type, head dims by
                   layer in ``per_layer_config``)
mrope              Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni thinker and talker  MRoPE
                   (sections in blocks, half-split)
mrope_interleaved  Qwen3-VL, Cosmos 3 Edge, Qwen3-Omni thinker and talker, MRoPE
                   Cohere Compass (cyclic sections, half-split; NoPE
                   layer types)
qwen3_5_mrope      Qwen3.5, Qwen4-Exp (cyclic sections, partial rotary)    MRoPE
glm4v_mrope        GLM-4V, GLM-OCR (blocks, adjacent pairs, partial)       MRoPE
hy_v4_mrope        Hy4-VL text (cyclic sections, adjacent pairs; the       MRoPE
                   rotated part of MLA heads, ``head_dim``)
glm_mrope          GLM-4.5V, GLM-Image (blocks, half-split, partial rotary) MRoPE
ernie_mrope        ERNIE 4.5-VL (``mrope_section`` = (h, w, t), h == w:    MRoPE
                   the first 2h pairs alternate height, width, the rest
                   follow time; adjacent pairs; default frequencies only)
neomme_mrope       NeoMME (two axes: pairs alternate row, column;          MRoPE
                   positions ``[2, T]``; half-split, partial per layer type)
hunyuan_xdrope     HunYuan-VL (3 or 4 axes over feature blocks of          XDRoPE
                   ``[cos | cos]``; ``alpha``: a fixed NTK base)
axial              Qwen-VL / GLM-4V vision towers (shared frequencies)     AxialRope
axial_alternating  Pixtral (even frequencies rows, odd columns)            AxialRope
dinov3             DINOv3 ViT (patch-center coordinates, prefix tokens),   AxialRope
                   EoMT-DINOv3 (+ ``num_queries`` prefix tokens in the
                   last ``num_blocks`` layers: pass ``layer_idx``)
axial_xy           Step3.5 vision (the first D/4 pairs follow the column)  AxialRope
axial_xy_adjacent  Inkling2 vision, SAM3 ViT (adjacent pairs, column first) AxialRope
axial_xy_llama4    Llama 4 vision (the same; ``rope_type: default``)       AxialRope
axial_xy_per_axis  Gemma 4 vision (each axis a half-split block)           AxialRope
axial_xy_cyclic    Kimi K2.5 vision (pairs alternate column, row)          AxialRope
axial_thw          MiniMax-M3-VL vision (t, y, x on 2 floor(D/6) each)     AxialRope
loftr_axial        EfficientLoFTR (the whole hidden vector before the      AxialRope
                   heads split: q/k ``[B, 1, N, hidden]``; pairs cycle row,
                   column; positions count from 1)
memory_axial       SAM2 / SAM3 / EdgeTAM video trackers' memory attention  AxialRope
                   (as axial_xy_adjacent; memory keys take their frames'
                   grid positions, object-pointer keys stay unrotated)
mla                DeepSeek-V2/V3 decoupled RoPE (``qk_rope_head_dim``)    MLARope
deepseek_v4        DeepSeek-V4 (last R = f D features, adjacent pairs;       TrailingRope
                   ``main`` / ``compress`` rope parameters by layer type)
temperature        Ministral 3 (RoPE), Mistral 4 (MLA): + query temperature Compose
                   Llama 4 NoPE layers (``attn_temperature_tuning``)       PositionTemperature
================== ======================================================= ==============

A composite model's config is read through its ``text_config`` (an Omni model's through
``thinker_config``, then its ``text_config``; ``vision_config`` for the vision schemes).
Read fields: ``rope_parameters`` (v5) or ``rope_scaling`` (v4) with ``rope_theta`` inside or
at the top level; per-layer-type dicts need ``layer_type``; M-RoPE's ``mrope_section``
(default the family's: ``[16, 24, 24]``, ``[24, 20, 20]``, ``[11, 11, 10]``,
``[8, 12, 12]``, Hy4-VL's ``[12, 10, 10]``, ERNIE's ``[22, 22, 20]``), ``mrope_interleaved`` and
Qwen3-Omni's ``interleaved`` (must agree with the scheme) and ``partial_rotary_factor`` (in
the dict or at the top level); a layer type whose rope parameters are None is NoPE; the
legacy ``type: "mrope"`` means the default frequencies. Any other key of the rope dict goes
to the frequency scaling, which raises on a key it does not know (never ignored). Head dims:
``head_dim``, else ``hidden_size // num_attention_heads`` (vision: ``embed_dim //
num_heads`` when present);
Gemma 4 layers with their own ``head_dim`` in ``per_layer_config``. DINOv3's
training-time coordinate augmentation (``pos_embed_shift`` / ``jitter`` / ``rescale``) is
not applied: it is the eval-mode encoding.

Vision positions are ``(y, x)`` (row, column; ``(t, y, x)`` for ``axial_thw``), the
coordinates the tower computes: Inkling2 counts patches from 1 and gives its class token
``(0, 0)``; Llama 4 counts from 1 and appends a class token at ``(0, 0)``; SAM3 scales a
global layer's grid by ``window_size / width``; Gemma 4, SAM3 and the SAM2-style trackers
store ``(x, y)``, so swap their columns. The trackers' memory keys repeat the grid once per
memory frame, and their trailing object-pointer keys (``num_k_exclude_rope``), like
EdgeTAM's leading temporal tokens of each memory frame, are not rotated: pass the other
keys only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from posenc._checks import check_int
from posenc.base import Compose, PositionalEncoding
from posenc.encodings.nope import NoPE
from posenc.encodings.rotary.axial import AxialRope
from posenc.encodings.rotary.mla import MLARope
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.encodings.rotary.mrope import MRoPE, _sections
from posenc.encodings.rotary.mrope_xd import XDRoPE
from posenc.encodings.rotary.ntk_alpha import NTKAlphaScaling, ntk_alpha_parameters
from posenc.encodings.rotary.scaling import DEFAULT_BASE
from posenc.encodings.rotary.temperature import PositionTemperature
from posenc.encodings.rotary.trailing import TrailingRope

__all__ = ["SCHEMES", "build_scheme"]

Builder = Callable[[Mapping[str, Any], str | None, int | None], PositionalEncoding]


def _rope_params(cfg: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    """The rope dict (v5 or v4 form) for ``layer_type``, with ``rope_theta`` filled in."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise TypeError(f"rope parameters must be a dict, got {type(params).__name__}")
    nested = bool(params) and all(v is None or isinstance(v, Mapping) for v in params.values())
    if nested:
        if layer_type not in params or params[layer_type] is None:
            raise ValueError(
                f"the config has rope parameters per layer type {sorted(params)}; pass one "
                f"with rope parameters as layer_type (got {layer_type!r})"
            )
        params = params[layer_type]
    out = {k: v for k, v in params.items() if v is not None}
    if "rope_theta" not in out:
        out["rope_theta"] = cfg.get("rope_theta", DEFAULT_BASE)
    for key in ("rope_type", "type"):  # "mrope": Qwen2-VL's legacy name of the default
        if out.get(key) == "mrope":
            out[key] = "default"
    out.pop("max_position_embeddings", None)  # Mistral's copy of the model's; read by no type
    return out


def _head_dim(cfg: Mapping[str, Any], layer_idx: int | None = None) -> int:
    if layer_idx is not None:
        override = _per_layer(cfg).get(layer_idx, {})
        if override.get("head_dim") is not None:
            return check_int("head_dim", override["head_dim"])
    if cfg.get("head_dim") is not None:
        return check_int("head_dim", cfg["head_dim"])
    width = cfg.get("embed_dim") or cfg.get("hidden_size")
    heads = cfg.get("num_heads") or cfg.get("num_attention_heads")
    if width is None or heads is None:
        raise ValueError(
            "config has neither head_dim nor hidden_size (embed_dim) and num_attention_heads "
            f"(num_heads), got {width} and {heads}"
        )
    return check_int("hidden size", width) // check_int("heads", heads)


def _per_layer(cfg: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    """Gemma 4's ``per_layer_config`` (``{"05": {"head_dim": 512}}``) by layer index.

    A ``config.json`` without it gives its full-attention layers ``global_head_dim``
    (512 when absent), as the configs of the proportional families (Gemma 4) do.
    """
    table = cfg.get("per_layer_config")
    if table is None and cfg.get("layer_types"):
        full = {"head_dim": cfg.get("global_head_dim", 512)}
        table = {i: full for i, kind in enumerate(cfg["layer_types"]) if kind == "full_attention"}
    return {int(key): value for key, value in (table or {}).items()}


def _layer_head_dim(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None) -> int:
    """The head dim of one layer, or of every layer of ``layer_type`` (they must agree)."""
    if layer_idx is not None or not _per_layer(cfg):
        return _head_dim(cfg, layer_idx)
    kinds = cfg.get("layer_types") or []
    dims = {_head_dim(cfg, i) for i, kind in enumerate(kinds) if kind == layer_type}
    if len(dims) != 1:
        raise ValueError(
            f"layers of type {layer_type!r} have head dims {sorted(dims)}; pass layer_idx"
        )
    return dims.pop()


def _layer_type(
    cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None
) -> str | None:
    kinds = cfg.get("layer_types")
    if layer_idx is not None and kinds:
        layer_idx = check_int("layer_idx", layer_idx, minimum=0)
        if layer_idx >= len(kinds):
            raise ValueError(f"layer_idx={layer_idx} is out of range for {len(kinds)} layers")
        if layer_type is not None and layer_type != kinds[layer_idx]:
            raise ValueError(f"layer {layer_idx} is {kinds[layer_idx]!r}, not {layer_type!r}")
        return kinds[layer_idx]
    if layer_type is not None and kinds and layer_type not in kinds:
        raise ValueError(f"layer_type={layer_type!r} is not one of {sorted(set(kinds))}")
    return layer_type


def _rotary(cfg: Mapping[str, Any], head_dim: int, params: dict[str, Any]) -> RotaryEmbedding:
    base = params.pop("rope_theta")
    return RotaryEmbedding(head_dim, base=base, scaling=params)


# --------------------------------------------------------------------------- builders


def _proportional(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None):
    layer_type = _layer_type(cfg, layer_type, layer_idx)
    params = _rope_params(cfg, layer_type)
    return _rotary(cfg, _layer_head_dim(cfg, layer_type, layer_idx), params)


def _mrope_layer(
    cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None
) -> tuple[dict[str, Any], int, int | None] | None:
    """``(rope params, head dim, rotary dim)`` of an M-RoPE layer; None: a NoPE layer type
    (its entry of per-layer-type rope parameters is None, as Cohere Compass' can be)."""
    layer_type = _layer_type(cfg, layer_type, layer_idx)
    nested = cfg.get("rope_parameters") or {}
    if layer_type is not None and layer_type in nested and nested[layer_type] is None:
        return None
    params = _rope_params(cfg, layer_type)
    head_dim = _head_dim(cfg)  # (a per-layer head dim is Gemma 4's, not an M-RoPE family's)
    fraction = params.pop("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    return params, head_dim, None if fraction is None else int(head_dim * fraction)


def _mrope(default_section: list[int], *, cyclic: bool, interleaved: bool) -> Builder:
    def build(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None):
        layer = _mrope_layer(cfg, layer_type, layer_idx)
        if layer is None:
            return NoPE()
        params, head_dim, rotary_dim = layer
        section = params.pop("mrope_section", default_section)
        for key in ("mrope_interleaved", "interleaved"):  # Qwen3-Omni writes both
            flag = params.pop(key, cyclic)
            if bool(flag) != cyclic:
                raise ValueError(
                    f"{key}={flag!r} contradicts this family's M-RoPE (mrope_interleaved={cyclic})"
                )
        base = params.pop("rope_theta")
        return MRoPE(
            head_dim,
            mrope_section=section,
            base=base,
            scaling=params,
            rotary_dim=rotary_dim,
            interleaved=interleaved,
            mrope_interleaved=cyclic,
        )

    return build


def _ernie_mrope(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None):
    """ERNIE 4.5-VL: ``mrope_section`` is ``(s_h, s_w, s_t)`` with ``s_h == s_w``; the first
    ``2 s_h`` pairs alternate height, width, the last ``s_t`` follow time; adjacent pairs;
    the whole head rotates and only the default frequencies are allowed (as transformers)."""
    layer = _mrope_layer(cfg, layer_type, layer_idx)
    if layer is None:
        return NoPE()
    params, head_dim, rotary_dim = layer
    height, width, time = _sections(params.pop("mrope_section", [22, 22, 20]))
    kind = params.pop("rope_type", params.pop("type", "default"))
    base = params.pop("rope_theta")
    if kind != "default" or params or rotary_dim not in (None, head_dim):
        raise ValueError(
            "ERNIE 4.5-VL's M-RoPE takes the default rope type over the whole head, got "
            f"rope_type={kind!r}, rotary_dim={rotary_dim}, other keys {sorted(params)}"
        )
    if height != width:
        raise ValueError(
            f"ERNIE 4.5-VL's mrope_section (h, w, t) needs h == w (they alternate), got "
            f"{[height, width, time]}"
        )
    axes = [1, 2] * height + [0] * time
    return MRoPE(head_dim, base=base, interleaved=True, pair_axes=axes)


def _hunyuan_xdrope(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None):
    """HunYuan-VL: XD-RoPE over ``mrope_section`` (legacy ``xdrope_section``) axes; the
    checkpoints' ``type: "xdrope"`` (transformers: ``dynamic``) with ``alpha`` is the fixed
    NTK-alpha base ``rope_theta * alpha ** (D / (D - 2))`` (``NTKAlphaScaling``)."""
    layer = _mrope_layer(cfg, layer_type, layer_idx)
    if layer is None:
        return NoPE()
    params, head_dim, rotary_dim = layer
    sections = params.pop("mrope_section", None)
    legacy = params.pop("xdrope_section", None)
    if sections is None or (legacy is not None and list(legacy) != list(sections)):
        sections = legacy if sections is None else None
    if sections is None or rotary_dim not in (None, head_dim):
        raise ValueError(
            "HunYuan-VL's rotary needs one mrope_section (or xdrope_section) over the whole "
            f"head, got mrope_section / xdrope_section {legacy!r}, rotary_dim={rotary_dim}"
        )
    base = params.pop("rope_theta")
    if params.get("rope_type", params.get("type")) == "xdrope":  # transformers: "dynamic"
        params = {**params, "rope_type": "dynamic"}
    params = ntk_alpha_parameters(params) or params
    kind = params.pop("rope_type", params.pop("type", "default"))
    scaling = NTKAlphaScaling(params.pop("alpha")) if kind == "ntk_alpha" else None
    if kind not in ("default", "ntk_alpha") or params:
        raise ValueError(
            f"HunYuan-VL's XD-RoPE takes the default or the alpha (NTK) frequencies, got "
            f"rope_type={kind!r} with {sorted(params)}"
        )
    return XDRoPE(head_dim, sections=sections, base=base, scaling=scaling)


def _neomme_mrope(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None):
    """NeoMME: two axes (row, column), pairs alternate ``row0, col0, row1, col1, ...``;
    positions ``[2, T]`` / ``[2, B, T]``; half-split pairs of the first ``R`` features."""
    layer = _mrope_layer(cfg, layer_type, layer_idx)
    if layer is None:
        return NoPE()
    params, head_dim, rotary_dim = layer
    if "mrope_section" in params:
        raise ValueError(
            f"NeoMME alternates row and column pairs; mrope_section={params['mrope_section']!r} "
            "is not read by the model"
        )
    pairs = (head_dim if rotary_dim is None else rotary_dim) // 2
    if pairs % 2:
        raise ValueError(f"NeoMME's M-RoPE needs an even number of pairs, got {pairs}")
    base = params.pop("rope_theta")
    return MRoPE(
        head_dim,
        base=base,
        scaling=params,
        rotary_dim=rotary_dim,
        pair_axes=[0, 1] * (pairs // 2),
        num_axes=2,
    )


def _vision_base(cfg: Mapping[str, Any], layer_type: str | None, kinds: tuple[str, ...]) -> float:
    """The base of a vision tower's rope parameters, which may hold nothing else."""
    params = _rope_params(cfg, layer_type)
    kind = params.pop("rope_type", params.pop("type", kinds[0]))
    if kind not in kinds or set(params) - {"rope_theta"}:
        raise ValueError(
            f"a vision tower's axial RoPE takes rope_type {' or '.join(kinds)} and "
            f"rope_theta only, got {kind!r} and {params}"
        )
    return params["rope_theta"]


def _axial(
    frequencies: str = "shared",
    *,
    kinds: tuple[str, ...] = ("axial",),
    thirds: bool = False,
    **layout: Any,
) -> Builder:
    """A vision tower's axial RoPE: ``layout`` goes to ``AxialRope``; ``thirds``: three
    axes ``(t, y, x)`` of ``2 floor(D / 6)`` features each (MiniMax-M3-VL)."""

    def build(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None) -> AxialRope:
        base, head_dim = _vision_base(cfg, layer_type, kinds), _head_dim(cfg)
        extra = {"axis_order": (0, 1, 2), "axis_dim": 2 * (head_dim // 6)} if thirds else {}
        return AxialRope(head_dim, base=base, frequencies=frequencies, **layout, **extra)

    return build


def _memory_axial(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None):
    """SAM2-style video trackers: the memory attention's axial RoPE (adjacent pairs, column
    first), heads of ``memory_attention_hidden_size / (downsample_rate * heads)``."""
    width = check_int("memory_attention_hidden_size", cfg.get("memory_attention_hidden_size"))
    rate = check_int(
        "memory_attention_downsample_rate", cfg.get("memory_attention_downsample_rate", 1)
    )
    heads = check_int(
        "memory_attention_num_attention_heads", cfg.get("memory_attention_num_attention_heads")
    )
    return AxialRope(
        width // (rate * heads),
        base=_vision_base(cfg, layer_type, ("axial",)),
        axis_order=(1, 0),
        pairs="interleaved",
    )


def _loftr_axial(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None):
    """EfficientLoFTR: axial RoPE over the whole ``hidden_size`` vector before the heads split,
    adjacent pairs cycling row, column, on ``S = head_dim * partial_rotary_factor`` each."""
    params = _rope_params(cfg, layer_type)
    kind, fraction = params.pop("rope_type", "default"), params.pop("partial_rotary_factor", 1.0)
    base = params.pop("rope_theta")
    if kind != "default" or params:
        raise ValueError(
            f"EfficientLoFTR's RoPE takes rope_type default, rope_theta and "
            f"partial_rotary_factor only, got {kind!r} and {params}"
        )
    width, size = check_int("hidden_size", cfg.get("hidden_size")), int(_head_dim(cfg) * fraction)
    if 2 * size != width:
        raise ValueError(
            f"EfficientLoFTR rotates hidden_size={width} features: head_dim * "
            f"partial_rotary_factor must be {width // 2}, got {size}"
        )
    return AxialRope(width, base=base, cyclic=True, pairs="interleaved", axis_dim=size)


def _dinov3(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None) -> AxialRope:
    registers = check_int("num_register_tokens", cfg.get("num_register_tokens", 0), minimum=0)
    prefix = 1 + registers
    if cfg.get("model_type") == "eomt_dinov3":  # the last num_blocks layers prepend queries
        layers = check_int("num_hidden_layers", cfg.get("num_hidden_layers"))
        first = layers - check_int("num_blocks", cfg.get("num_blocks"), minimum=0)
        if layer_idx is not None and check_int("layer_idx", layer_idx, minimum=0) >= layers:
            raise ValueError(f"layer_idx={layer_idx} is out of range for {layers} layers")
        if layer_idx is not None and layer_idx >= first:
            prefix += check_int("num_queries", cfg.get("num_queries"), minimum=0)
    return AxialRope(
        _head_dim(cfg),
        base=_vision_base({"rope_theta": 100.0, **cfg}, layer_type, ("default",)),
        frequencies="shared",
        num_prefix_tokens=prefix,
    )


def _mla(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None) -> MLARope:
    params = _rope_params(cfg, _layer_type(cfg, layer_type, layer_idx))
    params.pop("llama_4_scaling_beta", None)  # the temperature scheme reads it
    rope_dim = check_int("qk_rope_head_dim", cfg.get("qk_rope_head_dim"))
    head_dim = check_int("qk_nope_head_dim", cfg.get("qk_nope_head_dim"), minimum=0) + rope_dim
    fraction = params.pop("partial_rotary_factor", None)
    if fraction is not None and int(head_dim * fraction) != rope_dim:
        raise ValueError(
            f"partial_rotary_factor={fraction} of head dim {head_dim} is not "
            f"qk_rope_head_dim={rope_dim}"
        )
    base = params.pop("rope_theta")
    return MLARope(
        head_dim,
        rope_dim,
        base=base,
        scaling=params,
        rope_interleave=bool(cfg.get("rope_interleave", True)),
    )


def _deepseek_v4(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None):
    """DeepSeek-V4: sliding-window layers take rope parameters ``main``, the compressed
    (CSA / HCA) layers ``compress`` (base ``compress_rope_theta``, YaRN in the releases)."""
    params = cfg.get("rope_parameters")
    if not (isinstance(params, Mapping) and {"main", "compress"} <= set(params)):
        raise ValueError(
            "model_type 'deepseek_v4' needs rope_parameters with 'main' and 'compress' dicts "
            f"(as transformers' DeepseekV4Config writes them), got {params!r}"
        )
    kinds = cfg.get("layer_types") or []
    if layer_idx is not None:
        kinds = [_layer_type(cfg, None, layer_idx)]
    elif layer_type is not None:
        kinds = [_layer_type(cfg, layer_type, None)]
    keys = {"main" if kind == "sliding_attention" else "compress" for kind in kinds}
    if len(keys) != 1:
        raise ValueError(
            f"model_type 'deepseek_v4' rotates its layers with rope parameters {sorted(keys)}: "
            "pass layer_idx or layer_type"
        )
    key = keys.pop()
    found = _rope_params({"rope_parameters": params[key]}, None)
    if key == "compress" and found["rope_theta"] != cfg.get(
        "compress_rope_theta", found["rope_theta"]
    ):
        raise ValueError(
            f"compress_rope_theta={cfg['compress_rope_theta']} disagrees with "
            f"rope_parameters['compress']['rope_theta']={found['rope_theta']}"
        )
    head_dim = _head_dim(cfg)
    rotary_dim = int(head_dim * found.pop("partial_rotary_factor", 1.0))
    if cfg.get("qk_rope_head_dim") not in (None, rotary_dim):
        raise ValueError(
            f"qk_rope_head_dim={cfg['qk_rope_head_dim']} is not the rotated part {rotary_dim} of "
            f"head_dim={head_dim} given by partial_rotary_factor"
        )
    base = found.pop("rope_theta")
    return TrailingRope(head_dim, rotary_dim, base=base, scaling=found, interleaved=True)


def _temperature(cfg: Mapping[str, Any], layer_type: str | None, layer_idx: int | None):
    if cfg.get("attn_temperature_tuning"):  # Llama 4: the NoPE layers' temperature alone
        return PositionTemperature(cfg["attn_scale"], cfg["floor_scale"], offset=1)
    params = _rope_params(cfg, _layer_type(cfg, layer_type, layer_idx))
    beta = params.pop("llama_4_scaling_beta", None)
    length = params.get("original_max_position_embeddings")
    if beta is None or length is None:
        raise ValueError(
            "the temperature scheme needs llama_4_scaling_beta and "
            f"original_max_position_embeddings in the rope parameters, got {beta} and {length}"
        )
    if "qk_rope_head_dim" in cfg:  # Mistral 4: multi-head latent attention
        rope: PositionalEncoding = _mla(cfg, layer_type, layer_idx)
    else:
        rope = _rotary(cfg, _head_dim(cfg), params)
    return Compose([rope, PositionTemperature(beta, length)])


SCHEMES: dict[str, Builder] = {
    "proportional": _proportional,
    "mrope": _mrope([16, 24, 24], cyclic=False, interleaved=False),
    "mrope_interleaved": _mrope([24, 20, 20], cyclic=True, interleaved=False),
    "qwen3_5_mrope": _mrope([11, 11, 10], cyclic=True, interleaved=False),
    "glm4v_mrope": _mrope([8, 12, 12], cyclic=False, interleaved=True),
    "hy_v4_mrope": _mrope([12, 10, 10], cyclic=True, interleaved=True),
    "glm_mrope": _mrope([8, 12, 12], cyclic=False, interleaved=False),
    "ernie_mrope": _ernie_mrope,
    "neomme_mrope": _neomme_mrope,
    "hunyuan_xdrope": _hunyuan_xdrope,
    "axial": _axial("shared"),
    "axial_alternating": _axial("alternating"),
    "axial_xy": _axial(axis_order=(1, 0)),
    "axial_xy_adjacent": _axial(axis_order=(1, 0), pairs="interleaved"),
    "axial_xy_llama4": _axial(kinds=("default",), axis_order=(1, 0), pairs="interleaved"),
    "axial_xy_per_axis": _axial(axis_order=(1, 0), pairs="per_axis"),
    "axial_xy_cyclic": _axial(axis_order=(1, 0), cyclic=True),
    "axial_thw": _axial(thirds=True),
    "dinov3": _dinov3,
    "memory_axial": _memory_axial,
    "loftr_axial": _loftr_axial,
    "mla": _mla,
    "deepseek_v4": _deepseek_v4,
    "temperature": _temperature,
}
_VISION = frozenset(name for name in SCHEMES if name.startswith(("axial", "dinov3")))


def build_scheme(
    scheme: str,
    config: Mapping[str, Any],
    *,
    layer_type: str | None = None,
    layer_idx: int | None = None,
) -> PositionalEncoding:
    """The encoding of ``scheme`` for a raw (sub-)config dict (see the module table).

    Args:
        scheme: a name of ``SCHEMES``.
        config: the config dict (``PretrainedConfig.to_dict()`` or ``config.json``).
        layer_type: the layer type, for per-layer-type rope parameters (Gemma 4).
        layer_idx: the layer, for per-layer head dims (Gemma 4); sets ``layer_type``.

    Raises:
        ValueError: unknown ``scheme`` (naming the ``model_type``); a rope key
            the scheme's scaling does not know; sections that do not sum to the rotary half; a
            ``layer_type`` not in the config; missing fields.
    """
    config = _as_dict(config)
    model_type = config.get("model_type")
    if scheme not in SCHEMES:
        raise ValueError(
            f"unknown scheme {scheme!r} (model_type {model_type!r}); known schemes: "
            f"{', '.join(sorted(SCHEMES))}"
        )
    parts = ("vision_config",) if scheme in _VISION else ("thinker_config", "text_config")
    for part in parts:  # a composite model's config: its text (Omni: thinker's) or vision part
        if config.get(part) is not None:
            config = _as_dict(config[part])
    return SCHEMES[scheme](config, layer_type, layer_idx)


def _as_dict(config: object) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        raise TypeError(f"config must be a dict or a PretrainedConfig, got {type(config)}")
    return to_dict()
