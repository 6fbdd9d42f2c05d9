"""posenc lab speed choices that must not change the numbers beyond float rounding: the
attention backend per pass (``posenc.lab.model.attention_backend``) and the order in
which parallel runs start (``posenc.lab.jobs.longest_first``)."""

from __future__ import annotations

import pytest
import torch

from posenc.lab import LabConfig, TinyLM
from posenc.lab.jobs import longest_first, run_cost
from posenc.lab.model import attention_backend
from posenc.lab.variants import build_encoding

NAMES = ["nope", "sinusoidal", "learned", "rope", "alibi", "t5", "shaw"]


def _model(name: str, length: int) -> TinyLM:
    config = LabConfig(encodings=(name,), d_model=16, num_heads=2, train_len=length,
                       eval_lens=(length,))  # fmt: skip
    torch.manual_seed(0)
    return TinyLM(build_encoding(name, config), vocab_size=256, d_model=16, num_layers=2,
                  num_heads=2)  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_backend_per_pass(name):
    model = _model(name, 8)
    value = name == "shaw"  # a VALUE-site term: SDPA cannot apply it
    tokens = torch.randint(0, 256, (1, 8))
    for grad, want in ((True, "sdpa"), (False, "chunked")):
        want = "auto" if value else want
        assert attention_backend(model.encoding, grad=grad) == want
        with torch.set_grad_enabled(grad):
            model(tokens)
        assert {block.attn.backend for block in model.blocks} == {want}


@pytest.mark.parametrize("name", NAMES)
def test_both_passes_match_a_float64_forward(name):
    """Logits with gradients (SDPA, one call) and without (chunked query blocks, two at
    T = 200 > block size 128) agree with the same weights in float64."""
    length = 200
    model = _model(name, length)
    tokens = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = _model(name, length).double()(tokens)
        chunked = model(tokens)
    with torch.enable_grad():
        fused = model(tokens)
    # float32 roundings over sums of d_model products per layer, relative to the logits' scale
    tol = 64 * torch.finfo(torch.float32).eps * float(reference.abs().max())
    for logits in (chunked, fused.detach()):
        assert logits.dtype == torch.float32
        torch.testing.assert_close(logits.double(), reference, rtol=0.0, atol=tol)


def test_longest_runs_start_first():
    config = LabConfig()
    todo = [(n, s) for s in config.seeds for n in config.encodings]
    order = longest_first(todo, config)
    assert sorted(order) == sorted(todo)
    assert order[:3] == [("rope", 0), ("rope", 1), ("rope", 2)]  # scalings and fine-tunes
    costs = [run_cost(name, config) for name, _ in order]
    assert costs == sorted(costs, reverse=True)
    rest = [key for key in order if run_cost(key[0], config) == run_cost("nope", config)]
    assert rest == [key for key in todo if key in rest]  # equals keep their order
    untuned = config.replace(finetune_steps=0)
    assert run_cost("rope", untuned) == run_cost("rope", config) - 4  # two fine-tunes fewer
    assert run_cost("learned", config) == run_cost("nope", config) + 1  # +interpolate row
