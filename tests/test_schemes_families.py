"""Every M-RoPE and 2-D axial family of the installed transformers against
``posenc.from_hf_config``, at real multi-axis positions.

The cases come from the rotary walk (``_hf_walk.discover``): each ``*RotaryEmbedding`` whose
``model_type`` the family table gives an M-RoPE or axial scheme. The M-RoPE text rotaries
and the shared / alternating axial towers are compared by the walk itself
(``_hf_walk.run_case``: q/k at text, random ``[A, B, T]`` and text + image positions;
cos/sin and q/k at random patch positions ``[N, 2]``), so ``test_hf_families`` counts them;
here each must be matched there, not listed as unsupported. A family marked ``pending:``
in the table must raise instead. Transformers forms the angles in float32, so the tolerance
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
from test_hf_families import UNSUPPORTED

EPS32 = torch.finfo(torch.float32).eps
MROPE_SCHEMES = (
    "mrope", "mrope_interleaved", "qwen3_5_mrope", "glm4v_mrope", "glm_mrope", "ernie_mrope",
    "neomme_mrope",
)  # fmt: skip


def _scheme(case: walk.RotaryCase) -> str | None:
    try:
        entry = FAMILIES.get(case.model_type)
    except Exception:  # a config class that cannot be built with its defaults
        return None
    scheme = entry.scheme if entry is not None else None
    vision = (scheme or "").startswith(("axial", "pending")) or scheme == "dinov3"
    keep = scheme in MROPE_SCHEMES or vision
    return scheme if keep else None


CASES = {
    f"{c.family}/{c.rotary}": c for c in walk.discover() if _scheme(c) is not None
}  # fmt: skip


def _tolerance(angle: float, base: float) -> float:
    return EPS32 * (8 + angle * (1 + math.log(base)))


@pytest.mark.parametrize(
    "case_id", sorted(c for c in CASES if _scheme(CASES[c]).startswith("pending"))
)
def test_pending_families_are_refused(case_id):
    config = walk.hf_config(CASES[case_id])[0]
    with pytest.raises(ValueError, match="model_type"):
        posenc.from_hf_config(config)


TEXT = sorted(
    c for c in CASES if "mrope" in _scheme(CASES[c]) and "pending" not in _scheme(CASES[c])
)
VISION = sorted(c for c in CASES if _scheme(CASES[c]) in ("axial", "axial_alternating"))
VARIANTS = sorted(
    c for c in CASES if _scheme(CASES[c]).startswith(("axial_xy", "axial_thw", "dinov3"))
)


@pytest.mark.parametrize("case_id", TEXT + VISION)
def test_family_is_compared_by_the_walk(case_id):
    """The walk (``test_hf_families``) compares it at its own positions: not unsupported."""
    assert case_id not in UNSUPPORTED, UNSUPPORTED.get(case_id)


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
    assert {_scheme(CASES[c]) for c in TEXT} == set(MROPE_SCHEMES)
    assert {_scheme(CASES[c]) for c in VISION} == {"axial", "axial_alternating"}
    assert {_scheme(CASES[c]) for c in VARIANTS} == {
        "axial_xy", "axial_xy_adjacent", "axial_xy_llama4", "axial_xy_per_axis",
        "axial_xy_cyclic", "axial_thw", "dinov3",
    }  # fmt: skip
