"""The paper's reading (``posenc.audit.paper``): the float64 formulas beside the runtimes.

Shapes: ``P`` positions, ``R`` rotary dim. transformers computes its angles in float32, so
they are compared with ``rtol = atol = 16 eps32``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from _audit_configs import CONFIGS, CONTEXT, DEEPSEEK_MSCALE, EPS32, GEMMA3, POSITIONS, TOL
from posenc.audit.hfread import read_transformers
from posenc.audit.paper import read_paper


@pytest.mark.parametrize(
    "name", ["default", "linear", "dynamic", "yarn", "llama3", "longrope", "hunyuan_ntk_alpha"]
)
def test_paper_equals_transformers_on_released_scalings(name):
    paper = read_paper(CONFIGS[name], POSITIONS, context=CONTEXT)
    theirs = read_transformers(CONFIGS[name], POSITIONS, context=CONTEXT)
    assert paper.ran and len(paper.layers) == len(theirs.layers) == 2
    for mine, them in zip(paper.layers, theirs.layers, strict=True):
        assert (mine.pairs, mine.rotary_dim) == (them.pairs, them.rotary_dim)
        np.testing.assert_allclose(mine.angles, them.angles, **TOL)
        np.testing.assert_allclose(mine.scale, them.scale, **TOL)


def test_dynamic_past_the_trained_length_rescales():
    """emozilla's dynamic NTK at 4096 > 2048 tokens: every pair but the first turns slower."""
    at = read_paper(CONFIGS["dynamic"], POSITIONS, context=CONTEXT).layers[0].angles
    past = read_paper(CONFIGS["dynamic"], POSITIONS, context=4096).layers[0].angles
    assert np.all(past[1:, 1:] < at[1:, 1:]) and np.allclose(past[:, 0], at[:, 0])


def test_deepseek_softmax_scale_is_mla_with_mscale():
    paper = read_paper(CONFIGS["deepseek_yarn"], POSITIONS, context=CONTEXT)
    mscale = 1.0 + 0.1 * DEEPSEEK_MSCALE * math.log(4.0)
    assert paper.layers[0].pairs == "adjacent"
    assert math.isclose(paper.layers[0].softmax_scale, 32**-0.5 * mscale**2, rel_tol=EPS32)


def test_per_layer_types_read_per_layer():
    paper = read_paper(GEMMA3, POSITIONS, context=CONTEXT)
    theirs = read_transformers(GEMMA3, POSITIONS, context=CONTEXT)
    assert paper.ran, paper.note
    for mine, them in zip(paper.layers, theirs.layers, strict=True):
        assert mine.sliding_window == them.sliding_window
        np.testing.assert_allclose(mine.angles, them.angles, **TOL)
    assert not np.allclose(paper.layers[0].angles, paper.layers[5].angles)


def test_a_scheme_gets_a_note():
    config = {"model_type": "qwen2_vl", "rope_scaling": {"mrope_section": [2, 3, 3]}}
    paper = read_paper(config, POSITIONS, context=CONTEXT)
    assert not paper.ran and "plain RoPE" in paper.note
