"""posenc.parallel against torchtitan's own code: its RoPE caches (``ComplexRoPE``,
``CosSinRoPE``, every scaling it has) and, on two gloo processes, its ``cp_shard`` (head-tail,
on a DeviceMesh) with ``ComplexRoPE`` looked up by the sharded positions.

torchtitan is installed ``--no-deps`` by scripts/setup.sh (its declared dependencies pull
datasets, wandb and tensorboard; these modules need only spmd_types, tyro and triton).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import posenc
from _ranks import run_ranks
from posenc.parallel import torchtitan_cos_sin, torchtitan_freqs_cis

rope_module = pytest.importorskip("torchtitan.models.common.rope")

D, T = 16, 64
WORKER = Path(__file__).with_name("_torchtitan_worker.py")
CASES = {
    # name: (torchtitan's RoPE.Config keywords, posenc's scaling)
    "none": ({}, None),
    "llama": (
        {"scaling": "llama", "scaling_factor": 8.0, "original_max_position_embeddings": 16},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "yarn": (
        {"scaling": "yarn", "rope_factor": 4.0, "original_seq_len": 16},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    ),
}
EPS = torch.finfo(torch.float32).eps


@pytest.mark.parametrize("name", sorted(CASES))
def test_freqs_cis_equals_complex_rope_cache(name):
    theirs_kwargs, scaling = CASES[name]
    config = rope_module.ComplexRoPE.Config(dim=D, max_seq_len=T, **theirs_kwargs)
    theirs = rope_module.ComplexRoPE(config).cache
    rope = posenc.RotaryEmbedding(D, scaling=scaling, interleaved=True)
    ours = torchtitan_freqs_cis(rope, T)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    # torchtitan keeps |cis| = 1 and folds YaRN's scale into the softmax; posenc carries it
    torch.testing.assert_close(ours.abs(), torch.full((T, D // 2), rope.attention_scale))
    torch.testing.assert_close(theirs.abs(), torch.ones(T, D // 2))
    torch.testing.assert_close(ours / ours.abs(), theirs, rtol=0, atol=8 * EPS * T)


@pytest.mark.parametrize("name", ["none", "yarn"])  # CosSinRoPE has no llama scaling
def test_cos_sin_equals_cos_sin_rope_cache(name):
    theirs_kwargs, scaling = CASES[name]
    config = rope_module.CosSinRoPE.Config(dim=D, max_seq_len=T, **theirs_kwargs)
    theirs = rope_module.CosSinRoPE(config).cache
    rope = posenc.RotaryEmbedding(D, scaling=scaling)
    ours = torchtitan_cos_sin(rope, T) / rope.attention_scale
    torch.testing.assert_close(ours, theirs, rtol=0, atol=8 * EPS * T)


@pytest.mark.distributed
def test_cp_shard_and_complex_rope_equal_posenc_on_two_ranks():
    for rank, errors in enumerate(run_ranks(WORKER, 2)):
        assert errors["tokens"] == 0 and errors["positions"] == 0, rank
        assert errors["rope_vs_unsplit"] < 8 * EPS * T * 8, rank  # float32 angles, |q| < 8
        assert errors["table_vs_complex_rope"] < 8 * EPS * T * 8, rank
