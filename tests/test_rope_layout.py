"""RotaryEmbedding(layout=...): [B, T, H, D] inputs rotate along T, and positions that do
not match the layout's T axis are refused with the shape named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tolerances
from posenc import RotaryEmbedding
from posenc.reference import rope as ref

B, T, H, D = 2, 6, 3, 8


def _reference(x_bhtd: torch.Tensor, positions: np.ndarray, rope: RotaryEmbedding) -> torch.Tensor:
    out = ref.rope_rotate(
        x_bhtd.double().numpy(),
        positions,
        rope.inv_freq.numpy(),
        interleaved=rope.interleaved,
        attention_scale=rope.attention_scale,
    )
    return torch.from_numpy(out)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("given", [False, True])
def test_bthd_rotates_along_t(interleaved: bool, dtype: torch.dtype, given: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    positions = torch.tensor([5, 1, 4, 1, 5, 9]) if given else None
    expected_pos = positions.numpy() if given else np.arange(T)
    rope = RotaryEmbedding(D, interleaved=interleaved, layout="bthd")
    q_out, k_out = rope(q.to(dtype), k.to(dtype), positions=positions)
    assert q_out.shape == (B, T, H, D) and k_out.shape == (B, T, H, D)
    tol = tolerances(dtype)
    for x, out in ((q, q_out), (k, k_out)):
        expected = _reference(x.transpose(1, 2), expected_pos, rope).transpose(1, 2)
        torch.testing.assert_close(out.double(), expected, **tol)


def test_bthd_offset_and_decode_match_bhtd() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(B, 2, H, D, generator=gen)
    k = torch.randn(B, T, H, D, generator=gen)
    bthd = RotaryEmbedding(D, layout="bthd")
    bhtd = RotaryEmbedding(D)
    got = bthd(q, k, offset=7)
    want = bhtd(q.transpose(1, 2), k.transpose(1, 2), offset=7)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b.transpose(1, 2), rtol=0, atol=0)


def test_positions_not_matching_t_axis_are_refused_naming_the_shape() -> None:
    q = torch.randn(B, T, H, D)  # [B, T, H, D] given to the default layout
    with pytest.raises(ValueError, match=r"\(2, 6, 3, 8\).*layout='bthd'"):
        RotaryEmbedding(D)(q, q, positions=torch.arange(T))
    q = torch.randn(B, H, T, D)  # [B, H, T, D] given to layout="bthd"
    with pytest.raises(ValueError, match=r"\(2, 3, 6, 8\).*layout='bhtd'"):
        RotaryEmbedding(D, layout="bthd")(q, q, positions=torch.arange(T))
    with pytest.raises(ValueError, match=r"\(2, 3, 6, 8\) has T=6"):
        RotaryEmbedding(D)(q, q, positions=torch.arange(5))


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="'bhdt'"):
        RotaryEmbedding(D, layout="bhdt")


def test_layout_survives_copy_and_shows_in_repr() -> None:
    import copy

    rope = RotaryEmbedding(D, layout="bthd")
    assert copy.deepcopy(rope).layout == "bthd"
    assert "layout='bthd'" in repr(rope)
