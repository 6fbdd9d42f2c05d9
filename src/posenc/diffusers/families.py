"""The diffusion transformers' positions, one row per diffusers model class.

Shapes: ``D`` head_dim, ``C`` d_model, ``N`` tokens, ``A`` axes. A row says which posenc
module a model's config gives (``build(config)``) and the positions of its image/video
tokens (``positions(config, frames, height, width)``, in patches). The RoPE families are
all ``AxialRope`` with one feature block per axis, ``f = theta ** (-2i / S_b)`` in block
``b`` of ``S_b`` features (Black Forest Labs 2024, Flux; Su et al. 2021, RoFormer, eq. 34,
per axis), and differ in their axis sizes, ``theta``, pair layout and positions:

=====================  ==========================================  ================
family                 axis sizes ``S_b`` / theta                  positions
=====================  ==========================================  ================
Flux, Chroma, ...      ``axes_dims_rope`` / 10000 (Flux.2: config) ids ``(t, y, x)``
Qwen-Image             ``axes_dims_rope`` / 10000                  centred ``(t, y, x)``
Wan, SkyReels-V2, ...  ``(D - 4 [D/6], 2 [D/6], 2 [D/6])`` / 10000 ``(t, y, x)``
HunyuanVideo, -Image   ``rope_axes_dim`` / ``rope_theta`` (256)    ``(t, y, x)``
CogVideoX (5B)         ``(D/4, 3D/8, 3D/8)`` / 10000               ``(t, y, x)``
Lumina 2, Z-Image      ``axes_dim_rope`` / 10000, ``rope_theta``   ``(cap, y, x)``
Hunyuan-DiT            ``(D/2, D/2)`` column first / 10000         crop ``(y, x)``
Lumina-Next            ``(D/2, D/2)`` pairs alternate rows/columns ``(y, x)``
=====================  ==========================================  ================

All rotate adjacent pairs ``(2i, 2i+1)`` (diffusers' ``repeat_interleave_real`` tables,
its ``use_real_unbind_dim=-1`` or complex ``freqs_cis``). The sin-cos families (DiT,
PixArt, SD3, CogVideoX 2B, Latte) are ``GridSinCos`` tables (``posenc.diffusers.sincos``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posenc.base import PositionalEncoding
from posenc.diffusers.grids import (
    centred_positions,
    crop_positions,
    grid_positions,
    sincos_positions,
)
from posenc.diffusers.sincos import GridSinCos
from posenc.encodings.rotary.axial import AxialRope

__all__ = ["FAMILIES", "Family", "family_of"]

Config = Mapping[str, Any]


@dataclass(frozen=True)
class Family:
    """One row: a family of diffusers model classes and how posenc builds their positions.

    Attributes:
        name: the family's name in the docs.
        classes: the diffusers model class names (``_class_name`` in ``config.json``).
        build: ``config -> module`` (``AxialRope`` or ``GridSinCos``).
        positions: ``(config, frames, height, width) -> [N, A]`` image/video token
            positions, in patches.
        reference: the diffusers code the parity suite compares with.
    """

    name: str
    classes: tuple[str, ...]
    build: Callable[[Config], PositionalEncoding]
    positions: Callable[[Config, int, int, int], Tensor]
    reference: str


def _need(config: Config, key: str) -> Any:
    if key not in config or config[key] is None:
        raise ValueError(f"the config has no {key!r} (keys: {', '.join(sorted(config))})")
    return config[key]


def _axes_rope(head_dim: int, dims: Any, base: float) -> AxialRope:
    """Blocks of ``dims`` features per axis, adjacent pairs."""
    dims = [int(d) for d in dims]
    return AxialRope(
        int(head_dim), base=float(base), axis_order=tuple(range(len(dims))), pairs="interleaved",
        axis_dim=dims,
    )  # fmt: skip


def _head_dim(config: Config) -> int:
    return int(_need(config, "attention_head_dim"))


def _flux(config: Config) -> AxialRope:
    return _axes_rope(_head_dim(config), _need(config, "axes_dims_rope"), 10000.0)


def _flux2(config: Config) -> AxialRope:
    return _axes_rope(
        _head_dim(config), _need(config, "axes_dims_rope"), _need(config, "rope_theta")
    )


def _wan(config: Config) -> AxialRope:
    head_dim = _head_dim(config)
    spatial = 2 * (head_dim // 6)
    return _axes_rope(head_dim, (head_dim - 2 * spatial, spatial, spatial), 10000.0)


def _hunyuan_video(config: Config) -> AxialRope:
    return _axes_rope(
        _head_dim(config), _need(config, "rope_axes_dim"), _need(config, "rope_theta")
    )


def _lumina2(config: Config) -> AxialRope:
    dims = _need(config, "axes_dim_rope")
    return _axes_rope(
        int(_need(config, "hidden_size")) // int(_need(config, "num_attention_heads")),
        dims,
        10000.0,
    )


def _z_image(config: Config) -> AxialRope:
    dims = _need(config, "axes_dims")
    head_dim = int(_need(config, "dim")) // int(_need(config, "n_heads"))
    return _axes_rope(head_dim, dims, _need(config, "rope_theta"))


def _cogvideox(config: Config) -> PositionalEncoding:
    head_dim = _head_dim(config)
    if config.get("use_rotary_positional_embeddings"):
        return _axes_rope(head_dim, (head_dim // 4, head_dim // 8 * 3, head_dim // 8 * 3), 1e4)
    width = head_dim * int(_need(config, "num_attention_heads"))
    return GridSinCos(
        width, axis_dims=(width // 4, 3 * width // 8, 3 * width // 8), axis_order=(0, 2, 1)
    )


def _hunyuan_dit(config: Config) -> AxialRope:
    return AxialRope(_head_dim(config), axis_order=(1, 0), pairs="interleaved")


def _lumina_next(config: Config) -> AxialRope:
    head_dim = int(_need(config, "hidden_size")) // int(_need(config, "num_attention_heads"))
    return AxialRope(head_dim, cyclic=True, pairs="interleaved")


def _sincos_2d(config: Config) -> GridSinCos:
    return GridSinCos(_head_dim(config) * int(_need(config, "num_attention_heads")))


# ----------------------------------------------------------------------------- positions


def _video(config: Config, frames: int, height: int, width: int) -> Tensor:
    return grid_positions(frames, height, width)


def _image(config: Config, frames: int, height: int, width: int) -> Tensor:
    return grid_positions(frames, height, width)[:, 1:]


def _image_or_video(config: Config, frames: int, height: int, width: int) -> Tensor:
    full = grid_positions(frames, height, width)
    return full if len(_need(config, "rope_axes_dim")) == 3 else full[:, 1:]


def _after_caption(offset: int) -> Callable[[Config, int, int, int], Tensor]:
    """Lumina 2 (``offset=0``) and Z-Image (``offset=1``) put the image after the caption:
    ``t = caption_length + offset + f`` (``caption_length``: a key of the call, default 0;
    Z-Image's is the caption padded to a multiple of 32)."""

    def positions(config: Config, frames: int, height: int, width: int) -> Tensor:
        start = int(config.get("caption_length", 0)) + offset
        return grid_positions(frames, height, width, start=(start, 0, 0))

    return positions


def _qwen(config: Config, frames: int, height: int, width: int) -> Tensor:
    return centred_positions(frames, height, width)


def _flux2_ids(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Flux.2's four axes ``(t, y, x, l)``: image ids with ``l = 0``."""
    ids = grid_positions(frames, height, width)
    extra = len(_need(config, "axes_dims_rope")) - 3
    return torch.cat((ids, ids.new_zeros(ids.shape[0], extra)), dim=1) if extra > 0 else ids


def _cogvideox_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """CogVideoX's 2B sin-cos grid divided by its interpolation scales; the 5B RoPE's crop
    coordinates (CogVideoX 1.5, with ``patch_size_t``: the integer grid)."""
    if not config.get("use_rotary_positional_embeddings"):
        time = float(config.get("temporal_interpolation_scale", 1.0))
        space = float(config.get("spatial_interpolation_scale", 1.875))
        scales = torch.tensor([time, space, space], dtype=torch.float64)
        return grid_positions(frames, height, width).double() / scales
    if config.get("patch_size_t") is not None:
        return grid_positions(frames, height, width)
    patch = int(_need(config, "patch_size"))
    base_h = int(_need(config, "sample_height")) // patch
    base_w = int(_need(config, "sample_width")) // patch
    return crop_positions(
        height, width, _resize_crop((height, width), (base_h, base_w)), frames=frames
    )


def _resize_crop(
    grid: tuple[int, int], base: tuple[int, int]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The crop region of a ``grid`` inside a ``base``-sized canvas, aspect kept and centred
    (diffusers' ``get_resize_crop_region_for_grid``)."""
    (h, w), (th, tw) = grid, base
    if h / w > th / tw:
        rh, rw = th, round(th / h * w)
    else:
        rw, rh = tw, round(tw / w * h)
    top, left = round((th - rh) / 2.0), round((tw - rw) / 2.0)
    return (top, left), (top + rh, left + rw)


def _hunyuan_dit_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    base = 512 // 8 // int(_need(config, "patch_size"))
    return crop_positions(height, width, _resize_crop((height, width), (base, base)))


def _lumina_next_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    return grid_positions(1, height, width)[:, 1:]


def _sincos_2d_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """DiT and SD3: ``interpolation_scale`` 1 (SD3 crops a ``pos_embed_max_size`` table)."""
    base = int(_need(config, "sample_size")) // int(_need(config, "patch_size"))
    return sincos_positions(
        height, width, base_size=base, max_size=config.get("pos_embed_max_size")
    )


def _pixart_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """PixArt: ``interpolation_scale`` from the config, else ``max(sample_size // 64, 1)``."""
    size = int(_need(config, "sample_size"))
    scale = config.get("interpolation_scale")
    scale = max(size // 64, 1) if scale is None else float(scale)
    base = size // int(_need(config, "patch_size"))
    return sincos_positions(height, width, base_size=base, interpolation_scale=scale)


def _row(name: str, classes: str, build, positions, reference: str) -> Family:
    return Family(name, tuple(classes.split()), build, positions, reference)


FAMILIES: tuple[Family, ...] = (
    _row(
        "Flux axes RoPE",
        "FluxTransformer2DModel ChromaTransformer2DModel LongCatImageTransformer2DModel "
        "OvisImageTransformer2DModel BriaTransformer2DModel",
        _flux,
        _video,
        "FluxPosEmbed(theta=10000, axes_dim) at ids (t, y, x)",
    ),
    _row(
        "Flux.2 axes RoPE",
        "Flux2Transformer2DModel Flux3Transformer2DModel Krea2Transformer2DModel",
        _flux2,
        _flux2_ids,
        "Flux2PosEmbed",
    ),
    _row("Qwen-Image MSRoPE", "QwenImageTransformer2DModel", _flux, _qwen, "QwenEmbedRope"),
    _row(
        "Wan 3-D RoPE",
        "WanTransformer3DModel WanVACETransformer3DModel WanAnimateTransformer3DModel "
        "SanaVideoTransformer3DModel SkyReelsV2Transformer3DModel",
        _wan,
        _video,
        "WanRotaryPosEmbed",
    ),
    _row(
        "HunyuanVideo 3-D RoPE",
        "HunyuanVideoTransformer3DModel HunyuanVideo15Transformer3DModel "
        "MotifVideoTransformer3DModel HunyuanImageTransformer2DModel",
        _hunyuan_video,
        _image_or_video,
        "HunyuanVideoRotaryPosEmbed, HunyuanImageRotaryPosEmbed",
    ),
    _row(
        "Lumina 2 axes RoPE",
        "Lumina2Transformer2DModel",
        _lumina2,
        _after_caption(0),
        "Lumina2RotaryPosEmbed",
    ),
    _row(
        "Z-Image axes RoPE", "ZImageTransformer2DModel", _z_image, _after_caption(1), "RopeEmbedder"
    ),
    _row(
        "CogVideoX 3-D RoPE / 3-D sin-cos",
        "CogVideoXTransformer3DModel",
        _cogvideox,
        _cogvideox_positions,
        "get_3d_rotary_pos_embed, CogVideoXPatchEmbed",
    ),
    _row(
        "Hunyuan-DiT 2-D RoPE",
        "HunyuanDiT2DModel",
        _hunyuan_dit,
        _hunyuan_dit_positions,
        "get_2d_rotary_pos_embed",
    ),
    _row(
        "Lumina-Next 2-D RoPE",
        "LuminaNextDiT2DModel",
        _lumina_next,
        _lumina_next_positions,
        "get_2d_rotary_pos_embed_lumina",
    ),
    _row(
        "2-D sin-cos table",
        "DiTTransformer2DModel SD3Transformer2DModel",
        _sincos_2d,
        _sincos_2d_positions,
        "PatchEmbed (get_2d_sincos_pos_embed)",
    ),
    _row(
        "PixArt 2-D sin-cos table",
        "PixArtTransformer2DModel",
        _sincos_2d,
        _pixart_positions,
        "PatchEmbed (get_2d_sincos_pos_embed)",
    ),
)


def family_of(class_name: str) -> Family:
    """The row of a diffusers model class.

    Raises:
        ValueError: a class that is not in the table (the message lists them).
    """
    for row in FAMILIES:
        if class_name in row.classes:
            return row
    known = sorted(c for row in FAMILIES for c in row.classes)
    raise ValueError(
        f"no positions known for diffusers class {class_name!r}; known: {', '.join(known)}"
    )
