"""posenc.XPos against the float64 reference, and its relative-decay property."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from conftest import tolerances
from posenc import XPos
from posenc.encodings.rotary.xpos import xpos_position_limit, xpos_scale
from posenc.reference import rope as ref

TIGHT = tolerances(torch.float64)
D = 16


def reference(x, positions, module: XPos, *, key: bool) -> torch.Tensor:
    out = ref.xpos_rotate(
        x.double().numpy(),
        np.asarray(positions),
        module.inv_freq.numpy(),
        scale_base=module.scale_base,
        key=key,
        interleaved=module.interleaved,
    )
    return torch.from_numpy(out)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("interleaved", "rotary_dim"), [(False, None), (True, None), (False, 8)])
@pytest.mark.parametrize(
    "positions",
    [torch.arange(300, 309), torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4], [5] * 9])],
    ids=["vector", "batch"],
)
def test_matches_reference(gen, dtype, interleaved, rotary_dim, positions):
    module = XPos(D, scale_base=64.0, rotary_dim=rotary_dim, interleaved=interleaved)
    q = torch.randn(2, 4, 9, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 2, 9, D, generator=gen, dtype=torch.float64).to(dtype)
    out_q, out_k = module(q, k, positions)
    tol = TIGHT if dtype == torch.float64 else tolerances(dtype)
    # the decay reaches zeta_0 ** (-308 / 64) ~ 400: compare relative to it
    rtol = tol["rtol"]
    want_q, want_k = (
        reference(q, positions, module, key=False),
        reference(k, positions, module, key=True),
    )
    torch.testing.assert_close(out_q.double(), want_q, rtol=rtol, atol=rtol * want_q.abs().max())
    torch.testing.assert_close(out_k.double(), want_k, rtol=rtol, atol=rtol * want_k.abs().max())


vectors = st.lists(st.floats(-3, 3), min_size=D, max_size=D).map(
    lambda v: torch.tensor(v, dtype=torch.float64).view(1, 1, 1, D)
)
positions_st = st.integers(-1000, 1000)


@given(q=vectors, k=vectors, m=positions_st, n=positions_st, shift=positions_st)
def test_score_depends_only_on_relative_position(q, k, m, n, shift):
    module = XPos(D, scale_base=512.0)

    def score(a: int, b: int) -> float:
        rq, rk = module.rotate(q, k, torch.tensor([a]), torch.tensor([b]))
        return float((rq * rk).sum())

    # angles up to 2000 rad and decays up to zeta_0 ** (-3000 / 512) ~ 1500
    bound = 2000 * 64 * np.finfo(float).eps * float(q.norm() * k.norm()) * 1500
    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=bound)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_positions_up_to_the_limit_are_finite_and_past_it_refused(gen, dtype):
    """Sun et al. 2022's scales zeta ** (+-n / scale_base) overflow one side and vanish on
    the other far from 0: finite up to ``xpos_position_limit``, a ValueError naming it past."""
    module = XPos(D, scale_base=64.0)
    limit = xpos_position_limit(64.0, dtype)
    info = torch.finfo(dtype)
    assert limit == math.floor(64.0 * math.log(info.eps / info.tiny) / math.log(3.5))
    q = torch.randn(1, 1, 3, D, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(1, 1, 3, D, generator=gen, dtype=torch.float64).to(dtype)
    for start in (limit - 2, -limit):  # three positions ending at +limit, from -limit
        positions = torch.arange(3) + start
        out_q, out_k = module(q, k, positions)
        assert torch.isfinite(out_q).all() and torch.isfinite(out_k).all()
        scores = out_q @ out_k.transpose(-1, -2)  # depends on m - n only: as near 0
        near = module(q, k, torch.arange(3))
        want = near[0] @ near[1].transpose(-1, -2)
        rtol = tolerances(dtype)["rtol"] * limit * 8  # angles of ~limit rad
        torch.testing.assert_close(scores, want, rtol=rtol, atol=rtol * want.abs().max())
    for far in (limit + 1, -limit - 1):
        with pytest.raises(ValueError, match=f"within \\+-{limit} for scale_base=64"):
            module(q, k, torch.tensor([0, 1, far]))


def test_decay_values():
    zeta = xpos_scale(torch.tensor([512.0]), 8, scale_base=512.0)[0]
    torch.testing.assert_close(
        zeta, torch.tensor([3.2, 5.2, 7.2, 9.2], dtype=torch.float64) / 11.2, **TIGHT
    )
    positions = torch.arange(-50, 50)
    product = xpos_scale(positions, 8) * xpos_scale(-positions, 8)
    torch.testing.assert_close(product, torch.ones_like(product), **TIGHT)


def test_kv_cache_decoding_equals_full_forward(gen):
    module = XPos(D)
    q = torch.randn(1, 2, 6, D, generator=gen)
    full_q, full_k = module(q, q)
    steps = [module(q[:, :, t : t + 1], q[:, :, t : t + 1], offset=t) for t in range(6)]
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 2), full_q, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([s[1] for s in steps], 2), full_k, rtol=0, atol=0)


def test_registered_and_buildable():
    module = posenc.build("xpos", d_model=64, num_heads=4, head_dim=16, max_len=64)
    assert isinstance(module, XPos) and module.sites == posenc.Site.QK


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: XPos(16, scale_base=0.0), "scale_base must be > 0, got 0.0"),
        (lambda: XPos(15), "head_dim must be even, got 15"),
        (lambda: XPos(16, rotary_dim=18), "rotary_dim=18 exceeds head_dim=16"),
    ],
)
def test_bad_input_raises(make, match):
    with pytest.raises(ValueError, match=match):
        make()
