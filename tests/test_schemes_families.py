"""Every M-RoPE and 2-D axial family of the installed transformers against
``posenc.from_hf_config``, at real multi-axis positions.

The cases come from the rotary walk (``_hf_walk.discover``): each ``*RotaryEmbedding`` whose
``model_type`` the family table gives an M-RoPE or axial scheme. The M-RoPE text rotaries
and the shared / alternating axial towers are compared by the walk itself
(``_hf_walk.run_case``: q/k at text, random ``[A, B, T]`` and text + image positions;
cos/sin and q/k at random patch positions ``[N, 2]``), so ``test_hf_families`` counts them;
here each must be matched there, not listed as unsupported. Transformers forms the angles
in float32, so the tolerance grows with the largest angle (as in ``test_hf_families``).

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
    "neomme_mrope", "hunyuan_xdrope",
)  # fmt: skip


def _scheme(case: walk.RotaryCase) -> str | None:
    try:
        entry = FAMILIES.get(case.model_type)
    except Exception:  # a config class that cannot be built with its defaults
        return None
    scheme = entry.scheme if entry is not None else None
    vision = (scheme or "").startswith("axial") or scheme == "dinov3"
    keep = scheme in MROPE_SCHEMES or vision
    return scheme if keep else None


CASES = {
    f"{c.family}/{c.rotary}": c for c in walk.discover() if _scheme(c) is not None
}  # fmt: skip


def _tolerance(angle: float, base: float) -> float:
    return EPS32 * (8 + angle * (1 + math.log(base)))


TEXT = sorted(c for c in CASES if _scheme(CASES[c]) in MROPE_SCHEMES)
VISION = sorted(c for c in CASES if _scheme(CASES[c]) in ("axial", "axial_alternating"))
VARIANTS = sorted(
    c for c in CASES if _scheme(CASES[c]).startswith(("axial_xy", "axial_thw", "dinov3"))
)


@pytest.mark.parametrize("case_id", TEXT + VISION)
def test_family_is_compared_by_the_walk(case_id):
    """The walk (``test_hf_families``) compares it at its own positions: not unsupported."""
    assert case_id not in UNSUPPORTED, UNSUPPORTED.get(case_id)


# --------------------------------------------------------------------------- axial variants


@pytest.mark.parametrize("case_id", VARIANTS)
def test_axial_variant_matches_the_family_rotation(case_id):
    """Rotated q/k through the family's own rotary and apply function (``_hf_walk``); EoMT
    in its encoder layers and in its last layers, which prepend the queries."""
    case = CASES[case_id]
    module = case.load()
    config = walk.hf_config(case)[1]
    rotary = getattr(module, case.rotary)(config)
    gen = torch.Generator().manual_seed(0)
    pos = walk.axial_variant_positions(module, config, posenc.from_hf_config(config), gen)
    layers = {None: 0}
    if case.family == "eomt_dinov3":
        prefix = 1 + config.num_register_tokens
        layers = {0: prefix, config.num_hidden_layers - 1: prefix + config.num_queries}
    for layer_idx, prefix in layers.items():
        ours = posenc.from_hf_config(config, layer_idx=layer_idx)
        assert isinstance(ours, posenc.AxialRope) and ours.num_prefix_tokens == prefix
        q = torch.randn(1, 3, prefix + len(pos), ours.head_dim, generator=gen)
        k = torch.randn(1, 3, prefix + len(pos), ours.head_dim, generator=gen)
        want = walk.hf_axial_rotate(module, rotary, q, k, pos)
        tol = 4 * _tolerance(float(pos.abs().max()) + 1, ours.base)
        for got, theirs, x in zip(ours.rotate(q, k, pos, pos), want, (q, k), strict=True):
            torch.testing.assert_close(got, theirs.float(), rtol=0, atol=tol * float(x.abs().max()))


def test_the_walk_reaches_every_scheme_family():
    """Each scheme of the table is exercised by at least one walked family."""
    assert {_scheme(CASES[c]) for c in TEXT} == set(MROPE_SCHEMES)
    assert {_scheme(CASES[c]) for c in VISION} == {"axial", "axial_alternating"}
    assert {_scheme(CASES[c]) for c in VARIANTS} == {
        "axial_xy", "axial_xy_adjacent", "axial_xy_llama4", "axial_xy_per_axis",
        "axial_xy_cyclic", "axial_thw", "dinov3",
    }  # fmt: skip
