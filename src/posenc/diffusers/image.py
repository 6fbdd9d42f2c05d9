"""Text-to-image transformers: their position rows.

Shapes: ``D`` head_dim, ``C`` d_model, ``H x W`` patches, ``N = H W`` image tokens.

* Flux (Black Forest Labs 2024) and its kin rotate ``D`` features in one block per id axis
  ``(t, y, x)`` (``axes_dims_rope``, e.g. ``(16, 56, 56)``), adjacent pairs, theta 10000
  (Flux.2, Flux.3 and Krea 2 read ``rope_theta``; Flux.2 adds a fourth axis); HiDream-I1
  builds the same angles as 2x2 rotation matrices.
* PRX: the same blocks on ``(y, x)`` (``axes_dim``, ``theta``), as 2x2 matrices.
* Qwen-Image (Qwen team 2025, sec. 2.3, "MSRoPE") uses Flux's blocks at centred rows and
  columns; its text continues on the diagonal from ``max(H//2, W//2)``.
* Lumina-Image 2.0 and Z-Image place the image after the caption on axis 0, Bria FIBO 2
  after its gist tokens; Qwen-Image 2.1 centres the image's rows and columns at the
  caption's length on axis 0.
* Hunyuan-DiT (Li et al. 2024): two blocks of ``D/2``, the column's first, at fractional
  coordinates of the image's crop in a 512-pixel canvas. Lumina-Next (Zhuo et al. 2024):
  pairs alternate row and column.
* CogView4 and GLM-Image: two blocks of ``D/2`` in the half-split layout ``(i, i + D/2)``;
  CogView4 resamples rows and columns onto ``rope_axes_dim`` positions.
* Ideogram 4: Qwen3-VL's interleaved M-RoPE (``posenc.MRoPE``, positions ``[3, N]``), the
  image at ``(0, y, x)`` shifted by 65536.
* The sin-cos tables and the models without positions: ``posenc.diffusers.tables``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.diffusers._common import (
    Config,
    Family,
    axes_rope,
    head_dim,
    need,
    resize_crop,
    row,
    rows_columns,
)
from posenc.diffusers.grids import (
    centred_positions,
    crop_positions,
    grid_positions,
)
from posenc.encodings.rotary.axial import AxialRope
from posenc.encodings.rotary.mrope import MRoPE

__all__ = ["IMAGE_FAMILIES"]

IDEOGRAM4_IMAGE_OFFSET = 65536  # diffusers' pipeline_ideogram4.IMAGE_POSITION_OFFSET


def _flux(config: Config) -> AxialRope:
    return axes_rope(head_dim(config), need(config, "axes_dims_rope"), 10000.0)


def _flux2(config: Config) -> AxialRope:
    return axes_rope(head_dim(config), need(config, "axes_dims_rope"), need(config, "rope_theta"))


def _ids(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Image ids ``(t, y, x)`` for three axes, ``(y, x)`` for two, zero-padded past three."""
    ids = grid_positions(frames, height, width)
    axes = len(need(config, "axes_dims_rope"))
    if axes == 2:
        return ids[:, 1:]
    return torch.cat((ids, ids.new_zeros(ids.shape[0], axes - 3)), dim=1) if axes > 3 else ids


def _qwen(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Centred rows and columns.

    Raises:
        ValueError: ``use_layer3d_rope`` (Qwen-Image-Layered): its layers and condition image
            are numbered by ``QwenEmbedLayer3DRope``, not built here (the rotation is the same;
            pass its positions to ``rotate`` yourself).
    """
    if config.get("use_layer3d_rope"):
        raise ValueError(
            "use_layer3d_rope=True (Qwen-Image-Layered) numbers layers and the condition image "
            "its own way; diffusers_positions does not build them (the RoPE module is the same)"
        )
    return centred_positions(frames, height, width)


def _lumina2(config: Config) -> AxialRope:
    width = int(need(config, "hidden_size")) // int(need(config, "num_attention_heads"))
    return axes_rope(width, need(config, "axes_dim_rope"), 10000.0)


def _z_image(config: Config) -> AxialRope:
    width = int(need(config, "dim")) // int(need(config, "n_heads"))
    return axes_rope(width, need(config, "axes_dims"), need(config, "rope_theta"))


def _after(key: str, offset: int, default: int | None = 0):
    """Images at ``t = config[key] + offset``: after the caption (``caption_length``, a key
    of the call, default 0; Lumina 2: ``offset=0``; Z-Image: 1, the caption padded to 32) or
    after Bria FIBO 2's gist tokens (``max_num_gist_tokens + 1``)."""

    def positions(config: Config, frames: int, height: int, width: int) -> Tensor:
        start = int(config.get(key, default) if default is not None else need(config, key))
        return grid_positions(frames, height, width, start=(start + offset, 0, 0))

    return positions


def _centred_after_caption(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Qwen-Image 2.1: the image's frame axis at the caption's length, rows and columns
    centred (``caption_length``, a key of the call, default 0)."""
    index = int(config.get("caption_length", 0))
    return centred_positions(frames, height, width, index=index)


def _prx(config: Config) -> AxialRope:
    width = int(need(config, "hidden_size")) // int(need(config, "num_heads"))
    dims = config.get("axes_dim") or (32, 32)  # the model's default when the config has none
    return axes_rope(width, dims, need(config, "theta"))


def _hunyuan_dit(config: Config) -> AxialRope:
    return AxialRope(head_dim(config), axis_order=(1, 0), pairs="interleaved")


def _hunyuan_dit_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    base = 512 // 8 // int(need(config, "patch_size"))
    return crop_positions(height, width, resize_crop((height, width), (base, base)))


def _lumina_next(config: Config) -> AxialRope:
    """Base ``10000 ntk_factor``: the pipeline's time-aware scaling (Lumina-Next, Zhuo et al.
    2024, sec. 2.3) passes ``ntk_factor`` or ``linear_factor`` (keys of the call, default 1)."""
    width = int(need(config, "hidden_size")) // int(need(config, "num_attention_heads"))
    base = 10000.0 * float(config.get("ntk_factor", 1.0))
    return AxialRope(width, base=base, cyclic=True, pairs="interleaved")


def _lumina_next_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Rows and columns, divided by ``linear_factor`` when it is not 1."""
    factor = float(config.get("linear_factor", 1.0))
    positions = rows_columns(config, frames, height, width)
    return positions if factor == 1.0 else positions.double() / factor


def _half_split_2d(config: Config) -> AxialRope:
    return AxialRope(head_dim(config))


def _cogview4_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Rows and columns resampled onto ``rope_axes_dim`` positions: ``y = i R_h // H``."""
    size_h, size_w = (int(n) for n in need(config, "rope_axes_dim"))
    rows = torch.arange(height) * size_h // height
    cols = torch.arange(width) * size_w // width
    return torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).reshape(-1, 2)


def _ideogram4(config: Config) -> MRoPE:
    """Qwen3-VL's interleaved M-RoPE; pairs past ``3 s_h`` / ``3 s_w`` follow time, so time
    gets the rest of the ``D/2`` pairs whatever its own section says."""
    width = head_dim(config)
    _, s_h, s_w = (int(s) for s in need(config, "mrope_section"))
    sections = (width // 2 - s_h - s_w, s_h, s_w)
    base = float(need(config, "rope_theta"))
    return MRoPE(width, mrope_section=sections, base=base, mrope_interleaved=True)


def _ideogram4_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """``[3, N]``: ``(0, y, x)`` plus the pipeline's image offset 65536 on every axis
    (``IMAGE_POSITION_OFFSET``, keeping images apart from text ``(i, i, i)``)."""
    return (grid_positions(frames, height, width) + IDEOGRAM4_IMAGE_OFFSET).T.contiguous()


IMAGE_FAMILIES: tuple[Family, ...] = (
    row(
        "Flux axes RoPE",
        "FluxTransformer2DModel ChromaTransformer2DModel LongCatImageTransformer2DModel "
        "OvisImageTransformer2DModel BriaTransformer2DModel HiDreamImageTransformer2DModel",
        _flux, _ids, "FluxPosEmbed and its copies; HiDreamImageEmbedND",
    ),
    row(
        "Flux.2 axes RoPE",
        "Flux2Transformer2DModel Flux3Transformer2DModel Krea2Transformer2DModel "
        "BriaFiboTransformer2DModel",
        _flux2, _ids, "Flux2PosEmbed, Flux3PosEmbed, Krea2RotaryPosEmbed",
    ),
    row(
        "PRX axes RoPE (rows, columns)", "PRXTransformer2DModel", _prx, rows_columns,
        "PRXEmbedND (2x2 matrices)",
    ),
    row(
        "Qwen-Image MSRoPE", "QwenImageTransformer2DModel NucleusMoEImageTransformer2DModel",
        _flux, _qwen, "QwenEmbedRope, NucleusMoEEmbedRope",
    ),
    row(
        "Qwen-Image 2.1 MSRoPE", "QwenImage21Transformer2DModel", _flux, _centred_after_caption,
        "QwenImage21Rope",
    ),
    row(
        "Lumina 2 axes RoPE", "Lumina2Transformer2DModel", _lumina2, _after("caption_length", 0),
        "Lumina2RotaryPosEmbed",
    ),
    row(
        "Z-Image axes RoPE", "ZImageTransformer2DModel", _z_image, _after("caption_length", 1),
        "RopeEmbedder",
    ),
    row(
        "Bria FIBO 2 axes RoPE", "BriaFibo2Transformer2DModel", _z_image,
        _after("max_num_gist_tokens", 1, None), "RopeEmbedder (transformer_bria_fibo2)",
    ),
    row(
        "Hunyuan-DiT 2-D RoPE", "HunyuanDiT2DModel", _hunyuan_dit, _hunyuan_dit_positions,
        "get_2d_rotary_pos_embed",
    ),
    row(
        "Lumina-Next 2-D RoPE", "LuminaNextDiT2DModel", _lumina_next, _lumina_next_positions,
        "get_2d_rotary_pos_embed_lumina",
    ),
    row(
        "CogView4 2-D RoPE", "CogView4Transformer2DModel", _half_split_2d, _cogview4_positions,
        "CogView4RotaryPosEmbed",
    ),
    row(
        "GLM-Image 2-D RoPE", "GlmImageTransformer2DModel", _half_split_2d, rows_columns,
        "GlmImageRotaryPosEmbed",
    ),
    row(
        "Ideogram 4 M-RoPE", "Ideogram4Transformer2DModel", _ideogram4, _ideogram4_positions,
        "Ideogram4MRoPE",
    ),
)  # fmt: skip
