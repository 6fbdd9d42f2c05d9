"""Image transformers whose positions are a table added to the patch embeddings, or none.

Shapes: ``C`` d_model, ``H x W`` patches, ``N = H W`` image tokens. DiT (Peebles & Xie 2023,
sec. 3.1), PixArt-α (Chen et al. 2023) and Stable Diffusion 3 (Esser et al. 2024) add MAE's
2-D sin-cos table (``GridSinCos``, the column's block first) at scaled coordinates
(``sincos_positions``); SD3 centre-crops a ``pos_embed_max_size`` table and CogView3-Plus
reads its top-left corner at integer rows and columns. Sana (Xie et al. 2024) has no
positions (``NoPE``) unless its config sets ``interpolation_scale``; DreamLite has none;
Transformer2DModel adds PixArt's table to patches and nothing to continuous inputs.
"""

from __future__ import annotations

from torch import Tensor

from posenc.base import PositionalEncoding
from posenc.diffusers._common import Config, Family, head_dim, need, row, rows_columns
from posenc.diffusers.grids import sincos_positions
from posenc.diffusers.sincos import GridSinCos
from posenc.encodings.nope import NoPE

__all__ = ["TABLE_FAMILIES"]


def _sincos_2d(config: Config) -> GridSinCos:
    return GridSinCos(head_dim(config) * int(need(config, "num_attention_heads")))


def _sincos_2d_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """DiT and SD3: interpolation scale 1 (SD3 crops a ``pos_embed_max_size`` table)."""
    base = int(need(config, "sample_size")) // int(need(config, "patch_size"))
    return sincos_positions(
        height, width, base_size=base, max_size=config.get("pos_embed_max_size")
    )


def _sana(config: Config) -> PositionalEncoding:
    """Sana: no positional encoding (NoPE) unless ``interpolation_scale`` is set."""
    return NoPE() if config.get("interpolation_scale") is None else _sincos_2d(config)


def _sana_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    scale = config.get("interpolation_scale")
    if scale is None:
        return rows_columns(config, frames, height, width)  # NoPE reads none
    base = int(need(config, "sample_size")) // int(need(config, "patch_size"))
    return sincos_positions(height, width, base_size=base, interpolation_scale=float(scale))


def _transformer2d(config: Config) -> PositionalEncoding:
    """Transformer2DModel by input kind: patches get PixArt's sin-cos table, continuous
    inputs (a convolution in) none.

    Raises:
        ValueError: discrete inputs (``num_vector_embeds``), whose learned row and column
            tables are checkpoint weights.
    """
    if config.get("num_vector_embeds") is not None:
        raise ValueError(
            "Transformer2DModel with num_vector_embeds (discrete inputs) adds learned "
            "ImagePositionalEmbeddings tables (checkpoint weights); posenc does not build them"
        )
    return NoPE() if config.get("patch_size") is None else _sincos_2d(config)


def _pixart_positions(config: Config, frames: int, height: int, width: int) -> Tensor:
    """PixArt: ``interpolation_scale`` from the config, else ``max(sample_size // 64, 1)``."""
    size = int(need(config, "sample_size"))
    scale = config.get("interpolation_scale")
    scale = max(size // 64, 1) if scale is None else float(scale)
    base = size // int(need(config, "patch_size"))
    return sincos_positions(height, width, base_size=base, interpolation_scale=scale)


TABLE_FAMILIES: tuple[Family, ...] = (
    row(
        "2-D sin-cos table", "DiTTransformer2DModel SD3Transformer2DModel", _sincos_2d,
        _sincos_2d_positions, "PatchEmbed (get_2d_sincos_pos_embed)",
    ),
    row(
        "Sana: NoPE, or a 2-D sin-cos table", "SanaTransformer2DModel", _sana, _sana_positions,
        "PatchEmbed (pos_embed_type None or sincos)",
    ),
    row(
        "CogView3-Plus 2-D sin-cos table (top-left of the max table)",
        "CogView3PlusTransformer2DModel", _sincos_2d, rows_columns,
        "CogView3PlusPatchEmbed",
    ),
    row(
        "DreamLite: none", "DreamLiteTransformer2DModel", lambda config: NoPE(), rows_columns,
        "BasicTransformerBlockDreamLite (built without positional_embeddings)",
    ),
    row(
        "PixArt 2-D sin-cos table", "PixArtTransformer2DModel", _sincos_2d, _pixart_positions,
        "PatchEmbed (get_2d_sincos_pos_embed)",
    ),
    row(
        "Transformer2DModel: PixArt's table (patches) or NoPE (continuous)",
        "Transformer2DModel", _transformer2d, _pixart_positions,
        "PatchEmbed (get_2d_sincos_pos_embed)",
    ),
)  # fmt: skip
