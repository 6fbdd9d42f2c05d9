"""``save_pretrained`` of a patched model writes the patch's rope config: reloaded without
posenc, the model gives the patched outputs; what a config cannot say is refused."""

from __future__ import annotations

import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf.patch import patch, unpatch  # noqa: E402
from test_patch import DYNAMIC, VOCAB, _close, _load, _saved  # noqa: E402

LENGTH = 40  # past the trained 10 (DYNAMIC) and 64 // 4 (YaRN's original length below)
SCALINGS = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
}  # fmt: skip


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_a_saved_patched_model_reloads_as_the_patched_one(name, tmp_path_factory):
    model_cls, folder = _saved(tmp_path_factory, "llama")
    ids = torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(7))
    original = _logits(_load(model_cls, folder), ids)
    patched = patch(_load(model_cls, folder), scaling=SCALINGS[name])
    want = _logits(patched, ids)
    out = tmp_path_factory.mktemp("saved")
    patched.save_pretrained(out)
    written = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert {k: written[k] for k in SCALINGS[name]} == SCALINGS[name]
    reloaded = _logits(_load(model_cls, out), ids)  # no posenc: transformers' own scaling
    _close(reloaded, want, LENGTH)
    assert (reloaded - original).abs().max() > 1e-2  # the scaling changed the model
    unpatch(patched)
    patched.save_pretrained(out)  # unpatched: transformers' own save again
    _close(_logits(_load(model_cls, out), ids), original, LENGTH)


def test_a_per_layer_type_scaling_is_saved_for_its_type(tmp_path_factory):
    model_cls, folder = _saved(tmp_path_factory, "gemma3_text")
    ids = torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(8))
    patched = patch(_load(model_cls, folder), scaling={"full_attention": SCALINGS["yarn"]})
    out = tmp_path_factory.mktemp("saved")
    patched.save_pretrained(out)
    written = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert written["sliding_attention"]["rope_type"] == "default"
    assert written["full_attention"]["rope_type"] == "yarn"
    _close(_logits(_load(model_cls, out), ids), _logits(patched, ids), LENGTH)


def test_the_default_policy_saves_a_dynamic_model_as_it_runs(tmp_path_factory):
    model_cls, folder = _saved(tmp_path_factory, "llama", **DYNAMIC)
    ids = torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(9))
    patched = patch(_load(model_cls, folder))
    out = tmp_path_factory.mktemp("saved")
    patched.save_pretrained(out)
    _close(_logits(_load(model_cls, out), ids), _logits(patched, ids), LENGTH)


def test_what_a_config_cannot_say_is_refused_before_writing(tmp_path_factory):
    model_cls, folder = _saved(tmp_path_factory, "llama", **DYNAMIC)
    out = tmp_path_factory.mktemp("saved")
    monotone = patch(_load(model_cls, folder), length_policy="monotone")
    with pytest.raises(ValueError, match="length_policy='monotone'"):
        monotone.save_pretrained(out)
    static_ntk = patch(_load(model_cls, folder), scaling={"rope_type": "ntk", "factor": 2.0})
    with pytest.raises(ValueError, match="rope_type 'ntk' has no transformers implementation"):
        static_ntk.save_pretrained(out)
    with pytest.raises(ValueError, match="push_to_hub"):
        patch(_load(model_cls, folder)).save_pretrained(out, push_to_hub=True)
    assert not any(out.iterdir())


def test_a_deep_copy_saves_its_own_patch(tmp_path_factory):
    model_cls, folder = _saved(tmp_path_factory, "llama")
    patched = patch(_load(model_cls, folder), scaling=SCALINGS["linear"])
    copied = copy.deepcopy(patched)
    assert copied.save_pretrained.model is copied
    unpatch(patched)
    out = tmp_path_factory.mktemp("saved")
    copied.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["factor"] == 2.0
