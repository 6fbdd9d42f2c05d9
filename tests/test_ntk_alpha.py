"""NTK-alpha (HunYuan's fixed NTK base) against the float64 reference, and how configs
are read. The comparisons with transformers live in the family walk (``tests/_hf_walk.py``:
HunYuan dense and MoE rotary modules at the checkpoints' ``dynamic`` + ``alpha``) and in
``tests/test_patch.py`` (a patched HunYuan dense model's logits and greedy tokens).

Shapes: ``R`` rotary dim.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from _hf_walk import HUNYUAN_ALPHA
from conftest import tolerances
from posenc import NTKAlphaScaling, reference, rope_inv_freq

transformers = pytest.importorskip("transformers")


@settings(max_examples=30, deadline=None)
@given(
    dim=st.integers(2, 128).map(lambda n: 2 * n),
    alpha=st.floats(1.0, 1e4),
    base=st.floats(100.0, 1e7),
)
def test_frequencies_match_the_reference(dim, alpha, base):
    scaling = {"rope_type": "ntk_alpha", "alpha": alpha}
    got, scale = rope_inv_freq(dim, base=base, scaling=scaling, dtype=torch.float64)
    want = torch.from_numpy(reference.ntk_frequencies(dim, base, alpha))
    torch.testing.assert_close(got, want, **tolerances(torch.float64, ops=4 * dim))
    assert scale == 1.0
    plain, _ = rope_inv_freq(dim, base=base, dtype=torch.float64)
    torch.testing.assert_close(got[0], plain[0], rtol=0, atol=0)  # the highest is kept ...
    torch.testing.assert_close(got[-1], plain[-1] / alpha, **tolerances(torch.float64, ops=dim))


@pytest.mark.parametrize("name", ["HunYuanDenseV1Config", "HunYuanMoEV1Config"])
def test_config_class_and_config_json_read_alike(name):
    config = getattr(transformers, name)(**HUNYUAN_ALPHA)
    for source in (config, config.to_dict(), {"model_type": config.model_type, **HUNYUAN_ALPHA}):
        enc = posenc.from_hf_config(source)
        assert enc.scaling == NTKAlphaScaling(1000.0) and enc.base == 10000.0


def test_alpha_is_read_only_where_the_family_reads_it():
    rope = HUNYUAN_ALPHA["rope_parameters"]
    llama = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4}
    with pytest.raises(ValueError, match="alpha"):  # Llama's dynamic NTK has no alpha
        posenc.from_hf_config({**llama, "rope_scaling": rope})
    plain = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    enc = posenc.from_hf_config(transformers.HunYuanDenseV1Config(rope_parameters=plain))
    assert enc.scaling.rope_type == "dynamic"  # no alpha: dynamic NTK, as transformers


@pytest.mark.parametrize("alpha", [0.5, float("nan"), -2.0])
def test_bad_alpha_raises(alpha):
    with pytest.raises(ValueError, match="alpha"):
        NTKAlphaScaling(alpha)
    with pytest.raises(TypeError, match="alpha"):
        NTKAlphaScaling("2")
