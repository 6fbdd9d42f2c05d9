"""Every M-RoPE and 2-D axial family of the installed transformers against
``posenc.from_hf_config``, at real multi-axis positions.

The cases come from the rotary walk (``_hf_walk.discover``): each ``*RotaryEmbedding`` whose
``model_type`` the family table gives an M-RoPE or axial scheme. Text rotaries are compared
on q/k at random ``(t, h, w)`` positions ``[3, B, T]`` (0..300 and 100000 + that), through
the family's own rotary module and ``apply_rotary_pos_emb``; vision rotaries on their
cos/sin at random patch positions ``[N, 2]`` and, where the module has
``apply_rotary_pos_emb_vision``, on the rotated q/k. A family marked ``pending:`` in the
table must raise instead. Transformers forms the angles in float32, so the tolerance
grows with the largest angle (as in ``test_hf_families``).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``N`` patches, ``D`` head_dim.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc

pytest.importorskip("transformers", reason="the family walk needs transformers installed")

import _hf_walk as walk
from posenc.hf.families import FAMILIES

EPS32 = torch.finfo(torch.float32).eps
#: default configs that transformers itself cannot run: GLM-4V's sections ([8, 12, 12])
#: assume the half-rotated 128-feature heads of the releases
HALF_ROTARY = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
CONFIG_FIELDS = {
    "glm4v": {"rope_parameters": HALF_ROTARY},
    "glm_image": {"rope_parameters": HALF_ROTARY},
    "glm4v_moe": {"head_dim": 128},
}


def _scheme(case: walk.RotaryCase) -> str | None:
    try:
        entry = FAMILIES.get(case.model_type)
    except Exception:  # a config class that cannot be built with its defaults
        return None
    scheme = entry.scheme if entry is not None else None
    kinds = ("mrope", "mrope_interleaved", "qwen3_5_mrope", "glm4v_mrope", "glm_mrope")
    vision = (scheme or "").startswith(("axial", "pending")) or scheme == "dinov3"
    keep = scheme in kinds or vision
    return scheme if keep else None


CASES = {
    f"{c.family}/{c.rotary}": c for c in walk.discover() if _scheme(c) is not None
}  # fmt: skip


def _config(case: walk.RotaryCase):
    config = case.config_class()(**CONFIG_FIELDS.get(case.family, {}))
    text = config.get_text_config(decoder=True)
    return config, text


def _tolerance(angle: float, base: float) -> float:
    return EPS32 * (8 + angle * (1 + math.log(base)))


@pytest.mark.parametrize(
    "case_id", sorted(c for c in CASES if _scheme(CASES[c]).startswith("pending"))
)
def test_pending_families_are_refused(case_id):
    config, _ = _config(CASES[case_id])
    with pytest.raises(ValueError, match="model_type"):
        posenc.from_hf_config(config)


TEXT = sorted(
    c for c in CASES if "mrope" in _scheme(CASES[c]) and "pending" not in _scheme(CASES[c])
)
VISION = sorted(c for c in CASES if _scheme(CASES[c]) in ("axial", "axial_alternating"))
VARIANTS = sorted(
    c for c in CASES if _scheme(CASES[c]).startswith(("axial_xy", "axial_thw", "dinov3"))
)


@pytest.mark.parametrize("case_id", TEXT)
def test_mrope_family_matches_at_three_axis_positions(case_id):
    case = CASES[case_id]
    config, text = _config(case)
    ours = posenc.from_hf_config(config)
    assert isinstance(ours, posenc.MRoPE)
    gen = torch.Generator().manual_seed(0)
    for first in (0, walk.OFFSET):
        pos = first + torch.randint(0, 300, (3, 2, 8), generator=gen)  # [3, B, T]
        q = torch.randn(2, 4, 8, ours.head_dim, generator=gen)
        k = torch.randn(2, 2, 8, ours.head_dim, generator=gen)
        want = walk.hf_rotate(case, text, q, k, pos, None)
        tol = _tolerance(first + 300, ours.rope.base)
        for got, theirs, x in zip(ours.rotate(q, k, pos, pos), want, (q, k), strict=True):
            torch.testing.assert_close(got, theirs, rtol=0, atol=tol * float(x.abs().max()))


@pytest.mark.parametrize("case_id", VISION)
def test_axial_family_matches_at_patch_positions(case_id):
    case = CASES[case_id]
    config = case.config_class()()
    ours = posenc.from_hf_config(config)
    assert isinstance(ours, posenc.AxialRope)
    module = case.load()
    rotary = getattr(module, case.rotary)(config)
    pos = torch.randint(0, 64, (24, 2), generator=torch.Generator().manual_seed(0))
    cos, sin = rotary(torch.zeros(1), pos)  # [N, D]: the pair angles, twice
    tol = _tolerance(64, ours.base)
    ours_cos, ours_sin = ours.cos_sin(pos, dtype=torch.float32)  # [N, D/2]
    for theirs, mine in ((cos, ours_cos), (sin, ours_sin)):
        torch.testing.assert_close(theirs.float(), mine.repeat(1, 2), rtol=0, atol=tol)
    apply = getattr(module, "apply_rotary_pos_emb_vision", None)
    if apply is not None:
        gen = torch.Generator().manual_seed(1)
        q = torch.randn(1, 3, 24, ours.head_dim, generator=gen)
        k = torch.randn(1, 3, 24, ours.head_dim, generator=gen)
        want = apply(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)  # [N, H, D]
        for got, theirs in zip(ours.rotate(q, k, pos, pos), want, strict=True):
            torch.testing.assert_close(got[0], theirs.transpose(0, 1), rtol=0, atol=4 * tol)


# --------------------------------------------------------------------------- axial variants
# Each family's own rotation of q, k [1, H, N, D] at posenc's positions [N, A] ((y, x) or
# (t, y, x)): how its tower calls its rotary module and apply function.


def _vision_apply(module, rotary, q, k, pos):
    """Qwen-style towers: cos/sin [N, D] from positions [N, A], q/k [N, H, D]."""
    cos, sin = rotary(q, pos)
    got = module.apply_rotary_pos_emb_vision(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin)
    return tuple(x.transpose(0, 1)[None] for x in got)


def _xy_first(module, rotary, q, k, pos):
    """SAM3 and Gemma 4 take (x, y) positions."""
    xy = pos.flip(-1)
    if hasattr(module, "apply_multidimensional_rope"):  # Gemma 4: [B, N, 2], q/k [B, N, H, D]
        cos, sin = rotary(q, xy[None])
        rot = (
            module.apply_multidimensional_rope(x.transpose(1, 2), cos, sin, xy[None])
            for x in (q, k)
        )
        return tuple(x.transpose(1, 2) for x in rot)
    cos, sin = rotary(q, xy)  # SAM3: cos/sin [1, N, D]
    return module.apply_rotary_pos_emb_2d(q, k, cos=cos, sin=sin)


def _llama4(module, rotary, q, k, pos):
    """Llama 4 fixes its grid (1-based, class token last at (0, 0)): complex freqs_ci."""
    freqs = rotary(q)
    got = module.vision_apply_rotary_emb(q.transpose(1, 2), k.transpose(1, 2), freqs)
    return tuple(x.transpose(1, 2) for x in got)


def _dinov3(module, rotary, q, k, pos, grid):
    """EoMT-DINOv3: patch centers of the pixel grid, prefix tokens left as they are (eval
    mode: training jitters and rescales the centers)."""
    size = rotary.eval().config.patch_size
    cos, sin = rotary(torch.zeros(1, 3, grid[0] * size, grid[1] * size))
    return module.apply_rotary_pos_emb(q, k, cos, sin)


AXES = {"axial_thw": 3}
GRID = (4, 4)  # Llama 4: image_size / patch_size


def _variant_positions(scheme: str, gen: torch.Generator) -> torch.Tensor:
    if scheme == "axial_xy_llama4":
        return torch.cat((posenc.axial_positions(GRID) + 1, torch.zeros(1, 2, dtype=torch.long)))
    if scheme == "dinov3":
        return posenc.dinov3_positions((4, 3))
    return torch.randint(0, 64, (24, AXES.get(scheme, 2)), generator=gen)


@pytest.mark.parametrize("case_id", VARIANTS)
def test_axial_variant_matches_the_family_rotation(case_id):
    case = CASES[case_id]
    scheme, module = _scheme(case), case.load()
    fields = {"image_size": GRID[0] * 14, "patch_size": 14} if scheme == "axial_xy_llama4" else {}
    config = case.config_class()(**fields)
    rotary = getattr(module, case.rotary)(config)
    gen = torch.Generator().manual_seed(0)
    pos = _variant_positions(scheme, gen)
    if scheme == "dinov3":  # EoMT: the encoder layers, then the query layers
        last = config.num_hidden_layers - 1
        layers = {
            0: 1 + config.num_register_tokens,
            last: 1 + config.num_register_tokens + config.num_queries,
        }
    else:
        layers = {None: 0}
    for layer_idx, prefix in layers.items():
        ours = posenc.from_hf_config(config, layer_idx=layer_idx)
        assert isinstance(ours, posenc.AxialRope) and ours.num_prefix_tokens == prefix
        q = torch.randn(1, 3, prefix + len(pos), ours.head_dim, generator=gen)
        k = torch.randn(1, 3, prefix + len(pos), ours.head_dim, generator=gen)
        if scheme == "dinov3":
            want = _dinov3(module, rotary, q, k, pos, (4, 3))
        elif scheme == "axial_xy_llama4":
            want = _llama4(module, rotary, q, k, pos)
        elif scheme in ("axial_xy_per_axis",) or case.family == "sam3":
            want = _xy_first(module, rotary, q, k, pos)
        else:
            want = _vision_apply(module, rotary, q, k, pos)
        tol = 4 * _tolerance(float(pos.abs().max()) + 1, ours.base)
        for got, theirs, x in zip(ours.rotate(q, k, pos, pos), want, (q, k), strict=True):
            torch.testing.assert_close(got, theirs.float(), rtol=0, atol=tol * float(x.abs().max()))


def test_the_walk_reaches_every_scheme_family():
    """Each scheme of the table is exercised by at least one walked family."""
    assert {_scheme(c).split(":")[0] for c in CASES.values()} >= {"pending"}
    assert {_scheme(CASES[c]) for c in TEXT} == {
        "mrope", "mrope_interleaved", "qwen3_5_mrope", "glm4v_mrope", "glm_mrope"
    }  # fmt: skip
    assert {_scheme(CASES[c]) for c in VISION} == {"axial", "axial_alternating"}
    assert {_scheme(CASES[c]) for c in VARIANTS} == {
        "axial_xy", "axial_xy_adjacent", "axial_xy_llama4", "axial_xy_per_axis",
        "axial_xy_cyclic", "axial_thw", "dinov3",
    }  # fmt: skip
