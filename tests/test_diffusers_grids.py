"""posenc.diffusers' own parts: grid position builders, N-D sin-cos tables, per-axis-block
RoPE and the config door, each against a float64 formula written here (not diffusers).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.diffusers import (
    GridSinCos,
    centred_positions,
    crop_positions,
    diffusers_positions,
    from_diffusers,
    grid_positions,
    normalize_config,
    sincos_positions,
    text_positions,
)
from posenc.encodings.rotary.axial import AxialRope

sizes = st.integers(1, 5)


@settings(max_examples=25, deadline=None)
@given(sizes, sizes, sizes, st.tuples(*(st.integers(-3, 3),) * 3))
def test_grid_positions_are_row_major(frames, height, width, start):
    positions = grid_positions(frames, height, width, start=start)
    assert positions.shape == (frames * height * width, 3)
    assert positions.dtype == torch.int64
    for n, (t, y, x) in enumerate(positions.tolist()):
        f, rest = divmod(n, height * width)
        assert (t, y, x) == (f + start[0], rest // width + start[1], rest % width + start[2])


@settings(max_examples=25, deadline=None)
@given(sizes, st.integers(1, 9), st.integers(1, 9), st.integers(0, 3))
def test_centred_positions(frames, height, width, index):
    positions = centred_positions(frames, height, width, index=index)
    plain = grid_positions(frames, height, width)
    shift = torch.tensor([index, -(height - height // 2), -(width - width // 2)])
    torch.testing.assert_close(positions, plain + shift, rtol=0, atol=0)
    assert int(positions[:, 1].max()) == height // 2 - 1
    assert int(positions[:, 2].min()) == -(width - width // 2)


def test_crop_positions_follow_the_endpoint_free_linspace():
    (top, left), (bottom, right) = (1, 2), (7, 10)
    positions = crop_positions(4, 5, ((top, left), (bottom, right)), frames=3)
    for axis, (n, first, edge) in enumerate(((3, 0, 3), (4, top, bottom), (5, left, right))):
        expected = [first + i * (edge * (n - 1) / n - first) / (n - 1) for i in range(n)]
        values = sorted(set(positions[:, axis].tolist()))
        np.testing.assert_allclose(values, expected, rtol=0, atol=1e-12)
    assert positions.dtype == torch.float64


def test_sincos_positions_scale_and_crop():
    plain = sincos_positions(4, 6, base_size=8, interpolation_scale=2.0)
    np.testing.assert_allclose(plain[:6, 1].numpy(), np.arange(6) * 8 / (6 * 2.0), atol=1e-12)
    np.testing.assert_allclose(plain[::6, 0].numpy(), np.arange(4) * 8 / (4 * 2.0), atol=1e-12)
    cropped = sincos_positions(4, 6, base_size=8, max_size=10)
    np.testing.assert_allclose(cropped[::6, 0].numpy(), (np.arange(4) + 3) * 8 / 10, atol=1e-12)
    np.testing.assert_allclose(cropped[:6, 1].numpy(), (np.arange(6) + 2) * 8 / 10, atol=1e-12)


def test_text_positions_are_on_the_diagonal():
    positions = text_positions(4, start=3)
    assert positions.tolist() == [[3 + i] * 3 for i in range(4)]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: grid_positions(0, 2, 2), "frames"),
        (lambda: grid_positions(1, 2, 2, start=(0, 0)), "start"),
        (lambda: centred_positions(1, 2, 2, index=-1), "index"),
        (lambda: crop_positions(2, 2, ((0, 0),)), "crop"),
        (lambda: sincos_positions(5, 2, base_size=4, max_size=4), "larger than max_size"),
        (lambda: sincos_positions(2, 2, base_size=4, interpolation_scale=0.0), "interpolation"),
        (lambda: text_positions(0), "length"),
    ],
)
def test_bad_grids_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _sincos_reference(positions: np.ndarray, dims, order) -> np.ndarray:
    """Per block: ``[sin(p w) | cos(p w)]``, ``w_i = 10000 ** (-i / h)`` (MAE's 2-D form)."""
    blocks = []
    for size, axis in zip(dims, order, strict=True):
        half = size // 2
        w = 10000.0 ** (-np.arange(half) / half)
        angles = positions[:, axis, None] * w
        blocks += [np.sin(angles), np.cos(angles)]
    return np.concatenate(blocks, axis=1)


@pytest.mark.parametrize(
    ("dims", "order"), [((8, 8), (1, 0)), ((4, 6, 6), (0, 2, 1)), ((6, 10), (0, 1))]
)
def test_grid_sincos_matches_its_formula(dims, order):
    positions = crop_positions(3, 4, ((0, 1), (5, 6)), frames=2 if len(dims) == 3 else None)
    module = GridSinCos(sum(dims), axis_dims=dims, axis_order=order)
    expected = _sincos_reference(positions.numpy(), dims, order)
    np.testing.assert_allclose(module.table(positions, dtype=torch.float64), expected, atol=1e-12)
    x = torch.randn(2, positions.shape[0], sum(dims))
    torch.testing.assert_close(module(x, positions), x + torch.from_numpy(expected).float())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"d_model": 8, "axis_dims": (3, 5)}, "even"),
        ({"d_model": 8, "axis_dims": (4, 6)}, "sum to d_model"),
        ({"d_model": 8, "axis_order": (0, 0)}, "permutation"),
        ({"d_model": 8, "base": -1.0}, "base"),
    ],
)
def test_grid_sincos_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GridSinCos(**kwargs)


def test_grid_sincos_bad_inputs_raise():
    module = GridSinCos(8)
    with pytest.raises(ValueError, match=r"positions must be \[N, 2\]"):
        module.table(torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"x must be \[B, 4, 8\]"):
        module(torch.zeros(1, 5, 8), torch.zeros(4, 2))


def _axes_reference(positions: np.ndarray, dims, base: float) -> np.ndarray:
    """Angles ``[N, P]``: pair ``i`` of block ``b`` turns by ``p_b base ** (-2i / S_b)``."""
    return np.concatenate(
        [positions[:, b, None] * base ** (-np.arange(0, s, 2) / s) for b, s in enumerate(dims)],
        axis=1,
    )


def _rotate_adjacent(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    out = x.copy()
    a, b = x[..., 0 : 2 * angles.shape[-1] : 2], x[..., 1 : 2 * angles.shape[-1] : 2]
    out[..., 0 : 2 * angles.shape[-1] : 2] = a * np.cos(angles) - b * np.sin(angles)
    out[..., 1 : 2 * angles.shape[-1] : 2] = a * np.sin(angles) + b * np.cos(angles)
    return out


@pytest.mark.parametrize(("dims", "head_dim"), [((4, 6, 6), 16), ((2, 8), 12), ((6, 4, 4, 2), 16)])
def test_per_axis_blocks_match_their_formula(dims, head_dim):
    rope = AxialRope(
        head_dim, base=256.0, axis_order=tuple(range(len(dims))), pairs="interleaved",
        axis_dim=dims,
    )  # fmt: skip
    positions = torch.randint(-5, 9, (7, len(dims)))
    angles = _axes_reference(positions.double().numpy(), dims, 256.0)
    cos, sin = rope.cos_sin(positions, dtype=torch.float64)
    np.testing.assert_allclose(cos.numpy(), np.cos(angles), atol=1e-12)
    np.testing.assert_allclose(sin.numpy(), np.sin(angles), atol=1e-12)
    q = torch.randn(1, 2, 7, head_dim, dtype=torch.float64)
    got, _ = rope.rotate(q, q, positions, positions)
    np.testing.assert_allclose(got.numpy(), _rotate_adjacent(q.numpy(), angles), atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(-6, 6), min_size=3, max_size=3))
def test_per_axis_blocks_are_relative(shift):
    """``<R(p) q, R(p') k>`` depends on ``p - p'`` only, axis by axis."""
    rope = AxialRope(16, axis_order=(0, 1, 2), pairs="interleaved", axis_dim=(4, 6, 6))
    generator = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 1, 1, 5, 16, dtype=torch.float64, generator=generator)
    p_q, p_k = torch.randint(-4, 5, (2, 5, 3), generator=generator)
    moved = torch.tensor(shift)
    base = rope.rotate(q, k, p_q, p_k)
    shifted = rope.rotate(q, k, p_q + moved, p_k + moved)
    scores = (base[0] @ base[1].transpose(-1, -2), shifted[0] @ shifted[1].transpose(-1, -2))
    torch.testing.assert_close(*scores, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"axis_dim": (4, 6, 7), "axis_order": (0, 1, 2)}, "even sizes"),
        ({"axis_dim": (4, 6), "axis_order": (0, 1, 2)}, "3 even sizes"),
        ({"axis_dim": (8, 6, 6), "axis_order": (0, 1, 2)}, "at most head_dim"),
        ({"axis_dim": (4, 6), "cyclic": True}, "cyclic pairs need equal"),
        ({"axis_dim": (4, 6), "frequencies": "alternating"}, "alternating frequencies"),
    ],
)
def test_bad_axis_blocks_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AxialRope(16, **kwargs)


def test_equal_blocks_equal_the_single_size():
    """``axis_dim=(S, S)`` is ``axis_dim=S``."""
    single, blocks = AxialRope(16, axis_dim=6), AxialRope(16, axis_dim=(6, 6))
    torch.testing.assert_close(single.inv_freq, blocks.inv_freq, rtol=0, atol=0)
    assert single.axis_dim == blocks.axis_dim == 6


def test_config_door_takes_models_dicts_and_names():
    diffusers = pytest.importorskip("diffusers")
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=1, joint_attention_dim=8, pooled_projection_dim=8,
        axes_dims_rope=(4, 6, 6),
    )  # fmt: skip
    name, config = normalize_config(model)
    assert name == "FluxTransformer2DModel" and tuple(config["axes_dims_rope"]) == (4, 6, 6)
    from_model = from_diffusers(model)
    from_dict = from_diffusers({"_class_name": name, **model.config})
    torch.testing.assert_close(from_model.inv_freq, from_dict.inv_freq, rtol=0, atol=0)
    released = from_diffusers("FluxTransformer2DModel")
    assert released.axis_dim == (16, 56, 56) and released.head_dim == 128
    positions = diffusers_positions("FluxTransformer2DModel", height=2, width=3)
    assert positions.tolist() == [[0, y, x] for y in range(2) for x in range(3)]


def test_missing_config_key_is_named():
    with pytest.raises(ValueError, match="no 'axes_dims_rope'"):
        from_diffusers({"_class_name": "FluxTransformer2DModel", "axes_dims_rope": None})


def test_angles_stay_float64_for_large_positions():
    """A position beyond float16/bfloat16's exact range keeps its angle (no half rounding)."""
    rope = from_diffusers("WanTransformer3DModel", attention_head_dim=12)
    cos, _ = rope.cos_sin(torch.tensor([[0, 0, 257]]), dtype=torch.bfloat16)
    expected = math.cos(257 * 10000.0 ** (-0.0))
    assert abs(float(cos[0, -2]) - expected) < 2**-7


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40), st.integers(1, 40))
def test_resize_crop_is_diffusers_crop_region(h, w, th, tw):
    """``resize_crop`` gives the region of CogVideoX's ``get_resize_crop_region_for_grid``."""
    pytest.importorskip("diffusers")
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    from posenc.diffusers._common import resize_crop

    assert resize_crop((h, w), (th, tw)) == get_resize_crop_region_for_grid((h, w), tw, th)
