"""Mistakes a newcomer makes get a one-line hint: a RoPE scaling named as an encoding, and
``[B, T, H, D]`` tensors handed to a ``[B, H, T, D]`` rotation without positions (which
would rotate the head axis as if it were the positions)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import posenc
from posenc.cli import PREFIX, main

D = 16


@pytest.mark.parametrize("name", ["yarn", "YaRN", "llama3", "ntk"])
def test_explain_a_scaling_points_to_rope(capsys, name):
    assert main(["explain", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith(PREFIX) and len(err.splitlines()) == 1
    assert f"{name!r} is a RoPE scaling" in err and "posenc explain rope" in err


def _bthd(t: int, heads: int) -> torch.Tensor:
    return torch.randn(2, t, heads, D)  # [B, T, H, D]


@pytest.mark.parametrize("encoding", [posenc.RotaryEmbedding(D), posenc.XPos(D)])
@pytest.mark.parametrize(("q_heads", "k_heads"), [(4, 4), (4, 2)])
def test_bthd_tensors_without_positions_are_refused_with_the_way_out(encoding, q_heads, k_heads):
    q, k = _bthd(12, q_heads), _bthd(12, k_heads)
    way_out = (
        "pass RotaryEmbedding(..., layout='bthd')"
        if type(encoding) is posenc.RotaryEmbedding
        else "transpose them to [B, H, T, D]"
    )
    with pytest.raises(
        ValueError, match=r"\[B, T, H, D\] tensors( with grouped heads)?\? " + re.escape(way_out)
    ):
        encoding(q, k)


def test_bthd_tensors_rotate_along_t_with_layout_bthd():
    """The way out the message names gives the rotation of the transposed tensors."""
    q, k = _bthd(12, 4), _bthd(12, 2)
    got = posenc.RotaryEmbedding(D, layout="bthd")(q, k)
    want = posenc.RotaryEmbedding(D)(q.transpose(1, 2), k.transpose(1, 2))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w.transpose(1, 2), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("q_shape", "k_shape", "kwargs"),
    [
        ((2, 8, 12, D), (2, 2, 12, D), {}),  # grouped heads
        ((2, 4, 3, D), (2, 4, 12, D), {}),  # queries the last 3 of 12 keys
        ((2, 4, 1, D), (2, 4, 1, D), {}),  # a first decode step
        ((2, 4, 1, D), (2, 4, 1, D), {"offset": 7}),  # a later one
    ],
)
def test_bhtd_tensors_that_cannot_be_bthd_need_no_positions(q_shape, k_shape, kwargs):
    q, k = torch.randn(q_shape), torch.randn(k_shape)
    got_q, got_k = posenc.RotaryEmbedding(D)(q, k, **kwargs)
    start = kwargs.get("offset", 0)
    positions = torch.arange(start, start + k_shape[2])
    want_q, want_k = posenc.RotaryEmbedding(D).rotate(q, k, positions[-q_shape[2] :], positions)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=0)


def test_fewer_tokens_than_heads_need_positions_and_say_so():
    q = torch.randn(1, 8, 4, D)
    with pytest.raises(ValueError, match=r"pass positions \(torch.arange\(4\)\)"):
        posenc.RotaryEmbedding(D)(q, q)
    posenc.RotaryEmbedding(D)(q, q, torch.arange(4))


def test_from_hf_config_reads_a_path_to_a_config_json_or_its_folder(tmp_path):
    config = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4}
    config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    want = posenc.from_hf_config(config)
    for given in (tmp_path, str(tmp_path / "config.json")):
        got = posenc.from_hf_config(given)
        assert repr(got) == repr(want)
        torch.testing.assert_close(got.inv_freq, want.inv_freq, rtol=0, atol=0)
    assert repr(posenc.rope_from_hf_config(tmp_path)) == repr(posenc.rope_from_hf_config(config))


def test_a_config_path_that_is_not_a_config_says_which(tmp_path):
    with pytest.raises(ValueError, match=r"config path '.*missing.json': no such file"):
        posenc.from_hf_config(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"config path '.*config.json': no such file"):
        posenc.from_hf_config(tmp_path)  # a folder without a config.json
    (tmp_path / "config.json").write_text("model_type: llama")
    with pytest.raises(ValueError, match="is not JSON"):
        posenc.from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(TypeError, match="holds a list, not an object"):
        posenc.from_hf_config(tmp_path)
