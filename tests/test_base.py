"""Sites, the default hooks, Compose, the registry, NoPE and the `posenc` entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import posenc
from posenc import base
from posenc.base import Compose, PositionalEncoding, Site
from posenc.cli import main
from posenc.encodings.rotary import cpu_kernel


class Shift(PositionalEncoding):
    sites = Site.INPUT

    def __init__(self, amount: float) -> None:
        super().__init__()
        self.amount = amount

    def embed(self, x, positions=None):
        return x * 10 + self.amount  # order-sensitive, so chaining order shows


class Scale(PositionalEncoding):
    sites = Site.QK

    def rotate(self, q, k, q_pos, k_pos):
        return q * 2, k + 1


class Bias(PositionalEncoding):
    sites = Site.SCORE | Site.VALUE
    causal_only = True

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def score_bias(self, q, k, q_pos, k_pos):
        return torch.full((1, q.shape[1], q.shape[2], k.shape[2]), self.value)

    def value_term(self, probs, q_pos, k_pos):
        return torch.full((*probs.shape[:3], 4), self.value)


def qk() -> tuple[torch.Tensor, ...]:
    q, k = torch.ones(1, 2, 3, 4), torch.ones(1, 2, 5, 4)
    return q, k, torch.arange(3), torch.arange(5)


# ----------------------------------------------------------------- sites and hooks


def test_site_names_combine_in_hook_order():
    assert (Site.SCORE | Site.INPUT).names() == ["input", "score"]
    assert Site.NONE.names() == []
    assert (Site.INPUT | Site.QK | Site.SCORE | Site.VALUE).names() == [
        "input",
        "qk",
        "score",
        "value",
    ]


def test_default_hooks_are_identities_or_none():
    enc = PositionalEncoding()
    x = torch.randn(2, 3, 4)
    q, k, q_pos, k_pos = qk()
    assert enc.embed(x) is x
    assert enc.rotate(q, k, q_pos, k_pos) == (q, k)
    assert enc.score_bias(q, k, q_pos, k_pos) is None
    assert enc.value_term(torch.ones(1, 2, 3, 5), q_pos, k_pos) is None
    assert "sites=none" in repr(enc)


def test_nope_is_the_identity():
    nope = posenc.build("nope", d_model=8, num_heads=2, head_dim=4, max_len=16, causal=True)
    x = torch.randn(2, 3, 8)
    assert isinstance(nope, posenc.NoPE) and nope.sites == Site.NONE
    assert nope(x) is x and nope(x, torch.arange(3)) is x and nope.embed(x) is x
    assert not list(nope.parameters())


# ----------------------------------------------------------------- Compose


def test_compose_chains_embed_in_order():
    x = torch.zeros(1, 2, 4)
    torch.testing.assert_close(Compose([Shift(1.0), Shift(2.0)]).embed(x), x * 100 + 12)
    sin = posenc.SinusoidalPositionalEncoding(4)
    learned = posenc.LearnedPositionalEncoding(4, 8)
    y = torch.randn(2, 5, 4)
    torch.testing.assert_close(Compose([sin, learned]).embed(y), learned(sin(y)))


def test_compose_sums_biases_and_value_terms_and_chains_rotations():
    q, k, q_pos, k_pos = qk()
    both = Compose([Bias(1.5), Scale(), Bias(2.0), Shift(0.0)])
    assert both.sites == Site.INPUT | Site.QK | Site.SCORE | Site.VALUE
    assert both.causal_only
    torch.testing.assert_close(both.score_bias(q, k, q_pos, k_pos), torch.full((1, 2, 3, 5), 3.5))
    probs = torch.ones(1, 2, 3, 5)
    torch.testing.assert_close(both.value_term(probs, q_pos, k_pos), torch.full((1, 2, 3, 4), 3.5))
    rq, rk = Compose([Scale(), Scale()]).rotate(q, k, q_pos, k_pos)
    torch.testing.assert_close(rq, q * 4)
    torch.testing.assert_close(rk, k + 2)


def test_compose_without_a_site_gives_none():
    q, k, q_pos, k_pos = qk()
    only_input = Compose([Shift(1.0)])
    assert only_input.score_bias(q, k, q_pos, k_pos) is None
    assert only_input.value_term(torch.ones(1, 2, 3, 5), q_pos, k_pos) is None
    assert not only_input.causal_only


def test_compose_bad_input_raises():
    with pytest.raises(ValueError, match="Compose needs at least one encoding, got an empty list"):
        Compose([])
    with pytest.raises(TypeError, match="item 1 is Linear"):
        Compose([Shift(1.0), torch.nn.Linear(2, 2)])


# ----------------------------------------------------------------- registry


def test_registry_holds_the_foundation_encodings():
    names = posenc.available()
    assert names == sorted(names)
    assert {"sinusoidal", "learned", "nope"} <= set(names)
    for name in names:
        entry = posenc.info(name)
        assert entry.name == name and issubclass(entry.cls, PositionalEncoding)
        assert entry.paper and entry.description and entry.sites == entry.cls.sites


def test_build_passes_only_accepted_context_keywords():
    module = posenc.build(
        "learned", d_model=8, max_len=4, num_heads=2, causal=False, beyond="interpolate"
    )
    assert (module.d_model, module.max_len, module.beyond) == (8, 4, "interpolate")
    with pytest.raises(TypeError, match="unexpected keyword argument 'base'"):
        posenc.build("learned", d_model=8, max_len=4, base=10.0)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown encoding 'sinus'; known encodings: .*sinusoidal"
    ):
        posenc.build("sinus", d_model=8)


def test_register_refuses_a_second_class_under_one_name(monkeypatch):
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    deco = posenc.register("shift", paper="none", description="test encoding")
    assert deco(Shift) is Shift
    assert deco(Shift) is Shift  # the same class again is fine
    assert "shift" in posenc.available()
    with pytest.raises(ValueError, match="encoding name 'shift' is already registered"):
        deco(Scale)


# ----------------------------------------------------------------- command line


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"posenc {posenc.__version__} (RoPE on CPU: {cpu_kernel.status()})"


@pytest.mark.parametrize("argv", [["no-such-command"], ["list", "--bogus"]])
def test_usage_errors_print_one_line_and_exit_2(capsys, argv):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("posenc")


def test_console_entry_point_runs():
    done = subprocess.run(
        [sys.executable, "-m", "posenc", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    assert done.stdout.startswith(f"posenc {posenc.__version__} (RoPE on CPU: ")
