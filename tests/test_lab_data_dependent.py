"""The data-dependent encodings as lab encodings, set up as their papers define them: one
gate module per layer (FoX, PaTH), FoX's gate initialised as in its paper's code, the
shared weights of a seed unchanged by the encoding, and weights that survive a copy.

Shapes: ``C`` d_model, ``H`` heads.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from posenc.encodings.data_dependent.fox import GATE_STD
from posenc.lab import LabConfig
from posenc.lab.model import per_layer, seeded_model
from posenc.lab.variants import build_encoding

CONFIG = LabConfig(d_model=16, num_heads=2, num_layers=3, train_len=8, eval_lens=(8,))
SHAPE = {"vocab_size": 32, "d_model": 16, "num_layers": 3, "num_heads": 2}


def _model(name: str, seed: int = 0):
    return seeded_model(lambda: build_encoding(name, CONFIG), seed=seed, **SHAPE)


@pytest.mark.parametrize(
    ("name", "own"), [("fox", True), ("path", True), ("stick_breaking", False), ("rope", False)]
)
def test_gated_encodings_get_one_instance_per_layer(name, own):
    model = _model(name)
    encodings = [block.attn.position for block in model.blocks]
    assert per_layer(model.encoding) is own
    assert encodings[0] is model.encoding
    assert len({id(e) for e in encodings}) == (len(encodings) if own else 1)
    if own:  # drawn one after the other from the encoding's stream: all different
        firsts = [next(e.parameters()).detach() for e in encodings]
        assert not any(torch.equal(a, b) for a, b in itertools.pairwise(firsts))


@pytest.mark.parametrize("name", ["fox", "path"])
def test_per_layer_gates_leave_the_shared_weights_of_a_seed_alone(name):
    plain, gated = _model("rope", seed=3), _model(name, seed=3)
    for key in ("embedding.weight", "blocks.2.mlp.0.weight", "head.weight"):
        torch.testing.assert_close(gated.state_dict()[key], plain.state_dict()[key], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["fox", "path"])
def test_a_copy_keeps_every_layers_gates(name):
    model = _model(name)
    twin = model.with_encoding(build_encoding(name, CONFIG))
    for a, b in zip(model.state_dict().items(), twin.state_dict().items(), strict=True):
        assert a[0] == b[0]
        torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)


def test_fox_gate_starts_as_in_the_paper():
    torch.manual_seed(0)
    enc = build_encoding("fox", CONFIG.replace(d_model=512, num_heads=16))
    weight, bias = enc.gate.weight.detach(), enc.gate.bias.detach()
    assert torch.equal(bias, torch.zeros_like(bias))
    # the sample std of n normal draws is within a few 1/sqrt(2n) of the true one
    n = weight.numel()
    assert abs(weight.std().item() / GATE_STD - 1) < 5 / math.sqrt(2 * n)
    assert abs(weight.mean().item()) < 5 * GATE_STD / math.sqrt(n)


def test_wrong_number_of_layer_encodings_is_refused():
    from posenc.lab.model import TinyLM

    enc = build_encoding("fox", CONFIG)
    with pytest.raises(ValueError, match="3 layers but 2"):
        TinyLM(enc, layer_encodings=[build_encoding("fox", CONFIG)], **SHAPE)
