"""LieRE and ComRoPE against the float64 reference (spectral matrix exponential), RoPE as
their special case, orthogonality, the relative property (ComRoPE has it, LieRE not in
general), gradients to the generators, and their use in MultiHeadAttention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import MultiHeadAttention
from posenc.encodings.rotary.lie import ComRoPE, LieRE
from posenc.reference import lie_rotate, rope_frequencies, skew_expm

D = 8
KINDS = {
    "liere": lambda dim, **kw: LieRE(dim, **kw),
    "ap": lambda dim, **kw: ComRoPE(dim, variant="ap", **kw),
    "ld": lambda dim, **kw: ComRoPE(dim, variant="ld", **kw),
}


def _random(kind: str, axes: int = 2, seed: int = 0) -> torch.nn.Module:
    """Random generators (``init="normal"``), blocks of ``2 * axes`` features."""
    torch.manual_seed(seed)
    dim = 2 * axes * (D // 4)
    return KINDS[kind](dim, axes=axes, block_size=2 * axes, init="normal", init_std=0.7).double()


def _exp_tol(enc: torch.nn.Module, pos: torch.Tensor, dtype: torch.dtype) -> float:
    """matrix_exp's error bound in ``dtype``: grows with the norm of the angle matrices."""
    gens = enc.generators().detach().abs().sum(dim=(0, 2, 3)).max()
    return torch.finfo(dtype).eps * 16 * D * (1 + float(gens * pos.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", list(KINDS))
def test_rotate_matches_reference(gen, kind, dtype):
    enc = _random(kind)
    q = torch.randn(2, 3, 5, D, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 1, 5, D, generator=gen, dtype=torch.float64)
    pos = torch.randint(-6, 7, (2, 5, 2), generator=gen)
    q_rot, k_rot = enc.to(dtype).rotate(q.to(dtype), k.to(dtype), pos, pos)
    gens = enc.double().generators().detach().numpy()
    tol = 4 * D * torch.finfo(dtype).eps + _exp_tol(
        enc, pos, torch.promote_types(dtype, torch.float32)
    )
    for b in range(2):
        for x, got in ((q, q_rot), (k, k_rot)):
            for h in range(x.shape[1]):
                want = lie_rotate(x[b, h].numpy(), gens, pos[b].numpy())
                torch.testing.assert_close(
                    got[b, h].double(), torch.from_numpy(want), rtol=tol, atol=tol
                )


def test_rope_is_the_special_case(gen):
    """2x2 blocks, one axis, generators [[0, -f], [f, 0]] at RoPE's frequencies: RoPE with
    interleaved pairs (float64 generators), and the ``init="rope"`` default (float32 ones)."""
    enc = LieRE(D, axes=1, block_size=2).double()
    q = torch.randn(1, 2, 6, D, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, 6, D, generator=gen, dtype=torch.float64)
    pos = torch.arange(6)[:, None]
    rope = posenc.RotaryEmbedding(D, interleaved=True)
    want = rope(q, k)
    torch.testing.assert_close(enc.rotate(q, k, pos, pos), want, **tolerances(torch.float32))
    with torch.no_grad():
        enc.weight.zero_()
        enc.weight[0, :, 0, 1] = -torch.from_numpy(rope_frequencies(D))
    torch.testing.assert_close(
        enc.rotate(q, k, pos, pos), want, **tolerances(torch.float64, ops=16)
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_rotation_is_orthogonal_and_the_reference_exponential(gen, kind):
    enc = _random(kind, axes=3)
    pos = 3.0 * torch.randn(4, 3, generator=gen, dtype=torch.float64)
    rot = enc.rotation(pos, dtype=torch.float64).detach()  # [N, K, b, b]
    eye = torch.eye(6, dtype=torch.float64).expand_as(rot)
    torch.testing.assert_close(
        rot @ rot.transpose(-1, -2), eye, **tolerances(torch.float64, ops=64)
    )
    angles = np.einsum("na,akij->nkij", pos.numpy(), enc.generators().detach().numpy())
    torch.testing.assert_close(
        rot, torch.from_numpy(skew_expm(angles)), **tolerances(torch.float64, ops=64)
    )


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(["ap", "ld"]),
    seed=st.integers(0, 2**16),
    shift=st.lists(st.integers(-20, 20), min_size=2, max_size=2),
)
def test_comrope_scores_depend_on_position_differences_only(kind, seed, shift):
    enc = _random(kind, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, 1, 5, D, generator=gen, dtype=torch.float64) for _ in range(2))
    pos = torch.randint(-10, 11, (5, 2), generator=gen)
    moved = pos + torch.tensor(shift)
    scores = [a @ b.transpose(-1, -2) for a, b in (enc.rotate(q, k, p, p) for p in (pos, moved))]
    tol = _exp_tol(enc, moved, torch.float64)
    torch.testing.assert_close(scores[0], scores[1], rtol=tol, atol=tol)


def test_liere_is_not_relative_in_general(gen):
    enc = _random("liere")
    q, k = (torch.randn(1, 1, 5, D, generator=gen, dtype=torch.float64) for _ in range(2))
    pos = torch.randint(-10, 11, (5, 2), generator=gen)
    scores = [a @ b.transpose(-1, -2) for a, b in (enc.rotate(q, k, p, p) for p in (pos, pos + 3))]
    assert (scores[0] - scores[1]).abs().max() > 1e-3  # non-commuting generators


@pytest.mark.parametrize("kind", list(KINDS))
def test_gradients_reach_the_generators(gen, kind):
    enc = _random(kind)
    q, k = (torch.randn(1, 1, 3, D, generator=gen, dtype=torch.float64) for _ in range(2))
    pos = torch.randint(-4, 5, (3, 2), generator=gen)
    names = [name for name, _ in enc.named_parameters()]

    def scores(*values):
        a, b = torch.func.functional_call(enc, dict(zip(names, values, strict=True)), (q, k, pos))
        return a @ b.transpose(-1, -2)

    values = tuple(p.detach().clone().requires_grad_(True) for p in enc.parameters())
    assert torch.autograd.gradcheck(scores, values, fast_mode=True)
    grads = torch.autograd.grad(scores(*values).square().sum(), values)
    assert all(g.abs().max() > 0 for g in grads)


@pytest.mark.parametrize("kind", ["ap", "ld"])
def test_attention_with_comrope_is_shift_invariant(gen, kind):
    torch.manual_seed(0)
    enc = KINDS[kind](D, axes=2, block_size=4, init="normal", init_std=0.7)
    mha = MultiHeadAttention(16, 2, position=enc, causal=False).double()
    x = torch.randn(2, 6, 16, generator=gen, dtype=torch.float64)
    pos = torch.randint(0, 8, (2, 6, 2), generator=gen)
    torch.testing.assert_close(mha(x, pos), mha(x, pos + torch.tensor([5, -3])),
                               **tolerances(torch.float64, ops=256))  # fmt: skip


def test_registered_and_built_by_name():
    assert {"liere", "comrope"} <= set(posenc.available())
    assert isinstance(posenc.build("comrope", head_dim=16, variant="ld"), ComRoPE)
    mha = MultiHeadAttention(32, 2, position="liere")
    assert mha(torch.randn(1, 4, 32), torch.randint(0, 3, (4, 2))).shape == (1, 4, 32)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: LieRE(8, block_size=3), ValueError, "block_size"),
        (lambda: LieRE(8, block_size=16), ValueError, "block_size"),
        (lambda: LieRE(8, init="zeros"), ValueError, "init"),
        (lambda: ComRoPE(8, variant="xy"), ValueError, "variant"),
        (lambda: ComRoPE(12, axes=2, block_size=6, variant="ap"), ValueError, "2 \\* axes"),
        (lambda: LieRE(8, axes=0), ValueError, "axes"),
        (lambda: LieRE(8.0), TypeError, "head_dim"),
    ],
)
def test_bad_construction_raises(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_positions_raise():
    enc = LieRE(8, axes=2, block_size=4)
    q = torch.randn(1, 1, 3, 8)
    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        enc.rotate(q, q, torch.zeros(3, 3), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="positions"):
        enc.rotation(torch.zeros(3, 1))
