"""One calling convention: every encoding that rotates answers ``enc(q, k, positions=...)``
with ``(q, k)``; position-only biases answer ``enc.bias(T)`` / ``posenc.alibi_bias(T, T, H)``
without query/key tensors; the documented submodules load on attribute access."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import posenc
from conftest import tolerances
from posenc.base import PositionalEncoding
from posenc.encodings.rotary.trailing import TrailingRope
from posenc.hf import schemes
from posenc.reference import alibi_bias as ref_alibi_bias
from posenc.reference import alibi_slopes as ref_alibi_slopes

B, H, T, D = 2, 4, 6, 16

ROTATING = {
    "rope": lambda: posenc.RotaryEmbedding(D),
    "mrope": lambda: posenc.MRoPE(D, mrope_section=[2, 3, 3]),
    "xdrope": lambda: schemes.XDRoPE(D, sections=[2, 2, 3, 1]),
    "mla": lambda: posenc.MLARope(D, 8),
    "trailing": lambda: TrailingRope(D, 8),
    "temperature": lambda: posenc.PositionTemperature(0.5, 2),
    "compose": lambda: posenc.Compose([posenc.RotaryEmbedding(D), posenc.PositionTemperature()]),
    "axial": lambda: posenc.AxialRope(D),
    "nope": posenc.NoPE,
}


def _positions(enc: PositionalEncoding, length: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    if enc.position_shape == "[A, T]":
        return torch.randint(0, 50, (enc.num_axes, B, length), generator=gen)
    if enc.position_shape == "[N, A]":
        return torch.randint(0, 50, (length, 2), generator=gen)
    return torch.randint(0, 50, (B, length), generator=gen)


def test_every_encoding_a_scheme_builds_is_covered() -> None:
    built = {
        v
        for v in vars(schemes).values()
        if isinstance(v, type) and issubclass(v, PositionalEncoding) and v is not PositionalEncoding
    }
    covered = {type(make()) for make in ROTATING.values()}
    assert built <= covered, sorted(c.__name__ for c in built - covered)


@pytest.mark.parametrize("name", sorted(ROTATING))
def test_the_call_equals_the_rotate_hook(name: str) -> None:
    enc = ROTATING[name]()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, 2, T, D, generator=gen, dtype=torch.float64)
    pos = _positions(enc, T)
    got = enc(q, k, positions=pos)
    want = (q, k) if name == "nope" else enc.rotate(q, k, pos, pos)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if enc.position_shape == "[N, A]":
        with pytest.raises(ValueError, match="positions"):
            enc(q, k)
        return
    k_long = torch.randn(B, 2, T + 3, D, generator=gen, dtype=torch.float64)
    got = enc(q, k_long)  # no positions: keys 0..Tk-1, queries the last Tq of them
    k_pos = torch.arange(T + 3)
    want = (q, k_long) if name == "nope" else enc.rotate(q, k_long, k_pos[3:], k_pos)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bias_encodings_say_what_to_call() -> None:
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(TypeError, match=r"ALiBi .*enc\.bias\(T\)"):
        posenc.ALiBi(2)(q, q)
    with pytest.raises(TypeError, match=r"CoPE has no bias of positions alone.*score_bias"):
        posenc.CoPE(4).bias(3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [True, False])
def test_alibi_bias_of_a_length_matches_the_reference(dtype: torch.dtype, causal: bool) -> None:
    want = ref_alibi_bias(np.arange(T), np.arange(T), ref_alibi_slopes(H), causal=causal)
    got = posenc.alibi_bias(T, T, H, causal=causal, dtype=dtype)
    assert got.shape == (1, H, T, T)
    torch.testing.assert_close(got[0].double(), torch.from_numpy(want), **tolerances(dtype))
    alibi = posenc.ALiBi(H, causal=causal)
    torch.testing.assert_close(alibi.bias(T, dtype=dtype), got, rtol=0, atol=0)


def test_alibi_bias_forms_refuse_mixed_arguments() -> None:
    torch.testing.assert_close(
        posenc.alibi_bias(2, 5, H), posenc.alibi_bias(torch.arange(3, 5), torch.arange(5), H)
    )
    with pytest.raises(TypeError, match="k_pos Tensor"):
        posenc.alibi_bias(4, torch.arange(4), 2)
    with pytest.raises(ValueError, match="q_pos"):
        posenc.alibi_bias(0, 3, 2)
    with pytest.raises(ValueError, match="5 queries but only 3 keys"):
        posenc.alibi_bias(5, 3, 2)


BIASES = {
    "alibi": lambda: posenc.ALiBi(H),
    "t5": lambda: posenc.T5RelativeBias(H),
    "kerple": lambda: posenc.KERPLE(H),
    "sandwich": lambda: posenc.Sandwich(H),
    "fire": lambda: posenc.FIRE(H),
    "compose": lambda: posenc.Compose([posenc.RotaryEmbedding(D), posenc.ALiBi(H)]),
}


@pytest.mark.parametrize("name", sorted(BIASES))
def test_bias_of_lengths_equals_the_score_bias_of_any_content(name: str) -> None:
    torch.manual_seed(0)
    enc = BIASES[name]()
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, 3, D, generator=gen)
    k = torch.randn(1, H, 7, D, generator=gen)
    want = enc.score_bias(q, k, torch.arange(4, 7), torch.arange(7))
    torch.testing.assert_close(enc.bias(3, 7), want, rtol=0, atol=0)
    assert enc.bias(5).shape == (1, H, 5, 5)
    with pytest.raises(TypeError, match="q_len"):
        enc.bias(2.5)


def test_compose_and_rerotate_keys_name_their_arguments() -> None:
    with pytest.raises(TypeError, match="encodings"):
        posenc.Compose(None)
    k = torch.zeros(1, 1, 2, 4)
    freq = (torch.ones(2, dtype=torch.float64), 1.0)
    with pytest.raises(TypeError, match="old"):
        posenc.rerotate_keys(k, torch.arange(2), old=None, new=freq)
    with pytest.raises(TypeError, match=r"k must be a torch\.Tensor"):
        posenc.rerotate_keys(None, torch.arange(2), old=freq, new=freq)


def test_submodules_load_on_attribute_access() -> None:
    code = (
        "import posenc\n"
        "for name in ('viz', 'lab', 'analysis', 'reference', 'explain'):\n"
        "    assert getattr(posenc, name).__name__ == 'posenc.' + name\n"
        "assert 'viz' in dir(posenc)\n"
        "try:\n"
        "    posenc.no_such_thing\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_thing' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
