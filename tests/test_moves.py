"""Moving and copying modules: dtype and device moves, state dicts, deepcopy and pickle.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model.

For every registered encoding, RoPE under every scaling, and ``MultiHeadAttention``
holding each encoding:

* ``.to(torch.bfloat16)``, ``.half()``, ``.double()`` and back leave the frequencies and
  caches exact: after the round trip the module computes bit for bit what a fresh
  float32 module with the same (round-tripped) parameters computes; in the new dtype it
  runs and matches the float32 result to that dtype's precision;
* ``.to("meta")`` then ``to_empty(device="cpu")`` and reloading the state dict restores
  the exact outputs;
* ``state_dict()`` holds the learned parameters only (no cache, before or after a
  forward) and loads, through ``torch.save`` / ``torch.load(weights_only=True)``, into a
  module built with other parameters;
* ``copy.deepcopy`` and pickling work after a forward, and the copy's caches are its own.
"""

from __future__ import annotations

import ast
import copy
import pickle
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import posenc
from _build import SCALINGS, C, D, H, apply_hooks, attention_positions, build_encoding, make_inputs
from conftest import tolerances

T = 6
LONG = 4 * T
NAMES = posenc.available()
KINDS = (
    NAMES + [f"rope-{s}" for s in SCALINGS if s != "default"] + [f"attention-{n}" for n in NAMES]
)


def make(kind: str, seed: int = 0) -> nn.Module:
    """The module called ``kind``: an encoding, ``rope-<scaling>`` or ``attention-<name>``."""
    if kind.startswith("attention-"):
        position = make(kind.removeprefix("attention-"), seed)
        torch.manual_seed(seed)
        return posenc.MultiHeadAttention(C, H, position=position)
    if kind.startswith("rope-"):
        return posenc.RotaryEmbedding(D, scaling=SCALINGS[kind.removeprefix("rope-")])
    # caches start at 16 positions and grow; a learned table must cover the longest run
    return build_encoding(kind, seed=seed, max_len=LONG if kind == "learned" else 16)


def run(module: nn.Module, *, dtype: torch.dtype = torch.float32, length: int = T):
    """The module's outputs on seeded inputs of ``dtype``: ``{name: tensor}``."""
    x, q, k, pos = make_inputs(length, dtype=dtype)
    if isinstance(module, posenc.MultiHeadAttention):
        return {"out": module(x, attention_positions(module.position, None, length))}
    return apply_hooks(module, x, q, k, pos, pos)


def assert_same(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)


def reloaded(kind: str, state: dict[str, Tensor]) -> nn.Module:
    """A fresh module of ``kind`` (other initial parameters) with ``state`` loaded."""
    fresh = make(kind, seed=1)
    fresh.load_state_dict(state)
    return fresh


MOVES = {
    "bfloat16": (lambda m: m.to(torch.bfloat16), torch.bfloat16),
    "half": (lambda m: m.half(), torch.float16),
    "double": (lambda m: m.double(), torch.float64),
}


@pytest.mark.parametrize("move", MOVES)
@pytest.mark.parametrize("kind", KINDS)
def test_dtype_moves_keep_frequencies_exact(kind, move):
    to_dtype, dtype = MOVES[move]
    module = make(kind)
    reference = run(module)  # fills the float32 caches first
    moved = to_dtype(module)
    out = run(moved, dtype=dtype)
    for key, value in out.items():
        assert value.dtype == dtype, key
        tol = tolerances(dtype, ops=64) if dtype != torch.float64 else tolerances(torch.float32)
        torch.testing.assert_close(value.float(), reference[key].float(), **tol, msg=key)
    back = moved.float()
    assert_same(run(back, length=2 * T), run(reloaded(kind, back.state_dict()), length=2 * T))


def test_rope_frequencies_survive_a_dtype_move():
    rope = posenc.RotaryEmbedding(D, scaling=SCALINGS["yarn"])
    inv_freq, cos = rope.inv_freq.clone(), rope.cos_sin(torch.arange(T))[0]
    rope.to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float64 and torch.equal(rope.inv_freq, inv_freq)
    assert torch.equal(rope.cos_sin(torch.arange(T))[0], cos)


@pytest.mark.parametrize("kind", KINDS)
def test_meta_and_back(kind):
    module = make(kind)
    want = run(module)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    module.to("meta")
    assert all(p.is_meta for p in module.parameters())
    module.to_empty(device="cpu")  # parameters are uninitialized memory now
    module.load_state_dict(state)
    assert_same(run(module), want)


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_holds_learned_parameters_only(kind):
    module = make(kind)
    names = {name for name, _ in module.named_parameters()}
    assert set(module.state_dict()) == names
    run(module, length=LONG)  # grows every cache
    assert set(module.state_dict()) == names


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_loads_from_a_file_into_another_instance(kind, tmp_path):
    module = make(kind)
    run(module)
    path = tmp_path / "state.pt"
    torch.save(module.state_dict(), path)
    assert_same(run(reloaded(kind, torch.load(path, weights_only=True))), run(module))


COPIES = {
    "deepcopy": copy.deepcopy,
    "pickle": lambda m: pickle.loads(pickle.dumps(m)),
}


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("kind", KINDS)
def test_copies_work_and_own_their_caches(kind, how):
    module = make(kind)
    want, want_long = run(module), run(make(kind), length=LONG)
    twin = COPIES[how](module)
    assert_same(run(twin), want)
    assert_same(run(twin, length=LONG), want_long)  # the copy grows its own caches
    assert_same(run(module), want)
    assert_same(run(module, length=LONG), want_long)


def test_every_torch_load_in_posenc_is_weights_only():
    """No file that posenc reads can run code: each ``torch.load`` passes
    ``weights_only=True``."""
    root = Path(posenc.__file__).parent
    calls = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and ast.unparse(func) == "torch.load":
                calls.append(node)
                flags = {kw.arg: ast.unparse(kw.value) for kw in node.keywords}
                assert flags.get("weights_only") == "True", f"{path}:{node.lineno}"
    assert calls, "posenc loads files (posenc show --table); the scan found no torch.load"
