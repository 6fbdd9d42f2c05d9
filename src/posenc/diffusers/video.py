"""Video transformers: their position rows.

Shapes: ``D`` head_dim, ``C`` d_model, ``F x H x W`` patches, ``N = F H W`` tokens. Every
RoPE here rotates one block of features per axis ``(t, y, x)``, adjacent pairs:

* Wan 2.1 (Wan team 2025, sec. 3.1) and the models built on it: blocks
  ``(D - 4 [D/6], 2 [D/6], 2 [D/6])``, theta 10000; ChronoEdit numbers a two-frame edit
  ``t = (0, temporal_skip_len - 1)``; Wan-Animate 2 offsets each stream and strides its
  frames;
* HunyuanVideo (Kong et al. 2024, sec. 3.2): ``rope_axes_dim`` (16, 56, 56), theta 256
  (HunyuanImage: the same on two axes); Helios: ``rope_dim`` / ``rope_theta`` at the frame
  indices of the current and history latents (here ``0..F-1``);
* Kandinsky 5 and 6: ``axes_dims`` (``D`` their sum), theta 10000, as 2x2 matrices, at
  the grid divided by the pipeline's per-axis ``scale_factor``; the video tokens only (the
  1-D text and audio RoPE beside them are plain ``RotaryEmbedding``);
* JoyImage-Edit: ``rope_dim_list`` / ``theta`` (256) like HunyuanVideo (Edit-Plus puts each
  reference after the target on the frame axis);
* Allegro: three blocks of ``D/3`` features, each half-split on its own, at the grid
  divided by ``interpolation_scale_t/h/w``;
* MiniMax-H3: three blocks of ``2 rope_freq_dim`` features with the same frequencies,
  half-split over the rotated ``6 rope_freq_dim`` features, the rest unrotated, at the
  ``(t, y, x)`` the caller passes (here the grid);
* TransformerTemporalModel (the temporal layers of the video UNets) adds the paper's
  sinusoidal table over frames when ``positional_embeddings="sinusoidal"`` (Vaswani et al.
  2017, sec. 3.5), else nothing;
* CogVideoX (Yang et al. 2024, sec. 2.2, 3-D RoPE): blocks ``(D/4, 3D/8, 3D/8)``, theta
  10000, at the fractional coordinates of the video's crop in the ``sample_height x
  sample_width`` canvas (CogVideoX 1.5, with ``patch_size_t``: the integer grid);
  EasyAnimate uses the same at a fixed 60 x 90 canvas. CogVideoX 2B adds a 3-D sin-cos
  table instead (``C/4`` for time, ``3C/8`` per spatial axis).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.base import PositionalEncoding
from posenc.diffusers._common import Config, Family, axes_rope, head_dim, need, resize_crop, row
from posenc.diffusers.grids import crop_positions, grid_positions
from posenc.diffusers.sincos import GridSinCos
from posenc.encodings.nope import NoPE
from posenc.encodings.rotary.axial import AxialRope
from posenc.encodings.sinusoidal import SinusoidalPositionalEncoding

__all__ = ["VIDEO_FAMILIES"]


def _wan(config: Config) -> AxialRope:
    width = head_dim(config)
    spatial = 2 * (width // 6)
    return axes_rope(width, (width - 2 * spatial, spatial, spatial), 10000.0)


def _wan_animate2(config: Config) -> AxialRope:
    width = int(need(config, "dim")) // int(need(config, "num_heads"))
    return _wan({"attention_head_dim": width})


def _offset_strided(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Wan-Animate 2's streams: ``(offset_t + j stride, offset_y + i, offset_x + k)``
    (``rope_offsets`` and ``rope_stride``, keys of the call, default ``(0, 0, 0)`` and 1)."""
    stride = int(config.get("rope_stride", 1))
    offsets = [int(o) for o in config.get("rope_offsets", (0, 0, 0))]
    positions = grid_positions(frames, height, width, start=(0, offsets[1], offsets[2]))
    positions[:, 0] = positions[:, 0] * stride + offsets[0]
    return positions


def _video(config: Config, frames: int, height: int, width: int) -> Tensor:
    return grid_positions(frames, height, width)


def _chronoedit(config: Config, frames: int, height: int, width: int) -> Tensor:
    """Two frames (an image and its edit) sit ``temporal_skip_len - 1`` apart."""
    positions = grid_positions(frames, height, width)
    if frames == 2:
        skip = int(need(config, "rope_temporal_skip_len"))
        positions[:, 0] *= skip - 1
    return positions


def _hunyuan(config: Config) -> AxialRope:
    return axes_rope(head_dim(config), need(config, "rope_axes_dim"), need(config, "rope_theta"))


def _hunyuan_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    full = grid_positions(frames, height, width)
    return full if len(need(config, "rope_axes_dim")) == 3 else full[:, 1:]


def _helios(config: Config) -> AxialRope:
    return axes_rope(head_dim(config), need(config, "rope_dim"), need(config, "rope_theta"))


def _kandinsky(config: Config) -> AxialRope:
    dims = need(config, "axes_dims")
    return axes_rope(sum(int(d) for d in dims), dims, 10000.0)


def _kandinsky_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """The grid divided by the pipeline's ``scale_factor`` per axis (a key of the call,
    default ``(1, 1, 1)``)."""
    scale = torch.tensor(config.get("scale_factor", (1.0, 1.0, 1.0)), dtype=torch.float64)
    if scale.shape != (3,) or not bool((scale > 0).all()):
        raise ValueError(f"scale_factor must be three numbers > 0, got {scale.tolist()}")
    return grid_positions(frames, height, width).double() / scale


def _minimax_h3(config: Config) -> AxialRope:
    """Three blocks of ``2 F`` features sharing one set of ``F`` frequencies, laid out
    half-split over the ``6 F`` rotated features (``rope_freq_dim`` ``F``); the rest pass."""
    size = 2 * int(need(config, "rope_freq_dim"))
    base = float(need(config, "rope_theta"))
    return AxialRope(head_dim(config), base=base, axis_order=(0, 1, 2), axis_dim=size)


def _joyimage(config: Config) -> AxialRope:
    width = int(need(config, "hidden_size")) // int(need(config, "num_attention_heads"))
    dims = config.get("rope_dim_list") or (width // 3,) * 3
    return axes_rope(width, dims, need(config, "theta"))


def _temporal(config: Config) -> PositionalEncoding:
    """TransformerTemporalModel: the paper's sinusoidal table over frames when
    ``positional_embeddings="sinusoidal"``, else none."""
    kind = config.get("positional_embeddings")
    if kind is None:
        return NoPE()
    if kind != "sinusoidal":
        raise ValueError(f"unknown positional_embeddings {kind!r}; diffusers knows 'sinusoidal'")
    width = head_dim(config) * int(need(config, "num_attention_heads"))
    return SinusoidalPositionalEncoding(
        width, max_len=int(need(config, "num_positional_embeddings"))
    )


def _frames(config: Config, frames: int, height: int, width: int) -> Tensor:
    """The frame index of each frame, ``[F]`` (the temporal layers attend over frames)."""
    return torch.arange(frames)


def _allegro(config: Config) -> AxialRope:
    """Three blocks of ``D/3`` features, each half-split on its own (``pairs="per_axis"``)."""
    width = head_dim(config)
    return AxialRope(width, axis_order=(0, 1, 2), pairs="per_axis", axis_dim=width // 3)


def _allegro_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """The grid divided by ``interpolation_scale_t/h/w`` (float64)."""
    keys = ("interpolation_scale_t", "interpolation_scale_h", "interpolation_scale_w")
    scales = torch.tensor([float(need(config, key)) for key in keys], dtype=torch.float64)
    return grid_positions(frames, height, width).double() / scales


def _cogvideox_dims(width: int) -> tuple[int, int, int]:
    return width // 4, width // 8 * 3, width // 8 * 3


def _cogvideox(config: Config) -> PositionalEncoding:
    """The 5B's RoPE or the 2B's sin-cos table.

    Raises:
        ValueError: ``use_learned_positional_embeddings`` (CogVideoX-5b-I2V), whose added
            table is loaded from the checkpoint (weights, not a formula).
    """
    if config.get("use_learned_positional_embeddings"):
        raise ValueError(
            "use_learned_positional_embeddings=True adds a position table loaded from the "
            "checkpoint (CogVideoX-5b-I2V) beside the RoPE; posenc does not build it"
        )
    if config.get("use_rotary_positional_embeddings"):
        return axes_rope(head_dim(config), _cogvideox_dims(head_dim(config)), 10000.0)
    width = head_dim(config) * int(need(config, "num_attention_heads"))
    dims = (width // 4, 3 * width // 8, 3 * width // 8)
    return GridSinCos(width, axis_dims=dims, axis_order=(0, 2, 1))


def _cogvideox_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """The 2B's sin-cos grid divided by its interpolation scales; the RoPE's crop
    coordinates (CogVideoX 1.5, with ``patch_size_t``: the integer grid)."""
    if not config.get("use_rotary_positional_embeddings"):
        time = float(config.get("temporal_interpolation_scale", 1.0))
        space = float(config.get("spatial_interpolation_scale", 1.875))
        scales = torch.tensor([time, space, space], dtype=torch.float64)
        return grid_positions(frames, height, width).double() / scales
    if config.get("patch_size_t") is not None:
        return grid_positions(frames, height, width)
    patch = int(need(config, "patch_size"))
    base = (int(need(config, "sample_height")) // patch, int(need(config, "sample_width")) // patch)
    crop = resize_crop((height, width), base)
    return crop_positions(height, width, crop, frames=frames)


def _easyanimate(config: Config) -> AxialRope:
    return axes_rope(head_dim(config), _cogvideox_dims(head_dim(config)), 10000.0)


def _easyanimate_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    patch = int(need(config, "patch_size"))
    crop = resize_crop((height, width), (60 // patch, 90 // patch))
    return crop_positions(height, width, crop, frames=frames)


VIDEO_FAMILIES: tuple[Family, ...] = (
    row(
        "Wan 3-D RoPE",
        "WanTransformer3DModel WanVACETransformer3DModel WanAnimateTransformer3DModel "
        "SanaVideoTransformer3DModel SkyReelsV2Transformer3DModel AnyFlowTransformer3DModel",
        _wan, _video, "WanRotaryPosEmbed and its copies",
    ),
    row(
        "Wan-Animate 2 3-D RoPE", "WanAnimate2Transformer3DModel", _wan_animate2,
        _offset_strided, "rope_params / rope_apply (transformer_wan_animate_2)",
    ),
    row(
        "ChronoEdit 3-D RoPE", "ChronoEditTransformer3DModel", _wan, _chronoedit,
        "ChronoEditRotaryPosEmbed",
    ),
    row(
        "HunyuanVideo 3-D RoPE",
        "HunyuanVideoTransformer3DModel HunyuanVideo15Transformer3DModel "
        "MotifVideoTransformer3DModel HunyuanImageTransformer2DModel",
        _hunyuan, _hunyuan_positions, "HunyuanVideoRotaryPosEmbed and its copies",
    ),
    row(
        "Kandinsky 3-D RoPE",
        "Kandinsky5Transformer3DModel Kandinsky6Transformer3DModel Kandinsky6SRTransformer3DModel",
        _kandinsky, _kandinsky_positions, "Kandinsky5RoPE3D, Kandinsky6RoPE3D (2x2 matrices)",
    ),
    row(
        "MiniMax-H3 3-D RoPE", "MiniMaxH3Transformer3DModel", _minimax_h3, _video,
        "MiniMaxH3RotaryPosEmbed",
    ),
    row(
        "JoyImage 3-D RoPE",
        "JoyImageEditTransformer3DModel JoyImageEditPlusTransformer3DModel",
        _joyimage, _video,
        "get_rotary_pos_embed, _get_rotary_pos_embed_for_range",
    ),
    row(
        "TransformerTemporalModel: 1-D sinusoidal over frames, or none",
        "TransformerTemporalModel", _temporal, _frames, "SinusoidalPositionalEmbedding",
    ),
    row(
        "Allegro 3-D RoPE (per-axis half-split blocks, interpolated grid)",
        "AllegroTransformer3DModel", _allegro, _allegro_positions,
        "get_3d_rotary_pos_embed_allegro, apply_rotary_emb_allegro",
    ),
    row("Helios 3-D RoPE", "HeliosTransformer3DModel", _helios, _video, "HeliosRotaryPosEmbed"),
    row(
        "CogVideoX 3-D RoPE / 3-D sin-cos",
        "CogVideoXTransformer3DModel ConsisIDTransformer3DModel",
        _cogvideox, _cogvideox_positions, "get_3d_rotary_pos_embed, CogVideoXPatchEmbed",
    ),
    row(
        "EasyAnimate 3-D RoPE", "EasyAnimateTransformer3DModel", _easyanimate,
        _easyanimate_positions, "EasyAnimateRotaryPosEmbed",
    ),
)  # fmt: skip
