"""posenc lab speed choices that must not change the numbers beyond float rounding: the
attention backend per pass (``posenc.lab.model.attention_backend``) and the order in
which parallel runs start (``posenc.lab.jobs.longest_first``); the fused AdamW
(``posenc.lab.train.adamw``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc.lab import LabConfig, TinyLM
from posenc.lab.jobs import longest_first, run_cost
from posenc.lab.model import attention_backend
from posenc.lab.train import adamw
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


def test_fused_adamw_follows_the_reference_update():
    """Ten steps of the lab's fused AdamW match torch's for-loop AdamW with the same
    groups (decay on matrices only) to float32 rounding."""
    models = [_model("rope", 8) for _ in range(2)]
    fused = adamw(models[0], lr=1e-2, weight_decay=0.1)
    groups = [{**group, "params": list(group["params"])} for group in fused.param_groups]
    assert fused.defaults["fused"] and fused.defaults["betas"] == (0.9, 0.95)
    assert [g["weight_decay"] for g in groups] == [0.1, 0]
    params = dict(models[1].named_parameters())
    names = {id(p): n for n, p in models[0].named_parameters()}
    for group in groups:
        group["params"] = [params[names[id(p)]] for p in group["params"]]
        group.pop("fused")
    reference = torch.optim.AdamW(groups, foreach=False)
    tokens = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(2))
    for _ in range(10):
        for model, optimizer in zip(models, (fused, reference), strict=True):
            loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    eps = torch.finfo(torch.float32).eps
    for (name, got), want in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        # lr 1e-2 per step, ten steps: each update rounds at eps of the weight's scale
        tol = 64 * eps * (1.0 + float(want.detach().abs().max()))
        torch.testing.assert_close(got, want, rtol=0.0, atol=tol, msg=name)
