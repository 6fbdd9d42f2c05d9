"""diffusers' own position code, run on tiny configs: one reference per matched family.

Each case names a diffusers model class, a tiny config (the keys ``posenc.from_diffusers``
reads) and a grid ``(F, H, W)`` in patches; its ``reference`` builds diffusers' position
module from the same config (nothing downloaded, random weights where there are any) and
returns what the model uses for the image/video tokens:

* ``("real", cos, sin)``: ``[N, D]`` tables with every pair's value twice (``repeat_interleave``),
  rotated by ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-1)``;
* ``("real_half", cos, sin)``: ``[N, D]`` tables ``[c | c]`` of the half-split layout,
  rotated by ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-2)`` (CogView4, GLM);
* ``("complex", freqs)``: ``[N, D/2]`` unit complex numbers, rotated as complex pairs;
* ``("matrix", m)``: ``[N, D/2, 2, 2]`` rotation matrices, rotated by HiDream's ``apply_rope``;
* ``("pairs", cos, sin)``: ``[N, D/2]`` already one value per pair, in posenc's pair order;
* ``("rotate", fn)``: no table, only the model's own rotation ``fn(x [B, H, N, D])``.

A table may carry the model's own rotation as a last element ``fn(x [B, H, N, D])``.
* ``("table", table)``: an ``[N, C]`` sin-cos table added to the patch embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from diffusers.models import embeddings as E
from diffusers.models.attention_processor import StableAudioAttnProcessor2_0
from diffusers.models.transformers import (
    ace_step_transformer,
    transformer_anyflow,
    transformer_bria,
    transformer_bria_fibo,
    transformer_bria_fibo2,
    transformer_chronoedit,
    transformer_cogview4,
    transformer_easyanimate,
    transformer_flux,
    transformer_flux2,
    transformer_flux3,
    transformer_glm_image,
    transformer_helios,
    transformer_hidream_image,
    transformer_hunyuan_video,
    transformer_hunyuan_video15,
    transformer_hunyuanimage,
    transformer_ideogram4,
    transformer_joyimage,
    transformer_joyimage_edit_plus,
    transformer_kandinsky,
    transformer_kandinsky6,
    transformer_kandinsky6_sr,
    transformer_krea2,
    transformer_longcat_audio_dit,
    transformer_longcat_image,
    transformer_lumina2,
    transformer_minimax_h3,
    transformer_minimax_music3,
    transformer_motif_video,
    transformer_nucleusmoe_image,
    transformer_ovis_image,
    transformer_prx,
    transformer_qwenimage,
    transformer_qwenimage21,
    transformer_sana_video,
    transformer_skyreels_v2,
    transformer_stable_audio3,
    transformer_wan,
    transformer_wan_animate,
    transformer_wan_animate_2,
    transformer_z_image,
)
from diffusers.pipelines.cogvideo.pipeline_cogvideox import (
    get_resize_crop_region_for_grid as cogvideox_crop,
)
from diffusers.pipelines.consisid.pipeline_consisid import (
    get_resize_crop_region_for_grid as consisid_crop,
)
from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import (
    get_resize_crop_region_for_grid as hunyuan_crop,
)

from posenc.diffusers import grid_positions


@dataclass(frozen=True)
class Case:
    class_name: str
    config: dict[str, Any]
    grid: tuple[int, int, int]
    reference: Any  # (config, grid) -> ("real", cos, sin) | ("complex", f) | ("table", t)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.class_name}{'-' + self.note if self.note else ''}"


def _ids(grid: tuple[int, int, int], axes: int = 3) -> torch.Tensor:
    ids = grid_positions(*grid).float()
    return torch.cat((ids, ids.new_zeros(ids.shape[0], axes - 3)), dim=1) if axes > 3 else ids


def _pos_embed(module_cls):
    def reference(config, grid):
        dims = config["axes_dims_rope"]
        module = module_cls(theta=config.get("rope_theta", 10000), axes_dim=list(dims))
        return ("real", *module(_ids(grid, len(dims))))

    return reference


def _wan(module_cls):
    def reference(config, grid):
        f, h, w = grid
        module = module_cls(config["attention_head_dim"], (1, 2, 2), 32)
        cos, sin = module(torch.zeros(1, 1, f, 2 * h, 2 * w))
        return "real", cos[0, :, 0], sin[0, :, 0]

    return reference


def _hunyuan_video(module_cls):
    def reference(config, grid):
        f, h, w = grid
        module = module_cls(2, 1, list(config["rope_axes_dim"]), config["rope_theta"])
        return ("real", *module(torch.zeros(1, 1, f, 2 * h, 2 * w)))

    return reference


def _hunyuan_image(config, grid):
    _, h, w = grid
    module = transformer_hunyuanimage.HunyuanImageRotaryPosEmbed(
        (2, 2), list(config["rope_axes_dim"]), config["rope_theta"]
    )
    return ("real", *module(torch.zeros(1, 1, 2 * h, 2 * w)))


def _qwen(config, grid):
    module = transformer_qwenimage.QwenEmbedRope(
        theta=10000, axes_dim=list(config["axes_dims_rope"]), scale_rope=True
    )
    video, _ = module([grid], device=torch.device("cpu"), max_txt_seq_len=4)
    return "complex", video


def _nucleus(config, grid):
    module = transformer_nucleusmoe_image.NucleusMoEEmbedRope(
        theta=10000, axes_dim=list(config["axes_dims_rope"]), scale_rope=True
    )
    video, _ = module([grid], device=torch.device("cpu"), max_txt_seq_len=4)
    return "complex", video


def _qwen21(config, grid):
    """One image after ``caption_length`` text tokens, then two more text tokens."""
    _, h, w = grid
    module = transformer_qwenimage21.QwenImage21Rope(
        theta=10000, axes_dim=list(config["axes_dims_rope"])
    )
    text = config["caption_length"]
    mask = torch.tensor([False] * text + [True] * (h * w) + [False] * 2)
    freqs = module([(1, h, w)], mask, torch.device("cpu"))
    return "complex", freqs[text : text + h * w]


def _bria_fibo2(config, grid):
    """The image plane of ``BriaFibo2Transformer2DModel.forward``: after the gist tokens."""
    module = transformer_bria_fibo2.RopeEmbedder(
        theta=config["rope_theta"], axes_dims=list(config["axes_dims"]), axes_lens=[64, 32, 32]
    )
    start = (config["max_num_gist_tokens"] + 1, 0, 0)
    return "complex", module(grid_positions(*grid, start=start))


def _helios(config, grid):
    f, h, w = grid
    module = transformer_helios.HeliosRotaryPosEmbed(list(config["rope_dim"]), config["rope_theta"])
    table = module(torch.arange(f)[None], h, w, torch.device("cpu"))  # [1, 2D, F, H, W]
    cos, sin = table[0].flatten(1).T.chunk(2, dim=-1)
    return "real", cos, sin


def _lumina2(config, grid):
    _, h, w = grid
    module = transformer_lumina2.Lumina2RotaryPosEmbed(
        theta=10000, axes_dim=list(config["axes_dim_rope"]), axes_lens=[32, 32, 32], patch_size=2
    )
    mask = torch.ones(1, config["caption_length"], dtype=torch.bool)
    _, _, image, *_ = module(torch.zeros(1, 1, 2 * h, 2 * w), mask)
    return "complex", image[0]


def _z_image(config, grid):
    """The image ids of ``ZImageTransformer2DModel.patchify_and_embed``: after the caption."""
    module = transformer_z_image.RopeEmbedder(
        theta=config["rope_theta"], axes_dims=list(config["axes_dims"]), axes_lens=[64, 32, 32]
    )
    start = (config["caption_length"] + 1, 0, 0)
    return "complex", module(grid_positions(*grid, start=start))


def _wan_animate2(config, grid):
    """Wan-Animate 2's ``rope_apply`` with the model's per-stream offsets and frame stride."""
    width = config["dim"] // config["num_heads"]
    offsets, stride = config["rope_offsets"], config["rope_stride"]
    spatial = 2 * (width // 6)
    freqs = torch.cat(
        [
            transformer_wan_animate_2.rope_params(64, width - 2 * spatial, offset=offsets[0]),
            transformer_wan_animate_2.rope_params(64, spatial, offset=offsets[1]),
            transformer_wan_animate_2.rope_params(64, spatial, offset=offsets[2]),
        ],
        dim=1,
    )

    def rotate(x):
        sizes = torch.tensor([grid] * x.shape[0])  # one (f, h, w) per sample
        out = transformer_wan_animate_2.rope_apply(x.transpose(1, 2), sizes, freqs, stride)
        return out.transpose(1, 2)

    return "rotate", rotate


def _ideogram4(config, grid):
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import IMAGE_POSITION_OFFSET

    module = transformer_ideogram4.Ideogram4MRoPE(
        config["attention_head_dim"], config["rope_theta"], config["mrope_section"]
    )
    cos, sin = module((grid_positions(*grid) + IMAGE_POSITION_OFFSET)[None])
    return "real_half", cos[0], sin[0]


def _minimax_h3(config, grid):
    module = transformer_minimax_h3.MiniMaxH3RotaryPosEmbed(
        config["rope_freq_dim"], config["rope_theta"]
    )
    cos, sin = module(grid_positions(*grid))

    def rotate(x):  # the model's own partial rotation
        out = transformer_minimax_h3._apply_rotary_emb(x.transpose(1, 2), cos, sin)
        return out.transpose(1, 2)

    return "real_half", cos, sin, rotate


def _prx(config, grid):
    module = transformer_prx.PRXEmbedND(16, config["theta"], list(config["axes_dim"]))
    return "matrix", module(grid_positions(*grid)[None, :, 1:].float())[0, 0]


def _anyflow(config, grid):
    f, h, w = grid
    module = transformer_anyflow.AnyFlowRotaryPosEmbed(config["attention_head_dim"], (1, 2, 2), 32)
    layout = {"total_frames": f, "full_frame_shape": (h, w)}
    freqs = module(layout, torch.device("cpu"))["query"]

    def rotate(x):  # the model's own complex rotation (float64)
        return transformer_anyflow.apply_rotary_emb(x, freqs)

    return "complex", freqs[0, 0], rotate


def _joy_settings(config):
    keys = ("hidden_size", "num_attention_heads", "rope_dim_list", "theta")
    return SimpleNamespace(**{key: config[key] for key in keys})


def _joyimage(config, grid):
    """The model's own ``get_rotary_pos_embed`` (it reads four config fields from ``self``)."""
    (cos, sin), _ = transformer_joyimage.JoyImageEditTransformer3DModel.get_rotary_pos_embed(
        _joy_settings(config), list(grid)
    )
    return "real", cos, sin


def _joyimage_plus(config, grid):
    model = SimpleNamespace(config=_joy_settings(config))
    cls = transformer_joyimage_edit_plus.JoyImageEditPlusTransformer3DModel
    return ("real", *cls._get_rotary_pos_embed_for_range(model, (0, 0, 0), grid))


def _allegro(config, grid):
    """Allegro's per-axis tables (``[c | c]`` per block) read at each token's indices, as its
    pipeline does, and its own ``apply_rotary_emb_allegro``."""
    f, h, w = grid
    scales = tuple(config[f"interpolation_scale_{axis}"] for axis in "thw")
    *tables, grid_t, grid_h, grid_w = E.get_3d_rotary_pos_embed_allegro(
        config["attention_head_dim"], ((0, 0), (h, w)), (h, w), f, interpolation_scale=scales
    )
    index = torch.cartesian_prod(*(g.long() for g in (grid_t, grid_h, grid_w))).T  # [3, N]
    half = tables[0][0].shape[-1] // 2
    cos = torch.cat([c[i, :half] for (c, _), i in zip(tables, index, strict=True)], dim=-1)
    sin = torch.cat([s[i, :half] for (_, s), i in zip(tables, index, strict=True)], dim=-1)

    def rotate(x):
        return E.apply_rotary_emb_allegro(x, tuple(tables), tuple(index[:, None]))

    return "pairs", cos, sin, rotate


def _ace_step(config, grid):
    tokens = grid[0] * grid[1] * grid[2]
    cos, sin = ace_step_transformer._ace_step_rotary_freqs(
        tokens, config["head_dim"], config["rope_theta"], torch.device("cpu"), torch.float32
    )
    return "real_half", cos, sin


def _stable_audio(config, grid):
    """The pipeline's table (``D/2`` rotated features) and the processor's partial rotation."""
    tokens = grid[0] * grid[1] * grid[2]
    cos, sin = E.get_1d_rotary_pos_embed(
        config["attention_head_dim"] // 2, tokens, use_real=True, repeat_interleave_real=False
    )

    def rotate(x):
        return StableAudioAttnProcessor2_0().apply_partial_rotary_emb(x, (cos, sin))

    return "real_half", cos, sin, rotate


def _stable_audio3(config, grid):
    tokens = grid[0] * grid[1] * grid[2]
    width = config["embed_dim"] // config["num_heads"]
    angles = transformer_stable_audio3.StableAudio3RotaryEmbedding(width // 2)(
        tokens, torch.device("cpu")
    )

    def rotate(x):
        out = transformer_stable_audio3._apply_rotary_partial(x.transpose(1, 2), angles)
        return out.transpose(1, 2)

    return "real_half", angles.cos(), angles.sin(), rotate


def _longcat_audio(config, grid):
    tokens = grid[0] * grid[1] * grid[2]
    width = config["dit_dim"] // config["dit_heads"]
    module = transformer_longcat_audio_dit.AudioDiTRotaryEmbedding(width, 2048, base=100000.0)
    cos, sin = module(torch.zeros(1, tokens, 1))

    def rotate(x):
        out = transformer_longcat_audio_dit._apply_rotary_emb(x.transpose(1, 2), (cos, sin))
        return out.transpose(1, 2)

    return "real_half", cos, sin, rotate


def _minimax_music3(config, grid):
    tokens = grid[0] * grid[1] * grid[2]
    module = transformer_minimax_music3.MiniMaxMusic3RotaryEmbedding(config["rotary_dim"])
    cos, sin = module(tokens, torch.device("cpu"))

    def rotate(x):
        out = transformer_minimax_music3._apply_partial_rotary_emb(x.transpose(1, 2), (cos, sin))
        return out.transpose(1, 2)

    return "real_half", cos, sin, rotate


def _kandinsky(module_cls):
    def reference(config, grid):
        f, h, w = grid
        module = module_cls(list(config["axes_dims"]))
        pos, scale = tuple(torch.arange(n) for n in grid), config["scale_factor"]
        if module_cls is transformer_kandinsky.Kandinsky5RoPE3D:
            matrices = module((1, f, h, w), pos, scale)
        else:
            matrices = module(pos, scale)
        return "matrix", matrices.reshape(f * h * w, -1, 2, 2)

    return reference


def _cogvideox_rope(config, grid, crop_region=cogvideox_crop):
    f, h, w = grid
    patch = config["patch_size"]
    if config.get("patch_size_t") is not None:
        max_size = (config["sample_height"] // patch, config["sample_width"] // patch)
        cos, sin = E.get_3d_rotary_pos_embed(
            config["attention_head_dim"], None, (h, w), f, grid_type="slice", max_size=max_size
        )
        return "real", cos, sin
    crop = crop_region((h, w), config["sample_width"] // patch, config["sample_height"] // patch)
    return ("real", *E.get_3d_rotary_pos_embed(config["attention_head_dim"], crop, (h, w), f))


def _cogvideox_sincos(config, grid):
    f, h, w = grid
    width = config["attention_head_dim"] * config["num_attention_heads"]
    embed = E.CogVideoXPatchEmbed(
        patch_size=2, in_channels=4, embed_dim=width, text_embed_dim=8,
        sample_width=2 * w, sample_height=2 * h, sample_frames=4 * (f - 1) + 1,
        max_text_seq_length=3, spatial_interpolation_scale=config["spatial_interpolation_scale"],
        temporal_interpolation_scale=config["temporal_interpolation_scale"],
    )  # fmt: skip
    return "table", embed.pos_embedding[0, 3:]


def _consisid_rope(config, grid):
    return _cogvideox_rope(config, grid, consisid_crop)


def _easyanimate(config, grid):
    f, h, w = grid
    module = transformer_easyanimate.EasyAnimateRotaryPosEmbed(2, config["attention_head_dim"])
    return ("real", *module(torch.zeros(1, 1, f, 2 * h, 2 * w)))


def _chronoedit(config, grid):
    f, h, w = grid
    module = transformer_chronoedit.ChronoEditRotaryPosEmbed(
        config["attention_head_dim"], (1, 2, 2), 32,
        temporal_skip_len=config["rope_temporal_skip_len"],
    )  # fmt: skip
    cos, sin = module(torch.zeros(1, 1, f, 2 * h, 2 * w))
    return "real", cos[0, :, 0], sin[0, :, 0]


def _cogview4(config, grid):
    _, h, w = grid
    module = transformer_cogview4.CogView4RotaryPosEmbed(
        config["attention_head_dim"], 2, tuple(config["rope_axes_dim"])
    )
    return ("real_half", *module(torch.zeros(1, 1, 2 * h, 2 * w)))


def _glm_image(config, grid):
    _, h, w = grid
    module = transformer_glm_image.GlmImageRotaryPosEmbed(config["attention_head_dim"], 2)
    return ("real_half", *module(torch.zeros(1, 1, 2 * h, 2 * w)))


def _hidream(config, grid):
    module = transformer_hidream_image.HiDreamImageEmbedND(
        theta=10000, axes_dim=list(config["axes_dims_rope"])
    )
    return "matrix", module(_ids(grid)[None])[0, :, 0]


def _hunyuan_dit(config, grid):
    _, h, w = grid
    crop = hunyuan_crop((h, w), 512 // 8 // config["patch_size"])
    return ("real", *E.get_2d_rotary_pos_embed(config["attention_head_dim"], crop, (h, w)))


def _lumina_next(config, grid):
    _, h, w = grid
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    factors = {key: config.get(key, 1.0) for key in ("linear_factor", "ntk_factor")}
    table = E.get_2d_rotary_pos_embed_lumina(head_dim, h, w, **factors)
    return "complex", table.reshape(h * w, -1)


def _patch_embed(config, grid):
    """PatchEmbed's table: its output on a zero latent less the projection's bias."""
    _, h, w = grid
    patch, width = (
        config["patch_size"],
        config["attention_head_dim"] * config["num_attention_heads"],
    )
    scale = config.get("interpolation_scale")
    if config["_kind"] == "pixart" and scale is None:
        scale = max(config["sample_size"] // 64, 1)
    embed = E.PatchEmbed(
        height=config["sample_size"], width=config["sample_size"], patch_size=patch,
        in_channels=4, embed_dim=width, interpolation_scale=scale or 1,
        pos_embed_max_size=config.get("pos_embed_max_size"),
    )  # fmt: skip
    with torch.no_grad():
        out = embed(torch.zeros(1, 4, patch * h, patch * w))
    return "table", (out[0] - embed.proj.bias).double()


def _cogview3plus(config, grid):
    """CogView3PlusPatchEmbed's image rows: its output on zeros less the projection's bias."""
    _, h, w = grid
    width = config["attention_head_dim"] * config["num_attention_heads"]
    embed = E.CogView3PlusPatchEmbed(
        in_channels=4, hidden_size=width, patch_size=2, text_hidden_size=8,
        pos_embed_max_size=config["pos_embed_max_size"],
    )  # fmt: skip
    with torch.no_grad():
        out = embed(torch.zeros(1, 4, 2 * h, 2 * w), torch.zeros(1, 3, 8))
    return "table", (out[0, 3:] - embed.proj.bias).double()


def _temporal(config, grid):
    frames, width = grid[0], config["attention_head_dim"] * config["num_attention_heads"]
    embed = E.SinusoidalPositionalEmbedding(width, config["num_positional_embeddings"])
    return "table", embed(torch.zeros(1, frames, width))[0].double()


FLUX = {"attention_head_dim": 16, "axes_dims_rope": (4, 6, 6)}
HUNYUAN = {"attention_head_dim": 16, "rope_axes_dim": (4, 6, 6), "rope_theta": 256.0}
ROPE_CASES = [
    Case("FluxTransformer2DModel", FLUX, (1, 3, 5), _pos_embed(transformer_flux.FluxPosEmbed)),
    Case("ChromaTransformer2DModel", FLUX, (2, 3, 4), _pos_embed(transformer_flux.FluxPosEmbed)),
    Case(
        "LongCatImageTransformer2DModel", FLUX, (1, 4, 3),
        _pos_embed(transformer_longcat_image.LongCatImagePosEmbed),
    ),
    Case(
        "OvisImageTransformer2DModel", FLUX, (1, 4, 3),
        _pos_embed(transformer_ovis_image.OvisImagePosEmbed),
    ),
    Case("BriaTransformer2DModel", FLUX, (1, 3, 3), _pos_embed(transformer_bria.BriaPosEmbed)),
    Case(
        "Flux2Transformer2DModel",
        {"attention_head_dim": 16, "axes_dims_rope": (4, 4, 4, 4), "rope_theta": 2000},
        (2, 3, 4), _pos_embed(transformer_flux2.Flux2PosEmbed),
    ),
    Case("NucleusMoEImageTransformer2DModel", FLUX, (1, 4, 5), _nucleus),
    Case(
        "QwenImage21Transformer2DModel", {**FLUX, "caption_length": 3}, (1, 5, 4), _qwen21
    ),
    Case(
        "BriaFiboTransformer2DModel",
        {"attention_head_dim": 16, "axes_dims_rope": (4, 6, 6), "rope_theta": 10000},
        (1, 3, 4), _pos_embed(transformer_bria_fibo.BriaFiboEmbedND),
    ),
    Case(
        "BriaFibo2Transformer2DModel",
        {"dim": 32, "n_heads": 2, "axes_dims": (4, 6, 6), "rope_theta": 256.0,
         "max_num_gist_tokens": 40},
        (1, 3, 4), _bria_fibo2,
    ),
    Case(
        "HeliosTransformer3DModel",
        {"attention_head_dim": 16, "rope_dim": (4, 6, 6), "rope_theta": 10000.0},
        (3, 2, 4), _helios,
    ),
    Case("QwenImageTransformer2DModel", FLUX, (2, 5, 4), _qwen),
    Case(
        "WanTransformer3DModel", {"attention_head_dim": 20}, (3, 4, 5),
        _wan(transformer_wan.WanRotaryPosEmbed),
    ),
    Case(
        "WanVACETransformer3DModel", {"attention_head_dim": 12}, (2, 3, 3),
        _wan(transformer_wan.WanRotaryPosEmbed),
    ),
    Case(
        "WanAnimateTransformer3DModel", {"attention_head_dim": 12}, (2, 3, 3),
        _wan(transformer_wan_animate.WanRotaryPosEmbed),
    ),
    Case(
        "WanAnimate2Transformer3DModel",
        {"dim": 24, "num_heads": 2, "rope_offsets": (3, 1, 2), "rope_stride": 2},
        (3, 2, 4), _wan_animate2,
    ),
    Case("AnyFlowTransformer3DModel", {"attention_head_dim": 12}, (2, 3, 4), _anyflow),
    Case(
        "SanaVideoTransformer3DModel", {"attention_head_dim": 12}, (2, 3, 3),
        _wan(transformer_sana_video.WanRotaryPosEmbed),
    ),
    Case(
        "SkyReelsV2Transformer3DModel", {"attention_head_dim": 18}, (2, 3, 4),
        _wan(transformer_skyreels_v2.SkyReelsV2RotaryPosEmbed),
    ),
    Case(
        "HunyuanVideoTransformer3DModel",
        HUNYUAN, (3, 4, 5), _hunyuan_video(transformer_hunyuan_video.HunyuanVideoRotaryPosEmbed),
    ),
    Case(
        "HunyuanVideo15Transformer3DModel", HUNYUAN, (2, 3, 4),
        _hunyuan_video(transformer_hunyuan_video15.HunyuanVideo15RotaryPosEmbed),
    ),
    Case(
        "MotifVideoTransformer3DModel", HUNYUAN, (2, 4, 3),
        _hunyuan_video(transformer_motif_video.MotifVideoRotaryPosEmbed),
    ),
    Case(
        "Flux3Transformer2DModel",
        {"attention_head_dim": 16, "axes_dims_rope": (4, 4, 4, 4), "rope_theta": 10000},
        (2, 3, 4), _pos_embed(transformer_flux3.Flux3PosEmbed),
    ),
    Case(
        "Krea2Transformer2DModel",
        {"attention_head_dim": 16, "axes_dims_rope": (4, 6, 6), "rope_theta": 1000.0},
        (2, 3, 4), _pos_embed(transformer_krea2.Krea2RotaryPosEmbed),
    ),
    Case(
        "HunyuanImageTransformer2DModel",
        {"attention_head_dim": 16, "rope_axes_dim": (8, 8), "rope_theta": 256.0},
        (1, 4, 5), _hunyuan_image,
    ),
    Case(
        "Lumina2Transformer2DModel",
        {"hidden_size": 32, "num_attention_heads": 2, "axes_dim_rope": (4, 6, 6),
         "caption_length": 3},
        (1, 3, 4), _lumina2,
    ),
    Case(
        "ZImageTransformer2DModel",
        {"dim": 32, "n_heads": 2, "axes_dims": (4, 6, 6), "rope_theta": 256.0,
         "caption_length": 32},
        (2, 3, 4), _z_image,
    ),
    Case(
        "MiniMaxH3Transformer3DModel",
        {"attention_head_dim": 16, "rope_freq_dim": 2, "rope_theta": 10000.0},
        (2, 3, 4), _minimax_h3,
    ),
    Case(
        "JoyImageEditTransformer3DModel",
        {"hidden_size": 32, "num_attention_heads": 2, "rope_dim_list": [4, 6, 6], "theta": 256},
        (2, 3, 4), _joyimage,
    ),
    Case(
        "JoyImageEditPlusTransformer3DModel",
        {"hidden_size": 32, "num_attention_heads": 2, "rope_dim_list": [4, 6, 6], "theta": 256},
        (1, 4, 3), _joyimage_plus,
    ),
    Case(
        "AllegroTransformer3DModel",
        {"attention_head_dim": 12, "interpolation_scale_t": 2.2, "interpolation_scale_h": 2.0,
         "interpolation_scale_w": 2.0},
        (3, 4, 2), _allegro,
    ),
    Case(
        "AceStepTransformer1DModel", {"head_dim": 16, "rope_theta": 1e6}, (9, 1, 1), _ace_step
    ),
    Case("LongCatAudioDiTTransformer", {"dit_dim": 32, "dit_heads": 2}, (9, 1, 1), _longcat_audio),
    Case(
        "MiniMaxMusic3Transformer1DModel", {"attention_head_dim": 16, "rotary_dim": 8}, (8, 1, 1),
        _minimax_music3,
    ),
    Case("StableAudioDiTModel", {"attention_head_dim": 16}, (11, 1, 1), _stable_audio),
    Case("StableAudio3DiTModel", {"embed_dim": 48, "num_heads": 2}, (10, 1, 1), _stable_audio3),
    Case(
        "Kandinsky5Transformer3DModel", {"axes_dims": (4, 6, 6), "scale_factor": (1.0, 2.0, 2.0)},
        (2, 3, 4), _kandinsky(transformer_kandinsky.Kandinsky5RoPE3D),
    ),
    Case(
        "Kandinsky6Transformer3DModel", {"axes_dims": (4, 6, 6), "scale_factor": (1.0, 1.0, 1.0)},
        (3, 2, 3), _kandinsky(transformer_kandinsky6.Kandinsky6RoPE3D),
    ),
    Case(
        "Kandinsky6SRTransformer3DModel",
        {"axes_dims": (4, 6, 6), "scale_factor": (2.0, 1.5, 1.5)},
        (2, 4, 3), _kandinsky(transformer_kandinsky6_sr.Kandinsky6SRRoPE3D),
    ),
    Case(
        "CogVideoXTransformer3DModel",
        {"attention_head_dim": 16, "use_rotary_positional_embeddings": True, "patch_size": 2,
         "patch_size_t": None, "sample_height": 12, "sample_width": 20},
        (3, 4, 8), _cogvideox_rope, "rope",
    ),
    Case(
        "CogVideoXTransformer3DModel",
        {"attention_head_dim": 16, "use_rotary_positional_embeddings": True, "patch_size": 2,
         "patch_size_t": 2, "sample_height": 12, "sample_width": 20},
        (2, 4, 6), _cogvideox_rope, "rope-slice",
    ),
    Case(
        "ConsisIDTransformer3DModel",
        {"attention_head_dim": 16, "use_rotary_positional_embeddings": True, "patch_size": 2,
         "sample_height": 12, "sample_width": 20},
        (2, 6, 4), _consisid_rope, "rope",
    ),
    Case(
        "EasyAnimateTransformer3DModel", {"attention_head_dim": 16, "patch_size": 2}, (2, 5, 3),
        _easyanimate,
    ),
    Case(
        "ChronoEditTransformer3DModel",
        {"attention_head_dim": 12, "rope_temporal_skip_len": 8}, (2, 3, 4), _chronoedit, "edit",
    ),
    Case(
        "ChronoEditTransformer3DModel",
        {"attention_head_dim": 12, "rope_temporal_skip_len": 8}, (3, 2, 3), _chronoedit, "video",
    ),
    Case(
        "CogView4Transformer2DModel", {"attention_head_dim": 16, "rope_axes_dim": (8, 8)},
        (1, 5, 3), _cogview4,
    ),
    Case(
        "Ideogram4Transformer2DModel",
        {"attention_head_dim": 32, "rope_theta": 10000, "mrope_section": (4, 3, 3)},
        (1, 3, 4), _ideogram4,
    ),
    Case(
        "PRXTransformer2DModel",
        {"hidden_size": 32, "num_heads": 2, "axes_dim": (6, 10), "theta": 10000},
        (1, 4, 3), _prx,
    ),
    Case("GlmImageTransformer2DModel", {"attention_head_dim": 16}, (1, 4, 5), _glm_image),
    Case(
        "HiDreamImageTransformer2DModel", {"attention_head_dim": 16, "axes_dims_rope": (4, 6, 6)},
        (1, 3, 4), _hidream,
    ),
    Case(
        "HunyuanDiT2DModel", {"attention_head_dim": 16, "patch_size": 2}, (1, 6, 4), _hunyuan_dit
    ),
    Case(
        "LuminaNextDiT2DModel", {"hidden_size": 32, "num_attention_heads": 2}, (1, 3, 5),
        _lumina_next,
    ),
    Case(
        "LuminaNextDiT2DModel",
        {"hidden_size": 32, "num_attention_heads": 2, "ntk_factor": 2.0, "linear_factor": 1.5},
        (1, 4, 3), _lumina_next, "scaled",
    ),
]  # fmt: skip

TABLE_CASES = [
    Case(
        "CogVideoXTransformer3DModel",
        {"attention_head_dim": 8, "num_attention_heads": 2,
         "use_rotary_positional_embeddings": False, "spatial_interpolation_scale": 1.875,
         "temporal_interpolation_scale": 1.0},
        (3, 4, 5), _cogvideox_sincos, "sincos",
    ),
    Case(
        "DiTTransformer2DModel",
        {"_kind": "dit", "attention_head_dim": 8, "num_attention_heads": 2, "sample_size": 8,
         "patch_size": 2},
        (1, 3, 5), _patch_embed,
    ),
    Case(
        "PixArtTransformer2DModel",
        {"_kind": "pixart", "attention_head_dim": 8, "num_attention_heads": 2, "sample_size": 128,
         "patch_size": 2, "interpolation_scale": None, "caption_channels": 8},
        (1, 4, 6), _patch_embed,
    ),
    Case(
        "SanaTransformer2DModel",
        {"_kind": "sana", "attention_head_dim": 8, "num_attention_heads": 2, "sample_size": 16,
         "patch_size": 1, "interpolation_scale": 2.0},
        (1, 6, 4), _patch_embed, "sincos",
    ),
    Case(
        "Transformer2DModel",
        {"_kind": "pixart", "attention_head_dim": 8, "num_attention_heads": 2,
         "sample_size": 128, "patch_size": 2, "interpolation_scale": None},
        (1, 3, 5), _patch_embed, "patches",
    ),
    Case(
        "CogView3PlusTransformer2DModel",
        {"attention_head_dim": 8, "num_attention_heads": 2, "pos_embed_max_size": 10},
        (1, 4, 6), _cogview3plus,
    ),
    Case(
        "TransformerTemporalModel",
        {"attention_head_dim": 8, "num_attention_heads": 2, "positional_embeddings": "sinusoidal",
         "num_positional_embeddings": 12},
        (7, 2, 2), _temporal, "sinusoidal",
    ),
    Case(
        "SD3Transformer2DModel",
        {"_kind": "sd3", "attention_head_dim": 8, "num_attention_heads": 2, "sample_size": 8,
         "patch_size": 2, "pos_embed_max_size": 12},
        (1, 5, 8), _patch_embed,
    ),
]  # fmt: skip

# Model classes whose (default) blocks add no positions: posenc builds NoPE for them, and
# test_models_without_positions_build_nope checks diffusers' blocks have no pos_embed.
NOPE_CLASSES = ("DreamLiteTransformer2DModel", "TransformerTemporalModel")
